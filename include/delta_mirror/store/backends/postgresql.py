"""PostgreSQL: one statement per commit (``pg_commit``, run by ``pg_exec``) and its ``NOTIFY``,
``COPY`` for an import's rows, single reads without a transaction."""

from __future__ import annotations

from delta_mirror.store.backends import Backend
from delta_mirror.store.bulk_load import BulkImport
from delta_mirror.store.commit_writer import PgOneStatement

BACKEND = Backend(
    name="postgresql",
    integer_division="/",
    placeholder="%s",
    notifies=True,
    autocommit_reads=True,
    copies=True,
    writer=PgOneStatement,
    bulk_import=BulkImport,
)

__all__ = ["BACKEND"]
