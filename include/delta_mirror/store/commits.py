"""The native write path: ``SqlStore.commit`` (actions in, the next version out), and
``_import_version``: one imported version row by row (the reference the bulk import,
``store.bulk_load``, is tested against; imports go through ``SqlStore.importing``).

Invariants kept here:
- a version is committed exactly once: the ``dl_commits`` primary key decides races, the loser
  gets ``CommitConflictError`` naming the table and version;
- a commit is one transaction: a refused commit leaves the store unchanged;
- the SHA-256 and size of a version's canonical commit bytes are recorded when it is committed.

The Delta rules a commit obeys are ``delta/commit_rules.py``; :func:`check_commit_rules`
reads from the store what they need and applies them, for this path and the verbatim one alike.

A commit to a table this store committed to before is prepared from what the store remembers of
it (``commit_writer.TableCache``: what the rules and the first ``commitInfo`` read, as of its
latest version) and handed to the database's writer (``commit_writer``: one statement on
PostgreSQL, one short transaction on SQLite), which claims it only under the claim rule; anything
else takes the transaction path.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from sqlalchemy import Connection, func, select, update
from sqlalchemy.exc import IntegrityError

from delta_mirror.delta import commit_rules
from delta_mirror.delta.actions import Action, canonical_line, render_commit
from delta_mirror.delta.protocol import now_ms
from delta_mirror.errors import (
    CommitConflictError,
    MirrorError,
    PermanentError,
    TableNotFoundError,
    TransientError,
)
from delta_mirror.store import db, pg_commit
from delta_mirror.store.backends import backend_of
from delta_mirror.store.base import version_taken
from delta_mirror.store.commit_writer import (
    CommitWriter,
    KnownTable,
    PreparedCommit,
    TableCache,
    once_more_if_dead,
    refuse_version,
)
from delta_mirror.store.log_rows import (
    active_keys,
    check_commit_size,
    claim_version,
    enqueue_json,
    insert_action_rows,
    write_actions,
)
from delta_mirror.store.reads import latest_action, latest_version_in
from delta_mirror.store.schema import PART_COMMIT, dl_commits
from delta_mirror.store.states import CommitSource, TableState
from delta_mirror.store.tables import (
    TableInfo,
    Tables,
    check_table_name,
    get_table,
    refuse_if_halted,
    stored_location,
)

# Without an expected version a writer that loses a race retries on the next version this often.
_NEXT_VERSION_ATTEMPTS = 50


def check_commit_rules(
    conn: Connection | None, table: TableInfo, version: int, actions: Sequence[Action]
) -> None:
    """Every writer's commit obeys ``delta/commit_rules.py`` (native and verbatim alike); nothing is
    changed here. Only the downgrade and active-file rules read the store (``conn``): without one,
    a commit that needs them is a caller's bug."""
    previous = None
    if version > table.first_version and any(k == "protocol" for k, _ in actions):
        assert conn is not None
        if not commit_rules.drops_a_feature(actions):
            line = latest_action(conn, table.id, "protocol", version - 1)
            previous = None if line is None else json.loads(line)["protocol"]
    check_rules_as_known(table, version, actions, previous)
    removes = commit_rules.removed_files(actions)
    if removes:
        assert conn is not None
        active = active_keys(conn, table.id, [p for p, _ in removes])
        commit_rules.check_removes(removes, active, table=table.name, version=version)


def check_rules_as_known(
    table: TableInfo, version: int, actions: Sequence[Action], previous_protocol: Mapping[str, Any] | None
) -> None:
    """Every rule but the active-file one, with the protocol in force given (read from the store by
    :func:`check_commit_rules`; remembered by the one-statement paths, whose statement verifies it)."""
    commit_rules.check_actions(
        actions,
        table=table.name,
        version=version,
        location=table.location,
        first_version=table.first_version,
        first_commit=version == table.first_version and table.base_checkpoint_version is None,
        previous_protocol=previous_protocol,
    )


def _with_commit_info(
    known: KnownTable,
    actions: list[Action],
    version: int,
    ts: int,
    operation: str | None,
    metadata: Mapping[str, Any],
) -> list[Action]:
    """:func:`commit_rules.with_commit_info` for a commit at ``version`` of the table ``known``
    describes as of the version before (its first version, its last in-commit timestamp);
    ``metadata``: the commit's own metaData, else the table's."""
    return commit_rules.with_commit_info(
        actions,
        version=version,
        first_version=known.table.first_version,
        timestamp=ts,
        operation=operation,
        metadata=metadata,
        previous_ict=known.ict,
    )


class _Asked(NamedTuple):
    """A native commit as its caller asked for it (``Commits.commit``'s arguments)."""

    name: str
    actions: Sequence[Action]
    expected_version: int | None
    operation: str | None
    location: str | None


