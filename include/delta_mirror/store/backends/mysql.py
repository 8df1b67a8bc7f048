"""MySQL 8 / MariaDB 10.11 (``mysql_store``: engine, session checks, errors): every commit by the
transaction path, an import's rows by large multi-row INSERTs (``mysql_bulk``), ``DIV`` for
integer division."""

from __future__ import annotations

from typing import TYPE_CHECKING

from delta_mirror.store.backends import Backend
from delta_mirror.store.commit_writer import TransactionOnly

if TYPE_CHECKING:
    from sqlalchemy import Connection

    from delta_mirror.store.bulk_load import BulkImport


def _bulk_import(conn: Connection, table_id: int) -> BulkImport:
    from delta_mirror.store.mysql_bulk import MySqlBulkImport

    return MySqlBulkImport(conn, table_id)


BACKEND = Backend(
    name="mysql",
    integer_division="DIV",
    placeholder="%s",
    notifies=False,
    autocommit_reads=False,
    joined_lines=None,
    raw_cursor_reads=False,
    arrow_blocks=False,
    update_from=True,
    update_join=True,
    copies=False,
    writer=TransactionOnly,
    bulk_import=_bulk_import,
)

__all__ = ["BACKEND"]
