"""What the project derives from a store URL: every host of a replicated PostgreSQL store survives.

A store on highly available PostgreSQL (a primary and standbys, Patroni, CloudNativePG, RDS) is
given with all its hosts and ``target_session_attrs``, in either form:

- ``postgresql+psycopg://user:pw@/db?host=H1:P1&host=H2:P2&target_session_attrs=read-write``
  (SQLAlchemy's multi-host form), or
- ``postgresql+psycopg://user:pw@H1:P1,H2:P2/db?target_session_attrs=read-write`` (libpq's URI
  form; SQLAlchemy does not parse it, so :func:`canonical` rewrites it into the first one).

Every connection the project opens besides the store's engine keeps them all: the watchers'
``LISTEN`` connection (:func:`libpq_url`) and the Spark checkpoint engine's JDBC reads
(:func:`jdbc_url`: ``jdbc:postgresql://H1:P1,H2:P2/db?targetServerType=primary``). A password is
only ever in what is handed to a driver, never in :func:`hosts_text`, which messages use.

:func:`refuse_read_only` is the start-up check of ``init``, ``serve`` and ``status``: a store whose
only reachable node is a standby is refused in one line instead of failing at the first write.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs

from sqlalchemy import Engine
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import SQLAlchemyError

from delta_mirror.config import multi_host_query_form
from delta_mirror.errors import PermanentError

if TYPE_CHECKING:
    from delta_mirror.store.backends import Backend

DEFAULT_PORT = 5432

# libpq's ``target_session_attrs`` as PgJDBC's ``targetServerType`` (its own spelling).
_TARGET_SERVER_TYPES: Mapping[str, str] = {
    "any": "any",
    "read-write": "primary",
    "primary": "primary",
    "read-only": "secondary",
    "standby": "secondary",
    "prefer-standby": "preferSecondary",
}

# libpq's option names that PgJDBC spells its own way (the rest, e.g. sslmode, are the same).
_JDBC_NAMES: Mapping[str, str] = {
    "connect_timeout": "connectTimeout",
    "application_name": "ApplicationName",
    "tcp_user_timeout": "tcpUserTimeout",
}

# Query keys that are hosts, not options handed on to the driver as they are.
_HOST_KEYS = ("host", "hostaddr", "port")


READ_ONLY_HINT = "give the primary or all hosts with target_session_attrs=read-write"
URL_HINT = (
    "use sqlite:///path, postgresql+psycopg://user@host/db, mysql+pymysql://user@host/db or duckdb:///path"
)


def _split_host(entry: str) -> tuple[str, int | None]:
    """``H``, ``H:P``, ``[v6]``, ``[v6]:P`` -> (host, port or None)."""
    entry = entry.strip()
    if entry.startswith("["):
        host, _, rest = entry[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ""
    elif entry.count(":") == 1:
        host, port = entry.split(":")
    else:  # a bare IPv6 address or a Unix socket folder
        host, port = entry, ""
    if port and not port.isdigit():
        raise PermanentError(
            f"store URL host {host!r} has a port that is not a number: {port!r}",
            hint="write each host as HOST:PORT, e.g. ?host=db1:5432&host=db2:5432",
        )
    return host, int(port) if port else None


def canonical(url: str) -> str:
    """``url`` with libpq's comma form ``H1:P1,H2:P2`` in the netloc rewritten into SQLAlchemy's
    ``?host=H1:P1&host=H2:P2`` (``config.multi_host_query_form``, which messages' redaction
    shares); any other URL unchanged (the same string). A host's port that is not a number: one line."""
    rewritten = multi_host_query_form(url)
    if rewritten != url:
        for entry in parse_qs(rewritten.partition("?")[2]).get("host", []):
            _split_host(entry)
    return rewritten


def parse(url: str) -> URL:
    """The SQLAlchemy URL of either form (``PermanentError`` in one line when it is not one)."""
    try:
        return make_url(canonical(url))
    except PermanentError:
        raise
    except Exception as exc:
        raise PermanentError(f"store URL is not valid: {exc}", hint=URL_HINT) from None


def backend_for(u: URL) -> Backend:
    """The store's ``backends.Backend`` for ``u`` (``PermanentError`` when there is none)."""
    from delta_mirror.store.backends import backend_named

    backend = backend_named(u.get_backend_name())
    if backend is None:
        raise PermanentError(f"unsupported store backend '{u.get_backend_name()}'", hint=URL_HINT)
    return backend


def _last(value: str | tuple[str, ...]) -> str:
    return value if isinstance(value, str) else value[-1]


def hosts(url: str | URL) -> list[tuple[str, int | None]]:
    """Every host of a PostgreSQL store URL with its port (None: the URL's or libpq's default),
    in order; one entry for a single-host URL (``localhost`` when it names none)."""
    u = parse(url) if isinstance(url, str) else url
    listed = u.query.get("host")
    if listed:
        entries = [listed] if isinstance(listed, str) else list(listed)
        found = [_split_host(e) for e in entries]
        return [(h, p if p is not None else u.port) for h, p in found]
    return [(u.host or "localhost", u.port)]


def hosts_text(url: str | URL) -> str:
    """``H1:P1,H2:P2`` (no credentials): the hosts for a message."""
    return ",".join(f"{h}:{p or DEFAULT_PORT}" for h, p in hosts(url))


def _options(u: URL) -> dict[str, str]:
    """The URL's query options other than its hosts (the last value of a repeated one)."""
    return {k: _last(v) for k, v in u.query.items() if k not in _HOST_KEYS}


