"""The event-driven trigger: it fires when the store has commits past the watermark, and survives a
store that is briefly unreachable (the asset watcher must not die). Driven as the triggerer drives
it (Airflow's shared-stream manager, ``support.triggerer``) unless a test says otherwise."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from dm_airflow_kit import make_table
from support.services import scalar_query
from support.triggerer import Triggerer

from delta_mirror.jobs.publisher import Publisher
from delta_mirror.store import SqlStore

if TYPE_CHECKING:
    from delta_mirror.airflow.triggers import StoreCommitTrigger


def first_event(trigger: object, timeout: float = 10.0) -> dict[str, object]:
    async def run() -> dict[str, object]:
        triggerer = Triggerer()
        events = triggerer.events(trigger)
        try:
            return await anext(events)
        finally:
            await events.aclose()
            await triggerer.stop()

    return asyncio.run(asyncio.wait_for(run(), timeout))


def trigger(**kwargs: Any) -> StoreCommitTrigger:
    from delta_mirror.airflow.triggers import StoreCommitTrigger

    return StoreCommitTrigger(table="t1", poll_interval=0.05, **kwargs)


def test_the_trigger_serializes_to_its_import_path_and_arguments() -> None:
    from delta_mirror.airflow.triggers import StoreCommitTrigger

    path, kwargs = StoreCommitTrigger(
        "t1", store_conn_id="pg", poll_interval=2.0, watermark=7, coalesce_seconds=60.0
    ).serialize()
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


def test_a_trigger_run_alone_fires_as_it_does_in_a_shared_stream(
    sqlite_store: str, local_location: Path
) -> None:
    """``run()``: the triggerer's fallback when a trigger shares no stream (its own producer)."""
    store = SqlStore(sqlite_store)
    make_table(store, "t1", local_location.as_uri(), versions=3)

    async def run() -> dict[str, object]:
        async for event in trigger().run():
            return dict(event.payload)
        raise AssertionError("the trigger ended without an event")

    assert asyncio.run(asyncio.wait_for(run(), 10)) == {"table": "t1", "from_version": 0, "to_version": 2}


def test_triggers_of_one_store_connection_and_interval_share_one_stream_key() -> None:
    from delta_mirror.airflow.triggers import StoreCommitTrigger

    keys = {
        StoreCommitTrigger("a", store_conn_id="pg", poll_interval=1).shared_stream_key(),
        StoreCommitTrigger("b", store_conn_id="pg", poll_interval=1.0, publish=True).shared_stream_key(),
    }
    assert len(keys) == 1
    assert StoreCommitTrigger("a", store_conn_id="other", poll_interval=1).shared_stream_key() not in keys
    assert StoreCommitTrigger("a", store_conn_id="pg", poll_interval=5).shared_stream_key() not in keys


def test_a_trigger_joining_a_running_stream_gets_its_pending_versions_at_once(
    sqlite_store: str, local_location: Path
) -> None:
    """Airflow broadcasts nothing sent before a subscriber joined: the producer reports again for it
    at once, not after its (here 60 s) interval."""
    from delta_mirror.airflow.triggers import StoreCommitTrigger
    from delta_mirror.store.watch import watchers

    store = SqlStore(sqlite_store)
    make_table(store, "t1", local_location.as_uri(), versions=1)
    make_table(store, "t2", local_location.as_uri() + "2", versions=2)

    async def main() -> None:
        triggerer = Triggerer()
        first = triggerer.events(StoreCommitTrigger(table="t1", poll_interval=60.0))
        second = triggerer.events(StoreCommitTrigger(table="t2", poll_interval=60.0))
        try:
            assert await asyncio.wait_for(anext(first), 10) == {
                "table": "t1",
                "from_version": 0,
                "to_version": 0,
            }
            assert len(watchers()) == 1
            assert await asyncio.wait_for(anext(second), 10) == {
                "table": "t2",
                "from_version": 0,
                "to_version": 1,
            }
            assert len(watchers()) == 1  # the same producer polls both tables now
        finally:
            await first.aclose()
            await second.aclose()
            await triggerer.stop()
        assert watchers() == []  # the last subscriber gone, Airflow stopped the producer

    asyncio.run(main())


