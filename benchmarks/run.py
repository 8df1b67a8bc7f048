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

1. ``publish``: N versions x 10 ``add`` actions committed into PostgreSQL (``SqlStore.commit``,
   not timed), then ``Publisher(store).publish(name)`` to a fresh local folder; beside it
   ``bare`` (the same bytes written by a plain put-if-absent + head loop, no database) and
   ``deltalake`` (``DeltaTable.create`` + one ``create_write_transaction`` per version).
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

5. ``commit_service`` (``benchmarks/commit_service.py``): a real ``delta-mirror serve`` under 8
   concurrent HTTP clients committing 1-add commits to 16 tables, on PostgreSQL and SQLite:
   commits/s and p50/p99 latency (targets on PostgreSQL: >= 300 commits/s, p99 <= 100 ms).
6. ``spark_writers`` (``benchmarks/spark_writers.py``): per-commit latency (median, p95) of 50
   one-row Delta-Spark appends with Delta's stock LogStore vs through the delta-mirror LogStore and
   ``delta-mirror serve`` on PostgreSQL (target: <= 1.15 x stock, or <= +30 ms median).

The PostgreSQL server is the tests' throwaway server (``tests/support/services.py``: fsync off, so the
numbers measure CPU and round trips, not a disk). The corpus is read in place and never written.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import hashlib
import io
import json
import os
import platform
import pstats
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
RESULTS_DIR = REPO / "bench-results"
RESULT_MARK = "BENCH_RESULT "
CHILD_TIMEOUT = 3600.0
SOURCE_300K = "kernel-rs/300k-add-files-100-col-partitioned"
NO_AUTO_CHECKPOINT = {"checkpoint_interval": 2**31 - 1, "checkpoint_max_bytes": 2**62}

# Sizes: (full, quick)
SIZES = {
    "publish_versions": (2000, 100),
    "publish_adds": (10, 10),
    "history_commits": (5000, 200),
    "history_adds": (20, 20),
    "history_removes": (10, 10),
    "truncated_300k_adds": (None, 20_000),  # quick: a truncated copy of the 300k table
    "repeat": (3, 1),
}

# The schema every synthetic table uses (ours and deltalake's): id long, value string, part string.
SCHEMA_FIELDS = [("id", "long"), ("value", "string"), ("part", "string")]
PARTITION_BY = ["part"]
TABLE_CONFIG = {"delta.checkpointInterval": "100"}  # same policy on both sides
STATS = '{"numRecords":100,"minValues":{"id":0},"maxValues":{"id":99},"nullCount":{"id":0}}'


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def max_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux


def current_rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


# ================================================================================================
# Synthetic actions (shared by our side and the peers)
# ================================================================================================


def schema_string() -> str:
    fields = [{"name": n, "type": t, "nullable": True, "metadata": {}} for n, t in SCHEMA_FIELDS]
    return json.dumps({"type": "struct", "fields": fields}, separators=(",", ":"))


def first_commit_actions() -> list[tuple[str, dict[str, Any]]]:
    return [
        ("protocol", {"minReaderVersion": 1, "minWriterVersion": 2}),
        (
            "metaData",
            {
                "id": str(uuid.uuid4()),
                "format": {"provider": "parquet", "options": {}},
                "schemaString": schema_string(),
                "partitionColumns": PARTITION_BY,
                "configuration": dict(TABLE_CONFIG),
                "createdTime": int(time.time() * 1000),
            },
        ),
    ]


def add_body(version: int, i: int) -> dict[str, Any]:
    part = str((version * 31 + i) % 10)
    return {
        "path": f"part={part}/v{version:06d}-{i:03d}-c000.snappy.parquet",
        "partitionValues": {"part": part},
        "size": 1000 + i,
        "modificationTime": 1_700_000_000_000 + version,
        "dataChange": True,
        "stats": STATS,
    }


def remove_body(add: dict[str, Any], ts: int) -> dict[str, Any]:
    return {
        "path": add["path"],
        "deletionTimestamp": ts,
        "dataChange": True,
        "extendedFileMetadata": True,
        "partitionValues": add["partitionValues"],
        "size": add["size"],
    }


def pa_schema() -> Any:
    import pyarrow as pa

    types = {"long": pa.int64(), "string": pa.string()}
    return pa.schema([(n, types[t]) for n, t in SCHEMA_FIELDS])


