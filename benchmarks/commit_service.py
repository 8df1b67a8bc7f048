"""Figure ``commit_service``: ``delta-mirror serve`` under keep-alive HTTP clients (issue 31).

Real processes side by side in one run: the service (``delta-mirror serve``, 1 and 2 ``--workers``),
its own PostgreSQL with **fsync on** (a plain server started here, not the tests' fsync-off one; its
data folder is on the machine's disk) and SQLite, and client *processes* (``CLIENT_PROCS`` of them,
each driving its share of the keep-alive connections from one ``selectors`` loop over raw sockets,
so the clients cost little and their CPU is counted). 64 tables, each owned by one connection during
a window (no conflicts, every POST a fresh version):

- ``append``: commitInfo + one ``add`` (what a Delta-Spark append of one file looks like, ~0.9 kB);
- ``remove``: MERGE-like, commitInfo + a ``remove`` of the file the table's previous version added
  + one ``add`` (the first commit of a table, with nothing to remove yet, is an append).

Each measured window lasts ``--window`` seconds; windows run round-robin (repeat, kind, clients,
then every service in turn, so each pair is measured minutes apart at most) and each figure is the
median over ``--repeats`` windows. Per window: commits/s (201s completed in the window / window),
p50/p99 of the client-side latency, CPU per commit of the service's process tree, the database's
(PostgreSQL's postmaster and its backends; SQLite runs inside the service) and the clients' (utime +
stime from ``/proc/<pid>/stat`` of each tree, before/after), statements per commit (PostgreSQL:
``pg_stat_statements`` calls in the service's database, BEGIN/COMMIT included: the round trips,
except that an ``executemany`` pipelines its statements and that the pool's pre-ping, an empty
query, is not seen there: one more round trip per commit while it is on), the machine's
busy cores and load. pg_stat_statements stays loaded during the windows: beside a server without
it (``benchmarks/pg_commit_cost.py``, same load) it made no difference to PostgreSQL's CPU per
commit beyond noise (≤ 0.04 ms on a bare INSERT, none measurable on the commit statement). Every body is a pure function of (table, version, kind): at the end every
version of every table is read back from the store and compared byte for byte.

``--base PATH`` runs the same services from another checkout (``git worktree add PATH <commit>``;
its ``include/`` goes first on the service's ``PYTHONPATH``) beside this tree's, in the same rounds;
``--base a=PATH1,b=PATH2`` runs several, labelled.

Standalone: ``PYTHONPATH=tests .venv/bin/python benchmarks/commit_service.py [--quick] [--window S]
[--repeats N] [--base PATH]`` (JSON on stdout, progress on stderr). In ``make bench`` the settings
come from ``DELTA_MIRROR_BENCH_CS_*`` (``WINDOW``, ``REPEATS``, ``SQLITE_REPEATS``, ``BASE``).
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import selectors
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
TABLES = 64
CLIENTS = (8, 16, 32)
WORKERS = (1, 2)
KINDS = ("append", "remove")
CLIENT_PROCS = 2
# full / quick
WINDOW_S = (6.0, 2.0)
REPEATS = (5, 1)
SQLITE_REPEATS = (3, 1)
WARMUP_S = 1.5
BASE_TS = 1_767_000_000_000  # commit timestamps: fixed, so every body can be rebuilt to compare
SCHEMA = json.dumps(
    {"type": "struct", "fields": [{"name": "id", "type": "long", "nullable": True, "metadata": {}}]}
)
# Issue 31's goals (on this 2-core machine, clients included) and the figures it started from.
GOALS = {
    "service_cpu_ms_per_append": 0.5,
    "service_cpu_ms_per_remove": 1.0,
    "appends_per_s_16_clients": 1300.0,
    "appends_p99_ms_16_clients": 30.0,
    "removes_per_s": 800.0,
}
EARLIER = {
    "source": "issue 31 (independent load run, quiet machine, 20 s windows, PostgreSQL fsync on)",
    "postgres": {
        "append/8/1": "820/s, p99 17 ms",
        "append/32/1": "745-814/s, p99 52-63 ms",
        "append/32/2": "968-1,090/s, p99 52-55 ms",
        "remove/8/1": "424-433/s",
        "remove/8/2": "562/s",
        "cpu_ms_per_commit": "service 1.0 (append) / 2.2 (with removes), PostgreSQL 0.55, client 0.27",
        "one_process_ceiling": "~800/s at 0.8 core",
    },
    "sqlite": {"append": "1,050-1,114/s"},
}


# -- the commits (pure functions of table, version, kind) -------------------------------------------


def _line(kind: str, body: dict[str, Any]) -> str:
    return json.dumps({kind: body}, separators=(",", ":"))


def _file(table: int, version: int) -> str:
    return f"part-00000-{uuid.UUID(int=(table << 64) | version)}-c000.snappy.parquet"


def kind_at(kind: str, version: int) -> str:
    """A ``remove`` window's first commit of a table (nothing added yet) is an append."""
    return "remove" if kind == "remove" and version >= 2 else "append"


