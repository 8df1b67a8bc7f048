"""Lag history (``dl_lag_samples``): one row per measurement, pruned by the table's retention."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import bindparam, delete, insert, select, text

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

    def add_lag_samples(
        self, samples: Sequence[tuple[int, float, int]], sampled_at: int | None = None
    ) -> int:
        """Record (table_id, lag_seconds, versions_behind) for many tables in one statement; returns
        their ``sampled_at`` (epoch ms)."""
        at = now_ms() if sampled_at is None else int(sampled_at)
        if not samples:
            return at
        rows = [
            {"table_id": t, "sampled_at": at, "lag_seconds": float(lag), "versions_behind": int(behind)}
            for t, lag, behind in samples
        ]
        with db.translated(self.url, "recording lag samples"), self.engine.begin() as conn:
            conn.execute(insert(dl_lag_samples), rows)
        return at

    def prune_lag_samples_many(self, cutoffs: Sequence[tuple[int, int]]) -> int:
        """Delete each table's samples taken before its cut-off: (table_id, older_than ms) pairs,
        one statement (executed per pair by the driver: each an index range on (table_id, sampled_at))."""
        if not cutoffs:
            return 0
        stmt = delete(dl_lag_samples).where(
            dl_lag_samples.c.table_id == bindparam("t"), dl_lag_samples.c.sampled_at < bindparam("cut")
        )
        with db.translated(self.url, "pruning lag samples"), self.engine.begin() as conn:
            result = conn.execute(stmt, [{"t": t, "cut": cut} for t, cut in cutoffs])
            return max(0, int(result.rowcount or 0))

    def lag_samples_many(
        self, table_ids: Sequence[int] | None, since: int, limit: int
    ) -> dict[int, list[tuple[int, float, int]]]:
        """Each table's samples since ``since`` (oldest first, at most the newest ``limit``) in one
        statement: the UI overview's sparklines (``table_ids`` None: every table)."""
        where = "" if table_ids is None else "AND s.table_id IN :ids"
        stmt = text(
            "SELECT table_id, sampled_at, lag_seconds, versions_behind FROM ("
            " SELECT s.table_id, s.sampled_at, s.lag_seconds, s.versions_behind, row_number() OVER ("
            "  PARTITION BY s.table_id ORDER BY s.sampled_at DESC, s.id DESC) AS rn"
            f" FROM dl_lag_samples s WHERE s.sampled_at >= :since {where}"
            ") x WHERE rn <= :limit ORDER BY table_id, sampled_at, rn DESC"
        )
        params: dict[str, object] = {"since": int(since), "limit": int(limit)}
        if table_ids is not None:
            stmt = stmt.bindparams(bindparam("ids", expanding=True))
            params["ids"] = sorted(set(table_ids))
        out: dict[int, list[tuple[int, float, int]]] = {}
        with db.translated(self.url, "reading lag samples"), self.reader.connect() as conn:
            for t, at, lag, behind in conn.execute(stmt, params):
                out.setdefault(int(t), []).append((int(at), float(lag), int(behind)))
        return out

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
