"""PySpark ingest: source files (CSV, Parquet, JSON) → Parquet data files in the table → one commit.

``ingest(spark, store, table, source, ...)`` is an example data pipeline on top of the
store: Spark reads the source, writes Parquet data files into the table location
(``spark.data_files``: Delta-Spark's layout, paths, partition values and stats), and the ``add``
actions (plus ``remove`` actions for ``mode="overwrite"``) are committed through ``SqlStore.commit``
with optimistic concurrency. The mirror then publishes the version like any other.

What it guarantees:

- **All or nothing.** Readers see the new rows only once the commit is in the store *and*
  published; data files written for a commit that never happens are not in the log, so no reader
  sees them. When the store refuses the commit, the files are deleted; after a crash (or an
  ambiguous, transient commit error) they stay as orphans until ``VACUUM`` (or any orphan-file
  cleanup that compares the folder with the log) removes them.
- **Concurrency as in Delta.** An append is a *blind append*: when another writer takes the
  version first, the append is rebased onto the new latest version, unless a winning commit changed
  the table's ``metaData`` or ``protocol`` (then it is refused, like Delta's
  ``MetadataChangedException``). An overwrite read the whole table, so a racing commit refuses it
  (``CommitConflictError``; re-run it).
- **Schema.** The first ingest creates the table (``protocol`` 1/2 + ``metaData`` from the Spark
  schema, every field nullable). Later ingests must bring the same columns; integer and float
  widening is cast, anything else is refused with the difference named.
- **Idempotent retries** (optional): with ``app_id`` and ``app_version`` the commit carries a
  ``txn`` action, and an ingest whose ``app_version`` the table already has is skipped: a retried
  task after a successful commit does not ingest twice.

Empty strings in a partition column become null, as in Delta-Spark (Hive partition folders cannot
tell them apart).

Run it as a job: ``python -m delta_mirror.spark.ingest --table events --source data/*.csv
--format csv --location /lake/events --partition-by country`` (the store from ``--store`` or
``DELTA_MIRROR_STORE``); the same module works under ``spark-submit``.
"""

from __future__ import annotations

import argparse
import json
import sys
import uuid
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from delta_mirror.delta.actions import Action
from delta_mirror.delta.new_table import create_table_actions
from delta_mirror.delta.protocol import now_ms
from delta_mirror.errors import (
    CommitConflictError,
    DataError,
    MirrorError,
    PermanentError,
    TableNotFoundError,
    TransientError,
)
from delta_mirror.spark.data_files import DEFAULT_INDEXED_COLUMNS, WrittenFile, write_files
from delta_mirror.spark.table_schema import conform, new_table_schema, plain_schema
from delta_mirror.storage import normalize_location
from delta_mirror.store.sql_store import SqlStore, TableInfo
from delta_mirror.version import ENGINE_INFO

SOURCE_FORMATS = ("csv", "parquet", "json")
MODES = ("append", "overwrite")
MAX_ATTEMPTS = 10


@dataclass(frozen=True)
class IngestResult:
    table: str
    mode: str
    version: int | None  # the committed version; None when skipped or when there was nothing to add
    created: bool
    files: int
    rows: int
    bytes: int
    removed_files: int
    attempts: int
    skipped: bool = False

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def read_source(
    spark: Any,
    source: str | Sequence[str],
    fmt: str = "csv",
    *,
    schema: str | None = None,
    options: dict[str, str] | None = None,
) -> Any:
    """The source as a DataFrame; malformed rows fail the job (``FAILFAST``).

    CSV: a header line, quotes escaped by doubling them (RFC 4180, as Python and spreadsheets write
    it), types inferred unless ``schema`` (DDL) is given; empty fields are null.
    """
    if fmt not in SOURCE_FORMATS:
        raise PermanentError(f"unknown source format {fmt!r}", hint=f"use one of {', '.join(SOURCE_FORMATS)}")
    opts: dict[str, str] = {}
    if fmt == "csv":
        opts = {"header": "true", "escape": '"', "mode": "FAILFAST"}
        if schema is None:
            opts["inferSchema"] = "true"
    elif fmt == "json":
        opts = {"mode": "FAILFAST"}
    opts.update(options or {})
    reader = spark.read.format(fmt).options(**opts)
    if schema is not None:
        reader = reader.schema(schema)
    paths = [source] if isinstance(source, str) else list(source)
    return reader.load(paths)


