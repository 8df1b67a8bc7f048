"""Per-version latency: the time from a version's commit to its publish, read from the store.

The store records both ends of every version already: ``dl_commits.committed_at`` (the commit) and
``dl_mirror_status.finished_at`` of the version's JSON row once it is ``SUCCESS`` (read back durable
at the location: readable). So "lag over time" needs no sampling: the percentiles, the lag chart
and the overview's sparkline are reconstructed from these two times for every version, whenever the
publisher ran. A window is the versions *committed* in it (``ix_dl_commits_committed``, migration
0006: an index range per table); imported versions (their commit time is the source's) are left out.
A version re-published by the reconciler counts from its latest publish.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import bindparam, text

from delta_mirror.store import db
from delta_mirror.store.backends import backend_of
from delta_mirror.store.base import CHUNK, StoreBase

#: The percentiles reported per window (nearest rank: the smallest latency with at least P % of the
#: versions at or below it).
PERCENTILES = (50, 95, 99)

#: Percentiles are over at most the newest this many versions of a window per table: the cost of a
#: fleet's percentiles follows tables x this, never a busy table's whole week.
LATENCY_SAMPLE = 2000

# The window's published versions of each table: an index range per table (ix_dl_commits_committed),
# each joined to its status row by primary key; the newest LATENCY_SAMPLE are kept (in Python).
_LATENCIES_SQL = """
SELECT c.table_id, c.committed_at, m.finished_at - c.committed_at AS lat
FROM dl_commits c JOIN dl_mirror_status m
  ON m.table_id = c.table_id AND m.version = c.version AND m.artifact = 'json'
WHERE c.table_id IN :ids AND c.committed_at >= :since AND c.source <> 'import' AND m.state = 'SUCCESS'
"""

# Each version committed in the window: its commit time and, once published, its publish time.
_VERSIONS_SQL = """
SELECT c.version, c.committed_at, CASE WHEN m.state = 'SUCCESS' THEN m.finished_at END AS published_at
FROM dl_commits c JOIN dl_mirror_status m
  ON m.table_id = c.table_id AND m.version = c.version AND m.artifact = 'json'
WHERE c.table_id = :t AND c.committed_at >= :since AND c.source <> 'import'
ORDER BY c.committed_at DESC, c.version DESC LIMIT :limit
"""

# Versions committed before the window still unpublished (the open-state partial index): they are
# behind at the window's start, however old.
_OPEN_BEFORE_SQL = """
SELECT c.version, c.committed_at, NULL AS published_at
FROM dl_mirror_status m JOIN dl_commits c ON c.table_id = m.table_id AND c.version = m.version
WHERE m.table_id = :t AND m.artifact = 'json' AND m.state <> 'SUCCESS' AND c.committed_at < :since
  AND c.source <> 'import'
ORDER BY m.version LIMIT :limit
"""

# The sparkline: per table and slice of the window, the highest latency of the versions committed in
# it (an unpublished version counts until now).
_PEAKS_SQL = """
SELECT c.table_id, (c.committed_at - :since) / :bucket AS b, max(c.committed_at) AS at,
  max(CASE WHEN m.state = 'SUCCESS' THEN m.finished_at ELSE :now END - c.committed_at) AS lat
FROM dl_commits c JOIN dl_mirror_status m
  ON m.table_id = c.table_id AND m.version = c.version AND m.artifact = 'json'