@pytest.mark.slow
def test_a_trigger_busy_longer_than_its_queue_of_reports_keeps_its_stream(
    sqlite_store: str, local_location: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Airflow fails a trigger whose queue of unread reports is full (here 1 report): a trigger busy
    publishing while other tables commit still fires afterwards, since it reads its stream in a task
    of its own and keeps only the newest versions."""
    from delta_mirror.airflow.triggers import StoreCommitTrigger

    store = SqlStore(sqlite_store)
    make_table(store, "t1", local_location.as_uri(), versions=1)
    make_table(store, "t2", local_location.as_uri() + "2", versions=1)
    busy = asyncio.Event()
    events: list[dict[str, object]] = []

    async def slow_publish(self: StoreCommitTrigger, *_args: object) -> dict[str, object]:
        busy.set()
        await asyncio.sleep(2.0)  # meanwhile t2's commits broadcast reports to t1's queue too
        return {"table": self.table, "reason": "slow"}

    monkeypatch.setattr(StoreCommitTrigger, "_publish_pending", slow_publish)

    async def main() -> None:
        triggers = [StoreCommitTrigger(name, poll_interval=0.05, publish=True) for name in ("t1", "t2")]
        async with Triggerer(max_subscriber_queue=1).collecting(triggers, events) as tasks:
            await asyncio.wait_for(busy.wait(), 10)
            for n in range(5):
                await asyncio.to_thread(store.commit, "t2", [("txn", {"appId": "loader", "version": n})])
                await asyncio.sleep(0.15)
            await asyncio.to_thread(store.commit, "t1", [("txn", {"appId": "loader", "version": 1})])
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 20
            while sum(e["table"] == "t1" for e in events) < 2:
                assert loop.time() < deadline, events
                assert not any(t.done() for t in tasks), [t.exception() for t in tasks if t.done()]
                await asyncio.sleep(0.05)

    asyncio.run(main())


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


def pg_backends(url: str) -> int:
    """Open connections to the store's database (not counting this query's own)."""
    return scalar_query(
        url,
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()",
    )


def pg_sessions(url: str) -> int:
    """Connections ever opened to the store's database (PostgreSQL 14+ counts them)."""
    return scalar_query(url, "SELECT sessions FROM pg_stat_database WHERE datname = current_database()")


@pytest.mark.postgres
def test_50_triggers_share_one_stream_a_commit_fires_only_its_table_and_a_store_restart_loses_nothing(
    pg_store_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pg_restart: object
) -> None:
    """Each table's trigger fires exactly once for its pending version 0, once for a later commit to
    it and never for another table's commit; 50 watched tables hold a bounded number of store
    connections (the shared pool and one LISTEN), and a commit made across a PostgreSQL restart
    still fires."""
    from support.builders import add_body, metadata_body, protocol_body

    from delta_mirror.airflow.triggers import StoreCommitTrigger
    from delta_mirror.store.watch import watchers

    store = SqlStore(pg_store_url)
    store.init()
    names = [f"t{i:03d}" for i in range(50)]
    for name in names:
        store.create_table(name, (tmp_path / name).as_uri())
        store.commit(
            name, [("protocol", protocol_body()), ("metaData", metadata_body()), ("add", add_body("a"))]
        )
    monkeypatch.setenv("DELTA_MIRROR_STORE", pg_store_url)
    events: list[dict[str, Any]] = []
    # no coalescing here: no DAG run publishes what the triggers fire for
    triggers = [StoreCommitTrigger(table=name, poll_interval=0.2, coalesce_seconds=0) for name in names]

    async def settle(count: int, quiet: float = 1.0) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 30
        while len(events) < count:
            assert loop.time() < deadline, events
            await asyncio.sleep(0.05)
        await asyncio.sleep(quiet)  # no extra event arrives meanwhile
        assert len(events) == count, events[count:]

    async def main() -> None:
        async with Triggerer().collecting(triggers, events):
            await settle(50)
            assert sorted(str(e["table"]) for e in events) == names
            assert all(e["from_version"] == 0 and e["to_version"] == 0 for e in events)
            assert len(watchers()) == 1
            # the test's writer, the watcher's poll and its 2 one-off readers, the LISTEN connection
            assert pg_backends(pg_store_url) <= 5
            # idle, polled 5 times a second for 50 tables: no new connection (the query's own aside)
            before = await asyncio.to_thread(pg_sessions, pg_store_url)
            await asyncio.sleep(2.0)
            assert await asyncio.to_thread(pg_sessions, pg_store_url) - before <= 2

            await asyncio.to_thread(store.commit, "t007", [("add", add_body("b"))])
            await settle(51)
            assert events[50] == {"table": "t007", "from_version": 1, "to_version": 1}

            store.close()
            await asyncio.to_thread(pg_restart)  # type: ignore[arg-type]
            await asyncio.to_thread(store.commit, "t011", [("add", add_body("b"))])
            await settle(52, quiet=2.0)
            assert events[51] == {"table": "t011", "from_version": 1, "to_version": 1}
            assert pg_backends(pg_store_url) <= 5

    asyncio.run(main())