def ingest(
    spark: Any,
    store: SqlStore,
    table: str,
    source: str | Sequence[str] | None = None,
    *,
    format: str = "csv",
    location: str | None = None,
    partition_by: Sequence[str] | None = None,
    mode: str = "append",
    schema: str | None = None,
    options: dict[str, str] | None = None,
    configuration: dict[str, str] | None = None,
    app_id: str | None = None,
    app_version: int | None = None,
    max_records_per_file: int | None = None,
    df: Any = None,
) -> IngestResult:
    """Ingest ``source`` (or a ready DataFrame ``df``) into ``table`` as one commit; returns what was done.

    ``location`` is needed when the table does not exist yet (it is created at the first ingest);
    ``partition_by`` and ``configuration`` apply to a new table (an existing one keeps its own).
    """
    if mode not in MODES:
        raise PermanentError(f"unknown mode {mode!r}", table=table, hint="use append or overwrite")
    if (app_id is None) != (app_version is None):
        raise PermanentError("app_id and app_version go together", table=table)
    info = _table_or_none(store, table)
    latest = None if info is None else store.latest_version(info.id)
    metadata: dict[str, Any] | None = None
    if info is not None and latest is not None:
        snap = store.snapshot(info.id, latest)
        metadata = json.loads(snap.metadata)["metaData"]
        if app_id is not None and _txn_done(snap.txns, app_id, app_version):
            return IngestResult(table, mode, None, False, 0, 0, 0, 0, 0, skipped=True)
    if df is None:
        if source is None:
            raise PermanentError("nothing to ingest: give a source or a DataFrame", table=table)
        df = read_source(spark, source, format, schema=schema, options=options)

    df, root, partitions, schema_string, config = _target(
        spark, df, table, info, metadata, location, partition_by, configuration
    )
    written = write_files(
        spark,
        df,
        root,
        partition_columns=partitions,
        indexed_column_limit=int(config.get("delta.dataSkippingNumIndexedCols", DEFAULT_INDEXED_COLUMNS)),
        max_records_per_file=max_records_per_file,
    )
    try:
        return _commit(
            spark,
            store,
            table,
            written,
            mode=mode,
            new=metadata is None,
            create_at=root if info is None else None,
            read_version=latest,
            first_version=info.first_version if info is not None else 0,
            schema_string=schema_string,
            partitions=partitions,
            configuration=config,
            txn=(app_id, app_version) if app_id is not None and app_version is not None else None,
        )
    except MirrorError as exc:
        if not isinstance(exc, TransientError):  # a refused commit wrote nothing: drop its files
            _delete(spark, root, written)
        raise


def _target(
    spark: Any,
    df: Any,
    table: str,
    info: TableInfo | None,
    metadata: dict[str, Any] | None,
    location: str | None,
    partition_by: Sequence[str] | None,
    configuration: dict[str, str] | None,
) -> tuple[Any, str, list[str], str, dict[str, str]]:
    """Where and how the rows go: an existing table's root, partitioning, schema and properties
    (the DataFrame conformed to its schema), or those of the table this ingest creates."""
    if metadata is not None:
        assert info is not None
        partitions = list(metadata.get("partitionColumns") or [])
        if partition_by is not None and list(partition_by) != partitions:
            raise DataError(
                f"the table is partitioned by {partitions}, not {list(partition_by)}",
                table=table,
                hint="drop partition_by (the table keeps its partitioning) or ingest into a new table",
            )
        df = conform(df, json.loads(metadata["schemaString"]), table)
        config = metadata.get("configuration") or {}
        return df, info.location, partitions, metadata["schemaString"], config
    if info is not None:
        root = info.location
    elif location is None:
        raise TableNotFoundError(
            f"no table named '{table}' in the store, and no location to create it at",
            table=table,
            hint="pass a location for the first ingest",
        )
    else:
        root = normalize_location(location)
    partitions = list(partition_by or [])
    schema_string = new_table_schema(df, partitions, table)
    _refuse_existing_log(spark, root, table)
    return df, root, partitions, schema_string, dict(configuration or {})


