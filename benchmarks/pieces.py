"""The benchmark's child pieces: each runs in a fresh interpreter (``run.py --child PIECE``) so its
wall time and peak RSS are its own. Also the synthetic workload both sides use and the profiler.
"""

from __future__ import annotations

import cProfile
import io
import json
import os
import pstats
import resource
import sys
import threading
import time
import uuid
from collections.abc import Callable
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
    "publish_versions": (10_000, 200),
    "publish_deltalake_versions": (1000, 100),
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


@piece("publish_setup_bulk")
def p_publish_setup_bulk(a: dict[str, Any]) -> Callable[[], dict[str, Any]]:
    """Like ``publish_setup`` but fast enough for 10,000 versions per table: versions 0 and 1 go
    through ``SqlStore.commit``; 2.. are bulk-inserted 1,000 at a time as the same rows
    ``SqlStore.commit`` writes (canonical lines, ``log_rows.file_rows``, a commitInfo shaped as
    version 1's, a PENDING status row). The commit rules are not re-run: every path is new, and the
    publisher re-checks each stored commit and its SHA-256 anyway."""
    store = _open_store(a["url"], init=True)

    def work() -> dict[str, Any]:
        per_table = []
        for t in a["tables"]:
            t0 = time.perf_counter()
            _bulk_table(store, t, a["versions"], a["adds"])
            per_table.append(time.perf_counter() - t0)
            log(f"  publish setup: table {t['name']}: {a['versions']} versions in {per_table[-1]:.1f}s")
        return {"seconds_per_table": [round(x, 2) for x in per_table]}

    return work


def _bulk_table(store: Any, t: dict[str, Any], versions: int, adds: int) -> None:
    import hashlib

    from sqlalchemy import insert

    from delta_mirror.delta.actions import canonical_line, render_commit
    from delta_mirror.store.log_rows import file_rows
    from delta_mirror.store.schema import PART_COMMIT, dl_actions, dl_commits, dl_files, dl_mirror_status
    from delta_mirror.store.states import Artifact, CommitSource, PublishState

    table = store.create_table(t["name"], t["location"])
    if not t["auto_checkpoint"]:
        store.update_table(table.id, **NO_AUTO_CHECKPOINT)
    store.commit(t["name"], first_commit_actions())
    store.commit(t["name"], [("add", add_body(1, i)) for i in range(adds)])
    info = json.loads(store.commit_lines(table.id, 1, 1)[1][0])["commitInfo"]
    step = 1000
    for lo in range(2, versions, step):
        commits, actions_rows, files, status = [], [], [], []
        for v in range(lo, min(versions, lo + step)):
            ts = int(time.time() * 1000)
            actions = [("commitInfo", {**info, "timestamp": ts, "readVersion": v - 1})]
            actions += [("add", add_body(v, i)) for i in range(adds)]
            lines = [canonical_line(k, b) for k, b in actions]
            data = render_commit(lines)
            commits.append(
                {
                    "table_id": table.id,
                    "version": v,
                    "committed_at": ts,
                    "in_commit_timestamp": None,
                    "action_count": len(lines),
                    "size_bytes": len(data),
                    "sha256": hashlib.sha256(data).hexdigest(),
                    "has_json": True,
                    "source": CommitSource.NATIVE,
                }
            )
            actions_rows += [
                {
                    "table_id": table.id,
                    "version": v,
                    "part": PART_COMMIT,
                    "seq": seq,
                    "action_type": k,
                    "payload": ln,
                }
                for seq, ((k, _), ln) in enumerate(zip(actions, lines, strict=True))
            ]
            files += file_rows(table.id, v, PART_COMMIT, actions)[0]
            status.append(
                {
                    "table_id": table.id,
                    "version": v,
                    "artifact": Artifact.JSON,
                    "state": PublishState.PENDING,
                    "attempts": 0,
                    "enqueued_at": ts,
                }
            )
        with store.engine.begin() as conn:  # seeding the benchmark's rows directly, not a store write path
            for tbl, rows in (
                (dl_commits, commits),
                (dl_actions, actions_rows),
                (dl_files, files),
                (dl_mirror_status, status),
            ):
                conn.execute(insert(tbl), rows)


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


