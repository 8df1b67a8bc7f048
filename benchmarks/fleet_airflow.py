"""Fleet benchmark on a real Airflow (issue 15, item 4): commit → published at N event-driven tables.

For each number of tables N and each task layout, one ``airflow standalone`` (scheduler, triggerer,
dag-processor, api-server; LocalExecutor) started by the e2e tests' ``AirflowStack``, with Airflow's
metadata and the delta-mirror store in two databases of one throwaway PostgreSQL server
(``support.services.PgServer``) and the tables on local storage. N tables from a generated config
(``schedule: event``, ``poll_interval: 1s``), version 0 of each published before Airflow starts (so
the run measures commits, not the initial catch-up). Then, per commit rate: writers commit one
``add`` (a real one-row Parquet file) to random tables at a fixed total rate for a fixed time, then
a drain until every commit is published (or the drain limit).

Reported per run: commit → published latency p50 / p95 / p99 / max (the commit's ``committed_at``
and the publish state's ``finished_at`` in the store, both set by the committing / publishing
process), commits never published, every commit published exactly once (one publish attempt, the
log file present), the backlog over time, DAG runs and task instances started (metadata DB), the
CPU-seconds of the triggerer / scheduler / workers (the scheduler's children: LocalExecutor workers
and task processes) / dag-processor / api-server / PostgreSQL process trees (``/proc``, reaped
children included), per commit and, over an idle window before the writers, the idle watcher cost;
store statements/s (``log_statement = all`` on the store database only), transactions/s, new and
open connections (``pg_stat_database``, ``pg_stat_activity``); the DAG-file build time
(``fleet.dag_parse_seconds`` on the same config); the plugin's overview page (``/delta-mirror/``)
and ``delta-mirror status --json`` response times. The load average is recorded with every figure.

Alone: ``PYTHONPATH=tests .venv/bin/python benchmarks/fleet_airflow.py [--quick] [--sizes 100,500]
[--layouts single,triggerer] [--rates 1]`` prints one JSON object. From ``benchmarks/run.py``:
``fleet_airflow.figure(opts, log)`` with ``opts`` from ``fleet_airflow.options([...])``.
"""

from __future__ import annotations

import argparse
import contextlib
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
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))  # fleet.py
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # support/
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "airflow_e2e"))  # the e2e stack

from airflow_e2e_stack import VENV_BIN, AirflowStack
from fleet import _count_statements, cpu_delta, cpu_snapshot, dag_parse_seconds
from support.services import PgServer
from support.waiting import load_scaled

REPO = Path(__file__).resolve().parent.parent

# The task layout of each table's DAG, as table-config lines under `defaults:` (helper `sync`'s key
# `tasks`): "steps" = publish → checkpoint → validate → metrics, four task processes per run (the
# layout before issue 15 item 3); "single" = one `sync` task per run that publishes (`publish_in:
# task`); "triggerer" = `publish_in: triggerer` (the default for event tables since issue 27): the
# triggerer's watcher publishes, a run starts only when a checkpoint is due or publishing failed
# (validation is the monitor's fleet-wide task, on its cadence).
LAYOUTS: dict[str, list[str]] = {
    "steps": ["  tasks: steps", "  publish_in: task"],
    "single": ["  tasks: single", "  publish_in: task"],
    "triggerer": ["  tasks: single", "  publish_in: triggerer"],
}

Log = Callable[[str], None]


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


# -- PostgreSQL -------------------------------------------------------------------------------------


def _conn(port: int, db: str = "postgres") -> psycopg.Connection[Any]:
    return psycopg.connect(host="127.0.0.1", port=port, user="postgres", dbname=db, autocommit=True)


