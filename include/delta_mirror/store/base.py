"""What every topic of the store shares: its URL and engines, and the one lost-race error.

``SqlStore`` (``store/sql_store.py``) is composed of one mixin per topic (tables, commits,
reads, mirror status, lag, breakers); each derives from :class:`StoreBase` for the attributes
``SqlStore.__init__`` sets.
"""

from __future__ import annotations

from sqlalchemy import Engine

from delta_mirror.errors import CommitConflictError

#: ``IN (...)`` lists are sent in chunks of this many values.
CHUNK = 500


class StoreBase:
    """The attributes every topic uses (set once by ``SqlStore.__init__``)."""

    url: str
    engine: Engine
    reader: Engine  # read-only transactions (never block writers on SQLite)


def version_taken(table: str, version: int | None) -> CommitConflictError:
    """The loser of a race for a version (the ``dl_commits`` primary key decided it)."""
    return CommitConflictError(
        "another writer committed this version first",
        table=table,
        version=version,
        hint="re-read the table and retry the commit on the new latest version",
    )


__all__ = ["CHUNK", "StoreBase", "version_taken"]