def _conninfo_value(value: str) -> str:
    """A libpq key/value conninfo value, quoted when it needs to be."""
    if value and not re.search(r"[\s'\\]", value):
        return value
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def libpq_url(url: str, *, primary: bool = False) -> str:
    """A PostgreSQL store URL as a libpq conninfo string for a plain psycopg connection (the
    watchers' ``LISTEN``): ``host=H1,H2 port=P1,P2 dbname=... target_session_attrs=...``, every
    host and option kept. ``primary``: a URL of several hosts without ``target_session_attrs``
    gets ``read-write`` (a standby cannot ``LISTEN``). It holds the password: hand it to the
    driver only, never to a log."""
    u = parse(url)
    if not backend_for(u).notifies:  # the LISTEN connection's database: PostgreSQL
        raise PermanentError(f"no libpq mapping for a {u.drivername} store", hint="use a PostgreSQL store")
    found = hosts(u)
    parts: dict[str, str] = {"host": ",".join(h for h, _ in found)}
    if any(p is not None for _, p in found):
        parts["port"] = ",".join(str(p) if p is not None else "" for _, p in found)
    if u.database:
        parts["dbname"] = u.database
    if u.username:
        parts["user"] = u.username
    if u.password is not None:
        parts["password"] = str(u.password)
    parts.update(_options(u))
    if primary and len(found) > 1:
        parts.setdefault("target_session_attrs", "read-write")
    return " ".join(f"{k}={_conninfo_value(v)}" for k, v in parts.items())


def jdbc_url(url: str) -> tuple[str, dict[str, str]]:
    """A PostgreSQL store URL as a JDBC URL and its connection properties (the Spark checkpoint
    engine reads the store over JDBC): ``jdbc:postgresql://H1:P1,H2:P2/db?targetServerType=primary``
    for a replicated store; credentials and other options in the properties, never in the URL.
    ``PermanentError`` for another database."""
    u = parse(url)
    if not backend_for(u).jdbc_reads:
        raise PermanentError(f"no JDBC mapping for a {u.drivername} store", hint="use PostgreSQL or SQLite")
    netloc = ",".join(
        f"[{h}]:{p or DEFAULT_PORT}" if ":" in h else f"{h}:{p or DEFAULT_PORT}" for h, p in hosts(u)
    )
    props = {"driver": "org.postgresql.Driver", "user": u.username or ""}
    if u.password is not None:
        props["password"] = str(u.password)
    options = _options(u)
    attrs = options.pop("target_session_attrs", None)
    # e.g. sslmode: the JDBC driver takes the same names; connect_timeout is its connectTimeout
    props.update({_JDBC_NAMES.get(k, k): v for k, v in options.items()})
    query = ""
    if attrs is not None:
        server_type = _TARGET_SERVER_TYPES.get(attrs)
        if server_type is None:
            raise PermanentError(
                f"store URL has an unknown target_session_attrs={attrs!r}",
                hint=f"use one of {', '.join(_TARGET_SERVER_TYPES)}",
            )
        query = f"?targetServerType={server_type}"
    return f"jdbc:postgresql://{netloc}/{u.database or ''}{query}", props


# libpq's reasons for skipping a host that does not match target_session_attrs (connection failures
# have no SQLSTATE): 'connection to server at "H", port P failed: session is read-only'.
_SKIPPED_READ_ONLY = re.compile(
    r'server at "(?P<host>[^"]*)"(?: \([^)]*\))?, port (?P<port>\d+) failed: '
    r"(?:session is read-only|server is in hot standby mode)"
)


def read_only_host(message: str) -> str | None:
    """``HOST:PORT`` of a node a connection failure skipped for being read-only, if it says so."""
    match = _SKIPPED_READ_ONLY.search(message)
    return f"{match['host']}:{match['port']}" if match else None


def _standby_error(where: str) -> PermanentError:
    return PermanentError(f"the store at {where} is a read-only standby", hint=READ_ONLY_HINT)


def refuse_read_only(engine: Engine, url: str, *, writes: bool = True) -> None:
    """On a PostgreSQL store: ``PermanentError`` when the only node reached is a read-only standby
    (a multi-host URL with ``target_session_attrs=read-write`` whose primary is not reachable, or,
    for a command that ``writes``, a standby given as the only host). Nothing is written; any other
    failure is left to the caller's own first use of the store (which reports it as it always did)."""
    from delta_mirror.store.backends import backend_of

    if backend_of(engine).server_scheme is None:  # a file database has no standby
        return
    try:
        with engine.connect() as conn:
            dbapi: Any = conn.connection.dbapi_connection
            info: Any = getattr(dbapi, "info", None)  # psycopg's ConnectionInfo (libpq's view of the session)
            if not writes or not hasattr(info, "parameter_status"):
                return
            standby = info.parameter_status("in_hot_standby")  # PostgreSQL 14+: no round trip
            if standby is None:
                standby = "on" if conn.exec_driver_sql("SELECT pg_is_in_recovery()").scalar() else "off"
            if standby == "on":
                raise _standby_error(f"{info.host}:{info.port}")
    except SQLAlchemyError as exc:
        skipped = read_only_host(str(getattr(exc, "orig", exc)))
        if skipped is not None and "target_session_attrs" in parse(url).query:
            raise _standby_error(skipped) from None


__all__ = [
    "READ_ONLY_HINT",
    "URL_HINT",
    "backend_for",
    "canonical",
    "hosts",
    "hosts_text",
    "jdbc_url",
    "libpq_url",
    "parse",
    "read_only_host",
    "refuse_read_only",
]