def _commit(
    spark: Any,
    store: SqlStore,
    table: str,
    written: list[WrittenFile],
    *,
    mode: str,
    new: bool,
    create_at: str | None,
    read_version: int | None,
    first_version: int,
    schema_string: str,
    partitions: list[str],
    configuration: dict[str, str],
    txn: tuple[str, int] | None,
) -> IngestResult:
    """Commit the files; a blind append that loses a race is rebased onto the winner's version."""
    rows = sum(w.rows for w in written)
    size = sum(int(w.add["size"]) for w in written)
    if not new and mode == "append" and not written and txn is None:
        return IngestResult(table, mode, None, False, 0, 0, 0, 0, 0)
    for attempt in range(1, MAX_ATTEMPTS + 1):
        expected = first_version if new or read_version is None else read_version + 1
        removes = _removes(store, table, read_version) if mode == "overwrite" and not new else []
        blind = not removes and mode == "append"
        actions: list[Action] = [
            ("commitInfo", _commit_info(spark, mode, new, read_version, blind, partitions, written, removes))
        ]
        if new:
            actions += create_table_actions(
                schema_string, partition_columns=partitions, configuration=configuration
            )
        if txn is not None:
            actions.append(("txn", {"appId": txn[0], "version": txn[1], "lastUpdated": now_ms()}))
        actions += [("remove", r) for r in removes]
        actions += [("add", w.add) for w in written]
        try:
            version = store.commit(table, actions, expected_version=expected, location=create_at)
        except CommitConflictError:
            if mode != "append" or attempt == MAX_ATTEMPTS:
                raise
            info = store.get_table(table)
            latest = store.latest_version(info.id)
            if latest is None:
                raise
            winners = store.commit_lines(info.id, expected, latest)
            _check_rebase(table, winners, new, schema_string, partitions, info, create_at)
            if txn is not None and _txn_done(
                [line for v in sorted(winners) for line in winners[v] if line.startswith('{"txn"')], *txn
            ):
                _delete(spark, info.location, written)
                return IngestResult(table, mode, None, False, 0, 0, 0, 0, attempt, skipped=True)
            new, create_at, read_version, first_version = False, None, latest, info.first_version
            continue
        return IngestResult(table, mode, version, new, len(written), rows, size, len(removes), attempt)
    raise AssertionError("unreachable")


def _check_rebase(
    table: str,
    winners: dict[int, list[str]],
    new: bool,
    schema_string: str,
    partitions: list[str],
    info: TableInfo,
    create_at: str | None,
) -> None:
    """A blind append may follow the winners unless they changed what it was written against."""
    for version in sorted(winners):
        for line in winners[version]:
            if not line.startswith(('{"metaData"', '{"protocol"')):
                continue
            if new and line.startswith('{"metaData"'):
                meta = json.loads(line)["metaData"]
                same = (
                    plain_schema(json.loads(meta["schemaString"])) == plain_schema(json.loads(schema_string))
                    and list(meta.get("partitionColumns") or []) == partitions
                    and (create_at is None or create_at.rstrip("/") == info.location.rstrip("/"))
                )
                if same:
                    continue
            if new and line.startswith('{"protocol"'):
                continue
            raise CommitConflictError(
                f"a concurrent commit (version {version}) changed the table's "
                f"{'metadata' if 'metaData' in line[:12] else 'protocol'}: this append cannot be rebased",
                table=table,
                version=version,
                hint="re-run the ingest: it will be checked against the new schema",
            )


def _commit_info(
    spark: Any,
    mode: str,
    new: bool,
    read_version: int | None,
    blind: bool,
    partitions: list[str],
    written: list[WrittenFile],
    removes: list[dict[str, Any]],
) -> dict[str, Any]:
    """``commitInfo`` as Delta-Spark writes it for ``df.write.format("delta")``."""
    info: dict[str, Any] = {
        "timestamp": now_ms(),
        "operation": "WRITE",
        "operationParameters": {
            "mode": "ErrorIfExists" if new and mode == "append" else mode.capitalize(),
            "partitionBy": json.dumps(partitions),
        },
    }
    if read_version is not None and not new:
        info["readVersion"] = read_version
    metrics = {
        "numFiles": str(len(written)),
        "numOutputRows": str(sum(w.rows for w in written)),
        "numOutputBytes": str(sum(int(w.add["size"]) for w in written)),
    }
    if removes:
        metrics["numRemovedFiles"] = str(len(removes))
    info.update(
        {
            "isolationLevel": "Serializable",
            "isBlindAppend": blind,
            "operationMetrics": metrics,
            "engineInfo": f"Apache-Spark/{spark.version} {ENGINE_INFO}",
            "txnId": str(uuid.uuid4()),
        }
    )
    return info


def _removes(store: SqlStore, table: str, version: int | None) -> list[dict[str, Any]]:
    """``remove`` actions for every active file at ``version`` (what an overwrite replaces)."""
    if version is None:
        return []
    info = store.get_table(table)
    now = now_ms()
    out = []
    for batch in store.iter_active_add_lines(info.id, version):
        for line in batch:
            add = json.loads(line)["add"]
            body: dict[str, Any] = {
                "path": add["path"],
                "deletionTimestamp": now,
                "dataChange": True,
                "extendedFileMetadata": True,
                "partitionValues": add.get("partitionValues") or {},
                "size": add.get("size"),
            }
            if add.get("deletionVector"):
                body["deletionVector"] = add["deletionVector"]
            out.append(body)
    return out


