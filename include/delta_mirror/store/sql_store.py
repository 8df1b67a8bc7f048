"""``SqlStore``: the authority for every table's Delta log, one facade over the store's topics
(the module list is in ``store/__init__.py``).

Invariants (kept in ``commits.py`` and ``verbatim.py``): a version is committed exactly once (the
``dl_commits`` primary key decides races); a commit is one transaction, so a refused commit leaves
the store unchanged; the SHA-256 and size of a version's commit bytes are recorded with it.
"""

from __future__ import annotations

from delta_mirror.config import redact_url
from delta_mirror.config import store_url as resolve_store_url
from delta_mirror.delta.protocol import now_ms
from delta_mirror.errors import PermanentError
from delta_mirror.store import db
from delta_mirror.store.backends import backend_of
from delta_mirror.store.breakers import Breakers, BreakerState
from delta_mirror.store.commit_writer import TableCache
from delta_mirror.store.commits import Commits
from delta_mirror.store.importing import Imports
from delta_mirror.store.lag import LagHistory
from delta_mirror.store.latency import VersionLatency
from delta_mirror.store.mirror_status import MirrorStatus, StatusRow
from delta_mirror.store.reads import CommitRow, FileEntry, FileIdRange, Reads, Snapshot
from delta_mirror.store.table_failures import TableFailures
from delta_mirror.store.tables import TABLE_NAME, TableInfo, check_table_name, default_table_name
from delta_mirror.store.verbatim import CommitResult, VerbatimCommits


class SqlStore(
    VerbatimCommits,
    Commits,
    Imports,
    Reads,
    MirrorStatus,
    LagHistory,
    VersionLatency,
    TableFailures,
    Breakers,
):
    """The authority for every table's Delta log, on SQLite or PostgreSQL."""

    def __init__(self, url: str | None = None, *, shared_engine: bool = False) -> None:
        """``shared_engine``: use the process's pooled engine for the URL (``db.shared_engine``);
        ``close`` then leaves it open for the other users."""
        self.url = resolve_store_url(url)
        self._shared_engine = shared_engine
        self.engine = db.shared_engine(self.url) if shared_engine else db.make_engine(self.url)
        self.reader = db.reader(self.engine)
        self._tables = TableCache()
        self._writer = backend_of(self.engine).writer(self.engine, self.url)

    @property
    def display_url(self) -> str:
        return redact_url(self.url)

    def init(self) -> None:
        """Create or upgrade the schema (idempotent)."""
        with db.translated(self.url, "initialising the store"):
            db.migrate(self.engine)

    def ensure_initialised(self) -> None:
        with db.translated(self.url, "opening the store"):
            if not db.is_initialised(self.engine):
                raise PermanentError(
                    f"the store at {self.display_url} is not initialised",
                    hint="run `delta-mirror init` first",
                )

    def close(self) -> None:
        if not self._shared_engine:
            self.engine.dispose()


__all__ = [
    "TABLE_NAME",
    "BreakerState",
    "CommitResult",
    "CommitRow",
    "FileEntry",
    "FileIdRange",
    "Snapshot",
    "SqlStore",
    "StatusRow",
    "TableInfo",
    "check_table_name",
    "default_table_name",
    "now_ms",
]
