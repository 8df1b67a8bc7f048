"""SQLite, the zero-setup default: WAL and a busy timeout so writers queue instead of failing, one
short ``BEGIN IMMEDIATE`` transaction per commit (``sqlite_commit``), bulk rows by ``executemany``
and ``json_each``, no notifications; errors by SQLite's error codes."""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.exc import DBAPIError, OperationalError, SQLAlchemyError

from delta_mirror.config import redact_url
from delta_mirror.errors import MirrorError, PermanentError, TransientError
from delta_mirror.store.backends import Backend, not_initialised
from delta_mirror.store.bulk_load import BulkImport
from delta_mirror.store.commit_writer import SqliteShortTransaction
from delta_mirror.store.db import READ_ONLY

if TYPE_CHECKING:
    from sqlalchemy.engine import URL


_IN_MEMORY = (None, "", ":memory:")


class SQLite(Backend):
    name = "sqlite"
    raw_cursor_reads = True
    update_from = sqlite3.sqlite_version_info >= (3, 33)
    writer = SqliteShortTransaction
    bulk_import = BulkImport

    def engine(self, url: URL, text: str) -> Engine:
        if url.database not in _IN_MEMORY:
            folder = Path(str(url.database)).expanduser().parent
            try:
                folder.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise PermanentError(
                    f"cannot create the folder {folder} of the SQLite store: {exc.strerror or exc}",
                    hint="point --store (or DELTA_MIRROR_HOME) at a writable folder",
                ) from None
        engine = create_engine(url, connect_args={"timeout": 60})
        event.listen(engine, "connect", _pragmas)
        event.listen(engine, "begin", _begin)
        return engine

    def shared(self, url: URL) -> bool:
        return url.database not in _IN_MEMORY  # each engine on ":memory:" is a database of its own

    def classify_error(self, exc: SQLAlchemyError, url: str, action: str) -> MirrorError | None:
        code = _code(exc)
        where = redact_url(url)
        if code in ("SQLITE_BUSY", "SQLITE_LOCKED") or (
            isinstance(exc, OperationalError) and "locked" in str(exc)
        ):
            return TransientError(f"SQLite store busy while {action} ({where})", hint="retried automatically")
        if isinstance(exc, OperationalError) and "no such table" in str(exc):
            return not_initialised(where)
        return None

    def is_unique_violation(self, exc: SQLAlchemyError) -> bool:
        code = _code(exc)  # SQLite has no SQLSTATE; Python 3.11+ names the code
        if code:
            return code in ("SQLITE_CONSTRAINT_UNIQUE", "SQLITE_CONSTRAINT_PRIMARYKEY")
        return isinstance(exc, DBAPIError) and (
            re.search(r"UNIQUE|PRIMARY KEY", str(exc.orig), re.IGNORECASE) is not None
        )


def _code(exc: SQLAlchemyError) -> str:
    return str(getattr(getattr(exc, "orig", None), "sqlite_errorname", ""))


def _pragmas(dbapi_conn: Any, _record: Any) -> None:
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.close()
    dbapi_conn.isolation_level = None  # the driver's own BEGINs off: ``_begin`` says which


def _begin(conn: Connection) -> None:
    """Writers take the write lock up front: two writers queue on the busy timeout instead of
    failing late with "database is locked" on lock upgrade. Readers (``db.reader(engine)``) begin
    deferred: under WAL they read a snapshot and must not block writers."""
    conn.exec_driver_sql("BEGIN" if conn.get_execution_options().get(READ_ONLY) else "BEGIN IMMEDIATE")


BACKEND = SQLite()

__all__ = ["BACKEND", "SQLite"]
