"""Figure ``spark_writers``: per-commit latency of small Delta-Spark appends, stock vs through the authority.

Two Spark driver processes, one after the other, each with its own JVM (local[2]):

* ``stock``: ``get_spark()`` without the delta-mirror jar: Delta's own LogStore (``HDFSLogStore``
  for ``file:``), commits written straight to ``_delta_log/``;
* ``authority``: ``get_spark(authority=...)``: every commit POSTed to a real ``delta-mirror serve``
  over PostgreSQL (the tests' throwaway server), then ``<v>.json`` written by the LogStore.

Each process creates its table and makes ``WARMUP`` appends (not timed: JIT, first connections),
then ``APPENDS`` appends of one row in one file (``df.coalesce(1).write.mode("append")``); the
latency of each ``save()`` call is measured in the driver. Reported: median and p95 per commit,
and the authority's median as a ratio of stock's and as extra milliseconds.

Standalone: ``PYTHONPATH=tests .venv/bin/python benchmarks/spark_writers.py [--quick]`` (prints JSON).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
APPENDS = (50, 10)  # full, quick
WARMUP = 5
TARGET_RATIO = 1.15
TARGET_EXTRA_MS = 30.0
MARK = "SPARK_WRITERS "


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


def writer(mode: str, location: str, appends: int, url: str | None, root: str | None) -> dict[str, Any]:
    """One driver process: warm-up appends, then ``appends`` timed ones (runs in the child)."""
    from delta_mirror.spark.session import AuthorityConfig, get_spark

    conf = {"spark.databricks.delta.snapshotPartitions": "1", "spark.sql.shuffle.partitions": "1"}
    authority = AuthorityConfig(url=url, roots=(root,)) if mode == "authority" and url and root else None
    t0 = time.perf_counter()
    spark = get_spark(app_name=f"bench-{mode}", authority=authority, **conf)
    start_s = time.perf_counter() - t0
    impl = spark.sparkContext.getConf().get("spark.delta.logStore.file.impl", "delta default")

    def append(i: int) -> float:
        df = spark.createDataFrame([(i, f"u{i}")], "id BIGINT, name STRING")
        started = time.perf_counter()
        df.coalesce(1).write.format("delta").mode("append").save(location)
        return (time.perf_counter() - started) * 1000

    for i in range(WARMUP):
        append(i)
    latencies = [append(WARMUP + i) for i in range(appends)]
    versions = len(list(Path(location.removeprefix("file:"), "_delta_log").glob("*.json")))
    return {
        "logstore": impl,
        "session_start_s": round(start_s, 2),
        "commits": appends,
        "median_ms": round(statistics.median(latencies), 1),
        "p95_ms": round(_percentile(latencies, 0.95), 1),
        "min_ms": round(min(latencies), 1),
        "max_ms": round(max(latencies), 1),
        "versions_in_log": versions,
    }


def _child(
    mode: str, location: str, appends: int, url: str | None, root: str | None, token: str | None
) -> dict[str, Any]:
    env = {**os.environ}
    env.pop("DELTA_MIRROR_COMMIT_URL", None)
    env.pop("DELTA_MIRROR_COMMIT_ROOTS", None)
    if token:
        env["DELTA_MIRROR_COMMIT_TOKEN"] = token
    args = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--child",
        json.dumps([mode, location, appends, url, root]),
    ]
    done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=3600, cwd=REPO)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith(MARK)]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"{mode} writer failed (exit {done.returncode}): {done.stderr[-3000:]}")
    return dict(json.loads(lines[-1][len(MARK) :]))


def measure(store_url: str, tmp: Path, appends: int, log: Callable[[str], None]) -> dict[str, Any]:
    from support.commit_service import commit_service

    from delta_mirror.store import SqlStore

    SqlStore(store_url).init()
    lake = tmp / "lake"
    lake.mkdir(parents=True, exist_ok=True)
    out: dict[str, Any] = {}
    log("spark_writers: stock LogStore")
    out["stock"] = _child("stock", f"file:{lake / 'stock'}", appends, None, None, None)
    with commit_service(store_url, [lake.as_uri()]) as svc:
        log("spark_writers: through the authority")
        out["authority"] = _child(
            "authority", f"file:{lake / 'authority'}", appends, svc.url, f"file:{lake}/", svc.token
        )
    stock, ours = out["stock"]["median_ms"], out["authority"]["median_ms"]
    out["median_ratio"] = round(ours / stock, 3) if stock else None
    out["median_extra_ms"] = round(ours - stock, 1)
    return out


def figure(bench: Any, log: Callable[[str], None]) -> dict[str, Any]:
    """``bench`` from run.py: ``new_db()``, ``tmp``, ``opts``."""
    appends = APPENDS[1] if bench.opts.quick else APPENDS[0]
    out: dict[str, Any] = {
        "method": f"{appends} one-row appends (after {WARMUP} untimed) per Spark driver process, local[2]; "
        "stock = Delta's own LogStore, authority = delta-mirror LogStore + `delta-mirror serve` on "
        "PostgreSQL; latency of each save() in the driver",
    }
    out.update(measure(bench.new_db(), bench.tmp / "spark-writers", appends, log))
    ratio, extra = out["median_ratio"], out["median_extra_ms"]
    out["targets"] = {
        "median_le_1_15x_stock_or_plus_30ms": bool(
            (ratio is not None and ratio <= TARGET_RATIO) or extra <= TARGET_EXTRA_MS
        )
    }
    return out


def _stderr(message: str) -> None:
    sys.stderr.write(message + "\n")


def main() -> int:
    import argparse
    from types import SimpleNamespace

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.child:
        mode, location, appends, url, root = json.loads(opts.child)
        sys.stdout.write(MARK + json.dumps(writer(mode, location, appends, url, root)) + "\n")
        return 0
    from support.services import PgServer

    server = PgServer.from_env_or_start()
    with tempfile.TemporaryDirectory() as tmp:
        bench = SimpleNamespace(opts=opts, tmp=Path(tmp), new_db=server.create_database)
        try:
            result = figure(bench, _stderr)
        finally:
            server.stop_and_remove()
    sys.stdout.write(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
