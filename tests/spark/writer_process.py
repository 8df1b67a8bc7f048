"""A Spark writer in its own process, for the race and crash tests of ``test_spark_writers.py``.

``python writer_process.py SPEC_JSON`` starts its own SparkSession with the authority LogStore
(``AuthorityConfig``; the token comes from ``DELTA_MIRROR_COMMIT_TOKEN``), then runs the spec's
phases in order. Before each phase it touches ``<dir>/<name>.ready`` and waits for
``<dir>/<name>.go``, so that two processes start a phase together. Each phase's outcome is one
line ``RESULT {"phase": ..., "outcomes": [...]}`` on stdout: ``"ok"`` or the name of the Delta
exception that stopped the operation (``ConcurrentAppendException``...).
"""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path
from typing import Any

from delta_mirror.spark.session import AuthorityConfig, get_spark

# A short-lived JVM that writes a few rows: the client compiler only (C2 compiles cost more CPU
# than this run ever gets back), a serial collector and a small heap, one partition. The race
# tests start two of these on a 2-core machine beside the shared session.
LEAN_CONF = {
    "spark.databricks.delta.snapshotPartitions": "1",
    "spark.sql.shuffle.partitions": "1",
    "spark.driver.memory": "512m",
    "spark.driver.extraJavaOptions": "-Duser.timezone=UTC -XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
}

_EXCEPTION = re.compile(r"(\w+(?:Exception|Error))")


def outcome(exc: BaseException) -> str:
    text = str(exc)
    names: list[str] = _EXCEPTION.findall(text)
    for name in names:
        if name.startswith("Concurrent") or name.startswith("ProtocolChanged") or name.startswith("Metadata"):
            return name
    return f"{type(exc).__name__}: {text[:300]}"


def run_op(spark: Any, location: str, op: dict[str, Any]) -> None:
    from delta.tables import DeltaTable

    kind = op["kind"]
    if kind == "append":
        ids = range(op["start"], op["start"] + op.get("rows", 3))
        df = spark.createDataFrame(
            [(i, f"u{i}", "XX") for i in ids], "event_id BIGINT, user STRING, country STRING"
        )
        df.coalesce(1).write.format("delta").mode("append").save(location)
    elif kind == "delete":
        DeltaTable.forPath(spark, location).delete(op["where"])
    elif kind == "update":
        DeltaTable.forPath(spark, location).update(op["where"], {"user": f"'{op['user']}'"})
    else:
        raise ValueError(kind)


def main() -> int:
    spec = json.loads(sys.argv[1])
    sync = Path(spec["sync_dir"])
    conf = dict(LEAN_CONF)
    if spec.get("failpoint"):
        conf["spark.hadoop.delta.mirror.commit.failpoint"] = spec["failpoint"]
    spark = get_spark(
        "local[1]",  # one writer, one operation at a time: the race is between processes
        app_name=f"writer-{spec['name']}",
        authority=AuthorityConfig(url=spec["url"], roots=tuple(spec["roots"])),
        **conf,
    )
    spark.sparkContext.setLogLevel("OFF")
    location = spec["location"]
    for phase in spec["phases"]:
        spark.read.format("delta").load(location).count()  # warm: the snapshot is loaded
        (sync / f"{spec['name']}.{phase['name']}.ready").touch()
        go = sync / f"{phase['name']}.go"
        deadline = time.monotonic() + 600
        while not go.exists():
            if time.monotonic() > deadline:
                raise SystemExit(f"no go for phase {phase['name']}")
            time.sleep(0.02)
        outcomes = []
        for op in phase["ops"]:
            try:
                run_op(spark, location, op)
                outcomes.append("ok")
            except Exception as exc:
                outcomes.append(outcome(exc))
        sys.stdout.write("RESULT " + json.dumps({"phase": phase["name"], "outcomes": outcomes}) + "\n")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
