"""The store's fixtures: an initialised store on real SQLite and real PostgreSQL (``store_url``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from delta_mirror.store import SqlStore


@pytest.fixture
def store(store_url: str) -> Iterator[SqlStore]:
    s = SqlStore(store_url)
    s.init()
    yield s
    s.close()


@pytest.fixture
def location(tmp_path: Path) -> str:
    return (tmp_path / "table").as_uri()