WHERE c.table_id IN :ids AND c.committed_at >= :since AND c.source <> 'import'
GROUP BY c.table_id, b ORDER BY c.table_id, b
"""


@dataclass(frozen=True)
class LatencyStats:
    """Commit-to-readable seconds of the versions committed in a window and published."""

    versions: int
    p50: float
    p95: float
    p99: float
    max: float

    def to_json(self) -> dict[str, Any]:
        return {"versions": self.versions, "p50": self.p50, "p95": self.p95, "p99": self.p99, "max": self.max}


@dataclass(frozen=True)
class VersionTimes:
    version: int
    committed_at: int  # epoch ms
    published_at: int | None  # epoch ms; None: not published yet


def _seconds(ms: Any) -> float:
    return round(max(0, int(ms)) / 1000.0, 3)  # clocks of two hosts may disagree by a little


def _stats(values: list[float]) -> LatencyStats:
    """Nearest-rank percentiles of sorted ``values``."""
    n = len(values)

    def at(p: int) -> float:
        return values[max(1, (p * n + 99) // 100) - 1]

    return LatencyStats(n, at(50), at(95), at(99), values[-1])


class VersionLatency(StoreBase):
    """Latency per version from the commit and publish times the store keeps."""

    def latency_stats(self, table_ids: Sequence[int], since: int) -> dict[int, LatencyStats]:
        """p50 / p95 / p99 / max of each table's versions committed at or after ``since`` (epoch ms)
        and published (at most the newest ``LATENCY_SAMPLE``). Tables with none are absent."""
        return {t: w["window"] for t, w in self.latency_windows(table_ids, {"window": since}).items()}

    def latency_windows(
        self, table_ids: Sequence[int], windows: dict[str, int]
    ) -> dict[int, dict[str, LatencyStats]]:
        """The percentiles of several windows (name -> since, epoch ms) at once: one read of the widest
        window's newest ``LATENCY_SAMPLE`` published versions per table (one statement per 500
        tables, no sort in the database), the narrower windows taken from the same rows."""
        ids = sorted(set(table_ids))
        if not ids or not windows:
            return {}
        widest = min(windows.values())
        rows: dict[int, list[tuple[int, float]]] = {}
        stmt = text(_LATENCIES_SQL).bindparams(bindparam("ids", expanding=True))
        with db.translated(self.url, "reading version latency"), self.reader.connect() as conn:
            for i in range(0, len(ids), CHUNK):
                params = {"ids": ids[i : i + CHUNK], "since": int(widest)}
                for table_id, committed, lat in conn.execute(stmt, params):
                    rows.setdefault(int(table_id), []).append((int(committed), _seconds(lat)))
        out: dict[int, dict[str, LatencyStats]] = {}
        for table_id, found in rows.items():
            found.sort(reverse=True)  # newest first: a narrower window keeps the newest SAMPLE too
            for name, since in windows.items():
                values = sorted([lat for at, lat in found if at >= since][:LATENCY_SAMPLE])
                if values:
                    out.setdefault(table_id, {})[name] = _stats(values)
        return out

    def version_times(
        self, table_id: int, since: int, limit: int = 20_000
    ) -> tuple[list[VersionTimes], bool]:
        """The table's versions committed at or after ``since`` (the newest ``limit``), and those
        committed before it and still unpublished, oldest first; True when ``limit`` cut some off."""
        params = {"t": int(table_id), "since": int(since), "limit": int(limit) + 1}
        with db.translated(self.url, "reading version latency"), self.reader.connect() as conn:
            rows = conn.execute(text(_VERSIONS_SQL), params).all()
            cut = len(rows) > limit
            rows = rows[:limit]
            older = conn.execute(text(_OPEN_BEFORE_SQL), {**params, "limit": int(limit)}).all()
        times = [
            VersionTimes(int(v), int(c), None if p is None else int(p))
            for v, c, p in [*older, *reversed(rows)]
        ]
        return times, cut

    def latencies_of(self, table_id: int, versions: Sequence[int]) -> list[tuple[int, float]]:
        """(version, commit-to-readable seconds) of the given published versions (a run's): one
        primary-key range read, for the per-version latency metric."""
        if not versions:
            return []
        lo, hi, wanted = min(versions), max(versions), set(versions)
        stmt = text(
            "SELECT c.version, m.finished_at - c.committed_at FROM dl_commits c JOIN dl_mirror_status m"
            " ON m.table_id = c.table_id AND m.version = c.version AND m.artifact = 'json'"
            " WHERE c.table_id = :t AND c.version BETWEEN :lo AND :hi AND m.state = 'SUCCESS'"
            " ORDER BY c.version"
        )
        with db.translated(self.url, "reading version latency"), self.reader.connect() as conn:
            rows = conn.execute(stmt, {"t": int(table_id), "lo": int(lo), "hi": int(hi)}).all()
        return [(int(v), _seconds(lat)) for v, lat in rows if int(v) in wanted]

    def latency_peaks(
        self, table_ids: Sequence[int], since: int, until: int, points: int
    ) -> dict[int, list[list[float]]]:
        """Each table's highest version latency (seconds) per equal slice of ``since``..``until``,
        as [commit time of the slice's last version, seconds] pairs, oldest first: the overview's
        sparklines, a constant number of statements per 500 tables."""
        ids = sorted(set(table_ids))
        bucket = max(1, (int(until) - int(since)) // max(1, points) + 1)
        sql = _PEAKS_SQL.replace(") / :bucket", f") {backend_of(self.engine).integer_division} :bucket")
        stmt = text(sql).bindparams(bindparam("ids", expanding=True))
        out: dict[int, list[list[float]]] = {}
        with db.translated(self.url, "reading version latency"), self.reader.connect() as conn:
            for i in range(0, len(ids), CHUNK):
                params = {"ids": ids[i : i + CHUNK], "since": int(since), "bucket": bucket, "now": int(until)}
                for table_id, _b, at, lat in conn.execute(stmt, params):
                    out.setdefault(int(table_id), []).append([int(at), _seconds(lat)])
        return out


def versions_behind_series(times: Sequence[VersionTimes], since: int, now: int) -> list[list[int]]:
    """How many versions were committed and not yet published, over ``since``..``now``: a step
    series of [time ms, versions behind] at each change, reconstructed from the versions' times."""
    events: dict[int, int] = {}
    start = 0
    for v in times:
        done = v.published_at
        if done is not None:
            done = max(done, v.committed_at)  # another host's clock may be a little behind
            if done <= since:
                continue  # behind only before the window
        if v.committed_at <= since:
            start += 1
        else:
            events[v.committed_at] = events.get(v.committed_at, 0) + 1
        if done is not None:
            events[done] = events.get(done, 0) - 1
    series = [[int(since), start]]
    behind = start
    for at in sorted(events):
        if at > now:
            break
        behind += events[at]
        series.append([at, max(0, behind)])
    series.append([int(now), max(0, behind)])
    return series


__all__ = [
    "LATENCY_SAMPLE",
    "PERCENTILES",
    "LatencyStats",
    "VersionLatency",
    "VersionTimes",
    "versions_behind_series",
]
