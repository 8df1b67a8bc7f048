"""delta-mirror benchmarks: our side and a peer measured side by side, in the same run.

Usage (``tests/`` on ``PYTHONPATH`` for the tests' ``support`` package, as ``make bench`` sets it)::

    make bench                                                  # full run
    PYTHONPATH=tests .venv/bin/python benchmarks/run.py --quick    # small sizes, a smoke test
    PYTHONPATH=tests .venv/bin/python benchmarks/run.py --profile  # also profile our pieces (cProfile + RSS sampler)

Prints ONE JSON object on stdout (progress goes to stderr) and writes the same JSON to
``bench-results/latest.json``.

Every measured piece runs in its own fresh Python subprocess, so its peak RSS
(``getrusage(RUSAGE_SELF).ru_maxrss`` at the end of the child) and its wall time belong to that
piece alone. Wall time is taken inside the child around the measured operation (imports and, for
our side, the SQL engine's first connection are excluded; deltalake's table load *is* included
where the figure says so). ``rss_before_mib`` is the child's peak after imports, before the work.

Figures:

1. ``publish``: N versions x 10 ``add`` actions per table (bulk-inserted as ``SqlStore.commit``'s
   rows, not timed), on PostgreSQL and on SQLite; timed as whole processes: ``delta-mirror mirror``
   against ``benchmarks/bare_publish.py`` (the same commit files by a plain put-if-absent + head
   loop, no database), back to back, idle and again beside a CPU burner (a child spinning on one
   core); a table with cadence checkpoints apart; a profile summary (microseconds per version by
   part, main thread and commit-writer thread); ``deltalake`` (``DeltaTable.create`` + one
   ``create_write_transaction`` per version) at a smaller size.
2. ``import_300k`` and ``checkpoint_300k``: import ``kernel-rs/300k-add-files-100-col-partitioned``
   into PostgreSQL (timed), publish its JSON commits (not timed), then time
   ``Publisher(store).checkpoint(name)`` against ``DeltaTable(copy).create_checkpoint()``
   (load included) on a copy of the source.
3. ``long_history``: 5,000 commits of 20 adds + 10 removes generated through ``SqlStore.commit``
   (setup time reported), published (not timed), then the store checkpoint at the latest version
   against deltalake's load + ``create_checkpoint`` on a copy of the published folder.
4. ``spark_checkpoint`` (``benchmarks/spark_checkpoint.py``): the local engine, the Spark engine
   and Delta-Spark's ``DeltaLog.checkpoint()`` on one table at 10k / 100k / 300k / 1M active files
   (``--skip-1m`` or ``DELTA_MIRROR_BENCH_SKIP_1M=1`` stops at 300k), process-tree peak RSS (JVM
   included), and the file count where Spark overtakes the local engine.

5. ``commit_service`` (``benchmarks/commit_service.py``, issue 31): real ``delta-mirror serve``
   processes (1 and 2 workers) under 8 / 16 / 32 keep-alive clients (client processes) on 64
   tables, appends and MERGE-like commits (a remove + an add), on its own fsync-on PostgreSQL and
   on SQLite: commits/s, p50/p99, CPU per commit of the service, database and clients, statements
   per commit, machine load; medians of fixed windows; every version read back and compared.
   ``DELTA_MIRROR_BENCH_CS_{WINDOW,REPEATS,SQLITE_REPEATS,BASE}`` set it (defaults: 6 s windows,
   5 repeats on PostgreSQL, 3 on SQLite, about 13 minutes; ``--quick``: about 1.5 minutes).
6. ``import_log`` (``benchmarks/import_log.py``, run as a child script): ``import_table`` against
   deltalake opening the same log (the 300k-file table and a 5,000-commit history, SQLite and
   PostgreSQL); its JSON is kept whole under ``import_log``.
7. ``spark_writers`` (``benchmarks/spark_writers.py``): per-commit latency (median, p95) of 50
   one-row Delta-Spark appends with Delta's stock LogStore vs through the delta-mirror LogStore and
   ``delta-mirror serve`` on PostgreSQL (target: <= 1.15 x stock, or <= +30 ms median).

8. ``fleet`` (issue 15, three scripts run as children, their JSON kept whole under ``fleet``):
   ``watchers`` (``benchmarks/fleet.py``: the shared watcher against the old per-table poll at 50 /
   500 tables, and the DAG-file build for 1,000 tables), ``airflow`` (``benchmarks/fleet_airflow.py``:
   a real ``airflow standalone`` with N event-driven tables, writers at a fixed rate, commit →
   published latency, CPU per commit, store load, UI and ``status --json`` times; the ``single``
   layout (a ``sync`` run per commit) and ``publish_in: triggerer`` at 100 and 500 tables, 1 and 10
   commits/s, about 45 minutes) and ``status`` (``benchmarks/fleet_status.py``: status,
   health, the lag step and the UI overview at 1,000 tables x 1,000,000 versions). ``--quick`` runs
   each one's quick mode.

9. ``backends`` (``benchmarks/backends.py``, issue 30): publish, import and checkpoint on SQLite,
   PostgreSQL, MySQL/MariaDB and DuckDB side by side, at one size for all four (2,000 versions x 10
   adds; the 300k-file table cut to 100,000 adds; ``--quick``: 200 versions, 10,000 adds).

The PostgreSQL server is the tests' throwaway server (``tests/support/services.py``: fsync off, so the
numbers measure CPU and round trips, not a disk). The corpus is read in place and never written.
"""