class Commits(Tables):
    """Native commits and imported versions."""

    # Set by ``SqlStore.__init__``: the one cache of what tables look like (a hint the claim
    # re-checks) and the database's writer.
    _tables: TableCache
    _writer: CommitWriter

    def commit(
        self,
        name: str,
        actions: Sequence[Action],
        *,
        expected_version: int | None = None,
        operation: str | None = None,
        location: str | None = None,
    ) -> int:
        """Commit native actions as the next version; returns it.

        Raises ``CommitConflictError`` when another writer took ``expected_version``, ``DataError``
        for invalid actions or a version gap. Nothing is written unless everything is valid.
        Without ``expected_version`` a writer that loses a race re-validates its actions and takes
        the next free version (SQLite queues writers, PostgreSQL lets them race: both behave alike;
        on MySQL a deadlock victim among the racers is one more lost race).
        ``location`` creates the table there when it does not exist, in the same transaction.

        A commit to a table this store committed to before goes to the database's writer
        (``_commit_fast``: one statement on PostgreSQL, one short transaction on SQLite); the rest,
        or what the writer finds changed, takes one transaction. A commit whose pooled connection
        turns out dead before anything could be committed is tried once more on a fresh one.
        """
        check_table_name(name)
        check_commit_size(name, expected_version, len(actions), 0)
        if location is not None:  # compared and stored in the one spelling the store keeps
            location = stored_location(name, location)
        attempts = 1 if expected_version is not None else _NEXT_VERSION_ATTEMPTS
        asked = _Asked(name, actions, expected_version, operation, location)
        for attempt in range(1, attempts + 1):
            try:
                done = self._commit_fast(asked)
                if done is not None:
                    return done
                return self._commit_in_transaction(asked)
            except CommitConflictError:
                self._tables.by_name.pop(name, None)
                if attempt >= attempts:
                    raise
            except TransientError as exc:
                # a deadlock victim (MySQL's racing inserters of one version): nothing was written
                self._tables.by_name.pop(name, None)
                if attempt >= attempts or not db.lost_a_race(exc, self.engine):
                    raise
        raise AssertionError("unreachable")

    def _commit_in_transaction(self, asked: _Asked) -> int:
        """``_commit_once``, tried once more when the connection was found dead inside the
        transaction (before its COMMIT: nothing of it can have been committed)."""
        reached_commit: list[bool] = []
        return once_more_if_dead(
            lambda: self._commit_once(asked, reached_commit),
            retry=lambda: not reached_commit,
        )

    def _commit_fast(self, asked: _Asked) -> int | None:
        """The commit prepared from what this store remembers of the table (``KnownTable``) and
        handed to the database's writer, which claims only while the table's latest version is
        still the remembered one, so everything remembered still holds. None (nothing written):
        take the transaction path, which decides any refusal in its usual order."""
        name, actions, expected_version, operation, location = asked
        known = self._tables.by_name.get(name)
        if known is None or known.table.state == TableState.HALTED:
            return None
        table = known.table
        if location is not None and location != table.location:
            return None
        version = table.first_version if known.latest is None else known.latest + 1
        if expected_version is not None and expected_version != version:
            return None
        in_force = self._tables.protocol_in_force(table, version, actions)
        if in_force is None:
            return None
        protocol_version, previous = in_force
        ordered = commit_rules.in_spark_order(actions)
        metadata = next((b for k, b in ordered if k == "metaData"), known.metadata)
        if commit_rules.in_commit_timestamps_enabled(metadata) and not known.ict_known:
            return None
        ts = now_ms()
        try:
            check_rules_as_known(table, version, actions, previous)
            ordered = _with_commit_info(known, ordered, version, ts, operation, metadata)
            lines = [canonical_line(k, b) for k, b in ordered]
            data = render_commit(lines)
            check_commit_size(name, version, len(ordered), len(data))
        except MirrorError:
            return None
        ict = ordered[0][1].get("inCommitTimestamp") if ordered[0][0] == "commitInfo" else None
        if ict is not None and type(ict) is not int:
            return None
        prepared = PreparedCommit(
            table,
            version,
            ordered,
            lines,
            CommitSource.NATIVE,
            ts,
            ict,
            len(data),
            hashlib.sha256(data).hexdigest(),
            protocol_version,
        )
        if not self._writer.write(prepared):
            self._tables.by_name.pop(name, None)
            if protocol_version is not None:
                self._tables.protocols.pop(table.id, None)
            return None
        self._remember(known.after(version, metadata, ict), pg_commit.protocol_of(ordered, version))
        return version

    def _remember(self, known: KnownTable, protocol: pg_commit.Protocol | None) -> None:
        self._tables.remember(known)
        if protocol is not None:
            self._tables.protocols[known.table.id] = protocol

    def _commit_once(self, asked: _Asked, reached_commit: list[bool]) -> int:
        """One transaction; ``reached_commit`` gets an item once its body is done (a dead connection
        found from then on may have committed it)."""
        name, actions, expected_version, operation, location = asked
        with db.translated(self.url, f"committing to table '{name}'"):
            try:
                with self.engine.begin() as conn:
                    try:
                        table = self._get_table(conn, name)
                    except TableNotFoundError:
                        if location is None:
                            raise
                        table = self._create_in(conn, name, location, expected_version)
                    else:
                        if location is not None and location != table.location:
                            raise PermanentError(
                                f"the table is at {table.location}, not {location}",
                                table=name,
                                hint="drop --location, or commit to a new table name",
                            )
                    version, known, protocol = self._commit(conn, table, actions, expected_version, operation)
                    reached_commit.append(True)
            except IntegrityError as exc:
                if backend_of(self.engine).is_unique_violation(exc):
                    raise version_taken(name, expected_version) from None
                raise
        self._remember(known, protocol)
        return version

    def _commit(
        self,
        conn: Connection,
        table: TableInfo,
        actions: Sequence[Action],
        expected_version: int | None,
        operation: str | None,
    ) -> tuple[int, KnownTable, pg_commit.Protocol | None]:
        """The commit in ``conn``'s transaction: its version, and what a next commit may remember."""
        latest = latest_version_in(conn, table.id)
        next_version = table.first_version if latest is None else latest + 1
        version = next_version if expected_version is None else expected_version
        refuse_if_halted(table, version)  # read in this transaction, before any other refusal
        refuse_version(table, latest, version, CommitSource.NATIVE)
        name = table.name
        ts = claim_version(conn, table, version, CommitSource.NATIVE)
        check_commit_rules(conn, table, version, actions)
        ordered, known = self._first_commit_info(
            conn, table, version, commit_rules.in_spark_order(actions), ts, operation
        )
        write_actions(conn, table.id, version, PART_COMMIT, ordered, strict=True)
        data = render_commit([canonical_line(k, b) for k, b in ordered])
        check_commit_size(name, version, len(ordered), len(data))
        ict = ordered[0][1].get("inCommitTimestamp") if ordered[0][0] == "commitInfo" else None
        conn.execute(
            update(dl_commits)
            .where(dl_commits.c.table_id == table.id, dl_commits.c.version == version)
            .values(
                action_count=len(ordered),
                size_bytes=len(data),
                sha256=hashlib.sha256(data).hexdigest(),
                in_commit_timestamp=ict,
            )
        )
        enqueue_json(conn, table.id, version, ts)
        old = self._tables.by_name.get(name)
        if not known.ict_known and old is not None and old.table.id == table.id and old.latest == latest:
            known = KnownTable(table, latest, known.metadata, old.ict, old.ict_known)
        return version, known.after(version, known.metadata, ict), pg_commit.protocol_of(ordered, version)

    @staticmethod
    def _first_commit_info(
        conn: Connection,
        table: TableInfo,
        version: int,
        actions: list[Action],
        ts: int,
        operation: str | None,
    ) -> tuple[list[Action], KnownTable]:
        """:func:`commit_rules.with_commit_info` with the table's metaData and last in-commit
        timestamp read from the store; and what was read, as of ``version - 1``."""
        metadata = next((b for k, b in actions if k == "metaData"), None)
        if metadata is None:
            prev = latest_action(conn, table.id, "metaData", version - 1)
            metadata = json.loads(prev)["metaData"] if prev else {}
        previous_ict = None
        ict_known = version == table.first_version  # no timestamp before the first commit
        if commit_rules.in_commit_timestamps_enabled(metadata):
            ict_known = True
            previous_ict = conn.execute(
                select(func.max(dl_commits.c.in_commit_timestamp)).where(dl_commits.c.table_id == table.id)
            ).scalar()
        known = KnownTable(table, None, metadata, previous_ict, ict_known)  # as of version - 1
        return _with_commit_info(known, actions, version, ts, operation, metadata), known

    # -- import ---------------------------------------------------------------------------------
    def _import_version(
        self,
        conn: Connection,
        table: TableInfo,
        version: int,
        actions: Sequence[Action],
        lines: Sequence[str],
        *,
        part: int = PART_COMMIT,
        has_json: bool = True,
        committed_at: int | None = None,
        published_sha256: str | None = None,
        published_size: int | None = None,
        index_files: bool = True,
    ) -> None:
        """Record one imported version (in the caller's transaction); actions are kept as they were.

        ``index_files=False`` stores a commit whose effect is already in the base snapshot.
        ``published_sha256`` marks the version as already present at the location (in-place import).
        """
        refuse_if_halted(get_table(conn, table.name), version)  # its state now, not the caller's copy
        ts = committed_at or now_ms()
        if part == PART_COMMIT:
            data = render_commit(lines)
            ict = None
            if actions and actions[0][0] == "commitInfo":
                raw = actions[0][1].get("inCommitTimestamp")
                ict = raw if isinstance(raw, int) else None
            claim_version(
                conn,
                table,
                version,
                CommitSource.IMPORT,
                action_count=len(actions),
                size=len(data) if has_json else 0,
                sha256=hashlib.sha256(data).hexdigest() if has_json else "",
                in_commit_timestamp=ict,
                has_json=has_json,
                committed_at=ts,
            )
            if has_json:
                enqueue_json(
                    conn,
                    table.id,
                    version,
                    ts,
                    published_sha256=published_sha256,
                    published_size=published_size,
                )
        if index_files:
            write_actions(conn, table.id, version, part, actions, strict=False, lines=lines)
        else:
            insert_action_rows(conn, table.id, version, part, actions, lines)


__all__ = ["Commits", "check_commit_rules"]
