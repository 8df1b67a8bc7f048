"""Engines, migrations and database error classification for the store: what every database
shares; what differs by database is asked of its ``Backend`` (``store/backends/``)."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy import Connection, Engine, inspect
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError, OperationalError, SQLAlchemyError

from delta_mirror.config import redact_url
from delta_mirror.errors import MirrorError, PermanentError, TransientError
from delta_mirror.store.backends import Backend, backend_named, backend_of
from delta_mirror.store.urls import backend_for, canonical, parse

MIGRATIONS = Path(__file__).parent / "migrations"

READ_ONLY = "delta_mirror_read_only"


def reader(engine: Engine) -> Engine:
    """The same engine and pool, for read-only work (on SQLite its transactions do not block writers)."""
    return engine.execution_options(**{READ_ONLY: True})


def make_engine(url: str) -> Engine:
    """An engine for ``url``, made by its database's backend (SQLite: WAL and a busy timeout so
    writers queue, not fail)."""
    url = canonical(url)  # libpq's multi-host H1:P1,H2:P2 form as SQLAlchemy's ?host=...&host=...
    parsed = parse(url)
    return backend_for(parsed).engine(parsed, url)


# One engine (and pool) per store URL per process: hooks, triggers and operators share it instead of
# opening a new engine, and a new connection, on every call.
_SHARED: dict[str, Engine] = {}
_SHARED_LOCK = threading.Lock()


def shared_engine(url: str) -> Engine:
    """The process's pooled engine for ``url`` (made on first use; never disposed by its users).

    An in-memory SQLite URL is not shared: each engine of it is a separate database.
    """
    url = canonical(url)
    parsed = parse(url)  # a bad URL or database: the same one-line errors as make_engine's
    if not backend_for(parsed).shared(parsed):
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


def _backend_of_url(url: str) -> Backend | None:
    try:
        return backend_named(make_url(canonical(url)).get_backend_name())
    except Exception:
        return None


def classify_db_error(exc: SQLAlchemyError, url: str, action: str) -> MirrorError:
    """A database error as the core's error class: first as its database names it (by SQLSTATE,
    error number, code or exception class: ``Backend.classify_error``), then by the rules every
    database shares (never by message text)."""
    backend = _backend_of_url(url)
    known = backend.classify_error(exc, url, action) if backend is not None else None
    if known is not None:
        return known
    where = redact_url(url)
    if isinstance(exc, DBAPIError) and exc.connection_invalidated:
        return TransientError(
            f"database connection lost while {action} ({where})", hint="retried automatically"
        )
    if isinstance(exc, OperationalError):
        return TransientError(
            f"database error while {action} ({where}): {str(exc.orig)[:200]}",
            hint="retried automatically; check the database if it persists",
        )
    return PermanentError(f"database error while {action} ({where}): {str(exc)[:300]}")


def _causes(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and what it was raised from, in order (a core error from ``translated``, then the
    SQLAlchemy error, then the driver's)."""
    cause: BaseException | None = exc
    while cause is not None:
        yield cause
        cause = cause.__cause__


def lost_a_race(exc: BaseException, bind: Engine | Connection) -> bool:
    """Whether ``exc`` (a core error raised from a SQLAlchemy one) is a deadlock or serialization
    victim on ``bind``'s database: nothing was written, and a writer taking the next free version
    may simply try again."""
    cause = next((c for c in _causes(exc) if isinstance(c, SQLAlchemyError)), None)
    return cause is not None and backend_of(bind).is_deadlock_victim(cause)


def dead_connection(exc: BaseException) -> bool:
    """Whether ``exc`` (or what it was raised from) is SQLAlchemy's report of a dead connection:
    the pool already dropped it, so a retry gets a fresh one (any backend)."""
    return any(isinstance(c, DBAPIError) and c.connection_invalidated for c in _causes(exc))


# Alembic keeps its migration context in module globals: one migration at a time per process.
_MIGRATE_LOCK = threading.Lock()


def migrate(engine: Engine, revision: str = "head") -> None:
    """Bring the schema to the newest Alembic revision (idempotent, safe to run concurrently);
    ``revision``: an older one (the upgrade tests start from it)."""
    from alembic import command
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    with _MIGRATE_LOCK, engine.begin() as conn, backend_of(conn).migration_lock(conn):
        # concurrent `init`s of one store queue on its database's lock, then find it at head
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, revision)


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
    "lost_a_race",
    "make_engine",
    "migrate",
    "reader",
    "shared_engine",
    "translated",
]