# ================================================================================================
# Child pieces. Each returns (setup_fn -> state, work_fn(state) -> extra dict); run_child times
# only work_fn.
# ================================================================================================

PIECES: dict[str, Callable[[dict[str, Any]], Callable[[], dict[str, Any]]]] = {}


def piece(name: str) -> Callable[[Any], Any]:
    def deco(fn: Any) -> Any:
        PIECES[name] = fn
        return fn

    return deco


def _open_store(url: str, *, init: bool = False) -> Any:
    from delta_mirror.store.sql_store import SqlStore

    store = SqlStore(url)
    if init:
        store.init()
    return store


@piece("publish_setup")
def p_publish_setup(a: dict[str, Any]) -> Callable[[], dict[str, Any]]:
    """Commit the same versions into each table of ``a["tables"]`` ({name, location, auto_checkpoint})."""
    store = _open_store(a["url"], init=True)

    def work() -> dict[str, Any]:
        per_table = []
        for t in a["tables"]:
            t0 = time.perf_counter()
            table = store.create_table(t["name"], t["location"])
            if not t["auto_checkpoint"]:
                store.update_table(table.id, **NO_AUTO_CHECKPOINT)
            store.commit(t["name"], first_commit_actions())
            for v in range(1, a["versions"]):
                store.commit(t["name"], [("add", add_body(v, i)) for i in range(a["adds"])])
            per_table.append(time.perf_counter() - t0)
            log(f"  publish setup: table {t['name']}: {a['versions']} versions in {per_table[-1]:.1f}s")
        return {"seconds_per_table": [round(x, 2) for x in per_table]}

    return work


@piece("history_setup")
def p_history_setup(a: dict[str, Any]) -> Callable[[], dict[str, Any]]:
    from collections import deque

    store = _open_store(a["url"], init=True)

    def work() -> dict[str, Any]:
        store.create_table(a["name"], a["location"])
        active: deque[dict[str, Any]] = deque()
        adds0 = [add_body(0, i) for i in range(a["adds"])]
        store.commit(a["name"], [*first_commit_actions(), *(("add", b) for b in adds0)])
        active.extend(adds0)
        t0 = time.perf_counter()
        for v in range(1, a["commits"]):
            ts = int(time.time() * 1000)
            removes = [remove_body(active.popleft(), ts) for _ in range(a["removes"])]
            adds = [add_body(v, i) for i in range(a["adds"])]
            store.commit(a["name"], [*(("remove", b) for b in removes), *(("add", b) for b in adds)])
            active.extend(adds)
            if v % 500 == 0:
                rate = v / (time.perf_counter() - t0)
                log(f"  history setup: {v}/{a['commits'] - 1} commits ({rate:.0f}/s)")
        table = store.get_table(a["name"])
        latest = store.latest_version(table.id)
        assert latest is not None
        return {
            "latest_version": latest,
            "active_files": store.count_active_files(table.id, latest),
            "expected_active_files": len(active),
        }

    return work


@piece("disable_auto_checkpoint")
def p_disable_auto_checkpoint(a: dict[str, Any]) -> Callable[[], dict[str, Any]]:
    store = _open_store(a["url"])

    def work() -> dict[str, Any]:
        store.update_table(store.get_table(a["name"]).id, **NO_AUTO_CHECKPOINT)
        return {}

    return work


@piece("publish_ours")
def p_publish_ours(a: dict[str, Any]) -> Callable[[], dict[str, Any]]:
    from delta_mirror.jobs.publisher import Publisher

    store = _open_store(a["url"])
    store.get_table(a["name"])  # warm the engine (dialect init, first connection)

    def work() -> dict[str, Any]:
        result = Publisher(store).publish(a["name"])
        return {
            "published": len(result.published),
            "already_present": len(result.already_present),
            "checkpoints": result.checkpoints,
        }

    return work


@piece("import")
def p_import(a: dict[str, Any]) -> Callable[[], dict[str, Any]]:
    from delta_mirror.jobs.importer import import_table

    store = _open_store(a["url"], init=True)
    store.list_tables()

    def work() -> dict[str, Any]:
        res = import_table(store, a["source"], name=a["name"], location=a["location"])
        table = store.get_table(a["name"])
        return {
            "commits": res.commits,
            "end_version": res.end_version,
            "active_files": store.count_active_files(table.id, res.end_version),
        }

    return work