#: (label, function-name matches) for the publish profile summary: cumulative time of the first
#: matching frame, per thread, in microseconds per version.
PROFILE_PARTS: dict[str, list[tuple[str, tuple[str, ...]]]] = {
    "main": [
        ("store reads (commit_rows + commit_lines)", ("reads.py:commit_rows", "reads.py:commit_lines")),
        ("re-check of the stored commit", ("stored_commit.py:check_stored_commit",)),
        ("render", ("actions.py:render_commit",)),
        ("sha256", ("<built-in method _hashlib.openssl_sha256>",)),
        (
            "status updates (mark_started / mark_succeeded)",
            ("mirror_status.py:mark_started", "mirror_status.py:mark_succeeded"),
        ),
        (
            "waiting for the writer (queue full / drain)",
            ("publish_pipeline.py:submit", "publish_pipeline.py:drain"),
        ),
        ("cadence check", ("publisher.py:_checkpoint_due",)),
    ],
    "writer": [
        ("put_if_absent (storage)", ("obstore_store.py:put_if_absent",)),
        ("head read-back (storage)", ("obstore_store.py:head",)),
        ("lease renewal", ("publish_lease.py:keep",)),
    ],
}


@piece("publish_profile")
def p_publish_profile(a: dict[str, Any]) -> Callable[[], dict[str, Any]]:
    """``Publisher.publish`` of the first half of the versions without a profiler, measuring the
    CPU of each thread (load-independent: the main thread, the commit writer, and the rest, which is
    the storage library's I/O threads); then the second half with cProfile on the main thread and on
    the writer's thread (wall time per function: GIL waits and profiler overhead included)."""
    from delta_mirror.jobs import publish_pipeline
    from delta_mirror.jobs.publisher import Publisher

    store = _open_store(a["url"])
    table = store.get_table(a["name"])
    half = (store.latest_version(table.id) or 0) // 2
    writer_prof = cProfile.Profile()
    writer_cpu = [0.0]
    profiling = [False]
    original_run = publish_pipeline.CommitWriter._run

    def instrumented_run(self: Any) -> None:
        c0 = time.thread_time()
        if profiling[0]:
            writer_prof.enable()
        try:
            original_run(self)
        finally:
            writer_prof.disable()
            writer_cpu[0] += time.thread_time() - c0

    publish_pipeline.CommitWriter._run = instrumented_run  # type: ignore[method-assign]

    def work() -> dict[str, Any]:
        r0, c0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.thread_time(), time.perf_counter()
        first = Publisher(store).publish(a["name"], to_version=half)
        wall, main_cpu = time.perf_counter() - t0, time.thread_time() - c0
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        n1 = max(1, len(first.published))
        process_cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
        summary: dict[str, Any] = {
            "unprofiled_versions": n1,
            "unprofiled_wall_us_per_version": round(wall / n1 * 1e6, 1),
            "cpu_us_per_version": {
                "main thread": round(main_cpu / n1 * 1e6, 1),
                "writer thread": round(writer_cpu[0] / n1 * 1e6, 1),
                "storage I/O threads (the rest)": round(
                    (process_cpu - main_cpu - writer_cpu[0]) / n1 * 1e6, 1
                ),
                "process (user + system)": round(process_cpu / n1 * 1e6, 1),
            },
            "loadavg": round(os.getloadavg()[0], 2),
        }
        profiling[0] = True
        main_prof = cProfile.Profile()
        t0 = time.perf_counter()
        main_prof.enable()
        result = Publisher(store).publish(a["name"])
        main_prof.disable()
        wall = time.perf_counter() - t0
        n = max(1, len(result.published) + len(result.already_present))
        summary["versions"] = n
        summary["wall_us_per_version_under_profiler"] = round(wall / n * 1e6, 1)
        for thread, prof in (("main", main_prof), ("writer", writer_prof)):
            stats: dict[Any, Any] = pstats.Stats(prof).stats  # type: ignore[attr-defined]
            parts: dict[str, float] = {}
            for label, names in PROFILE_PARTS[thread]:
                cum = 0.0
                for (file, _line, func), (_cc, _nc, _tt, ct, _callers) in stats.items():
                    key = f"{Path(file).name}:{func}" if file != "~" else func
                    if key in names:
                        cum += ct
                parts[label] = round(cum / n * 1e6, 1)
            total = sum(v[3] for k, v in stats.items() if k[2] in ("_publish_commits", "_run"))
            parts["total (thread's own entry point)"] = round(total / n * 1e6, 1)
            summary[f"{thread}_thread_us_per_version"] = parts
        return {"profile_summary": summary}

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
    import delta_mirror.delta.checkpoint.layouts  # noqa: F401  (imported untimed, as deltalake is)
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
import spark_checkpoint  # noqa: E402

PIECES.update(spark_checkpoint.PIECES)
