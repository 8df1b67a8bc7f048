"""The SQL store: the authority for every table's Delta log (SQLAlchemy 2 Core + Alembic).

``SqlStore`` (``sql_store.py``) is one facade over a module per topic: tables and leases,
commits (native, verbatim, import), reads, mirror status, lag history and circuit-breaker rows.
All of the package's SQL lives in this folder (``schema.py`` names the tables, ``states.py`` the
values of their state columns).
"""

from __future__ import annotations

from delta_mirror.store.sql_store import FileEntry, Snapshot, SqlStore, StatusRow, TableInfo
from delta_mirror.store.states import Artifact, PublishState, TableState

__all__ = [
    "Artifact",
    "FileEntry",
    "PublishState",
    "Snapshot",
    "SqlStore",
    "StatusRow",
    "TableInfo",
    "TableState",
]
