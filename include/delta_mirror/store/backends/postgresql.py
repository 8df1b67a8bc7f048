"""PostgreSQL: one statement per commit (``pg_commit``, run by ``pg_exec``) and its ``NOTIFY``,
``COPY`` for an import's rows, single reads without a transaction."""

from __future__ import annotations

from delta_mirror.store.backends import Backend
from delta_mirror.store.bulk_load import BulkImport
from delta_mirror.store.commit_writer import PgOneStatement

# One row per version: the server joins the lines (payloads hold no raw newline).
_JOINED_LINES = (
    "SELECT version, string_agg(payload, E'\\n' ORDER BY seq) FROM dl_actions "
    "WHERE table_id = %s AND part = %s AND version BETWEEN %s AND %s GROUP BY version"
)

BACKEND = Backend(
    name="postgresql",
    integer_division="/",
    placeholder="%s",
    notifies=True,
    autocommit_reads=True,
    joined_lines=_JOINED_LINES,
    raw_cursor_reads=False,
    arrow_blocks=False,
    update_from=True,
    update_join=False,
    copies=True,
    writer=PgOneStatement,
    bulk_import=BulkImport,
)

__all__ = ["BACKEND"]
