"""The SQL store: the authority for every table's Delta log (SQLAlchemy 2 Core + Alembic)."""

from __future__ import annotations

from delta_mirror.store.sql_store import FileEntry, Snapshot, SqlStore, StatusRow, TableInfo

__all__ = ["FileEntry", "Snapshot", "SqlStore", "StatusRow", "TableInfo"]
