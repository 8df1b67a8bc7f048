"""Engines, migrations and database error classification for the store."""

from __future__ import annotations

import os
import re
import select
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, create_engine, event, inspect
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import (
    ArgumentError,
    DBAPIError,
    DisconnectionError,
    OperationalError,
    SQLAlchemyError,
)

from delta_mirror.config import redact_url
from delta_mirror.errors import MirrorError, PermanentError, TransientError
from delta_mirror.extras import require
from delta_mirror.store.urls import canonical

MIGRATIONS = Path(__file__).parent / "migrations"

# SQLSTATE classes that are worth retrying: serialization failures, deadlocks, connection
# exceptions, and the server shutting down or starting up.
_TRANSIENT_SQLSTATES = ("40001", "40P01", "57P01", "57P02", "57P03", "53300")
_TRANSIENT_SQLSTATE_CLASSES = ("08",)


READ_ONLY = "delta_mirror_read_only"


def reader(engine: Engine) -> Engine:
    """The same engine and pool, for read-only work (on SQLite its transactions do not block writers)."""
    return engine.execution_options(**{READ_ONLY: True})


def make_engine(url: str) -> Engine:
    """An engine for ``url``; SQLite gets WAL and a busy timeout so writers queue, not fail."""
    url = canonical(url)  # libpq's multi-host H1:P1,H2:P2 form as SQLAlchemy's ?host=...&host=...
    try:
        parsed = make_url(url)
    except Exception as exc:
        raise PermanentError(
            f"store URL is not valid: {exc}",
            hint="use sqlite:///path, postgresql+psycopg://..., mysql+pymysql://... or duckdb:///path",
        ) from None
    if parsed.get_backend_name() == "sqlite":
        if parsed.database and parsed.database != ":memory:":
            folder = Path(parsed.database).expanduser().parent
            try:
                folder.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise PermanentError(
                    f"cannot create the folder {folder} of the SQLite store: {exc.strerror or exc}",
                    hint="point --store (or DELTA_MIRROR_HOME) at a writable folder",
                ) from None
        engine = create_engine(parsed, connect_args={"timeout": 60})

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.close()

        @event.listens_for(engine, "begin")
        def _sqlite_begin(conn: Connection) -> None:
            # Writers take the write lock up front: two writers queue on the busy timeout instead of
            # failing late with "database is locked" on lock upgrade. Readers (``reader(engine)``)
            # begin deferred: under WAL they read a snapshot and must not block writers.
            conn.exec_driver_sql(
                "BEGIN" if conn.get_execution_options().get(READ_ONLY) else "BEGIN IMMEDIATE"
            )

        @event.listens_for(engine, "connect")
        def _sqlite_autocommit_off(dbapi_conn: Any, _record: Any) -> None:
            dbapi_conn.isolation_level = None

        return engine
    if parsed.get_backend_name() == "duckdb":
        require("duckdb", "duckdb", "the DuckDB store")
        require("duckdb_engine", "duckdb", "the DuckDB store")
        from delta_mirror.store.duckdb_store import make_duckdb_engine

        return make_duckdb_engine(parsed, READ_ONLY)
    if parsed.get_backend_name() == "mysql":
        if parsed.drivername in ("mysql", "mysql+pymysql"):  # "mysql://" is PyMySQL here too
            require("pymysql", "mysql", "the MySQL/MariaDB store")
        from delta_mirror.store.mysql_store import make_mysql_engine

        return make_mysql_engine(parsed, url)
    if parsed.get_backend_name() == "postgresql":
        return _postgresql_engine(parsed, url)
    raise PermanentError(
        f"unsupported store backend '{parsed.get_backend_name()}'",
        hint="use sqlite:///path, postgresql+psycopg://user@host/db, mysql+pymysql://user@host/db"
        " or duckdb:///path",
    )


def _postgresql_engine(parsed: URL, url: str) -> Engine:
    """No pre-ping (a round trip per checkout, as many as a whole commit): a connection the server
    closed is found without one (``_closed_by_server``), and a commit that still finds its
    connection dead is tried once more (``dead_connection``)."""
    try:
        engine = create_engine(parsed, pool_pre_ping=False, connect_args={"connect_timeout": 10})
    except (ArgumentError, ValueError) as exc:  # e.g. a non-numeric port
        raise PermanentError(
            f"store URL {redact_url(url)} is not valid: {exc}",
            hint="use postgresql+psycopg://user@host:port/db",
        ) from None

    @event.listens_for(engine, "checkout")
    def _drop_closed(dbapi_conn: Any, _record: Any, _proxy: Any) -> None:
        if _closed_by_server(dbapi_conn):
            raise DisconnectionError("the server closed this pooled connection")  # the pool reconnects

    return engine