from __future__ import annotations

import argparse
import compileall
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import backends
import commit_service
import figures
import pieces
import spark_checkpoint
import spark_writers
from figures import Bench, child, machine_info
from pieces import REPO, RESULTS_DIR, log, run_child

FIGURES = (
    "publish",
    "checkpoint",
    "history",
    "import_log",
    "spark_checkpoint",
    "commit_service",
    "spark_writers",
    "fleet",
    "backends",
)
#: The figures whose ``targets`` make ``all_targets_met`` (keys of the output).
TARGET_FIGURES = ("publish", "checkpoint_300k", "long_history", "commit_service", "spark_writers")


def _parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="small sizes (smoke test)")
    parser.add_argument(
        "--profile", action="store_true", help="also profile our pieces (bench-results/profile-*)"
    )
    parser.add_argument("--repeat", type=int, default=0, help="runs per checkpoint figure (median reported)")
    parser.add_argument(
        "--only",
        default=",".join(FIGURES),
        help="figures to run (comma separated); a partial run updates only its figures in latest.json",
    )
    parser.add_argument(
        "--skip-1m",
        action="store_true",
        help="spark_checkpoint without the 1,000,000-file size (also DELTA_MIRROR_BENCH_SKIP_1M=1)",
    )
    parser.add_argument("--child", nargs=2, metavar=("PIECE", "ARGS_JSON"), help=argparse.SUPPRESS)
    return parser.parse_args()


