"""Specification of ``POST /v1/commits/<version>`` answered from uvicorn's parser (``commit_http``).

Over raw sockets against a real ``delta-mirror serve`` and a real store: the same answers, byte for
byte but the date, as the ASGI route (``--access-log`` sends every request through uvicorn's own
request cycle, so a service started with it is the reference); pipelined requests answered in
order; ``Expect: 100-continue``; chunked bodies; ``Connection: close`` and HTTP/1.0; a writer that
hangs up while its commit runs; a shutdown with a commit in flight. And the uvicorn internals the
protocol relies on, checked so that an upgrade that changes them fails here first.
"""

from __future__ import annotations

import inspect
import re
import socket
import threading
import time
import tomllib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from support.builders import action, add_body, log_line, metadata_body, protocol_body
from support.commit_service import CommitService
from support.services import free_port
from support.waiting import load_scaled
from uvicorn import Config, Server

from delta_mirror.commit_http import CommitProtocol
from delta_mirror.commit_service import create_app
from delta_mirror.store import SqlStore

MAX_BODY = 64 * 1024
REPO = Path(__file__).resolve().parent.parent


def commit_file(*actions: str) -> bytes:
    info = log_line(action("commitInfo", {"timestamp": 1700000000000, "operation": "WRITE"}))
    return "".join(f"{x}\n" for x in (info, *actions)).encode()


def add(path: str) -> str:
    return log_line(action("add", add_body(path, size=10, modificationTime=1700000000000)))


V0 = commit_file(
    log_line(action("protocol", protocol_body(1, 2))),
    log_line(
        action(
            "metaData", metadata_body(id="a6b9e1c2-0000-4000-8000-000000000000", created_time=1700000000000)
        )
    ),
    add("part-0.parquet"),
)


@dataclass
class Reply:
    status: int
    headers: list[tuple[str, str]]
    body: bytes

    def header(self, name: str) -> str | None:
        return next((v for n, v in self.headers if n == name), None)


class Wire:
    """One raw connection: requests written as bytes, replies read in order."""

    def __init__(self, port: int, *, sock: socket.socket | None = None) -> None:
        self.sock = sock or socket.create_connection(("127.0.0.1", port), timeout=load_scaled(30))
        self.buffer = b""

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _fill(self) -> None:
        chunk = self.sock.recv(65536)
        if not chunk:
            raise ConnectionError(f"closed by the service; unread: {self.buffer!r}")
        self.buffer += chunk

    def reply(self) -> Reply:
        while b"\r\n\r\n" not in self.buffer:
            self._fill()
        head, self.buffer = self.buffer.split(b"\r\n\r\n", 1)
        status_line, *lines = head.decode("latin-1").split("\r\n")
        headers = [(n.lower(), v.strip()) for n, v in (x.split(":", 1) for x in lines)]
        status = int(status_line.split()[1])
        length = int(next((v for n, v in headers if n == "content-length"), "0"))
        while len(self.buffer) < length:
            self._fill()
        body, self.buffer = self.buffer[:length], self.buffer[length:]
        return Reply(status, headers, body)

    def closed(self) -> bool:
        """Whether the service closes the connection (nothing more to read)."""
        return self.buffer == b"" and self.sock.recv(1) == b""

    def close(self) -> None:
        self.sock.close()


def post(
    root: str,
    version: int | str,
    body: bytes,
    token: str | None,
    *,
    extra: str = "",
    http: str = "HTTP/1.1",
) -> bytes:
    auth = f"Authorization: Bearer {token}\r\n" if token is not None else ""
    head = (
        f"POST /v1/commits/{version}?root={quote(root, safe='')} {http}\r\nHost: x\r\n{auth}"
        f"Content-Length: {len(body)}\r\n{extra}\r\n"
    )
    return head.encode() + body


