"""The publish status of each version's artifacts (``dl_mirror_status``): the publisher's queue.

One row per (table, version, artifact): ``PENDING`` → ``IN_PROGRESS`` (under the table's lease)
→ ``SUCCESS`` once the file was read back durable, or ``FAILED`` (retried later) / ``CONFLICT``
(a different file is at the location). A new lease holder re-drives what a crashed one left
``IN_PROGRESS``; the reconciler queues again what it found missing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import ColumnElement, Connection, and_, bindparam, func, insert, select, text, update

from delta_mirror.delta.protocol import now_ms
from delta_mirror.store import db
from delta_mirror.store.backends import backend_of
from delta_mirror.store.base import StoreBase, from_row
from delta_mirror.store.schema import dl_mirror_status, dl_tables
from delta_mirror.store.states import Artifact, PublishState
from delta_mirror.store.table_failures import TableFailure


@dataclass(frozen=True)
class StatusRow:
    version: int
    artifact: str
    state: str
    attempts: int
    error_class: str | None
    last_error: str | None
    sha256: str | None
    size_bytes: int | None
    enqueued_at: int
    started_at: int | None
    finished_at: int | None


@dataclass(frozen=True)
class FleetRow:
    """What ``status`` says of one table, read for every table at once (``MirrorStatus.fleet_rows``)."""

    table_id: int
    latest_committed: int | None
    last_json: int | None  # highest version with a JSON status row
    last_checkpoint: int | None  # highest checkpoint published
    first_open: int | None  # lowest JSON version not SUCCESS (pending, in progress, failed, conflict)
    first_open_committed_at: int | None
    pending: int  # JSON versions PENDING or IN_PROGRESS
    failed: int  # versions (any artifact) FAILED
    conflicts: int  # versions (any artifact) CONFLICT
    last_error_class: str | None  # of the failed or conflicting row that finished last
    last_error: str | None
    failure: TableFailure | None = None  # its failed publish attempts in a row (dl_table_failures)


# The fleet queries: a constant number of statements for any number of tables, each an index lookup
# per table (dl_commits' and dl_mirror_status' primary keys) or a read of the unfinished rows only
# (the partial index ix_dl_mirror_status_open, migration 0004: `state <> 'SUCCESS'` is written as a
# literal so SQLite can use it too). No statement reads a table's whole history: the newest version
# is ORDER BY version DESC LIMIT 1, a backward index walk that stops at the first match (SQLite's
# max() shortcut does not apply when the artifact, a later key column, is filtered too).
_FLEET_TOPS = """
SELECT t.id,
  (SELECT c.version FROM dl_commits c WHERE c.table_id = t.id
    ORDER BY c.version DESC LIMIT 1) AS latest,
  (SELECT m.version FROM dl_mirror_status m WHERE m.table_id = t.id AND m.artifact = 'json'
    ORDER BY m.version DESC LIMIT 1) AS last_json,
  (SELECT m.version FROM dl_mirror_status m
    WHERE m.table_id = t.id AND m.artifact = 'checkpoint' AND m.state = 'SUCCESS'
    ORDER BY m.version DESC LIMIT 1) AS last_checkpoint,
  f.error_class, f.message, f.first_failed_at, f.last_failed_at, f.attempts
FROM dl_tables t LEFT JOIN dl_table_failures f ON f.table_id = t.id {where}
"""
_FLEET_OPEN = """
SELECT m.table_id, m.artifact, m.state, count(*) AS n, min(m.version) AS first
FROM dl_mirror_status m WHERE m.state <> 'SUCCESS' {and_ids}
GROUP BY m.table_id, m.artifact, m.state
"""
_FLEET_OPEN_TIMES = """
SELECT o.table_id, c.committed_at FROM (
  SELECT m.table_id, min(m.version) AS v FROM dl_mirror_status m
  WHERE m.state <> 'SUCCESS' AND m.artifact = 'json' {and_ids} GROUP BY m.table_id
) o JOIN dl_commits c ON c.table_id = o.table_id AND c.version = o.v
"""
_FLEET_LAST_ERRORS = """
SELECT table_id, error_class, last_error FROM (
  SELECT m.table_id, m.error_class, m.last_error, row_number() OVER (
    PARTITION BY m.table_id ORDER BY coalesce(m.finished_at, 0) DESC, m.version, m.artifact) AS rn
  FROM dl_mirror_status m WHERE m.state <> 'SUCCESS' AND m.state IN ('FAILED', 'CONFLICT') {and_ids}
) e WHERE rn = 1
"""


def _artifact_rows(table_id: int, artifact: str, *more: ColumnElement[bool]) -> ColumnElement[bool]:
    """The WHERE of a table's status rows of one artifact (and ``more``)."""
    return and_(dl_mirror_status.c.table_id == table_id, dl_mirror_status.c.artifact == artifact, *more)


