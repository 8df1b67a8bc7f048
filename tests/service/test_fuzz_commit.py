"""Issue 39's fuzz suite: property-based tests (hypothesis) of what ``POST /v1/commits/<version>``
parses — the version, the root, the headers, the framing (Content-Length or chunks), pipelining —
and of the commit-line checks, against a real ``delta-mirror serve`` on SQLite over raw sockets;
and a slow-client soak (slowloris, unread answers, half-open connections).

The invariant: **the store changes only by a valid commit, and every answer is one of the
documented codes** (docs/commit-service.md; never a 500). The service's memory and open
connections are sampled all along and must stay under its limits.

Bounded in time: ``make test`` runs the short profile (a fixed, small number of examples: seconds);
``make fuzz`` sets ``DELTA_MIRROR_FUZZ_SECONDS`` (600 by default there), split between the
properties and the soak, and prints the figures docs/commit-service.md ("Security") quotes.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import os
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import select
from support.commit_service import FIRST_COMMIT as V0
from support.commit_service import CommitService, commit_file
from support.commit_service import add_line as add
from support.stores import sqlite_store
from support.waiting import load_scaled

from delta_mirror.delta.actions import split_commit
from delta_mirror.errors import MirrorError
from delta_mirror.store import SqlStore
from delta_mirror.store.schema import dl_commits, dl_tables

SECONDS = float(os.environ.get("DELTA_MIRROR_FUZZ_SECONDS", "0") or 0)
SHORT_EXAMPLES = 25
#: Every status the service may answer (docs/commit-service.md); anything else fails the suite.
DOCUMENTED = {100, 200, 201, 400, 401, 403, 404, 405, 408, 409, 413, 422, 423, 431, 503}
MAX_BODY = 64 << 10
MAX_HEAD = 16 << 10
LIMIT_CONCURRENCY = 200
HEAD_SECONDS = 3
#: The service's memory may grow this much over its size after start, whatever the clients do:
#: measured +10.0-11.0 MiB (short profile, three runs 2026-11-29 04:50-04:52 UTC, load 5.5-7) and
#: +15.5 MiB (make fuzz, 10 minutes) since the guard caps pipelining; make fuzz before that cap:
#: +79.5 MiB (peak 138.3 MiB). 40 MiB leaves room for a loaded machine, and fails the uncapped growth.
MEMORY_HEADROOM_KIB = 40 << 10


def profile(max_examples: int) -> settings:
    """The suite's hypothesis settings: no deadline (a real service under load), no example
    database (nothing written into the repository), every example new."""
    return settings(
        max_examples=max_examples, deadline=None, database=None, suppress_health_check=list(HealthCheck)
    )


@dataclass
class Figures:
    """What a run saw; printed at the end (``make fuzz``)."""

    examples: int = 0
    requests: int = 0
    answers: dict[int, int] = field(default_factory=dict)
    server_errors: int = 0
    unexpected_store_changes: int = 0
    commits: int = 0
    peak_rss_kib: int = 0
    start_rss_kib: int = 0
    peak_connections: int = 0
    soak_clients: int = 0

    def answered(self, status: int) -> None:
        self.answers[status] = self.answers.get(status, 0) + 1
        if status >= 500 and status != 503:
            self.server_errors += 1


class Monitor:
    """Samples the service's resident memory and open sockets every 0.2 s."""

    def __init__(self, pid: int, figures: Figures) -> None:
        self.pid, self.figures = pid, figures
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def rss(self) -> int:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        return 0

    def sockets(self) -> int:
        count = 0
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{self.pid}/fd"):
                with contextlib.suppress(OSError):
                    count += os.readlink(f"/proc/{self.pid}/fd/{fd}").startswith("socket:")
        return count

    def _run(self) -> None:
        while not self.stop.wait(0.2):
            with contextlib.suppress(OSError):
                self.figures.peak_rss_kib = max(self.figures.peak_rss_kib, self.rss())
                self.figures.peak_connections = max(self.figures.peak_connections, self.sockets())


@dataclass
class Fuzzed:
    svc: CommitService
    store: SqlStore
    lake: Path
    figures: Figures
    monitor: Monitor