def chunked(root: str, version: int, body: bytes, token: str, *, piece: int = 100) -> bytes:
    head = (
        f"POST /v1/commits/{version}?root={quote(root, safe='')} HTTP/1.1\r\nHost: x\r\n"
        f"Authorization: Bearer {token}\r\nTransfer-Encoding: chunked\r\n\r\n"
    ).encode()
    parts = [body[i : i + piece] for i in range(0, len(body), piece)]
    return head + b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"


@pytest.fixture
def lake(tmp_path: Path) -> Path:
    path = tmp_path / "lake"
    path.mkdir()
    return path


def serve(store: SqlStore, lake: Path, log: Path, *extra: str) -> CommitService:
    args = ["--max-body-bytes", str(MAX_BODY), *extra]
    return CommitService(store.url, [f"file:{lake}/"], extra_args=args, log_path=log).start()


@pytest.fixture
def service(store: SqlStore, lake: Path, tmp_path: Path) -> Iterator[CommitService]:
    svc = serve(store, lake, tmp_path / "serve.log")
    yield svc
    svc.stop()
    assert svc.token not in svc.log(), "the token must never be logged"
    assert "Traceback" not in svc.log()


def root_of(lake: Path, name: str = "t") -> str:
    return f"file:{lake}/{name}"


# -- the same answers as the ASGI route ---------------------------------------------------------


def conversation(svc: CommitService, lake: Path) -> list[Reply]:
    """Every kind of answer the commit route gives, over one keep-alive connection."""
    root, token = root_of(lake), svc.token
    outside = f"file:{lake.parent}/elsewhere/t"
    requests = [
        post(root, 0, V0, token),  # 201, the table created
        post(root, 0, V0, token),  # 200 existing: the LogStore's retry
        post(root, 0, commit_file(add("other.parquet")), token),  # 409
        post(root, 1, commit_file(add("a.parquet")), None),  # 401 without a token
        post(root, 1, commit_file(add("a.parquet")), "wrong"),  # 401 with a wrong one
        post(root, 1, commit_file(add("a.parquet")), token).replace(b"?root=", b"?nothing="),  # 400
        post(root, "1x", commit_file(add("a.parquet")), token),  # 400: no version
        post(root, 1 << 63, commit_file(add("a.parquet")), token),  # 400: over a long
        post(root, 1, b"x" * (MAX_BODY + 1), token),  # 413 by its length
        chunked(root, 1, b"x" * (MAX_BODY + 1), token, piece=8192),  # 413 while it streams
        post(outside, 0, V0, token),  # 403: not under an allowed root
        post(f"file:{lake}/missing", 3, commit_file(add("a.parquet")), token),  # 404 unknown table
        post(root, 1, b"not json\n", token),  # 422
        post(root, 5, commit_file(add("gap.parquet")), token),  # a gap: refused
        post(root, 1, commit_file(add("a.parquet")), token, extra="Expect: 100-continue\r\n"),
        chunked(root, 2, commit_file(add("b.parquet")), token),  # 201 from a chunked body
        post(root, 3, commit_file(add("c.parquet")), token, http="HTTP/1.0"),  # then closed
    ]
    wire = Wire(svc.port)
    replies = []
    try:
        for request in requests:
            wire.send(request)
            replies.append(wire.reply())
            if replies[-1].status == 100:  # the interim answer to Expect: 100-continue
                replies.append(wire.reply())
        assert wire.closed(), "HTTP/1.0 without keep-alive: the service closes the connection"
    finally:
        wire.close()
    return replies


def comparable(replies: list[Reply], lake: Path) -> list[tuple[int, list[tuple[str, str]], str]]:
    return [
        (
            r.status,
            [(n, v) for n, v in r.headers if n != "date"],
            r.body.decode().replace(str(lake.parent), "<dir>"),
        )
        for r in replies
    ]


