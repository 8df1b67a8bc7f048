"""Validation with delta-kernel-java as the reader (``validate --reader kernel-java``).

The reading is ``kernel_java.read_versions_with_kernel_java`` (a small Java program on the Delta
kernel, the library Trino, Flink and others build on; one JVM per batch of versions). Each version's
view is compared with the store's: version, protocol, table id and partition columns, schema,
active files and the row count (when every active file exists and has stats). Local tables only.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from delta_mirror.errors import PermanentError
from delta_mirror.jobs.validate.report import ReaderReport
from delta_mirror.jobs.validate.rows import expected_rows
from delta_mirror.jobs.validate.schema_diff import schema_diffs
from delta_mirror.storage import local_path, normalize_location
from delta_mirror.store.sql_store import SqlStore, TableInfo

_BATCH = 200  # versions per JVM
_HINT = (
    "delta-kernel-java sees the published table differently from SQL: a commit or checkpoint file was "
    "changed after publishing, or the mirror renders an action this reader reads differently; look for "
    "hash_mismatch problems and compare with --reader spark"
)


class KernelJavaCheck:
    """Walk ``lo..hi`` with delta-kernel-java and compare every version with the store."""

    def __init__(self, store: SqlStore, table: TableInfo, report: ReaderReport) -> None:
        folder = local_path(normalize_location(table.location))
        if folder is None:  # readers.reader_for refuses such a table before
            raise ValueError(f"KernelJavaCheck reads local tables only, not {table.location}")
        self.store, self.table, self.folder = store, table, folder
        self.out = report

    def report(self, kind: str, version: int, message: str, hint: str = _HINT) -> None:
        self.out.problem(kind, version, message, hint)

    def run(self, lo: int, hi: int) -> None:
        from delta_mirror.jobs.validate import kernel_java as kj
        from delta_mirror.jobs.validate.reader_view import StoreState

        state = StoreState(self.store, self.table, lo, with_records=True)
        lines = self.store.commit_lines(self.table.id, lo + 1, hi) if hi > lo else {}
        for start in range(lo, hi + 1, _BATCH):
            versions = list(range(start, min(hi, start + _BATCH - 1) + 1))
            # reading rows needs the data files: a table whose files are gone is still checked, without rows
            count = all((self.folder / unquote(path)).exists() for path, _ in state.files)
            try:
                views = kj.read_versions_with_kernel_java(str(self.folder), versions, count_rows=count)
            except kj.ReaderUnavailable as exc:
                raise PermanentError(exc.message, table=self.table.name, hint=exc.hint) from exc
            except kj.ReaderFailure as exc:
                self.report("reader_error", start, str(exc.message), "see the log problems reported with it")
                return
            for version in versions:
                if version > lo:
                    state.apply(lines.get(version, []))
                self.compare(version, views[version], state)

    def compare(self, version: int, view: Any, state: Any) -> None:
        from delta_mirror.jobs.validate import kernel_java as kj

        if isinstance(view, kj.ReaderLimitation):
            self.out.limitation(version, str(view.message))
            return
        if isinstance(view, kj.ReaderError):
            self.report("reader_error", version, str(view.message), "see the log problems reported with it")
            return
        at = f"at version {version}"
        if view.version != version:
            self.report(
                "reader_version", version, f"delta-kernel-java loaded version {view.version} for {version}"
            )
            return
        self._compare_log(version, view, state, at)
        self._compare_files(version, view, state, at)

    def _compare_log(self, version: int, view: Any, state: Any, at: str) -> None:
        """Protocol, table id, partition columns and schema."""
        p, md = state.protocol, state.metadata
        expected = (
            p.get("minReaderVersion"),
            p.get("minWriterVersion"),
            tuple(sorted(p["readerFeatures"])) if "readerFeatures" in p else None,
            tuple(sorted(p["writerFeatures"])) if "writerFeatures" in p else None,
            md.get("id"),
            tuple(md.get("partitionColumns") or ()),
        )
        vp = view.protocol
        found = (
            vp.min_reader_version,
            vp.min_writer_version,
            vp.reader_features,
            vp.writer_features,
            view.table_id,
            view.partition_columns,
        )
        if found != expected:
            self.report(
                "reader_protocol",
                version,
                f"{at}: delta-kernel-java sees (reader, writer, reader features, writer features, table id, "
                f"partition columns) {found}; the store {expected}",
            )
        diffs = schema_diffs(json.loads(md.get("schemaString") or "{}"), json.loads(view.schema), "")
        if diffs:
            self.report(
                "reader_schema",
                version,
                f"{at}: schema differs (store vs kernel-java): " + "; ".join(diffs[:5]),
            )

    def _compare_files(self, version: int, view: Any, state: Any, at: str) -> None:
        """Active files, then the row count the data gave."""
        found = set(view.files)  # already decoded, as the names on storage
        store_files = {unquote(path) for path, _ in state.files}
        if found != store_files:
            lost, extra = sorted(store_files - found), sorted(found - store_files)
            self.report(
                "reader_files",
                version,
                f"{at}: delta-kernel-java sees {len(found)} active files, the store {len(store_files)}"
                + (f"; {len(lost)} missing (e.g. {lost[0]})" if lost else "")
                + (f"; {len(extra)} not in the store (e.g. {extra[0]})" if extra else ""),
            )
            return
        expected = expected_rows(state.row_inputs(), lambda p: (Path(self.folder) / unquote(p)).exists())
        if view.row_count is not None and expected is not None and view.row_count != expected:
            self.report(
                "reader_rows",
                version,
                f"{at}: delta-kernel-java counts {view.row_count} rows, the store's stats say {expected}",
            )


__all__ = ["KernelJavaCheck"]
