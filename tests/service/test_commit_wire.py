"""Specification of ``POST /v1/commits/<version>`` on the wire, over raw sockets against a real
``delta-mirror serve`` and a real store: every kind of answer on one keep-alive connection;
pipelined requests answered in order; ``Expect: 100-continue``; chunked bodies and the body limit;
``Connection: close`` and HTTP/1.0; a writer that hangs up while its commit runs, one that reads
its answers slowly; a shutdown with a commit in flight.
"""

from __future__ import annotations

import json
import re
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import pytest
from support.commit_service import FIRST_COMMIT as V0
from support.commit_service import CommitService, commit_file
from support.commit_service import add_line as add
from support.waiting import load_scaled

from delta_mirror.store import SqlStore

MAX_BODY = 64 * 1024


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


def pipelined(wire: Wire, batch: list[bytes], *, read_after: float = 0.0) -> list[Reply]:
    """Send ``batch`` in one write from a thread (more than the socket buffers hold), start reading
    after ``read_after`` seconds, and return the replies in order."""
    sender = threading.Thread(target=wire.sock.sendall, args=(b"".join(batch),))
    try:
        sender.start()
        time.sleep(read_after)
        return [wire.reply() for _ in batch]
    finally:
        sender.join(load_scaled(60))
        wire.close()


def versions(replies: list[Reply]) -> list[tuple[int, int]]:
    return [(r.status, int(re.findall(rb'"version":(\d+)', r.body)[0])) for r in replies]


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


def test_every_kind_of_answer_on_one_keep_alive_connection(service: CommitService, lake: Path) -> None:
    replies = conversation(service, lake)
    assert [r.status for r in replies] == [
        201, 200, 409, 401, 401, 400, 400, 400, 413, 413, 403, 404, 422, 422, 100, 201, 201, 201,
    ]  # fmt: skip
    codes = [json.loads(r.body).get("code") if r.status >= 400 else None for r in replies]
    assert codes[3:14] == [
        "unauthorized", "unauthorized", "bad_request", "bad_request", "bad_request", "too_large",
        "too_large", "root_not_allowed", "unknown_table", "invalid", "invalid",
    ]  # fmt: skip
    for reply in replies:
        if reply.status != 100:
            assert reply.header("content-type") == "application/json"
            assert reply.body.count(b"\n") == 0
            assert int(reply.header("content-length") or -1) == len(reply.body)
    assert replies[-1].header("connection") == "close"  # HTTP/1.0 without keep-alive
    assert "Traceback" not in service.log()


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
    assert versions(pipelined(Wire(service.port), batch)) == [(201, v) for v in range(300)]


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


def test_answers_wait_while_a_writer_does_not_read_them_and_all_arrive_in_order(
    service: CommitService, lake: Path
) -> None:
    """A writer that pipelines 200 commits and reads nothing for a while, through small socket
    buffers: the service stops reading while its answers wait, and every answer arrives in order."""
    root, token = root_of(lake), service.token
    batch = [post(root, 0, V0, token)] + [
        post(root, v, commit_file(add(f"p{v}.parquet")), token) for v in range(1, 200)
    ]
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(load_scaled(60))
    sock.connect(("127.0.0.1", service.port))
    replies = pipelined(Wire(0, sock=sock), batch, read_after=2.0)
    assert versions(replies) == [(201, v) for v in range(200)]
