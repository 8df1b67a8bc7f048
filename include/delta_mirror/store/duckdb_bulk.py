"""An import's rows written in bulk on DuckDB: the rows ``BulkImport`` writes, as Arrow columns.

DuckDB stores a registered Arrow table with one ``INSERT ... SELECT`` in C (its executemany runs
one statement per row, and it has no COPY FROM STDIN or json_each). ``dl_files.id`` is given
explicitly, from a block of the table's sequence taken up front: the ids then follow the rows'
order exactly as on the other databases (the reference import compares them), and the rows sent
while open and closed later are updated by id.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import pyarrow as pa

from delta_mirror.store.bulk_load import BulkImport
from delta_mirror.store.file_index import FILE_COLUMNS, RV

_VIEW = "delta_mirror_bulk_rows"
_INT = pa.int64()
_TEXT = pa.large_string()
# dl_files columns of ``FileIndex.rows``, each with its Arrow type.
_FILE_TYPES = (_TEXT, _TEXT, _INT, _INT, _INT, _INT, _INT, _INT, _INT, _TEXT, _INT)
_CLOSED = ("remove_version", "remove_part", "remove_seq", "deletion_timestamp")


class DuckDBBulkImport(BulkImport):
    """``BulkImport`` whose rows go to DuckDB as Arrow tables (the same rows, ids included)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._open_ids: dict[int, int] = {}  # id() of an open row sent -> its dl_files.id

    def _close_sent_files(self, closed: list[list[Any]]) -> None:
        """The file rows sent open and removed since: one UPDATE by id from an Arrow table."""
        if closed:
            positions = [FILE_COLUMNS.index(c) for c in _CLOSED]
            data = {"id": [self._open_ids[id(row)] for row in closed]}
            data.update({c: [row[i] for row in closed] for c, i in zip(_CLOSED, positions, strict=True)})
            sets = ", ".join(f"{c} = x.{c}" for c in _CLOSED)
            self._through_arrow(
                data,
                {c: _INT for c in data},
                f"UPDATE dl_files SET {sets} FROM {_VIEW} AS x WHERE dl_files.id = x.id",
                fallback=None,
            )

    def _flush_actions(self) -> None:
        versions: list[int] = []
        parts: list[int] = []
        seqs: list[int] = []
        kinds_out: list[str] = []
        payloads: list[str] = []
        for version, part, first, kinds, lines in self._actions:
            n = len(lines)
            if len(kinds) != n:
                raise ValueError(f"version {version}: {n} lines but {len(kinds)} action types")
            versions += [version] * n
            parts += [part] * n
            seqs.extend(range(first, first + n))
            kinds_out += kinds
            payloads += lines
        if payloads:
            self._append(
                "dl_actions",
                {
                    "table_id": [self.table_id] * len(payloads),
                    "version": versions,
                    "part": parts,
                    "seq": seqs,
                    "action_type": kinds_out,
                    "payload": payloads,
                },
                {"action_type": _TEXT, "payload": _TEXT},
            )
        self._actions, self._buffered = [], 0

    def _send_files(self, upto: int | None = None) -> None:
        rows = self.index.rows[self._files_sent : upto]
        if not rows:
            return
        ids = self._reserve_ids(len(rows))
        data: dict[str, list[Any]] = {"id": ids, "table_id": [self.table_id] * len(rows)}
        for i, column in enumerate(FILE_COLUMNS):
            data[column] = [row[i] for row in rows]
        types = {"id": _INT, "table_id": _INT, **dict(zip(FILE_COLUMNS, _FILE_TYPES, strict=True))}
        self._append("dl_files", data, types)
        for row, file_id in zip(rows, ids, strict=True):
            if row[RV] is None:
                self._sent_open.append(row)
                self._open_ids[id(row)] = file_id
        self._files_sent += len(rows)

    def _write(self, table: str, columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
        rows = list(rows)
        if rows:
            self._append(table, {c: [row[i] for row in rows] for i, c in enumerate(columns)}, {})

    def _reserve_ids(self, n: int) -> list[int]:
        """``n`` consecutive ids of ``dl_files_id_seq``: nothing else takes ids meanwhile (the
        import holds the file's write lock, and only this process opens the file)."""
        last = self.conn.exec_driver_sql(
            "SELECT max(nextval('dl_files_id_seq')) FROM range(?)", (n,)
        ).scalar()
        assert last is not None
        return list(range(int(last) - n + 1, int(last) + 1))

    def _append(self, table: str, data: dict[str, list[Any]], types: dict[str, pa.DataType]) -> None:
        columns = ", ".join(data)
        self._through_arrow(
            data, types, f"INSERT INTO {table} ({columns}) SELECT {columns} FROM {_VIEW}", fallback=table
        )

    def _through_arrow(
        self, data: dict[str, list[Any]], types: dict[str, pa.DataType], sql: str, *, fallback: str | None
    ) -> None:
        """Run ``sql`` over ``data`` registered as an Arrow table. A value Arrow cannot hold in its
        column (a bool where an integer belongs, an integer beyond int64) goes row by row through
        ``INSERT`` (``fallback``: the table), where DuckDB refuses it as the other databases do."""
        try:
            arrow = pa.table({c: pa.array(v, type=types.get(c)) for c, v in data.items()})
        except (pa.ArrowException, TypeError, ValueError, OverflowError):
            if fallback is None:
                raise
            rows: list[Sequence[Any]] = list(zip(*data.values(), strict=True))
            self._insert(fallback, list(data), rows)
            return
        raw = self.conn.connection.driver_connection
        assert raw is not None
        raw.register(_VIEW, arrow)
        try:
            self.conn.exec_driver_sql(sql)
        finally:
            raw.unregister(_VIEW)


__all__ = ["DuckDBBulkImport"]
