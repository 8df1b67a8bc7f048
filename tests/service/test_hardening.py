"""Issue 39: ``delta-mirror serve`` under hostile input, over raw sockets against the real process
and a real SQLite store. Every bad input is one 4xx line, never a 500; the store changes only by a
valid commit; a store that is down is ``503 store unavailable`` naming nothing of the store; the
caches keyed by what clients send stay small; ``s3a://lake/w//t`` is the table at ``s3://lake/w/t``.
The connection limits (head size and time, body time, concurrency) are in test_hardening_limits.py.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest
from sqlalchemy import func, select
from support.commit_service import FIRST_COMMIT as V0
from support.commit_service import CommitService, commit_file
from support.commit_service import add_line as add
from support.services import free_port
from support.stores import sqlite_store
from support.waiting import load_scaled

from delta_mirror.store import SqlStore
from delta_mirror.store.schema import dl_commits, dl_tables

MAX_BODY = 64 * 1024


class Raw:
    """One raw connection: bytes out, replies (status, body) read in order."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=load_scaled(30))
        self.buffer = b""

    def _fill(self) -> None:
        chunk = self.sock.recv(1 << 16)
        if not chunk:
            raise ConnectionError(f"closed by the service; unread: {self.buffer[:200]!r}")
        self.buffer += chunk

    def reply(self) -> tuple[int, bytes]:
        while b"\r\n\r\n" not in self.buffer:
            self._fill()
        head, self.buffer = self.buffer.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        length = next(
            (int(x.split(":", 1)[1]) for x in lines[1:] if x.lower().startswith("content-length:")), 0
        )
        while len(self.buffer) < length:
            self._fill()
        body, self.buffer = self.buffer[:length], self.buffer[length:]
        return int(lines[0].split()[1]), body

    def close(self) -> None:
        self.sock.close()


def request(method: str, target: str, body: bytes = b"", token: str | None = None) -> bytes:
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    return (
        f"{method} {target} HTTP/1.1\r\nHost: x\r\n{auth}Content-Length: {len(body)}\r\n\r\n".encode() + body
    )


def one_line_4xx(status: int, body: bytes, code: str = "bad_request") -> None:
    assert 400 <= status < 500, (status, body[:300])
    assert b"\n" not in body and json.loads(body)["code"] == code, body[:300]


def store_rows(store: SqlStore) -> tuple[int, int]:
    with store.engine.connect() as conn:
        tables = conn.execute(select(func.count()).select_from(dl_tables)).scalar_one()
        commits = conn.execute(select(func.count()).select_from(dl_commits)).scalar_one()
    return int(tables), int(commits)


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


@pytest.fixture
def lake(tmp_path: Path) -> Path:
    path = tmp_path / "lake"
    path.mkdir()
    return path


@pytest.fixture
def sqlite(tmp_path: Path) -> Iterator[SqlStore]:
    _, store = sqlite_store(tmp_path)
    yield store
    store.close()


@pytest.fixture
def service(sqlite: SqlStore, lake: Path, tmp_path: Path) -> Iterator[CommitService]:
    svc = CommitService(
        sqlite.url,
        [f"file:{lake}/", "s3a://lake/warehouse/"],
        extra_args=["--max-body-bytes", str(MAX_BODY)],
        log_path=tmp_path / "serve.log",
    ).start()
    yield svc
    svc.stop()
    log = svc.log()
    assert svc.token not in log, "the token must never be logged"
    assert "Traceback" not in log and "RecursionError" not in log, log[-3000:]


def root_query(root: str) -> str:
    return f"?root={quote(root, safe='')}"


# -- findings 1 and 2: the probes of the retired fast path, kept against the service -------------------


def test_600_pipelined_refusals_without_a_token_are_each_answered_once(
    service: CommitService, sqlite: SqlStore, lake: Path
) -> None:
    before = store_rows(sqlite)
    target = f"/v1/commits/0{root_query(f'file:{lake}/t')}"
    batch = request("GET", "/health") + request("POST", target, V0) * 600
    wire = Raw(service.port)
    sender = threading.Thread(target=wire.sock.sendall, args=(batch,))
    try:
        sender.start()
        replies = [wire.reply() for _ in range(601)]
    finally:
        sender.join(load_scaled(60))
        wire.close()
    assert [s for s, _ in replies] == [200] + [401] * 600
    assert store_rows(sqlite) == before


def test_an_over_limit_chunked_body_sent_while_the_writer_is_not_reading_is_413(
    service: CommitService, sqlite: SqlStore, lake: Path
) -> None:
    before = store_rows(sqlite)
    body = b"x" * (4 * MAX_BODY)
    head = (
        f"POST /v1/commits/0{root_query(f'file:{lake}/t')} HTTP/1.1\r\nHost: x\r\n"
        f"Authorization: Bearer {service.token}\r\nTransfer-Encoding: chunked\r\n\r\n"
    ).encode()
    chunks = b"".join(b"%x\r\n%s\r\n" % (8192, body[i : i + 8192]) for i in range(0, len(body), 8192))
    wire = Raw(service.port)
    try:
        with contextlib.suppress(OSError):  # all written before a byte is read; it may close once it answered
            wire.sock.sendall(head + chunks + b"0\r\n\r\n")
        status, answer = wire.reply()
    finally:
        wire.close()
    one_line_4xx(status, answer, "too_large")
    assert status == 413
    assert store_rows(sqlite) == before


# -- finding 5: every bad input is one 4xx line ---------------------------------------------------------

BAD_VERSIONS = ["9" * 5000, "9" * 20, "1" + "0" * 19, "+1", "\u0661", "1_000", "0x1", "-0", " 1"]


