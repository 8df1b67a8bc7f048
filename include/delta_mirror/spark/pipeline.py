"""Example data pipeline as an ordinary Delta-Spark job: create, append, MERGE upsert, DELETE, OPTIMIZE.

Nothing here knows about delta-mirror. Every commit the job makes goes through the session's
``LogStore``; with the SQL-authority LogStore configured (``spark.session.AuthorityConfig``) each
step becomes one version in the store, committed with Spark's exact bytes, and the mirror
publishes nothing new: ``<v>.json`` is already there, identical to the stored commit. Without it
the same job writes a plain Delta table. (``spark.ingest`` is the other path into the store: no
JVM LogStore, one commit per ingest.)

Steps, each one Delta commit (a step with nothing to do commits nothing):

1. ``create`` - ``CREATE TABLE IF NOT EXISTS`` at the location (deletion vectors on by default);
2. ``append`` - the source rows; with ``app_id``/``run_version`` the write carries Delta's
   idempotent-write options ``txnAppId``/``txnVersion``, so a retried run does not append twice;
3. ``merge`` - an upsert of corrections (``amount`` + 1 for every fourth ``event_id``);
4. ``delete`` - rows matching ``delete_where``;
5. ``optimize`` - bin-packing compaction of the small files the steps above wrote.

Run it under ``spark-submit`` (the authority's ``--jars``/``--conf`` flags are in
docs/writing-from-spark.md) or as ``python -m delta_mirror.spark.pipeline --location L --source S``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

SAMPLE_SCHEMA = "event_id BIGINT, user STRING, country STRING, ts TIMESTAMP, amount DECIMAL(12,2), day DATE"
DEFAULT_DELETE_WHERE = "amount < 50"
STEPS = ("create", "append", "merge", "delete", "optimize")


@dataclass
class PipelineResult:
    """The table version each step committed (``None``: the step had nothing to commit)."""

    location: str
    versions: dict[str, int | None] = field(default_factory=dict)
    rows: int = 0

    @property
    def first_version(self) -> int | None:
        done = [v for v in self.versions.values() if v is not None]
        return min(done) if done else None

    @property
    def last_version(self) -> int | None:
        done = [v for v in self.versions.values() if v is not None]
        return max(done) if done else None

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "first_version": self.first_version, "last_version": self.last_version}


def _latest_version(spark: Any, location: str) -> int | None:
    from delta.tables import DeltaTable

    if not DeltaTable.isDeltaTable(spark, location):
        return None
    row = DeltaTable.forPath(spark, location).history(1).select("version").first()
    return None if row is None else int(row[0])


def run_pipeline(
    spark: Any,
    location: str,
    source: str,
    *,
    source_format: str = "csv",
    schema: str | None = SAMPLE_SCHEMA,
    partition_by: Sequence[str] = ("country",),
    delete_where: str = DEFAULT_DELETE_WHERE,
    deletion_vectors: bool = True,
    app_id: str | None = None,
    run_version: int | None = None,
    steps: Sequence[str] = STEPS,
) -> PipelineResult:
    """Run the steps in order on the table at ``location``; returns the version of each step."""
    from delta_mirror.spark.ingest import read_source

    unknown = [s for s in steps if s not in STEPS]
    if unknown:
        raise ValueError(f"unknown pipeline step(s) {unknown}; choose from {list(STEPS)}")
    result = PipelineResult(location=location)
    run = _Steps(
        spark,
        location,
        read_source(spark, source, source_format, schema=schema),
        partition_by=partition_by,
        delete_where=delete_where,
        deletion_vectors=deletion_vectors,
        txn=(app_id, run_version) if app_id is not None and run_version is not None else None,
    )
    for name in STEPS:
        if name not in steps:
            continue
        before = _latest_version(spark, location)
        getattr(run, name)()
        after = _latest_version(spark, location)
        result.versions[name] = after if after != before else None
    result.rows = spark.read.format("delta").load(location).count()
    return result


@dataclass
class _Steps:
    """The pipeline's steps, each one ordinary Delta-Spark operation (a method per name in STEPS)."""

    spark: Any
    location: str
    rows: Any
    partition_by: Sequence[str]
    delete_where: str
    deletion_vectors: bool
    txn: tuple[str, int] | None

    def create(self) -> None:
        from delta.tables import DeltaTable

        builder = (
            DeltaTable.createIfNotExists(self.spark).location(self.location).addColumns(self.rows.schema)
        )
        if self.partition_by:
            builder = builder.partitionedBy(*self.partition_by)
        if self.deletion_vectors:
            builder = builder.property("delta.enableDeletionVectors", "true")
        builder.execute()

    def append(self) -> None:
        writer = self.rows.write.format("delta").mode("append")
        if self.txn is not None:
            writer = writer.option("txnAppId", self.txn[0]).option("txnVersion", str(self.txn[1]))
        writer.save(self.location)

    def merge(self) -> None:
        from delta.tables import DeltaTable
        from pyspark.sql import functions as F

        amount = self.rows.schema["amount"].dataType
        corrections = self.rows.where(F.col("event_id") % 4 == 0).withColumn(
            "amount", (F.col("amount") + 1).cast(amount)
        )
        (
            DeltaTable.forPath(self.spark, self.location)
            .alias("t")
            .merge(corrections.alias("s"), "t.event_id = s.event_id")
            .whenMatchedUpdateAll()
            .whenNotMatchedInsertAll()
            .execute()
        )

    def delete(self) -> None:
        from delta.tables import DeltaTable

        DeltaTable.forPath(self.spark, self.location).delete(self.delete_where)

    def optimize(self) -> None:
        from delta.tables import DeltaTable

        DeltaTable.forPath(self.spark, self.location).optimize().executeCompaction()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m delta_mirror.spark.pipeline",
        description="Example Delta-Spark job: create, append, MERGE, DELETE, OPTIMIZE a table.",
    )
    parser.add_argument("--location", required=True, help="table root (file path, s3a://...)")
    parser.add_argument("--source", required=True, help="source file, folder or glob")
    parser.add_argument("--format", default="csv", choices=["csv", "parquet", "json"])
    parser.add_argument("--schema", default=SAMPLE_SCHEMA, help="source schema as DDL ('' to infer)")
    parser.add_argument("--partition-by", default="country", help="comma-separated, for a new table")
    parser.add_argument("--delete-where", default=DEFAULT_DELETE_WHERE)
    parser.add_argument("--steps", default=",".join(STEPS))
    parser.add_argument("--app-id", default=None, help="txnAppId for an idempotent append")
    parser.add_argument("--run-version", type=int, default=None, help="txnVersion for the append")
    parser.add_argument("--master", default=None)
    args = parser.parse_args(argv)

    from delta_mirror.spark.session import get_spark

    spark = get_spark(args.master, app_name="delta-mirror-pipeline")
    result = run_pipeline(
        spark,
        args.location,
        args.source,
        source_format=args.format,
        schema=args.schema or None,
        partition_by=[c for c in args.partition_by.split(",") if c],
        delete_where=args.delete_where,
        app_id=args.app_id,
        run_version=args.run_version,
        steps=[s for s in args.steps.split(",") if s],
    )
    sys.stdout.write(json.dumps(result.as_dict()) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["DEFAULT_DELETE_WHERE", "SAMPLE_SCHEMA", "STEPS", "PipelineResult", "main", "run_pipeline"]
