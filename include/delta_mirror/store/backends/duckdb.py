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


BACKEND = Backend(
    name="duckdb",
    integer_division="/",
    placeholder="?",
    notifies=False,
    autocommit_reads=False,
    copies=False,
    writer=TransactionOnly,
    bulk_import=_bulk_import,
)

__all__ = ["BACKEND"]
