"""One commit pipeline: a commit prepared once (:class:`PreparedCommit`), claimed and written by
the one :class:`CommitWriter` the store's database has (its ``backends`` module names it), with one cache of what tables look like
(:class:`TableCache`) and one retry rule (:func:`once_more_if_dead`).

**The claim rule**, written once here (each database's writer implements it; the differential
test, tests/store/test_commit_differential.py, compares them with a Python reference). A writer
claims version ``v`` of table ``T`` only while

- ``T`` is the table as the caller last saw it: same id, ``table_uuid``, name, root, first version
  and base checkpoint (a table dropped and re-created at the same root under the same name is
  another table, even where the database gives it the old id, as SQLite does for the newest row);
- ``T`` is not halted;
- ``v`` is ``T``'s next version (its latest + 1, or its first version);
- every (path, deletion vector) the commit removes is active;
- when the Delta rules were checked against a remembered protocol written at version ``pv``, no
  protocol newer than ``pv`` exists.

Otherwise it writes nothing and answers False: the caller then takes the transaction path (a
SQLAlchemy transaction on every database), which reads the table, decides any refusal in its
usual order (halted, then taken version or gap, then the Delta rules) and writes the same rows
(``log_rows``). The ``dl_commits`` primary key still decides a race: ``CommitConflictError``.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from sqlalchemy import Engine, select
from sqlalchemy.exc import IntegrityError

from delta_mirror.delta.actions import Action
from delta_mirror.errors import CommitConflictError, TransientError, VersionGapError
from delta_mirror.store import db, pg_commit, sqlite_commit
from delta_mirror.store.backends import backend_of
from delta_mirror.store.base import version_taken
from delta_mirror.store.schema import dl_commits
from delta_mirror.store.states import CommitSource
from delta_mirror.store.tables import TableInfo

_T = TypeVar("_T")


@dataclass(frozen=True)
class PreparedCommit:
    """A commit after parsing and the Delta rules: what any writer needs to claim and write it.

    ``actions``/``lines``: in their stored order (``seq``); ``protocol_version``: the version of the
    remembered protocol the rules were checked against (None: they read none)."""

    table: TableInfo
    version: int
    actions: Sequence[Action]
    lines: Sequence[str]
    source: CommitSource
    ts: int
    ict: int | None
    size: int
    sha256: str
    protocol_version: int | None

    def params(self) -> dict[str, Any]:
        """The claim's and the rows' parameters (``pg_commit.params``), shared by every writer."""
        return pg_commit.params(
            self.table,
            self.version,
            self.actions,
            self.lines,
            ts=self.ts,
            ict=self.ict,
            size=self.size,
            sha256=self.sha256,
            source=self.source,
            protocol_version=self.protocol_version,
        )


class CommitWriter(Protocol):
    """How one database claims a prepared commit and writes its rows in one go."""

    #: Held around a verbatim commit: SQLite's writers of one process queue here rather than on
    #: its busy timeout; elsewhere a no-op.
    queue: contextlib.AbstractContextManager[Any]

    def write(self, commit: PreparedCommit) -> bool:
        """Claim ``commit.version`` under the claim rule and write every row; False: the rule did
        not hold and nothing was written. ``CommitConflictError`` when another writer holds the
        version (the primary key); other database errors as the core's error classes."""
        ...


def once_more_if_dead(attempt: Callable[[], _T], *, retry: Callable[[], bool] = lambda: True) -> _T:
    """The store's one retry rule for a commit: a pooled connection found dead is replaced and the
    attempt runs once more (``retry()`` says whether that is still safe: nothing of the first
    attempt can have been committed, or the retry finds out)."""
    try:
        return attempt()
    except TransientError as exc:
        if not db.dead_connection(exc) or not retry():
            raise
    return attempt()


class _Translated:
    """What every writer shares: its engine and URL, a unique violation as a lost race."""

    queue: contextlib.AbstractContextManager[Any] = contextlib.nullcontext()

    def __init__(self, engine: Engine, url: str) -> None:
        self.engine = engine
        self.url = url

    @contextlib.contextmanager
    def _claiming(self, commit: PreparedCommit) -> Iterator[None]:
        with db.translated(self.url, f"committing to table '{commit.table.name}'"):
            try:
                yield
            except IntegrityError as exc:  # here, not in ``translated``: a lost race
                if not backend_of(self.engine).is_unique_violation(exc):
                    raise
                raise version_taken(commit.table.name, commit.version) from None


class TransactionOnly(_Translated):
    """MySQL/MariaDB and DuckDB: no one-round-trip claim; every commit takes the transaction path."""

    def write(self, commit: PreparedCommit) -> bool:
        return False


class SqliteShortTransaction(_Translated):
    """SQLite: ``sqlite_commit.run``, one short ``BEGIN IMMEDIATE`` transaction (a killed process
    leaves none of it, so no retry is needed to learn whether it landed)."""

    def __init__(self, engine: Engine, url: str) -> None:
        super().__init__(engine, url)
        self.queue = threading.Lock()

    def write(self, commit: PreparedCommit) -> bool:
        with self._claiming(commit):
            return sqlite_commit.run(self.engine, commit.params())