def _top_version(conn: Connection, table_id: int, artifact: str, *more: ColumnElement[bool]) -> int | None:
    """The highest version among the table's ``artifact`` rows (matching ``more``)."""
    v = conn.execute(
        select(func.max(dl_mirror_status.c.version)).where(_artifact_rows(table_id, artifact, *more))
    ).scalar()
    return None if v is None else int(v)


def _span(versions: Sequence[int]) -> tuple[int, int] | None:
    """(lowest, highest) when ``versions`` are every version between them, else None."""
    lo, hi = min(versions), max(versions)
    return (lo, hi) if len(set(versions)) == hi - lo + 1 else None


def _at_versions(versions: Sequence[int]) -> ColumnElement[bool]:
    """``versions`` as a range when they are contiguous (one index range), else as a list."""
    span = _span(versions)
    column = dl_mirror_status.c.version
    return column.in_(list(versions)) if span is None else column.between(*span)


# What a published row records beside its hash and size (the text form of the fast paths; the
# per-row path sets the same columns).
_SUCCESS_SET = (
    "UPDATE dl_mirror_status AS m SET state = 'SUCCESS', sha256 = {sha256}, size_bytes = {size}, "
    "finished_at = :now, error_class = NULL, last_error = NULL, lease_owner = NULL "
)

# ``_mark_commits_succeeded``'s statement on MySQL/MariaDB (the same rows and values).
_MYSQL_SUCCESS_FROM_COMMITS = (
    "UPDATE dl_mirror_status AS m JOIN dl_commits AS c "
    "ON c.table_id = m.table_id AND c.version = m.version AND c.has_json "
    "SET m.state = 'SUCCESS', m.sha256 = c.sha256, m.size_bytes = c.size_bytes, m.finished_at = :now, "
    "m.error_class = NULL, m.last_error = NULL, m.lease_owner = NULL "
    "WHERE m.table_id = :t AND m.artifact = 'json' AND m.version BETWEEN :lo AND :hi"
)