def commit_body(table: int, version: int, kind: str) -> bytes:
    """Version ``version`` (>= 1) of table ``table``: one add; with ``remove`` also the remove of the
    file version ``version - 1`` added (still active: only this version removes it)."""
    ts = BASE_TS + version
    merge = kind_at(kind, version) == "remove"
    info = {
        "timestamp": ts,
        "operation": "MERGE" if merge else "WRITE",
        "operationParameters": {"predicate": '["(id = id)"]'} if merge else {"mode": "Append"},
        "readVersion": version - 1,
        "isolationLevel": "Serializable",
        "isBlindAppend": not merge,
        "engineInfo": "Apache-Spark/4.2.0 Delta-Lake/4.4.0",
        "txnId": str(uuid.UUID(int=(version << 64) | table)),
    }
    lines = [_line("commitInfo", info)]
    if merge:
        lines.append(
            _line(
                "remove",
                {
                    "path": _file(table, version - 1),
                    "deletionTimestamp": ts,
                    "dataChange": True,
                    "extendedFileMetadata": True,
                    "partitionValues": {},
                    "size": 1234,
                },
            )
        )
    lines.append(
        _line(
            "add",
            {
                "path": _file(table, version),
                "partitionValues": {},
                "size": 1234,
                "modificationTime": ts,
                "dataChange": True,
                "stats": '{"numRecords":10,"minValues":{"id":1},"maxValues":{"id":10},"nullCount":{"id":0}}',
            },
        )
    )
    return "".join(f"{x}\n" for x in lines).encode()


def v0_body(table: int) -> bytes:
    lines = [
        _line("commitInfo", {"timestamp": BASE_TS, "operation": "CREATE TABLE"}),
        _line("protocol", {"minReaderVersion": 1, "minWriterVersion": 2}),
        _line(
            "metaData",
            {
                "id": str(uuid.UUID(int=table)),
                "format": {"provider": "parquet", "options": {}},
                "schemaString": SCHEMA,
                "partitionColumns": [],
                "configuration": {},
                "createdTime": BASE_TS,
            },
        ),
    ]
    return "".join(f"{x}\n" for x in lines).encode()


# -- the client process -------------------------------------------------------------------------------


