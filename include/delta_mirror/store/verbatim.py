"""The verbatim write path: a writer's exact commit file (Delta-Spark through the commit service).

The bytes are kept as they are: the published ``<version>.json`` is the writer's file byte for
byte. The same rules as a native commit apply (``commits.check_commit_rules``, the size limits),
and the same rows are written (``log_rows``). A commit to a root seen before is handed to the
database's writer (``_commit_verbatim_fast``, ``store/commit_writer.py``: one statement on
PostgreSQL, one short transaction on SQLite; every commit kind); anything else takes one
transaction that decides every refusal in its usual order.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, select

from delta_mirror.delta.actions import Action, split_commit
from delta_mirror.delta.protocol import now_ms
from delta_mirror.errors import (
    CommitConflictError,
    InvalidActionError,
    MirrorError,
    PermanentError,
    TableNotFoundError,
)
from delta_mirror.store import db, pg_commit
from delta_mirror.store.commit_writer import (
    CommitWriter,
    PreparedCommit,
    TableCache,
    once_more_if_dead,
    refuse_version,
)
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


class VerbatimCommits(Tables):
    """``commit_verbatim`` and its two paths (one statement, one transaction)."""

    # Set by ``SqlStore.__init__``: the one cache of what tables look like (here: the table last
    # seen at each root and the protocol in force, hints the claim re-checks) and the database's
    # writer (whose ``queue`` a verbatim commit holds: on SQLite one writer at a time per process).
    _tables: TableCache
    _writer: CommitWriter

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

        A commit to a table seen before at this root takes ``_commit_verbatim_fast``: the
        database's writer (one statement on PostgreSQL, one short transaction on SQLite, every
        kind). Anything else, or anything the writer finds changed, takes the transaction path
        below, which decides every refusal in its usual order. A commit whose pooled connection turns out dead is tried
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
            return once_more_if_dead(lambda: self._commit_verbatim_once(commit, create_name))
        except CommitConflictError:
            # A racing retry of the same bytes may have won: that is this commit, already done.
            existing = self._existing_commit(location, version)
            if existing is not None and existing.sha256 == commit.sha256 and existing.size == len(data):
                return existing
            raise

    def _commit_verbatim_once(self, commit: _Verbatim, create_name: str | None) -> CommitResult:
        with self._writer.queue:
            known = self._tables.by_root.get(commit.location)
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
                refuse_version(table, latest, version, CommitSource.SPARK)
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
            self._tables.by_root.pop(location, None)
            raise
        self._tables.remember_root(table)
        self._tables.learn_protocol(table.id, pg_commit.protocol_of(actions, version))
        return CommitResult(table.name, version, commit.sha256, len(data))

    def _commit_verbatim_fast(self, table: TableInfo, commit: _Verbatim) -> CommitResult | None:
        """The commit prepared against ``table`` (the one last seen at this root) and handed to the
        database's writer, which claims it only under the claim rule (``commit_writer``) and writes
        the transaction path's rows; None (nothing written): take the transaction path. A commit
        that needs the protocol in force and finds none remembered, or that the rules refuse, takes
        it too (it decides the refusal in its usual order)."""
        version, actions = commit.version, commit.actions
        in_force = self._tables.protocol_in_force(table, version, actions)
        if in_force is None:
            return None
        protocol_version, previous = in_force
        try:
            check_rules_as_known(table, version, actions, previous)
        except MirrorError:
            return None
        prepared = PreparedCommit(
            table,
            version,
            actions,
            commit.lines,
            CommitSource.SPARK,
            now_ms(),
            commit.ict,
            len(commit.data),
            commit.sha256,
            protocol_version,
        )
        if not self._writer.write(prepared):
            if protocol_version is not None:
                self._tables.protocols.pop(
                    table.id, None
                )  # perhaps a newer one: the transaction path reads it
            return None
        self._tables.learn_protocol(table.id, pg_commit.protocol_of(actions, version))
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
