"""An import's rows written in bulk on MySQL/MariaDB: the rows ``BulkImport`` writes, as multi-row
``INSERT``s of several MiB each.

PyMySQL's ``executemany`` of an ``INSERT ... VALUES`` sends one statement per batch of rows (up to
the cursor's ``max_stmt_length``); it is raised here to a few MiB, below the server's
``max_allowed_packet``. The file rows sent while open and removed later are closed at the end with
one ``UPDATE ... JOIN`` against a temporary table of their new values (not one UPDATE per row).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from delta_mirror.store.bulk_load import _ACTION_COLUMNS, BulkImport
from delta_mirror.store.file_index import F_AP, F_AS, F_AV, F_DT, F_DV, F_PATH, F_RP, F_RS, FILE_COLUMNS, RV

_STATEMENT_BYTES = 8 << 20  # one INSERT's size, at most half the server's max_allowed_packet
_CLOSED_TABLE = "delta_mirror_closed_files"  # the statements below spell it out
_DROP_CLOSED = "DROP TEMPORARY TABLE IF EXISTS delta_mirror_closed_files"


class MySqlBulkImport(BulkImport):
    """``BulkImport`` whose rows go to MySQL/MariaDB as large multi-row INSERTs (the same rows)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        packet = self.conn.exec_driver_sql("SELECT @@max_allowed_packet").scalar()
        self._statement_bytes = max(1 << 20, min(_STATEMENT_BYTES, int(packet or 0) // 2))

    def _close_sent_files(self, closed: list[list[Any]]) -> None:
        """The file rows sent open and removed since: one UPDATE by (path, deletion vector, add
        position), unique among a table's add rows, joined to a temporary table of them."""
        if not closed:
            return
        conn = self.conn
        conn.exec_driver_sql(_DROP_CLOSED)
        conn.exec_driver_sql(
            "CREATE TEMPORARY TABLE delta_mirror_closed_files (path LONGTEXT, dv_id LONGTEXT, av BIGINT,"
            " ap SMALLINT, aseq INT, rv BIGINT, rp SMALLINT, rs INT, dt BIGINT) CHARACTER SET utf8mb4"
        )
        try:
            self._insert(
                _CLOSED_TABLE,
                ("path", "dv_id", "av", "ap", "aseq", "rv", "rp", "rs", "dt"),
                [
                    (r[F_PATH], r[F_DV], r[F_AV], r[F_AP], r[F_AS], r[RV], r[F_RP], r[F_RS], r[F_DT])
                    for r in closed
                ],
            )
            conn.exec_driver_sql(
                "UPDATE dl_files f JOIN delta_mirror_closed_files x ON f.table_id = %s AND f.path = x.path"
                " AND f.dv_id = x.dv_id AND f.add_version = x.av AND f.add_part = x.ap AND f.add_seq = x.aseq"
                " SET f.remove_version = x.rv, f.remove_part = x.rp, f.remove_seq = x.rs,"
                " f.deletion_timestamp = x.dt",
                (self.table_id,),
            )
        finally:
            conn.exec_driver_sql(_DROP_CLOSED)

    def _flush_actions(self) -> None:
        tid = self.table_id
        rows: list[Sequence[Any]] = []
        for version, part, first, kinds, lines in self._actions:
            if len(kinds) != len(lines):
                raise ValueError(f"version {version}: {len(lines)} lines but {len(kinds)} action types")
            rows += [
                (tid, version, part, seq, kind, line)
                for seq, (kind, line) in enumerate(zip(kinds, lines, strict=True), start=first)
            ]
        self._insert("dl_actions", _ACTION_COLUMNS, rows)
        self._actions, self._buffered = [], 0

    def _send_files(self, upto: int | None = None) -> None:
        rows = self.index.rows[self._files_sent : upto]
        if rows:
            tid = self.table_id
            self._insert("dl_files", ("table_id", *FILE_COLUMNS), [(tid, *row) for row in rows])
            self._sent_open += [row for row in rows if row[RV] is None]
            self._files_sent += len(rows)

    def _write(self, table: str, columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
        self._insert(table, columns, list(rows))

    def _insert(self, table: str, columns: Sequence[str], rows: list[Sequence[Any]]) -> None:
        """Multi-row INSERTs of up to ``_statement_bytes`` each, on the driver's cursor of the
        import's connection (its transaction)."""
        if not rows:
            return
        raw = self.conn.connection.driver_connection
        assert raw is not None
        marks = ", ".join("%s" for _ in columns)
        with raw.cursor() as cur:
            cur.max_stmt_length = self._statement_bytes
            cur.executemany(f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({marks})", rows)


__all__ = ["MySqlBulkImport"]
