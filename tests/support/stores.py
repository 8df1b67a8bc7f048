"""Fresh SQL stores for tests: the one way a test opens an initialised store of its own."""

from __future__ import annotations

from pathlib import Path

from delta_mirror.store import SqlStore


def init_store(url: str) -> SqlStore:
    """An initialised ``SqlStore`` on ``url`` (the caller closes it)."""
    store = SqlStore(url)
    store.init()
    return store


def sqlite_store(folder: Path) -> tuple[str, SqlStore]:
    """A fresh, initialised SQLite store in ``folder/store.db``: its URL and the store."""
    url = f"sqlite:///{folder / 'store.db'}"
    return url, init_store(url)
