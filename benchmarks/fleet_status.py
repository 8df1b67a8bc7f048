"""Fleet status benchmark (issue 15, item 3): ``status`` / ``health`` / monitor lag step / UI pages
with 1,000 tables and 1,000,000 versions in the store, on PostgreSQL and SQLite.

The store is filled in SQL (INSERT ... SELECT over a series), so the rows are what the commit path
and the publisher leave: one ``dl_commits`` row per version (sha256, size, commit time), a JSON
publish state per version (most tables published; every 10th table with a pending tail, every 50th
with failed versions and their errors, every 100th halted on a conflict, every 25th with a version
in progress), a published checkpoint every 10 versions, 26 h of lag samples every 5 minutes, a
validation result per table and an open circuit breaker. ``dl_actions`` stays empty: none of the
measured commands reads actions.

Measured, median of ``--repeat`` runs, the load average beside each figure:

- ``status_json_s`` / ``health_json_s``: the whole process ``delta-mirror status --json`` /
  ``health --json`` (interpreter start, imports, connect, queries, JSON), wall clock, and
  ``status_json_cpu_s`` / ``health_json_cpu_s``: its CPU (user + sys; the machine may be shared);
  ``cli_startup_s`` (``_cpu_s``): the interpreter importing the CLI, the store and health alone;
- ``status_phases``: where one ``status --json`` process goes, wall and CPU per phase (``--phases``:
  the command's own steps, timed): ``interpreter`` (``python -c pass``), ``import_cli``,
  ``import_store`` (SQLAlchemy), ``engine`` (the dialect and the driver load), ``connect`` (the
  first connection and the schema check), ``list_tables``, ``fleet_status``, ``json``;
- the CLI processes run with a bytecode cache (``PYTHONPYCACHEPREFIX`` in the run's temporary
  folder, warmed by one untimed run), as an installed package has its ``.pyc`` files: with
  ``PYTHONDONTWRITEBYTECODE`` set every run compiled ``delta_mirror`` from source (0.04-0.1 CPU-s);
  ``status_json_uncached_s`` is one run without the cache, for comparison;
- in one process (``--child``): ``fleet_status_s`` (every table's status), ``lag_step_s`` (the
  monitor DAG's lag step: statuses and one lag sample per table), ``overview_s`` (the UI overview
  page's data and HTML), ``table_page_s`` (a table page with failures), and the number of SQL
  statements each sends (``statements``).

``--before DIR``: also measure another checkout's ``include/`` (e.g. ``git archive <commit>
include | tar -x -C DIR``, then ``--before DIR/include``) on the same stores, reported under
``before`` (``--before-repeat`` runs, default 1: the per-table code takes minutes at this size).

Alone: ``PYTHONPATH=tests .venv/bin/python benchmarks/fleet_status.py [--quick]`` prints one JSON.
From ``benchmarks/run.py``: ``fleet_status.figure(opts, log)``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
FAILED_TABLE = 1  # id % 50 == 1: failed versions with their errors
NOW_MS = int(time.time() * 1000)


# -- the store -------------------------------------------------------------------------------------


def fill(url: str, tables: int, versions: int, log: Callable[[str], None]) -> dict[str, int]:
    """``tables`` tables of ``versions`` versions each, states and samples as the docstring says."""
    from sqlalchemy import insert, text

    from delta_mirror.store import SqlStore
    from delta_mirror.store.schema import dl_breakers, dl_tables

    store = SqlStore(url)
    store.init()
    pg = store.engine.dialect.name == "postgresql"
    sha = "md5(t.id || ':' || s.v) || md5(s.v || ':' || t.id)" if pg else "lower(hex(randomblob(32)))"
    yes = "true" if pg else "1"
    started = time.monotonic()
    validation = {
        "at": NOW_MS - 3_600_000,
        "from_version": 0,
        "to_version": versions - 10,
        "versions_checked": versions - 9,
        "reader": "deltalake",
        "ok": True,
        "problems": [],
        "problem_count": 0,
    }
    with store.engine.begin() as conn:
        conn.execute(text("CREATE TABLE bench_series (v BIGINT PRIMARY KEY)"))
        conn.execute(
            text("INSERT INTO bench_series (v) VALUES (:v)"), [{"v": v} for v in range(max(versions, 312))]
        )
        conn.execute(
            insert(dl_tables),
            [
                {
                    "id": i,
                    "name": f"t{i:04d}",
                    "location": f"s3://fleet-bucket/warehouse/t{i:04d}",
                    "table_uuid": f"00000000-0000-4000-8000-{i:012d}",
                    "state": "HALTED" if i % 100 == 2 else "ACTIVE",
                    "halted_reason": f"CONFLICT at version {versions - 1}: a different file is at the location"
                    if i % 100 == 2
                    else None,
                    "first_version": 0,
                    "settings": json.dumps({"last_validation": validation}),
                    "created_at": NOW_MS - 30 * 86_400_000,
                }
                for i in range(1, tables + 1)
            ],
        )
        n = versions
        conn.execute(
            text(
                "INSERT INTO dl_commits (table_id, version, committed_at, action_count, size_bytes, sha256, "
                f"has_json, source) SELECT t.id, s.v, {NOW_MS} + (s.v - {n}) * 60000 + t.id, 3, "
                f"1200 + (s.v * 7 + t.id) % 900, {sha}, {yes}, 'native' "
                f"FROM dl_tables t CROSS JOIN bench_series s WHERE s.v < {n}"
            )
        )
        state = (
            f"CASE WHEN t.id % 10 = 0 AND s.v >= {n - 5} THEN 'PENDING' "
            f"WHEN t.id % 50 = 1 AND s.v >= {n - 3} THEN 'FAILED' "
            f"WHEN t.id % 100 = 2 AND s.v = {n - 1} THEN 'CONFLICT' "
            f"WHEN t.id % 25 = 3 AND s.v = {n - 1} THEN 'IN_PROGRESS' ELSE 'SUCCESS' END"
        )
        conn.execute(
            text(
                "INSERT INTO dl_mirror_status (table_id, version, artifact, state, attempts, error_class, "
                "last_error, sha256, size_bytes, enqueued_at, started_at, finished_at) "
                f"SELECT t.id, s.v, 'json', {state}, "
                f"CASE WHEN t.id % 50 = 1 AND s.v >= {n - 3} THEN 3 ELSE 1 END, "
                f"CASE WHEN t.id % 50 = 1 AND s.v >= {n - 3} THEN 'TRANSIENT' "
                f"WHEN t.id % 100 = 2 AND s.v = {n - 1} THEN 'CONFLICT' END, "
                f"CASE WHEN t.id % 50 = 1 AND s.v >= {n - 3} THEN 'storage answered 503 SlowDown writing "
                f"_delta_log/' || s.v || '.json' WHEN t.id % 100 = 2 AND s.v = {n - 1} THEN 'a different "
                "file is at the location' END, "
                f"{sha}, 1200 + (s.v * 7 + t.id) % 900, "
                f"{NOW_MS} + (s.v - {n}) * 60000 + t.id, {NOW_MS} + (s.v - {n}) * 60000 + t.id + 500, "
                f"CASE WHEN t.id % 10 = 0 AND s.v >= {n - 5} THEN NULL "
                f"ELSE {NOW_MS} + (s.v - {n}) * 60000 + t.id + 900 END "
                f"FROM dl_tables t CROSS JOIN bench_series s WHERE s.v < {n}"
            )
        )
        conn.execute(
            text(
                "INSERT INTO dl_mirror_status (table_id, version, artifact, state, attempts, sha256, size_bytes, "
                "enqueued_at, started_at, finished_at) "
                f"SELECT t.id, s.v, 'checkpoint', 'SUCCESS', 1, {sha}, 40000 + t.id, "
                f"{NOW_MS} + (s.v - {n}) * 60000, {NOW_MS} + (s.v - {n}) * 60000 + 100, "
                f"{NOW_MS} + (s.v - {n}) * 60000 + 2000 "
                f"FROM dl_tables t CROSS JOIN bench_series s WHERE s.v < {n - 5} AND s.v % 10 = 9"
            )
        )
        conn.execute(
            text(
                "INSERT INTO dl_lag_samples (table_id, sampled_at, lag_seconds, versions_behind) "
                f"SELECT t.id, {NOW_MS} - s.v * 300000, (t.id % 7) * 1.5 + s.v % 5, s.v % 3 "
                "FROM dl_tables t CROSS JOIN bench_series s WHERE s.v < 312"
            )
        )
        conn.execute(
            insert(dl_breakers),
            [
                {
                    "key": "table:t0007",
                    "state": "OPEN",
                    "failures": 5,
                    "opened_at": NOW_MS,
                    "updated_at": NOW_MS,
                }
            ],
        )
        conn.execute(text("DROP TABLE bench_series"))
    if pg:
        with store.engine.execution_options(isolation_level="AUTOCOMMIT").connect() as conn:
            conn.execute(text("VACUUM ANALYZE"))  # what autovacuum does after a bulk load
    counts = {}
    with store.engine.connect() as conn:
        for t in ("dl_tables", "dl_commits", "dl_mirror_status", "dl_lag_samples"):
            counts[t] = int(conn.execute(text(f"SELECT count(*) FROM {t}")).scalar() or 0)
    store.close()
    log(f"fleet_status: filled {url.split('@')[-1]} in {time.monotonic() - started:.1f} s: {counts}")
    return counts


# -- one process: the in-process figures ----------------------------------------------------------


def _timed(fn: Callable[[], Any], engine: Any) -> tuple[float, int]:
    from sqlalchemy import event

    count = 0

    def on_execute(*_args: Any) -> None:
        nonlocal count
        count += 1

    event.listen(engine, "before_cursor_execute", on_execute)
    try:
        started = time.perf_counter()
        fn()
        return time.perf_counter() - started, count
    finally:
        event.remove(engine, "before_cursor_execute", on_execute)


def _ui_pages() -> tuple[Callable[[], None], Callable[[], None], Any]:
    """The "Delta Mirror" overview and a table page (data and HTML) and the engine they read,
    opened once and kept, as the plugin keeps it (``--before`` trees: one ``ui_plugin`` module)."""
    try:
        from delta_mirror.airflow.ui_render import overview_html, table_html
        from delta_mirror.health.pages import PageStores, overview_data, table_data
    except ImportError:  # a tree from before data and HTML were split (issue 29)
        import importlib

        old: Any = importlib.import_module("delta_mirror.airflow.ui_plugin")

        def old_overview() -> None:
            old.overview_html(old.overview_data())

        def old_table_page() -> None:
            old.table_html(old.table_data(f"t{FAILED_TABLE:04d}"))

        old_overview()
        return old_overview, old_table_page, old._store_for(None).engine
    stores = PageStores()

    def overview() -> None:
        overview_html(overview_data(stores))

    def table_page() -> None:
        table_html(table_data(stores, f"t{FAILED_TABLE:04d}"))

    overview()
    return overview, table_page, stores.store(None).engine


def child(url: str) -> dict[str, Any]:
    """The in-process figures with whatever ``delta_mirror`` is on the path (this tree's or ``--before``'s)."""
    from delta_mirror.health import monitoring, status
    from delta_mirror.store import SqlStore

    os.environ["DELTA_MIRROR_STORE"] = url
    os.environ.pop("DELTA_MIRROR_CONFIG", None)
    store = SqlStore(url)
    out: dict[str, Any] = {}

    def fleet() -> None:
        tables = store.list_tables()
        if hasattr(status, "fleet_status"):
            status.fleet_status(store, tables)
        else:
            [status.table_status(store, t) for t in tables]

    def lag_step() -> None:  # the monitor DAG's DeltaMirrorLagOperator.execute, without Airflow's stats
        tables = store.list_tables()
        if hasattr(monitoring, "record_lag_samples"):
            monitoring.record_lag_samples(store, tables)
        else:
            for t in tables:
                monitoring.record_lag_sample(store, t, status=status.table_status(store, t))

    overview, table_page, ui_engine = _ui_pages()
    for key, fn, engine in (
        ("fleet_status", fleet, store.engine),
        ("lag_step", lag_step, store.engine),
        ("overview", overview, ui_engine),
        ("table_page", table_page, ui_engine),
    ):
        seconds, statements = _timed(fn, engine)
        out[f"{key}_s"] = round(seconds, 3)
        out.setdefault("statements", {})[key] = statements
    store.close()
    return out


# -- the runs ---------------------------------------------------------------------------------------


def _env(src: Path | None, cwd: Path, *, bytecode: bool = True) -> dict[str, str]:
    """The children's environment; ``bytecode``: a .pyc cache of their own under ``cwd``."""
    drop = ("DELTA_MIRROR_CONFIG", "DELTA_MIRROR_STORE", "PYTHONDONTWRITEBYTECODE", "PYTHONPYCACHEPREFIX")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    paths = [str(REPO / "tests")] + ([str(src)] if src else [])
    env["PYTHONPATH"] = os.pathsep.join([*paths[::-1], env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    if bytecode:
        env["PYTHONPYCACHEPREFIX"] = str(cwd / ("pycache-before" if src else "pycache"))
    else:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def _run_timed(cmd: list[str], env: dict[str, str], cwd: Path) -> tuple[float, float, Any]:
    """Wall and CPU (user + sys) seconds of one child process, and the process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    seconds = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return seconds, cpu, proc


def _cli_seconds(
    url: str, command: str, src: Path | None, cwd: Path, *, bytecode: bool = True
) -> tuple[float, float]:
    cmd = [sys.executable, "-m", "delta_mirror.cli", command, "--json", "--store", url]
    seconds, cpu, proc = _run_timed(cmd, _env(src, cwd, bytecode=bytecode), cwd)
    if proc.returncode not in (0, 1) or not proc.stdout.strip().startswith(("[", "{")):
        raise RuntimeError(f"{' '.join(cmd[2:5])} failed (exit {proc.returncode}): {proc.stderr[-2000:]}")
    return seconds, cpu


def _startup_seconds(src: Path | None, cwd: Path) -> tuple[float, float]:
    """The floor under every CLI figure: the interpreter starting and importing the CLI and the store."""
    code = "import delta_mirror.cli, delta_mirror.store, delta_mirror.health.monitoring"
    seconds, cpu, proc = _run_timed([sys.executable, "-c", code], _env(src, cwd), cwd)
    if proc.returncode != 0:
        raise RuntimeError(f"importing the CLI failed: {proc.stderr[-2000:]}")
    return seconds, cpu


def phases(url: str) -> dict[str, dict[str, float]]:
    """``status --json``'s steps in one process, timed (wall and CPU, seconds): what
    ``delta-mirror status --json`` runs, in its order, as ``cli.main`` starts it."""
    out: dict[str, dict[str, float]] = {}
    last = (time.perf_counter(), time.process_time())

    def mark(name: str) -> None:
        nonlocal last
        now = (time.perf_counter(), time.process_time())
        out[name] = {"wall_s": round(now[0] - last[0], 4), "cpu_s": round(now[1] - last[1], 4)}
        last = now

    import delta_mirror.cli
    from delta_mirror.cli import common

    mark("import_cli")
    start = getattr(common, "process_start", None)  # a --before checkout may not have it
    with start() if start else contextlib.nullcontext():
        from delta_mirror.store import SqlStore

        mark("import_store")
        store = SqlStore(url)
        mark("engine")
        store.ensure_initialised()
        if hasattr(common, "started"):
            common.started()
        mark("connect")
        from delta_mirror.health.status import fleet_status

        tables = store.list_tables()
        mark("list_tables")
        rows = fleet_status(store, tables)
        mark("fleet_status")
        text = json.dumps([r.to_json() for r in rows], indent=2, default=str)
        mark("json")
    assert text and delta_mirror.cli.cli
    return out


def _phases(url: str, src: Path | None, cwd: Path) -> dict[str, dict[str, float]]:
    wall, cpu, _ = _run_timed([sys.executable, "-c", "pass"], _env(src, cwd), cwd)
    steps: dict[str, dict[str, float]] = _child_json("--phases", url, src, cwd)
    return {"interpreter": {"wall_s": round(wall, 4), "cpu_s": round(cpu, 4)}, **steps}


def _child_json(flag: str, url: str, src: Path | None, cwd: Path) -> Any:
    """This script run again with ``flag`` against ``url``: the JSON on its last line (imports may
    print before it)."""
    proc = subprocess.run(
        [sys.executable, __file__, flag, url],
        cwd=cwd,
        env=_env(src, cwd),
        capture_output=True,
        text=True,
        timeout=1800,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"fleet_status {flag} failed: {proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def measure(url: str, src: Path | None, repeat: int, cwd: Path) -> dict[str, Any]:
    _cli_seconds(url, "health", src, cwd)  # warms the bytecode cache (and the database's)
    uncached = _cli_seconds(url, "status", src, cwd, bytecode=False)
    runs: list[dict[str, Any]] = []
    for _ in range(repeat):
        run: dict[str, Any] = {"loadavg_1m": round(os.getloadavg()[0], 2)}
        for key, (seconds, cpu) in (
            ("cli_startup", _startup_seconds(src, cwd)),
            ("status_json", _cli_seconds(url, "status", src, cwd)),
            ("health_json", _cli_seconds(url, "health", src, cwd)),
        ):
            run[f"{key}_s"], run[f"{key}_cpu_s"] = round(seconds, 3), round(cpu, 3)
        run["status_phases"] = _phases(url, src, cwd)
        run.update(_child_json("--child", url, src, cwd))
        runs.append(run)
    keys = [k for k in runs[0] if k.endswith("_s")]
    steps = runs[0]["status_phases"]
    return {
        **{k: round(statistics.median(r[k] for r in runs), 3) for k in keys},
        "status_json_uncached_s": round(uncached[0], 3),
        "status_json_uncached_cpu_s": round(uncached[1], 3),
        "status_phases": {
            step: {
                m: round(statistics.median(r["status_phases"][step][m] for r in runs), 4)
                for m in ("wall_s", "cpu_s")
            }
            for step in steps
        },
        "statements": runs[-1]["statements"],
        "loadavg_1m": [r["loadavg_1m"] for r in runs],
        "runs": runs,
    }


def figure(opts: Any, log: Callable[[str], None]) -> dict[str, Any]:
    """The figures as one dict; ``opts`` needs only what it sets (``quick``, ``tables``, ``versions``,
    ``repeat``, ``backends``, ``before``, ``before_repeat``): the rest take main()'s defaults."""
    defaults = {
        "quick": False,
        "tables": 1000,
        "versions": 1000,
        "repeat": 3,
        "before": None,
        "before_repeat": 1,
    }
    from support.services import PgServer

    opts = argparse.Namespace(**{**defaults, "backends": ["postgresql", "sqlite"], **vars(opts)})
    opts.repeat = int(opts.repeat) if opts.repeat else 3  # run.py's --repeat 0 means "the default"
    tables, versions = (200, 500) if opts.quick else (opts.tables, opts.versions)
    tmp = Path(tempfile.mkdtemp(prefix="dm-bench-status-"))
    os.environ.setdefault("AIRFLOW_HOME", str(tmp / "airflow"))
    before = Path(opts.before) if opts.before else None
    out: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
        },
        "tables": tables,
        "versions": tables * versions,
        "loadavg_at_start": [round(x, 2) for x in os.getloadavg()],
        "targets": {"status_json_s": 1.0, "overview_s": 1.0},
    }
    server = PgServer.start_new()
    try:
        for backend in opts.backends:
            url = server.create_database() if backend == "postgresql" else f"sqlite:///{tmp / 'store.db'}"
            rows = fill(url, tables, versions, log)
            result: dict[str, Any] = {"rows": rows, "after": measure(url, None, opts.repeat, tmp)}
            log(
                f"fleet_status: {backend} after {json.dumps({k: v for k, v in result['after'].items() if k != 'runs'})}"
            )
            if before:
                result["before"] = measure(url, before, opts.before_repeat, tmp)
                log(
                    f"fleet_status: {backend} before {json.dumps({k: v for k, v in result['before'].items() if k != 'runs'})}"
                )
            out[backend] = result
            if backend == "postgresql":
                server.drop_database(url)
    finally:
        server.stop_and_remove()
        shutil.rmtree(tmp, ignore_errors=True)  # the SQLite store is ~300 MB
    out["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    out["targets_met"] = all(
        out[b]["after"][k] <= limit for b in opts.backends for k, limit in out["targets"].items()
    )
    return out


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="200 tables x 500 versions")
    parser.add_argument("--tables", type=int, default=1000)
    parser.add_argument("--versions", type=int, default=1000, help="versions per table")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--backends", default="postgresql,sqlite")
    parser.add_argument("--before", default=None, help="a directory holding another checkout's delta_mirror/")
    parser.add_argument("--before-repeat", type=int, default=1, help="runs of --before (it is slow)")
    parser.add_argument("--child", default=None, metavar="URL", help=argparse.SUPPRESS)
    parser.add_argument("--phases", default=None, metavar="URL", help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.child:
        print(json.dumps(child(opts.child)))
        return 0
    if opts.phases:
        print(json.dumps(phases(opts.phases)))
        return 0
    opts.backends = opts.backends.split(",")
    print(json.dumps(figure(opts, lambda m: print(m, file=sys.stderr, flush=True)), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