def _closed_by_server(dbapi_conn: Any) -> bool:
    """Whether the server closed this idle pooled connection, without a round trip: an idle
    connection's socket has nothing to read unless the server wrote to it since (a restart's or
    ``pg_terminate_backend``'s FATAL message, then end of file). Anything else it may have written
    (a parameter change report) only costs a new connection."""
    try:
        poller = select.poll()
        poller.register(dbapi_conn.fileno(), select.POLLIN)
    except Exception:  # closed already: no socket
        return True
    return bool(poller.poll(0))


# One engine (and pool) per store URL per process: hooks, triggers and operators share it instead of
# opening a new engine, and a new connection, on every call.
_SHARED: dict[str, Engine] = {}
_SHARED_LOCK = threading.Lock()


def shared_engine(url: str) -> Engine:
    """The process's pooled engine for ``url`` (made on first use; never disposed by its users).

    An in-memory SQLite URL is not shared: each engine of it is a separate database.
    """
    url = canonical(url)
    try:
        parsed = make_url(url)
    except Exception:
        return make_engine(url)  # raises the clear error for a bad URL
    if parsed.get_backend_name() == "sqlite" and parsed.database in (None, "", ":memory:"):
        return make_engine(url)
    with _SHARED_LOCK:
        engine = _SHARED.get(url)
        if engine is None:
            engine = _SHARED[url] = make_engine(url)
        return engine


def _forget_pools_after_fork() -> None:
    """A forked child must not use its parent's connections (two processes on one socket):
    drop the inherited pools without closing them (``close=False`` leaves the parent's intact)."""
    for engine in list(_SHARED.values()):
        engine.dispose(close=False)


os.register_at_fork(after_in_child=_forget_pools_after_fork)


def sqlstate(exc: BaseException) -> str | None:
    orig = getattr(exc, "orig", None)
    state = getattr(orig, "sqlstate", None) or getattr(orig, "pgcode", None)
    return str(state) if state else None


def classify_db_error(exc: SQLAlchemyError, url: str, action: str) -> MirrorError:
    """Database errors by SQLSTATE (never by message text), SQLite by its error codes."""
    from delta_mirror.store import mysql_store

    if mysql_store.is_mysql_error(exc):  # MySQL/MariaDB: by error number
        return mysql_store.classify_error(exc, url, action)
    state = sqlstate(exc)
    where = redact_url(url)
    orig = getattr(exc, "orig", None)
    if state:
        if state in _TRANSIENT_SQLSTATES or state[:2] in _TRANSIENT_SQLSTATE_CLASSES:
            return TransientError(
                f"database unavailable while {action} ({where}, SQLSTATE {state})",
                hint="retried automatically; check the database if it persists",
            )
        if state == "42P01":
            return PermanentError(f"the store at {where} is not initialised", hint="run `delta-mirror init`")
        if state[:2] == "28":
            return PermanentError(
                f"database login failed for {where} (SQLSTATE {state})",
                hint="check the user and password of the store connection",
            )
        if state == "3D000":
            return PermanentError(
                f"database does not exist: {where}", hint="create it, then run `delta-mirror init`"
            )
        return PermanentError(f"database error while {action} ({where}, SQLSTATE {state}): {str(orig)[:200]}")
    if type(orig).__module__.startswith(("duckdb", "_duckdb")):
        return _classify_duckdb_error(exc, url, action)
    code = getattr(orig, "sqlite_errorname", "")
    if code in ("SQLITE_BUSY", "SQLITE_LOCKED") or (
        isinstance(exc, OperationalError) and "locked" in str(exc)
    ):
        return TransientError(f"SQLite store busy while {action} ({where})", hint="retried automatically")
    if isinstance(exc, OperationalError) and "no such table" in str(exc):
        return PermanentError(f"the store at {where} is not initialised", hint="run `delta-mirror init`")
    if isinstance(exc, DBAPIError) and exc.connection_invalidated:
        return TransientError(
            f"database connection lost while {action} ({where})", hint="retried automatically"
        )
    if isinstance(exc, OperationalError):
        return TransientError(
            f"database error while {action} ({where}): {str(orig)[:200]}",
            hint="retried automatically; check the database if it persists",
        )
    return PermanentError(f"database error while {action} ({where}): {str(exc)[:300]}")


def _classify_duckdb_error(exc: SQLAlchemyError, url: str, action: str) -> MirrorError:
    """DuckDB's errors by exception class (it has no SQLSTATE)."""
    from delta_mirror.store import duckdb_store

    where = redact_url(url)
    kind = duckdb_store.classify(exc)
    if kind == "locked":
        return duckdb_store.lock_error(exc, str(make_url(url).database))
    if kind == "missing":
        return PermanentError(f"the store at {where} is not initialised", hint="run `delta-mirror init`")
    if kind == "conflict":
        return TransientError(f"DuckDB write conflict while {action} ({where})", hint="retried automatically")
    return PermanentError(f"database error while {action} ({where}): {str(getattr(exc, 'orig', exc))[:300]}")


