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


def redact_url(url: str) -> str:
    """The URL with any password replaced, for messages and logs."""
    from sqlalchemy.engine import make_url

    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001 - an unparsable URL is reported by the caller
        return "<unparsable store URL>"


__all__ = ["home", "redact_url", "store_url"]
