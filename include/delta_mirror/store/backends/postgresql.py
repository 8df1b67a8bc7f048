"""PostgreSQL: one statement per commit (``pg_commit``, run by ``pg_exec``) and its ``NOTIFY``,
``COPY`` for an import's rows, single reads without a transaction, the checkpoint engine's reads
over JDBC; errors by SQLSTATE; concurrent migrations queue on an advisory lock."""

from __future__ import annotations

import contextlib
import select
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.exc import ArgumentError, DisconnectionError, SQLAlchemyError

from delta_mirror.config import redact_url
from delta_mirror.errors import MirrorError, PermanentError
from delta_mirror.store.backends import Backend, no_such_database, not_initialised, unavailable
from delta_mirror.store.bulk_load import BulkImport
from delta_mirror.store.commit_writer import PgOneStatement

if TYPE_CHECKING:
    from sqlalchemy.engine import URL


# SQLSTATE classes that are worth retrying: serialization failures, deadlocks, connection
# exceptions, and the server shutting down or starting up.
_TRANSIENT_SQLSTATES = ("40001", "40P01", "57P01", "57P02", "57P03", "53300")
_TRANSIENT_SQLSTATE_CLASSES = ("08",)
# A transaction rolled back to break a lock cycle or a serialization conflict: nothing was written.
_LOST_RACE_SQLSTATES = ("40001", "40P01")
_UNIQUE_VIOLATION = "23505"
# Any constant works: it only has to be the same for every delta-mirror process.
_MIGRATE_LOCK_KEY = 0x64656C7461  # "delta"

# libpq's connection options a store URL may carry in its query (the Airflow hook takes them from a
# Postgres connection's extra, as the Postgres provider passes them to the driver).
_LIBPQ_OPTIONS = frozenset(
    {
        "target_session_attrs",
        "load_balance_hosts",
        "connect_timeout",
        "sslmode",
        "sslrootcert",
        "sslcert",
        "sslkey",
        "application_name",
        "options",
        "keepalives",
        "keepalives_idle",
        "keepalives_interval",
        "keepalives_count",
        "tcp_user_timeout",
    }
)

# One row per version: the server joins the lines (payloads hold no raw newline).
_JOINED_LINES = (
    "SELECT version, string_agg(payload, E'\\n' ORDER BY seq) FROM dl_actions "
    "WHERE table_id = %s AND part = %s AND version BETWEEN %s AND %s GROUP BY version"
)


class PostgreSQL(Backend):
    name = "postgresql"
    placeholder = "%s"
    notifies = True
    autocommit_reads = True
    copies = True
    joined_lines = _JOINED_LINES
    jdbc_reads = True
    server_scheme = "postgresql+psycopg"
    url_options = _LIBPQ_OPTIONS
    multi_host = True
    writer = PgOneStatement
    bulk_import = BulkImport  # its rows by COPY

    def engine(self, url: URL, text: str) -> Engine:
        """No pre-ping (a round trip per checkout, as many as a whole commit): a connection the
        server closed is found without one (``_closed_by_server``), and a commit that still finds
        its connection dead is tried once more (``db.dead_connection``)."""
        try:
            engine = create_engine(url, pool_pre_ping=False, connect_args={"connect_timeout": 10})
        except (ArgumentError, ValueError) as exc:  # e.g. a non-numeric port
            raise PermanentError(
                f"store URL {redact_url(text)} is not valid: {exc}",
                hint="use postgresql+psycopg://user@host:port/db",
            ) from None
        event.listen(engine, "checkout", _drop_closed)
        return engine

    def classify_error(self, exc: SQLAlchemyError, url: str, action: str) -> MirrorError | None:
        state = sqlstate(exc)
        if not state:
            return None
        where = redact_url(url)
        if state in _TRANSIENT_SQLSTATES or state[:2] in _TRANSIENT_SQLSTATE_CLASSES:
            return unavailable(action, where, f"SQLSTATE {state}")
        if state == "25006":  # a write on a standby: no retry helps (urls.refuse_read_only at start)
            from delta_mirror.store.urls import READ_ONLY_HINT, hosts_text

            return PermanentError(
                f"the store at {hosts_text(url)} is a read-only standby", hint=READ_ONLY_HINT
            )
        if state == "42P01":
            return not_initialised(where)
        if state[:2] == "28":
            return PermanentError(
                f"database login failed for {where} (SQLSTATE {state})",
                hint="check the user and password of the store connection",
            )
        if state == "3D000":
            return no_such_database(where)
        detail = str(getattr(exc, "orig", None))[:200]
        return PermanentError(f"database error while {action} ({where}, SQLSTATE {state}): {detail}")

    def is_unique_violation(self, exc: SQLAlchemyError) -> bool:
        return sqlstate(exc) == _UNIQUE_VIOLATION

    def is_deadlock_victim(self, exc: SQLAlchemyError) -> bool:
        return sqlstate(exc) in _LOST_RACE_SQLSTATES

    @contextlib.contextmanager
    def migration_lock(self, conn: Connection) -> Iterator[None]:
        """Concurrent ``init``s queue here (the lock ends with the transaction); the later ones
        then find the schema at head."""
        conn.exec_driver_sql(f"SELECT pg_advisory_xact_lock({_MIGRATE_LOCK_KEY})")
        yield


def sqlstate(exc: BaseException) -> str | None:
    """The SQLSTATE of a wrapped driver error (None when it carries none)."""
    orig = getattr(exc, "orig", None)
    state = getattr(orig, "sqlstate", None) or getattr(orig, "pgcode", None)
    return str(state) if state else None


def _drop_closed(dbapi_conn: Any, _record: Any, _proxy: Any) -> None:
    if _closed_by_server(dbapi_conn):
        raise DisconnectionError("the server closed this pooled connection")  # the pool reconnects


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


BACKEND = PostgreSQL()

__all__ = ["BACKEND", "PostgreSQL", "sqlstate"]