def is_unique_violation(exc: SQLAlchemyError) -> bool:
    """A duplicate primary or unique key (the store's commit race is decided by one)."""
    if type(getattr(exc, "orig", None)).__module__.startswith(("duckdb", "_duckdb")):
        from delta_mirror.store import duckdb_store

        return duckdb_store.classify(exc) == "unique"
    from delta_mirror.store import mysql_store

    if mysql_store.is_mysql_error(exc):
        return mysql_store.is_unique_violation(exc)
    state = sqlstate(exc)
    if state:
        return state == "23505"
    orig = getattr(exc, "orig", None)
    code = getattr(orig, "sqlite_errorname", "")  # SQLite has no SQLSTATE; Python 3.11+ names the code
    if code:
        return code in ("SQLITE_CONSTRAINT_UNIQUE", "SQLITE_CONSTRAINT_PRIMARYKEY")
    return re.search(r"UNIQUE|PRIMARY KEY", str(orig), re.IGNORECASE) is not None


# A transaction the database rolled back to break a lock cycle or a serialization conflict: nothing
# was written. MySQL/InnoDB picks such a victim among inserters of one duplicate key whenever the
# holder of that key rolls back (a refused or killed writer), so racing committers see it there.
_LOST_RACE_SQLSTATES = ("40001", "40P01")
_MYSQL_DEADLOCK = 1213


def _causes(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and what it was raised from, in order (a core error from ``translated``, then the
    SQLAlchemy error, then the driver's)."""
    cause: BaseException | None = exc
    while cause is not None:
        yield cause
        cause = cause.__cause__


def lost_a_race(exc: BaseException) -> bool:
    """Whether ``exc`` (a core error raised from a SQLAlchemy one) is a deadlock or serialization
    victim: nothing was written, and a writer taking the next free version may simply try again."""
    cause = next((c for c in _causes(exc) if isinstance(c, SQLAlchemyError)), None)
    if cause is None:
        return False
    from delta_mirror.store import mysql_store

    if mysql_store.is_mysql_error(cause):
        return mysql_store.error_code(cause) == _MYSQL_DEADLOCK
    return sqlstate(cause) in _LOST_RACE_SQLSTATES


def dead_connection(exc: BaseException) -> bool:
    """Whether ``exc`` (or what it was raised from) is SQLAlchemy's report of a dead connection:
    the pool already dropped it, so a retry gets a fresh one (any backend)."""
    return any(isinstance(c, DBAPIError) and c.connection_invalidated for c in _causes(exc))


# Alembic keeps its migration context in module globals: one migration at a time per process.
_MIGRATE_LOCK = threading.Lock()
# Any constant works: it only has to be the same for every delta-mirror process.
_PG_MIGRATE_LOCK_KEY = 0x64656C7461  # "delta"


def migrate(engine: Engine, revision: str = "head") -> None:
    """Bring the schema to the newest Alembic revision (idempotent, safe to run concurrently);
    ``revision``: an older one (the upgrade tests start from it)."""
    from alembic import command
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    with _MIGRATE_LOCK, engine.begin() as conn:
        if conn.dialect.name == "postgresql":
            # Concurrent `init`s queue here; the later ones then find the schema at head.
            # (SQLite needs nothing: every transaction starts with BEGIN IMMEDIATE.)
            conn.exec_driver_sql(f"SELECT pg_advisory_xact_lock({_PG_MIGRATE_LOCK_KEY})")
        if conn.dialect.name == "mysql":  # the same queue; MySQL's DDL commits at once, the lock stays
            _mysql_migrate(cfg, conn, revision)
            return
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, revision)


def _mysql_migrate(cfg: Any, conn: Connection, revision: str) -> None:
    """Alembic under a session-level ``GET_LOCK`` (released on every way out)."""
    from alembic import command

    from delta_mirror.store.mysql_store import migrate_lock_name

    name = migrate_lock_name(conn)
    if conn.exec_driver_sql("SELECT GET_LOCK(%s, 600)", (name,)).scalar() != 1:
        raise TransientError("another delta-mirror init holds the store's migration lock", hint="retry")
    try:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, revision)
    finally:
        conn.exec_driver_sql("SELECT RELEASE_LOCK(%s)", (name,))


def is_initialised(engine: Engine) -> bool:
    with reader(engine).connect() as conn:
        return "dl_tables" in inspect(conn).get_table_names()


@contextmanager
def translated(url: str, action: str) -> Iterator[None]:
    """Turn SQLAlchemy errors raised inside into the core's error classes."""
    try:
        yield
    except MirrorError:
        raise
    except SQLAlchemyError as exc:
        raise classify_db_error(exc, url, action) from exc


__all__ = [
    "READ_ONLY",
    "classify_db_error",
    "dead_connection",
    "is_initialised",
    "is_unique_violation",
    "lost_a_race",
    "make_engine",
    "migrate",
    "reader",
    "shared_engine",
    "translated",
]
