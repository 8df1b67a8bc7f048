"""SQLite, the zero-setup default: one short ``BEGIN IMMEDIATE`` transaction per commit
(``sqlite_commit``), bulk rows by ``executemany`` and ``json_each``, no notifications."""

from __future__ import annotations

import sqlite3

from delta_mirror.store.backends import Backend
from delta_mirror.store.bulk_load import BulkImport
from delta_mirror.store.commit_writer import SqliteShortTransaction

BACKEND = Backend(
    name="sqlite",
    integer_division="/",
    placeholder="?",
    notifies=False,
    autocommit_reads=False,
    joined_lines=None,
    raw_cursor_reads=True,
    arrow_blocks=False,
    update_from=sqlite3.sqlite_version_info >= (3, 33),
    update_join=False,
    copies=False,
    writer=SqliteShortTransaction,
    bulk_import=BulkImport,
)

__all__ = ["BACKEND"]
