"""The store on MySQL 8 / MariaDB 10.11 (``mysql+pymysql://user:pw@host:port/db``): every commit by the
transaction path, an import's rows by large multi-row INSERTs (``mysql_bulk``), ``DIV`` for
integer division, errors by their number, migrations under a ``GET_LOCK``.

Isolation level: READ COMMITTED, set on every connection and checked when it is made. The store's
write paths are written for it (it is PostgreSQL's default): every statement sees what others
committed before it; a commit reads the newest version, then inserts the next one, and the
``dl_commits`` primary key decides a race (the loser's insert waits for the winner's row lock, then
fails with a duplicate key: ``CommitConflictError``). InnoDB's default, REPEATABLE READ, would give
a transaction's plain reads its first snapshot and take gap locks on the ranges its UPDATEs scan.
A server (or proxy) that leaves a session on another level, or a binary log in ``STATEMENT``
format (which cannot log READ COMMITTED writes), is refused at connect with one line
(docs/stores.md).

Tables are ``utf8mb4`` with a binary, no-pad collation (file paths and table names compare byte by
byte, as on PostgreSQL and SQLite; MySQL's default collations ignore case and trailing spaces).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.engine import URL
from sqlalchemy.exc import ArgumentError, DBAPIError, SQLAlchemyError

from delta_mirror.config import redact_url
from delta_mirror.errors import MirrorError, PermanentError, TransientError
from delta_mirror.extras import require
from delta_mirror.store.backends import Backend, no_such_database, not_initialised, unavailable
from delta_mirror.store.commit_writer import TransactionOnly
from delta_mirror.store.mysql_bulk import MySqlBulkImport

ISOLATION_LEVEL = "READ COMMITTED"

# MySQL/MariaDB error numbers (the driver's ``args[0]``): the store classifies by number, never by text.
ER_DUP_ENTRY = 1062
ER_DUP_UNIQUE = 1169
ER_DUP_ENTRY_WITH_KEY_NAME = 1586
_DUPLICATE_KEY = (ER_DUP_ENTRY, ER_DUP_UNIQUE, ER_DUP_ENTRY_WITH_KEY_NAME)
_TRANSIENT = {
    1040,  # too many connections
    1053,  # server shutdown in progress
    1205,  # lock wait timeout
    1213,  # deadlock (InnoDB rolled the transaction back)
    1927,  # MariaDB: connection killed
    2002,  # cannot connect (socket)
    2003,  # cannot connect (TCP)
    2006,  # server has gone away
    2013,  # lost connection during a query
    2055,  # lost connection (system error)
    4031,  # MySQL 8: disconnected by the server (idle timeout)
}
# InnoDB picks a deadlock victim among inserters of one duplicate key whenever the holder of that
# key rolls back (a refused or killed writer), so racing committers see it: nothing was written.
_DEADLOCK = 1213
_NO_SUCH_TABLE = 1146
_LOGIN_FAILED = (1044, 1045, 1698)
_UNKNOWN_DATABASE = 1049

# Session settings: strict (an overlong value fails instead of being cut), and no silent engine swap.
_SET_SQL_MODE = "SET SESSION sql_mode = 'STRICT_ALL_TABLES,NO_ENGINE_SUBSTITUTION,ERROR_FOR_DIVISION_BY_ZERO'"
_SET_ISOLATION = "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED"  # ISOLATION_LEVEL


class MySQL(Backend):
    name = "mysql"
    integer_division = "DIV"
    placeholder = "%s"
    update_join = True
    server_scheme = "mysql+pymysql"
    writer = TransactionOnly  # every commit by the transaction path
    bulk_import = MySqlBulkImport

    def engine(self, url: URL, text: str) -> Engine:
        if url.drivername in ("mysql", "mysql+pymysql"):  # "mysql://" is PyMySQL here too
            require("pymysql", "mysql", "the MySQL/MariaDB store")
        return make_mysql_engine(url, text)

    def classify_error(self, exc: SQLAlchemyError, url: str, action: str) -> MirrorError | None:
        return classify_error(exc, url, action) if is_mysql_error(exc) else None

    def is_unique_violation(self, exc: SQLAlchemyError) -> bool:
        return is_mysql_error(exc) and error_code(exc) in _DUPLICATE_KEY

    def is_deadlock_victim(self, exc: SQLAlchemyError) -> bool:
        return is_mysql_error(exc) and error_code(exc) == _DEADLOCK

    @contextlib.contextmanager
    def migration_lock(self, conn: Connection) -> Iterator[None]:
        """A session-level ``GET_LOCK`` (MySQL's DDL commits at once: a transaction's lock would
        not hold), released on every way out."""
        name = migrate_lock_name(conn)
        if conn.exec_driver_sql("SELECT GET_LOCK(%s, 600)", (name,)).scalar() != 1:
            raise TransientError("another delta-mirror init holds the store's migration lock", hint="retry")
        try:
            yield
        finally:
            conn.exec_driver_sql("SELECT RELEASE_LOCK(%s)", (name,))


def is_mysql_error(exc: BaseException) -> bool:
    """Whether ``exc`` (a SQLAlchemy error) wraps a MySQL driver's error (PyMySQL or mysqlclient)."""
    orig = getattr(exc, "orig", None)
    return orig is not None and type(orig).__module__.startswith(("pymysql", "MySQLdb"))


