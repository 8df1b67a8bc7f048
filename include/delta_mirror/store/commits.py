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
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence

from sqlalchemy import Connection, func, select, update
from sqlalchemy.exc import IntegrityError

from delta_mirror.delta import commit_rules
from delta_mirror.delta.actions import Action, canonical_line, render_commit
from delta_mirror.delta.protocol import now_ms
from delta_mirror.errors import CommitConflictError, DataError, PermanentError, TableNotFoundError
from delta_mirror.store import db
from delta_mirror.store.base import version_taken
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
from delta_mirror.store.states import CommitSource
from delta_mirror.store.tables import TableInfo, Tables, check_table_name, get_table, refuse_if_halted

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
    commit_rules.check_actions(
        actions,
        table=table.name,
        version=version,
        location=table.location,
        first_version=table.first_version,
        first_commit=version == table.first_version and table.base_checkpoint_version is None,
        previous_protocol=previous,
    )
    removes = commit_rules.removed_files(actions)
    if removes:
        assert conn is not None
        active = active_keys(conn, table.id, [p for p, _ in removes])
        commit_rules.check_removes(removes, active, table=table.name, version=version)


class Commits(Tables):
    """Native commits and imported versions."""

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
        the next free version (SQLite queues writers, PostgreSQL lets them race: both behave alike).
        ``location`` creates the table there when it does not exist, in the same transaction.
        """
        check_table_name(name)
        check_commit_size(name, expected_version, len(actions), 0)
        attempts = 1 if expected_version is not None else _NEXT_VERSION_ATTEMPTS
        for attempt in range(1, attempts + 1):
            try:
                return self._commit_once(name, actions, expected_version, operation, location)
            except CommitConflictError:
                if attempt >= attempts:
                    raise
        raise AssertionError("unreachable")

    def _commit_once(
        self,
        name: str,
        actions: Sequence[Action],
        expected_version: int | None,
        operation: str | None,
        location: str | None,
    ) -> int:
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
                        if location is not None and location.rstrip("/") != table.location.rstrip("/"):
                            raise PermanentError(
                                f"the table is at {table.location}, not {location}",
                                table=name,
                                hint="drop --location, or commit to a new table name",
                            )
                    return self._commit(conn, table, actions, expected_version, operation)
            except IntegrityError as exc:
                if db.is_unique_violation(exc):
                    raise version_taken(name, expected_version) from None
                raise

    def _commit(
        self,
        conn: Connection,
        table: TableInfo,
        actions: Sequence[Action],
        expected_version: int | None,
        operation: str | None,
    ) -> int:
        latest = latest_version_in(conn, table.id)
        next_version = table.first_version if latest is None else latest + 1
        version = next_version if expected_version is None else expected_version
        refuse_if_halted(table, version)  # read in this transaction, before any other refusal
        name = table.name
        if version < next_version:
            raise CommitConflictError(
                f"version {version} is already committed (latest is {latest})",
                table=name,
                version=version,
                hint=f"commit as version {next_version}",
            )
        if version > next_version:
            raise DataError(
                f"version gap: the next version is {next_version}, not {version}",
                table=name,
                version=version,
                hint="versions must be contiguous; omit the expected version",
            )
        ts = claim_version(conn, table, version, CommitSource.NATIVE)
        check_commit_rules(conn, table, version, actions)
        ordered = self._first_commit_info(
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
        return version

    @staticmethod
    def _first_commit_info(
        conn: Connection,
        table: TableInfo,
        version: int,
        actions: list[Action],
        ts: int,
        operation: str | None,
    ) -> list[Action]:
        """:func:`commit_rules.with_commit_info` with the table's metaData and last in-commit
        timestamp read from the store."""
        metadata = next((b for k, b in actions if k == "metaData"), None)
        if metadata is None:
            prev = latest_action(conn, table.id, "metaData", version - 1)
            metadata = json.loads(prev)["metaData"] if prev else {}
        previous_ict = None
        if commit_rules.in_commit_timestamps_enabled(metadata):
            previous_ict = conn.execute(
                select(func.max(dl_commits.c.in_commit_timestamp)).where(dl_commits.c.table_id == table.id)
            ).scalar()
        return commit_rules.with_commit_info(
            actions,
            version=version,
            first_version=table.first_version,
            timestamp=ts,
            operation=operation,
            metadata=metadata,
            previous_ict=previous_ict,
        )

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
