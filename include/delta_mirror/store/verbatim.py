"""The verbatim write path: a writer's exact commit file (Delta-Spark through the commit service).

The bytes are kept as they are: the published ``<version>.json`` is the writer's file byte for
byte. The same rules as a native commit apply (``commits.check_commit_rules``, the size limits),
and the same rows are written (``log_rows``). A commit to a root seen before takes one statement
on PostgreSQL (``_commit_verbatim_fast``, ``store/pg_commit.py``: appends, removes, deletion
vector updates, metadata and protocol changes), one short transaction on SQLite
(``store/sqlite_commit.py``); anything else takes one transaction that decides
every refusal in its usual order.
"""

from __future__ import annotations

import contextlib
import hashlib
import threading
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, select
from sqlalchemy.exc import IntegrityError

from delta_mirror.delta.actions import Action, split_commit
from delta_mirror.delta.protocol import now_ms
from delta_mirror.errors import (
    CommitConflictError,
    DataError,
    InvalidActionError,
    MirrorError,
    PermanentError,
    TableNotFoundError,
    TransientError,
)
from delta_mirror.store import db, pg_commit, sqlite_commit
from delta_mirror.store.base import version_taken
from delta_mirror.store.commits import check_commit_rules, check_rules_as_known
from delta_mirror.store.log_rows import (
    check_commit_size,
    claim_version,
    enqueue_json,
    write_actions,
)
from delta_mirror.store.schema import PART_COMMIT, dl_commits, dl_tables
from delta_mirror.store.states import CommitSource
from delta_mirror.store.tables import (
    TableInfo,
    Tables,
    check_location,
    check_table_name,
    refuse_if_halted,
    table_and_latest_at,
)


@dataclass(frozen=True)
class CommitResult:
    """A version committed by ``SqlStore.commit_verbatim``; ``existing`` when it already held these bytes."""

    table: str
    version: int
    sha256: str
    size: int
    existing: bool = False


@dataclass(frozen=True)
class _Verbatim:
    """A verbatim commit, parsed and hashed once."""

    location: str
    version: int
    data: bytes
    lines: list[str]
    actions: list[Action]
    sha256: str
    raw_ict: Any

    @property
    def ict(self) -> int | None:
        return self.raw_ict if type(self.raw_ict) is int else None


# Roots remembered by ``SqlStore.commit_verbatim`` (forgotten all at once past this many).
_KNOWN_ROOTS = 4096


