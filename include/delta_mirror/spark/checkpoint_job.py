"""spark-submit entry point of the Spark checkpoint engine.

    spark-submit --packages org.postgresql:postgresql:42.7.14 \\
        .../delta_mirror/spark/checkpoint_job.py --table sales [--version V | --if-due]
    python -m delta_mirror.spark.checkpoint_job --table sales      # same, with get_spark()

The store is ``--store`` or ``DELTA_MIRROR_STORE`` (keep passwords out of the command line: the
Airflow operator passes it in the environment). Object-store credentials come from the ``AWS_*``
environment as everywhere else. The checkpoint is committed by the publisher — put-if-absent,
only after its commit is published, ``_last_checkpoint`` never backwards — under the table's lease.
Prints one JSON line: ``{"table", "version", "engine", "files", "seconds"}`` (``version`` null when
``--if-due`` found nothing due). Exit codes as the CLI's: 1 failure, 3 conflict, 4 data, 5 transient.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

from delta_mirror.errors import ErrorClass, MirrorError

_EXIT = {ErrorClass.CONFLICT: 3, ErrorClass.DATA: 4, ErrorClass.TRANSIENT: 5, ErrorClass.PERMANENT: 1}


def _session(master: str | None) -> Any:
    if "PYSPARK_GATEWAY_PORT" in os.environ:  # launched by spark-submit: its JVM, its --packages
        from pyspark.sql import SparkSession

        builder = SparkSession.builder.appName("delta-mirror-checkpoint")
        builder = builder.config("spark.sql.session.timeZone", "UTC")
        return builder.getOrCreate()
    from delta_mirror.spark.session import get_spark

    return get_spark(master, app_name="delta-mirror-checkpoint")


def run(argv: list[str] | None = None) -> dict[str, Any]:
    from delta_mirror.jobs.publish_lease import SPARK_LEASE_TTL
    from delta_mirror.jobs.publisher import Publisher
    from delta_mirror.table_config import CheckpointEngine

    parser = argparse.ArgumentParser(
        prog="delta_mirror.spark.checkpoint_job", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--table", required=True)
    parser.add_argument("--store", default=None, help="store URL (default: DELTA_MIRROR_STORE)")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--version", type=int, default=None, help="default: the last published version")
    group.add_argument("--if-due", action="store_true", help="only when the checkpoint cadence says so")
    parser.add_argument("--partitions", type=int, default=None, help="parallel JDBC reads")
    parser.add_argument("--staging", default=None, help="staging folder shared by driver and executors")
    parser.add_argument("--master", default=None, help="without spark-submit: the Spark master")
    parser.add_argument(
        "--lease-ttl", type=float, default=SPARK_LEASE_TTL, help="seconds (a big build takes a while)"
    )
    args = parser.parse_args(argv)

    from delta_mirror.spark.checkpoint_engine import SparkCheckpointEngine
    from delta_mirror.store import SqlStore

    started = time.monotonic()
    store = SqlStore(args.store)
    try:
        spark = _session(args.master)
        engine = SparkCheckpointEngine(spark, num_partitions=args.partitions, staging_dir=args.staging)
        publisher = Publisher(store, checkpoint_builder=engine, lease_ttl=args.lease_ttl)
        if args.if_due:
            version = publisher.checkpoint_if_due(args.table)
        else:
            version = publisher.checkpoint(args.table, args.version)
    finally:
        store.close()
    return {
        "table": args.table,
        "version": version,
        "engine": CheckpointEngine.SPARK.value,
        "seconds": round(time.monotonic() - started, 3),
        "timings": {k: round(v, 3) for k, v in engine.timings.items()},
    }


def main(argv: list[str] | None = None) -> int:
    try:
        result = run(argv)
    except MirrorError as exc:
        print(f"error: {exc.message}", file=sys.stderr)  # noqa: T201 - a command-line entry point
        return _EXIT.get(exc.error_class, 1)
    print(json.dumps(result))  # noqa: T201
    return 0


__all__ = ["main", "run"]

if __name__ == "__main__":
    sys.exit(main())
