"""``publish_in: triggerer``: the trigger publishes a table's commits itself and fires its DAG only
when the run has work (a checkpoint due, publishing failed). Its async generator is driven
directly, on a real SQLite or PostgreSQL store and a real local folder."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from dm_airflow_kit import make_table
from support.triggerer import Triggerer

from delta_mirror.delta.log_path import LOG_DIR, commit_name
from delta_mirror.jobs.publisher import Publisher
from delta_mirror.store import SqlStore


@pytest.fixture
def store(store_url: str, monkeypatch: pytest.MonkeyPatch, airflow_env: dict[str, str]) -> SqlStore:
    """A fresh store, also the trigger's (``DELTA_MIRROR_STORE``: no connection id)."""
    monkeypatch.setenv("DELTA_MIRROR_STORE", store_url)
    s = SqlStore(store_url)
    s.init()
    return s


def drive(body: Callable[[list[dict[str, Any]]], Awaitable[None]], **kwargs: Any) -> list[dict[str, Any]]:
    """Run a publishing trigger for table t1 while ``body`` acts and checks; the events it fired."""
    from delta_mirror.airflow.triggers import StoreCommitTrigger

    events: list[dict[str, Any]] = []
    trig = StoreCommitTrigger(table="t1", poll_interval=0.1, publish=True, **kwargs)

    async def main() -> None:
        async with Triggerer().collecting([trig], events):  # as the triggerer runs it: a shared stream
            await asyncio.wait_for(body(events), 20)

    asyncio.run(main())
    return events


