"""Figure ``spark_checkpoint``: three checkpoint engines on the same table, side by side.

* ``local``: ``Publisher(store).checkpoint(name, v)`` — the in-process engine (PostgreSQL COPY +
  Arrow), as in the other figures;
* ``spark``: ``Publisher(store, checkpoint_builder=SparkCheckpointEngine(spark)).checkpoint(name, v)``
  — the store read over JDBC in parallel partitions, rows built and written by Spark (local[2]),
  committed by the publisher;
* ``delta_spark``: ``DeltaLog.forTable(spark, copy).checkpoint()`` on a copy of the published log
  truncated at ``v`` (its log replay included: that is how Delta-Spark gets its state).

One table holds every size: ``files_per_version`` adds per version, generated with bulk SQL
(``generate_series``: the payloads are the canonical lines ``SqlStore.commit`` would store, the
``dl_commits`` SHA-256 computed by PostgreSQL), then published (JSON only, not timed). The
checkpoint of version ``v`` covers ``v * files_per_version`` active files, so the sizes are
versions of one table. Every measurement runs in a fresh child process; ``seconds`` is the timed
call (Spark's session start is reported apart as ``session_start_s``, and ``with_start_s`` adds it);
``tree_peak_rss_mib`` is the peak of the summed RSS of the child and its descendants (the JVM),
sampled every 50 ms with psutil from before the session starts to the end.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

SIZES_FULL = [10_000, 100_000, 300_000, 1_000_000]
SIZES_NO_1M = [10_000, 100_000, 300_000]
SIZES_QUICK = [10_000, 50_000]
FILES_PER_VERSION = 10_000
SPARK_CONF = {"spark.driver.memory": "4g"}
SKIP_1M_ENV = "DELTA_MIRROR_BENCH_SKIP_1M"


class TreeRss:
    """Peak of the summed RSS of this process and all its descendants (the JVM of PySpark)."""

    def __init__(self, interval: float = 0.05) -> None:
        import psutil

        self.proc = psutil.Process()
        self.interval = interval
        self.peak = 0.0
        self.peak_children = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        import psutil

        total = children = 0
        try:
            total = self.proc.memory_info().rss
            for c in self.proc.children(recursive=True):
                try:
                    rss = c.memory_info().rss
                except psutil.Error:
                    continue
                children += rss
                total += rss
        except psutil.Error:
            return
        self.peak = max(self.peak, total / 2**20)
        self.peak_children = max(self.peak_children, children / 2**20)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._sample()
            time.sleep(self.interval)

    def stop(self) -> dict[str, float]:
        self._sample()
        self._stop.set()
        self._thread.join()
        return {
            "tree_peak_rss_mib": round(self.peak, 1),
            "children_peak_rss_mib": round(self.peak_children, 1),
        }


# ------------------------------------------------------------------------------------------------
# child pieces (registered into run.py's PIECES)


def p_setup(a: dict[str, Any]) -> Callable[[], dict[str, Any]]:
    """Create the table, generate ``versions`` x ``per_version`` adds with bulk SQL, publish them."""
    from sqlalchemy import text

    from delta_mirror.delta.actions import canonical_line, spark_ordered
    from delta_mirror.delta.protocol import now_ms
    from delta_mirror.jobs.publisher import Publisher
    from delta_mirror.store.sql_store import SqlStore

    store = SqlStore(a["url"])
    store.init()

    def work() -> dict[str, Any]:
        t0 = time.perf_counter()
        name, per, versions = a["name"], a["per_version"], a["versions"]
        table = store.create_table(name, a["location"])
        store.update_table(table.id, checkpoint_interval=2**31 - 1, checkpoint_max_bytes=2**62)
        store.commit(name, a["first_commit"])
        body = {
            "path": "part=@P@/v@V@-@I@-c000.snappy.parquet",
            "partitionValues": {"part": "@P@"},
            "size": 999_999_937,
            "modificationTime": 1_999_999_999_937,
            "dataChange": True,
            "stats": a["stats"],
        }
        template = canonical_line("add", spark_ordered("add", body))
        payload = (
            "replace(replace(replace(replace(replace(:tpl, '@P@', ((v * 31 + i) % 10)::text), "
            "'@V@', lpad(v::text, 6, '0')), '@I@', lpad(i::text, 5, '0')), "
            "'1999999999937', (1700000000000 + v)::text), '999999937', (1000 + i)::text)"
        )
        params = {"t": table.id, "tpl": template, "per": per, "now": now_ms()}
        with store.engine.begin() as conn:
            for start in range(1, versions + 1, 10):  # 10 versions per statement
                end = min(versions, start + 9)
                series = f"FROM generate_series({start}, {end}) AS v, generate_series(0, :per - 1) AS i"
                conn.execute(
                    text(
                        "INSERT INTO dl_actions (table_id, version, part, seq, action_type, payload) "
                        f"SELECT :t, v, 0, i, 'add', {payload} {series}"
                    ),
                    params,
                )
                conn.execute(
                    text(
                        "INSERT INTO dl_files (table_id, path, dv_id, add_version, add_part, add_seq, size, "
                        "partition_values) SELECT :t, 'part=' || ((v * 31 + i) % 10) || '/v' || "
                        "lpad(v::text, 6, '0') || '-' || lpad(i::text, 5, '0') || '-c000.snappy.parquet', "
                        "'', v, 0, i, 1000 + i, '{\"part\":\"' || ((v * 31 + i) % 10) || '\"}' "
                        f"{series}"
                    ),
                    params,
                )
            conn.execute(
                text(
                    "INSERT INTO dl_commits (table_id, version, committed_at, action_count, size_bytes, "
                    "sha256, has_json, source) SELECT :t, version, :now, count(*), "
                    "sum(octet_length(payload) + 1), "
                    "encode(sha256(convert_to(string_agg(payload || E'\\n', '' ORDER BY seq), 'UTF8')), 'hex'), "
                    "true, 'native' FROM dl_actions WHERE table_id = :t AND version >= 1 GROUP BY version"
                ),
                params,
            )
            conn.execute(
                text(
                    "INSERT INTO dl_mirror_status (table_id, version, artifact, state, attempts, enqueued_at) "
                    "SELECT :t, version, 'json', 'PENDING', 0, :now FROM dl_commits "
                    "WHERE table_id = :t AND version >= 1"
                ),
                params,
            )
        generated = time.perf_counter() - t0
        t1 = time.perf_counter()
        result = Publisher(store, cadence_checkpoints=False).publish(name)
        published = time.perf_counter() - t1
        return {
            "generate_seconds": round(generated, 2),
            "publish_seconds": round(published, 2),
            "last_published": result.last_published,
        }

    return work


def p_local(a: dict[str, Any]) -> Callable[[], dict[str, Any]]:
    from delta_mirror.jobs.publisher import Publisher
    from delta_mirror.store.sql_store import SqlStore

    tree = TreeRss()
    store = SqlStore(a["url"])
    store.get_table(a["name"])  # first connection outside the timing

    def work() -> dict[str, Any]:
        Publisher(store, lease_ttl=3600).checkpoint(a["name"], a["version"])
        return tree.stop()

    return work


def _spark(tree: TreeRss) -> tuple[Any, float]:
    from delta_mirror.spark.session import get_spark

    t0 = time.perf_counter()
    spark = get_spark(**SPARK_CONF)  # type: ignore[arg-type]  # **conf: Spark keys, never authority=
    spark.range(1).count()  # the JVM and one task are up
    return spark, time.perf_counter() - t0


def p_spark(a: dict[str, Any]) -> Callable[[], dict[str, Any]]:
    from delta_mirror.jobs.publisher import Publisher
    from delta_mirror.spark.checkpoint_engine import SparkCheckpointEngine
    from delta_mirror.store.sql_store import SqlStore

    tree = TreeRss()
    spark, started = _spark(tree)
    store = SqlStore(a["url"])
    store.get_table(a["name"])
    engine = SparkCheckpointEngine(spark, num_partitions=a.get("partitions"))

    def work() -> dict[str, Any]:
        Publisher(store, checkpoint_builder=engine, lease_ttl=3600).checkpoint(a["name"], a["version"])
        out: dict[str, Any] = tree.stop()
        out["session_start_s"] = round(started, 2)
        out["engine_timings"] = {k: round(v, 2) for k, v in engine.timings.items()}
        return out

    return work


def p_delta_spark(a: dict[str, Any]) -> Callable[[], dict[str, Any]]:
    tree = TreeRss()
    spark, started = _spark(tree)
    jvm = spark._jvm

    def work() -> dict[str, Any]:
        delta_log = jvm.org.apache.spark.sql.delta.DeltaLog.forTable(spark._jsparkSession, a["path"])
        delta_log.checkpoint()
        out: dict[str, Any] = tree.stop()
        out["session_start_s"] = round(started, 2)
        last = json.loads((Path(a["path"]) / "_delta_log" / "_last_checkpoint").read_text())
        out["checkpoint_version"] = last["version"]
        out["num_add_files"] = last.get("numOfAddFiles")
        return out

    return work


PIECES = {
    "sparkcp_setup": p_setup,
    "sparkcp_local": p_local,
    "sparkcp_spark": p_spark,
    "sparkcp_delta_spark": p_delta_spark,
}


# ------------------------------------------------------------------------------------------------
# parent


def _clear_checkpoints(folder: Path) -> None:
    log_dir = folder / "_delta_log"
    for p in [
        *log_dir.glob("*.checkpoint*.parquet"),
        *log_dir.glob(".*.checkpoint*.crc"),
        *log_dir.glob("*.crc"),
    ]:
        p.unlink()
    for p in (log_dir / "_last_checkpoint", log_dir / "._last_checkpoint.crc"):
        if p.exists():
            p.unlink()
    shutil.rmtree(log_dir / "_sidecars", ignore_errors=True)


def _truncated_copy(location: Path, dest: Path, version: int) -> Path:
    (dest / "_delta_log").mkdir(parents=True)
    for v in range(version + 1):
        name = f"{v:020d}.json"
        os.link(location / "_delta_log" / name, dest / "_delta_log" / name)
    return dest


def figure(
    bench: Any, child: Callable[..., dict[str, Any]], log: Callable[[str], None], shared: Any
) -> dict[str, Any]:
    """Run the figure; ``shared`` is the pieces module (first_commit_actions, STATS, vacuum_analyze)."""
    quick = bool(bench.opts.quick)
    skip_1m = bool(os.environ.get(SKIP_1M_ENV)) or getattr(bench.opts, "skip_1m", False)
    sizes = SIZES_QUICK if quick else (SIZES_NO_1M if skip_1m else SIZES_FULL)
    per = 5_000 if quick else FILES_PER_VERSION
    versions = max(sizes) // per
    url = bench.new_db()
    location = bench.tmp / "sparkcp" / "table"
    location.mkdir(parents=True)
    log(f"spark checkpoint: generating {versions} versions x {per} adds in PostgreSQL, publishing")
    setup = child(
        "sparkcp_setup",
        url=url,
        name="big",
        location=str(location),
        per_version=per,
        versions=versions,
        first_commit=[[k, b] for k, b in shared.first_commit_actions()],
        stats=shared.STATS,
    )
    shared.vacuum_analyze(url)
    out: dict[str, Any] = {
        "table": f"one table, {per:,} adds per version (10 partition values, stats), no removes; "
        "checkpoint of version v = v x per-version active files; classic single-file checkpoints",
        "setup": {k: setup[k] for k in ("generate_seconds", "publish_seconds", "last_published")},
        "sizes": {},
    }
    repeat = 1 if quick else int(os.environ.get("DELTA_MIRROR_BENCH_SPARK_REPEAT", "1"))
    for files in sizes:
        version = files // per
        copy = _truncated_copy(location, bench.tmp / "sparkcp" / f"copy-{files}", version)
        row: dict[str, Any] = {"files": files, "version": version}
        for label, piece, args, folder in (
            ("local", "sparkcp_local", {"url": url, "name": "big", "version": version}, location),
            ("spark", "sparkcp_spark", {"url": url, "name": "big", "version": version}, location),
            ("delta_spark", "sparkcp_delta_spark", {"path": str(copy)}, copy),
        ):
            runs = []
            for _ in range(repeat):
                _clear_checkpoints(folder)
                log(f"spark checkpoint: {files:,} files: {label}")
                runs.append(child(piece, **args))
            best = sorted(runs, key=lambda r: r["seconds"])[len(runs) // 2]
            entry = {
                "seconds": best["seconds"],
                "peak_rss_mib": best["peak_rss_mib"],
                "tree_peak_rss_mib": best["tree_peak_rss_mib"],
                "process_seconds": best["process_seconds"],
            }
            for key in ("session_start_s", "engine_timings", "num_add_files"):
                if key in best:
                    entry[key] = best[key]
            if "session_start_s" in best:
                entry["with_start_s"] = round(best["seconds"] + best["session_start_s"], 2)
            if len(runs) > 1:
                entry["runs"] = [r["seconds"] for r in runs]
            row[label] = entry
        _clear_checkpoints(location)
        shutil.rmtree(copy, ignore_errors=True)
        row["spark_vs_local"] = round(row["spark"]["seconds"] / row["local"]["seconds"], 2)
        row["delta_spark_vs_local"] = round(row["delta_spark"]["seconds"] / row["local"]["seconds"], 2)
        out["sizes"][str(files)] = row
        log(
            f"spark checkpoint: {files:,} files: local {row['local']['seconds']:.2f}s, "
            f"spark {row['spark']['seconds']:.2f}s (+{row['spark']['session_start_s']:.1f}s start), "
            f"delta-spark {row['delta_spark']['seconds']:.2f}s"
        )
    out["crossover"] = crossover(out["sizes"])
    return out


def crossover(sizes: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Where the Spark engine overtakes the local one: the first measured size where its call is
    faster, and a least-squares line (seconds = a + b x files) through each engine's points, with
    the file count where the lines cross (None when Spark's slope is not smaller: never on this
    machine). Session start is left out: it is a constant per job, and noisy under load."""
    rows = sorted(sizes.values(), key=lambda r: r["files"])
    measured = next((r["files"] for r in rows if r["spark"]["seconds"] < r["local"]["seconds"]), None)

    def fit(label: str) -> tuple[float, float]:
        xs = [float(r["files"]) for r in rows]
        ys = [float(r[label]["seconds"]) for r in rows]
        mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
        var = sum((x - mx) ** 2 for x in xs)
        slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / var if var else 0.0
        return my - slope * mx, slope

    out: dict[str, Any] = {
        "measured_at_files": measured,
        "largest_measured": rows[-1]["files"] if rows else None,
    }
    if len(rows) >= 2:
        (la, lb), (sa, sb) = fit("local"), fit("spark")
        out["fit_seconds"] = {
            "local": {"intercept": round(la, 2), "per_million_files": round(lb * 1e6, 2)},
            "spark": {"intercept": round(sa, 2), "per_million_files": round(sb * 1e6, 2)},
        }
        out["fit_crossover_files"] = int((sa - la) / (lb - sb)) if lb > sb and sa > la else None
    return out