def _rows(port: int, db: str, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
    with _conn(port, db) as conn:
        return list(conn.execute(sql, params).fetchall())


def _one(port: int, db: str, sql: str, params: Sequence[Any] = ()) -> Any:
    return _rows(port, db, sql, params)[0][0]


def _db_stats(port: int, db: str) -> dict[str, int]:
    sql = "SELECT sessions, xact_commit + xact_rollback, 0 FROM pg_stat_database WHERE datname = %s"
    sessions, xacts, _ = _rows(port, "postgres", sql, (db,))[0]
    backends = _one(port, "postgres", "SELECT count(*) FROM pg_stat_activity WHERE datname = %s", (db,))
    return {"sessions": sessions, "xacts": xacts, "backends": backends}


# -- the fleet ------------------------------------------------------------------------------------


def config_text(n: int, layout: str) -> str:
    lines = [
        "defaults:",
        "  schedule: event",
        "  poll_interval: 1s",
        "  retries: 0",
        "  deadline: null",
        *LAYOUTS[layout],
        "  maintenance:",
        "    schedule: null",
        "reconcile:",
        "  schedule: null",
        "monitor:",
        "  schedule: null",
        "tables:",
    ]
    return "\n".join([*lines, *(f"  t{i:04d}: {{}}" for i in range(n))]) + "\n"


def _one_row(root: Path) -> dict[str, Any]:
    import pyarrow as pa

    from delta_mirror.dev.datafiles import write_data_file

    data = pa.table({"id": [random.randrange(1 << 40)], "name": ["x"]})
    return write_data_file(root, data)


def make_tables(url: str, root: Path, n: int) -> list[str]:
    """N tables with version 0 (protocol, metaData, one add) committed and published."""
    import pyarrow as pa
    from support.builders import metadata_body, protocol_body

    from delta_mirror.dev.datafiles import delta_schema_string
    from delta_mirror.jobs.publisher import Publisher
    from delta_mirror.store import SqlStore

    schema = delta_schema_string(pa.schema([("id", pa.int64()), ("name", pa.string())]))
    store = SqlStore(url)
    store.init()
    publisher = Publisher(store)
    names = [f"t{i:04d}" for i in range(n)]
    try:
        for name in names:
            table = root / name
            table.mkdir(parents=True)
            meta = metadata_body(id=f"00000000-0000-4000-8000-{int(name[1:]):012d}", schema_string=schema)
            actions = [("protocol", protocol_body()), ("metaData", meta), ("add", _one_row(table))]
            store.commit(name, actions, location=table.as_uri())
            publisher.publish(name)
    finally:
        store.close()
    return names


class Writers:
    """Threads committing one ``add`` to random tables at ``rate`` commits/s in total."""

    def __init__(
        self, url: str, root: Path, names: list[str], rate: float, seconds: float, threads: int
    ) -> None:
        self.url, self.root, self.names = url, root, names
        self.rate, self.seconds, self.threads = rate, seconds, max(1, threads)
        self.sent: list[tuple[str, int]] = []
        self.errors: list[str] = []
        self._lock = threading.Lock()
        self.workers: list[threading.Thread] = []

    def start(self) -> None:
        t0 = time.monotonic() + 0.2
        for k in range(self.threads):
            w = threading.Thread(target=self._run, args=(k, t0), daemon=True, name=f"writer-{k}")
            w.start()
            self.workers.append(w)

    def _run(self, k: int, t0: float) -> None:
        from delta_mirror.store import SqlStore

        store = SqlStore(self.url)
        rng = random.Random(1500 + k)
        total = int(self.rate * self.seconds)
        try:
            for i in range(k, total, self.threads):
                delay = t0 + i / self.rate - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                name = rng.choice(self.names)
                try:
                    version = store.commit(name, [("add", _one_row(self.root / name))])
                except Exception as exc:  # a conflict between writers on one table: counted, not retried
                    with self._lock:
                        self.errors.append(f"{name}: {type(exc).__name__}: {exc}"[:200])
                    continue
                with self._lock:
                    self.sent.append((name, int(version)))
        finally:
            store.close()

    def join(self) -> None:
        for w in self.workers:
            w.join()


def _published(
    port: int, db: str, sent: list[tuple[str, int]]
) -> list[tuple[str, int, int, str | None, int | None, int | None]]:
    """(table, version, committed_at ms, json publish state, finished_at ms, attempts) per commit sent."""
    if not sent:
        return []
    rows = _rows(
        port,
        db,
        "SELECT t.name, c.version, c.committed_at, m.state, m.finished_at, m.attempts "
        "FROM dl_commits c JOIN dl_tables t ON t.id = c.table_id "
        "LEFT JOIN dl_mirror_status m ON m.table_id = c.table_id AND m.version = c.version AND m.artifact = 'json' "
        "WHERE c.version > 0",
    )
    wanted = set(sent)
    return [r for r in rows if (r[0], r[1]) in wanted]


def _pending(port: int, db: str) -> int:
    return int(
        _one(port, db, "SELECT count(*) FROM dl_mirror_status WHERE artifact = 'json' AND state <> 'SUCCESS'")
    )


def _pct(values: list[float], p: float) -> float | None:
    if not values:
        return None
    return round(values[min(len(values) - 1, int(p * len(values)))], 2)


def _runs(port: int, metadata_db: str, home: Path | None = None) -> dict[str, Any]:
    """DAG runs by type and state, task instances by task; with ``home`` (the stack's AIRFLOW_HOME)
    also why up to five failed task instances failed, from their task logs (the stack's directory
    is removed after the run, so this is the only trace a bench keeps of them)."""
    runs = _rows(
        port,
        metadata_db,
        "SELECT run_type, state, count(*) FROM dag_run WHERE dag_id LIKE 'delta\\_mirror\\_\\_%%' GROUP BY 1, 2",
    )
    tis = _rows(
        port,
        metadata_db,
        "SELECT task_id, count(*), avg(duration), "
        "avg(extract(epoch FROM start_date - queued_dttm)) FROM task_instance "
        "WHERE dag_id LIKE 'delta\\_mirror\\_\\_%%' GROUP BY 1",
    )
    out: dict[str, Any] = {
        "dag_runs": {f"{t}/{s}": int(c) for t, s, c in runs},
        "task_instances": {
            t: {"count": int(c), "mean_duration_s": _r(d), "mean_queued_s": _r(q)} for t, c, d, q in tis
        },
    }
    if home is not None:
        failed = _rows(
            port,
            metadata_db,
            "SELECT dag_id, run_id, task_id, try_number FROM task_instance "
            "WHERE state = 'failed' AND dag_id LIKE 'delta\\_mirror\\_\\_%%' LIMIT 5",
        )
        out["failed_tasks"] = [_failure(home, *row) for row in failed]
    return out


def _failure(home: Path, dag_id: str, run_id: str, task_id: str, attempt: int) -> dict[str, Any]:
    """A failed task instance and the last error lines of its log (none when the log is missing)."""
    path = (
        home
        / "logs"
        / f"dag_id={dag_id}"
        / f"run_id={run_id}"
        / f"task_id={task_id}"
        / f"attempt={attempt}.log"
    )
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        lines = []
    errors = [line[:500] for line in lines if "error" in line.lower()][-3:]
    return {"dag_id": dag_id, "run_id": run_id, "task_id": task_id, "try": attempt, "log_errors": errors}


def _r(x: Any) -> float | None:
    return None if x is None else round(float(x), 2)


def _triggers(port: int, metadata_db: str) -> int:
    return int(_one(port, metadata_db, "SELECT count(*) FROM trigger WHERE triggerer_id IS NOT NULL"))


_PROCESSOR = re.compile(
    r"delta_mirror_dags\.py\s+(?:\d+\s+)?(?:[\d.]+s\s+)?(\d+)\s+(\d+)\s+([\d.]+)s\s+(\S+)"
)
_TASK_PARSE = re.compile(r"Worker startup parse complete.*?dag_file_parse_ms=(\d+)")
_WORKLOAD = re.compile(r"Workload finished.*?duration=([\d.]+)")


def log_figures(path: Path) -> dict[str, Any]:
    """From ``airflow standalone``'s output: the dag-processor's "Last Duration" of the DAG file
    (every table's DAG), a task's own start-up parse (its table's DAG only), task process lifetimes."""
    text = path.read_text(errors="replace")
    full = [float(d) for d, _at in {(m[2], m[3]) for m in _PROCESSOR.findall(text)}]  # one per parse
    task = sorted(int(m) / 1000 for m in _TASK_PARSE.findall(text))
    work = sorted(float(m) for m in _WORKLOAD.findall(text))

    def stats(xs: list[float]) -> dict[str, Any]:
        return {"n": len(xs), "median_s": _r(statistics.median(xs)) if xs else None, "p95_s": _pct(xs, 0.95)}

    return {
        "dag_processor_parse": stats(sorted(full)),
        "task_startup_parse": stats(task),
        "task_process": stats(work),
    }


def _timed(fn: Callable[[], Any], times: int = 3) -> dict[str, Any]:
    took, status = [], None
    for _ in range(times):
        t0 = time.perf_counter()
        status = fn()
        took.append(time.perf_counter() - t0)
    return {
        "min_s": round(min(took), 3),
        "median_s": round(statistics.median(took), 3),
        "status": status,
        "load": load(),
    }


# The monitor DAG's fleet validation (``publish_in: triggerer`` tables), run once over every table in a
# fresh interpreter: its wall time and CPU-seconds (user + sys) and how many tables it validated.
_VALIDATE_PASS = """
import json, resource, sys, time
from datetime import timedelta
from delta_mirror.jobs.fleet_validate import TableValidation, failures, validate_due_tables
from delta_mirror.store.sql_store import SqlStore
t0 = time.monotonic()
store = SqlStore(sys.argv[1])
names = [t.name for t in store.list_tables()]
results = validate_due_tables(store, {n: TableValidation(timedelta(minutes=10)) for n in names})
ru = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"tables": len(names), "validated": sum(r.report is not None for r in results),
                  "failed": len(failures(results)), "wall_s": round(time.monotonic() - t0, 2),
                  "cpu_s": round(ru.ru_utime + ru.ru_stime, 2)}))
"""


def fleet_validation_pass(store_url: str, commits_per_s: float) -> dict[str, Any]:
    """One validation pass over every table (all due: the worst case of a 10-minute cadence) and its
    CPU amortised per commit at ``commits_per_s`` over the cadence."""
    out = subprocess.run(
        [str(VENV_BIN / "python"), "-c", _VALIDATE_PASS, store_url],
        capture_output=True,
        text=True,
        timeout=3600,
    )
    if out.returncode != 0:
        return {"error": out.stderr.strip().splitlines()[-1:] or [f"exit {out.returncode}"]}
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    result["cpu_s_per_commit_at_rate"] = round(result["cpu_s"] / (600 * commits_per_s), 4)
    result["load"] = load()
    return result


def _status_cli(env: dict[str, str]) -> int:
    out = subprocess.run(
        [str(VENV_BIN / "delta-mirror"), "status", "--json"], env=env, capture_output=True, timeout=300
    )
    return out.returncode


@contextlib.contextmanager
def airflow(
    pg: PgServer, home: Path, config: Path, store_url: str, opts: Any, log: Log
) -> Iterator[tuple[AirflowStack, str]]:
    meta_url = pg.create_database(prefix="airflow_")
    stack = AirflowStack(
        home,
        {
            "DELTA_MIRROR_CONFIG": str(config),
            "DELTA_MIRROR_STORE": store_url,
            "AIRFLOW__CORE__PLUGINS_FOLDER": str(REPO / "plugins"),
            "AIRFLOW__CORE__PARALLELISM": str(opts.parallelism),
            # a task's calls to the Execution API (api-server): 5 s by default, which a loaded 2-core
            # machine exceeds, and the retried `PATCH .../run` then fails the task (400: already running)
            "AIRFLOW__WORKERS__EXECUTION_API_TIMEOUT": str(opts.api_timeout),
            # how often the dag-processor parses the DAG file again (Airflow's default: 30 s); a fleet
            # whose table list changes rarely sets it higher (docs/scaling.md)
            **(
                {"AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": str(int(opts.dag_reparse))}
                if opts.dag_reparse
                else {}
            ),
        },
        metadata_url=meta_url.replace("postgresql+psycopg://", "postgresql+psycopg2://"),
    )
    try:
        stack.start()
        yield stack, meta_url.rsplit("/", 1)[1]
    finally:
        killed = stack.stop()
        if killed:
            log(f"  airflow: SIGKILLed {killed}")
        with contextlib.suppress(Exception):
            pg.drop_database(meta_url)


def _wait(check: Callable[[], bool], seconds: float, what: str, stack: AirflowStack) -> float:
    t0 = time.monotonic()
    while not check():
        stack._check_alive()
        if time.monotonic() - t0 > load_scaled(seconds):
            raise RuntimeError(f"timed out waiting for {what} (load {load()})")
        time.sleep(1.0)
    return round(time.monotonic() - t0, 1)


def _machine_busy() -> float:
    """CPU-seconds the whole machine has been busy (``/proc/stat``: all but idle and iowait)."""
    with open("/proc/stat") as f:
        ticks = [int(x) for x in f.readline().split()[1:]]
    return (sum(ticks[:8]) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


class Fleet:
    """One running fleet: the stack, its two databases, the tables; snapshots of its counters."""

    def __init__(self, pg: PgServer, stack: AirflowStack, store_url: str, meta_db: str, work: Path) -> None:
        assert stack.proc is not None
        self.pg, self.stack, self.store_url, self.meta_db, self.work = pg, stack, store_url, meta_db, work
        self.port, self.store_db = pg.port, store_url.rsplit("/", 1)[1]
        self.standalone = stack.proc.pid
        self.postmaster = int((pg.datadir / "postmaster.pid").read_text().split()[0])

    def snapshot(self) -> dict[str, Any]:
        return {
            "t": time.monotonic(),
            "db": _db_stats(self.port, self.store_db),
            "log": self.pg.logfile.stat().st_size,
            "cpu": cpu_snapshot(self.standalone, self.postmaster),
            "machine": _machine_busy(),
        }

    def window(self, a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
        """Cores per component and the store's load between two snapshots, per second."""
        el = b["t"] - a["t"]
        statements = _count_statements(self.pg.logfile, a["log"], self.store_db) if b["log"] > a["log"] else 0
        return {
            "window_s": round(el, 1),
            "cores": {k: round(v / el, 3) for k, v in cpu_delta(a["cpu"], b["cpu"]).items()},
            # every process on the machine (the other jobs sharing it included), of os.cpu_count()
            "machine_busy_cores": round((b["machine"] - a["machine"]) / el, 2),
            "store_statements_per_s": round(statements / el, 1),
            "store_xacts_per_s": round((b["db"]["xacts"] - a["db"]["xacts"]) / el, 1),
            "store_new_connections_per_s": round((b["db"]["sessions"] - a["db"]["sessions"]) / el, 2),
            "load": load(),
        }

    def pending(self) -> int:
        return _pending(self.port, self.store_db)


def run_one(pg: PgServer, n: int, layout: str, opts: Any, tmp: Path, log: Log) -> dict[str, Any]:
    """One Airflow with N tables in ``layout``; one phase per commit rate in ``opts.rates``."""
    work = Path(tempfile.mkdtemp(prefix=f"{layout}{n}-", dir=tmp))
    store_url = pg.create_database(prefix="dmstore_")
    config = work / "delta_mirror.yaml"
    config.write_text(config_text(n, layout))
    t0 = time.monotonic()
    names = make_tables(store_url, work / "tables", n)
    result: dict[str, Any] = {
        "tables": n,
        "layout": layout,
        "dag_reparse_s": opts.dag_reparse or 30,
        "setup_s": round(time.monotonic() - t0, 1),
    }
    log(f"fleet_airflow: {layout}, {n} tables created and published in {result['setup_s']} s (load {load()})")
    with _conn(pg.port) as admin:  # statements are counted from the server log, for this database only
        admin.execute(f"ALTER DATABASE {store_url.rsplit('/', 1)[1]} SET log_statement = 'all'")
    try:
        with airflow(pg, work / "airflow", config, store_url, opts, log) as (stack, meta_db):
            fleet = Fleet(pg, stack, store_url, meta_db, work)
            ready = stack.wait_ready({"delta_mirror__t0000"}, timeout=load_scaled(300 + n))
            result["airflow_ready_s"] = round(ready, 1)
            result["triggers_ready_s"] = _wait(
                lambda: _triggers(pg.port, meta_db) >= n, 300 + n, "triggers", stack
            )
            log(
                f"  airflow ready in {ready:.0f} s, {n} triggers assigned {result['triggers_ready_s']} s later"
            )
            time.sleep(5)  # the triggers' first polls
            a = fleet.snapshot()
            time.sleep(opts.idle)
            result["idle"] = fleet.window(a, fleet.snapshot())
            result["idle"]["store_open_connections"] = _db_stats(pg.port, fleet.store_db)["backends"]
            result["idle"]["metadata_open_connections"] = _db_stats(pg.port, meta_db)["backends"]
            log(f"  idle: {result['idle']}")
            result["phases"] = [load_phase(fleet, names, rate, opts, log) for rate in opts.rates]
            env = {**os.environ, "DELTA_MIRROR_STORE": store_url, "DELTA_MIRROR_CONFIG": str(config)}
            result["ui_overview"] = _timed(lambda: stack.api("GET", "/delta-mirror/").status_code)
            result["ui_overview_api"] = _timed(
                lambda: stack.api("GET", "/delta-mirror/api/overview").status_code
            )
            result["status_json_cli"] = _timed(lambda: _status_cli(env))
            log(f"  UI overview {result['ui_overview']}, status --json {result['status_json_cli']}")
            if layout == "triggerer":  # the validation the per-commit runs no longer do
                result["fleet_validation"] = fleet_validation_pass(store_url, min(opts.rates))
                log(f"  fleet validation pass: {result['fleet_validation']}")
            result["airflow_log"] = log_figures(stack.log_path)
            log(f"  from Airflow's log: {result['airflow_log']}")
        result["dag_file"] = dag_parse_seconds(n, work / "parse", config=config)
        log(f"  DAG file: {result['dag_file']}")
    finally:
        with contextlib.suppress(Exception):
            pg.drop_database(store_url)
    return result


def _latency(fleet: Fleet, sent: list[tuple[str, int]]) -> dict[str, Any]:
    """From the store: commit → published per commit sent; never published; published once."""
    rows = _published(fleet.port, fleet.store_db, sent)
    lat = sorted((f - c) / 1000 for _n, _v, c, s, f, _a in rows if s == "SUCCESS" and f is not None)
    logs = fleet.work / "tables"
    return {
        "latency_s": {
            "p50": _pct(lat, 0.5),
            "p95": _pct(lat, 0.95),
            "p99": _pct(lat, 0.99),
            "max": _r(lat[-1]) if lat else None,
            "mean": _r(statistics.fmean(lat)) if lat else None,
        },
        "published": len(lat),
        "never_published": len(sent) - len(lat),
        # one publish attempt per version (the state's attempts) and its log file in place
        "published_exactly_once": sum(1 for r in rows if r[3] == "SUCCESS" and r[5] == 1) == len(sent) > 0,
        "publish_attempts": {
            str(a): sum(1 for r in rows if r[5] == a) for a in sorted({r[5] for r in rows}, key=str)
        },
        "log_files_present": sum(
            1 for n, v, *_ in rows if (logs / n / "_delta_log" / f"{v:020d}.json").exists()
        ),
    }


def load_phase(fleet: Fleet, names: list[str], rate: float, opts: Any, log: Log) -> dict[str, Any]:
    """Writers at ``rate`` for ``opts.seconds``, then the drain (at most ``opts.drain``)."""
    log(f"  writers: {rate}/s for {opts.seconds} s (load {load()})")
    runs0 = _runs(fleet.port, fleet.meta_db)
    a = fleet.snapshot()
    writers = Writers(fleet.store_url, fleet.work / "tables", names, rate, opts.seconds, opts.writers)
    writers.start()
    backlog: list[tuple[float, int, list[float]]] = []  # (s since start, versions not published, load)
    open_store: list[int] = []
    while any(w.is_alive() for w in writers.workers):
        time.sleep(5)
        backlog.append((round(time.monotonic() - a["t"]), fleet.pending(), load()))
        open_store.append(_db_stats(fleet.port, fleet.store_db)["backends"])
    writers.join()
    b = fleet.snapshot()
    drain_t0 = time.monotonic()
    while time.monotonic() - drain_t0 < opts.drain and fleet.pending():
        time.sleep(2)
    drained = round(time.monotonic() - drain_t0, 1)
    c = fleet.snapshot()
    sent = list(writers.sent)
    cpu = cpu_delta(a["cpu"], c["cpu"])
    stack_cpu = sum(v for k, v in cpu.items() if k != "postgres")
    phase = {
        "rate_per_s": rate,
        "seconds": opts.seconds,
        "commits": len(sent),
        "writer_errors": writers.errors[:5],
        "achieved_rate_per_s": round(len(sent) / (b["t"] - a["t"]), 2),
        **_latency(fleet, sent),
        "drain_s": drained,
        "backlog": backlog,
        "cpu_s": cpu,  # writing and drain
        "cpu_s_per_commit": {
            "stack": round(stack_cpu / max(1, len(sent)), 3),
            "stack_and_postgres": round((stack_cpu + cpu["postgres"]) / max(1, len(sent)), 3),
        },
        "while_writing": fleet.window(a, b),
        "store_open_connections": {
            "max": max(open_store, default=None),
            "mean": _r(statistics.fmean(open_store)) if open_store else None,
        },
        "runs_before": runs0,
        "runs_after": _runs(fleet.port, fleet.meta_db, fleet.work / "airflow"),
        "load_end": load(),
        "wall_s": round(c["t"] - a["t"], 1),
    }
    keys = (
        "commits",
        "latency_s",
        "never_published",
        "published_exactly_once",
        "cpu_s_per_commit",
        "drain_s",
    )
    log(f"  phase {rate}/s: {json.dumps({k: phase[k] for k in keys})} load {load()}")
    return phase


def figure(opts: Any, log: Log) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="dm-bench-fleet-airflow-"))
    pg = PgServer.start_new()
    results: list[dict[str, Any]] = []
    try:
        with _conn(pg.port) as admin:
            admin.execute("ALTER SYSTEM SET log_line_prefix = '%m [%p] db=%d '")
            admin.execute("SELECT pg_reload_conf()")
            (pg_version,), *_ = admin.execute("SHOW server_version").fetchall()
        for n in opts.sizes:
            for layout in opts.layouts:
                try:
                    results.append(run_one(pg, n, layout, opts, tmp, log))
                except Exception as exc:  # one failed size / layout is reported, the others still run
                    log(f"fleet_airflow: {layout} {n} failed: {exc}")
                    results.append(
                        {"tables": n, "layout": layout, "error": f"{type(exc).__name__}: {exc}"[:2000]}
                    )
                if opts.out:  # what was measured so far survives a later failure or an interrupt
                    Path(opts.out).write_text(json.dumps(_report(opts, pg_version, results), indent=2))
    finally:
        pg.stop_and_remove()
        shutil.rmtree(tmp, ignore_errors=True)
    return _report(opts, pg_version, results)


def _git() -> dict[str, Any]:
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True).stdout.strip()

    return {
        "commit": git("rev-parse", "--short", "HEAD"),
        "modified": git("status", "--porcelain", "--", "include").splitlines(),
    }


