"""Spark writes Parquet data files into a table's location and describes them as ``add`` actions.

The files are written the way Delta-Spark lays them out, so every reader finds them:

- Spark writes the DataFrame to a private staging folder under the table root
  (``_delta_mirror_staging/<uuid>/``; a ``_`` folder is hidden from Spark and from ``VACUUM``),
  partitioned Hive-style (``col=value/``, Spark's escaping; null and empty values in
  ``__HIVE_DEFAULT_PARTITION__``), snappy Parquet, timestamps as ``TIMESTAMP_MICROS``;
- the stats of each file are computed by Spark over the staged files (``input_file_name()``);
- the files are renamed into the table root (Hadoop ``FileSystem``: atomic on local disks) and their
  size and modification time read back.

Paths in the actions are relative to the table root and URI-encoded exactly as Delta-Spark writes
them (Hadoop ``Path.toUri``: ``p=a b%c`` on disk is ``p=a%20b%2525c`` in the log); partition values
are the unescaped folder values, ``None`` for the default partition.

Stats (``numRecords``, ``minValues``, ``maxValues``, ``nullCount``) cover the first
``delta.dataSkippingNumIndexedCols`` (32) leaf columns, top-level atomic columns only (struct, array
and map columns get none: a missing stat only disables skipping). They are bounds every reader can
trust: timestamps are rounded outwards to milliseconds (min down, max up); a string min is cut to 32
characters (a prefix is never greater) and a longer max is left out; NaN and infinities are left
out; booleans and binary get ``nullCount`` only, as in Delta-Spark.
"""

from __future__ import annotations

import contextlib
import json
import math
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

STAGING_DIR = "_delta_mirror_staging"
HIVE_DEFAULT_PARTITION = "__HIVE_DEFAULT_PARTITION__"
STRING_PREFIX_LENGTH = 32
DEFAULT_INDEXED_COLUMNS = 32
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MINMAX_TYPES = ("byte", "short", "integer", "long", "float", "double", "date", "timestamp", "string")


@dataclass(frozen=True)
class WrittenFile:
    """One data file in place under the table root, with the body of its ``add`` action."""

    add: dict[str, Any]
    location: str  # Hadoop path of the file (for cleanup when the commit is refused)
    rows: int


class _Hadoop:
    """The few Hadoop ``FileSystem`` calls used here (py4j; works for file:, s3a:, gs:, abfs:)."""

    def __init__(self, spark: Any, root: str) -> None:
        jvm = spark._jvm
        self.Path = jvm.org.apache.hadoop.fs.Path
        self.root = self.Path(root)
        self.fs = self.root.getFileSystem(spark._jsc.hadoopConfiguration())

    def qualified(self, path: Any) -> Any:
        return self.fs.makeQualified(path)

    def files(self, folder: Any) -> list[Any]:
        out = []
        it = self.fs.listFiles(folder, True)
        while it.hasNext():
            out.append(it.next())
        return out

    def move(self, src: Any, dst: Any) -> None:
        self.fs.mkdirs(dst.getParent())
        if not self.fs.rename(src, dst):
            raise OSError(f"could not rename {src.toString()} to {dst.toString()}")

    def status(self, path: Any) -> Any:
        return self.fs.getFileStatus(path)

    def delete(self, path: Any, recursive: bool = False) -> None:
        self.fs.delete(path, recursive)


def hadoop_root(location: str) -> str:
    """The table root as Hadoop names it: ``file:<path>`` unescaped, ``s3a://`` for ``s3://``."""
    from delta_mirror.storage import local_path

    folder = local_path(location)
    if folder is not None:
        return f"file:{folder}"
    if location.startswith("s3://"):
        return "s3a://" + location[len("s3://") :]
    return location


def unescape_path_name(name: str) -> str:
    """Spark's ``unescapePathName``: ``%XX`` back to the character (Hive partition folders)."""
    out, i = [], 0
    while i < len(name):
        c = name[i]
        if c == "%" and _is_hex(name[i + 1 : i + 3]):
            out.append(chr(int(name[i + 1 : i + 3], 16)))
            i += 3
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _is_hex(text: str) -> bool:
    return len(text) == 2 and all(ch in "0123456789abcdefABCDEF" for ch in text)


