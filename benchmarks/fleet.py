"""Fleet benchmark (issue 15, items 1-2): the cost of watching N event-driven tables, before/after.

Runs the watchers of N tables in one event loop, as Airflow's triggerer does, against a throwaway
PostgreSQL store (``log_statement = all``, so every statement the server receives is counted):

- ``before``: the pre-fleet trigger, one poll per table per interval, each on a new ``SqlStore``
  (a new engine and connection: ``get_table``, ``latest_version``, ``last_published_version``);
- ``after``: ``StoreCommitTrigger`` as shipped, run as the triggerer runs it (Airflow's shared
  stream, ``support.triggerer``): one watcher per store connection and interval (one statement per
  interval for all tables, the process's pooled engine, woken by NOTIFY), broadcast to every trigger.

For each mode and N it measures, over an idle window: new server sessions per second, statements
per second and per poll interval, open connections, the CPU of the watching process (cores); then
commit→event latency for commits to random tables at a fixed rate. Also the DAG-file build time for
1,000 generated tables (a fresh interpreter importing the factory and building every DAG).

Alone: ``PYTHONPATH=tests .venv/bin/python benchmarks/fleet.py [--quick] [--sizes 50,500]`` prints
one JSON object. To wire it into ``benchmarks/run.py`` as a ``fleet`` piece: call
``fleet.figure(opts, log)`` in a child and put its result under ``"fleet"`` in the JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from support.services import scalar_query

REPO = Path(__file__).resolve().parent.parent

_STATEMENT = re.compile(r"LOG:\s+(statement|execute [^:]*):")


TICK = os.sysconf("SC_CLK_TCK")


# -- CPU of process trees (fleet_airflow.py: the Airflow components) ---------------------------------------------------------------


def _procs() -> dict[int, tuple[int, float, float, str]]:
    """pid → (ppid, own CPU s, reaped children's CPU s, command line) of every live process."""
    out: dict[int, tuple[int, float, float, str]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, IndexError):
            continue
        ppid = int(fields[1])
        own = (int(fields[11]) + int(fields[12])) / TICK
        reaped = (int(fields[13]) + int(fields[14])) / TICK
        out[int(entry)] = (ppid, own, reaped, cmd)
    return out


def _descendants(procs: dict[int, tuple[int, float, float, str]], root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for pid, (ppid, *_rest) in procs.items():
        children.setdefault(ppid, []).append(pid)
    found, todo = [], list(children.get(root, []))
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo += children.get(pid, [])
    return found


COMPONENTS = ("scheduler", "triggerer", "dag-processor", "api-server")


def cpu_snapshot(standalone: int, postmaster: int | None) -> dict[str, float]:
    """CPU-seconds so far per component tree: the scheduler's own process apart from its
    children ("workers": LocalExecutor workers and the task processes they fork and reap)."""
    procs = _procs()
    cpu = dict.fromkeys((*COMPONENTS, "workers", "standalone", "postgres"), 0.0)
    if standalone in procs:
        cpu["standalone"] = procs[standalone][1]
    for pid in (p for p, v in procs.items() if v[0] == standalone):
        cmd = procs[pid][3]
        name = next((c for c in COMPONENTS if c in cmd or c.replace("-", "_") in cmd), "standalone")
        tree = sum(procs[d][1] + procs[d][2] for d in _descendants(procs, pid))
        if name == "scheduler":
            cpu["scheduler"] += procs[pid][1]
            cpu["workers"] += tree + procs[pid][2]
        else:
            cpu[name] += procs[pid][1] + procs[pid][2] + tree
    if postmaster in procs:
        cpu["postgres"] = (
            procs[postmaster][1]
            + procs[postmaster][2]
            + sum(procs[d][1] + procs[d][2] for d in _descendants(procs, postmaster))
        )
    return cpu


def cpu_delta(a: dict[str, float], b: dict[str, float]) -> dict[str, float]:
    return {k: round(b[k] - a.get(k, 0.0), 2) for k in b}


def _tables(store: Any, root: Path, n: int) -> list[str]:
    from support.builders import add_body, metadata_body, protocol_body

    names = [f"t{i:04d}" for i in range(n)]
    for name in names:
        store.create_table(name, (root / name).as_uri())
        store.commit(
            name, [("protocol", protocol_body()), ("metaData", metadata_body()), ("add", add_body("a"))]
        )
    return names


def _sessions(url: str) -> int:
    """Sessions ever opened to the bench database (asked from the ``postgres`` database)."""
    return scalar_query(_admin(url), f"SELECT sessions FROM pg_stat_database WHERE datname = '{_db(url)}'")


def _backends(url: str) -> int:
    return scalar_query(_admin(url), f"SELECT count(*) FROM pg_stat_activity WHERE datname = '{_db(url)}'")


def _db(url: str) -> str:
    from sqlalchemy.engine import make_url

    return str(make_url(url).database)


def _admin(url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(url).set(database="postgres").render_as_string(hide_password=False)


def _legacy_check(url: str, table: str) -> tuple[int | None, int | None]:
    """The pre-fleet trigger's poll (triggers.py before commit 8d8a357): a new store per poll."""
    from delta_mirror.store import SqlStore

    store = SqlStore(url)
    try:
        info = store.get_table(table)
        return store.latest_version(info.id), store.last_published_version(info.id)
    finally:
        store.close()


async def _legacy_run(url: str, table: str, interval: float) -> Any:
    """The pre-fleet ``StoreCommitTrigger.run`` loop, as an async generator of payloads."""
    watermark = None
    while True:
        try:
            latest, published = await asyncio.to_thread(_legacy_check, url, table)
        except Exception:
            latest, published = None, None
        if watermark is None and latest is not None:
            watermark = published if published is not None else -1
        if latest is not None and watermark is not None and latest > watermark:
            yield {"table": table, "from_version": watermark + 1, "to_version": latest}
            watermark = latest
        await asyncio.sleep(interval)


async def _trigger_run(table: str, interval: float, triggerer: Any) -> Any:
    """``StoreCommitTrigger`` as the triggerer runs it: in Airflow's shared stream of its store."""
    from delta_mirror.airflow.triggers import StoreCommitTrigger

    # coalesce_seconds=0: no DAG run publishes here, so the watcher's own latency is what is measured
    async for payload in triggerer.events(
        StoreCommitTrigger(table=table, poll_interval=interval, coalesce_seconds=0)
    ):
        yield payload


def _count_statements(logfile: Path, offset: int, database: str) -> int:
    """Statements logged for ``database`` since ``offset`` (log_line_prefix names the database)."""
    with logfile.open("rb") as f:
        f.seek(offset)
        data = f.read().decode(errors="replace")
    return sum(1 for line in data.splitlines() if f"db={database} " in line and _STATEMENT.search(line))


async def _measure(
    mode: str,
    url: str,
    names: list[str],
    interval: float,
    window: float,
    commits: int,
    rate: float,
    logfile: Path,
) -> dict[str, Any]:
    from support.triggerer import Triggerer

    from delta_mirror.store import SqlStore

    arrived: dict[tuple[str, int], float] = {}
    triggerer = Triggerer()

    async def watch(name: str) -> None:
        gen = (
            _legacy_run(url, name, interval) if mode == "before" else _trigger_run(name, interval, triggerer)
        )
        async for payload in gen:
            arrived[(payload["table"], int(payload["to_version"]))] = time.monotonic()

    tasks = [asyncio.create_task(watch(n)) for n in names]
    loop = asyncio.get_running_loop()
    try:
        deadline = loop.time() + 120
        while len(arrived) < len(names) and loop.time() < deadline:  # each table's pending version 0
            await asyncio.sleep(0.1)
        warm = len(arrived)
        await asyncio.sleep(interval)
        offset = logfile.stat().st_size
        sessions0, cpu0, t0 = await asyncio.to_thread(_sessions, url), time.process_time(), time.monotonic()
        await asyncio.sleep(window)
        cpu1, t1 = time.process_time(), time.monotonic()
        sessions1 = await asyncio.to_thread(_sessions, url)
        statements = _count_statements(logfile, offset, _db(url))
        open_conns = await asyncio.to_thread(_backends, url)
        elapsed = t1 - t0
        # commits to random tables at `rate`; latency = commit returned → the trigger's event
        writer = SqlStore(url)
        # the CPU of this process while commits arrive: the watchers' fan-out (and the writer's calls)
        commit_cpu0 = time.process_time()
        sent: dict[tuple[str, int], float] = {}
        rng = random.Random(15)
        for _ in range(commits):
            name = rng.choice(names)
            version = await asyncio.to_thread(
                writer.commit, name, [("txn", {"appId": "bench", "version": 1})]
            )
            sent[(name, int(version))] = time.monotonic()
            await asyncio.sleep(1.0 / rate)
        deadline = loop.time() + max(10.0, 5 * interval)
        while not all(k in arrived for k in sent) and loop.time() < deadline:
            await asyncio.sleep(0.05)
        writer.close()
        commit_cpu = time.process_time() - commit_cpu0
        latencies = sorted(arrived[k] - t for k, t in sent.items() if k in arrived)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await triggerer.stop()

    def pct(p: float) -> float | None:
        if not latencies:
            return None
        return round(latencies[min(len(latencies) - 1, int(p * len(latencies)))], 3)

    new_sessions = sessions1 - sessions0
    return {
        "mode": mode,
        "tables": len(names),
        "poll_interval_s": interval,
        "warm_events": warm,
        "idle_window_s": round(elapsed, 2),
        "new_connections_per_s": round(new_sessions / elapsed, 2),
        "statements_per_poll_per_table": round(statements / elapsed * interval / len(names), 2),
        "statements_per_s": round(statements / elapsed, 1),
        "statements_per_interval": round(statements / elapsed * interval, 1),
        "open_connections": open_conns,  # the watchers only: measured before the writer connects
        "watcher_cpu_cores": round((cpu1 - cpu0) / elapsed, 3),
        "commits": len(sent),
        "events_for_commits": len(latencies),
        "latency_s": {
            "p50": pct(0.5),
            "p99": pct(0.99),
            "max": round(latencies[-1], 3) if latencies else None,
        },
        "latency_mean_s": round(statistics.fmean(latencies), 3) if latencies else None,
        "cpu_s_per_commit": round(commit_cpu / max(1, len(sent)), 4),
    }


def dag_parse_seconds(n: int, tmp: Path, config: Path | None = None) -> dict[str, Any]:
    """A fresh interpreter imports the DAG factory and builds the DAGs of ``n`` event-driven tables
    (of ``config`` when given: fleet_airflow.py times the config its Airflow ran)."""
    tmp.mkdir(parents=True, exist_ok=True)
    if config is None:
        config = tmp / "fleet.yaml"
        lines = ["defaults:", "  schedule: event", "  poll_interval: 1s", "tables:"]
        lines += [f"  t{i:04d}: {{}}" for i in range(n)]
        config.write_text("\n".join(lines) + "\n")
    code = (
        "import time; t0 = time.perf_counter(); "
        "from delta_mirror.airflow.dag_factory import build_dags; t1 = time.perf_counter(); "
        "dags = build_dags(); t2 = time.perf_counter(); "
        "print(len(dags), round(t1 - t0, 2), round(t2 - t1, 2))"
    )
    env = {**os.environ, "DELTA_MIRROR_CONFIG": str(config), "AIRFLOW_HOME": str(tmp / "airflow")}
    started = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    total = time.perf_counter() - started
    if out.returncode != 0:
        return {"tables": n, "error": out.stderr.strip().splitlines()[-1:]}
    dags, imports, build = out.stdout.split()[-3:]
    return {
        "tables": n,
        "dags": int(dags),
        "import_s": float(imports),
        "build_s": float(build),
        "process_s": round(total, 2),
    }


def figure(opts: Any, log: Callable[[str], None]) -> dict[str, Any]:
    from support.services import PgServer

    from delta_mirror.store import SqlStore

    tmp = Path(tempfile.mkdtemp(prefix="dm-bench-fleet-"))
    os.environ.setdefault("AIRFLOW_HOME", str(tmp / "airflow"))
    server = PgServer.start_new()
    results: list[dict[str, Any]] = []
    try:
        with __import__("psycopg").connect(
            f"host=127.0.0.1 port={server.port} user=postgres dbname=postgres", autocommit=True
        ) as admin:
            admin.execute("ALTER SYSTEM SET log_statement = 'all'")
            admin.execute("ALTER SYSTEM SET log_line_prefix = '%m [%p] db=%d '")
            admin.execute("SELECT pg_reload_conf()")
        for n in opts.sizes:
            for mode in opts.modes:
                url = server.create_database()
                store = SqlStore(url)
                store.init()
                names = _tables(store, tmp / f"{mode}{n}", n)
                store.close()
                os.environ["DELTA_MIRROR_STORE"] = url
                log(f"fleet: {mode}, {n} tables")
                result = asyncio.run(
                    _measure(
                        mode, url, names, opts.interval, opts.window, opts.commits, opts.rate, server.logfile
                    )
                )
                log(f"  {result}")
                results.append(result)
                server.drop_database(url)
        parse = dag_parse_seconds(opts.parse_tables, tmp) if opts.parse_tables else {}
        log(f"fleet: DAG file, {parse}")
    finally:
        server.stop_and_remove()
        shutil.rmtree(tmp, ignore_errors=True)  # the tables' folders and the DAG-file config
    return {
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
        },
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "watchers": results,
        "dag_file": parse,
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="50 tables, a 5 s window, 5 commits")
    parser.add_argument("--sizes", default="50,500", help="numbers of watched tables, comma-separated")
    parser.add_argument("--interval", type=float, default=1.0, help="each trigger's poll_interval (s)")
    parser.add_argument("--window", type=float, default=10.0, help="idle measuring window (s)")
    parser.add_argument("--commits", type=int, default=20)
    parser.add_argument("--rate", type=float, default=2.0, help="commits per second")
    parser.add_argument("--parse-tables", type=int, default=1000, help="0: skip the DAG-file build")
    parser.add_argument("--modes", default="before,after", help="before (the pre-fleet trigger), after")
    opts = parser.parse_args()
    opts.sizes = [int(s) for s in opts.sizes.split(",")]
    opts.modes = opts.modes.split(",")
    if opts.quick:
        opts.sizes, opts.window, opts.commits, opts.parse_tables = [50], 5.0, 5, 100
    print(json.dumps(figure(opts, lambda m: print(m, file=sys.stderr, flush=True)), indent=2))
    return 0


if __name__ == "__main__":
    threading.current_thread().name = "fleet-bench"
    sys.exit(main())
