"""Per-version latency (commit to readable) and table-level failures, read from the store (issue 28),
on SQLite and PostgreSQL."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import inspect, text, update
from store.store_kit import add, new_table

from delta_mirror.delta.protocol import now_ms
from delta_mirror.store import SqlStore, db
from delta_mirror.store.latency import VersionTimes, versions_behind_series
from delta_mirror.store.schema import dl_commits, dl_mirror_status
from delta_mirror.store.states import Artifact

HOUR = 3_600_000


def _set_times(store: SqlStore, table_id: int, times: dict[int, tuple[int, int | None]]) -> None:
    """Version -> (committed_at, published_at or None: still pending), as a publisher would leave them."""
    with store.engine.begin() as conn:
        for version, (committed, published) in times.items():
            conn.execute(
                update(dl_commits)
                .where(dl_commits.c.table_id == table_id, dl_commits.c.version == version)
                .values(committed_at=committed)
            )
            conn.execute(
                update(dl_mirror_status)
                .where(
                    dl_mirror_status.c.table_id == table_id,
                    dl_mirror_status.c.version == version,
                    dl_mirror_status.c.artifact == Artifact.JSON,
                )
                .values(
                    state="SUCCESS" if published is not None else "PENDING",
                    finished_at=published,
                )
            )


def _table_with_versions(store: SqlStore, location: str, name: str, count: int) -> int:
    table_id = new_table(store, location, name)
    for i in range(1, count):
        store.commit(name, [add(f"f{i}.parquet")])
    return table_id


def test_latency_percentiles_come_from_each_versions_commit_and_publish_times(
    store: SqlStore, tmp_path: Path
) -> None:
    # 100 versions committed over the last 50 minutes: 97 readable after 2 s, spikes of 60, 120 and 177 s.
    table_id = _table_with_versions(store, (tmp_path / "t").as_uri(), "t", 100)
    now = now_ms()
    times: dict[int, tuple[int, int | None]] = {}
    for v in range(100):
        committed = now - 3_000_000 + v * 30_000
        took = {97: 60_000, 98: 120_000, 99: 177_000}.get(v, 2_000)
        times[v] = (committed, committed + took)
    _set_times(store, table_id, times)
    other = _table_with_versions(store, (tmp_path / "u").as_uri(), "u", 2)
    _set_times(store, other, {0: (now - 2 * HOUR, now - 2 * HOUR + 5_000), 1: (now - 60_000, None)})

    stats = store.latency_stats([table_id, other], now - HOUR)
    t = stats[table_id]
    assert (t.versions, t.p50, t.p95, t.p99, t.max) == (100, 2.0, 2.0, 120.0, 177.0)
    # "u": its only published version is older than the hour, its newer one is still pending
    assert other not in stats
    assert store.latency_stats([other], now - 3 * HOUR)[other].to_json() == {
        "versions": 1,
        "p50": 5.0,
        "p95": 5.0,
        "p99": 5.0,
        "max": 5.0,
    }
    # a narrower window holds only its versions: the last 10 minutes are v80..v99
    recent = store.latency_stats([table_id], now - 600_000)[table_id]
    assert recent.versions == 20 and recent.p95 == 120.0 and recent.max == 177.0

    # the run's published versions, for the per-version metric
    assert store.latencies_of(table_id, [98, 99]) == [(98, 120.0), (99, 177.0)]
    # the sparkline: the highest latency of each slice, a pending version counting until now
    peaks = store.latency_peaks([table_id, other], now - HOUR, now, 6)
    assert max(p[1] for p in peaks[table_id]) == 177.0
    assert 59.0 <= peaks[other][-1][1] <= 61.0 + 5


def test_versions_behind_over_time_is_rebuilt_from_commit_and_publish_times(
    store: SqlStore, tmp_path: Path
) -> None:
    """A burst of 5 commits published together 3 minutes later: 1..5 behind, then 0 — no sample needed."""
    table_id = _table_with_versions(store, (tmp_path / "t").as_uri(), "t", 7)
    now = now_ms()
    base = now - 600_000
    times: dict[int, tuple[int, int | None]] = {0: (base - 2 * HOUR, base - 2 * HOUR + 1_000)}
    for v in range(1, 6):
        times[v] = (base + v * 1_000, base + 180_000)
    times[6] = (now - 10_000, None)  # committed 10 s ago, not published yet
    _set_times(store, table_id, times)

    versions, cut = store.version_times(table_id, now - HOUR)
    assert not cut
    assert [v.version for v in versions] == [1, 2, 3, 4, 5, 6]
    assert versions[-1].published_at is None
    series = versions_behind_series(versions, now - HOUR, now)
    assert [n for _, n in series] == [0, 1, 2, 3, 4, 5, 0, 1, 1]
    assert series[6][0] == base + 180_000

    # a version committed before the window and still unpublished is behind from the window's start
    _set_times(store, table_id, {0: (now - 2 * HOUR, None)})
    versions, _ = store.version_times(table_id, now - HOUR)
    assert versions[0] == VersionTimes(0, now - 2 * HOUR, None)
    assert versions_behind_series(versions, now - HOUR, now)[0] == [now - HOUR, 1]

    # limit: the newest versions of the window, and the answer says some were cut off
    newest, cut = store.version_times(table_id, now - HOUR, limit=2)
    assert cut and [v.version for v in newest] == [0, 5, 6]


def test_a_failed_attempt_is_recorded_counted_and_cleared_by_the_next_success(
    store: SqlStore, tmp_path: Path
) -> None:
    a = new_table(store, (tmp_path / "a").as_uri(), "a")
    b = new_table(store, (tmp_path / "b").as_uri(), "b")
    assert store.table_failures() == {}
    store.record_table_failure(a, "PERMANENT", "[Errno 20] Not a directory: '/x/a'\nsecond line", at=1_000)
    store.record_table_failure(a, "TRANSIENT", "connection reset", at=61_000)
    failures = store.table_failures([a, b])
    assert set(failures) == {a}
    f = failures[a]
    assert (f.attempts, f.first_failed_at, f.last_failed_at) == (2, 1_000, 61_000)
    assert (f.error_class, f.message) == ("TRANSIENT", "connection reset")  # the latest error
    store.record_table_failure(b, "PERMANENT", "first line only\nnot this")
    assert store.table_failures([b])[b].message == "first line only"
    store.clear_table_failure(a)
    assert set(store.table_failures()) == {b}


def test_init_upgrades_a_0005_store_with_the_commit_time_index_and_the_failures_table(
    store_url: str, tmp_path: Path
) -> None:
    old = SqlStore(store_url)
    db.migrate(old.engine, "0005")
    table_id = new_table(old, (tmp_path / "t").as_uri(), "t")
    old.close()
    store = SqlStore(store_url)
    store.init()
    with store.engine.connect() as conn:
        assert conn.execute(text("select version_num from alembic_version")).scalar() == "0008"
    if store.engine.dialect.name == "duckdb":  # duckdb-engine does not reflect indexes
        with store.engine.connect() as conn:
            sql = "SELECT index_name FROM duckdb_indexes() WHERE table_name = 'dl_commits'"
            names = set(conn.execute(text(sql)).scalars())
    else:
        names = {i["name"] for i in inspect(store.engine).get_indexes("dl_commits")}
    assert "ix_dl_commits_committed" in names
    assert "dl_table_failures" in inspect(store.engine).get_table_names()
    assert store.latest_version(table_id) == 0
    store.record_table_failure(table_id, "PERMANENT", "boom")
    assert store.table_failures()[table_id].attempts == 1
    store.close()


def test_percentiles_read_a_bounded_sample_and_a_bounded_number_of_tables(
    store: SqlStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The newest LATENCY_SAMPLE versions of a window per table, for at most LATENCY_TABLES tables:
    a fleet's ``status --json`` costs tables x sample, never a busy table's week."""
    from delta_mirror.health import status as status_module
    from delta_mirror.health.status import fleet_status
    from delta_mirror.store import latency

    table_id = _table_with_versions(store, (tmp_path / "t").as_uri(), "t", 20)
    now = now_ms()
    # older versions took 100 s, the newest five 1 s
    _set_times(
        store,
        table_id,
        {
            v: (now - 100_000 + v * 1_000, now - 100_000 + v * 1_000 + (1_000 if v >= 15 else 100_000))
            for v in range(20)
        },
    )
    monkeypatch.setattr(latency, "LATENCY_SAMPLE", 5)
    stats = store.latency_stats([table_id], now - HOUR)[table_id]
    assert (stats.versions, stats.max) == (5, 1.0)  # the newest five only
    u = _table_with_versions(store, (tmp_path / "u").as_uri(), "u", 1)
    tables = [store.get_table("t"), store.get_table("u")]
    monkeypatch.setattr(status_module, "LATENCY_TABLES", 1)
    assert [st.latency for st in fleet_status(store, tables, latency=True)] == [None, None]
    (one,) = fleet_status(store, tables[:1], latency=True)
    assert one.latency is not None
    hour = one.latency["1h"]
    assert hour is not None and hour["versions"] == 5
    assert u