def collect(trig: StoreCommitTrigger, events: list[dict[str, Any]]) -> Coroutine[Any, Any, None]:
    async def run() -> None:
        async with Triggerer().collecting([trig], events) as tasks:
            await asyncio.gather(*tasks)

    return run()


async def quiet_then(
    events: list[dict[str, object]], count: int, quiet: float = 0.6, timeout: float = 10.0
) -> None:
    """``count`` events arrive (within ``timeout``) and no more during ``quiet`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while len(events) < count:
        assert loop.time() < deadline, events
        await asyncio.sleep(0.02)
    await asyncio.sleep(quiet)
    assert len(events) == count, events


@pytest.mark.slow
def test_commits_during_an_unpublished_run_are_coalesced_into_one_event_after_it_publishes(
    sqlite_store: str, local_location: Path
) -> None:
    """The trigger fires for v0; v1 and v2 arrive before that run published v0: one event for both
    once v0 is published, none before; versions a run already published fire nothing."""
    store = SqlStore(sqlite_store)
    make_table(store, "t1", local_location.as_uri(), versions=1)
    events: list[dict[str, object]] = []

    def commit(n: int) -> None:
        store.commit("t1", [("txn", {"appId": "loader", "version": n})])

    async def main() -> None:
        task = asyncio.create_task(collect(trigger(coalesce_seconds=60.0), events))
        try:
            await quiet_then(events, 1)
            assert events[0] == {"table": "t1", "from_version": 0, "to_version": 0}
            commit(1)
            commit(2)
            await quiet_then(events, 1, quiet=1.0)  # held: the run for v0 has not published
            await asyncio.to_thread(Publisher(store).publish, "t1", 0)
            await quiet_then(events, 2)
            assert events[1] == {"table": "t1", "from_version": 1, "to_version": 2}
            # the run for 1..2 publishes them and a version committed meanwhile (3): nothing to fire
            commit(3)
            await asyncio.to_thread(Publisher(store).publish, "t1")
            await quiet_then(events, 2, quiet=1.0)
            commit(4)  # nothing is held now: at once
            await quiet_then(events, 3)
            assert events[2] == {"table": "t1", "from_version": 4, "to_version": 4}
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    asyncio.run(main())


@pytest.mark.slow
def test_a_held_batch_fires_anyway_when_the_run_does_not_publish_within_coalesce_seconds(
    sqlite_store: str, local_location: Path
) -> None:
    store = SqlStore(sqlite_store)
    make_table(store, "t1", local_location.as_uri(), versions=1)
    events: list[dict[str, object]] = []

    async def main() -> None:
        task = asyncio.create_task(collect(trigger(coalesce_seconds=1.5), events))
        try:
            await quiet_then(events, 1, quiet=0.1)
            store.commit("t1", [("txn", {"appId": "loader", "version": 1})])
            started = asyncio.get_running_loop().time()
            await quiet_then(events, 2, quiet=0.5)
            assert asyncio.get_running_loop().time() - started >= 1.0  # held, then released
            assert events[1] == {"table": "t1", "from_version": 1, "to_version": 1}
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    asyncio.run(main())