def test_the_commit_route_answers_byte_for_byte_as_the_asgi_route_does(tmp_path: Path) -> None:
    answers = {}
    for name, extra in (("asgi", ["--access-log"]), ("fast", [])):  # names of one length
        lake = tmp_path / name / "lake"
        lake.mkdir(parents=True)
        own = SqlStore(f"sqlite:///{tmp_path / name / 'store.db'}")
        own.init()
        own.close()
        svc = serve(own, lake, tmp_path / f"{name}.log", *extra)
        try:
            answers[name] = comparable(conversation(svc, lake), lake)
        finally:
            svc.stop()
        assert "Traceback" not in svc.log()
    assert [a[0] for a in answers["fast"]] == [
        201, 200, 409, 401, 401, 400, 400, 400, 413, 413, 403, 404, 422, 422, 100, 201, 201, 201,
    ]  # fmt: skip
    assert answers["fast"] == answers["asgi"]
    assert "POST /v1/commits" in (tmp_path / "asgi.log").read_text()  # it did take uvicorn's cycle


def test_pipelined_commits_are_answered_in_order_among_other_routes(
    service: CommitService, lake: Path
) -> None:
    root, token = root_of(lake), service.token
    get_latest = f"GET /v1/latest?root={quote(root, safe='')} HTTP/1.1\r\nHost: x\r\n"
    get_latest += f"Authorization: Bearer {token}\r\n\r\n"
    batch = [post(root, 0, V0, token)]
    batch += [post(root, v, commit_file(add(f"p{v}.parquet")), token) for v in range(1, 4)]
    batch += [post(root, 4, commit_file(add("x.parquet")), "wrong"), get_latest.encode()]
    batch += [chunked(root, v, commit_file(add(f"p{v}.parquet")), token) for v in range(4, 7)]
    batch += [post(root, 2, commit_file(add("late.parquet")), token)]
    wire = Wire(service.port)
    try:
        wire.send(b"".join(batch))  # all of it in one write: the parser sees them back to back
        replies = [wire.reply() for _ in batch]
    finally:
        wire.close()
    assert [r.status for r in replies] == [201, 201, 201, 201, 401, 200, 201, 201, 201, 409]
    assert [r.body.count(b'"version":') and int(re.findall(rb'"version":(\d+)', r.body)[0]) for r in replies] == [
        0, 1, 2, 3, 0, 3, 4, 5, 6, 0,
    ]  # fmt: skip


def test_three_hundred_pipelined_commits_on_one_connection_land_in_order(
    service: CommitService, lake: Path
) -> None:
    """More than the socket buffers hold at once: reading pauses while answers are pending."""
    root, token = root_of(lake), service.token
    batch = [post(root, 0, V0, token)]
    batch += [
        post(root, v, commit_file(add(f"part-{v:05d}.parquet" + "x" * 900)), token) for v in range(1, 300)
    ]
    wire = Wire(service.port)
    sender = threading.Thread(target=wire.send, args=(b"".join(batch),))
    try:
        sender.start()
        replies = [wire.reply() for _ in batch]
    finally:
        sender.join(load_scaled(60))
        wire.close()
    assert [(r.status, int(re.findall(rb'"version":(\d+)', r.body)[0])) for r in replies] == [
        (201, v) for v in range(300)
    ]


def test_expect_100_continue_is_answered_only_when_the_checks_pass(
    service: CommitService, lake: Path
) -> None:
    root, token = root_of(lake), service.token
    wire = Wire(service.port)
    try:
        wire.send(
            post(root, 0, b"", "wrong", extra="Expect: 100-continue\r\n").replace(b"Length: 0", b"Length: 5")
        )
        assert wire.reply().status == 401  # no 100 Continue: the writer need not send its body
        wire.close()
        wire = Wire(service.port)
        request = post(root, 0, V0, token, extra="Expect: 100-continue\r\n")
        head, body = request.split(b"\r\n\r\n", 1)
        wire.send(head + b"\r\n\r\n")
        assert wire.reply().status == 100
        wire.send(body)
        assert wire.reply().status == 201
    finally:
        wire.close()