@piece("checkpoint_ours")
def p_checkpoint_ours(a: dict[str, Any]) -> Callable[[], dict[str, Any]]:
    from delta_mirror.jobs.publisher import Publisher

    store = _open_store(a["url"])
    store.get_table(a["name"])  # warm the engine

    def work() -> dict[str, Any]:
        version = Publisher(store).checkpoint(a["name"])
        return {"version": version}

    return work


@piece("publish_bare")
def p_publish_bare(a: dict[str, Any]) -> Callable[[], dict[str, Any]]:
    from delta_mirror.storage import open_store

    src = Path(a["source"]) / "_delta_log"
    files = sorted(p for p in src.iterdir() if p.name.endswith(".json") and p.name[:20].isdigit())
    blobs = [(f"_delta_log/{p.name}", p.read_bytes()) for p in files]  # not timed

    def work() -> dict[str, Any]:
        objects = open_store(a["location"])
        for path, data in blobs:
            objects.put_if_absent(path, data)
            meta = objects.head(path)
            if meta is None or meta.size != len(data):
                raise RuntimeError(f"{path} not durable")
        return {"published": len(blobs), "bytes": sum(len(d) for _, d in blobs)}

    return work


@piece("publish_deltalake")
def p_publish_deltalake(a: dict[str, Any]) -> Callable[[], dict[str, Any]]:
    from deltalake import DeltaTable
    from deltalake.transaction import AddAction, RemoveAction

    schema = pa_schema()
    batches = []  # the same actions as ours, built before timing
    for v in range(1, a["versions"]):
        acts: list[AddAction | RemoveAction] = []
        for i in range(a["adds"]):
            b = add_body(v, i)
            acts.append(
                AddAction(b["path"], b["size"], b["partitionValues"], b["modificationTime"], True, b["stats"])
            )
        batches.append(acts)

    def work() -> dict[str, Any]:
        dt = DeltaTable.create(a["location"], schema, partition_by=PARTITION_BY, configuration=TABLE_CONFIG)
        for acts in batches:
            dt.create_write_transaction(actions=acts, mode="append", schema=schema, partition_by=PARTITION_BY)
            dt.update_incremental()  # without it every commit re-reads the log: quadratic
        return {"version": dt.version()}

    return work


@piece("checkpoint_deltalake")
def p_checkpoint_deltalake(a: dict[str, Any]) -> Callable[[], dict[str, Any]]:
    from deltalake import DeltaTable

    def work() -> dict[str, Any]:
        dt = DeltaTable(a["location"])
        dt.create_checkpoint()
        return {"version": dt.version()}

    return work


@piece("verify_deltalake")
def p_verify_deltalake(a: dict[str, Any]) -> Callable[[], dict[str, Any]]:
    """Open a published folder with deltalake and count its active files (sanity, not timed)."""
    from deltalake import DeltaTable

    def work() -> dict[str, Any]:
        dt = DeltaTable(a["location"])
        adds = dt.get_add_actions(flatten=False)
        return {"version": dt.version(), "active_files": int(adds.num_rows)}

    return work


# ------------------------------------------------------------------------------------------------
# Profiling helpers (used with --profile): cProfile around the work, and an RSS sampler that
# records which delta_mirror function was running when the RSS grew.


