"""Validation with DuckDB's ``delta`` extension as the reader (``validate --reader duckdb``).

The extension is delta-kernel-rs inside DuckDB, an implementation independent of deltalake's
table provider and of Delta-Spark. It is loaded from the ``duckdb-extension-delta`` package (a
file on disk: no extension server is needed). For each version of the range:

- version: ``delta_scan(..., version => v)`` refuses a version the log does not reach (DuckDB
  exposes no version number, so "loads exactly v" is what is checked);
- active files: ``delta_list_files`` against the store's file index, and which of them carry a
  deletion vector;
- schema: the column names and types DuckDB reads, against the store's ``schemaString`` rendered
  as DuckDB types (nullability and field metadata are not exposed);
- rows: ``count(*)`` against the store's ``numRecords`` stats minus deletion-vector cardinalities,
  when every active file exists and has stats.

Not exposed by DuckDB, so not checked: the protocol, the rest of ``metaData``, ``txn`` versions.
Local tables only (reading S3 needs DuckDB's httpfs extension and a secret).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from delta_mirror.errors import PermanentError, first_line
from delta_mirror.extras import require
from delta_mirror.jobs.validate.limits import judge_dv_failure, unsupported_feature
from delta_mirror.jobs.validate.report import Limitation, Problem, ReaderReport
from delta_mirror.jobs.validate.rows import expected_rows
from delta_mirror.storage import local_path, normalize_location
from delta_mirror.store.sql_store import SqlStore, TableInfo

_HINT = (
    "DuckDB (delta-kernel-rs) sees the published table differently from SQL: a commit or checkpoint "
    "file was changed after publishing, or the mirror renders an action this reader reads "
    "differently; look for hash_mismatch problems and compare with --reader spark"
)
_ERROR_HINT = (
    "DuckDB could not load this version of the published log: see the log problems reported with "
    "it; if the log is intact, compare with --reader spark"
)


class DuckDBUnavailable(PermanentError):
    """The delta extension has no build for the installed duckdb (a missing one: ``MissingExtraError``)."""


_database: Any = None  # one in-memory DuckDB per process, the extension loaded once


def connect() -> Any:
    """A DuckDB connection with the delta extension loaded from its PyPI package's file.

    Connections share one in-memory database per process, so the extension (~80 MB) loads once;
    each caller gets its own cursor (DuckDB connections are not shared across threads).
    """
    global _database
    if _database is None:
        require("duckdb", "duckdb", "the duckdb reader")
        require("duckdb_extension_delta", "duckdb", "the duckdb reader")
        import duckdb
        import duckdb_extension_delta

        folder = Path(duckdb_extension_delta.__file__).parent / "extensions" / f"v{duckdb.__version__}"
        ext = folder / "delta.duckdb_extension"
        if not ext.exists():
            raise DuckDBUnavailable(
                f"duckdb-extension-delta has no extension for duckdb {duckdb.__version__} ({ext} is missing)",
                hint="install the same version of duckdb and duckdb-extension-delta (requirements.txt pins both)",
            )
        con = duckdb.connect(config={"autoinstall_known_extensions": "false"})
        con.execute(f"LOAD '{_quote(str(ext))}'")
        _database = con
    return _database.cursor()


@dataclass(frozen=True)
class DuckDBView:
    """What DuckDB sees at one version (paths relative to the table root, decoded)."""

    files: frozenset[str]
    with_dv: frozenset[str]
    columns: tuple[tuple[str, str], ...]  # (name, DuckDB type)
    rows: int | None  # None when not counted


def read_with_duckdb(con: Any, folder: str, version: int | None = None, *, count: bool = True) -> DuckDBView:
    """DuckDB's view of the table in ``folder`` (a local path) at ``version`` (default: latest)."""
    args = f"'{_quote(folder)}'" + ("" if version is None else f", version => {int(version)}")
    listed = con.execute(f"SELECT data_file, have_deletes FROM delta_list_files({args})").fetchall()
    root = folder.rstrip("/") + "/"
    files = {_rel(p, root): bool(d) for p, d in listed}
    columns = tuple(
        (str(r[0]), str(r[1])) for r in con.execute(f"DESCRIBE SELECT * FROM delta_scan({args})").fetchall()
    )
    rows = int(con.execute(f"SELECT count(*) FROM delta_scan({args})").fetchone()[0]) if count else None
    return DuckDBView(frozenset(files), frozenset(p for p, d in files.items() if d), columns, rows)


def duckdb_type(typ: Any) -> str:
    """A Delta schema type as DuckDB names it (``long`` → ``BIGINT``, struct → ``STRUCT(a INTEGER)``)."""
    if isinstance(typ, str):
        t = typ.replace(" ", "").lower()
        if t.startswith("decimal"):
            return t.upper()
        return _PRIMITIVES.get(t, t.upper())
    if not isinstance(typ, dict):
        return repr(typ)
    kind = typ.get("type")
    if kind == "struct":
        inner = ", ".join(f"{f.get('name')} {duckdb_type(f.get('type'))}" for f in typ.get("fields") or [])
        return f"STRUCT({inner})"
    if kind == "array":
        return f"{duckdb_type(typ.get('elementType'))}[]"
    if kind == "map":
        return f"MAP({duckdb_type(typ.get('keyType'))}, {duckdb_type(typ.get('valueType'))})"
    return json.dumps(typ)


