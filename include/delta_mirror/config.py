"""Where the store lives: ``--store`` URL, else ``DELTA_MIRROR_STORE``, else SQLite under the home."""

from __future__ import annotations

import os
from pathlib import Path


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


def redact_url(url: str) -> str:
    """The URL with any password (in the userinfo or the query string) replaced, for messages and logs."""
    from sqlalchemy.engine import make_url

    try:
        parsed = make_url(url)
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
    "redact_url",
    "store_url",
]
