"""Validation: does what readers see at the table's location agree with the SQL store?

Two independent checks over a version range:

1. **Log listing vs SQL.** ``_delta_log/`` is listed once and compared with the store: every
   published commit is present with the recorded SHA-256; no commit or checkpoint sits at a
   version the store does not know (an external writer); ``_last_checkpoint`` is well formed,
   points at a complete checkpoint and never lags the store's newest checkpoint.
2. **Reader view vs SQL.** A real Delta reader opens the published log and walks the range
   version by version: deltalake (protocol, metadata, schema, active files, deletion vectors,
   ``txn`` versions), Delta-Spark (``spark_reader``), DuckDB's delta extension (``duckdb_reader``)
   or delta-kernel-java (``kernel_java``). At a checkpoint version the reader starts afresh, so the
   checkpoint's own content is what gets compared there.

A reader that cannot read a version although the log is right (a feature it does not implement, a
known defect; ``limits``) gives a **limitation**, not a problem: it names a reader to use instead.
``reader="auto"`` reads with deltalake and hands the versions it cannot read to Delta-Spark when
Spark is installed.

The store side of (2) is computed incrementally: the snapshot and active files at the first
version, then each commit's actions applied in order. Asking the store for a full snapshot per
version would cost O(history) per version; replaying one commit costs O(its actions).
Problems are data, not exceptions: each names the version, what was expected and what was found,
the likely cause and what to do.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from delta_mirror.errors import PermanentError
from delta_mirror.jobs.validate.readers import READERS, ReadOptions, reader_for
from delta_mirror.jobs.validate.report import MAX_PROBLEMS_PER_KIND, Limitation, Problem, ValidationReport

if TYPE_CHECKING:  # the CLI reads READERS at start-up, before any store (and SQLAlchemy) loads
    from delta_mirror.storage import ObjectStore
    from delta_mirror.store.sql_store import SqlStore, TableInfo


def validate_table(
    store: SqlStore,
    name: str,
    *,
    from_version: int | None = None,
    to_version: int | None = None,
    reader: str = "deltalake",
    open_location: Callable[[str], ObjectStore] | None = None,
    storage_options: Mapping[str, str] | None = None,
    spark: Any = None,
) -> ValidationReport:
    """Validate the published versions ``from_version..to_version`` of table ``name``.

    The default range is the whole published history (from the base checkpoint of an imported
    table that starts at one). Raises ``PermanentError`` for an unknown reader, a reader that cannot
    read the table's location (``readers.READERS`` says which read what) or a range outside the
    published versions; everything found at the location is reported, not raised.
    ``reader="spark"`` reads with Delta-Spark (``spark``: a session to use, else ``get_spark()``);
    ``"auto"`` is deltalake, with Delta-Spark for the versions deltalake cannot read (when Spark is
    installed).
    """
    from delta_mirror.jobs.validate.listing import check_listing
    from delta_mirror.storage import open_store

    table = store.get_table(name)
    chosen = reader_for(reader, table)
    start, last, lo, hi = _published_range(store, table, from_version, to_version)
    report = ValidationReport(name, table.location, lo, hi, hi - lo + 1)
    objects = (open_location or (lambda loc: open_store(loc, storage_options)))(table.location)
    complete = check_listing(store, table, objects, lo, hi, last, report.problems)
    reader_from = max(lo, start)  # before the base checkpoint the store keeps no file index
    if reader_from <= hi:
        chosen.check(
            store, table, reader_from, hi, report, ReadOptions(storage_options, spark, frozenset(complete))
        )
    return report


def _published_range(
    store: SqlStore, table: TableInfo, from_version: int | None, to_version: int | None
) -> tuple[int, int, int, int]:
    """(first readable, last published, lo, hi): the range to check, refused when out of bounds."""
    last = store.last_published_version(table.id)
    start = table.first_version if table.base_checkpoint_version is None else table.base_checkpoint_version
    floor = table.settings.get("log_floor")
    if isinstance(floor, int) and floor > start:
        start = floor  # older log files were removed by retention cleanup (maintenance)
    if (
        last is None
        and table.base_checkpoint_version is not None
        and store.last_checkpoint_version(table.id) is not None
    ):
        last = table.base_checkpoint_version  # imported as a checkpoint alone: there is no JSON to publish
    if last is None or last < table.first_version:
        latest = store.latest_version(table.id)
        committed = (
            f"; versions {table.first_version}..{latest} are committed in the store (a Spark job's "
            "commit files count once the publisher has checked them)"
            if latest is not None
            else ""
        )
        raise PermanentError(
            f"nothing is published yet: validate checks what the publisher published, and it has not "
            f"published this table{committed}",
            table=table.name,
            hint=f"run the publisher first: `delta-mirror mirror {table.name}` (or the table's DAG), then validate",
        )
    lo = start if from_version is None else from_version
    hi = last if to_version is None else to_version
    if lo > hi:
        raise PermanentError(
            f"empty version range {lo}..{hi}", table=table.name, hint="from_version must be <= to_version"
        )
    if lo < start or hi > last:
        raise PermanentError(
            f"versions {lo}..{hi} are outside the published versions {start}..{last}",
            table=table.name,
            hint="validate only published versions; run `delta-mirror mirror` first to publish the rest",
        )
    return start, last, lo, hi


__all__ = ["MAX_PROBLEMS_PER_KIND", "READERS", "Limitation", "Problem", "ValidationReport", "validate_table"]