def partition_values(rel_dirs: list[str], partition_columns: list[str]) -> dict[str, str | None]:
    """Partition values from a file's folders (``col=escaped``), in the table's column order."""
    found: dict[str, str | None] = {}
    for part in rel_dirs:
        key, sep, value = part.partition("=")
        if not sep:
            continue
        text = unescape_path_name(value)
        found[unescape_path_name(key)] = None if text == HIVE_DEFAULT_PARTITION else text
    missing = [c for c in partition_columns if c not in found]
    if missing:
        raise ValueError(f"no folder for partition column(s) {missing} in {'/'.join(rel_dirs)}")
    return {c: found[c] for c in partition_columns}


def indexed_columns(data_schema: dict[str, Any], limit: int) -> list[tuple[str, str]]:
    """(name, type) of the top-level atomic data columns inside the first ``limit`` leaf columns."""
    out: list[tuple[str, str]] = []
    leaves = 0
    for field in data_schema["fields"]:
        kind = field["type"]
        width = _leaf_count(kind)
        if limit >= 0 and leaves + width > limit:
            break
        leaves += width
        if isinstance(kind, str):
            out.append((field["name"], kind))
    return out


def _leaf_count(kind: Any) -> int:
    if isinstance(kind, dict) and kind.get("type") == "struct":
        return sum(_leaf_count(f["type"]) for f in kind["fields"])
    return 1


def _minmax_kind(kind: str) -> str | None:
    if kind.startswith("decimal"):
        return "decimal"
    return kind if kind in _MINMAX_TYPES else None


def _stat_columns(F: Any, name: str, kind: str, index: int) -> list[Any]:
    col = F.col(f"`{name}`")
    exprs = [F.count(col).alias(f"c{index}")]
    mk = _minmax_kind(kind)
    if mk == "timestamp":
        exprs += [
            F.unix_micros(F.min(col)).alias(f"lo{index}"),
            F.unix_micros(F.max(col)).alias(f"hi{index}"),
        ]
    elif mk in ("date", "decimal"):
        exprs += [
            F.min(col).cast("string").alias(f"lo{index}"),
            F.max(col).cast("string").alias(f"hi{index}"),
        ]
    elif mk is not None:
        exprs += [F.min(col).alias(f"lo{index}"), F.max(col).alias(f"hi{index}")]
    return exprs