def _txn_done(txn_lines: Sequence[str], app_id: str, app_version: int | None) -> bool:
    for line in txn_lines:
        body = json.loads(line)["txn"]
        if body.get("appId") == app_id and app_version is not None and int(body["version"]) >= app_version:
            return True
    return False


def _table_or_none(store: SqlStore, table: str) -> TableInfo | None:
    try:
        return store.get_table(table)
    except TableNotFoundError:
        return None


def _refuse_existing_log(spark: Any, root: str, table: str) -> None:
    """A new table's location must not hold a Delta log already (import that table instead)."""
    from delta_mirror.spark.data_files import hadoop_root

    jvm = spark._jvm
    log = jvm.org.apache.hadoop.fs.Path(hadoop_root(root) + "/_delta_log")
    fs = log.getFileSystem(spark._jsc.hadoopConfiguration())
    if fs.exists(log) and any(s.getPath().getName().endswith(".json") for s in fs.listStatus(log)):
        raise DataError(
            f"{root} already holds a Delta log",
            table=table,
            hint=f"import it first: delta-mirror import {root} --table {table}",
        )


def _delete(spark: Any, root: str, written: list[WrittenFile]) -> None:
    """Best-effort removal of data files no commit refers to."""
    if not written:
        return
    jvm = spark._jvm
    conf = spark._jsc.hadoopConfiguration()
    for w in written:
        try:
            path = jvm.org.apache.hadoop.fs.Path(w.location)
            path.getFileSystem(conf).delete(path, False)
        except Exception:
            pass


# --------------------------------------------------------------------------------------------------
# the job: python -m delta_mirror.spark.ingest (or spark-submit)

_EXIT = {"CONFLICT": 3, "DATA": 4, "TRANSIENT": 5}


def _session(master: str | None, table: str) -> Any:
    """Under ``spark-submit`` its session (master, jars, conf); else ``get_spark`` (local[2], Delta).

    Ingest itself writes plain Parquet: it needs no Delta jars on the cluster.
    """
    import os

    if master is None and "PYSPARK_GATEWAY_PORT" in os.environ:  # the JVM of spark-submit started us
        from pyspark.sql import SparkSession

        return SparkSession.builder.appName(f"delta-mirror-ingest-{table}").getOrCreate()
    from delta_mirror.spark.session import get_spark

    return get_spark(master, app_name=f"delta-mirror-ingest-{table}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m delta_mirror.spark.ingest",
        description="Ingest CSV/Parquet/JSON files into a delta-mirror table with Spark (one commit).",
    )
    parser.add_argument("--table", required=True)
    parser.add_argument("--source", required=True, action="append", help="file, folder or glob (repeatable)")
    parser.add_argument("--format", default="csv", choices=SOURCE_FORMATS)
    parser.add_argument("--location", help="table root, for the first ingest (creates the table)")
    parser.add_argument("--partition-by", default="", help="comma-separated partition columns (new table)")
    parser.add_argument("--mode", default="append", choices=MODES)
    parser.add_argument("--schema", help="source schema as DDL, e.g. 'id BIGINT, ts TIMESTAMP'")
    parser.add_argument("--option", action="append", default=[], metavar="KEY=VALUE", help="reader option")
    parser.add_argument("--store", help="store URL (default: DELTA_MIRROR_STORE, else the SQLite default)")
    parser.add_argument("--master", help="Spark master (default: DELTA_MIRROR_SPARK_MASTER or local[2])")
    parser.add_argument("--app-id", help="idempotency: skip when the table has this txn app id ...")
    parser.add_argument("--app-version", type=int, help="... at this version or later")
    args = parser.parse_args(argv)
    options = dict(o.split("=", 1) for o in args.option)
    try:
        store = SqlStore(args.store)
        store.ensure_initialised()
        result = ingest(
            _session(args.master, args.table),
            store,
            args.table,
            args.source,
            format=args.format,
            location=args.location,
            partition_by=[c for c in args.partition_by.split(",") if c] or None,
            mode=args.mode,
            schema=args.schema,
            options=options,
            app_id=args.app_id,
            app_version=args.app_version,
        )
    except MirrorError as exc:
        sys.stderr.write(f"error: {exc.message}\n")
        return _EXIT.get(exc.error_class.value, 1)
    sys.stdout.write(json.dumps(result.to_json()) + "\n")
    return 0


__all__ = ["IngestResult", "ingest", "main", "read_source"]


if __name__ == "__main__":
    sys.exit(main())
