"""Validation with Delta-Spark as the reader (``validate --reader spark``; docs/spark.md).

For each version of the range, delta-spark opens the published table (``versionAsOf``) and its view
is compared with the store's:

- version: ``DESCRIBE HISTORY`` lists every published commit version with the operation of its
  ``commitInfo``; each version loads with ``versionAsOf``;
- schema: the read schema against the store's ``schemaString`` (names, types; nullability and
  column-mapping metadata are Spark's business);
- active files: ``DataFrame.inputFiles()`` of the Delta scan is the snapshot's whole active file set
  (no data is read), against the store's file index;
- rows: ``count()`` against the store's ``numRecords`` stats minus deletion-vector cardinalities,
  when every active file exists and has stats.

Local (``file://``) and S3 (``s3://``, read as ``s3a://`` with the table's storage options set on
the session for its bucket, ``delta_mirror.spark.s3a``) tables.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from delta_mirror.errors import first_line
from delta_mirror.jobs.validate.report import ReaderReport
from delta_mirror.jobs.validate.rows import dv_cardinality, expected_rows, num_records
from delta_mirror.jobs.validate.schema_diff import schema_diffs  # the same comparison as for deltalake
from delta_mirror.storage import S3_SCHEMES, local_path, normalize_location, open_store, storage_options_for
from delta_mirror.store.sql_store import SqlStore, TableInfo

_HINT = (
    "Delta-Spark (the reference reader) sees the published table differently from SQL: a commit or "
    "checkpoint file was changed after publishing, or the mirror renders an action Spark reads "
    "differently; look for hash_mismatch problems, then compare the commit file with the store's "
    "bytes (SqlStore.commit_bytes)"
)
_ERROR_HINT = (
    "Delta-Spark could not load this version of the published log: see the log problems reported "
    "with it; if the log is intact the table may use a feature this delta-spark does not support, "
    "or a data file is missing"
)


def _plain_schema(schema: Any) -> Any:
    """A schema without nullability and field metadata (what Spark's read schema may differ in)."""
    if isinstance(schema, dict):
        kind = schema.get("type")
        if kind == "struct":
            return {
                "type": "struct",
                "fields": [
                    {"name": f.get("name"), "type": _plain_schema(f.get("type"))}
                    for f in schema.get("fields", [])
                ],
            }
        if kind == "array":
            return {"type": "array", "elementType": _plain_schema(schema.get("elementType"))}
        if kind == "map":
            return {
                "type": "map",
                "keyType": _plain_schema(schema.get("keyType")),
                "valueType": _plain_schema(schema.get("valueType")),
            }
    return schema


def spark_check(
    store: SqlStore,
    table: TableInfo,
    lo: int,
    hi: int,
    report: ReaderReport,
    spark: Any = None,
    storage_options: Mapping[str, str] | None = None,
) -> None:
    """Compare Delta-Spark's view of versions ``lo..hi`` with the store; problems go to ``report``.

    ``storage_options``: credentials and endpoint of an S3 location (as for deltalake; the
    ``AWS_*`` environment fills in what is missing).
    """
    if spark is None:
        from delta_mirror.spark.session import get_spark

        spark = get_spark()
    view = _SparkView(spark, table, storage_options)
    if not _check_history(view, store, table, lo, hi, report):
        return
    for version in range(lo, hi + 1):
        _check_version(view, store, table, version, report)


class _SparkView:
    """Where Spark reads the table, and paths as both sides spell them (relative, decoded)."""

    def __init__(self, spark: Any, table: TableInfo, storage_options: Mapping[str, str] | None) -> None:
        self.spark = spark
        self.uri = uri = normalize_location(table.location)
        self.options = storage_options_for(uri, storage_options)
        self.folder = folder = local_path(uri)
        if folder is not None:
            self.path = str(folder)
            self.root = self.path.rstrip("/") + "/"
        elif urlparse(uri).scheme in S3_SCHEMES:
            from delta_mirror.spark.s3a import configure_s3a

            self.path = configure_s3a(spark, uri, self.options)
            self.root = self.path + "/"
        else:  # readers.reader_for refuses such a table before
            raise ValueError(f"the spark reader reads local and S3 tables only, not {uri}")
        self.exists = _exists_check(uri, self.options) if folder is None else _local_exists(folder)

    def text_of(self, exc: BaseException) -> str:
        from delta_mirror.spark.s3a import redact

        return redact(first_line(exc, 500, joined=True), self.options)

    def rel(self, path: str, *, decode: bool = True) -> str:
        """Relative to the table root and decoded: log paths are URI-encoded, Hadoop paths are not."""
        text = unquote(path) if decode else path
        for prefix, replacement in (("file://", ""), ("file:", ""), ("s3://", "s3a://")):
            if text.startswith(prefix):
                text = replacement + text[len(prefix) :]
                break
        if self.folder is not None and text.startswith("/"):
            text = "/" + text.lstrip("/")
        return text[len(self.root) :] if text.startswith(self.root) else text


def _check_history(
    view: _SparkView, store: SqlStore, table: TableInfo, lo: int, hi: int, report: ReaderReport
) -> bool:
    """``DESCRIBE HISTORY`` lists every published version with its operation; False: cannot open."""
    lines_by_version = store.commit_lines(table.id, lo, hi)
    with_json = {r.version for r in store.commit_rows(table.id, lo, hi) if r.has_json}
    try:
        rows = (
            view.spark.sql(f"DESCRIBE HISTORY delta.`{view.path}`").select("version", "operation").collect()
        )
        history = {int(r["version"]): r["operation"] for r in rows}
    except Exception as exc:
        report.problem(
            "reader_error",
            None,
            f"Delta-Spark cannot open the table at {view.uri}: {view.text_of(exc)}",
            _ERROR_HINT,
        )
        return False
    missing = sorted(v for v in with_json if v not in history)
    if missing:
        report.problem(
            "reader_version",
            missing[0],
            f"DESCRIBE HISTORY lacks {len(missing)} published versions (e.g. {missing[0]}); it lists "
            f"{sorted(history)[:10]}{'...' if len(history) > 10 else ''}",
            _HINT,
        )
    for version in sorted(with_json & history.keys()):
        expected_op = None
        for line in lines_by_version.get(version, []):
            if line.startswith('{"commitInfo"'):
                expected_op = json.loads(line)["commitInfo"].get("operation")
        if expected_op is not None and history[version] != expected_op:
            report.problem(
                "reader_version",
                version,
                f"at version {version}: DESCRIBE HISTORY shows operation {history[version]!r}, the store "
                f"{expected_op!r}",
                _HINT,
            )
    return True


def input_files(df: Any) -> list[str]:
    """``df.inputFiles()`` in one py4j call: PySpark turns the Java array into a list one element per
    call (300,000 active files: 90 s); Hadoop's ``StringUtils.join`` (on Spark's classpath) returns one
    string. A path with a newline in it (the count differs) or a classpath without Hadoop's
    ``StringUtils`` takes the slow path: the same answer."""
    files = df._jdf.inputFiles()
    count = len(files)
    if count == 0:
        return []
    try:
        joined = str(df.sparkSession._jvm.org.apache.hadoop.util.StringUtils.join("\n", files))
    except Exception:
        joined = ""
    paths = joined.split("\n")
    return paths if joined and len(paths) == count else list(df.inputFiles())


def _check_version(
    view: _SparkView, store: SqlStore, table: TableInfo, version: int, report: ReaderReport
) -> None:
    """One version: schema, active files, then (when countable) the row count."""
    at = f"at version {version}"
    metadata = json.loads(store.snapshot(table.id, version).metadata)["metaData"]
    adds = [
        json.loads(line)["add"] for batch in store.iter_active_add_lines(table.id, version) for line in batch
    ]
    try:
        df = view.spark.read.format("delta").option("versionAsOf", version).load(view.path)
        found_files = {view.rel(p, decode=False) for p in input_files(df)}
        schema = json.loads(df.schema.json())
    except Exception as exc:
        report.problem(
            "reader_error",
            version,
            f"Delta-Spark cannot load version {version}: {view.text_of(exc)}",
            _ERROR_HINT,
        )
        return
    diffs = schema_diffs(
        _plain_schema(json.loads(metadata.get("schemaString") or "{}")), _plain_schema(schema), ""
    )
    if diffs:
        report.problem(
            "reader_schema", version, f"{at}: schema differs (store vs spark): " + "; ".join(diffs[:5]), _HINT
        )
    expected_files = {view.rel(a["path"]) for a in adds}
    if found_files != expected_files:
        lost = sorted(expected_files - found_files)
        extra = sorted(found_files - expected_files)
        parts = [f"{at}: Delta-Spark sees {len(found_files)} active files, the store {len(expected_files)}"]
        if lost:
            parts.append(f"{len(lost)} missing from Spark (e.g. {lost[0]})")
        if extra:
            parts.append(f"{len(extra)} not in the store (e.g. {extra[0]})")
        report.problem("reader_files", version, "; ".join(parts), _HINT)
        return
    _check_rows(view, df, adds, version, report)


def _check_rows(
    view: _SparkView, df: Any, adds: list[dict[str, Any]], version: int, report: ReaderReport
) -> None:
    expected = expected_rows(
        ((a["path"], num_records(a), dv_cardinality(a)) for a in adds), lambda p: view.exists(view.rel(p))
    )
    if expected is None:
        return
    try:
        rows = df.count()
    except Exception as exc:
        report.problem(
            "reader_error",
            version,
            f"Delta-Spark cannot read the data of version {version}: {view.text_of(exc)}",
            _ERROR_HINT,
        )
        return
    if rows != expected:
        report.problem(
            "reader_rows",
            version,
            f"at version {version}: Delta-Spark counts {rows} rows, the store's stats say {expected}",
            "numRecords stats or deletion vectors in the log disagree with the data files; the stats were "
            "written by the table's writer: check the add actions of the listed version",
        )


def _local_exists(folder: Path) -> Callable[[str], bool]:
    return lambda name: (folder / name).exists()


def _exists_check(uri: str, options: Mapping[str, str]) -> Callable[[str], bool]:
    """Whether a data file (relative to the table root, decoded) exists; one HEAD per file."""
    objects = open_store(uri, options)
    known: dict[str, bool] = {}

    def exists(name: str) -> bool:
        if name not in known:
            known[name] = objects.head(name) is not None
        return known[name]

    return exists


__all__ = ["spark_check"]
