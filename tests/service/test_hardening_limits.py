"""Issue 39 finding 3: the connection limits of ``delta-mirror serve`` (docs/commit-service.md,
"Security"), over raw sockets against the real process: a head that never ends is cut at
``--max-header-bytes`` (431) without the memory growing; silent, half-sent and trickling
connections are closed at ``--timeout-headers`` (408), a body that stops at ``--timeout-body``;
connections beyond ``--limit-concurrency`` get 503; HTTPS with ``--ssl-certfile/--ssl-keyfile``;
and the service reaches uvicorn only through its public names.
"""

from __future__ import annotations

import ast
import contextlib
import datetime
import http.client
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.commit_service import FIRST_COMMIT as V0
from support.commit_service import CommitService
from support.stores import sqlite_store
from support.waiting import load_scaled

from delta_mirror.store import SqlStore

HEAD_SECONDS = 2.0
SERVICE_PACKAGE = Path(__file__).parents[2] / "include" / "delta_mirror" / "service"


def vm(pid: int, key: str) -> int:
    """``VmRSS`` / ``VmHWM`` of the process, in KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise AssertionError(key)


def closed_within(sock: socket.socket, seconds: float) -> tuple[bool, bytes]:
    """Whether the service closed ``sock`` within ``seconds`` (what it sent before closing)."""
    sock.settimeout(0.2)
    got, deadline = b"", time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            chunk = sock.recv(4096)
        except TimeoutError:
            continue
        except ConnectionResetError:
            return True, got
        if not chunk:
            return True, got
        got += chunk
    return False, got


@pytest.fixture
def sqlite(tmp_path: Path) -> Iterator[SqlStore]:
    _, store = sqlite_store(tmp_path)
    yield store
    store.close()


def started(store: SqlStore, tmp_path: Path, *args: str) -> CommitService:
    lake = tmp_path / "lake"
    lake.mkdir(exist_ok=True)
    return CommitService(
        store.url, [f"file:{lake}/"], extra_args=args, log_path=tmp_path / "serve.log"
    ).start()


@pytest.fixture
def service(sqlite: SqlStore, tmp_path: Path) -> Iterator[CommitService]:
    svc = started(sqlite, tmp_path, "--timeout-headers", str(HEAD_SECONDS), "--timeout-body", "2")
    yield svc
    svc.stop()
    assert "Traceback" not in svc.log(), svc.log()[-3000:]


def test_a_64_mib_header_that_never_ends_is_cut_at_the_limit_without_growing_memory(
    service: CommitService,
) -> None:
    assert service.proc is not None
    pid = service.proc.pid
    peak_before = vm(pid, "VmHWM")
    sock = socket.create_connection(("127.0.0.1", service.port), timeout=load_scaled(30))
    sent = 0

    def send() -> None:
        nonlocal sent
        with contextlib.suppress(OSError):
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: ")
            piece = b"a" * (1 << 20)
            for _ in range(64):
                sock.sendall(piece)
                sent += len(piece)

    sender = threading.Thread(target=send)
    sender.start()
    closed, got = closed_within(sock, load_scaled(30))
    sender.join(load_scaled(30))
    sock.close()
    assert closed, "the connection must be closed"
    assert got == b"" or got.startswith(b"HTTP/1.1 431 "), got[:200]
    assert sent < 16 << 20, f"{sent >> 20} MiB were taken in before the connection was closed"
    assert vm(pid, "VmHWM") - peak_before < 16 << 10, "the service's peak memory grew by 16 MiB or more"
    assert service.request("GET", "/health", token=None).status == 200


def test_40_silent_half_sent_and_trickling_connections_are_closed_at_the_header_timeout(
    service: CommitService, sqlite: SqlStore
) -> None:
    half = b"POST /v1/commits/0?root=file:/x/t HTTP/1.1\r\nHost: x\r\nX-Slow: a"
    socks = [
        socket.create_connection(("127.0.0.1", service.port), timeout=load_scaled(30)) for _ in range(40)
    ]
    opened = time.monotonic()
    for i, sock in enumerate(socks):
        if i % 2:
            sock.sendall(half)  # half-sent
    stop = threading.Event()

    def trickle() -> None:  # slowloris: a byte of header now and then on the first 5 half-sent ones
        while not stop.wait(0.3):
            for sock in socks[1:10:2]:
                with contextlib.suppress(OSError):
                    sock.sendall(b"a")

    trickler = threading.Thread(target=trickle)
    trickler.start()
    try:
        results = [
            closed_within(s, HEAD_SECONDS + load_scaled(4) - (time.monotonic() - opened)) for s in socks
        ]
    finally:
        stop.set()
        trickler.join()
        for s in socks:
            s.close()
    elapsed = time.monotonic() - opened
    assert all(closed for closed, _ in results), f"{sum(not c for c, _ in results)} of 40 still open"
    assert all(got == b"" or got.startswith(b"HTTP/1.1 408 ") for _, got in results)
    assert HEAD_SECONDS - 0.5 <= elapsed <= HEAD_SECONDS + load_scaled(4), elapsed
    assert service.request("GET", "/health", token=None).status == 200


def pipeline_and_leave(port: int, *, clients: int, linger: float) -> None:
    """``clients`` threads, each three times over: a new connection pipelining 2,000 ``GET /health``,
    nothing read, ``linger`` seconds, then gone."""

    def leave_unread() -> None:
        for _ in range(3):
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port)) as s:
                s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n" * 2000)
                time.sleep(linger)

    threads = [threading.Thread(target=leave_unread) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def test_clients_that_pipeline_and_leave_without_reading_leave_no_traceback(service: CommitService) -> None:
    """uvloop raises on a write to a closed connection, and uvicorn may still write the pipelined
    answers of a client that left: one traceback per such client before the guard dropped them."""

    pipeline_and_leave(service.port, clients=8, linger=0.5)
    time.sleep(1)
    assert service.request("GET", "/health", token=None).status == 200
    assert "Traceback" not in service.log() and "Exception in ASGI application" not in service.log()


def test_pipelined_requests_never_read_queue_a_bounded_number_per_connection(service: CommitService) -> None:
    """uvicorn parses every request of a read at once and keeps each until answered: 10 clients
    pipelining 2,000 requests and never reading grew the service by 59 MiB; the guard hands it at
    most 8 unanswered requests (plus one 4 KiB slice) per connection. Order and answers unchanged."""
    assert service.proc is not None
    peak_before = vm(service.proc.pid, "VmHWM")

    pipeline_and_leave(service.port, clients=10, linger=1.5)
    grown = vm(service.proc.pid, "VmHWM") - peak_before
    with socket.create_connection(("127.0.0.1", service.port), timeout=load_scaled(30)) as s:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n" * 3000)
        got = b""
        while got.count(b"HTTP/1.1 200 ") < 3000:
            chunk = s.recv(1 << 16)
            assert chunk, f"closed after {got.count(b'HTTP/1.1 200 ')} answers"
            got += chunk
    assert grown < 24 << 10, f"the service's peak memory grew by {grown >> 10} MiB"


def test_a_body_that_stops_coming_is_closed_at_the_body_timeout_and_commits_nothing(
    service: CommitService, sqlite: SqlStore, tmp_path: Path
) -> None:
    root = f"file:{tmp_path}/lake/t"
    sock = socket.create_connection(("127.0.0.1", service.port), timeout=load_scaled(30))
    try:
        sock.sendall(
            (
                f"POST /v1/commits/0?root={root} HTTP/1.1\r\nHost: x\r\n"
                f"Authorization: Bearer {service.token}\r\nContent-Length: {len(V0)}\r\n\r\n"
            ).encode()
            + V0[:10]
        )
        closed, _ = closed_within(sock, 2 + load_scaled(4))
    finally:
        sock.close()
    assert closed
    assert sqlite.list_tables() == []


def test_connections_beyond_the_concurrency_limit_get_503(sqlite: SqlStore, tmp_path: Path) -> None:
    svc = started(sqlite, tmp_path, "--limit-concurrency", "10", "--timeout-headers", "60")
    held = [socket.create_connection(("127.0.0.1", svc.port)) for _ in range(12)]
    try:
        time.sleep(0.5)
        over = svc.request("GET", "/health", token=None)
    finally:
        for s in held:
            s.close()
    try:
        deadline = time.monotonic() + load_scaled(10)
        while (
            after := svc.request("GET", "/health", token=None)
        ).status != 200 and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        svc.stop()
    assert over.status == 503
    assert after.status == 200


def test_an_idle_keep_alive_connection_is_closed_at_the_keep_alive_timeout(
    sqlite: SqlStore, tmp_path: Path
) -> None:
    svc = started(sqlite, tmp_path, "--timeout-keep-alive", "1")
    try:
        sock = socket.create_connection(("127.0.0.1", svc.port), timeout=load_scaled(30))
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        time.sleep(0.2)
        sock.recv(4096)
        closed, _ = closed_within(sock, 1 + load_scaled(3))
        sock.close()
    finally:
        svc.stop()
    assert closed


def self_signed(folder: Path) -> tuple[Path, Path]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    import ipaddress

    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
        .sign(key, hashes.SHA256())
    )
    certfile, keyfile = folder / "cert.pem", folder / "key.pem"
    certfile.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    keyfile.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    keyfile.chmod(0o600)
    return certfile, keyfile


def test_https_with_a_self_signed_certificate(sqlite: SqlStore, tmp_path: Path) -> None:
    certfile, keyfile = self_signed(tmp_path)
    lake = tmp_path / "lake"
    lake.mkdir()
    svc = CommitService(
        sqlite.url,
        [f"file:{lake}/"],
        extra_args=["--ssl-certfile", str(certfile), "--ssl-keyfile", str(keyfile)],
        log_path=tmp_path / "serve.log",
    )
    plain_get = svc.request

    def tls_request(method: str, path: str, body: bytes | None = None, **kw: object) -> object:
        context = ssl.create_default_context(cafile=str(certfile))
        conn = http.client.HTTPSConnection("127.0.0.1", svc.port, context=context, timeout=load_scaled(30))
        return plain_get(method, path, body, conn=conn, **kw)  # type: ignore[arg-type]

    svc.request = tls_request  # type: ignore[method-assign,assignment]
    svc.start()
    try:
        commit = svc.post(f"file:{lake}/t", 0, V0)
        with pytest.raises((ConnectionError, http.client.HTTPException, OSError)):
            plain_get("GET", "/health", token=None)
        untrusted = ssl.create_default_context()
        with pytest.raises(ssl.SSLError):
            http.client.HTTPSConnection("127.0.0.1", svc.port, context=untrusted, timeout=10).request(
                "GET", "/health"
            )
    finally:
        svc.stop()
    assert commit.status == 201, commit.body
    assert "https://" in svc.log()


def test_the_service_uses_only_uvicorn_s_public_names() -> None:
    """No import of ``uvicorn.<module>`` (its protocols, loops, config, server), no subclass of them:
    the service keeps working across uvicorn versions (``guard.py`` wraps, it does not subclass)."""
    found = []
    for path in sorted(SERVICE_PACKAGE.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("uvicorn"):
                found.append(f"{path.name}: from {node.module} import ...")
            if isinstance(node, ast.Import):
                found += [
                    f"{path.name}: import {a.name}" for a in node.names if a.name.startswith("uvicorn.")
                ]
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id == "uvicorn"
                and node.attr != "run"
            ):
                found.append(f"{path.name}: uvicorn.{node.attr}")
    assert found == []
