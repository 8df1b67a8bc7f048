"""The publisher lease across a store that cannot be reached at the release (a failover).

A release that fails leaves the lease row naming an owner whose work ended; the next take of that
table in the same process gives it back first, so the next publisher (a watcher's trigger makes a
new one per report) does not wait out the TTL. Real SQLite store; the failing release is the store's
method made to raise once, as it does while the primary is lost.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from support.stores import sqlite_store

from delta_mirror.errors import LeaseHeldError, PermanentError, TransientError
from delta_mirror.jobs.publish_lease import PublishLease
from delta_mirror.store import SqlStore
from delta_mirror.store.sql_store import TableInfo

TTL = 120.0


@pytest.fixture
def store_table(tmp_path: Path) -> tuple[SqlStore, TableInfo]:
    _url, store = sqlite_store(tmp_path)
    root = tmp_path / "t"
    root.mkdir()
    return store, store.create_table("t", str(root))


def _lost_primary_once(store: SqlStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """The next ``release_lease`` fails as it does while the primary is lost; later ones work."""
    real = store.release_lease

    def release_lease(table_id: int, owner: str) -> None:
        monkeypatch.setattr(store, "release_lease", real)
        raise TransientError("database error while releasing the publisher lease: session is read-only")

    monkeypatch.setattr(store, "release_lease", release_lease)


def _ended_with_a_failed_release(
    store: SqlStore, table: TableInfo, owner: str, monkeypatch: pytest.MonkeyPatch
) -> PublishLease:
    """A publisher of ``owner`` took the lease, did its work, and its release failed."""
    lease = PublishLease(store, owner, TTL)
    lease.take(table)
    _lost_primary_once(store, monkeypatch)
    with pytest.raises(TransientError, match="releasing the publisher lease"):
        lease.release(table)
    return lease


def test_a_release_that_fails_reaches_the_caller_and_the_next_take_in_the_process_gets_the_lease(
    store_table: tuple[SqlStore, TableInfo], monkeypatch: pytest.MonkeyPatch
) -> None:
    store, table = store_table
    _ended_with_a_failed_release(store, table, "host:1:first", monkeypatch)
    assert store.get_table("t").lease_owner == "host:1:first"  # the row still names the ended owner

    PublishLease(store, "host:1:second", TTL).take(table)  # no wait for the TTL

    assert store.get_table("t").lease_owner == "host:1:second"


def test_another_process_still_waits_for_the_ttl(store_table: tuple[SqlStore, TableInfo]) -> None:
    """Only the process that saw the release fail knows the owner is done: a lease of another
    process is never given back early."""
    store, table = store_table
    PublishLease(store, "other-host:7:busy", TTL).take(table)  # another process, at work
    mine = PublishLease(store, "host:1:mine", TTL)
    with pytest.raises(LeaseHeldError):
        mine.take(table)
    assert store.get_table("t").lease_owner == "other-host:7:busy"


def test_an_owner_that_takes_again_is_not_given_back_under_itself(
    store_table: tuple[SqlStore, TableInfo], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reused publisher whose release failed takes the table again: it holds the lease once more,
    and a second publisher in the process must see it held."""
    store, table = store_table
    reused = _ended_with_a_failed_release(store, table, "host:1:reused", monkeypatch)

    reused.take(table)  # at work again

    with pytest.raises(LeaseHeldError):
        PublishLease(store, "host:1:second", TTL).take(table)
    assert store.get_table("t").lease_owner == "host:1:reused"


def test_while_the_store_is_still_away_the_owner_stays_remembered(
    store_table: tuple[SqlStore, TableInfo], monkeypatch: pytest.MonkeyPatch
) -> None:
    store, table = store_table
    _ended_with_a_failed_release(store, table, "host:1:first", monkeypatch)
    _lost_primary_once(store, monkeypatch)  # the first give-back fails too
    with pytest.raises(LeaseHeldError):
        PublishLease(store, "host:1:second", TTL).take(table)

    PublishLease(store, "host:1:third", TTL).take(table)  # the store answers again

    assert store.get_table("t").lease_owner == "host:1:third"


def test_when_the_work_failed_its_error_is_what_the_caller_sees_not_the_failed_release(
    store_table: tuple[SqlStore, TableInfo], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A publish that failed because the primary was lost also fails to give its lease back: the
    caller (the task, its alert) gets the publish's error; the release is logged and remembered."""
    store, table = store_table
    lease = PublishLease(store, "host:1:first", TTL)
    with pytest.raises(PermanentError, match="the publish itself"), lease.held(table):
        _lost_primary_once(store, monkeypatch)
        raise PermanentError("the publish itself failed", table="t")
    assert "could not give back the publisher lease of 't'" in caplog.text

    PublishLease(store, "host:1:second", TTL).take(table)  # remembered: given back at the next take
    assert store.get_table("t").lease_owner == "host:1:second"


def test_when_the_work_succeeded_a_failed_release_is_raised_and_a_clean_one_frees_the_table(
    store_table: tuple[SqlStore, TableInfo], monkeypatch: pytest.MonkeyPatch
) -> None:
    store, table = store_table
    with PublishLease(store, "host:1:clean", TTL).held(table):
        assert store.get_table("t").lease_owner == "host:1:clean"
    assert store.get_table("t").lease_owner is None
    with pytest.raises(TransientError), PublishLease(store, "host:1:first", TTL).held(table):
        _lost_primary_once(store, monkeypatch)