def error_code(exc: BaseException) -> int | None:
    """The MySQL error number of a wrapped driver error (None when it carries none)."""
    args = getattr(getattr(exc, "orig", None), "args", ())
    return args[0] if args and isinstance(args[0], int) else None


def classify_error(exc: SQLAlchemyError, url: str, action: str) -> MirrorError:
    """A MySQL/MariaDB error as the core's error class, by its error number."""
    code = error_code(exc)
    where = redact_url(url)
    if code in _TRANSIENT or (code is None and isinstance(exc, DBAPIError) and exc.connection_invalidated):
        return unavailable(action, where, f"MySQL error {code}")
    if code == _NO_SUCH_TABLE:
        return not_initialised(where)
    if code in _LOGIN_FAILED:
        return PermanentError(
            f"database login failed for {where} (MySQL error {code})",
            hint="check the user and password of the store connection, and its grants on the database",
        )
    if code == _UNKNOWN_DATABASE:
        return no_such_database(where)
    detail = getattr(exc, "orig", exc)
    return PermanentError(f"database error while {action} ({where}, MySQL error {code}): {str(detail)[:200]}")


def make_mysql_engine(parsed: URL, url: str) -> Engine:
    """An engine at READ COMMITTED whose every new connection is checked (see the module doc)."""
    if parsed.drivername == "mysql":  # SQLAlchemy's default would be mysqlclient: the store ships PyMySQL
        parsed = parsed.set(drivername="mysql+pymysql")
    try:
        engine = create_engine(
            parsed,
            pool_pre_ping=True,
            pool_recycle=3600,  # below the servers' usual wait_timeout of 8 hours, and proxies' idle cuts
            isolation_level=ISOLATION_LEVEL,
            connect_args={"connect_timeout": 10, "charset": "utf8mb4"},
        )
    except (ArgumentError, ValueError) as exc:  # e.g. a non-numeric port
        raise PermanentError(
            f"store URL {redact_url(url)} is not valid: {exc}",
            hint="use mysql+pymysql://user:password@host:port/db",
        ) from None
    except ImportError as exc:  # another driver named in the URL, not installed
        raise PermanentError(
            f"the driver of the store URL {redact_url(url)} is not installed ({exc.name})",
            hint="use mysql+pymysql://user:password@host:port/db",
        ) from None

    @event.listens_for(engine, "connect")
    def _mysql_session(dbapi_conn: Any, _record: Any) -> None:
        check_session(engine, dbapi_conn, url)

    return engine


def check_session(engine: Engine, dbapi_conn: Any, url: str) -> None:
    """Set the session's SQL mode; refuse a session the store cannot run correctly on."""
    cur = dbapi_conn.cursor()
    try:
        cur.execute(_SET_SQL_MODE)
        cur.execute(_SET_ISOLATION)
        cur.execute("SELECT @@GLOBAL.log_bin, @@SESSION.binlog_format")
        log_bin, binlog_format = cur.fetchone()
    finally:
        cur.close()
    level = engine.dialect.get_isolation_level(dbapi_conn)
    if str(level).replace("-", " ").upper() != ISOLATION_LEVEL:
        raise PermanentError(
            f"the MySQL store at {redact_url(url)} runs at isolation level {level}, not {ISOLATION_LEVEL}",
            hint="the store needs READ COMMITTED sessions (docs/stores.md); check the server or proxy settings",
        )
    if int(log_bin or 0) and str(binlog_format).upper() == "STATEMENT":
        raise PermanentError(
            f"the MySQL store at {redact_url(url)} logs binlog_format=STATEMENT, which cannot log "
            f"{ISOLATION_LEVEL} transactions",
            hint="set binlog_format=ROW (or MIXED) on the server",
        )


def migrate_lock_name(conn: Connection) -> str:
    """The server-wide ``GET_LOCK`` name that serializes migrations of one store database."""
    return f"delta_mirror_migrate.{conn.engine.url.database or ''}"[:64]


def table_options(bind: Connection) -> dict[str, Any]:
    """The ``mysql_*`` options of the store's ``CREATE TABLE``s (none on another database):
    InnoDB, utf8mb4, a binary no-pad collation (``utf8mb4_nopad_bin`` on MariaDB,
    ``utf8mb4_0900_bin`` on MySQL 8)."""
    if bind.dialect.name != "mysql":
        return {}
    collation = "utf8mb4_nopad_bin" if getattr(bind.dialect, "is_mariadb", False) else "utf8mb4_0900_bin"
    return {"mysql_engine": "InnoDB", "mysql_charset": "utf8mb4", "mysql_collate": collation}


# The TEXT defaults of the schema as MySQL 8 expressions (the migrations' literals).
_TEXT_DEFAULTS = {"{}": "('{}')", "": "('')"}


def text_default(bind: Connection, value: str) -> Any:
    """A ``server_default`` for a TEXT column (``value``: one of ``_TEXT_DEFAULTS``): MySQL 8 takes
    only an expression there (MariaDB, PostgreSQL and SQLite the plain literal, which they get)."""
    if bind.dialect.name != "mysql" or getattr(bind.dialect, "is_mariadb", False):
        return value
    from sqlalchemy import text

    return text(_TEXT_DEFAULTS[value])


BACKEND = MySQL()

__all__ = [
    "BACKEND",
    "ISOLATION_LEVEL",
    "MySQL",
    "check_session",
    "classify_error",
    "error_code",
    "is_mysql_error",
    "make_mysql_engine",
    "migrate_lock_name",
    "table_options",
    "text_default",
]
