"""Each table's Airflow asset (``delta_mirror.airflow.assets``): one per table, a stable URI, an
event from the publishing task only when it published, with the versions in its ``extra``; a
config whose tables would share an asset is refused before any DAG is built.

The operators run in real DAG runs (``dag.test()``) on a real SQLite store and real Delta files;
the events are read back from Airflow's metadata DB. The triggerer's watcher runs as the triggerer
runs it (``support.triggerer``)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from dm_airflow_kit import DAGS_FOLDER, make_table, run_dag
from support.triggerer import Triggerer

from delta_mirror.jobs.publisher import Publisher
from delta_mirror.store import SqlStore
from delta_mirror.table_config import ConfigError, parse_config


def config(tables: dict[str, Any]) -> Any:
    import yaml

    return parse_config(yaml.safe_dump({"defaults": {"schedule": None}, "tables": tables}), "tables.yaml")


# --------------------------------------------------------------------------------------------------
# the mapping


def test_each_table_has_one_asset_named_after_it_with_a_uri_from_its_store_and_name() -> None:
    from delta_mirror.airflow.assets import table_asset, table_assets

    cfg = config({"orders": {}, "orders.v2": {"store_conn_id": "pg_main"}, "clicks": {"schedule": "event"}})
    assets = table_assets(cfg)
    assert {n: (a.name, a.uri) for n, a in assets.items()} == {
        "orders": ("orders", "x-delta-mirror://default/orders"),
        "orders.v2": ("orders.v2", "x-delta-mirror://pg_main/orders.v2"),
        "clicks": ("clicks", "x-delta-mirror://default/clicks"),
    }
    # stable: the same from every call, from a config object or its default path, listed or not
    assert table_asset("orders", cfg) == assets["orders"] == table_assets(cfg)["orders"]
    assert table_asset("unlisted", cfg).uri == "x-delta-mirror://default/unlisted"


def test_a_configured_asset_uri_is_normalised_as_airflow_normalises_it() -> None:
    from delta_mirror.airflow.assets import table_asset

    cfg = config({"orders": {"asset_uri": "s3://lake/orders/"}})
    assert (table_asset("orders", cfg).name, table_asset("orders", cfg).uri) == ("orders", "s3://lake/orders")


def test_a_triggerer_published_table_asset_carries_the_watcher_that_emits_its_events() -> None:
    """Every DAG file builds it the same way (Airflow keeps the watchers of the copy parsed last)."""
    from delta_mirror.airflow.assets import table_asset
    from delta_mirror.airflow.triggers import PublishedVersionsTrigger

    cfg = config(
        {
            "trig": {"schedule": "event", "poll_interval": "2s", "store_conn_id": "pg"},
            "task": {"schedule": "event", "publish_in": "task"},
        }
    )
    (watcher,) = table_asset("trig", cfg).watchers
    assert isinstance(watcher.trigger, PublishedVersionsTrigger)
    path, kwargs = watcher.trigger.serialize()
    assert kwargs == {"table": "trig", "store_conn_id": "pg", "poll_interval": 2.0, "watermark": None}
    assert PublishedVersionsTrigger(**kwargs).serialize() == (path, kwargs)
    assert table_asset("trig", cfg) == table_asset("trig", cfg)
    # its shared stream is the publishing trigger's: no poll of its own
    from delta_mirror.airflow.triggers import StoreCommitTrigger

    assert watcher.trigger.shared_stream_key() == StoreCommitTrigger("trig", "pg", 2.0).shared_stream_key()
    assert table_asset("task", cfg).watchers == []  # its sync task emits the events


@pytest.mark.parametrize(
    ("tables", "line"),
    [
        (
            {"a": {"asset_uri": "s3://lake/orders/"}, "b": {"asset_uri": "s3://lake/orders"}},
            "tables 'a' (s3://lake/orders/) and 'b' (s3://lake/orders) would have the same asset URI "
            "s3://lake/orders",
        ),
        (
            {"a": {"asset_uri": "x-delta-mirror://default/b"}, "b": {}},
            "tables 'a' (x-delta-mirror://default/b) and 'b' (x-delta-mirror://default/b) would have "
            "the same asset URI x-delta-mirror://default/b",
        ),
    ],
    ids=["one-location-written-twice", "a-uri-naming-another-table"],
)
def test_two_tables_with_one_asset_uri_are_refused_in_one_line_naming_both(
    tables: dict[str, Any], line: str
) -> None:
    from delta_mirror.airflow.assets import table_asset, table_assets

    with pytest.raises(ConfigError) as caught:
        table_assets(config(tables))
    assert str(caught.value).splitlines() == [
        f"tables.yaml: {line} — give one of them another asset_uri (one table, one asset)"
    ]
    with pytest.raises(ConfigError, match="same asset URI"):  # a consumer's lookup refuses it too
        table_asset("a", config(tables))


def test_an_asset_uri_airflow_refuses_is_one_line_naming_the_table() -> None:
    from delta_mirror.airflow.assets import table_assets

    with pytest.raises(ConfigError) as caught:
        table_assets(config({"a": {"asset_uri": "airflow://reserved/a"}}))
    assert "table 'a': the asset URI 'airflow://reserved/a' is not one Airflow accepts" in str(caught.value)
    assert len(str(caught.value).splitlines()) == 1


def test_an_asset_uri_in_the_defaults_is_refused() -> None:
    import yaml

    text = yaml.safe_dump({"defaults": {"asset_uri": "s3://lake/x"}, "tables": {"a": {}}})
    with pytest.raises(ConfigError, match=r"defaults\.asset_uri: an asset URI names one table's asset"):
        parse_config(text, "tables.yaml")


def test_a_clash_in_the_dag_file_is_one_import_error_and_no_dag_at_all(
    dm_config: Callable[..., Path],
) -> None:
    from airflow.dag_processing.dagbag import DagBag

    path = dm_config(
        {"a": {}, "b": {"asset_uri": "file:///lake/t/"}, "c": {"asset_uri": "file:///lake/t"}, "d": {}}
    )
    bag = DagBag(dag_folder=str(DAGS_FOLDER))
    assert bag.dag_ids == []  # nothing half-built: not a, not d, not the shared DAGs
    (message,) = bag.import_errors.values()
    assert (
        f"ConfigError: {path}: tables 'b' (file:///lake/t/) and 'c' (file:///lake/t) would have the "
        "same asset URI file:///lake/t — give one of them another asset_uri" in message
    )


def test_the_publishing_tasks_have_the_table_asset_as_outlet(dm_config: Callable[..., Path]) -> None:
    from airflow.dag_processing.dagbag import DagBag
    from airflow.sdk import Asset, AssetAny

    from delta_mirror.airflow.assets import table_asset

    dm_config({"steps": {}, "single": {"tasks": "single"}, "trig": {"schedule": "event"}})
    bag = DagBag(dag_folder=str(DAGS_FOLDER))
    assert bag.import_errors == {}
    for table, task_id in (("steps", "publish"), ("single", "sync"), ("trig", "sync")):
        task = bag.dags[f"delta_mirror__{table}"].get_task(task_id)
        assert task.outlets == [table_asset(table)], table
        # the watchers too (an Asset compares by name and URI): a consumer's file must not drop them
        (outlet,) = task.outlets
        assert [w.trigger.serialize() for w in outlet.watchers] == [
            w.trigger.serialize() for w in table_asset(table).watchers
        ]
        assert len(outlet.watchers) == (table == "trig")
    others = [t for t in bag.dags["delta_mirror__steps"].tasks if t.task_id != "publish"]
    assert all(t.outlets == [] for t in others)
    consumer = bag.dags["delta_mirror_example_table_consumer"]
    condition = consumer.timetable.asset_condition
    assert isinstance(condition, AssetAny), condition
    assert {a.name for a in condition.objects if isinstance(a, Asset)} == {
        "steps",
        "single",
        "trig",
    }


# --------------------------------------------------------------------------------------------------
# the event's extra, and reading it back


def test_the_extra_names_the_table_the_versions_and_the_newest_checkpoint() -> None:
    from delta_mirror.airflow.assets import EXTRA_KEYS, event_extra

    assert event_extra("t1", [4, 2, 3], [3]) == {
        "table": "t1",
        "first_version": 2,
        "last_version": 4,
        "checkpoint_version": 3,
    }
    assert tuple(event_extra("t1", [7]) or {}) == EXTRA_KEYS
    assert event_extra("t1", [7])["checkpoint_version"] is None  # type: ignore[index]
    assert event_extra("t1", [], [3]) is None  # nothing published: no event


def test_a_consumer_run_covers_first_to_last_over_all_its_events_of_either_source() -> None:
    """Coalesced events: two from tasks, one from the triggerer (Airflow wraps its payload)."""
    from delta_mirror.airflow.assets import published_range

    def ev(extra: dict[str, Any]) -> Any:
        return SimpleNamespace(extra=extra)

    events = {
        "orders": [
            ev({"table": "orders", "first_version": 3, "last_version": 4, "checkpoint_version": None}),
            ev({"table": "orders", "first_version": 5, "last_version": 9, "checkpoint_version": 9}),
            ev(
                {
                    "from_trigger": True,
                    "payload": {"table": "orders", "first_version": 10, "last_version": 10},
                }
            ),
        ],
        "clicks": [ev({"table": "clicks", "first_version": 0, "last_version": 0})],
    }
    got = published_range(events, "orders")
    assert got is not None
    assert got.to_json() == {
        "table": "orders",
        "first_version": 3,
        "last_version": 10,
        "checkpoint_version": 9,
        "events": 3,
    }
    assert published_range(events, "nope") is None
    assert published_range(None, "orders") is None  # a manual run has no triggering events


# --------------------------------------------------------------------------------------------------
# the operators' events, in real DAG runs


def asset_events(table: str) -> list[dict[str, Any]]:
    """The extras of ``table``'s asset events in Airflow's metadata DB, oldest first."""
    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        rows = session.scalars(
            select(AssetEvent)
            .join(AssetModel, AssetModel.id == AssetEvent.asset_id)
            .where(AssetModel.name == table)
            .order_by(AssetEvent.id)
        ).all()
        return [dict(r.extra or {}) for r in rows]


@pytest.fixture
def t1(sqlite_store: str, local_location: Path) -> SqlStore:
    store = SqlStore(sqlite_store)
    make_table(store, "t1", local_location.as_uri(), versions=4, checkpoint_interval=3)
    return store


@pytest.mark.parametrize("layout", ["steps", "single"])
def test_the_publishing_task_emits_one_event_with_the_versions_and_none_when_nothing_was_published(
    layout: str, t1: SqlStore, dm_config: Callable[..., Path], airflow_db: Path
) -> None:
    dm_config({"t1": {"tasks": layout, "validate": False}})
    before = asset_events("t1")  # Airflow's metadata DB is the session's: earlier tests' events
    run = run_dag("delta_mirror__t1")
    assert run.state == "success", run.states()
    task_id = "publish" if layout == "steps" else "sync"
    assert asset_events("t1")[len(before) :] == [
        {"table": "t1", "first_version": 0, "last_version": 3, "checkpoint_version": 3}
    ]
    # nothing new: the task succeeds and emits nothing
    run = run_dag("delta_mirror__t1")
    assert run.state == "success" and run.states()[task_id] == "success", run.states()
    assert len(asset_events("t1")) == len(before) + 1
    # one more commit: an event for it alone
    make_more(t1)
    assert run_dag("delta_mirror__t1").state == "success"
    assert asset_events("t1")[-1] == {
        "table": "t1",
        "first_version": 4,
        "last_version": 4,
        "checkpoint_version": None,
    }


def make_more(store: SqlStore) -> None:
    store.commit("t1", [("txn", {"appId": "loader", "version": 1})])


def test_a_triggerer_table_sync_task_leaves_its_events_to_the_watcher(
    t1: SqlStore, dm_config: Callable[..., Path], airflow_db: Path
) -> None:
    dm_config({"t1": {"schedule": "event", "publish_in": "triggerer", "validate": False}})
    before = len(asset_events("t1"))
    run = run_dag("delta_mirror__t1")
    assert run.state == "success", run.states()
    assert run.xcom("sync")["published"] == 4  # it published...
    assert len(asset_events("t1")) == before  # ...and the asset's watcher reports it, not the task


# --------------------------------------------------------------------------------------------------
# the triggerer's watcher


def test_the_watcher_fires_for_each_publish_past_the_version_it_started_at(t1: SqlStore) -> None:
    from delta_mirror.airflow.triggers import PublishedVersionsTrigger

    Publisher(t1).publish("t1", to_version=0)  # published before the watcher starts: no event
    events: list[dict[str, Any]] = []
    trig = PublishedVersionsTrigger(table="t1", poll_interval=0.05)

    async def until(check: Callable[[], bool]) -> None:
        for _ in range(200):
            if check():
                return
            await asyncio.sleep(0.05)
        raise AssertionError(f"timed out; events {events}")

    async def main() -> None:
        async with Triggerer().collecting([trig], events):
            await asyncio.sleep(0.3)
            assert events == []
            await asyncio.to_thread(Publisher(t1).publish, "t1")  # 1..3, checkpoint at 3
            await until(lambda: len(events) == 1)
            await asyncio.to_thread(make_more, t1)
            await asyncio.sleep(0.3)
            assert len(events) == 1  # committed, not published: nothing yet
            await asyncio.to_thread(Publisher(t1).publish, "t1")
            await until(lambda: len(events) == 2)

    asyncio.run(asyncio.wait_for(main(), 30))
    assert [(e["table"], e["first_version"], e["last_version"]) for e in events] == [
        ("t1", 1, 3),
        ("t1", 4, 4),
    ]
    # the publisher marks the versions published before it writes their checkpoint: the event may
    # go before it is there (a checkpoint written by a later run is not among these versions anyway)
    assert events[0]["checkpoint_version"] in (None, 3) and events[1]["checkpoint_version"] is None
    url = t1.url
    assert trig._checkpoint_among(url, 1, 3) == 3  # once written, it is reported
    assert trig._checkpoint_among(url, 4, 4) is None  # not among these versions


def test_table_asset_reads_the_config_named_by_path_or_by_delta_mirror_config(
    dm_config: Callable[..., Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from delta_mirror.airflow.assets import table_asset

    path = dm_config({"orders": {"store_conn_id": "pg_main"}})
    assert table_asset("orders").uri == "x-delta-mirror://pg_main/orders"  # DELTA_MIRROR_CONFIG
    monkeypatch.delenv("DELTA_MIRROR_CONFIG")
    assert table_asset("orders", str(path)).uri == "x-delta-mirror://pg_main/orders"
    with pytest.raises(ConfigError, match=r"cannot read the table config .*nope\.yaml"):
        table_asset("orders", tmp_path / "nope.yaml")
