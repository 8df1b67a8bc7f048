"""The event-driven trigger: it fires when the store has commits past the watermark, and survives a
store that is briefly unreachable (the asset watcher must not die)."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import pytest
from dm_airflow_kit import make_table

from delta_mirror.jobs.publisher import Publisher
from delta_mirror.store import SqlStore


def first_event(trigger: object, timeout: float = 10.0) -> dict[str, object]:
    async def run() -> dict[str, object]:
        async for event in trigger.run():  # type: ignore[attr-defined]
            return dict(event.payload)
        raise AssertionError("the trigger ended without an event")

    return asyncio.run(asyncio.wait_for(run(), timeout))


def trigger(**kwargs: object) -> object:
    from delta_mirror.airflow.triggers import StoreCommitTrigger

    return StoreCommitTrigger(table="t1", poll_interval=0.05, **kwargs)  # type: ignore[arg-type]


def test_the_trigger_serializes_to_its_import_path_and_arguments() -> None:
    from delta_mirror.airflow.triggers import StoreCommitTrigger

    path, kwargs = StoreCommitTrigger("t1", store_conn_id="pg", poll_interval=2.0, watermark=7).serialize()
    assert path == "delta_mirror.airflow.triggers.StoreCommitTrigger"
    assert StoreCommitTrigger(**kwargs).serialize() == (path, kwargs)


def test_pending_commits_fire_at_once_from_the_last_published_version(
    sqlite_store: str, local_location: Path
) -> None:
    store = SqlStore(sqlite_store)
    make_table(store, "t1", local_location.as_uri(), versions=3)
    assert first_event(trigger()) == {"table": "t1", "from_version": 0, "to_version": 2}
    Publisher(store).publish("t1", to_version=1)
    assert first_event(trigger()) == {"table": "t1", "from_version": 2, "to_version": 2}


def test_a_new_commit_past_the_watermark_fires_the_trigger(sqlite_store: str, local_location: Path) -> None:
    store = SqlStore(sqlite_store)
    make_table(store, "t1", local_location.as_uri(), versions=2)
    Publisher(store).publish("t1")

    def commit_later() -> None:
        time.sleep(0.3)
        store.commit("t1", [("txn", {"appId": "loader", "version": 1})])

    threading.Thread(target=commit_later).start()
    started = time.monotonic()
    assert first_event(trigger(watermark=1)) == {"table": "t1", "from_version": 2, "to_version": 2}
    assert time.monotonic() - started >= 0.25


def test_an_unreachable_store_is_polled_again_instead_of_killing_the_watcher(
    sqlite_store: str, local_location: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    store = SqlStore(sqlite_store)
    make_table(store, "t1", local_location.as_uri(), versions=1)
    monkeypatch.setenv("DELTA_MIRROR_STORE", f"sqlite:///{tmp_path / 'missing' / 'store.db'}")
    trig = trigger()

    def repair() -> None:
        time.sleep(0.3)
        monkeypatch.setenv("DELTA_MIRROR_STORE", sqlite_store)

    threading.Thread(target=repair).start()
    assert first_event(trig) == {"table": "t1", "from_version": 0, "to_version": 0}
