"""Lag history (``dl_lag_samples``): one row per measurement, pruned by the table's retention."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import bindparam, delete, insert, select, text

from delta_mirror.delta.protocol import now_ms
from delta_mirror.store import db
from delta_mirror.store.backends import backend_of
from delta_mirror.store.base import StoreBase
from delta_mirror.store.schema import dl_lag_samples

_IDS_PER_STATEMENT = 10_000  # SQLite allows 32,766 bound parameters per statement


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
        """Delete each table's samples taken before its cut-off, from (table_id, older_than ms) pairs:
        one statement per distinct cut-off (tables sharing a retention share one), each an index
        range per table on (table_id, sampled_at)."""
        by_cut: dict[int, list[int]] = {}
        for table_id, cut in cutoffs:
            by_cut.setdefault(int(cut), []).append(int(table_id))
        pruned = 0
        with db.translated(self.url, "pruning lag samples"), self.engine.begin() as conn:
            for cut, ids in by_cut.items():
                for i in range(0, len(ids), _IDS_PER_STATEMENT):
                    result = conn.execute(
                        delete(dl_lag_samples).where(
                            dl_lag_samples.c.table_id.in_(ids[i : i + _IDS_PER_STATEMENT]),
                            dl_lag_samples.c.sampled_at < cut,
                        )
                    )
                    pruned += max(0, int(result.rowcount or 0))
        return pruned

    def lag_peaks(
        self, table_ids: Sequence[int] | None, since: int, until: int, points: int
    ) -> dict[int, list[list[float]]]:
        """Each table's lag from ``since`` to ``until`` as at most ``points`` [time, highest lag]
        pairs, one per equal slice of the window, oldest first, in one statement: the UI
        overview's sparklines (``table_ids`` None: every table). The highest, so a spike shows."""
        if table_ids is not None and not table_ids:
            return {}
        bucket = max(1, (int(until) - int(since)) // max(1, points) + 1)
        where = "" if table_ids is None else "AND s.table_id IN :ids"
        div = backend_of(self.engine).integer_division
        stmt = text(
            f"SELECT s.table_id, (s.sampled_at - :since) {div} :bucket AS b, max(s.sampled_at), max(s.lag_seconds)"
            f" FROM dl_lag_samples s WHERE s.sampled_at >= :since {where}"
            " GROUP BY s.table_id, b ORDER BY s.table_id, b"
        )
        params: dict[str, object] = {"since": int(since), "bucket": bucket}
        if table_ids is not None:
            stmt = stmt.bindparams(bindparam("ids", expanding=True))
            params["ids"] = sorted(set(table_ids))
        out: dict[int, list[list[float]]] = {}
        with db.translated(self.url, "reading lag samples"), self.reader.connect() as conn:
            rows = conn.execute(stmt, params).all()  # fetchall: tens of thousands of small rows
        for t, _b, at, lag in rows:
            out.setdefault(t, []).append([at, lag])
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
