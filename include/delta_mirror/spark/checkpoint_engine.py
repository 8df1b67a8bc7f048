"""The Spark checkpoint engine: a table's checkpoint built by Spark from the store's active file set.

For tables too big for one process (docs/spark.md, "Spark checkpoint engine"). It produces what the local engine
(``delta_mirror.delta.checkpoint``) produces — same Parquet schema, same rows, same multi-part split, same
V2 layout — and hands the files to the publisher, which commits them exactly as it commits local
ones: put-if-absent into ``_delta_log/``, only after the version's commit is published, then
``_last_checkpoint``, never backwards (``Publisher(checkpoint_builder=SparkCheckpointEngine(...))``).
Which engine a table uses, and the publisher with its lease: ``spark.checkpoint_choice``.

How it reads the store:

* PostgreSQL: ``spark.read.jdbc`` of ``dl_files`` joined to ``dl_actions`` (the same O(active
  files) join as the local engine), split on ``dl_files.id`` into ``num_partitions`` ranges read in
  parallel (``partitionColumn``/``lowerBound``/``upperBound``), with a JDBC fetch size so no
  partition is held whole by the driver. The PostgreSQL JDBC driver comes from
  ``session.EXTRA_PACKAGES`` (or ``--packages`` under spark-submit); ``get_spark`` keeps it in
  ``spark.jars``, so executors on a cluster fetch it from the driver.
* SQLite: there is no server to connect to from executors, so the driver streams the payloads into
  a text file in the staging folder and Spark reads that file in splits (the staging folder must be
  visible to the executors: local mode, or a shared path).

How it writes: every line is parsed with ``from_json`` (FAILFAST) into the checkpoint's ``add`` /
``remove`` types — the Spark types are derived from ``checkpoint.CHECKPOINT_SCHEMA``, never written
twice — then normalised as the local engine normalises (``dataChange`` false, partition keys first
and always present, other map keys sorted and only when set). The non-file rows (protocol,
metaData, txn, domainMetadata) are rendered by the local engine into a small Parquet file that
Spark reads with the same schema. Classic: one file. Multi-part: ``repartition(n, path)`` is Spark's
Murmur3 hash partitioning, the very split the local engine reproduces, so part *i* holds the same
rows from either engine. V2: one sidecar per Spark partition (at most ``sidecar_size`` file actions
each), then the local engine names them and writes the top-level UUID file.

Core side: pyspark is imported inside functions only; never Airflow.
"""

from __future__ import annotations

import io
import json
import logging
import re
import shutil
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq

from delta_mirror.delta.checkpoint.layouts import (
    CheckpointHeader,
    checkpoint_header,
    checkpoint_result,
    non_file_parquet,
    num_checkpoint_parts,
    v2_checkpoint_files,
)
from delta_mirror.delta.checkpoint.model import CheckpointFile, CheckpointResult
from delta_mirror.delta.checkpoint.schema import CHECKPOINT_SCHEMA, SIDECAR_SCHEMA
from delta_mirror.delta.log_path import LOG_DIR, checkpoint_name, multipart_checkpoint_name
from delta_mirror.errors import InvalidActionError, PermanentError

if TYPE_CHECKING:
    from delta_mirror.jobs.publish_checkpoint import CheckpointPlan
    from delta_mirror.store.sql_store import SqlStore

log = logging.getLogger(__name__)

_PART_FILE = re.compile(r"^part-(\d{5})-.*\.parquet$")


# --------------------------------------------------------------------------------------------
# Arrow -> Spark types (from checkpoint.py's schema: one definition)
# --------------------------------------------------------------------------------------------


def spark_type(typ: Any) -> Any:
    """The Spark SQL type of an Arrow type of the checkpoint schema (every field nullable)."""
    from pyspark.sql import types as T

    if pa.types.is_struct(typ):
        return T.StructType([T.StructField(f.name, spark_type(f.type), True) for f in typ])
    if pa.types.is_map(typ):
        return T.MapType(spark_type(typ.key_type), spark_type(typ.item_type), True)
    if pa.types.is_list(typ):
        return T.ArrayType(spark_type(typ.value_type), True)
    simple = {
        pa.string(): T.StringType(),
        pa.int64(): T.LongType(),
        pa.int32(): T.IntegerType(),
        pa.bool_(): T.BooleanType(),
    }
    if typ in simple:
        return simple[typ]
    raise TypeError(f"no Spark type for {typ}")