class VerbatimCommits(Tables):
    """``commit_verbatim`` and its two paths (one statement, one transaction)."""

    # Set by ``SqlStore.__init__``: the tables last seen at each root (a hint the commit statement
    # itself re-checks), on SQLite one writer at a time per process (queued on a lock here rather
    # than polling SQLite's busy timeout), and per table id the protocol last seen in force (the
    # statement verifies no newer one exists).
    _verbatim_tables: dict[str, TableInfo]
    _sqlite_writes: threading.Lock | None
    _protocols: dict[int, pg_commit.Protocol]

    def commit_verbatim(
        self, location: str, version: int, data: bytes, *, create_name: str | None = None
    ) -> CommitResult:
        """Commit a writer's exact commit file as ``version`` of the table at ``location``.

        The bytes are kept as they are (lines stored verbatim, no key reordering, no commitInfo
        added): the published ``<version>.json`` is ``data`` byte for byte. The native commit rules
        apply (``_check_commit_rules``, the size limits). ``version`` already holding ``data`` is
        returned with ``existing=True`` (a retry after a lost answer); holding other bytes it is a
        ``CommitConflictError``; beyond the next version a ``DataError`` (a gap). A halted table
        refuses (``TableHaltedError``). With ``create_name``, version 0 of an unknown location
        creates the table in the same transaction, named ``create_name``, or ``create_name-<first 8
        hex digits of SHA-256(location)>`` when that name is taken.

        A commit to a table seen before at this root takes ``_commit_verbatim_fast``: one
        statement on PostgreSQL (on SQLite one short transaction, every kind too). Anything else, or
        anything that statement finds changed, takes the transaction path below, which decides
        every refusal in its usual order. A commit whose pooled connection turns out dead is tried
        once more on a fresh one (if the first try landed after all, the retry finds these very
        bytes: ``existing``).
        """
        label = create_name or location
        lines, actions = split_commit(data, table=label, version=version)
        check_commit_size(label, version, len(actions), len(data))
        commit = _Verbatim(
            location,
            version,
            data,
            lines,
            actions,
            hashlib.sha256(data).hexdigest(),
            next((body for kind, body in actions if kind == "commitInfo"), {}).get("inCommitTimestamp"),
        )
        try:
            try:
                return self._commit_verbatim_once(commit, create_name)
            except TransientError as exc:
                if not db.dead_connection(exc):
                    raise
                return self._commit_verbatim_once(commit, create_name)
        except CommitConflictError:
            # A racing retry of the same bytes may have won: that is this commit, already done.
            existing = self._existing_commit(location, version)
            if existing is not None and existing.sha256 == commit.sha256 and existing.size == len(data):
                return existing
            raise

    def _commit_verbatim_once(self, commit: _Verbatim, create_name: str | None) -> CommitResult:
        with self._sqlite_writes or contextlib.nullcontext():
            known = self._verbatim_tables.get(commit.location)
            if known is not None:
                done = self._commit_verbatim_fast(known, commit)
                if done is not None:
                    return done
            return self._commit_verbatim_in_transaction(commit, create_name)

    def _commit_verbatim_in_transaction(self, commit: _Verbatim, create_name: str | None) -> CommitResult:
        location, version, data, actions = commit.location, commit.version, commit.data, commit.actions
        try:
            with (
                db.translated(self.url, f"committing to the table at {location}"),
                self.engine.begin() as conn,
            ):
                table, latest = self._verbatim_table(conn, location, version, create_name)
                self._check_verbatim_version(table, latest, version)
                ts = claim_version(
                    conn,
                    table,
                    version,
                    CommitSource.SPARK,
                    action_count=len(actions),
                    size=len(data),
                    sha256=commit.sha256,
                    in_commit_timestamp=commit.ict,
                )
                check_commit_rules(conn, table, version, actions)
                write_actions(conn, table.id, version, PART_COMMIT, actions, strict=True, lines=commit.lines)
                enqueue_json(conn, table.id, version, ts)
        except TableNotFoundError:
            self._verbatim_tables.pop(location, None)
            raise
        if len(self._verbatim_tables) >= _KNOWN_ROOTS:
            self._verbatim_tables.clear()
            self._protocols.clear()
        self._verbatim_tables[location] = table
        self._learn_protocol(table.id, pg_commit.protocol_of(actions, version))
        return CommitResult(table.name, version, commit.sha256, len(data))

    def _learn_protocol(self, table_id: int, protocol: pg_commit.Protocol | None) -> None:
        """Remember the protocol a commit wrote (a later protocol change checks against it)."""
        if protocol is not None:
            known = self._protocols.get(table_id)
            if known is None or known.version < protocol.version:
                self._protocols[table_id] = protocol

    def _commit_verbatim_fast(self, table: TableInfo, commit: _Verbatim) -> CommitResult | None:
        """Claim the version and write the commit in one statement (PostgreSQL; on SQLite one short
        transaction), valid only while the table is still ``table`` (same id, name, root, first
        version and base checkpoint, not halted) and ``commit.version`` is its next version; else
        nothing is written and None tells the caller to take the transaction path.

        The same rows as the transaction path: the ``dl_commits`` row (whose primary key decides a
        race: ``CommitConflictError``), the actions, the file index (a re-added (path, deletion
        vector) supersedes the active entry), the ``PENDING`` status row. Every commit kind: the
        statement (``pg_commit.statement``; SQLite's ``sqlite_commit``) also checks what the rules
        read from the store (the removed files are active; a protocol change: the protocol it was
        checked against is still the newest). A commit that needs the protocol in force and finds
        none remembered, or that the rules refuse, takes the transaction path (it decides the
        refusal in its usual order), as do the other backends.
        """
        if self.engine.dialect.name not in ("postgresql", "sqlite"):
            return None
        version, actions = commit.version, commit.actions
        protocol_version, previous = None, None
        if pg_commit.needs_previous_protocol(table, version, actions):
            known = self._protocols.get(table.id)
            if known is None:
                return None
            protocol_version, previous = known.version, known.body
        try:
            check_rules_as_known(table, version, actions, previous)
        except MirrorError:
            return None
        params = pg_commit.params(
            table,
            version,
            actions,
            commit.lines,
            ts=now_ms(),
            ict=commit.ict,
            size=len(commit.data),
            sha256=commit.sha256,
            source=CommitSource.SPARK,
            protocol_version=protocol_version,
        )
        with db.translated(self.url, f"committing to the table at {table.location}"):
            try:
                if self.engine.dialect.name != "sqlite":
                    claimed = pg_commit.run(self.engine, params)
                else:  # one short transaction
                    claimed = sqlite_commit.run(self.engine, params, table.table_uuid)
            except IntegrityError as exc:  # here, not in ``translated``: a lost race is no database error
                if not db.is_unique_violation(exc):
                    raise
                raise version_taken(table.name, version) from None
        if not claimed:
            if protocol_version is not None:
                self._protocols.pop(table.id, None)  # perhaps a newer one: the transaction path reads it
            return None
        self._learn_protocol(table.id, pg_commit.protocol_of(actions, version))
        return CommitResult(table.name, version, commit.sha256, len(commit.data))

    def _verbatim_table(
        self, conn: Connection, location: str, version: int, create_name: str | None
    ) -> tuple[TableInfo, int | None]:
        """The table at ``location`` (created at version 0 with ``create_name``) and its latest version."""
        try:
            table, latest = table_and_latest_at(conn, location)
        except TableNotFoundError as exc:
            if create_name is None or version != 0:
                exc.version = version
                raise
            return self._create_verbatim(conn, location, create_name), None
        refuse_if_halted(table, version)
        return table, latest

    def _create_verbatim(self, conn: Connection, location: str, create_name: str) -> TableInfo:
        name = create_name
        taken = conn.execute(select(dl_tables.c.id).where(dl_tables.c.name == name)).first()
        if taken is not None:
            name = f"{create_name[:119]}-{hashlib.sha256(location.encode()).hexdigest()[:8]}"
        check_table_name(name)
        try:
            check_location(conn, name, location)
        except PermanentError as exc:  # the writer's root is the input here: refuse it as data
            raise InvalidActionError(exc.what, table=name, version=0, hint=exc.hint) from None
        return self._create_in(conn, name, location, 0)

    @staticmethod
    def _check_verbatim_version(table: TableInfo, latest: int | None, version: int) -> None:
        """Before claiming: an earlier version is a conflict (or this very commit), a later one a gap."""
        next_version = table.first_version if latest is None else latest + 1
        if version < next_version:
            raise CommitConflictError(
                f"version {version} is already committed (latest is {latest})",
                table=table.name,
                version=version,
                hint=f"re-read the log and commit as version {next_version}",
            )
        if version > next_version:
            raise DataError(
                f"version gap: the store's next version is {next_version}, not {version}; a writer may have"
                f" written _delta_log/{version - 1:020d}.json outside the authority",
                table=table.name,
                version=version,
                hint=f"run `delta-mirror reconcile {table.name} --strategy full`",
            )

    def _existing_commit(self, location: str, version: int) -> CommitResult | None:
        with db.translated(self.url, "reading a commit"), self.reader.connect() as conn:
            row = conn.execute(
                select(dl_tables.c.name, dl_commits.c.sha256, dl_commits.c.size_bytes)
                .select_from(dl_commits.join(dl_tables, dl_tables.c.id == dl_commits.c.table_id))
                .where(
                    dl_tables.c.location == location, dl_commits.c.version == version, dl_commits.c.has_json
                )
            ).first()
        return (
            None
            if row is None
            else CommitResult(row.name, version, row.sha256, row.size_bytes, existing=True)
        )


__all__ = ["CommitResult", "VerbatimCommits"]