_PRIMITIVES = {
    "byte": "TINYINT",
    "short": "SMALLINT",
    "integer": "INTEGER",
    "long": "BIGINT",
    "float": "FLOAT",
    "double": "DOUBLE",
    "boolean": "BOOLEAN",
    "string": "VARCHAR",
    "binary": "BLOB",
    "date": "DATE",
    "timestamp": "TIMESTAMP WITH TIME ZONE",
    "timestamp_ntz": "TIMESTAMP",
    "variant": "VARIANT",
}


def schema_columns(schema_string: str | None) -> tuple[tuple[str, str], ...]:
    """The store's schema as DuckDB would list it: (name, DuckDB type) per top-level column."""
    fields = json.loads(schema_string or "{}").get("fields") or []
    return tuple((str(f.get("name")), duckdb_type(f.get("type"))) for f in fields)


def column_diffs(expected: tuple[tuple[str, str], ...], found: tuple[tuple[str, str], ...]) -> list[str]:
    """Differences in column names, order and types (quoting and spacing aside)."""
    if [n for n, _ in expected] != [n for n, _ in found]:
        return [f"columns {[n for n, _ in expected]} vs {[n for n, _ in found]}"]
    return [
        f"{name}: type {e} vs {f}"
        for (name, e), (_, f) in zip(expected, found, strict=True)
        if _norm(e) != _norm(f)
    ]


def _norm(text: str) -> str:
    return text.replace('"', "").replace(" ", "").upper()


def _quote(text: str) -> str:
    return text.replace("'", "''")


def _rel(path: str, root: str) -> str:
    text = path[len("file://") :] if path.startswith("file://") else path
    return unquote(text[len(root) :] if text.startswith(root) else text)


class DuckDBCheck:
    """Walk ``lo..hi`` with DuckDB and compare every version with the store."""

    def __init__(
        self,
        store: SqlStore,
        table: TableInfo,
        report: ReaderReport,
        *,
        con: Any = None,
    ) -> None:
        folder = local_path(normalize_location(table.location))
        if folder is None:  # readers.reader_for refuses such a table before
            raise ValueError(f"DuckDBCheck reads local tables only, not {table.location}")
        self.store, self.table, self.folder = store, table, str(folder)
        self.out = report
        self.con = con

    def run(self, lo: int, hi: int) -> None:
        if self.con is None:
            self.con = connect()
        from delta_mirror.jobs.validate.reader_view import StoreState  # one incremental store view

        state = StoreState(self.store, self.table, lo, with_records=True)
        lines = self.store.commit_lines(self.table.id, lo + 1, hi) if hi > lo else {}
        for version in range(lo, hi + 1):
            if version > lo:
                state.apply(lines.get(version, []))
            self._compare(version, state)

    def _compare(self, version: int, state: Any) -> None:
        at = f"at version {version}"
        exists: Callable[[str], bool] = lambda p: (Path(self.folder) / unquote(p)).exists()  # noqa: E731
        expected = expected_rows(state.row_inputs(), exists)
        try:
            view = read_with_duckdb(self.con, self.folder, version, count=expected is not None)
        except Exception as exc:
            self._failed(version, first_line(exc, 500, joined=True), state, exists)
            return
        store_files = {unquote(path) for path, _ in state.files}
        store_dv = {unquote(path) for path, dv in state.files if dv}
        if view.files != store_files or view.with_dv != store_dv:
            lost, extra = sorted(store_files - view.files), sorted(view.files - store_files)
            parts = [f"{at}: DuckDB sees {len(view.files)} active files, the store {len(store_files)}"]
            if lost:
                parts.append(f"{len(lost)} missing from DuckDB (e.g. {lost[0]})")
            if extra:
                parts.append(f"{len(extra)} not in the store (e.g. {extra[0]})")
            if view.with_dv != store_dv:
                parts.append(
                    f"DuckDB sees {len(view.with_dv)} files with a deletion vector, the store {len(store_dv)}"
                )
            self._report("reader_files", version, "; ".join(parts), _HINT)
        diffs = column_diffs(schema_columns(state.metadata.get("schemaString")), view.columns)
        if diffs:
            self._report(
                "reader_schema",
                version,
                f"{at}: schema differs (store vs duckdb): " + "; ".join(diffs[:5]),
                _HINT,
            )
        if expected is not None and view.rows != expected:
            self._report(
                "reader_rows",
                version,
                f"{at}: DuckDB counts {view.rows} rows, the store's stats say {expected}",
                "numRecords stats or deletion vectors in the log disagree with the data files; the stats "
                "were written by the table's writer: check the add actions of the listed version",
            )

    def _failed(self, version: int, error: str, state: Any, exists: Callable[[str], bool]) -> None:
        verdict: Problem | Limitation | None = unsupported_feature(self.out.reader, version, error)
        if verdict is None and "deletion" in error.lower() and state.dvs:
            verdict = judge_dv_failure(
                self.out.reader, version, error, [(k[0], d) for k, d in state.dvs.items()], exists
            )
        if verdict is None:
            verdict = Problem(
                "reader_error", version, f"DuckDB cannot load version {version}: {error}", _ERROR_HINT
            )
        self.out.add(verdict)

    def _report(self, kind: str, version: int | None, message: str, hint: str) -> None:
        self.out.problem(kind, version, message, hint)


__all__ = [
    "DuckDBCheck",
    "DuckDBUnavailable",
    "DuckDBView",
    "connect",
    "duckdb_type",
    "read_with_duckdb",
]
