"""Validation with delta-kernel-java as the reader (``validate --reader kernel-java``).

The reading itself is ``kernel_java.read_with_kernel_java`` (a small Java program on the Delta
kernel, the library Trino, Flink and others build on); this module compares its view of each
version with the store's: version, schema, active files and row count.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from delta_mirror.errors import PermanentError
from delta_mirror.jobs.validate.limits import USE_INSTEAD, unsupported_feature
from delta_mirror.jobs.validate.report import MAX_PROBLEMS_PER_KIND, Limitation, Problem
from delta_mirror.jobs.validate.rows import expected_rows
from delta_mirror.jobs.validate.schema_diff import schema_diffs
from delta_mirror.storage import local_path, normalize_location
from delta_mirror.store.sql_store import SqlStore, TableInfo

_HINT = (
    "delta-kernel-java sees the published table differently from SQL: a commit or checkpoint file was "
    "changed after publishing, or the mirror renders an action this reader reads differently; look for "
    "hash_mismatch problems and compare with --reader spark"
)


def _field(view: Any, *names: str) -> Any:
    for name in names:
        if hasattr(view, name):
            return getattr(view, name)
    return None


def kernel_java_check(
    store: SqlStore,
    table: TableInfo,
    lo: int,
    hi: int,
    problems: list[Problem],
    limitations: list[Limitation],
) -> None:
    """Compare delta-kernel-java's view of versions ``lo..hi`` with the store."""
    try:
        kernel_java: Any = importlib.import_module("delta_mirror.jobs.validate.kernel_java")
    except ImportError as exc:
        raise PermanentError(
            "the kernel-java reader is not part of this installation",
            table=table.name,
            hint="use --reader spark, duckdb or deltalake",
        ) from exc
    folder = local_path(normalize_location(table.location))
    if folder is None:
        raise PermanentError(
            f"the kernel-java reader reads local tables, not {table.location}",
            table=table.name,
            hint="use --reader deltalake or --reader spark for this table",
        )
    from delta_mirror.jobs.validate.reader_view import StoreState

    counts: dict[str, int] = {}

    def report(kind: str, version: int, message: str, hint: str = _HINT) -> None:
        n = counts[kind] = counts.get(kind, 0) + 1
        if n <= MAX_PROBLEMS_PER_KIND:
            problems.append(Problem(kind, version, message, hint))

    state = StoreState(store, table, lo, with_records=True)
    lines = store.commit_lines(table.id, lo + 1, hi) if hi > lo else {}
    for version in range(lo, hi + 1):
        if version > lo:
            state.apply(lines.get(version, []))
        at = f"at version {version}"
        try:
            view = kernel_java.read_with_kernel_java(table.location, version)
        except kernel_java.ReaderUnavailable as exc:
            raise PermanentError(str(exc), table=table.name, hint="use --reader spark or duckdb") from exc
        except kernel_java.ReaderLimitation as exc:
            limitations.append(
                unsupported_feature("kernel-java", version, f"not supported: {exc}")
                or Limitation("kernel-java", version, str(exc), USE_INSTEAD["kernel-java"])
            )
            continue
        except kernel_java.ReaderFailure as exc:
            report("reader_error", version, f"delta-kernel-java cannot load version {version}: {exc}")
            continue
        found_version = _field(view, "version")
        if found_version is not None and found_version != version:
            report(
                "reader_version", version, f"delta-kernel-java loaded version {found_version} for {version}"
            )
            continue
        schema = _field(view, "schema", "schema_json", "schema_string")
        if schema is not None:
            found = json.loads(schema) if isinstance(schema, str) else schema
            diffs = schema_diffs(json.loads(state.metadata.get("schemaString") or "{}"), found, "")
            if diffs:
                report(
                    "reader_schema",
                    version,
                    f"{at}: schema differs (store vs kernel-java): " + "; ".join(diffs[:5]),
                )
        files = _field(view, "files", "paths", "file_paths")
        if files is not None:
            root = str(folder).rstrip("/") + "/"
            found_files = {
                unquote(f[len(root) :] if f.startswith(root) else f) for f in (unquote(str(p)) for p in files)
            }
            store_files = {unquote(path) for path, _ in state.files}
            if found_files != store_files:
                lost, extra = sorted(store_files - found_files), sorted(found_files - store_files)
                report(
                    "reader_files",
                    version,
                    f"{at}: delta-kernel-java sees {len(found_files)} active files, the store {len(store_files)}"
                    + (f"; {len(lost)} missing (e.g. {lost[0]})" if lost else "")
                    + (f"; {len(extra)} not in the store (e.g. {extra[0]})" if extra else ""),
                )
        rows = _field(view, "rows", "row_count", "num_rows")
        expected = expected_rows(state.row_inputs(), lambda p: (Path(folder) / unquote(p)).exists())
        if rows is not None and expected is not None and rows != expected:
            report(
                "reader_rows",
                version,
                f"{at}: delta-kernel-java counts {rows} rows, the store's stats say {expected}",
            )


__all__ = ["kernel_java_check"]