@pytest.fixture(scope="module")
def fuzzed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fuzzed]:
    folder = tmp_path_factory.mktemp("fuzz")
    lake = folder / "lake"
    lake.mkdir()
    _, store = sqlite_store(folder)
    svc = CommitService(
        store.url,
        [f"file:{lake}/", "s3a://lake/warehouse/"],
        extra_args=[
            "--max-body-bytes",
            str(MAX_BODY),
            "--max-header-bytes",
            str(MAX_HEAD),
            "--timeout-headers",
            str(HEAD_SECONDS),
            "--timeout-body",
            str(HEAD_SECONDS),
            "--limit-concurrency",
            str(LIMIT_CONCURRENCY),
        ],
        log_path=folder / "serve.log",
    ).start()
    assert svc.proc is not None
    figures = Figures()
    monitor = Monitor(svc.proc.pid, figures)
    figures.start_rss_kib = monitor.rss()
    monitor.thread.start()
    try:
        yield Fuzzed(svc, store, lake, figures, monitor)
    finally:
        monitor.stop.set()
        monitor.thread.join()
        svc.stop()
        store.close()
        log = svc.log()
        report = {
            "examples": figures.examples,
            "requests": figures.requests,
            "answers": dict(sorted(figures.answers.items())),
            "server_errors": figures.server_errors,
            "unexpected_store_changes": figures.unexpected_store_changes,
            "commits": figures.commits,
            "rss_start_mib": round(figures.start_rss_kib / 1024, 1),
            "rss_peak_mib": round(figures.peak_rss_kib / 1024, 1),
            "peak_open_sockets": figures.peak_connections,
            "soak_clients": figures.soak_clients,
            "tracebacks_in_log": log.count("Traceback"),
            "seconds": SECONDS,
        }
        print("\nfuzz figures: " + json.dumps(report))
        if path := os.environ.get("DELTA_MIRROR_FUZZ_REPORT"):
            Path(path).write_text(json.dumps(report, indent=1) + "\n")
        assert "Traceback" not in log, log[-3000:]
        assert svc.token not in log


def run_for(build: Callable[[settings], Callable[[], None]], share: float) -> None:
    """The ``@given`` test ``build`` makes, once with the short profile, or again and again (fresh
    examples each round) for ``share`` of ``DELTA_MIRROR_FUZZ_SECONDS``."""
    if SECONDS <= 0:
        build(profile(SHORT_EXAMPLES))()
        return
    deadline = time.monotonic() + SECONDS * share
    while time.monotonic() < deadline:
        build(profile(100))()


# -- requests -------------------------------------------------------------------------------------


def store_state(store: SqlStore) -> dict[tuple[str, int], str]:
    with store.engine.connect() as conn:
        rows = conn.execute(
            select(dl_tables.c.location, dl_commits.c.version, dl_commits.c.sha256).join(
                dl_commits, dl_commits.c.table_id == dl_tables.c.id
            )
        )
        return {(str(loc), int(v)): str(sha) for loc, v, sha in rows}


def read_replies(sock: socket.socket, expected: int) -> list[int]:
    """The statuses of up to ``expected`` final answers (100 skipped), until the service closes."""
    sock.settimeout(load_scaled(HEAD_SECONDS + 10))
    buffer, statuses = b"", list[int]()
    try:
        while len(statuses) < expected:
            while b"\r\n\r\n" not in buffer:
                chunk = sock.recv(1 << 16)
                if not chunk:
                    return statuses
                buffer += chunk
            head, buffer = buffer.split(b"\r\n\r\n", 1)
            lines = head.decode("latin-1").split("\r\n")
            status = int(lines[0].split()[1])
            length = next(
                (int(x.split(":", 1)[1]) for x in lines[1:] if x.lower().startswith("content-length:")), 0
            )
            while len(buffer) < length:
                chunk = sock.recv(1 << 16)
                if not chunk:
                    return [*statuses, status]
                buffer += chunk
            body, buffer = buffer[:length], buffer[length:]
            if status != 100:
                statuses.append(status)
                if status >= 400 and status != 503 and b'"code"' in body:
                    assert b"\n" not in body, body[:300]  # one line of JSON
    except (ConnectionResetError, TimeoutError):
        pass
    return statuses


@dataclass
class Sent:
    wire: bytes
    valid_body: bytes | None  # the body when it is a valid commit file, else None


ROOT_CHARS = st.characters(codec="utf-8", exclude_categories=["Cs"])


def root_strategy(lake: Path) -> st.SearchStrategy[str]:
    known = [f"file:{lake}/t{i}" for i in range(3)] + ["s3a://lake/warehouse/t", "s3a://lake/warehouse//t/"]
    fuzzed_tail = st.text(ROOT_CHARS, max_size=40)
    return st.one_of(
        st.sampled_from(known),
        st.builds(lambda k, t: k + t, st.sampled_from(known), fuzzed_tail),
        st.builds(lambda t: f"file:{lake}/{t}", fuzzed_tail),
        st.builds(lambda t: f"s3a://lake/warehouse/{t}", fuzzed_tail),
        st.text(ROOT_CHARS, max_size=60),
        st.sampled_from(["", "s3a://lake/warehouse/" + "x" * 300, "s3a://" + "a/" * 2500]),
    )


VERSIONS = st.one_of(
    st.integers(0, 3).map(str),
    st.integers(-5, 2**70).map(str),
    st.text("0123456789+-_ .xe\u0661", min_size=0, max_size=24),
    st.just("9" * 5000),
)