async def until(check: Callable[[], bool], timeout: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not await asyncio.to_thread(check):
        assert loop.time() < deadline, "timed out"
        await asyncio.sleep(0.05)


def published(store: SqlStore) -> int | None:
    return store.last_published_version(store.get_table("t1").id)


def test_pending_and_new_commits_are_published_by_the_trigger_and_fire_nothing(
    store: SqlStore, tmp_path: Path
) -> None:
    """Versions pending at start (a restarted triggerer) and a later commit are published by the
    trigger itself; no checkpoint is due (interval 10), so no DAG run is asked for."""
    root = tmp_path / "t1"
    root.mkdir()
    make_table(store, "t1", root.as_uri(), versions=2, checkpoint_interval=10)

    async def body(events: list[dict[str, Any]]) -> None:
        await until(lambda: published(store) == 1)
        await asyncio.to_thread(store.commit, "t1", [("txn", {"appId": "loader", "version": 1})])
        await until(lambda: published(store) == 2)
        await asyncio.sleep(0.5)  # no event arrives meanwhile
        assert events == []

    assert drive(body) == []
    assert all((root / LOG_DIR / commit_name(v)).is_file() for v in range(3))
    assert store.last_checkpoint_version(store.get_table("t1").id) is None


def test_a_due_checkpoint_publishes_then_fires_one_event_and_writes_no_checkpoint(
    store: SqlStore, tmp_path: Path
) -> None:
    root = tmp_path / "t1"
    root.mkdir()
    make_table(store, "t1", root.as_uri(), versions=4, checkpoint_interval=3)  # due at 3

    def commit() -> None:
        store.commit("t1", [("txn", {"appId": "loader", "version": 1})])

    async def body(events: list[dict[str, Any]]) -> None:
        await until(lambda: len(events) >= 1)
        assert published(store) == 3  # published before firing: the run only checkpoints
        assert store.last_checkpoint_version(store.get_table("t1").id) is None  # the run's, not here
        # a commit while that run has not written its checkpoint: published, no second run
        await asyncio.to_thread(commit)
        await until(lambda: published(store) == 4)
        await asyncio.sleep(0.3)
        assert len(events) == 1
        await asyncio.to_thread(Publisher(store).checkpoint, "t1", 3)  # the run did its work
        for _ in range(2):  # due again at 6 (3 versions since the checkpoint)
            await asyncio.to_thread(commit)
        await until(lambda: len(events) >= 2)
        await asyncio.sleep(0.3)

    events = drive(body)
    assert events[0] == {"table": "t1", "from_version": 0, "to_version": 3, "reason": "checkpoint due"}
    # 5 and 6 are one event, or 5 is published alone (not due yet) when a poll falls between them
    assert len(events) == 2 and events[1]["from_version"] in (5, 6)
    assert (events[1]["to_version"], events[1]["reason"]) == (6, "checkpoint due")
    assert published(store) == 6


def test_a_storage_failure_fires_one_event_and_writes_nothing(store: SqlStore, tmp_path: Path) -> None:
    root = tmp_path / "t1"
    root.mkdir()
    make_table(store, "t1", root.as_uri(), versions=2, checkpoint_interval=10)
    (root / LOG_DIR).write_text("not a folder")  # every put into the log fails
    before = sorted(p.name for p in root.iterdir())

    async def body(events: list[dict[str, Any]]) -> None:
        await until(lambda: len(events) >= 1)
        await asyncio.sleep(0.6)  # one event: the run publishes (with its retries), no re-fire

    events = drive(body)
    assert events == [{"table": "t1", "from_version": 0, "to_version": 1, "reason": "failed"}]
    assert published(store) is None
    assert sorted(p.name for p in root.iterdir()) == before
    assert (root / LOG_DIR).read_text() == "not a folder"


def test_a_held_lease_fires_nothing_and_the_trigger_publishes_once_it_is_released(
    store: SqlStore, tmp_path: Path
) -> None:
    root = tmp_path / "t1"
    root.mkdir()
    make_table(store, "t1", root.as_uri(), versions=2, checkpoint_interval=10)
    table_id = store.get_table("t1").id
    assert store.acquire_lease(table_id, "a-sync-task", 60.0)

    async def body(events: list[dict[str, Any]]) -> None:
        await asyncio.sleep(0.8)  # several polls and retries while the lease is held
        assert (events, published(store)) == ([], None)
        store.release_lease(table_id, "a-sync-task")  # that publisher gave up: the trigger goes on
        await until(lambda: published(store) == 1)
        await asyncio.sleep(0.3)

    assert drive(body) == []
    assert (root / LOG_DIR / commit_name(1)).is_file()


def test_the_checkpoint_run_meeting_the_trigger_publishing_waits_for_its_lease_and_succeeds(
    store: SqlStore, store_url: str, tmp_path: Path
) -> None:
    """The fleet benchmark's failed tries (issue 15): the ``sync`` task of the run started for a
    due checkpoint took the lease while the table's trigger published the next commit. The task
    of a ``publish_in: triggerer`` table waits for it: one commit published once, by the trigger;
    the checkpoint written by the run; the task does not fail."""
    from delta_mirror.airflow.dag_factory import table_dag
    from delta_mirror.jobs.watch_publish import publish_from_watcher
    from delta_mirror.storage import open_store
    from delta_mirror.table_config import TableConfig

    root = tmp_path / "t1"
    root.mkdir()
    make_table(store, "t1", root.as_uri(), versions=4, checkpoint_interval=3)
    assert publish_from_watcher(store, "t1").action == "checkpoint due"  # the trigger fires the run
    store.commit("t1", [("txn", {"appId": "loader", "version": 1})])  # and the next commit arrives
    putting = threading.Event()

    class SlowStorage:  # the trigger's put of version 4 takes a while: it holds the lease meanwhile
        def __init__(self, location: str) -> None:
            self.inner = open_store(location)

        def __getattr__(self, name: str) -> Any:
            return getattr(self.inner, name)

        def put_if_absent(self, path: str, data: bytes) -> None:
            putting.set()
            time.sleep(0.5)
            self.inner.put_if_absent(path, data)

    watched: list[Any] = []
    trigger = threading.Thread(
        target=lambda: watched.append(
            publish_from_watcher(SqlStore(store_url), "t1", open_location=SlowStorage)
        )
    )
    trigger.start()
    try:
        assert putting.wait(10)
        sync = table_dag(TableConfig(name="t1", schedule="event", publish_in="triggerer")).get_task("sync")
        assert getattr(sync, "publish_in", None) == "triggerer"  # from the table config
        summary = sync.execute({})  # type: ignore[union-attr]
    finally:
        trigger.join()
    assert (watched[0].action, watched[0].published) == ("checkpoint due", [4])
    assert (summary["published"], summary["last_published"], summary["checkpoints"]) == (0, 4, [4])
    assert (summary["published_elsewhere"], summary["checkpoint_not_written"]) == (False, None)
    assert store.last_checkpoint_version(store.get_table("t1").id) == 4
    task_table = table_dag(TableConfig(name="t1", schedule="event", publish_in="task")).get_task("sync")
    assert getattr(task_table, "publish_in", None) == "task"  # its run alone publishes: no wait
    by_default = table_dag(TableConfig(name="t1", schedule="event")).get_task("sync")
    assert getattr(by_default, "publish_in", None) == "triggerer"  # event tables: the triggerer


def test_a_publishing_trigger_serializes_its_storage_connection() -> None:
    from delta_mirror.airflow.triggers import StoreCommitTrigger

    path, kwargs = StoreCommitTrigger("t1", publish=True, aws_conn_id="s3").serialize()
    assert kwargs["publish"] is True and kwargs["aws_conn_id"] == "s3"
    assert StoreCommitTrigger(**kwargs).serialize() == (path, kwargs)
    assert "publish" not in StoreCommitTrigger("t1").serialize()[1]  # task mode: as before


def test_the_fleet_validate_operator_fails_with_one_line_per_failed_table(
    sqlite_store: str, tmp_path: Path
) -> None:
    """The monitor DAG's ``validate`` task: the due tables are validated in its one process; a
    problem fails the task (the DAG's failure notification alerts) naming each failed table."""
    from airflow.sdk.exceptions import AirflowFailException

    from delta_mirror.airflow.operators import DeltaMirrorFleetValidateOperator

    store = SqlStore(sqlite_store)
    roots = {}
    for name in ("good", "bad"):
        roots[name] = tmp_path / name
        roots[name].mkdir()
        make_table(store, name, roots[name].as_uri(), versions=2)
        Publisher(store).publish(name)
    (roots["bad"] / LOG_DIR / commit_name(1)).write_text("{}\n")
    tables = {name: {"every": 3600.0, "reader": "deltalake"} for name in ("good", "bad")}
    op = DeltaMirrorFleetValidateOperator(task_id="validate", tables=tables)
    with pytest.raises(AirflowFailException) as exc:
        op.execute({})
    message = str(exc.value)
    assert "validation failed for 1 table(s)" in message and "bad: versions 1..1:" in message
    assert "good" not in message.split("table(s)", 1)[1].split(" — ")[0]
    assert store.get_table("good").settings["last_validation"]["ok"] is True
    with pytest.raises(AirflowFailException, match=r"bad: versions 1\.\.1"):
        op.execute({})  # a failed validation is due again at once: no retry turns it into a success