def test_connection_close_is_honoured_after_the_answer(service: CommitService, lake: Path) -> None:
    wire = Wire(service.port)
    try:
        wire.send(post(root_of(lake), 0, V0, service.token, extra="Connection: close\r\n"))
        reply = wire.reply()
        assert (reply.status, reply.header("connection")) == (201, "close")
        assert wire.closed()
    finally:
        wire.close()


def test_a_writer_that_hangs_up_mid_commit_still_gets_its_commit_and_logs_nothing(
    service: CommitService, lake: Path, store: SqlStore
) -> None:
    token = service.token
    for n in range(20):  # hung up right after sending: most of them while their commit runs
        wire = Wire(service.port)
        wire.send(post(root_of(lake, f"t{n}"), 0, V0, token))
        wire.sock.shutdown(socket.SHUT_RDWR)
        wire.close()
    deadline = time.monotonic() + load_scaled(60)
    while time.monotonic() < deadline:
        wire = Wire(service.port)
        try:
            latest = []
            for n in range(20):
                wire.send(
                    f"GET /v1/latest?root={quote(root_of(lake, f't{n}'), safe='')} HTTP/1.1\r\n"
                    f"Host: x\r\nAuthorization: Bearer {token}\r\n\r\n".encode()
                )
                latest.append(wire.reply().status)
        finally:
            wire.close()
        if latest == [200] * 20:
            break
        time.sleep(0.2)
    assert latest == [200] * 20
    assert "Traceback" not in service.log() and "ERROR" not in service.log()


def test_a_commit_in_flight_at_shutdown_completes_and_is_answered(service: CommitService, lake: Path) -> None:
    request = post(root_of(lake), 0, V0, service.token)
    wire = Wire(service.port)
    try:
        wire.send(request[:-10])  # the request has begun; its last bytes come after the signal
        time.sleep(0.3 * load_scaled(1))
        assert service.proc is not None
        service.proc.terminate()
        time.sleep(0.3 * load_scaled(1))
        wire.send(request[-10:])
        reply = wire.reply()
        assert (reply.status, reply.header("connection")) == (201, "close")
        assert wire.closed()
        service.proc.wait(load_scaled(30))  # uvicorn ends by re-raising the SIGTERM it handled
        assert "Application shutdown complete" in service.log()
    finally:
        wire.close()


# -- the uvicorn internals it relies on ---------------------------------------------------------


def test_the_uvicorn_internals_the_protocol_relies_on_are_still_there() -> None:
    """A uvicorn upgrade that changes these must fail here, not in production."""
    import uvicorn
    from uvicorn.protocols.http import httptools_impl

    pinned = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    spec = next(d for d in pinned if d.startswith("uvicorn"))
    assert spec == "uvicorn>=0.54,<0.55", spec
    assert uvicorn.__version__.startswith("0.54."), uvicorn.__version__
    proto = httptools_impl.HttpToolsProtocol
    source = {
        name: inspect.getsource(getattr(proto, name)) for name in dir(proto) if not name.startswith("__")
    }
    # The request cycle's attributes uvicorn itself touches (our _Commit stands in for it).
    assert "self.cycle.disconnected = True" in source["connection_lost"]
    assert "self.cycle.message_event.set()" in source["connection_lost"]
    assert "self.cycle.keep_alive = False" in source["shutdown"]
    assert "self.cycle.response_complete" in source["shutdown"]
    # Pipelining: queued (cycle, app) pairs started by _start_asgi_task when a response completes.
    assert "self.pipeline.appendleft((self.cycle, app))" in source["on_headers_complete"]
    assert "self._start_asgi_task(cycle, app)" in source["on_response_complete"]
    assert "self.flow.resume_reading()" in source["on_response_complete"]
    assert "self.timeout_keep_alive_handler" in source["on_response_complete"]
    for callback in ("on_body", "on_message_complete", "on_url", "on_header", "on_message_begin"):
        assert callback in source, callback
    assert "self.expect_100_continue = True" in source["on_header"]
    assert "self.url += url" in source["on_url"]
    assert set(httptools_impl.STATUS_LINE) >= {100, 200, 201, 400, 401, 403, 404, 409, 413, 422, 500, 503}
    from uvicorn.protocols.http.flow_control import FlowControl

    flow = inspect.getsource(FlowControl)
    assert "self.write_paused = True" in flow and "def pause_reading" in flow