class _Conn:
    """One keep-alive connection: its tables' next versions, one request in flight at a time."""

    def __init__(self, port: int, token: str, kind: str, tables: list[list[Any]]) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=120)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.head = f"Host: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n"
        self.kind = kind
        self.tables = tables  # [table, quoted root, next version]
        self.turn = 0
        self.buf = b""
        self.sent_at = 0.0
        self.current: list[Any] | None = None
        self.stopped = False

    def send(self) -> None:
        entry = self.current = self.tables[self.turn % len(self.tables)]
        self.turn += 1
        table, root, version = entry
        body = commit_body(table, version, self.kind)
        req = (
            f"POST /v1/commits/{version}?root={root} HTTP/1.1\r\n{self.head}"
            f"Content-Type: application/octet-stream\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode() + body
        self.sent_at = time.monotonic()
        self.sock.sendall(req)

    def response(self) -> tuple[int, bytes] | None:
        """The complete response in the buffer, if there is one."""
        end = self.buf.find(b"\r\n\r\n")
        if end < 0:
            return None
        head = self.buf[:end].lower()
        at = head.find(b"content-length:")
        stop = head.find(b"\r\n", at)
        length = int(head[at + 15 : stop if stop >= 0 else len(head)]) if at >= 0 else 0
        if len(self.buf) < end + 4 + length:
            return None
        status, body = int(self.buf[9:12]), self.buf[end + 4 : end + 4 + length]
        self.buf = self.buf[end + 4 + length :]
        return status, body

    def answered(self, status: int, body: bytes, errors: list[str]) -> None:
        assert self.current is not None
        if status == 201:
            self.current[2] += 1
        else:
            errors.append(f"{status} {body[:200]!r}")
            self.stopped = True
        self.current = None


def _drain(conns: list[_Conn], errors: list[str]) -> None:
    """The requests in flight at the window's end: their versions count for what comes next, not for
    the window."""
    for c in conns:
        while c.current is not None:
            data = c.sock.recv(65536)
            if not data:
                errors.append("connection closed by the service while draining")
                c.current = None
                break
            c.buf += data
            got = c.response()
            if got is not None:
                c.answered(*got, errors)
        c.sock.close()


def _client_window(cmd: dict[str, Any]) -> dict[str, Any]:
    token = os.environ["DELTA_MIRROR_COMMIT_TOKEN"]
    conns = [_Conn(cmd["port"], token, cmd["kind"], tables) for tables in cmd["conns"]]
    latencies: list[float] = []
    errors: list[str] = []
    sel = selectors.DefaultSelector()
    for c in conns:
        sel.register(c.sock, selectors.EVENT_READ, c)
    start, end = cmd["start"], cmd["start"] + cmd["seconds"]
    with contextlib.suppress(ValueError):
        time.sleep(max(0.0, start - time.monotonic()))
    for c in conns:
        c.send()
    while (now := time.monotonic()) < end:
        for key, _ in sel.select(end - now):
            c = key.data
            data = c.sock.recv(65536)
            if not data:
                errors.append("connection closed by the service")
                sel.unregister(c.sock)
                c.stopped, c.current = True, None
                continue
            c.buf += data
            got = c.response()
            if got is None:
                continue
            t = time.monotonic()
            if t <= end:
                latencies.append((t - c.sent_at) * 1000)
            c.answered(*got, errors)
            if not c.stopped and t < end:
                c.send()
    _drain(conns, errors)
    sel.close()
    return {
        "lat": [round(x, 3) for x in latencies],
        "next": [[t[0], t[2]] for c in conns for t in c.tables],
        "errors": errors[:5],
    }


def client_main() -> int:
    """``--client``: one JSON command a line on stdin, one JSON answer a line on stdout."""
    for line in sys.stdin:
        if not line.strip():
            continue
        print(json.dumps(_client_window(json.loads(line))), flush=True)
    return 0


class _Clients:
    """``CLIENT_PROCS`` long-lived client processes (one per share of the connections)."""

    def __init__(self, token: str, procs: int) -> None:
        env = {**os.environ, "DELTA_MIRROR_COMMIT_TOKEN": token}
        self.procs = [
            subprocess.Popen(
                [sys.executable, __file__, "--client"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                env=env,
            )
            for _ in range(procs)
        ]

    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def send(self, commands: list[dict[str, Any]]) -> None:
        for p, cmd in zip(self.procs, commands, strict=False):
            assert p.stdin is not None
            p.stdin.write(json.dumps(cmd) + "\n")
            p.stdin.flush()

    def receive(self, n: int) -> list[dict[str, Any]]:
        out = []
        for p in self.procs[:n]:
            assert p.stdout is not None
            line = p.stdout.readline()
            if not line:
                raise RuntimeError(f"client process {p.pid} exited ({p.poll()})")
            out.append(json.loads(line))
        return out

    def stop(self) -> None:
        for p in self.procs:
            with contextlib.suppress(OSError):
                assert p.stdin is not None
                p.stdin.close()
        for p in self.procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(30)


# -- CPU from /proc ---------------------------------------------------------------------------------


def _procs() -> dict[int, tuple[int, int]]:
    """pid -> (ppid, utime + stime in clock ticks), every process."""
    out: dict[int, tuple[int, int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                raw = f.read()
        except OSError:
            continue
        rest = raw[raw.rfind(b")") + 2 :].split()
        out[int(entry)] = (int(rest[1]), int(rest[11]) + int(rest[12]))
    return out


def _tree_ticks(procs: dict[int, tuple[int, int]], roots: list[int]) -> int:
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in procs.items():
        children.setdefault(ppid, []).append(pid)
    total, todo, seen = 0, list(roots), set()
    while todo:
        pid = todo.pop()
        if pid in seen or pid not in procs:
            continue
        seen.add(pid)
        total += procs[pid][1]
        todo.extend(children.get(pid, ()))
    return total


def _machine_busy_ticks() -> tuple[int, int]:
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + fields[4]
    return sum(fields[:8]) - idle, sum(fields[:8])


# -- PostgreSQL with fsync on -------------------------------------------------------------------------


def _fsync_pg(statements: bool = True, settings: str = "") -> Any:
    """A PostgreSQL server as the tests start one (``support.services.PgServer``), but durable:
    fsync, full_page_writes and synchronous_commit at their defaults (on). ``statements``: with
    pg_stat_statements loaded (utility statements tracked); ``settings``: more ``-c`` options."""
    from support.services import PgServer

    preload = (
        " -c shared_preload_libraries=pg_stat_statements -c pg_stat_statements.track_utility=on"
        if statements
        else ""
    )

    class DurablePg(PgServer):
        def _pg_ctl_start(self) -> None:
            assert self.tmpdir is not None
            opts = (
                f"-p {self.port} -k {self.tmpdir} -c listen_addresses=127.0.0.1 -c max_connections=200"
                f"{preload} {settings}"
            ).rstrip()
            self._cmd(
                "pg_ctl",
                "-D",
                str(self.datadir),
                "-l",
                str(self.logfile),
                "-o",
                opts,
                "-w",
                "-t",
                "60",
                "start",
            )

    server = DurablePg.start_new()
    import psycopg

    with psycopg.connect(_admin(server.url), autocommit=True) as conn:
        if statements:
            conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        fsync = conn.execute("SHOW fsync").fetchone()
    assert fsync is not None and fsync[0] == "on", fsync
    return server


def _admin(url: str) -> str:
    from sqlalchemy.engine import make_url

    u = make_url(url)
    return f"host={u.host} port={u.port} user={u.username or 'postgres'} dbname=postgres"


class _PgStats:
    """Statements run in one database (pg_stat_statements, top level, utility statements included)."""

    def __init__(self, url: str) -> None:
        import psycopg
        from sqlalchemy.engine import make_url

        self.db = make_url(url).database
        self.conn = psycopg.connect(_admin(url), autocommit=True)

    def reset(self) -> None:
        self.conn.execute("SELECT pg_stat_statements_reset()")

    def statements(self) -> tuple[int, list[tuple[str, int]]]:
        rows = self.conn.execute(
            "SELECT s.query, s.calls FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid"
            " WHERE d.datname = %s ORDER BY s.calls DESC",
            (self.db,),
        ).fetchall()
        return sum(int(c) for _, c in rows), [(" ".join(str(q).split())[:90], int(c)) for q, c in rows]

    def close(self) -> None:
        self.conn.close()


# -- one service ---------------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _code_env(tree: Path) -> dict[str, str]:
    env = dict(os.environ)
    if tree.resolve() != REPO:
        env["PYTHONPATH"] = os.pathsep.join([str(tree / "include"), env.get("PYTHONPATH", "")]).rstrip(
            os.pathsep
        )
    return env


@dataclass
class _Service:
    """``delta-mirror serve`` from one code tree over one store, with its 64 tables and their versions."""

    code: str
    tree: Path
    store: str
    url: str
    workers: int
    work: Path
    token: str = field(default_factory=lambda: uuid.uuid4().hex)
    port: int = 0
    proc: subprocess.Popen[bytes] | None = None
    roots: list[str] = field(default_factory=list)
    next_version: list[int] = field(default_factory=list)
    # per table: (from version, to version exclusive, kind) of every window
    history: list[list[tuple[int, int, str]]] = field(default_factory=list)
    stats: _PgStats | None = None
    clients: _Clients | None = None

    @property
    def label(self) -> str:
        return f"{self.store}/{self.code}/{self.workers}w"

    def start(self, client_procs: int, log: Callable[[str], None]) -> None:
        cli = str(Path(sys.executable).parent / "delta-mirror")
        env = {**_code_env(self.tree), "DELTA_MIRROR_COMMIT_TOKEN": self.token}
        subprocess.run([cli, "--store", self.url, "init"], env=env, check=True, capture_output=True)
        lake = self.work / "lake"
        lake.mkdir(parents=True, exist_ok=True)
        self.port = _free_port()
        args = [cli, "--store", self.url, "serve", "--port", str(self.port), "--allow-root", f"file:{lake}/"]
        args += ["--workers", str(self.workers)]
        log_path = self.work / "serve.log"
        with log_path.open("ab") as out:
            self.proc = subprocess.Popen(args, env=env, stdout=out, stderr=out, start_new_session=True)
        deadline = time.monotonic() + 60 * max(1.0, os.getloadavg()[0] / (os.cpu_count() or 1))
        while not self._healthy():
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.label}: serve exited: {log_path.read_text()[-2000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.label}: serve did not become ready")
            time.sleep(0.1)
        self.roots = [urllib.parse.quote(f"file:{lake}/t{i:02d}", safe="") for i in range(TABLES)]
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
        for i, root in enumerate(self.roots):
            conn.request("POST", f"/v1/commits/0?root={root}", v0_body(i), self._auth())
            r = conn.getresponse()
            body = r.read()
            if r.status != 201:
                raise RuntimeError(f"{self.label}: creating table {i}: {r.status} {body[:300]!r}")
        conn.close()
        self.next_version = [1] * TABLES
        self.history = [[] for _ in range(TABLES)]
        if self.store == "postgres":
            self.stats = _PgStats(self.url)
        self.clients = _Clients(self.token, client_procs)
        log(f"commit_service: {self.label} on port {self.port} ({self.url.split('@')[-1]})")

    def _auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    def _healthy(self) -> bool:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
            conn.request("GET", "/health")
            ok = conn.getresponse().status == 200
            conn.close()
            return ok
        except OSError:
            return False

    def window(self, kind: str, clients: int, seconds: float, db_pids: list[int]) -> dict[str, Any]:
        """One window: ``clients`` connections (tables dealt round-robin) for ``seconds``."""
        assert self.proc is not None and self.clients is not None
        per_conn: list[list[list[Any]]] = [[] for _ in range(clients)]
        for t in range(TABLES):
            per_conn[t % clients].append([t, self.roots[t], self.next_version[t]])
        n_procs = min(len(self.clients.procs), clients)
        start = time.monotonic() + 0.3 + 0.02 * clients
        self.clients.send(
            [
                {
                    "port": self.port,
                    "kind": kind,
                    "start": start,
                    "seconds": seconds,
                    "conns": per_conn[p::n_procs],
                }
                for p in range(n_procs)
            ]
        )
        time.sleep(max(0.0, start - time.monotonic() - 0.05))
        if self.stats is not None:
            self.stats.reset()
        roots = {"service": [self.proc.pid], "database": db_pids, "clients": self.clients.pids()}
        procs = _procs()
        cpu0 = {k: _tree_ticks(procs, v) for k, v in roots.items()}
        busy0, total0 = _machine_busy_ticks()
        time.sleep(max(0.0, start + seconds - time.monotonic()))
        procs = _procs()
        cpu1 = {k: _tree_ticks(procs, v) for k, v in roots.items()}
        busy1, total1 = _machine_busy_ticks()
        load = os.getloadavg()[0]
        statements = self.stats.statements() if self.stats is not None else None
        answers = self.clients.receive(n_procs)
        lat = sorted(x for a in answers for x in a["lat"])
        for a in answers:
            for t, nxt in a["next"]:
                if nxt > self.next_version[t]:
                    self.history[t].append((self.next_version[t], nxt, kind))
                    self.next_version[t] = nxt
        done = len(lat)
        tick = os.sysconf("SC_CLK_TCK")
        ncpu = os.cpu_count() or 1

        def per_commit(k: str) -> float | None:
            if k == "database" and not db_pids:
                return None
            return round((cpu1[k] - cpu0[k]) / tick / max(done, 1) * 1000, 3)

        def pct(p: float) -> float | None:
            return round(lat[min(done - 1, int(p * done))], 2) if lat else None

        ours = sum(cpu1[k] - cpu0[k] for k in roots) / tick / seconds
        machine_cores = (busy1 - busy0) / max(total1 - total0, 1) * ncpu
        out: dict[str, Any] = {
            "commits": done,
            "commits_per_s": round(done / seconds, 1),
            "p50_ms": pct(0.50),
            "p99_ms": pct(0.99),
            "cpu_ms_per_commit": {k: per_commit(k) for k in roots},
            "cores": {k: round((cpu1[k] - cpu0[k]) / tick / seconds, 3) for k in roots},
            "machine_busy_cores": round(machine_cores, 2),
            "other_processes_cores": round(max(0.0, machine_cores - ours), 2),
            "loadavg_1m": round(load, 2),
            "errors": [e for a in answers for e in a["errors"]][:5],
        }
        if statements is not None:
            total, top = statements
            out["statements_per_commit"] = round(total / max(done, 1), 2)
            out["top_statements_per_commit"] = [[q, round(c / max(done, 1), 2)] for q, c in top[:8]]
        return out

    def verify(self) -> dict[str, Any]:
        """Every version of every table read back from the store and compared with what was sent."""
        from delta_mirror.delta.actions import render_commit
        from delta_mirror.storage import normalize_commit_root
        from delta_mirror.store import SqlStore

        store = SqlStore(self.url)
        checked = mismatches = 0
        first_bad: list[str] = []
        try:
            for t, raw_root in enumerate(self.roots):
                table = store.table_at(normalize_commit_root(urllib.parse.unquote(raw_root)))
                latest = store.latest_version(table.id)
                if latest != self.next_version[t] - 1:
                    mismatches += 1
                    first_bad.append(f"table {t}: latest {latest}, sent up to {self.next_version[t] - 1}")
                expected: dict[int, bytes] = {0: v0_body(t)}
                for lo, hi, kind in self.history[t]:
                    for v in range(lo, hi):
                        expected[v] = commit_body(t, v, kind)
                for lo in range(0, self.next_version[t], 5000):
                    hi = min(self.next_version[t] - 1, lo + 4999)
                    got = store.commit_lines(table.id, lo, hi)
                    for v in range(lo, hi + 1):
                        checked += 1
                        if v not in got or render_commit(got[v]) != expected[v]:
                            mismatches += 1
                            if len(first_bad) < 5:
                                first_bad.append(f"table {t} version {v} differs from what was sent")
        finally:
            store.close()
        return {"versions_checked": checked, "mismatches": mismatches, "first_mismatches": first_bad}

    def stop(self) -> None:
        if self.clients is not None:
            self.clients.stop()
        if self.stats is not None:
            self.stats.close()
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(30)


# -- the run --------------------------------------------------------------------------------------------


@dataclass
class Settings:
    window: float
    repeats: int
    sqlite_repeats: int
    clients: tuple[int, ...] = CLIENTS
    workers: tuple[int, ...] = WORKERS
    kinds: tuple[str, ...] = KINDS
    stores: tuple[str, ...] = ("postgres", "sqlite")
    base: tuple[tuple[str, Path], ...] = ()
    new: Path = REPO
    client_procs: int = CLIENT_PROCS


def _median(xs: list[float | None]) -> float | None:
    vals = [x for x in xs if x is not None]
    return round(statistics.median(vals), 3) if vals else None


def _summary(windows: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over the repeats of one configuration."""
    keys = ("commits_per_s", "p50_ms", "p99_ms", "machine_busy_cores", "other_processes_cores", "loadavg_1m")
    out: dict[str, Any] = {k: _median([w[k] for w in windows]) for k in keys}
    out["commits_per_s_range"] = [
        min(w["commits_per_s"] for w in windows),
        max(w["commits_per_s"] for w in windows),
    ]
    out["cpu_ms_per_commit"] = {
        k: _median([w["cpu_ms_per_commit"][k] for w in windows]) for k in ("service", "database", "clients")
    }
    out["cores"] = {k: _median([w["cores"][k] for w in windows]) for k in ("service", "database", "clients")}
    if "statements_per_commit" in windows[0]:
        out["statements_per_commit"] = _median([w["statements_per_commit"] for w in windows])
        out["top_statements_per_commit"] = windows[-1]["top_statements_per_commit"]
    out["windows"] = len(windows)
    out["errors"] = [e for w in windows for e in w["errors"]][:5]
    return out


def _services(settings: Settings, store: str, tmp: Path, new_db: Callable[[], str] | None) -> list[_Service]:
    trees = [("new", settings.new), *settings.base]
    out = []
    for code, tree in trees:
        for workers in settings.workers:
            work = tmp / f"{store}-{code}-{workers}w"
            work.mkdir(parents=True, exist_ok=True)
            url = new_db() if new_db is not None else f"sqlite:///{work / 'store.db'}"
            out.append(_Service(code, tree, store, url, workers, work))
    return out


def _run_store(
    settings: Settings, store: str, tmp: Path, log: Callable[[str], None], server: Any
) -> dict[str, Any]:
    repeats = settings.repeats if store == "postgres" else settings.sqlite_repeats
    services = _services(settings, store, tmp, server.create_database if store == "postgres" else None)
    db_pids: list[int] = []
    if store == "postgres":
        db_pids = [int((server.datadir / "postmaster.pid").read_text().split()[0])]
    results: dict[str, list[dict[str, Any]]] = {}
    out: dict[str, Any] = {}
    try:
        for svc in services:
            svc.start(settings.client_procs, log)
            svc.window("append", max(settings.clients), WARMUP_S, db_pids)  # warm-up, not recorded
        for rep in range(repeats):
            for kind in settings.kinds:
                for clients in settings.clients:
                    for svc in services:
                        w = svc.window(kind, clients, settings.window, db_pids)
                        results.setdefault(f"{svc.code}/{kind}/{clients}/{svc.workers}", []).append(w)
                        log(
                            f"commit_service: {store} {svc.code} {kind} {clients} clients {svc.workers}w"
                            f" [{rep + 1}/{repeats}]: {w['commits_per_s']}/s p50 {w['p50_ms']} p99 {w['p99_ms']} ms"
                            f" cpu/commit {w['cpu_ms_per_commit']} stmts {w.get('statements_per_commit')}"
                            f" busy {w['machine_busy_cores']} load {w['loadavg_1m']}"
                            + (f" ERRORS {w['errors']}" if w["errors"] else "")
                        )
        out["configs"] = {k: _summary(v) for k, v in results.items()}
        out["verified"] = {}
        for svc in services:
            svc.stop()
            out["verified"][f"{svc.code}/{svc.workers}w"] = svc.verify()
    finally:
        for svc in services:
            svc.stop()
    return out


def _goals(store: dict[str, Any], code: str = "new") -> dict[str, Any]:
    """The issue's goals against one store's medians, each beside its figure."""
    cfg = store["configs"]

    def get(kind: str, clients: int, workers: int) -> dict[str, Any] | None:
        found: dict[str, Any] | None = cfg.get(f"{code}/{kind}/{clients}/{workers}")
        return found

    figures: dict[str, Any] = {}
    targets: dict[str, bool] = {}
    a16 = [(w, c) for w in WORKERS if (c := get("append", 16, w)) is not None]
    if a16:
        cpu = [c["cpu_ms_per_commit"]["service"] for _, c in a16]
        figures["appends_16_clients"] = {
            f"{w}w": {"commits_per_s": c["commits_per_s"], "p99_ms": c["p99_ms"]} for w, c in a16
        }
        figures["service_cpu_ms_per_append_16_clients"] = {
            f"{w}w": c["cpu_ms_per_commit"]["service"] for w, c in a16
        }
        targets["appends_ge_1300_per_s_p99_le_30ms_16_clients"] = any(
            (c["commits_per_s"] or 0) >= GOALS["appends_per_s_16_clients"]
            and (c["p99_ms"] or 1e9) <= GOALS["appends_p99_ms_16_clients"]
            for _, c in a16
        )
        targets["service_cpu_le_0_5ms_per_append"] = (
            min(x for x in cpu if x is not None) <= GOALS["service_cpu_ms_per_append"]
        )
    rem = [(k, c) for k, c in cfg.items() if k.startswith(f"{code}/remove/")]
    if rem:
        figures["removes_best"] = max(((k, c["commits_per_s"]) for k, c in rem), key=lambda x: x[1] or 0)
        r16 = [c["cpu_ms_per_commit"]["service"] for k, c in rem if k.split("/")[2] == "16"]
        figures["service_cpu_ms_per_remove_16_clients"] = r16
        targets["removes_ge_800_per_s"] = (figures["removes_best"][1] or 0) >= GOALS["removes_per_s"]
        if r16:
            targets["service_cpu_le_1ms_per_remove"] = (
                min(x for x in r16 if x is not None) <= GOALS["service_cpu_ms_per_remove"]
            )
    return {"figures": figures, "targets": targets}


def run(settings: Settings, tmp: Path, log: Callable[[str], None]) -> dict[str, Any]:
    started = time.perf_counter()
    out: dict[str, Any] = {
        "method": __doc__.split("\n\n", 1)[1].split("\n\n``--base")[0].replace("\n", " ") if __doc__ else "",
        "settings": {
            "window_s": settings.window,
            "repeats_postgres": settings.repeats,
            "repeats_sqlite": settings.sqlite_repeats,
            "tables": TABLES,
            "clients": list(settings.clients),
            "workers": list(settings.workers),
            "client_processes": settings.client_procs,
            "base": {label: str(path) for label, path in settings.base},
            "cpus": os.cpu_count(),
        },
        "payload_bytes": {
            "append": len(commit_body(0, 5, "append")),
            "remove": len(commit_body(0, 5, "remove")),
        },
        "goals": GOALS,
        "earlier": EARLIER,
        "loadavg_at_start": [round(x, 2) for x in os.getloadavg()],
    }
    for label, path in settings.base:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=path, capture_output=True, text=True
        )
        out["settings"][f"{label}_commit"] = head.stdout.strip()
    server = _fsync_pg() if "postgres" in settings.stores else None
    try:
        for store in settings.stores:
            log(f"commit_service: {store}")
            out[store] = _run_store(settings, store, tmp, log, server)
            out[store]["goals"] = _goals(out[store])
    finally:
        if server is not None:
            server.stop_and_remove()
    targets: dict[str, bool] = {}
    for store in settings.stores:
        for k, v in out[store]["goals"]["targets"].items():
            targets[f"{store}_{k}"] = v
        targets[f"{store}_every_version_read_back_equal"] = all(
            r["mismatches"] == 0 for r in out[store]["verified"].values()
        )
    out["targets"] = targets
    out["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    out["seconds"] = round(time.perf_counter() - started, 1)
    _print_table(out, settings, log)
    return out


def _print_table(out: dict[str, Any], settings: Settings, log: Callable[[str], None]) -> None:
    log(
        "commit_service: medians (commits/s [range], p50/p99 ms, CPU ms per commit service/db/clients, stmts)"
    )
    for store in settings.stores:
        for key, c in sorted(out[store]["configs"].items()):
            cpu = c["cpu_ms_per_commit"]
            log(
                f"  {store:8} {key:22} {c['commits_per_s']:>8}/s {c['commits_per_s_range']} "
                f"p50 {c['p50_ms']} p99 {c['p99_ms']}  cpu {cpu['service']}/{cpu['database']}/{cpu['clients']}"
                f"  stmts {c.get('statements_per_commit')}  busy {c['machine_busy_cores']} others "
                f"{c['other_processes_cores']} load {c['loadavg_1m']}"
            )
        log(f"  {store} goals: {json.dumps(out[store]['goals'])}")
        log(f"  {store} read back: {json.dumps(out[store]['verified'])}")
    log(f"  goals: {json.dumps(GOALS)}; earlier: {json.dumps(EARLIER)}")


def settings_from(quick: bool, opts: argparse.Namespace | None = None) -> Settings:
    q = 1 if quick else 0
    env = os.environ.get

    def pick(name: str, default: Any, conv: Callable[[str], Any]) -> Any:
        value = getattr(opts, name, None) if opts is not None else None
        if value is not None:
            return value
        raw = env(f"DELTA_MIRROR_BENCH_CS_{name.upper()}")
        return conv(raw) if raw else default

    def ints(raw: str) -> tuple[int, ...]:
        return tuple(int(x) for x in raw.split(","))

    base = pick("base", None, str)
    new = pick("new", None, str)
    return Settings(
        window=pick("window", WINDOW_S[q], float),
        repeats=pick("repeats", REPEATS[q], int),
        sqlite_repeats=pick("sqlite_repeats", SQLITE_REPEATS[q], int),
        clients=pick("clients", CLIENTS, ints),
        workers=pick("workers", WORKERS, ints),
        kinds=pick("kinds", KINDS, lambda r: tuple(r.split(","))),
        stores=pick("stores", ("postgres", "sqlite"), lambda r: tuple(r.split(","))),
        base=tuple(_labelled(base)) if base else (),
        new=Path(new).resolve() if new else REPO,
    )


def _labelled(raw: str) -> list[tuple[str, Path]]:
    """``PATH`` or ``label=PATH``, comma-separated; unlabelled ones are ``base``, ``base2``, ..."""
    out = []
    for n, item in enumerate(x for x in raw.split(",") if x):
        label, _, path = item.rpartition("=")
        out.append((label or ("base" if n == 0 else f"base{n + 1}"), Path(path).resolve()))
    return out


def figure(bench: Any, log: Callable[[str], None]) -> dict[str, Any]:
    """For run.py (``bench``: ``opts``, ``tmp``); its own durable PostgreSQL, not the run's."""
    work = bench.tmp / "commit-service"
    work.mkdir(parents=True, exist_ok=True)
    return run(settings_from(bench.opts.quick), work, log)


def _parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--client", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--quick", action="store_true", help="2 s windows, one repeat")
    p.add_argument("--window", type=float, help="seconds per measured window")
    p.add_argument("--repeats", type=int, help="windows per configuration on PostgreSQL (median)")
    p.add_argument("--sqlite-repeats", type=int, help="windows per configuration on SQLite")
    p.add_argument("--clients", type=lambda r: tuple(int(x) for x in r.split(",")), help="e.g. 8,16,32")
    p.add_argument("--workers", type=lambda r: tuple(int(x) for x in r.split(",")), help="e.g. 1,2")
    p.add_argument("--kinds", type=lambda r: tuple(r.split(",")), help="append,remove")
    p.add_argument("--stores", type=lambda r: tuple(r.split(",")), help="postgres,sqlite")
    p.add_argument("--base", help="another checkout to run beside this one (git worktree)")
    p.add_argument("--new", help="run the 'new' services from this checkout instead of this one")
    return p.parse_args(argv)


def main(argv: list[str]) -> int:
    opts = _parse(argv)
    if opts.client:
        return client_main()
    sys.path.insert(0, str(REPO / "tests"))
    tmp = Path(tempfile.mkdtemp(prefix="dm-bench-cs-"))
    try:
        result = run(settings_from(opts.quick, opts), tmp, lambda m: print(m, file=sys.stderr, flush=True))
        print(json.dumps(result, indent=2))
    finally:
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
