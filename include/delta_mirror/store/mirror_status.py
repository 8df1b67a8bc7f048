"""The publish status of each version's artifacts (``dl_mirror_status``): the publisher's queue.

One row per (table, version, artifact): ``PENDING`` → ``IN_PROGRESS`` (under the table's lease)
→ ``SUCCESS`` once the file was read back durable, or ``FAILED`` (retried later) / ``CONFLICT``
(a different file is at the location). A new lease holder re-drives what a crashed one left
``IN_PROGRESS``; the reconciler queues again what it found missing.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import bindparam, func, insert, select, text, update

from delta_mirror.delta.protocol import now_ms
from delta_mirror.store import db
from delta_mirror.store.base import StoreBase
from delta_mirror.store.schema import dl_mirror_status, dl_tables
from delta_mirror.store.states import Artifact, PublishState


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


class MirrorStatus(StoreBase):
    """Read and move the per-version publish states."""

    def status_rows(
        self,
        table_id: int,
        artifact: str | None = None,
        states: Sequence[str] | None = None,
        from_version: int | None = None,
        to_version: int | None = None,
    ) -> list[StatusRow]:
        q = select(dl_mirror_status).where(dl_mirror_status.c.table_id == table_id)
        if artifact:
            q = q.where(dl_mirror_status.c.artifact == artifact)
        if states:
            q = q.where(dl_mirror_status.c.state.in_(list(states)))
        if from_version is not None:
            q = q.where(dl_mirror_status.c.version >= from_version)
        if to_version is not None:
            q = q.where(dl_mirror_status.c.version <= to_version)
        q = q.order_by(dl_mirror_status.c.version, dl_mirror_status.c.artifact)
        with db.translated(self.url, "reading mirror status"), self.reader.connect() as conn:
            return [
                StatusRow(
                    r.version,
                    r.artifact,
                    r.state,
                    r.attempts,
                    r.error_class,
                    r.last_error,
                    r.sha256,
                    r.size_bytes,
                    r.enqueued_at,
                    r.started_at,
                    r.finished_at,
                )
                for r in conn.execute(q)
            ]

    def last_published_version(self, table_id: int) -> int | None:
        """Highest version V such that every JSON commit up to V is published (SUCCESS)."""
        with db.translated(self.url, "reading mirror status"), self.reader.connect() as conn:
            first_open = conn.execute(
                select(func.min(dl_mirror_status.c.version)).where(
                    dl_mirror_status.c.table_id == table_id,
                    dl_mirror_status.c.artifact == Artifact.JSON,
                    dl_mirror_status.c.state != PublishState.SUCCESS,
                )
            ).scalar()
            if first_open is not None:
                first = conn.execute(
                    select(dl_tables.c.first_version).where(dl_tables.c.id == table_id)
                ).scalar()
                # Nothing published yet is None, not first_version - 1 (-1 for a new table).
                return None if first is None or first_open <= first else int(first_open) - 1
            top = conn.execute(
                select(func.max(dl_mirror_status.c.version)).where(
                    dl_mirror_status.c.table_id == table_id, dl_mirror_status.c.artifact == Artifact.JSON
                )
            ).scalar()
            return None if top is None else int(top)

    def last_checkpoint_version(self, table_id: int) -> int | None:
        with db.translated(self.url, "reading mirror status"), self.reader.connect() as conn:
            v = conn.execute(
                select(func.max(dl_mirror_status.c.version)).where(
                    dl_mirror_status.c.table_id == table_id,
                    dl_mirror_status.c.artifact == Artifact.CHECKPOINT,
                    dl_mirror_status.c.state == PublishState.SUCCESS,
                )
            ).scalar()
            return None if v is None else int(v)

    def mark_started(self, table_id: int, versions: Sequence[int], artifact: str, owner: str) -> None:
        if not versions:
            return
        now = now_ms()
        lo, hi = min(versions), max(versions)
        contiguous = len(set(versions)) == hi - lo + 1
        with db.translated(self.url, "updating mirror status"), self.engine.begin() as conn:
            conn.execute(
                update(dl_mirror_status)
                .where(
                    dl_mirror_status.c.table_id == table_id,
                    dl_mirror_status.c.artifact == artifact,
                    dl_mirror_status.c.version.between(lo, hi)
                    if contiguous
                    else dl_mirror_status.c.version.in_(list(versions)),
                )
                .values(
                    state=PublishState.IN_PROGRESS,
                    attempts=dl_mirror_status.c.attempts + 1,
                    started_at=now,
                    lease_owner=owner,
                )
            )

    def ensure_status(self, table_id: int, version: int, artifact: str) -> None:
        """Create a PENDING status row if missing (checkpoints are enqueued when due)."""
        with db.translated(self.url, "updating mirror status"), self.engine.begin() as conn:
            exists = conn.execute(
                select(dl_mirror_status.c.state).where(
                    dl_mirror_status.c.table_id == table_id,
                    dl_mirror_status.c.version == version,
                    dl_mirror_status.c.artifact == artifact,
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
        dialect = self.engine.dialect.name
        range_update = dialect == "postgresql" or (
            dialect == "sqlite" and sqlite3.sqlite_version_info >= (3, 33)
        )
        if (
            range_update
            and artifact == Artifact.JSON
            and self._mark_commits_succeeded(table_id, results, now)
        ):
            return
        if dialect == "postgresql":
            self._mark_succeeded_pg(table_id, artifact, results, now)
            return
        with db.translated(self.url, "updating mirror status"), self.engine.begin() as conn:
            conn.execute(
                update(dl_mirror_status)
                .where(
                    dl_mirror_status.c.table_id == table_id,
                    dl_mirror_status.c.artifact == artifact,
                    dl_mirror_status.c.version == bindparam("v"),
                )
                .values(
                    state=PublishState.SUCCESS,
                    sha256=bindparam("s"),
                    size_bytes=bindparam("n"),
                    finished_at=now,
                    error_class=None,
                    last_error=None,
                    lease_owner=None,
                ),
                [{"v": v, "s": s, "n": n} for v, s, n in results],
            )

    def _mark_commits_succeeded(
        self, table_id: int, results: Sequence[tuple[int, str, int]], now: int
    ) -> bool:
        """A contiguous run of published commits whose bytes were checked against ``dl_commits``:
        one range UPDATE taking hash and size from there (PostgreSQL, SQLite >= 3.33: UPDATE ... FROM).
        False when the fast path does not apply."""
        versions = [v for v, _, _ in results]
        lo, hi = min(versions), max(versions)
        if len(set(versions)) != hi - lo + 1:
            return False
        stmt = text(
            "UPDATE dl_mirror_status AS m SET state = 'SUCCESS', sha256 = c.sha256, size_bytes = c.size_bytes, "
            "finished_at = :now, error_class = NULL, last_error = NULL, lease_owner = NULL "
            "FROM dl_commits AS c WHERE c.table_id = m.table_id AND c.version = m.version AND c.has_json "
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
            "UPDATE dl_mirror_status AS m SET state = 'SUCCESS', sha256 = r.sha, size_bytes = r.n, "
            "finished_at = :now, error_class = NULL, last_error = NULL, lease_owner = NULL "
            f"FROM (VALUES {', '.join(values)}) AS r(v, sha, n) "
            "WHERE m.table_id = :t AND m.artifact = :a AND m.version = r.v"
        )
        with db.translated(self.url, "updating mirror status"), self.engine.begin() as conn:
            conn.execute(stmt, params)

    def mark_failed(
        self, table_id: int, version: int, artifact: str, state: str, error_class: str, message: str
    ) -> None:
        with db.translated(self.url, "updating mirror status"), self.engine.begin() as conn:
            conn.execute(
                update(dl_mirror_status)
                .where(
                    dl_mirror_status.c.table_id == table_id,
                    dl_mirror_status.c.artifact == artifact,
                    dl_mirror_status.c.version == version,
                )
                .values(
                    state=state,
                    error_class=error_class,
                    last_error=message[:4000],
                    finished_at=now_ms(),
                    lease_owner=None,
                )
            )

    def mark_pending(self, table_id: int, artifact: str, versions: Sequence[int]) -> None:
        """Queue versions again (the reconciler found their files missing at the location)."""
        if not versions:
            return
        with db.translated(self.url, "updating mirror status"), self.engine.begin() as conn:
            conn.execute(
                update(dl_mirror_status)
                .where(
                    dl_mirror_status.c.table_id == table_id,
                    dl_mirror_status.c.artifact == artifact,
                    dl_mirror_status.c.version.in_(list(versions)),
                )
                .values(state=PublishState.PENDING, finished_at=None)
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


__all__ = ["MirrorStatus", "StatusRow"]