@contextmanager
def in_process(
    store: SqlStore, lake: Path, protocol: type[CommitProtocol] = CommitProtocol
) -> Iterator[Server]:
    """The service's app under uvicorn in this process (a thread), to look inside its protocol."""
    app = create_app(store, token=None, allowed_roots=[f"file:{lake}/"])
    server = Server(Config(app, host="127.0.0.1", port=free_port(), http=protocol, access_log=False))
    thread = threading.Thread(target=server.run)
    thread.start()
    try:
        deadline = time.monotonic() + load_scaled(30)
        while not server.started and time.monotonic() < deadline:
            time.sleep(0.05)
        assert server.started
        yield server
    finally:
        server.should_exit = True
        thread.join(load_scaled(30))


def test_a_commit_is_answered_by_the_protocol_itself_and_other_routes_by_asgi(
    store: SqlStore, lake: Path
) -> None:
    """No asyncio Task for a commit; a GET gets uvicorn's own request cycle."""
    from delta_mirror.cli import service as cli_service

    assert "CommitProtocol" in inspect.getsource(cli_service)  # what `serve` runs
    with in_process(store, lake) as server:
        wire = Wire(server.config.port)
        try:
            wire.send(post(root_of(lake), 0, V0, None))
            assert wire.reply().status == 201
            (connection,) = server.server_state.connections
            assert isinstance(connection, CommitProtocol)
            assert type(connection.cycle).__name__ == "_Commit"
            assert server.server_state.tasks == set()
            wire.send(
                f"GET /v1/latest?root={quote(root_of(lake), safe='')} HTTP/1.1\r\nHost: x\r\n\r\n".encode()
            )
            assert wire.reply().status == 200
            assert type(connection.cycle).__name__ == "RequestResponseCycle"
        finally:
            wire.close()


class _SmallBuffers(CommitProtocol):
    """Small socket and transport buffers, so that a writer not reading fills them fast; counts pauses."""

    paused = 0

    def connection_made(self, transport: Any) -> None:
        transport.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        transport.set_write_buffer_limits(high=1024)
        super().connection_made(transport)

    def pause_writing(self) -> None:
        type(self).paused += 1
        super().pause_writing()


def test_answers_wait_while_a_writer_does_not_read_them_and_all_arrive_in_order(
    store: SqlStore, lake: Path
) -> None:
    root = root_of(lake)
    batch = [post(root, 0, V0, None)] + [
        post(root, v, commit_file(add(f"p{v}.parquet")), None) for v in range(1, 200)
    ]
    _SmallBuffers.paused = 0
    with in_process(store, lake, _SmallBuffers) as server:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.settimeout(load_scaled(60))
        sock.connect(("127.0.0.1", server.config.port))
        wire = Wire(0, sock=sock)
        sender = threading.Thread(target=sock.sendall, args=(b"".join(batch),))
        try:
            sender.start()
            deadline = time.monotonic() + load_scaled(60)
            while not _SmallBuffers.paused and time.monotonic() < deadline:
                time.sleep(0.05)
            assert _SmallBuffers.paused, "the answers never filled the buffers"
            replies = [wire.reply() for _ in batch]
        finally:
            sender.join(load_scaled(60))
            sock.close()
    assert [(r.status, int(re.findall(rb'"version":(\d+)', r.body)[0])) for r in replies] == [
        (201, v) for v in range(200)
    ]