@pytest.mark.parametrize("raw", BAD_VERSIONS, ids=lambda r: f"{r[:12]!r}-{len(r)}")
def test_a_bad_version_is_one_400_line_on_post_and_get(
    service: CommitService, sqlite: SqlStore, lake: Path, raw: str
) -> None:
    before = store_rows(sqlite)
    path = f"/v1/commits/{quote(raw, safe='')}{root_query(f'file:{lake}/t')}"
    wire = Raw(service.port)
    try:
        wire.sock.sendall(request("POST", path, V0, service.token) + request("GET", path, b"", service.token))
        answers = [wire.reply(), wire.reply()]
    finally:
        wire.close()
    for status, body in answers:
        one_line_4xx(status, body)
    assert store_rows(sqlite) == before


def bad_roots(lake: Path) -> list[str]:
    return [
        f"file:{lake}/t\x00x",
        f"file:{lake}/t\x01",
        f"file:{lake}/t\x7f",
        f"file:{lake}/{'a' * 5000}",
        f"file:{lake}/{'a' * 256}",
        f"file:{lake}/t.",
        f"file:{lake}/t/..",
        f"file:{lake}/t%00",
        "s3a://lake/warehouse/t\x00",
        "s3a://lake/warehouse/t.",
        "s3a://lake/warehouse/a%2Fb",
        "s3a://lake/warehouse/" + "b" * 5000,
        "s3a://lake/warehouse/%ff",
        "s3a://lake/warehouse/" + "c/" * 3000,
        "",
    ]


@pytest.mark.parametrize("index", range(15))
def test_a_bad_root_is_one_400_line_on_every_route(
    service: CommitService, sqlite: SqlStore, lake: Path, index: int
) -> None:
    root = bad_roots(lake)[index]
    before = store_rows(sqlite)
    query = root_query(root)
    wire = Raw(service.port)
    try:
        wire.sock.sendall(
            request("POST", f"/v1/commits/0{query}", V0, service.token)
            + request("GET", f"/v1/commits/0{query}", b"", service.token)
            + request("GET", f"/v1/latest{query}", b"", service.token)
        )
        answers = [wire.reply() for _ in range(3)]
    finally:
        wire.close()
    for status, body in answers:
        one_line_4xx(status, body)
    assert store_rows(sqlite) == before


# -- finding 8: one table per location ---------------------------------------------------------------


@pytest.mark.parametrize(
    "twin",
    [
        "s3a://lake/warehouse//t",
        "s3://lake/warehouse/t/",
        "s3n://lake//warehouse/t//",
        "S3A://lake/warehouse/%74",
    ],
)
def test_another_spelling_of_a_root_is_the_same_table(
    service: CommitService, sqlite: SqlStore, twin: str
) -> None:
    first = service.post("s3a://lake/warehouse/t", 0, V0)
    assert first.status == 201, first.body
    again = service.post(twin, 0, V0)
    assert (again.status, again.json().get("existing")) == (200, True), again.body
    other = service.post(twin, 0, commit_file(add("other.parquet")))
    assert other.status == 409, other.body
    assert service.post(twin, 1, commit_file(add("a.parquet"))).status == 201
    assert store_rows(sqlite) == (1, 2)


# -- finding 4: a store that is down names nothing of it --------------------------------------------


def test_a_store_that_is_down_is_503_store_unavailable_naming_nothing_of_it(
    lake: Path, tmp_path: Path
) -> None:
    port = free_port()
    dead = f"postgresql+psycopg://mirror_user:hunter2@127.0.0.1:{port}/mirror_db"
    service = CommitService(dead, [f"file:{lake}/"], log_path=tmp_path / "serve.log").start(ready=503)
    try:
        answers = [
            service.post(f"file:{lake}/t", 0, V0),
            service.get(f"file:{lake}/t", 0),
            service.latest(f"file:{lake}/t"),
            service.request("GET", "/health"),
        ]
    finally:
        service.stop()
    for answer in answers:
        assert answer.status == 503 and answer.headers["retry-after"].isdigit(), answer.body
        text = answer.body.decode()
        assert "\n" not in text
        for secret in (
            "mirror_user",
            "hunter2",
            "127.0.0.1",
            str(port),
            "mirror_db",
            "postgresql",
            "psycopg",
        ):
            assert secret not in text, (secret, text)
    for answer in answers[:3]:
        assert answer.json()["code"] == "unavailable" and "store unavailable" in answer.json()["error"]
    log = service.log()
    assert "hunter2" not in log and "mirror_user" in log, "the log has the detail, the password masked"
    assert "warning: --store carries a password" in log, "a password on the command line is warned of"


# -- finding 6: caches keyed by what clients send stay small -------------------------------------------


def test_400_queries_of_60_kib_leave_no_24_mb_behind(service: CommitService, lake: Path) -> None:
    assert service.proc is not None
    pid = service.proc.pid
    wire = Raw(service.port)
    try:

        def queries(n: int, size: int) -> None:
            for _ in range(n):
                pad = uuid.uuid4().hex * (size // 32)
                wire.sock.sendall(
                    request("GET", f"/v1/latest?pad={pad}&root=file:{lake}/t", b"", service.token)
                )
                status, _ = wire.reply()
                assert status == 404

        queries(20, 60 << 10)  # warm up: buffers and arenas at their working size
        before = rss_kib(pid)
        queries(400, 60 << 10)
        after = rss_kib(pid)
    finally:
        wire.close()
    assert after - before < 8 << 10, f"the service grew by {(after - before) >> 10} MiB"