def _bound(kind: str, value: Any, *, upper: bool) -> Any:
    """A stats value for ``value`` that is still a bound for every reader, or None to leave it out."""
    if value is None:
        return None
    mk = _minmax_kind(kind)
    if mk == "timestamp":
        micros = int(value)
        millis = -(-micros // 1000) if upper else micros // 1000
        moment = _EPOCH + timedelta(milliseconds=millis)
        if not 1 <= moment.year <= 9999:
            return None
        return moment.strftime("%Y-%m-%dT%H:%M:%S") + f".{millis % 1000:03d}Z"
    if mk == "decimal":
        return Decimal(str(value))
    if mk in ("float", "double"):
        return float(value) if math.isfinite(float(value)) else None
    if mk == "string":
        text = str(value)
        if len(text) <= STRING_PREFIX_LENGTH:
            return text
        return None if upper else text[:STRING_PREFIX_LENGTH]
    return value


def stats_json(num_records: int, mins: dict[str, Any], maxs: dict[str, Any], nulls: dict[str, int]) -> str:
    """The ``stats`` string, compact, keys in schema order; decimals as exact JSON numbers."""

    def value(v: Any) -> str:
        return str(v) if isinstance(v, Decimal) else json.dumps(v, ensure_ascii=False)

    def obj(d: dict[str, Any]) -> str:
        return "{" + ",".join(f"{json.dumps(k, ensure_ascii=False)}:{value(v)}" for k, v in d.items()) + "}"

    return (
        f'{{"numRecords":{num_records},"minValues":{obj(mins)},"maxValues":{obj(maxs)},'
        f'"nullCount":{obj(nulls)}}}'
    )


def _file_key(uri: str, marker: str) -> str:
    """The URI-encoded path below the staging folder (``input_file_name()`` and ``toUri()`` agree)."""
    at = uri.find(marker)
    if at < 0:
        raise ValueError(f"{uri} is not under the staging folder {marker}")
    return uri[at + len(marker) :]


def write_files(
    spark: Any,
    df: Any,
    location: str,
    *,
    partition_columns: list[str],
    indexed_column_limit: int = DEFAULT_INDEXED_COLUMNS,
    max_records_per_file: int | None = None,
) -> list[WrittenFile]:
    """Write ``df`` as Parquet files under the table root and return their ``add`` actions.

    The files are not in the log yet: readers cannot see them until a commit adds them. When this
    fails half-way, the staging folder is removed; files already moved into the table root stay
    as orphans (not in the log, so invisible) until ``VACUUM`` or an orphan cleanup removes them.
    """
    from pyspark.sql import functions as F

    hadoop = _Hadoop(spark, hadoop_root(location))
    root = hadoop.qualified(hadoop.root)
    staging_id = uuid.uuid4().hex
    staging = hadoop.Path(hadoop.Path(root, STAGING_DIR), staging_id)
    marker = f"/{STAGING_DIR}/{staging_id}/"
    data_schema = {
        "type": "struct",
        "fields": [f for f in df.schema.jsonValue()["fields"] if f["name"] not in partition_columns],
    }
    written: list[WrittenFile] = []
    try:
        writer = df.write.mode("errorifexists").option("compression", "snappy")
        if partition_columns:
            writer = writer.partitionBy(*partition_columns)
        if max_records_per_file:
            writer = writer.option("maxRecordsPerFile", str(max_records_per_file))
        key = "spark.sql.parquet.outputTimestampType"
        before = spark.conf.get(key)
        spark.conf.set(key, "TIMESTAMP_MICROS")  # INT96 (Spark's default) is legacy for other readers
        try:
            writer.parquet(staging.toString())
        finally:
            spark.conf.set(key, before)

        staged = [
            s
            for s in hadoop.files(staging)
            if s.getPath().getName().endswith(".parquet") and not s.getPath().getName().startswith((".", "_"))
        ]
        stats = _file_stats(spark, F, staging.toString(), data_schema, indexed_column_limit, marker)
        for status in staged:
            src = status.getPath()
            rel_raw = _file_key(src.toUri().toString(), marker)
            file_stats = stats.get(rel_raw)
            if file_stats is None:
                rows = spark.read.parquet(src.toString()).count()
                if rows:
                    raise RuntimeError(f"no stats computed for {rel_raw} ({rows} rows)")
                hadoop.delete(src)  # Spark writes an empty file for an empty DataFrame: not needed
                continue
            rel_decoded = _file_key(src.toUri().getPath(), marker)
            dst = hadoop.Path(root, rel_decoded)
            hadoop.move(src, dst)
            moved = hadoop.status(dst)
            rows, text = file_stats
            add = {
                "path": rel_raw,
                "partitionValues": partition_values(rel_decoded.split("/")[:-1], partition_columns),
                "size": int(moved.getLen()),
                "modificationTime": int(moved.getModificationTime()),
                "dataChange": True,
                "stats": text,
            }
            written.append(WrittenFile(add, dst.toString(), rows))
    finally:
        hadoop.delete(staging, True)
        with contextlib.suppress(Exception):  # only when empty (other writers may be staging)
            hadoop.delete(staging.getParent())
    return written


def _file_stats(
    spark: Any, F: Any, staging: str, data_schema: dict[str, Any], limit: int, marker: str
) -> dict[str, tuple[int, str]]:
    """(numRecords, stats JSON) per staged file, keyed by its URI-encoded path below the staging folder."""
    from pyspark.sql.types import StructType

    columns = indexed_columns(data_schema, limit)
    data = (
        spark.read.schema(StructType.fromJson(data_schema))
        .option("recursiveFileLookup", "true")
        .parquet(staging)
        .withColumn("_dm_file", F.input_file_name())
    )
    exprs = [F.count(F.lit(1)).alias("n")]
    for i, (name, kind) in enumerate(columns):
        exprs += _stat_columns(F, name, kind, i)
    out: dict[str, tuple[int, str]] = {}
    for row in data.groupBy("_dm_file").agg(*exprs).collect():
        n = int(row["n"])
        mins: dict[str, Any] = {}
        maxs: dict[str, Any] = {}
        nulls: dict[str, int] = {}
        for i, (name, kind) in enumerate(columns):
            nulls[name] = n - int(row[f"c{i}"])
            if _minmax_kind(kind) is None:
                continue
            lo = _bound(kind, row[f"lo{i}"], upper=False)
            hi = _bound(kind, row[f"hi{i}"], upper=True)
            if lo is not None:
                mins[name] = lo
            if hi is not None:
                maxs[name] = hi
        out[_file_key(row["_dm_file"], marker)] = (n, stats_json(n, mins, maxs, nulls))
    return out


__all__ = [
    "HIVE_DEFAULT_PARTITION",
    "STAGING_DIR",
    "WrittenFile",
    "hadoop_root",
    "indexed_columns",
    "partition_values",
    "stats_json",
    "unescape_path_name",
    "write_files",
]
