"""Lag history (``dl_lag_samples``): one row per measurement, pruned by the table's retention."""

from __future__ import annotations

from sqlalchemy import delete, insert, select

from delta_mirror.delta.protocol import now_ms
from delta_mirror.store import db
from delta_mirror.store.base import StoreBase
from delta_mirror.store.schema import dl_lag_samples


class LagHistory(StoreBase):
    """Record, read and prune a table's lag samples."""

    def add_lag_sample(
        self, table_id: int, lag_seconds: float, versions_behind: int, sampled_at: int | None = None
    ) -> int:
        """Record one lag measurement; returns its ``sampled_at`` (epoch ms)."""
        at = now_ms() if sampled_at is None else int(sampled_at)
        with db.translated(self.url, "recording a lag sample"), self.engine.begin() as conn:
            conn.execute(
                insert(dl_lag_samples).values(
                    table_id=table_id,
                    sampled_at=at,
                    lag_seconds=float(lag_seconds),
                    versions_behind=int(versions_behind),
                )
            )
        return at

    def lag_samples(
        self, table_id: int, since: int | None = None, limit: int | None = None
    ) -> list[tuple[int, float, int]]:
        """(sampled_at ms, lag_seconds, versions_behind), oldest first; ``limit`` keeps the newest."""
        q = select(
            dl_lag_samples.c.sampled_at, dl_lag_samples.c.lag_seconds, dl_lag_samples.c.versions_behind
        ).where(dl_lag_samples.c.table_id == table_id)
        if since is not None:
            q = q.where(dl_lag_samples.c.sampled_at >= since)
        q = q.order_by(dl_lag_samples.c.sampled_at.desc(), dl_lag_samples.c.id.desc())
        if limit is not None:
            q = q.limit(limit)
        with db.translated(self.url, "reading lag samples"), self.reader.connect() as conn:
            rows = [(int(r[0]), float(r[1]), int(r[2])) for r in conn.execute(q)]
        rows.reverse()
        return rows

    def prune_lag_samples(self, table_id: int, older_than: int) -> int:
        """Delete the table's samples taken before ``older_than`` (epoch ms); returns how many."""
        with db.translated(self.url, "pruning lag samples"), self.engine.begin() as conn:
            result = conn.execute(
                delete(dl_lag_samples).where(
                    dl_lag_samples.c.table_id == table_id, dl_lag_samples.c.sampled_at < older_than
                )
            )
            return int(result.rowcount or 0)


__all__ = ["LagHistory"]
