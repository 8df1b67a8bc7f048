"""The store's fixtures: a table location and an initialised PostgreSQL store for the tests of
PostgreSQL's own commit paths (the ``store`` parametrized over every backend is tests/conftest.py's)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from delta_mirror.store import SqlStore


@pytest.fixture
def location(tmp_path: Path) -> str:
    return (tmp_path / "table").as_uri()


@pytest.fixture
def pg_store(pg_store_url: str) -> Iterator[SqlStore]:
    store = SqlStore(pg_store_url)
    store.init()
    yield store
    store.close()
