"""DuckDB, one process per file (``duckdb_store``: engine, write queue, errors): every commit by
the transaction path, an import's rows as Arrow tables (``duckdb_bulk``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from delta_mirror.store.backends import Backend
from delta_mirror.store.commit_writer import TransactionOnly

if TYPE_CHECKING:
    from sqlalchemy import Connection

    from delta_mirror.store.bulk_load import BulkImport


def _bulk_import(conn: Connection, table_id: int) -> BulkImport:
    from delta_mirror.store.duckdb_bulk import DuckDBBulkImport

    return DuckDBBulkImport(conn, table_id)


# PostgreSQL's per-version join (chr(10): DuckDB has no E'' strings).
_JOINED_LINES = (
    "SELECT version, string_agg(payload, chr(10) ORDER BY seq) FROM dl_actions "
    "WHERE table_id = ? AND part = ? AND version BETWEEN ? AND ? GROUP BY version"
)

BACKEND = Backend(
    name="duckdb",
    integer_division="/",
    placeholder="?",
    notifies=False,
    autocommit_reads=False,
    joined_lines=_JOINED_LINES,
    raw_cursor_reads=False,
    arrow_blocks=True,
    update_from=True,
    update_join=False,
    copies=False,
    writer=TransactionOnly,
    bulk_import=_bulk_import,
)

__all__ = ["BACKEND"]
