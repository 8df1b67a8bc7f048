"""Figure ``commit_service``: throughput and latency of ``delta-mirror serve`` under concurrent writers.

A real ``delta-mirror serve`` process (uvicorn, one process unless ``--workers N``) over PostgreSQL (the tests' throwaway
server, as the other figures) and over SQLite. ``CLIENTS`` threads, each with one keep-alive HTTP
connection, POST small commits (``commitInfo`` + one ``add``, about 400 bytes: what a Delta-Spark
append of one file looks like) to ``TABLES`` tables; each client owns ``TABLES / CLIENTS`` tables
and commits to them in turn, so every POST is a fresh version (201), never a conflict. The tables
are created with their version 0 first (not timed). Measured: commits per second over the wall
time of the whole run, and the latency of each POST (p50 / p99), as the client sees it.

Standalone: ``PYTHONPATH=tests .venv/bin/python benchmarks/commit_service.py [--quick] [--workers N]`` (prints JSON).
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
CLIENTS = 8
TABLES = 16
COMMITS = (4000, 400)  # total POSTs: full, quick
TARGETS_PG = {"commits_per_s": 300.0, "p99_ms": 100.0}
SCHEMA = json.dumps(
    {"type": "struct", "fields": [{"name": "id", "type": "long", "nullable": True, "metadata": {}}]}
)


def _line(kind: str, body: dict[str, Any]) -> str:
    return json.dumps({kind: body}, separators=(",", ":"))


def _commit(version: int, path: str) -> bytes:
    now = int(time.time() * 1000)
    lines = [
        _line(
            "commitInfo",
            {
                "timestamp": now,
                "operation": "WRITE",
                "operationParameters": {"mode": "Append", "partitionBy": "[]"},
                "readVersion": version - 1,
                "isolationLevel": "Serializable",
                "isBlindAppend": True,
                "engineInfo": "Apache-Spark/4.2.0 Delta-Lake/4.4.0",
                "txnId": str(uuid.uuid4()),
            },
        ),
        _line(
            "add",
            {
                "path": path,
                "partitionValues": {},
                "size": 1234,
                "modificationTime": now,
                "dataChange": True,
                "stats": '{"numRecords":10,"minValues":{"id":1},"maxValues":{"id":10},"nullCount":{"id":0}}',
            },
        ),
    ]
    return "".join(f"{x}\n" for x in lines).encode()


def _v0() -> bytes:
    lines = [
        _line("commitInfo", {"timestamp": int(time.time() * 1000), "operation": "CREATE TABLE"}),
        _line("protocol", {"minReaderVersion": 1, "minWriterVersion": 2}),
        _line(
            "metaData",
            {
                "id": str(uuid.uuid4()),
                "format": {"provider": "parquet", "options": {}},
                "schemaString": SCHEMA,
                "partitionColumns": [],
                "configuration": {},
                "createdTime": int(time.time() * 1000),
            },
        ),
    ]
    return "".join(f"{x}\n" for x in lines).encode()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _Serve:
    def __init__(self, store_url: str, lake: Path, log_path: Path, workers: int = 1) -> None:
        self.token = uuid.uuid4().hex
        self.port = _free_port()
        cli = str(Path(sys.executable).parent / "delta-mirror")
        args = [cli, "--store", store_url, "serve", "--port", str(self.port), "--allow-root", f"file:{lake}/"]
        args += ["--workers", str(workers)]
        self.log_path = log_path
        with log_path.open("ab") as log:
            env = {**os.environ, "DELTA_MIRROR_COMMIT_TOKEN": self.token}
            self.proc = subprocess.Popen(args, env=env, stdout=log, stderr=log)
        deadline = time.monotonic() + 60 * max(1.0, os.getloadavg()[0] / (os.cpu_count() or 1))
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"serve exited: {log_path.read_text()[-2000:]}")
            try:
                if self.post_raw("GET", "/health", None)[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.1)
        raise RuntimeError("serve did not become ready")

    def post_raw(
        self, method: str, path: str, body: bytes | None, conn: http.client.HTTPConnection | None = None
    ) -> tuple[int, bytes]:
        own = conn is None
        conn = conn or http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        try:
            conn.request(method, path, body=body, headers={"Authorization": f"Bearer {self.token}"})
            r = conn.getresponse()
            return r.status, r.read()
        finally:
            if own:
                conn.close()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(30)


def measure(
    store_url: str, work: Path, total: int, log: Callable[[str], None], workers: int = 1
) -> dict[str, Any]:
    """One run: init the store, start the service, create the tables, then the timed POSTs."""
    from delta_mirror.store import SqlStore

    store = SqlStore(store_url)
    store.init()
    store.close()
    lake = work / "lake"
    lake.mkdir(parents=True, exist_ok=True)
    service = _Serve(store_url, lake, work / "serve.log", workers)
    try:
        roots = [urllib.parse.quote(f"file:{lake}/t{i:02d}", safe="") for i in range(TABLES)]
        for root in roots:
            status, body = service.post_raw("POST", f"/v1/commits/0?root={root}", _v0())
            assert status == 201, body
        per_client = total // CLIENTS
        latencies: list[list[float]] = [[] for _ in range(CLIENTS)]
        failures: list[str] = []
        barrier = threading.Barrier(CLIENTS + 1)

        def client(c: int) -> None:
            mine = roots[c::CLIENTS]
            versions = dict.fromkeys(mine, 0)
            conn = http.client.HTTPConnection("127.0.0.1", service.port, timeout=60)
            conn.connect()
            barrier.wait()
            try:
                for n in range(per_client):
                    root = mine[n % len(mine)]
                    versions[root] += 1
                    v = versions[root]
                    data = _commit(v, f"part-{c}-{n:06d}.snappy.parquet")
                    t0 = time.perf_counter()
                    status, body = service.post_raw("POST", f"/v1/commits/{v}?root={root}", data, conn)
                    latencies[c].append(time.perf_counter() - t0)
                    if status != 201:
                        failures.append(f"{status} {body[:200]!r}")
                        return
            finally:
                conn.close()

        import psutil

        serve = psutil.Process(service.proc.pid)

        def service_cpu() -> float:  # the service process and its workers
            procs = [serve, *serve.children(recursive=True)]
            return sum(sum(p.cpu_times()[:2]) for p in procs)

        threads = [threading.Thread(target=client, args=(c,)) for c in range(CLIENTS)]
        for t in threads:
            t.start()
        barrier.wait()
        cpu0, own0 = service_cpu(), psutil.Process().cpu_times()
        started = time.perf_counter()
        for t in threads:
            t.join()
        wall = time.perf_counter() - started
        cpu1, own1 = service_cpu(), psutil.Process().cpu_times()
        load = os.getloadavg()[0]
    finally:
        service.stop()
    flat = sorted(x for xs in latencies for x in xs)
    done = len(flat)

    def pct(p: float) -> float:
        return round(flat[min(done - 1, int(p * done))] * 1000, 2) if flat else float("nan")

    result = {
        "workers": workers,
        "clients": CLIENTS,
        "tables": TABLES,
        "commits": done,
        "seconds": round(wall, 3),
        "commits_per_s": round(done / wall, 1) if wall else None,
        "p50_ms": pct(0.50),
        "p99_ms": pct(0.99),
        "max_ms": round(flat[-1] * 1000, 2) if flat else None,
        "mean_ms": round(statistics.fmean(flat) * 1000, 2) if flat else None,
        "failures": failures[:5],
        # CPU time per commit of the service process and of the clients (load-independent-ish)
        "service_cpu_ms_per_commit": round((cpu1 - cpu0) / max(done, 1) * 1000, 3),
        "client_cpu_ms_per_commit": round((sum(own1[:2]) - sum(own0[:2])) / max(done, 1) * 1000, 3),
        "loadavg_1m_at_end": round(load, 2),
    }
    log(f"commit_service: {result}")
    return result


def figure(bench: Any, log: Callable[[str], None]) -> dict[str, Any]:
    """Both stores; targets on PostgreSQL (``bench`` from run.py: ``new_db()``, ``tmp``, ``opts``)."""
    total = COMMITS[1] if bench.opts.quick else COMMITS[0]
    workers = getattr(bench.opts, "workers", 1)
    out: dict[str, Any] = {
        "method": f"{CLIENTS} client threads with keep-alive connections POST 1-add commits to {TABLES} "
        "tables (each client owns 2 tables: no conflicts) through `delta-mirror serve` "
        f"({'one process' if workers == 1 else f'--workers {workers}'}); "
        "commits_per_s = POSTs / wall time of the run, latency per POST as the client sees it; clients "
        "and service share the machine",
        "payload_bytes": len(_commit(1, "part-0-000000.snappy.parquet")),
    }
    log("commit_service: PostgreSQL")
    out["postgres"] = measure(bench.new_db(), bench.tmp / "commit-service-pg", total, log, workers)
    log("commit_service: SQLite")
    sqlite_dir = bench.tmp / "commit-service-sqlite"
    sqlite_dir.mkdir(parents=True, exist_ok=True)
    out["sqlite"] = measure(f"sqlite:///{sqlite_dir / 'store.db'}", sqlite_dir, total, log, workers)
    pg = out["postgres"]
    out["targets"] = {
        "pg_commits_per_s_ge_300": bool(
            pg["commits_per_s"] and pg["commits_per_s"] >= TARGETS_PG["commits_per_s"]
        ),
        "pg_p99_le_100ms": bool(pg["p99_ms"] <= TARGETS_PG["p99_ms"]) and not pg["failures"],
    }
    return out


def main() -> int:
    import argparse
    from types import SimpleNamespace

    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--workers", type=int, default=1, help="delta-mirror serve --workers N")
    opts = parser.parse_args()
    from support.services import PgServer

    server = PgServer.from_env_or_start()
    tmp = Path(tempfile.mkdtemp(prefix="dm-bench-cs-"))
    try:
        bench = SimpleNamespace(opts=opts, tmp=tmp, new_db=server.create_database)
        print(json.dumps(figure(bench, lambda m: print(m, file=sys.stderr)), indent=2))
    finally:
        server.stop_and_remove()
    return 0


if __name__ == "__main__":
    sys.exit(main())