VALID_BODIES = st.sampled_from(
    [V0, commit_file(add("a.parquet")), commit_file(add("b.parquet"), add("c.parquet"))]
)


@st.composite
def bodies(draw: st.DrawFn) -> tuple[bytes, bool]:
    """A body and whether it is a valid commit file (as Delta-Spark writes one)."""
    kind = draw(st.sampled_from(["valid", "mutated", "bytes", "no_newline", "blank_line", "big"]))
    valid = draw(VALID_BODIES)
    if kind == "valid":
        return valid, True
    if kind == "mutated":
        at = draw(st.integers(0, len(valid) - 1))
        return valid[:at] + bytes([draw(st.integers(0, 255))]) + valid[at + 1 :], False
    if kind == "bytes":
        return draw(st.binary(max_size=300)), False
    if kind == "no_newline":
        return valid[:-1], False
    if kind == "blank_line":
        return valid + b"\n", False
    return b"x" * draw(st.sampled_from([MAX_BODY + 1, 2 * MAX_BODY])), False


HEADER_NAMES = st.text("abcdefghijklmnopqrstuvwxyz-", min_size=1, max_size=20)
HEADER_VALUES = st.text(st.characters(min_codepoint=0x20, max_codepoint=0xFF), max_size=60)


@st.composite
def requests(draw: st.DrawFn, lake: Path, token: str) -> Sent:
    root = draw(root_strategy(lake))
    version = draw(VERSIONS)
    body, valid = draw(bodies())
    quoting = draw(st.sampled_from(["", "/", ":/", ":/%"]))
    target = f"/v1/commits/{quote(version, safe='')}?root={quote(root, safe=quoting)}"
    auth = draw(st.sampled_from(["good", "good", "good", "none", "wrong", "odd"]))
    headers = [("Host", "x")]
    if auth == "good":
        headers.append(("Authorization", f"Bearer {token}"))
    elif auth == "wrong":
        headers.append(("Authorization", f"Bearer {token[:-1]}x"))
    elif auth == "odd":
        headers.append(("Authorization", draw(HEADER_VALUES)))
    headers += draw(st.lists(st.tuples(HEADER_NAMES, HEADER_VALUES), max_size=4))
    framing = draw(st.sampled_from(["length", "length", "chunked", "both", "double_length", "none"]))
    if framing == "chunked" or framing == "both":
        sizes = draw(st.lists(st.integers(1, 4096), min_size=1, max_size=8))
        pieces: list[bytes] = []
        at = 0
        while at < len(body):
            size = sizes[len(pieces) % len(sizes)]
            pieces.append(body[at : at + size])
            at += size
        payload = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n"
        headers.append(("Transfer-Encoding", "chunked"))
        if framing == "both":
            headers.append(("Content-Length", str(len(body))))
    elif framing == "double_length":
        payload = body
        headers += [("Content-Length", str(len(body))), ("Content-Length", str(len(body) + 1))]
    elif framing == "none":
        payload = b""
    else:
        payload = body
        headers.append(("Content-Length", str(len(body))))
    head = f"POST {target} HTTP/1.1\r\n" + "".join(f"{n}: {v}\r\n" for n, v in headers) + "\r\n"
    wire = head.encode("latin-1", "replace") + payload
    return Sent(wire, body if valid and auth == "good" and framing in ("length", "chunked") else None)


def check_exchange(f: Fuzzed, batch: list[Sent], split: list[int]) -> None:
    """Send ``batch`` on one connection (pipelined, cut at ``split``), read the answers, and check the
    invariant against the store."""
    before = store_state(f.store)
    data = b"".join(s.wire for s in batch)
    sock = socket.create_connection(("127.0.0.1", f.svc.port), timeout=load_scaled(30))
    try:
        cuts = sorted({c % (len(data) + 1) for c in split} | {0, len(data)})
        with contextlib.suppress(OSError):
            for a, b in itertools.pairwise(cuts):
                sock.sendall(data[a:b])
        statuses = read_replies(sock, len(batch))
    finally:
        sock.close()
    f.figures.examples += 1
    f.figures.requests += len(batch)
    for status in statuses:
        f.figures.answered(status)
    assert set(statuses) <= DOCUMENTED, statuses
    time.sleep(0.05)  # a commit whose answer we did not wait for lands now
    after = store_state(f.store)
    allowed = {hashlib.sha256(s.valid_body).hexdigest() for s in batch if s.valid_body is not None}
    changed = {k: v for k, v in after.items() if before.get(k) != v}
    gone = [k for k in before if k not in after]
    f.figures.commits += len(changed)
    bad = [k for k, v in changed.items() if v not in allowed] + gone
    f.figures.unexpected_store_changes += len(bad)
    assert not bad, f"the store changed by something no valid commit sent: {bad}"
    assert statuses.count(201) <= len(changed), (statuses, changed)


