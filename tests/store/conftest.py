"""The store's fixtures: a table location (the initialised ``store`` on SQLite and PostgreSQL is
tests/conftest.py's)."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def location(tmp_path: Path) -> str:
    return (tmp_path / "table").as_uri()