def spark_schema(schema: Any) -> Any:
    from pyspark.sql import types as T

    return T.StructType([T.StructField(f.name, spark_type(f.type), True) for f in schema])


# --------------------------------------------------------------------------------------------
# The engine
# --------------------------------------------------------------------------------------------


@dataclass
class SparkCheckpointEngine:
    """A ``CheckpointBuilder`` (see ``publisher.Publisher``) that builds with ``spark``.

    ``num_partitions``: parallel JDBC reads (default: twice the default parallelism).
    ``staging_dir``: where Spark writes before the publisher commits (default: a temporary folder;
    with a cluster master it must be a path the executors and the driver share).
    """

    spark: Any
    num_partitions: int | None = None
    staging_dir: str | None = None
    sidecar_size: int = 1_000_000
    fetch_size: int = 10_000
    timings: dict[str, float] = field(default_factory=dict)

    def __call__(self, store: SqlStore, plan: CheckpointPlan) -> CheckpointResult:
        return self.build(store, plan)

    def build(self, store: SqlStore, plan: CheckpointPlan) -> CheckpointResult:
        header = checkpoint_header(plan.header_input(), plan.kind, plan.checkpoint_id)
        parts = self.num_partitions or max(2, 2 * int(self.spark.sparkContext.defaultParallelism))
        base = Path(self.staging_dir or tempfile.gettempdir())
        base.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f"dm-spark-cp-{plan.version}-", dir=base))
        started = time.monotonic()
        try:
            lines, num_adds, num_removes = _file_lines(
                self.spark, store, plan, parts, staging, self.fetch_size
            )
            self.timings["read_setup_s"] = time.monotonic() - started
            files_df = _file_actions(lines, header)
            result = self._write(header, plan, files_df, num_adds, num_removes, staging, parts)
        except Exception as exc:  # Spark's errors come through py4j: name the JSON problem clearly
            if "FAILFAST" in str(exc) or "Malformed records" in str(exc):
                raise InvalidActionError(
                    f"an add/remove action does not fit the checkpoint schema: {str(exc)[:300]}",
                    table=plan.table.name,
                    version=plan.version,
                ) from exc
            raise
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        self.timings["total_s"] = time.monotonic() - started
        return result

    def _write(
        self,
        header: CheckpointHeader,
        plan: CheckpointPlan,
        files_df: Any,
        num_adds: int,
        num_removes: int,
        staging: Path,
        parts: int,
    ) -> CheckpointResult:
        version = plan.version
        num_file_actions = num_adds + num_removes
        non_file_rows = sum(len(v) for v in header.non_file.values())
        if header.kind == "v2":
            sidecar_df = files_df.select(
                *[files_df[f.name].cast(spark_type(f.type)).alias(f.name) for f in SIDECAR_SCHEMA]
            )
            wanted = max(1, -(-num_file_actions // self.sidecar_size))
            if sidecar_df.rdd.getNumPartitions() < wanted:
                sidecar_df = sidecar_df.repartition(wanted)
            datas = _write_parquet(sidecar_df, staging / "sidecars", None) if num_file_actions else []
            datas = [d for d in datas if _num_rows(d)]  # Spark writes an empty file for an empty input
            files, top_rows = v2_checkpoint_files(header, datas, plan.modification_time_ms)
            return checkpoint_result(
                version,
                files,
                num_adds,
                num_file_actions + top_rows,
                v2_top=files[-1],
                modification_time_ms=plan.modification_time_ms,
            )
        df = _non_file_df(self.spark, header, staging).unionByName(files_df)
        num_parts = 1
        if header.kind == "multipart":
            assert plan.part_size is not None and plan.part_size >= 1, "multipart needs a part size"
            num_parts, _ = num_checkpoint_parts(num_file_actions, plan.part_size)
        if num_parts == 1:  # one part is a classic checkpoint (never "parts":1), as locally
            (data,) = _write_parquet(df.repartition(1), staging / "classic", 1)
            files = [CheckpointFile(f"{LOG_DIR}/{checkpoint_name(version)}", data)]
            return checkpoint_result(version, files, num_adds, non_file_rows + num_file_actions)
        from pyspark.sql import functions as F

        key = F.coalesce(F.col("add.path"), F.col("remove.path"))  # null for non-file rows: the seed
        datas = _write_parquet(df.repartition(num_parts, key), staging / "parts", num_parts)
        files = [
            CheckpointFile(f"{LOG_DIR}/{multipart_checkpoint_name(version, i + 1, num_parts)}", d)
            for i, d in enumerate(datas)
        ]
        return checkpoint_result(version, files, num_adds, non_file_rows + num_file_actions, parts=num_parts)


# --------------------------------------------------------------------------------------------
# Reading the active file set
# --------------------------------------------------------------------------------------------


def _file_lines(
    spark: Any, store: SqlStore, plan: CheckpointPlan, parts: int, staging: Path, fetch_size: int
) -> tuple[Any, int, int]:
    """A DataFrame of one string column ``line`` (adds then tombstones) and the two counts."""
    table_id, v = plan.table.id, plan.version
    from delta_mirror.store.backends import backend_of

    if backend_of(store.engine).jdbc_reads:  # PostgreSQL
        from delta_mirror.store.urls import jdbc_url  # URL parsing by SQLAlchemy stays in store/

        url, props = jdbc_url(store.url)
        props["fetchsize"] = str(fetch_size)
        frames: list[Any] = []
        counts: dict[str, int] = {}
        for side in store.file_id_ranges(table_id, v, plan.min_deletion_timestamp):
            counts[side.side] = side.count
            if not side.count:
                continue
            # small sides (tombstones, usually) are not worth many connections
            n = max(1, min(parts, -(-side.count // 50_000)))
            frames.append(
                spark.read.jdbc(
                    url,
                    f"({side.query}) AS q",
                    column="fid",
                    lowerBound=side.first_id,
                    upperBound=side.last_id + 1,
                    numPartitions=n,
                    properties=props,
                ).select("line")
            )
        if not frames:
            return spark.createDataFrame([], "line string"), 0, 0
        df = frames[0]
        for other in frames[1:]:
            df = df.union(other)
        return df, counts["add"], counts["remove"]
    # SQLite: stream the payloads to a text file the executors can split
    path = staging / "lines.jsonl"
    num_adds = 0
    with path.open("w", encoding="utf-8") as out:
        for batch in store.iter_active_add_lines(table_id, v):
            num_adds += len(batch)
            out.write("\n".join(batch))
            out.write("\n")
        tombstones = store.tombstone_lines(table_id, v, plan.min_deletion_timestamp)
        if tombstones:
            out.write("\n".join(tombstones))
            out.write("\n")
    df = spark.read.text(str(path)).withColumnRenamed("value", "line").where("line <> ''")
    if df.rdd.getNumPartitions() < parts and num_adds + len(tombstones) > 200_000:
        df = df.repartition(parts)
    return df, num_adds, len(tombstones)


# --------------------------------------------------------------------------------------------
# Rows
# --------------------------------------------------------------------------------------------


def _norm_map(col: Any, keys: Sequence[str]) -> Any:
    """The local engine's rule: ``keys`` first (always, null when absent), then the other keys with
    a value, sorted by key; a null map stays null."""
    from pyspark.sql import functions as F

    extra = F.map_from_entries(
        F.array_sort(
            F.filter(
                F.map_entries(col),
                lambda e: (~e["key"].isin(list(keys)) if keys else F.lit(True)) & e["value"].isNotNull(),
            )
        )
    )
    if keys:
        fixed = F.map_from_arrays(F.array(*[F.lit(k) for k in keys]), F.array(*[col[k] for k in keys]))
        extra = F.map_concat(fixed, extra)
    return F.when(col.isNotNull(), extra)


def _normalised(col: Any, arrow_type: Any, partition_keys: Sequence[str]) -> Any:
    from pyspark.sql import functions as F

    fields = []
    for f in arrow_type:
        if f.name == "dataChange":
            value = F.when(col.isNotNull(), F.lit(False))  # a checkpoint changes no data
        elif f.name == "partitionValues":
            value = _norm_map(col[f.name], partition_keys)
        elif f.name == "tags":
            value = _norm_map(col[f.name], ())
        else:
            value = col[f.name]
        fields.append(value.alias(f.name))
    return F.when(col.isNotNull(), F.struct(*fields)).cast(spark_type(arrow_type))


def _file_actions(lines: Any, header: CheckpointHeader) -> Any:
    """``lines`` parsed into checkpoint rows (``CHECKPOINT_SCHEMA`` columns, only add/remove set)."""
    from pyspark.sql import functions as F

    add_t = CHECKPOINT_SCHEMA.field("add").type
    remove_t = CHECKPOINT_SCHEMA.field("remove").type
    parse = spark_schema(pa.schema([("add", add_t), ("remove", remove_t)]))
    parsed = lines.select(F.from_json(F.col("line"), parse, {"mode": "FAILFAST"}).alias("a"))
    columns = []
    for f in CHECKPOINT_SCHEMA:
        if f.name == "add":
            columns.append(_normalised(F.col("a.add"), add_t, header.partition_keys).alias("add"))
        elif f.name == "remove":
            columns.append(_normalised(F.col("a.remove"), remove_t, header.partition_keys).alias("remove"))
        else:
            columns.append(F.lit(None).cast(spark_type(f.type)).alias(f.name))
    return parsed.select(*columns)


def _non_file_df(spark: Any, header: CheckpointHeader, staging: Path) -> Any:
    """protocol, metaData, txn, domainMetadata rows as the local engine renders them."""
    path = staging / "non-file.parquet"
    path.write_bytes(non_file_parquet(header))
    return spark.read.schema(spark_schema(CHECKPOINT_SCHEMA)).parquet(str(path))


# --------------------------------------------------------------------------------------------
# Output
# --------------------------------------------------------------------------------------------


def _empty_parquet(schema: Any) -> bytes:
    out = io.BytesIO()
    pq.write_table(
        schema.empty_table(),
        out,
        compression="snappy",
        use_compliant_nested_type=True,
        store_schema=False,
        data_page_version="1.0",
    )
    return out.getvalue()


def _num_rows(data: bytes) -> int:
    return int(pq.ParquetFile(pa.BufferReader(data)).metadata.num_rows)


def _write_parquet(df: Any, folder: Path, expected_parts: int | None) -> list[bytes]:
    """Write ``df`` as snappy Parquet; the files' bytes by Spark partition index.

    With ``expected_parts``, partition *i* is element *i* (an empty partition writes no file: it
    becomes an empty Parquet file of the checkpoint schema); otherwise the files in order.
    """
    df.write.mode("errorifexists").option("compression", "snappy").parquet(str(folder))
    found: dict[int, list[Path]] = {}
    for p in folder.iterdir():
        m = _PART_FILE.match(p.name)
        if m:
            found.setdefault(int(m[1]), []).append(p)
    if any(len(v) > 1 for v in found.values()):
        raise PermanentError(
            "Spark split one partition into several files",
            hint="unset spark.sql.files.maxRecordsPerFile for the checkpoint job",
        )
    if expected_parts is None:
        return [found[i][0].read_bytes() for i in sorted(found)]
    if any(i >= expected_parts for i in found):
        raise AssertionError(f"unexpected partition index in {sorted(found)}")
    return [
        found[i][0].read_bytes() if i in found else _empty_parquet(CHECKPOINT_SCHEMA)
        for i in range(expected_parts)
    ]


def describe(result: CheckpointResult) -> dict[str, Any]:
    info = json.loads(result.last_checkpoint)
    return {"files": [f.path for f in result.files], "last_checkpoint": info}


__all__ = [
    "SparkCheckpointEngine",
    "describe",
    "spark_schema",
    "spark_type",
]