def main() -> int:
    opts = _parse_args()
    if opts.child:
        run_child(opts.child[0], json.loads(opts.child[1]))
        return 0

    def on_signal(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_signal)
    started = time.perf_counter()
    RESULTS_DIR.mkdir(exist_ok=True)
    # Bytecode for the package, as a wheel install has it: the editable install under
    # PYTHONDONTWRITEBYTECODE never writes any, and every `delta-mirror` process timed below would
    # compile ~40 modules first (~0.1 s of a 5 s publish run).
    compileall.compile_dir(str(REPO / "include" / "delta_mirror"), quiet=1)
    out: dict[str, Any] = {
        "benchmark": "delta-mirror",
        "quick": opts.quick,
        "method": "each piece in a fresh subprocess; seconds = wall time of the measured call inside the "
        "child (medians over `repeat` runs); peak_rss_mib = ru_maxrss of that child (our side excludes the "
        "PostgreSQL server's own memory); rss_before_mib = the child's peak after imports; the store "
        "database is VACUUM ANALYZEd after each setup (not timed)",
    }
    errors = _measure(opts, out)
    targets = collect_targets(out)
    out["targets"] = targets
    out["all_targets_met"] = bool(targets) and all(targets.values()) and not errors
    if errors:
        out["errors"] = errors
    out["total_seconds"] = round(time.perf_counter() - started, 1)
    if "machine" in out:  # other work on the machine skews every figure: say how busy it was
        out["machine"]["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    result_file = RESULTS_DIR / ("quick.json" if opts.quick else "latest.json")
    only = opts.only.split(",")
    if set(only) != set(FIGURES) and result_file.exists():
        out = _merge_previous(json.loads(result_file.read_text()), out, only, errors)
    text = json.dumps(out, indent=2)
    result_file.write_text(text + "\n")
    print(text)
    return 1 if errors else 0


def _measure(opts: argparse.Namespace, out: dict[str, Any]) -> dict[str, str]:
    """Run the figures ``--only`` names into ``out`` around one PostgreSQL server; their errors by figure."""
    from support.services import PgServer  # the tests' throwaway PostgreSQL

    corpus = Path(os.environ.get("DELTA_MIRROR_CORPUS") or REPO.parent / "shared" / "corpus").resolve()
    tmp = Path(tempfile.mkdtemp(prefix="dm-bench-"))
    server = None
    bench = None
    try:
        log("starting PostgreSQL")
        server = PgServer.from_env_or_start()
        out["machine"] = machine_info(server.url)
        out["corpus"] = str(corpus)
        bench = Bench(opts, server, tmp, corpus)
        out["repeat"] = bench.repeat
        errors = _run_figures(bench, out, set(opts.only.split(",")))
        if bench.profiles:
            out["profiles"] = bench.profiles
    finally:
        running = figures.current_child()
        if running is not None and running.poll() is None:
            running.kill()
        if server is not None:
            if not server.owned and bench is not None:
                for url in bench.databases:
                    with contextlib.suppress(Exception):
                        server.drop_database(url)
            log("stopping PostgreSQL")
            server.stop_and_remove()
        shutil.rmtree(tmp, ignore_errors=True)
    return errors


def _run_figures(bench: Bench, out: dict[str, Any], only: set[str]) -> dict[str, str]:
    """Each figure in ``only``, in the order of ``FIGURES``; one failing figure does not stop the others."""

    def run_checkpoint() -> None:
        out["import_300k"], out["checkpoint_300k"] = bench.fig_300k()

    runners: dict[str, Callable[[], None]] = {
        "publish": lambda: out.update(publish=bench.fig_publish()),
        "checkpoint": run_checkpoint,
        "history": lambda: out.update(long_history=bench.fig_history()),
        "spark_checkpoint": lambda: out.update(
            spark_checkpoint=spark_checkpoint.figure(bench, child, log, pieces)
        ),
        "import_log": lambda: out.update(import_log=_import_log(bench)),
        "commit_service": lambda: out.update(commit_service=commit_service.figure(bench, log)),
        "spark_writers": lambda: out.update(spark_writers=spark_writers.figure(bench, log)),
        "fleet": lambda: out.update(fleet=_fleet(bench)),
        "backends": lambda: out.update(backends=backends.figure(bench)),
    }
    errors: dict[str, str] = {}
    for key in (k for k in FIGURES if k in only):
        try:
            runners[key]()
        except KeyboardInterrupt:
            raise
        except Exception as exc:
            log(f"figure {key} failed: {exc}\n{traceback.format_exc()}")
            errors[key] = f"{type(exc).__name__}: {exc}"
    return errors


def _script(
    bench: Bench, script: str, args: list[str], timeout: float = pieces.CHILD_TIMEOUT
) -> dict[str, Any]:
    """``benchmarks/<script>`` run as it is in a child (it prints one JSON object), its JSON kept whole."""
    cmd = [sys.executable, str(REPO / "benchmarks" / script), *args]
    log(f"{script}: " + " ".join(cmd[2:]))
    env = {**os.environ, "DELTA_MIRROR_CORPUS": str(bench.corpus)}
    proc = subprocess.run(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"benchmarks/{script} failed (exit {proc.returncode}); see stderr above")
    # the JSON object is the last thing printed; a library may have printed a line before it
    start = proc.stdout.find("{") if proc.stdout.startswith("{") else proc.stdout.find("\n{") + 1
    if start > 0:
        log(f"{script}: printed before its JSON (ignored): {proc.stdout[:start].strip()[:500]!r}")
    result: dict[str, Any] = json.loads(proc.stdout[start:])
    return result


def _import_log(bench: Bench) -> dict[str, Any]:
    """Import vs deltalake opening the same log (SQLite and PostgreSQL); ``--quick``: a
    200-commit history only."""
    args = ["--repeat", str(bench.repeat)]
    if bench.opts.quick:
        args += ["--only", "history", "--history-commits", "200"]
    return _script(bench, "import_log.py", args)


def _fleet(bench: Bench) -> dict[str, Any]:
    """Issue 15's fleet figures, each its own script: the shared watcher against the old per-table
    poll (``fleet.py``), the whole Airflow stack at N tables (``fleet_airflow.py``), and status /
    health / UI overview at 1,000 tables and 1,000,000 versions (``fleet_status.py``)."""
    quick = ["--quick"] if bench.opts.quick else []
    out: dict[str, Any] = {"watchers": _script(bench, "fleet.py", quick)}
    # the per-commit `sync` run against publishing in the triggerer, at 1 and 10 commits/s; the
    # dag-processor re-parses every 5 minutes (docs/scaling.md, "Fleet knobs")
    airflow = quick or [
        "--sizes", "100,500", "--layouts", "single,triggerer", "--rates", "1,10", "--dag-reparse", "300"
    ]  # fmt: skip
    # eight stacks of up to ~10 minutes each (start, idle window, 180 s of commits, the drain)
    out["airflow"] = _script(bench, "fleet_airflow.py", airflow, timeout=3 * pieces.CHILD_TIMEOUT)
    out["status"] = _script(bench, "fleet_status.py", quick)
    return out


def collect_targets(out: dict[str, Any]) -> dict[str, bool]:
    """Every target of the run, flat: the figures' own, and import_log's per log and store side
    (``import_log.import_300k.ours_postgres.time_le_2x_deltalake``)."""
    targets: dict[str, bool] = {}
    for fig in TARGET_FIGURES:
        for k, v in (out.get(fig) or {}).get("targets", {}).items():
            targets[f"{fig}.{k}"] = v
    for name, figure in (out.get("import_log") or {}).items():
        for side, result in figure.items() if isinstance(figure, dict) else ():
            for k, v in (result.get("targets", {}) if isinstance(result, dict) else {}).items():
                targets[f"import_log.{name}.{side}.{k}"] = v
    return targets


def _merge_previous(
    previous: dict[str, Any], out: dict[str, Any], only: list[str], errors: dict[str, str]
) -> dict[str, Any]:
    """A partial run: keep the figures this run did not measure (each says when it was measured)."""
    merged = {k: v for k, v in previous.items() if k not in out}
    merged.update(out)
    if "machine" in previous:  # the figures kept were measured on the machine as it was then
        merged["machine_for_other_figures"] = previous.get("machine_for_other_figures", previous["machine"])
    # a re-measured figure's old targets go (its target names may have changed)
    kept = {k: v for k, v in previous.get("targets", {}).items() if k.split(".", 1)[0] not in out}
    merged["targets"] = {**kept, **out["targets"]}
    merged["all_targets_met"] = bool(merged["targets"]) and all(merged["targets"].values()) and not errors
    stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    merged.setdefault("measured_at", {})
    for key in only:
        merged["measured_at"][key] = stamp
    return merged


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt as exc:  # cleanup already ran in main's finally
        log(f"interrupted ({exc})")
        sys.exit(130)
