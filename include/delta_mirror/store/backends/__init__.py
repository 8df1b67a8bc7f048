"""One home per database: what differs between SQLite, PostgreSQL, MySQL/MariaDB and DuckDB.

Each database has one module here (``sqlite``, ``postgresql``, ``mysql``, ``duckdb``) that defines
its :class:`Backend`; the store looks its database's up by the dialect's name (:func:`backend_of`,
the one place that reads it) and asks it what to do, so the rest of the store never branches on
the database kind (``tests/store/test_backend_branches.py`` counts such branches outside this
folder and the migrations).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sqlalchemy import Connection, Engine


@dataclass(frozen=True)
class Backend:
    """What one database does its own way (each field says what the store asks it)."""

    #: The SQLAlchemy dialect's name.
    name: str
    #: The operator of an integer division in SQL (MySQL's ``/`` divides as a decimal).
    integer_division: str
    #: The DBAPI's placeholder, for statements sent to the driver as they are.
    placeholder: str
    #: Whether a committed version is announced by ``NOTIFY`` (a watcher then ``LISTEN``s).
    notifies: bool
    #: Whether a single read-only statement runs without a transaction (no BEGIN/ROLLBACK trips).
    autocommit_reads: bool
    #: Whether an import's rows go by ``COPY`` (``bulk_load``) and array parameters are unnested
    #: server-side (``mirror_status`` marks many versions in one statement).
    copies: bool
    #: A statement giving (version, its lines joined by ``\\n``) for a table, part and version
    #: range (one row per version: the server joins the lines), or None: the lines come in order.
    joined_lines: str | None
    #: Whether reads in bulk run on the driver's cursor itself (SQLite: no row objects).
    raw_cursor_reads: bool
    #: Whether bulk reads come as Arrow batches (DuckDB: blocks without a string per row).
    arrow_blocks: bool
    #: Whether ``UPDATE ... FROM`` is there (SQLite since 3.33); ``update_join``: MySQL's form of it,
    #: ``UPDATE ... JOIN``.
    update_from: bool
    update_join: bool
    #: Makes the database's ``commit_writer.CommitWriter`` (once per store). Typed loosely: the
    #: modules it names import this one.
    writer: Callable[[Engine, str], Any]
    #: Makes the import's bulk loader for a new table (``bulk_load.BulkImport`` or the database's own).
    bulk_import: Callable[[Connection, int], Any]


# dialect name -> the module defining its BACKEND
_MODULES = {
    "sqlite": "delta_mirror.store.backends.sqlite",
    "postgresql": "delta_mirror.store.backends.postgresql",
    "mysql": "delta_mirror.store.backends.mysql",
    "duckdb": "delta_mirror.store.backends.duckdb",
}


def backend_of(bind: Engine | Connection) -> Backend:
    """The backend of an engine's or a connection's database."""
    return _backend(bind.dialect.name)


@cache
def _backend(dialect: str) -> Backend:
    backend: Backend = importlib.import_module(_MODULES[dialect]).BACKEND
    return backend


__all__ = ["Backend", "backend_of"]
