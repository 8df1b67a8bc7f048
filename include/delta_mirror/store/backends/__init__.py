"""One home per database: what differs between SQLite, PostgreSQL, MySQL/MariaDB and DuckDB.

Each database has one module here (``sqlite``, ``postgresql``, ``mysql``, ``duckdb``) that defines
its :class:`Backend`: its engine, its errors, its migration lock and the ways of its writes and
reads. The store looks its database's up once by name (:func:`backend_of` for an engine or a
connection, :func:`backend_named` for a URL's backend name: one table, ``_MODULES``) and asks it
what to do, so the rest of the package never branches on the database kind
(``tests/test_backend_branches.py`` counts such branches outside this folder and the migrations).
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable, Iterator
from functools import cache
from typing import TYPE_CHECKING, Any

from delta_mirror.errors import MirrorError, PermanentError, TransientError

if TYPE_CHECKING:
    from sqlalchemy import Connection, Engine
    from sqlalchemy.engine import URL
    from sqlalchemy.exc import SQLAlchemyError


class Backend:
    """What one database does its own way; the defaults are what most of them do (each
    attribute and method says what the store asks it)."""

    #: The SQLAlchemy dialect's name (and the URL's backend name).
    name: str
    #: The operator of an integer division in SQL (MySQL's ``/`` divides as a decimal).
    integer_division = "/"
    #: The DBAPI's placeholder, for statements sent to the driver as they are.
    placeholder = "?"
    #: Whether a committed version is announced by ``NOTIFY`` (a watcher then ``LISTEN``s).
    notifies = False
    #: Whether a single read-only statement runs without a transaction (no BEGIN/ROLLBACK trips).
    autocommit_reads = False
    #: Whether an import's rows go by ``COPY`` (``bulk_load``) and array parameters are unnested
    #: server-side (``mirror_status`` marks many versions in one statement).
    copies = False
    #: A statement giving (version, its lines joined by ``\\n``) for a table, part and version
    #: range (one row per version: the server joins the lines), or None: the lines come in order.
    joined_lines: str | None = None
    #: Whether reads in bulk run on the driver's cursor itself (SQLite: no row objects).
    raw_cursor_reads = False
    #: Whether bulk reads come as Arrow batches (DuckDB: blocks without a string per row).
    arrow_blocks = False
    #: Whether ``UPDATE ... FROM`` is there (SQLite since 3.33); ``update_join``: MySQL's form of it,
    #: ``UPDATE ... JOIN``.
    update_from = True
    update_join = False
    #: Whether the Spark checkpoint engine reads the store over JDBC (``store.urls.jdbc_url``).
    jdbc_reads = False
    #: For a server database: the URL scheme (dialect+driver) of a store URL built from a
    #: connection's host, login and database (the Airflow hook); None for a file database.
    server_scheme: str | None = None
    #: The connection options such a URL takes in its query (PostgreSQL: libpq's, e.g. ``sslmode``).
    url_options: frozenset[str] = frozenset()
    #: Whether such a URL may name several hosts (libpq's ``?host=H1:P1&host=H2:P2``).
    multi_host = False
    #: Makes the database's ``commit_writer.CommitWriter`` (once per store) from the engine and the
    #: URL; ``bulk_import``: the import's bulk loader for a new table (``bulk_load.BulkImport`` or
    #: the database's own). Typed loosely: the modules they name import this one.
    writer: Callable[[Engine, str], Any]
    bulk_import: Callable[[Connection, int], Any]

    def engine(self, url: URL, text: str) -> Engine:
        """The store's engine for ``url`` (``text``: the URL as given, for messages)."""
        raise NotImplementedError

    def shared(self, url: URL) -> bool:
        """Whether engines on ``url`` may be one engine per process (SQLite's in-memory database:
        each engine is a database of its own)."""
        return True

    def classify_error(self, exc: SQLAlchemyError, url: str, action: str) -> MirrorError | None:
        """The core's error for a database error this database names its own way (by SQLSTATE,
        error number, code or class; never by message text where it gives more), or None: the
        rules every database shares decide (``db.classify_db_error``)."""
        return None

    def is_unique_violation(self, exc: SQLAlchemyError) -> bool:
        """A duplicate primary or unique key (the store's commit race is decided by one)."""
        return False

    def is_deadlock_victim(self, exc: SQLAlchemyError) -> bool:
        """Whether the database rolled the transaction back to break a lock cycle or a
        serialization conflict: nothing was written (``db.lost_a_race``)."""
        return False

    @contextlib.contextmanager
    def migration_lock(self, conn: Connection) -> Iterator[None]:
        """Concurrent migrations of one store queue here (SQLite needs nothing: every transaction
        starts with ``BEGIN IMMEDIATE``; DuckDB's file has one process)."""
        yield


# The lines every database gives for the same situation (``where``: the store URL without password).


def not_initialised(where: str) -> PermanentError:
    return PermanentError(f"the store at {where} is not initialised", hint="run `delta-mirror init`")


def no_such_database(where: str) -> PermanentError:
    return PermanentError(f"database does not exist: {where}", hint="create it, then run `delta-mirror init`")


def unavailable(action: str, where: str, code: str) -> TransientError:
    """``code``: the database's name for the error (``SQLSTATE 57P01``, ``MySQL error 2003``)."""
    return TransientError(
        f"database unavailable while {action} ({where}, {code})",
        hint="retried automatically; check the database if it persists",
    )


# backend name -> the module defining its BACKEND
_MODULES = {
    "sqlite": "delta_mirror.store.backends.sqlite",
    "postgresql": "delta_mirror.store.backends.postgresql",
    "mysql": "delta_mirror.store.backends.mysql",
    "duckdb": "delta_mirror.store.backends.duckdb",
}


def backend_of(bind: Engine | Connection) -> Backend:
    """The backend of an engine's or a connection's database."""
    backend = backend_named(bind.dialect.name)
    if backend is None:
        raise LookupError(f"no store backend for the {bind.dialect.name} dialect")
    return backend


@cache
def backend_named(name: str) -> Backend | None:
    """The backend called ``name`` (a URL's backend name, a dialect's name), None for another."""
    module = _MODULES.get(name)
    if module is None:
        return None
    backend: Backend = importlib.import_module(module).BACKEND
    return backend


def server_backend(kind: str) -> Backend:
    """The backend of a store on the server database ``kind`` (e.g. an Airflow connection's
    type: ``mysql``, ``postgres``): PostgreSQL for any kind that names no server database."""
    for name in (kind, "postgresql"):
        backend = backend_named(name)
        if backend is not None and backend.server_scheme is not None:
            return backend
    raise AssertionError("the PostgreSQL backend is a server database")


__all__ = [
    "Backend",
    "backend_named",
    "backend_of",
    "no_such_database",
    "not_initialised",
    "server_backend",
    "unavailable",
]
