"""Where the store lives: ``--store`` URL, else ``DELTA_MIRROR_STORE``, else SQLite under the home."""

from __future__ import annotations

import os
import re
from pathlib import Path
from urllib.parse import quote, unquote


def home() -> Path:
    """``$DELTA_MIRROR_HOME``, defaulting to ``./.delta-mirror``."""
    return Path(os.environ.get("DELTA_MIRROR_HOME", ".delta-mirror")).expanduser().resolve()


def store_url(explicit: str | None = None) -> str:
    if explicit:
        return explicit
    env = os.environ.get("DELTA_MIRROR_STORE")
    if env:
        return env
    return f"sqlite:///{home() / 'store.db'}"


# Query parameters that carry a secret (libpq takes ``?password=`` as well as ``user:password@``).
_SECRET_QUERY_KEYS = frozenset(
    {"password", "passwd", "pwd", "sslpassword", "secret", "token", "access_token"}
)


# ``scheme://[userinfo@]H1[:P1],H2[:P2][/...]``: libpq's multi-host URI form (a comma in the netloc).
_COMMA_NETLOC = re.compile(r"^(?P<scheme>[^:/?#]+://)(?:(?P<userinfo>[^@/?#]*)@)?(?P<hosts>[^/?#]*,[^/?#]*)")


def multi_host_query_form(url: str) -> str:
    """``url`` with libpq's comma form ``H1:P1,H2:P2`` in the netloc as SQLAlchemy's
    ``?host=H1:P1&host=H2:P2`` (which SQLAlchemy parses); any other URL unchanged. The store's
    ``urls.canonical`` checks the ports first."""
    match = _COMMA_NETLOC.match(url)
    if match is None:
        return url
    entries = [e.strip() for e in match["hosts"].split(",") if e.strip()]
    path, _, query = url[match.end() :].partition("?")
    hosts = "&".join(f"host={quote(unquote(e), safe='[]:')}" for e in entries)
    userinfo = f"{match['userinfo']}@" if match["userinfo"] is not None else ""
    return f"{match['scheme']}{userinfo}{path or '/'}?{hosts}" + (f"&{query}" if query else "")


def redact_url(url: str) -> str:
    """The URL with any password (in the userinfo or the query string) replaced, for messages and logs."""
    from sqlalchemy.engine import make_url

    try:
        parsed = make_url(multi_host_query_form(url))
        query = {k: ("***" if k.lower() in _SECRET_QUERY_KEYS else v) for k, v in parsed.query.items()}
        return parsed.set(query=query).render_as_string(hide_password=True).replace("%2A%2A%2A", "***")
    except Exception:
        return "<unparsable store URL>"


# Generous: real initial loads commit 100k+ adds at once; the limits only stop runaway inputs.
DEFAULT_MAX_COMMIT_ACTIONS = 1_000_000
DEFAULT_MAX_COMMIT_BYTES = 1024**3


def _limit(var: str, default: int) -> int:
    from delta_mirror.errors import PermanentError

    raw = os.environ.get(var, "").strip()
    if not raw:
        return default
    try:
        value = int(raw.replace("_", ""))
    except ValueError:
        value = 0
    if value < 1:
        raise PermanentError(f"{var}={raw!r} is not a positive integer", hint=f"unset it (default {default})")
    return value


def max_commit_actions() -> int:
    """Most actions one native commit may hold (``DELTA_MIRROR_MAX_COMMIT_ACTIONS``)."""
    return _limit("DELTA_MIRROR_MAX_COMMIT_ACTIONS", DEFAULT_MAX_COMMIT_ACTIONS)


def max_commit_bytes() -> int:
    """Largest canonical commit file / actions input in bytes (``DELTA_MIRROR_MAX_COMMIT_BYTES``)."""
    return _limit("DELTA_MIRROR_MAX_COMMIT_BYTES", DEFAULT_MAX_COMMIT_BYTES)


__all__ = [
    "DEFAULT_MAX_COMMIT_ACTIONS",
    "DEFAULT_MAX_COMMIT_BYTES",
    "home",
    "max_commit_actions",
    "max_commit_bytes",
    "multi_host_query_form",
    "redact_url",
    "store_url",
]