class PgOneStatement(_Translated):
    """PostgreSQL: ``pg_commit.run``, one statement (one round trip, plus its NOTIFY).

    A connection found dead may have died before the statement or after it committed: the same
    statement is sent once more on a fresh connection (a first one that landed, or still runs on a
    lost connection, makes it claim nothing or lose on the primary key), then the version's row
    tells which (its hash and commit time)."""

    def write(self, commit: PreparedCommit) -> bool:
        params = commit.params()
        first = [True]

        def attempt() -> bool:
            try:
                with self._claiming(commit):
                    return pg_commit.run(self.engine, params)
            except CommitConflictError:
                if first[0]:
                    raise
                return False  # the first attempt's, or a racer's: ``_landed`` tells

        def again() -> bool:
            first[0] = False
            return True

        return once_more_if_dead(attempt, retry=again) or (not first[0] and self._landed(commit, params))

    def _landed(self, commit: PreparedCommit, params: Mapping[str, Any]) -> bool:
        """Whether the version holds this commit; False when it is not committed; another writer's
        version is a conflict."""
        with db.translated(self.url, "reading a commit"), self.engine.connect() as conn:
            row = conn.execute(
                select(dl_commits.c.sha256, dl_commits.c.committed_at).where(
                    dl_commits.c.table_id == commit.table.id, dl_commits.c.version == commit.version
                )
            ).first()
        if row is None:
            return False
        if (row.sha256, row.committed_at) == (params["sha"], params["ts"]):
            return True
        raise version_taken(commit.table.name, commit.version)


def refuse_version(table: TableInfo, latest: int | None, version: int, source: CommitSource) -> None:
    """The one version check of every commit kind, before claiming: an earlier version is a
    conflict, a later one a gap (the hints say what the writer of each kind does next)."""
    next_version = table.first_version if latest is None else latest + 1
    native = source == CommitSource.NATIVE
    if version < next_version:
        raise CommitConflictError(
            f"version {version} is already committed (latest is {latest})",
            table=table.name,
            version=version,
            hint=f"commit as version {next_version}"
            if native
            else f"re-read the log and commit as version {next_version}",
        )
    if version > next_version:
        if native:
            what = f"version gap: the next version is {next_version}, not {version}"
            hint = "versions must be contiguous; omit the expected version"
        else:
            what = (
                f"version gap: the store's next version is {next_version}, not {version}; a writer may"
                f" have written _delta_log/{version - 1:020d}.json outside the authority"
            )
            hint = f"run `delta-mirror reconcile {table.name} --strategy full`"
        raise VersionGapError(what, next_version=next_version, table=table.name, version=version, hint=hint)


@dataclass(frozen=True)
class KnownTable:
    """What a native commit reads from the store, as of the table's version ``latest``: it holds
    while ``latest`` is the latest version (versions are never rewritten), which the claim rule
    verifies. ``ict``: the greatest in-commit timestamp so far; ``ict_known`` False when this store
    never read it (a commit that needs it takes the transaction path)."""

    table: TableInfo
    latest: int | None
    metadata: Mapping[str, Any]
    ict: int | None
    ict_known: bool

    def after(self, version: int, metadata: Mapping[str, Any], ict: Any) -> KnownTable:
        """The same facts once ``version`` (with this metaData and in-commit timestamp) is committed."""
        if ict is None:
            return KnownTable(self.table, version, metadata, self.ict, self.ict_known)
        if type(ict) is not int:
            return KnownTable(self.table, version, metadata, None, False)
        return KnownTable(self.table, version, metadata, max(ict, self.ict or ict), self.ict_known)


# Entries kept per map (each forgotten all at once past this many).
_KEPT = 4096


class TableCache:
    """The one cache of what tables look like, per store: a hint every claim re-checks (the claim
    rule), never a source of truth. Native commits look a table up by name, verbatim ones by root;
    the protocol in force is kept per table id."""

    def __init__(self) -> None:
        self.by_name: dict[str, KnownTable] = {}
        self.by_root: dict[str, TableInfo] = {}
        self.protocols: dict[int, pg_commit.Protocol] = {}

    def clear(self) -> None:
        self.by_name.clear()
        self.by_root.clear()
        self.protocols.clear()

    def remember(self, known: KnownTable) -> None:
        if len(self.by_name) >= _KEPT:
            self.by_name.clear()
        self.by_name[known.table.name] = known

    def remember_root(self, table: TableInfo) -> None:
        if len(self.by_root) >= _KEPT:
            self.by_root.clear()
            self.protocols.clear()
        self.by_root[table.location] = table

    def protocol_in_force(
        self, table: TableInfo, version: int, actions: Sequence[Action]
    ) -> tuple[int | None, Mapping[str, Any] | None] | None:
        """What the Delta rules of a commit at ``version`` are checked against: (the version, the
        body) of the remembered protocol in force, (None, None) when the commit needs none, None
        when it needs one and none is remembered (then it takes the transaction path)."""
        if not pg_commit.needs_previous_protocol(table, version, actions):
            return None, None
        known = self.protocols.get(table.id)
        return None if known is None else (known.version, known.body)

    def learn_protocol(self, table_id: int, protocol: pg_commit.Protocol | None) -> None:
        """Remember the protocol a commit wrote (a later protocol change checks against it)."""
        if protocol is not None:
            known = self.protocols.get(table_id)
            if known is None or known.version < protocol.version:
                self.protocols[table_id] = protocol


__all__ = [
    "CommitWriter",
    "KnownTable",
    "PgOneStatement",
    "PreparedCommit",
    "SqliteShortTransaction",
    "TableCache",
    "TransactionOnly",
    "once_more_if_dead",
    "refuse_version",
]