# -- the properties -------------------------------------------------------------------------------


def test_pipelined_fuzzed_commits_change_the_store_only_by_valid_commits(fuzzed: Fuzzed) -> None:
    def build(config: settings) -> Callable[[], None]:
        @config
        @given(st.data())
        def prop(data: st.DataObject) -> None:
            batch = data.draw(st.lists(requests(fuzzed.lake, fuzzed.svc.token), min_size=1, max_size=5))
            split = data.draw(st.lists(st.integers(0, 1 << 20), max_size=4))
            check_exchange(fuzzed, batch, split)

        return prop

    run_for(build, 0.6)
    assert fuzzed.figures.server_errors == 0


def test_raw_bytes_on_the_wire_are_answered_with_documented_codes(fuzzed: Fuzzed) -> None:
    prefixes = [b"", b"POST /v1/commits/0?root=file:/x/t HTTP/1.1\r\n", b"GET /v1/latest?root=", b"POST "]

    def build(config: settings) -> Callable[[], None]:
        @config
        @given(st.sampled_from(prefixes), st.binary(max_size=2000))
        def prop(prefix: bytes, noise: bytes) -> None:
            check_exchange(fuzzed, [Sent(prefix + noise + b"\r\n\r\n", None)], [])

        return prop

    run_for(build, 0.1)
    assert fuzzed.figures.server_errors == 0


def test_the_commit_line_checks_accept_exactly_or_refuse_in_one_line() -> None:
    def build(config: settings) -> Callable[[], None]:
        @config
        @given(st.binary(max_size=2000) | st.builds(lambda v, b: v + b, VALID_BODIES, st.binary(max_size=50)))
        def prop(data: bytes) -> None:
            try:
                lines, actions = split_commit(data, table="t", version=0)
            except MirrorError as exc:
                assert "\n" not in exc.message
                return
            assert b"".join(line.encode() + b"\n" for line in lines) == data and len(actions) == len(lines)

        return prop

    run_for(build, 0.05)


# -- the slow-client soak -------------------------------------------------------------------------


def slowloris(port: int, stop: float) -> None:
    """A head that never ends, a header line every half second."""
    while time.monotonic() < stop:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            s.sendall(b"POST /v1/commits/0?root=file:/x/t HTTP/1.1\r\nHost: x\r\n")
            while time.monotonic() < stop:
                s.sendall(b"X-a: b\r\n")
                time.sleep(0.5)


def unread(port: int, stop: float) -> None:
    """2,000 pipelined requests whose answers are never read, then gone."""
    while time.monotonic() < stop:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n" * 2000)
            time.sleep(1)


def half_open(port: int, stop: float) -> None:
    """A body cut short, then the client's side shut."""
    while time.monotonic() < stop:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            s.sendall(
                b"POST /v1/commits/1?root=file:/x/t HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nab"
            )
            s.shutdown(socket.SHUT_WR)
            time.sleep(1)


def test_slow_clients_keep_memory_and_connections_under_the_limits(fuzzed: Fuzzed) -> None:
    """Slowloris heads, answers never read, half-open connections: the service stays within its
    memory headroom and its connection limit, keeps answering, and closes them at its timeouts."""
    stop = time.monotonic() + max(SECONDS * 0.25, 4 * HEAD_SECONDS)
    port = fuzzed.svc.port
    errors: list[str] = []

    def healthy() -> None:
        while time.monotonic() < stop:
            time.sleep(1)
            try:
                status = fuzzed.svc.request("GET", "/health", token=None).status
            except OSError as exc:
                errors.append(f"health: {exc}")
                continue
            if status not in (200, 503):
                errors.append(f"health answered {status}")

    kinds = (slowloris,) * 20 + (unread,) * 10 + (half_open,) * 10
    threads = [threading.Thread(target=k, args=(port, stop)) for k in kinds] + [
        threading.Thread(target=healthy)
    ]
    fuzzed.figures.soak_clients += len(kinds)
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:5]
    figures = fuzzed.figures
    assert figures.peak_rss_kib - figures.start_rss_kib < MEMORY_HEADROOM_KIB, figures
    assert figures.peak_connections <= LIMIT_CONCURRENCY + 10, figures
    # every slow client's connection closed: at its deadline, or once the service has written (and
    # dropped) the answers already queued for a client that left
    deadline = time.monotonic() + HEAD_SECONDS + load_scaled(30)
    while fuzzed.monitor.sockets() > 4 and time.monotonic() < deadline:
        time.sleep(0.5)
    left = subprocess.run(
        ["ss", "-tn", f"sport = :{port}"], capture_output=True, text=True, check=False
    ).stdout
    assert fuzzed.monitor.sockets() <= 4, f"connections still open after the soak:\n{left}"