class RssSampler:
    def __init__(self, interval: float = 0.005) -> None:
        self.interval = interval
        self.main = threading.main_thread().ident
        self.samples: list[tuple[float, float, str]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _where(self) -> str:
        frame = sys._current_frames().get(self.main or 0)
        ours: list[str] = []
        while frame is not None:
            code = frame.f_code
            if "delta_mirror" in code.co_filename:
                mod = code.co_filename.rsplit("delta_mirror/", 1)[-1]
                ours.append(f"{mod}:{code.co_name}")
            frame = frame.f_back
        return " < ".join(ours[:4]) if ours else "-"

    def _run(self) -> None:
        t0 = time.perf_counter()
        while not self._stop.is_set():
            self.samples.append((time.perf_counter() - t0, current_rss_mib(), self._where()))
            time.sleep(self.interval)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def report(self) -> dict[str, Any]:
        if not self.samples:
            return {}
        growth: dict[str, float] = {}
        busy: dict[str, float] = {}
        prev = self.samples[0][1]
        for _t, rss, where in self.samples:
            growth[where] = growth.get(where, 0.0) + max(0.0, rss - prev)
            busy[where] = busy.get(where, 0.0) + self.interval
            prev = rss
        peak = max(self.samples, key=lambda s: s[1])
        return {
            "rss_start_mib": round(self.samples[0][1], 1),
            "rss_peak_mib": round(peak[1], 1),
            "peak_at_s": round(peak[0], 3),
            "peak_in": peak[2],
            "rss_growth_by_function_mib": {
                k: round(v, 1) for k, v in sorted(growth.items(), key=lambda kv: -kv[1])[:12] if v >= 0.5
            },
            "sampled_time_by_function_s": {
                k: round(v, 3) for k, v in sorted(busy.items(), key=lambda kv: -kv[1])[:12]
            },
            "timeline": [
                (round(t, 3), round(r, 1), w) for t, r, w in self.samples[:: max(1, len(self.samples) // 60)]
            ],
        }


def run_child(name: str, args: dict[str, Any]) -> None:
    work = PIECES[name](args)
    rss_before = max_rss_mib()
    profile_path = args.get("profile")
    extra: dict[str, Any]
    if profile_path:
        prof = cProfile.Profile()
        with RssSampler() as sampler:
            t0 = time.perf_counter()
            prof.enable()
            extra = work()
            prof.disable()
            seconds = time.perf_counter() - t0
        out = io.StringIO()
        stats = pstats.Stats(prof, stream=out)
        stats.sort_stats("cumulative").print_stats(45)
        stats.sort_stats("tottime").print_stats(30)
        Path(profile_path).write_text(out.getvalue())
        prof.dump_stats(str(profile_path) + ".pstats")
        extra["memory_profile"] = sampler.report()
        extra["pyarrow_max_memory_mib"] = _pyarrow_max_memory()
    else:
        t0 = time.perf_counter()
        extra = work()
        seconds = time.perf_counter() - t0
    result = {
        "seconds": round(seconds, 4),
        "peak_rss_mib": round(max_rss_mib(), 1),
        "rss_before_mib": round(rss_before, 1),
    }
    result.update(extra)
    print(RESULT_MARK + json.dumps(result), flush=True)


def _pyarrow_max_memory() -> float | None:
    if "pyarrow" not in sys.modules:
        return None
    import pyarrow as pa

    mib: float = pa.default_memory_pool().max_memory() / 2**20
    return round(mib, 1)


# The Spark checkpoint figure's pieces live beside this file (benchmarks/ is on sys.path as the
# script's folder, in the parent and in every child).
import commit_service  # noqa: E402
import spark_checkpoint  # noqa: E402
import spark_writers  # noqa: E402

PIECES.update(spark_checkpoint.PIECES)


# ================================================================================================
# Parent: orchestration
# ================================================================================================

_current_child: subprocess.Popen[str] | None = None


def child(piece_name: str, /, **args: Any) -> dict[str, Any]:
    """Run one piece in a fresh interpreter; return its measurements."""
    global _current_child
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", piece_name, json.dumps(args)]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, cwd=REPO)
    _current_child = proc
    try:
        stdout, _ = proc.communicate(timeout=CHILD_TIMEOUT)
    finally:
        _current_child = None
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if proc.returncode != 0:
        raise RuntimeError(f"piece {piece_name} failed (exit {proc.returncode}); see stderr above")
    lines = [ln for ln in stdout.splitlines() if ln.startswith(RESULT_MARK)]
    if not lines:
        raise RuntimeError(f"piece {piece_name} printed no result")
    result: dict[str, Any] = json.loads(lines[-1][len(RESULT_MARK) :])
    result["process_seconds"] = round(time.perf_counter() - t0, 3)
    return result


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Median wall and median peak RSS over repeats, with every run kept."""
    out = {
        "seconds": round(statistics.median(r["seconds"] for r in runs), 4),
        "peak_rss_mib": round(statistics.median(r["peak_rss_mib"] for r in runs), 1),
        "rss_before_mib": round(statistics.median(r["rss_before_mib"] for r in runs), 1),
    }
    if len(runs) > 1:
        out["runs"] = [{"seconds": r["seconds"], "peak_rss_mib": r["peak_rss_mib"]} for r in runs]
    return out


def ratio(a: float, b: float) -> float | None:
    return round(a / b, 3) if b else None


def vacuum_analyze(url: str) -> None:
    """VACUUM ANALYZE the store database after a setup (not timed).

    Without it the timed pieces race autovacuum (and first-read hint-bit writes) over the rows
    the setup just inserted: on a 2-core machine that is noise, not the cost of our code.
    """
    import psycopg
    from sqlalchemy.engine import make_url

    conninfo = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE")


def remove_checkpoint(folder: Path, version: int) -> None:
    log_dir = folder / "_delta_log"
    for p in log_dir.glob(f"{version:020d}.checkpoint*.parquet"):
        p.unlink()
    with contextlib.suppress(FileNotFoundError):
        (log_dir / "_last_checkpoint").unlink()


class Bench:
    def __init__(self, opts: argparse.Namespace, server: Any, tmp: Path, corpus: Path) -> None:
        self.opts = opts
        self.server = server
        self.tmp = tmp
        self.corpus = corpus
        self.idx = 1 if opts.quick else 0
        default_repeat = SIZES["repeat"][self.idx]
        assert default_repeat is not None
        self.repeat: int = opts.repeat or default_repeat
        self.databases: list[str] = []
        self.profiles: dict[str, Any] = {}

    def size(self, key: str) -> Any:
        return SIZES[key][self.idx]

    def new_db(self) -> str:
        url: str = self.server.create_database("dm_bench_")
        self.databases.append(url)
        return url

    def profile(
        self, label: str, piece_name: str, before: Callable[[], None] | None = None, **args: Any
    ) -> None:
        """Re-run one of our pieces under cProfile + the RSS sampler (not used for the figures)."""
        if not self.opts.profile:
            return
        if before:
            before()
        path = RESULTS_DIR / f"profile-{label}.txt"
        log(f"profiling {label} -> {path}")
        res = child(piece_name, **args, profile=str(path))
        self.profiles[label] = {
            "profile_file": str(path.relative_to(REPO)),
            "seconds_under_profiler": res["seconds"],
            "peak_rss_mib": res["peak_rss_mib"],
            "pyarrow_max_memory_mib": res.get("pyarrow_max_memory_mib"),
            "memory": res.get("memory_profile"),
        }

    # -- figure 1 ---------------------------------------------------------------------------------
    def fig_publish(self) -> dict[str, Any]:
        versions = self.size("publish_versions") + 1  # + version 0 (protocol + metaData)
        adds = self.size("publish_adds")
        url = self.new_db()
        root = self.tmp / "publish"
        reps = range(self.repeat)
        # "default": the table's own checkpoint policy (delta.checkpointInterval=100, as deltalake's);
        # "json": automatic checkpoints off, so only the JSON commits are published (what bare does).
        tables = [
            {
                "name": f"{kind}-{r}",
                "location": str(root / f"{kind}-{r}"),
                "auto_checkpoint": kind == "default",
            }
            for r in reps
            for kind in ("default", "json")
        ]
        if self.opts.profile:
            tables.append({"name": "profile", "location": str(root / "profile"), "auto_checkpoint": True})
        log(
            f"publish: committing {versions} versions x {adds} adds into {len(tables)} tables (setup, not timed)"
        )
        setup = child("publish_setup", url=url, tables=tables, versions=versions, adds=adds)
        vacuum_analyze(url)
        default_runs, json_runs, bare_runs = [], [], []
        for r in reps:
            default_runs.append(child("publish_ours", url=url, name=f"default-{r}"))
            json_runs.append(child("publish_ours", url=url, name=f"json-{r}"))
            bare_runs.append(
                child("publish_bare", source=str(root / f"json-{r}"), location=str(root / f"bare-{r}"))
            )
            log(
                f"publish run {r + 1}/{self.repeat}: ours {default_runs[-1]['seconds']:.3f}s, "
                f"ours json-only {json_runs[-1]['seconds']:.3f}s, bare {bare_runs[-1]['seconds']:.3f}s"
            )
        log(f"publish: deltalake, {versions} versions (one run: it takes minutes)")
        dl = child("publish_deltalake", location=str(root / "deltalake"), versions=versions, adds=adds)
        log(f"publish: deltalake {dl['seconds']:.2f}s")
        self.profile("publish", "publish_ours", url=url, name="profile")

        def fig(runs: list[dict[str, Any]], n: int) -> dict[str, Any]:
            out = summarize(runs)
            return {"versions": n, "versions_per_s": round(n / out["seconds"], 1), **out}

        n = versions
        o, j, b, d = fig(default_runs, n), fig(json_runs, n), fig(bare_runs, n), fig([dl], dl["version"] + 1)
        o["checkpoints_written"] = default_runs[0]["checkpoints"]
        j["checkpoints_written"] = json_runs[0]["checkpoints"]
        return {
            "versions": versions,
            "adds_per_version": adds,
            "setup_seconds_per_table": setup["seconds_per_table"],
            "setup_commits_per_s": round(versions / statistics.median(setup["seconds_per_table"]), 1),
            "ours": o,
            "ours_json_only": j,
            "bare": b,
            "deltalake": d,
            "notes": "ours = Publisher.publish with the table's checkpoint policy (interval 100, checked per "
            "500-version batch); ours_json_only = same with automatic checkpoints off (the bytes bare writes); "
            "bare = put_if_absent + head per file, no database; deltalake = DeltaTable.create + one "
            "create_write_transaction per version + update_incremental(), post-commit hooks at defaults "
            "(checkpoint every 100 versions), one run",
            "bare_bytes": bare_runs[0]["bytes"],
            "ratio_vs_bare": ratio(o["versions_per_s"], b["versions_per_s"]),
            "json_only_ratio_vs_bare": ratio(j["versions_per_s"], b["versions_per_s"]),
            "speedup_vs_deltalake": ratio(o["versions_per_s"], d["versions_per_s"]),
            "targets": {
                "json_only_ge_0.5x_bare": j["versions_per_s"] >= 0.5 * b["versions_per_s"],
                "with_checkpoints_ge_0.5x_bare": o["versions_per_s"] >= 0.5 * b["versions_per_s"],
                "faster_than_deltalake": o["versions_per_s"] > d["versions_per_s"],
            },
        }

    # -- figure 2 ---------------------------------------------------------------------------------
    def source_300k(self) -> tuple[Path, bool]:
        src = self.corpus / SOURCE_300K
        if not (src / "_delta_log").is_dir():
            raise FileNotFoundError(f"corpus table missing: {src}")
        keep = self.size("truncated_300k_adds")
        if keep is None:
            return src, False
        # --quick: a copy with the same shape (every commit keeps its share of the adds).
        dst = self.tmp / "src-300k-truncated"
        (dst / "_delta_log").mkdir(parents=True)
        files = sorted((src / "_delta_log").glob("*.json"))
        total = sum(sum(1 for ln in f.open() if ln.startswith('{"add"')) for f in files)
        for f in files:
            n_adds = sum(1 for ln in f.open() if ln.startswith('{"add"'))
            left = round(n_adds * keep / total)
            with f.open() as fin, (dst / "_delta_log" / f.name).open("w") as fout:
                for line in fin:
                    is_add = line.startswith('{"add"')
                    if not is_add or left > 0:
                        fout.write(line)
                        left -= is_add
        return dst, True

    def fig_300k(self) -> tuple[dict[str, Any], dict[str, Any]]:
        src, truncated = self.source_300k()
        url = self.new_db()
        root = self.tmp / "cp300k"
        pub = root / "published"
        log(f"import: {src} -> PostgreSQL (timed)")
        imp = child("import", url=url, name="t300k", source=str(src), location=str(pub))
        log(f"import: {imp['seconds']:.2f}s, {imp['peak_rss_mib']:.0f} MiB; publishing JSON (not timed)")
        child("disable_auto_checkpoint", url=url, name="t300k")
        pub_res = child("publish_ours", url=url, name="t300k")
        vacuum_analyze(url)
        version = imp["end_version"]
        import_fig = {
            "source": str(src),
            "truncated_for_quick": truncated,
            "commits": imp["commits"],
            "active_files": imp["active_files"],
            "seconds": imp["seconds"],
            "peak_rss_mib": imp["peak_rss_mib"],
            "rss_before_mib": imp["rss_before_mib"],
            "files_per_s": round(imp["active_files"] / imp["seconds"], 1),
            "publish_json_seconds_not_in_checkpoint_figure": pub_res["seconds"],
        }
        ours_runs, dl_runs = [], []
        for r in range(self.repeat):
            remove_checkpoint(pub, version)
            log(f"checkpoint 300k: ours run {r + 1}/{self.repeat}")
            ours_runs.append(child("checkpoint_ours", url=url, name="t300k"))
            copy = root / f"dl-copy-{r}"
            shutil.copytree(src, copy)
            log(f"checkpoint 300k: deltalake run {r + 1}/{self.repeat}")
            dl_runs.append(child("checkpoint_deltalake", location=str(copy)))
            shutil.rmtree(copy, ignore_errors=True)
        verify = child("verify_deltalake", location=str(pub))
        self.profile(
            "checkpoint_300k",
            "checkpoint_ours",
            lambda: remove_checkpoint(pub, version),
            url=url,
            name="t300k",
        )
        o, d = summarize(ours_runs), summarize(dl_runs)
        cp_file = pub / "_delta_log" / f"{version:020d}.checkpoint.parquet"
        fig = {
            "version": version,
            "active_files": imp["active_files"],
            "ours": o,
            "deltalake": d,
            "ours_checkpoint_bytes": cp_file.stat().st_size if cp_file.exists() else None,
            "verified_by_deltalake": {
                "active_files": verify["active_files"],
                "matches": verify["active_files"] == imp["active_files"] and verify["version"] == version,
            },
            "time_ratio_vs_deltalake": ratio(o["seconds"], d["seconds"]),
            "rss_ratio_vs_deltalake": ratio(o["peak_rss_mib"], d["peak_rss_mib"]),
            "targets": {
                "time_le_1.0x_deltalake": o["seconds"] <= d["seconds"],
                "rss_le_1.0x_deltalake": o["peak_rss_mib"] <= d["peak_rss_mib"],
            },
        }
        return import_fig, fig

    # -- figure 3 ---------------------------------------------------------------------------------
    def fig_history(self) -> dict[str, Any]:
        commits = self.size("history_commits")
        adds, removes = self.size("history_adds"), self.size("history_removes")
        url = self.new_db()
        root = self.tmp / "history"
        pub = root / "published"
        log(
            f"history: generating {commits} commits ({adds} adds + {removes} removes) through SqlStore.commit"
        )
        setup = child(
            "history_setup",
            url=url,
            name="hist",
            location=str(pub),
            commits=commits,
            adds=adds,
            removes=removes,
        )
        log(f"history: setup {setup['seconds']:.1f}s; publishing (not timed)")
        child("disable_auto_checkpoint", url=url, name="hist")
        pub_res = child("publish_ours", url=url, name="hist")
        vacuum_analyze(url)
        version = setup["latest_version"]
        pristine = root / "published-pristine"  # a copy without any checkpoint, for deltalake
        shutil.copytree(pub, pristine)
        ours_runs, dl_runs = [], []
        for r in range(self.repeat):
            remove_checkpoint(pub, version)
            log(f"history: ours checkpoint run {r + 1}/{self.repeat}")
            ours_runs.append(child("checkpoint_ours", url=url, name="hist"))
            copy = root / f"dl-copy-{r}"
            shutil.copytree(pristine, copy)
            log(f"history: deltalake checkpoint run {r + 1}/{self.repeat}")
            dl_runs.append(child("checkpoint_deltalake", location=str(copy)))
            shutil.rmtree(copy, ignore_errors=True)
        verify = child("verify_deltalake", location=str(pub))
        self.profile(
            "checkpoint_history",
            "checkpoint_ours",
            lambda: remove_checkpoint(pub, version),
            url=url,
            name="hist",
        )
        o, d = summarize(ours_runs), summarize(dl_runs)
        speedup = ratio(d["seconds"], o["seconds"])
        return {
            "commits": commits,
            "adds_per_commit": adds,
            "removes_per_commit": removes,
            "version": version,
            "active_files": setup["active_files"],
            "setup_seconds": setup["seconds"],
            "setup_commits_per_s": round(commits / setup["seconds"], 1),
            "setup_over_3_min": setup["seconds"] > 180,
            "publish_json_seconds_not_in_checkpoint_figure": pub_res["seconds"],
            "ours": o,
            "deltalake": d,
            "verified_by_deltalake": {
                "active_files": verify["active_files"],
                "matches": verify["active_files"] == setup["active_files"] and verify["version"] == version,
            },
            "speedup_vs_deltalake": speedup,
            "rss_ratio_vs_deltalake": ratio(o["peak_rss_mib"], d["peak_rss_mib"]),
            "targets": {"ge_2x_faster_than_deltalake": speedup is not None and speedup >= 2.0},
        }


# ================================================================================================
# Machine info and main
# ================================================================================================


def machine_info(pg_url: str) -> dict[str, Any]:
    from importlib import metadata

    def version(pkg: str) -> str | None:
        try:
            return metadata.version(pkg)
        except metadata.PackageNotFoundError:
            return None

    meminfo = {}
    with contextlib.suppress(OSError), open("/proc/meminfo") as f:
        for line in f:
            k, v = line.split(":", 1)
            meminfo[k] = int(v.split()[0])
    cpu = None
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), None)
    pg_version = None
    with contextlib.suppress(Exception):
        import sqlalchemy as sa

        engine = sa.create_engine(pg_url)
        with engine.connect() as conn:
            pg_version = str(conn.execute(sa.text("select version()")).scalar_one())
        engine.dispose()
    git = None
    with contextlib.suppress(Exception):
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
        )
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=REPO, capture_output=True, text=True)
        git = head.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    digest = hashlib.sha256()
    for source in sorted((REPO / "include" / "delta_mirror").rglob("*.py")):
        digest.update(str(source.relative_to(REPO)).encode() + b"\0" + source.read_bytes())
    return {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "hostname": platform.node(),
        "nproc": os.cpu_count(),
        "nproc_available": len(os.sched_getaffinity(0)),
        "loadavg_at_start": [round(x, 2) for x in os.getloadavg()],
        "cpu": cpu,
        "memory_total_mib": round(meminfo.get("MemTotal", 0) / 1024),
        "memory_available_mib": round(meminfo.get("MemAvailable", 0) / 1024),
        "os": platform.platform(),
        "python": platform.python_version(),
        "versions": {
            p: version(p)
            for p in ("delta-mirror", "deltalake", "pyarrow", "sqlalchemy", "psycopg", "obstore")
        },
        "postgresql": pg_version,
        "postgresql_settings": "throwaway server from tests/support/services.py (fsync=off, full_page_writes=off)",
        "git": git,
        "delta_mirror_source_sha256": digest.hexdigest()[:16],
    }


FIGURES = ("publish", "checkpoint", "history", "spark_checkpoint", "commit_service", "spark_writers")
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
    out: dict[str, Any] = {
        "benchmark": "delta-mirror",
        "quick": opts.quick,
        "method": "each piece in a fresh subprocess; seconds = wall time of the measured call inside the "
        "child (medians over `repeat` runs); peak_rss_mib = ru_maxrss of that child (our side excludes the "
        "PostgreSQL server's own memory); rss_before_mib = the child's peak after imports; the store "
        "database is VACUUM ANALYZEd after each setup (not timed)",
    }
    errors = _measure(opts, out)
    targets: dict[str, bool] = {}
    for fig in TARGET_FIGURES:
        for k, v in (out.get(fig) or {}).get("targets", {}).items():
            targets[f"{fig}.{k}"] = v
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
        if _current_child is not None and _current_child.poll() is None:
            _current_child.kill()
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
            spark_checkpoint=spark_checkpoint.figure(bench, child, log, sys.modules[__name__])
        ),
        "commit_service": lambda: out.update(commit_service=commit_service.figure(bench, log)),
        "spark_writers": lambda: out.update(spark_writers=spark_writers.figure(bench, log)),
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


def _merge_previous(
    previous: dict[str, Any], out: dict[str, Any], only: list[str], errors: dict[str, str]
) -> dict[str, Any]:
    """A partial run: keep the figures this run did not measure (each says when it was measured)."""
    merged = {k: v for k, v in previous.items() if k not in out}
    merged.update(out)
    if "machine" in previous:  # the figures kept were measured on the machine as it was then
        merged["machine_for_other_figures"] = previous.get("machine_for_other_figures", previous["machine"])
    merged["targets"] = {**previous.get("targets", {}), **out["targets"]}
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