class MirrorStatus(StoreBase):
    """Read and move the per-version publish states."""

    def _update(
        self,
        table_id: int,
        artifact: str,
        rows: ColumnElement[bool],
        values: dict[str, Any],
        params: list[dict[str, Any]] | None = None,
    ) -> None:
        """Set ``values`` on the table's ``artifact`` rows matched by ``rows``, in one transaction
        (``params``: once per parameter set)."""
        stmt = update(dl_mirror_status).where(_artifact_rows(table_id, artifact, rows)).values(**values)
        with db.translated(self.url, "updating mirror status"), self.engine.begin() as conn:
            conn.execute(stmt, params)

    def fleet_rows(self, table_ids: Sequence[int] | None = None) -> dict[int, FleetRow]:
        """Every table's status figures (or those of ``table_ids``) in four statements, whatever the
        number of tables: the ``status`` / ``health`` commands, the monitor DAG and the UI overview."""
        where = and_ids = ""
        params: dict[str, Any] = {}
        if table_ids is not None:
            where, and_ids = "WHERE t.id IN :ids", "AND m.table_id IN :ids"
            params["ids"] = sorted(set(table_ids))

        def q(sql: str) -> Any:
            stmt = text(sql.format(where=where, and_ids=and_ids))
            return stmt.bindparams(bindparam("ids", expanding=True)) if params else stmt

        with db.translated(self.url, "reading mirror status"), self.reader.connect() as conn:
            tops = conn.execute(q(_FLEET_TOPS), params).all()
            open_rows = conn.execute(q(_FLEET_OPEN), params).all()
            times = {int(r[0]): r[1] for r in conn.execute(q(_FLEET_OPEN_TIMES), params)}
            errors = {int(r[0]): (r[1], r[2]) for r in conn.execute(q(_FLEET_LAST_ERRORS), params)}
        counts: dict[int, dict[str, int]] = {}
        first_open: dict[int, int] = {}
        for table_id, artifact, state, n, first in open_rows:
            c = counts.setdefault(int(table_id), {"pending": 0, "failed": 0, "conflicts": 0})
            if artifact == Artifact.JSON:
                first_open[table_id] = min(int(first), first_open.get(table_id, int(first)))
                if state in (PublishState.PENDING, PublishState.IN_PROGRESS):
                    c["pending"] += int(n)
            if state == PublishState.FAILED:
                c["failed"] += int(n)
            elif state == PublishState.CONFLICT:
                c["conflicts"] += int(n)
        out: dict[int, FleetRow] = {}
        for table_id, latest, last_json, last_cp, f_class, f_message, f_first, f_last, f_attempts in tops:
            c = counts.get(table_id, {"pending": 0, "failed": 0, "conflicts": 0})
            failure = None
            if f_class is not None:
                failure = TableFailure(f_class, f_message, int(f_first), int(f_last), int(f_attempts))
            error_class, last_error = errors.get(table_id, (None, None))
            out[table_id] = FleetRow(
                table_id=table_id,
                latest_committed=None if latest is None else int(latest),
                last_json=None if last_json is None else int(last_json),
                last_checkpoint=None if last_cp is None else int(last_cp),
                first_open=first_open.get(table_id),
                first_open_committed_at=times.get(table_id),
                pending=c["pending"],
                failed=c["failed"],
                conflicts=c["conflicts"],
                last_error_class=error_class,
                last_error=last_error,
                failure=failure,
            )
        return out

    def status_rows(
        self,
        table_id: int,
        artifact: str | None = None,
        states: Sequence[str] | None = None,
        from_version: int | None = None,
        to_version: int | None = None,
        newest: int | None = None,
    ) -> list[StatusRow]:
        """Status rows in version order; ``newest``: only the last ``newest`` of them (a page)."""
        q = select(dl_mirror_status).where(dl_mirror_status.c.table_id == table_id)
        if artifact:
            q = q.where(dl_mirror_status.c.artifact == artifact)
        if states:
            q = q.where(dl_mirror_status.c.state.in_(list(states)))
        if from_version is not None:
            q = q.where(dl_mirror_status.c.version >= from_version)
        if to_version is not None:
            q = q.where(dl_mirror_status.c.version <= to_version)
        if newest is not None:
            q = q.order_by(dl_mirror_status.c.version.desc(), dl_mirror_status.c.artifact.desc()).limit(
                newest
            )
        else:
            q = q.order_by(dl_mirror_status.c.version, dl_mirror_status.c.artifact)
        with db.translated(self.url, "reading mirror status"), self.reader.connect() as conn:
            rows = [from_row(StatusRow, r) for r in conn.execute(q)]
        if newest is not None:
            rows.reverse()
        return rows

    def count_status(self, table_id: int, artifact: str) -> int:
        """How many versions of the table have a status row for ``artifact`` (the total of a page)."""
        with db.translated(self.url, "reading mirror status"), self.reader.connect() as conn:
            n = conn.execute(
                select(func.count()).where(
                    dl_mirror_status.c.table_id == table_id, dl_mirror_status.c.artifact == artifact
                )
            ).scalar()
            return int(n or 0)

    def last_published_version(self, table_id: int) -> int | None:
        """Highest version V such that every JSON commit up to V is published (SUCCESS)."""
        with db.translated(self.url, "reading mirror status"), self.reader.connect() as conn:
            first_open = conn.execute(
                select(func.min(dl_mirror_status.c.version)).where(
                    _artifact_rows(table_id, Artifact.JSON, dl_mirror_status.c.state != PublishState.SUCCESS)
                )
            ).scalar()
            if first_open is not None:
                first = conn.execute(
                    select(dl_tables.c.first_version).where(dl_tables.c.id == table_id)
                ).scalar()
                # Nothing published yet is None, not first_version - 1 (-1 for a new table).
                return None if first is None or first_open <= first else int(first_open) - 1
            return _top_version(conn, table_id, Artifact.JSON)

    def last_checkpoint_version(self, table_id: int) -> int | None:
        with db.translated(self.url, "reading mirror status"), self.reader.connect() as conn:
            return _top_version(
                conn, table_id, Artifact.CHECKPOINT, dl_mirror_status.c.state == PublishState.SUCCESS
            )

    def mark_started(self, table_id: int, versions: Sequence[int], artifact: str, owner: str) -> None:
        if not versions:
            return
        values = {
            "state": PublishState.IN_PROGRESS,
            "attempts": dl_mirror_status.c.attempts + 1,
            "started_at": now_ms(),
            "lease_owner": owner,
        }
        self._update(table_id, artifact, _at_versions(versions), values)

    def ensure_status(self, table_id: int, version: int, artifact: str) -> None:
        """Create a PENDING status row if missing (checkpoints are enqueued when due)."""
        with db.translated(self.url, "updating mirror status"), self.engine.begin() as conn:
            exists = conn.execute(
                select(dl_mirror_status.c.state).where(
                    _artifact_rows(table_id, artifact, dl_mirror_status.c.version == version)
                )
            ).first()
            if exists is None:
                conn.execute(
                    insert(dl_mirror_status).values(
                        table_id=table_id,
                        version=version,
                        artifact=artifact,
                        state=PublishState.PENDING,
                        attempts=0,
                        enqueued_at=now_ms(),
                    )
                )

    def mark_succeeded(self, table_id: int, artifact: str, results: Sequence[tuple[int, str, int]]) -> None:
        """Record SUCCESS for (version, sha256, size) after the files were verified durable."""
        if not results:
            return
        now = now_ms()
        backend = backend_of(self.engine)
        if (
            backend.update_from
            and artifact == Artifact.JSON
            and self._mark_commits_succeeded(table_id, results, now)
        ):
            return
        if backend.copies:
            self._mark_succeeded_pg(table_id, artifact, results, now)
            return
        values = {
            "state": PublishState.SUCCESS,
            "sha256": bindparam("s"),
            "size_bytes": bindparam("n"),
            "finished_at": now,
            "error_class": None,
            "last_error": None,
            "lease_owner": None,
        }
        rows = dl_mirror_status.c.version == bindparam("v")
        self._update(table_id, artifact, rows, values, [{"v": v, "s": s, "n": n} for v, s, n in results])

    def _mark_commits_succeeded(
        self, table_id: int, results: Sequence[tuple[int, str, int]], now: int
    ) -> bool:
        """A contiguous run of published commits whose bytes were checked against ``dl_commits``:
        one range UPDATE taking hash and size from there (PostgreSQL, SQLite >= 3.33: UPDATE ... FROM;
        MySQL: UPDATE ... JOIN).
        False when the fast path does not apply."""
        span = _span([v for v, _, _ in results])
        if span is None:
            return False
        lo, hi = span
        if backend_of(self.engine).update_join:  # MySQL: UPDATE ... JOIN, not UPDATE ... FROM
            stmt = text(_MYSQL_SUCCESS_FROM_COMMITS)
        else:
            stmt = text(
                _SUCCESS_SET.format(sha256="c.sha256", size="c.size_bytes")
                + "FROM dl_commits AS c WHERE c.table_id = m.table_id AND c.version = m.version AND c.has_json "
                "AND m.table_id = :t AND m.artifact = 'json' AND m.version BETWEEN :lo AND :hi"
            )
        # The publisher renders each commit and refuses bytes whose SHA-256 differs from
        # dl_commits, so the recorded hash and size are exactly those it verified at the location.
        with db.translated(self.url, "updating mirror status"), self.engine.begin() as conn:
            conn.execute(stmt, {"now": now, "t": table_id, "lo": lo, "hi": hi})
        return True

    def _mark_succeeded_pg(
        self, table_id: int, artifact: str, results: Sequence[tuple[int, str, int]], now: int
    ) -> None:
        """One UPDATE ... FROM (VALUES ...) per batch: a publish backlog is not 1 round trip per version."""
        params: dict[str, Any] = {"t": table_id, "a": artifact, "now": now}
        values = []
        for i, (v, sha, n) in enumerate(results):
            values.append(f"(CAST(:v{i} AS BIGINT), CAST(:s{i} AS VARCHAR), CAST(:n{i} AS BIGINT))")
            params.update({f"v{i}": v, f"s{i}": sha, f"n{i}": n})
        stmt = text(
            _SUCCESS_SET.format(sha256="r.sha", size="r.n")
            + f"FROM (VALUES {', '.join(values)}) AS r(v, sha, n) "
            "WHERE m.table_id = :t AND m.artifact = :a AND m.version = r.v"
        )
        with db.translated(self.url, "updating mirror status"), self.engine.begin() as conn:
            conn.execute(stmt, params)

    def mark_failed(
        self, table_id: int, version: int, artifact: str, state: str, error_class: str, message: str
    ) -> None:
        values = {
            "state": state,
            "error_class": error_class,
            "last_error": message[:4000],
            "finished_at": now_ms(),
            "lease_owner": None,
        }
        self._update(table_id, artifact, dl_mirror_status.c.version == version, values)

    def mark_pending(self, table_id: int, artifact: str, versions: Sequence[int]) -> None:
        """Queue versions again (the reconciler found their files missing at the location)."""
        if not versions:
            return
        self._update(
            table_id, artifact, _at_versions(versions), {"state": PublishState.PENDING, "finished_at": None}
        )

    def reset_in_progress(self, table_id: int) -> None:
        """A new lease holder re-drives what a crashed one left IN_PROGRESS (put-if-absent makes it safe)."""
        with db.translated(self.url, "updating mirror status"), self.engine.begin() as conn:
            conn.execute(
                update(dl_mirror_status)
                .where(
                    dl_mirror_status.c.table_id == table_id,
                    dl_mirror_status.c.state == PublishState.IN_PROGRESS,
                )
                .values(state=PublishState.PENDING)
            )


__all__ = ["FleetRow", "MirrorStatus", "StatusRow"]
