"""What every topic of the store shares: its URL and engines, and the one lost-race error.

``SqlStore`` (``store/sql_store.py``) is composed of one mixin per topic (tables, commits,
reads, mirror status, lag, breakers); each derives from :class:`StoreBase` for the attributes
``SqlStore.__init__`` sets.
"""

from __future__ import annotations

from dataclasses import fields
from functools import cache
from typing import TYPE_CHECKING, Any, TypeVar

from sqlalchemy import Engine

from delta_mirror.errors import CommitConflictError

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

_D = TypeVar("_D", bound="DataclassInstance")

#: ``IN (...)`` lists are sent in chunks of this many values.
CHUNK = 500


class StoreBase:
    """The attributes every topic uses (set once by ``SqlStore.__init__``)."""

    url: str
    engine: Engine
    reader: Engine  # read-only transactions (never block writers on SQLite)


@cache
def _field_names(cls: type[DataclassInstance]) -> tuple[str, ...]:
    return tuple(f.name for f in fields(cls))


def from_row(cls: type[_D], row: Any, **computed: Any) -> _D:
    """The dataclass ``cls`` from a result row whose columns carry its field names; ``computed``
    gives the fields whose value is not the column as it is (e.g. parsed JSON)."""
    return cls(
        **{name: computed[name] if name in computed else getattr(row, name) for name in _field_names(cls)}
    )


def version_taken(table: str, version: int | None) -> CommitConflictError:
    """The loser of a race for a version (the ``dl_commits`` primary key decided it)."""
    return CommitConflictError(
        "another writer committed this version first",
        table=table,
        version=version,
        hint="re-read the table and retry the commit on the new latest version",
    )


__all__ = ["CHUNK", "StoreBase", "from_row", "version_taken"]
