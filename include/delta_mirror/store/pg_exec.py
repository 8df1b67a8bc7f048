"""One statement on PostgreSQL at the driver level: how the one-statement commit is *run*.

The commit statement (``pg_commit.COMMIT``) is one round trip; what is left of a commit's cost in
this process is Python. Through SQLAlchemy's ``Connection.exec_driver_sql`` about half of it was
SQLAlchemy's connection, execution-context and result objects and psycopg's array dumper (Python,
a regular-expression callback per double quote of every JSON line). Here the statement runs on a
pooled connection's psycopg connection directly, with its arrays passed as PostgreSQL array
literals built by ``str.join`` (the statement casts every array parameter: ``%(x)s::text[]``).

What stays SQLAlchemy's: the pool (checkout with its dead-socket check, ``backends.postgresql._closed_by_server``;
the reset on return), and the errors: a driver error is raised as SQLAlchemy would raise it (the
``DBAPIError`` subclass by the driver's class, ``connection_invalidated`` when the connection is
dead, which then leaves the pool), so ``db.translated``, the backend's ``is_unique_violation``,
``db.dead_connection`` and ``db.lost_a_race`` read it unchanged.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError, StatementError

from delta_mirror.store.schema import COMMIT_CHANNEL

log = logging.getLogger(__name__)

#: ``schema.COMMIT_CHANNEL``.
CHANNEL = COMMIT_CHANNEL


def array_literal(items: list[Any]) -> str:
    """``items`` (str, int or None) as a PostgreSQL array literal: strings always quoted (``"`` and
    ``\\`` escaped), None as NULL."""
    if not items:
        return "{}"
    if all(type(x) is str for x in items):  # the common case, without a call per element
        return '{"' + '","'.join([x.replace("\\", "\\\\").replace('"', '\\"') for x in items]) + '"}'
    return "{" + ",".join(map(_element, items)) + "}"


def _element(x: Any) -> str:
    if type(x) is str:
        return '"' + x.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if x is None:
        return "NULL"
    if type(x) is int:
        return str(x)
    raise TypeError(f"no array literal for a {type(x).__name__}")


def literal_arrays(params: Mapping[str, Any]) -> dict[str, Any]:
    """``params`` with every list as an array literal (for a statement that casts each one)."""
    return {k: array_literal(v) if type(v) is list else v for k, v in params.items()}


def scalar(engine: Engine, sql: str, params: Mapping[str, Any], *, notify: str | None = None) -> Any:
    """The first column of ``sql``'s first row (None: no row), ``sql`` run as its own transaction
    (autocommit) on a connection of ``engine``'s pool; list parameters go as array literals.

    ``notify``: when that first column is true (a commit statement claimed its version), send
    ``NOTIFY`` on ``schema.COMMIT_CHANNEL`` with this payload in a transaction of its own on the same
    connection, after the commit. A commit's transaction that notifies holds PostgreSQL's notify
    lock through its WAL flush, so notifying commits never share a flush; one that only notifies
    writes no WAL (migration 0007). A failed notify is logged, never raised: the commit is durable
    and the watchers' poll finds it.

    Errors as SQLAlchemy's ``exec_driver_sql`` raises them (see the module's docstring).
    """
    dialect = engine.dialect
    dbapi_error: Any = dialect.loaded_dbapi.Error
    try:
        fairy = engine.raw_connection()
    except dbapi_error as exc:  # as ``Connection.__init__`` raises it
        raise _wrapped(exc, sql, params, dialect, dialect.is_disconnect(exc, None, None)) from exc
    conn: Any = fairy.driver_connection
    try:
        try:
            conn.autocommit = True
            try:
                cur = _cursor(fairy.info, conn)
                cur.execute(sql, literal_arrays(params))
                row = cur.fetchone()
                if notify is not None and row is not None and row[0]:
                    _notify(fairy, cur, notify, dialect)
            finally:
                if not conn.closed:
                    conn.autocommit = False  # back to the pool as SQLAlchemy's other users expect it
        except dbapi_error as exc:
            dead = dialect.is_disconnect(exc, conn, None)
            if dead:
                fairy.invalidate(exc)
            raise _wrapped(exc, sql, params, dialect, dead) from exc
    finally:
        fairy.close()
    return None if row is None else row[0]


def _notify(fairy: Any, cur: Any, payload: str, dialect: Any) -> None:
    """``pg_notify(COMMIT_CHANNEL, payload)`` as its own transaction. A failure is logged, not raised
    (the commit before it is durable; watchers poll); a connection it finds dead leaves the pool."""
    try:
        # never prepared: nothing to plan, and preparing would cost a round trip of its own
        cur.execute(_NOTIFY, (CHANNEL, payload), prepare=False)
    except dialect.loaded_dbapi.Error as exc:
        log.warning(
            "NOTIFY %s after a commit failed (%s); watchers poll", CHANNEL, str(exc).splitlines()[0][:200]
        )
        if dialect.is_disconnect(exc, cur.connection, None):
            fairy.invalidate(exc)


_NOTIFY = "SELECT pg_notify(%s, %s)"


def _cursor(info: dict[Any, Any], conn: Any) -> Any:
    """The cursor kept with a pooled connection (a new cursor per statement cost as much as the
    pool's checkout: its own adapters and dumper caches)."""
    kept = info.get(_CURSOR)
    if kept is None or kept[0] is not conn or kept[1].closed:
        kept = info[_CURSOR] = (conn, conn.cursor())
    return kept[1]


_CURSOR = "delta_mirror.pg_exec.cursor"


def _wrapped(exc: Exception, sql: str, params: Mapping[str, Any], dialect: Any, dead: bool) -> StatementError:
    """The SQLAlchemy error ``exec_driver_sql`` would have raised for the driver's ``exc``."""
    return DBAPIError.instance(
        sql,
        dict(params),
        exc,
        dialect.loaded_dbapi.Error,
        connection_invalidated=dead,
        dialect=dialect,
    )


__all__ = ["array_literal", "literal_arrays", "scalar"]
