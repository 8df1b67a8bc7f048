"""The row count the store's add actions describe (``numRecords`` minus deletion-vector cardinality),
which a reader's ``count(*)`` must equal."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from typing import Any


def num_records(add: Mapping[str, Any]) -> int | None:
    """The ``numRecords`` statistic of an add, or ``None`` when it has none."""
    stats = add.get("stats")
    try:
        n = json.loads(stats).get("numRecords") if isinstance(stats, str) else None
    except (json.JSONDecodeError, AttributeError):
        n = None
    return n if isinstance(n, int) and not isinstance(n, bool) else None


def dv_cardinality(add: Mapping[str, Any]) -> int:
    dv = add.get("deletionVector")
    return int(dv.get("cardinality") or 0) if isinstance(dv, dict) else 0


def expected_rows(files: Iterable[tuple[str, int | None, int]], exists: Callable[[str], bool]) -> int | None:
    """Rows of (path, numRecords, deleted rows) files; ``None`` when one lacks stats or is absent.

    A missing data file is the writer's data, not the log: the count is then not compared.
    """
    total = 0
    for path, records, deleted in files:
        if records is None or not exists(path):
            return None
        total += records - deleted
    return total


__all__ = ["dv_cardinality", "expected_rows", "num_records"]