def _report(opts: Any, pg_version: str, results: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
        },
        "postgres": pg_version,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "git": _git(),
        "command": " ".join(sys.argv),
        "settings": {
            "poll_interval_s": 1,
            "executor": "LocalExecutor",
            "parallelism": opts.parallelism,
            "execution_api_timeout_s": opts.api_timeout,
            "seconds": opts.seconds,
            "drain_limit_s": opts.drain,
            "idle_window_s": opts.idle,
            "writers": opts.writers,
            "rates": opts.rates,
            "layouts": {k: LAYOUTS[k] for k in opts.layouts},
        },
        "runs": results,
        "summary": summary(results),
    }


def summary(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for r in results:
        for p in r.get("phases", []):
            out.append(
                {
                    "tables": r["tables"],
                    "layout": r["layout"],
                    "rate": p["rate_per_s"],
                    "p50_s": p["latency_s"]["p50"],
                    "p99_s": p["latency_s"]["p99"],
                    "never_published": p["never_published"],
                    "exactly_once": p["published_exactly_once"],
                    "cpu_s_per_commit": p["cpu_s_per_commit"]["stack"],
                    "idle_triggerer_cores": r["idle"]["cores"]["triggerer"],
                    "p99_within_5s": p["latency_s"]["p99"] is not None
                    and p["latency_s"]["p99"] <= 5
                    and p["never_published"] == 0,
                    "load_end": p["load_end"],
                }
            )
    return out


def options(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="10 tables, 60 s of commits, a 120 s drain")
    parser.add_argument("--sizes", default="100,500", help="numbers of event-driven tables, comma-separated")
    parser.add_argument("--layouts", default="single,triggerer", help=f"task layouts: {', '.join(LAYOUTS)}")
    parser.add_argument("--rates", default="1", help="total commits per second, one phase each (same stack)")
    parser.add_argument("--seconds", type=float, default=180.0, help="how long the writers commit (s)")
    parser.add_argument(
        "--drain", type=float, default=200.0, help="the longest wait for the backlog after (s)"
    )
    parser.add_argument("--idle", type=float, default=20.0, help="the idle window before the writers (s)")
    parser.add_argument("--writers", type=int, default=2, help="writer threads sharing the rate")
    parser.add_argument("--out", default=None, help="also write the JSON here after each size / layout")
    parser.add_argument("--api-timeout", type=float, default=60.0, help="[workers] execution_api_timeout (s)")
    parser.add_argument("--parallelism", type=int, default=8, help="Airflow [core] parallelism")
    parser.add_argument(
        "--dag-reparse",
        type=float,
        default=0,
        help="[dag_processor] min_file_process_interval (s); 0: Airflow's default (30 s)",
    )
    quick = {"sizes": "10", "seconds": 60.0, "drain": 120.0, "idle": 10.0}
    if "--quick" in (sys.argv[1:] if argv is None else argv):  # --quick's defaults; explicit options win
        parser.set_defaults(**quick)
    opts = parser.parse_args(argv)
    opts.sizes = [int(s) for s in str(opts.sizes).split(",")]
    opts.layouts = [s for s in opts.layouts.split(",") if s]
    unknown = [s for s in opts.layouts if s not in LAYOUTS]
    if unknown:
        parser.error(f"unknown layout(s) {unknown}: use {', '.join(LAYOUTS)}")
    opts.rates = [float(s) for s in str(opts.rates).split(",")]
    return opts


def main() -> int:
    opts = options()
    print(json.dumps(figure(opts, lambda m: print(m, file=sys.stderr, flush=True)), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
