"""The DAG file and the factory: every DAG imports, is well-formed, and follows the table config.

Parsing goes through Airflow's own ``DagBag`` (what the dag-processor uses). In 3.3.2 it lives in
``airflow.dag_processing.dagbag`` and takes no ``include_examples`` argument (a ``TypeError``):
examples stay out through ``AIRFLOW__CORE__LOAD_EXAMPLES=False`` (set in conftest).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from dm_airflow_kit import DAGS_FOLDER, REPO, task_of

from delta_mirror.airflow.operators import (
    DeltaMirrorLagOperator,
    DeltaMirrorMaintenanceOperator,
    DeltaMirrorReconcileOperator,
    DeltaMirrorSyncOperator,
)

if TYPE_CHECKING:
    from airflow.dag_processing.dagbag import DagBag

SHARED = {
    "delta_mirror_reconcile",
    "delta_mirror_backfill",
    "delta_mirror_monitor",
    "delta_mirror_maintenance",
    "delta_mirror_example_spark_ingest",  # manual; ingest → publish → validate (airflow/examples.py)
    "delta_mirror_example_spark_pipeline",  # manual; Delta-Spark job → publish → validate (examples.py)
    "delta_mirror_example_table_consumer",  # on the tables' assets; reads the versions (examples.py)
}


def parse() -> DagBag:
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(DAGS_FOLDER))


def import_error(bag: DagBag) -> str:
    errors = bag.import_errors
    assert len(errors) == 1, errors
    return str(next(iter(errors.values())))


@pytest.fixture
def repo_config(monkeypatch: pytest.MonkeyPatch, airflow_env: dict[str, str]) -> Path:
    path = REPO / "config" / "delta_mirror.yaml"
    monkeypatch.setenv("DELTA_MIRROR_CONFIG", str(path))
    return path


def test_every_file_in_dags_imports_without_errors(repo_config: Path) -> None:
    bag = parse()
    assert bag.import_errors == {}
    assert {p.name for p in DAGS_FOLDER.glob("*.py")} == {"delta_mirror_dags.py"}
    assert set(bag.dag_ids) == {"delta_mirror__demo", *SHARED}


RICH = {
    "sales": {"schedule": "event", "tags": ["finance"], "owner": "finance-data"},
    "orders.v2": {"schedule": "1h", "validate": False, "retries": 5},
    "clicks": {"schedule": "*/15 * * * *", "maintenance": {"dry_run": False, "log_retention": "3d"}},
}


@pytest.mark.parametrize("which", ["repository-config", "three-tables"])
def test_every_dag_has_retries_an_owner_tags_and_docs(
    which: str, repo_config: Path, dm_config: Callable[..., Path]
) -> None:
    if which == "three-tables":
        dm_config(RICH, owner="data-platform", retries=2)
    bag = parse()
    assert bag.import_errors == {}
    assert len(bag.dags) == len(SHARED) + (1 if which == "repository-config" else 3)
    for dag_id, dag in bag.dags.items():
        assert dag.default_args.get("retries", 0) > 0, dag_id
        assert dag.default_args.get("owner"), dag_id
        assert "delta-mirror" in dag.tags and len(dag.tags) >= 2, dag_id
        assert dag.doc_md and len(dag.doc_md) > 40, dag_id
        for task in dag.tasks:
            assert task.retries == dag.default_args["retries"], (dag_id, task.task_id)
            assert task.owner == dag.default_args["owner"], (dag_id, task.task_id)
            assert task.on_failure_callback, (dag_id, task.task_id)
    if which == "three-tables":
        assert bag.dags["delta_mirror__sales"].owner == "finance-data"
        assert bag.dags["delta_mirror__orders.v2"].default_args["retries"] == 5


def test_tasks_retry_with_exponential_backoff_from_the_config(dm_config: Callable[..., Path]) -> None:
    dm_config(
        {"t1": {"retries": 4, "retry_delay": "15s", "max_retry_delay": "5m"}, "t2": {}},
        retry_exponential_backoff=3.0,
    )
    bag = parse()
    t1 = bag.dags["delta_mirror__t1"].get_task("publish")
    assert (t1.retries, t1.retry_delay, t1.max_retry_delay) == (
        4,
        timedelta(seconds=15),
        timedelta(minutes=5),
    )
    assert t1.retry_exponential_backoff == 3.0
    t2 = bag.dags["delta_mirror__t2"].get_task("publish")
    assert (t2.retries, t2.retry_delay, t2.max_retry_delay) == (
        1,
        timedelta(seconds=1),
        timedelta(minutes=10),
    )
    assert t2.retry_exponential_backoff == 3.0
    for dag_id in SHARED:
        for task in bag.dags[dag_id].tasks:
            assert task.retry_exponential_backoff == 3.0, (dag_id, task.task_id)


def test_the_table_dag_is_publish_checkpoint_validate_metrics(dm_config: Callable[..., Path]) -> None:
    dm_config({"t1": {"tags": ["sales"], "schedule": "10m"}, "t2": {"validate": False}})
    bag = parse()
    t1 = bag.dags["delta_mirror__t1"]
    assert t1.get_task("publish").downstream_task_ids == {"checkpoint"}
    assert t1.get_task("checkpoint").downstream_task_ids == {"validate"}
    assert t1.get_task("validate").downstream_task_ids == {"metrics"}
    assert {"delta-mirror", "table", "sales"} <= set(t1.tags)
    assert t1.max_active_runs == 1 and t1.catchup is False and t1.schedule == timedelta(minutes=10)
    assert t1.doc_md is not None and "t1" in t1.doc_md
    assert sorted(bag.dags["delta_mirror__t2"].task_ids) == ["checkpoint", "metrics", "publish"]


def test_an_event_table_runs_one_sync_task_unless_its_config_asks_for_the_steps(
    dm_config: Callable[..., Path],
) -> None:
    """``tasks`` unset: event-driven → one ``sync`` task (the Spark engine keeps its spark-submit
    checkpoint task after it); ``tasks: steps`` → the four; a scheduled table → the four."""

    dm_config(
        {
            "ev": {"schedule": "event", "validate_every": "30m", "lag_history_retention": "2d", "pool": "dm"},
            "ev_steps": {"schedule": "event", "tasks": "steps"},
            "cron_single": {"tasks": "single", "validate": False, "checkpoint": {"engine": "auto"}},
        }
    )
    bag = parse()
    ev = bag.dags["delta_mirror__ev"]
    assert ev.task_ids == ["sync"] and "one `sync` task" in str(ev.doc_md)
    sync = ev.get_task("sync")
    assert isinstance(sync, DeltaMirrorSyncOperator)
    assert (sync.validate_every, sync.lag_history_retention, sync.checkpoint_engine) == (
        1800.0,
        172800.0,
        "local",
    )
    assert (sync.pool, sync.retries, bool(sync.on_failure_callback)) == ("dm", 1, True)
    assert sorted(bag.dags["delta_mirror__ev_steps"].task_ids) == [
        "checkpoint",
        "metrics",
        "publish",
        "validate",
    ]
    single = bag.dags["delta_mirror__cron_single"].get_task("sync")
    assert isinstance(single, DeltaMirrorSyncOperator)
    assert (single.validate_every, single.checkpoint_engine) == (None, "auto")  # validate: false


def test_an_event_table_on_the_spark_engine_keeps_its_spark_submit_checkpoint_after_sync(
    dm_config: Callable[..., Path],
) -> None:
    pytest.importorskip("airflow.providers.apache.spark", reason="the apache-spark provider is not installed")
    dm_config({"big": {"schedule": "event", "checkpoint": {"engine": "spark"}}})
    dag = parse().dags["delta_mirror__big"]
    sync = dag.get_task("sync")
    assert isinstance(sync, DeltaMirrorSyncOperator)
    assert sync.downstream_task_ids == {"checkpoint"}
    assert sync.checkpoint_engine == "spark"  # publishes without the cadence's checkpoints
    assert type(dag.get_task("checkpoint")).__name__ == "DeltaMirrorSparkCheckpointOperator"


def test_a_bad_task_layout_is_an_import_error_naming_the_table_and_the_choices(
    dm_config: Callable[..., Path],
) -> None:
    dm_config({"t1": {"schedule": "event", "tasks": "fast"}})
    message = import_error(parse())
    assert "tables.t1.tasks: expected single or steps, got 'fast'" in message


def test_a_task_process_builds_only_its_own_table_dag(
    dm_config: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Airflow's parsing context (set in a task's process) names the task's DAG; the scheduler's DAG
    processor has none and gets every DAG."""
    from airflow.sdk.definitions.context import _AIRFLOW_PARSING_CONTEXT_DAG_ID

    from delta_mirror.airflow.dag_factory import build_dags

    dm_config({f"t{i}": {} for i in range(5)})
    every = build_dags()
    assert {f"delta_mirror__t{i}" for i in range(5)} | {"delta_mirror_reconcile"} <= set(every)

    monkeypatch.setenv(_AIRFLOW_PARSING_CONTEXT_DAG_ID, "delta_mirror__t3")
    only = build_dags()
    assert list(only) == ["delta_mirror__t3"]
    assert only["delta_mirror__t3"].task_ids == every["delta_mirror__t3"].task_ids

    monkeypatch.setenv(_AIRFLOW_PARSING_CONTEXT_DAG_ID, "delta_mirror_reconcile")  # not a table's DAG
    assert set(build_dags()) == set(every)


def test_the_fleet_knobs_of_the_config_reach_the_table_dags_and_their_tasks(
    dm_config: Callable[..., Path],
) -> None:
    """max_active_runs / max_active_tasks per DAG, pool / priority_weight on every task of the table."""
    dm_config(
        {
            "busy": {
                "max_active_runs": 2,
                "max_active_tasks": 3,
                "pool": "delta_mirror",
                "priority_weight": 10,
            },
            "t2": {},
        },
        max_active_runs=1,
    )
    bag = parse()
    busy, t2 = bag.dags["delta_mirror__busy"], bag.dags["delta_mirror__t2"]
    assert (busy.max_active_runs, busy.max_active_tasks) == (2, 3)
    assert {(t.pool, t.priority_weight) for t in busy.tasks} == {("delta_mirror", 10)}
    assert t2.max_active_runs == 1
    assert {(t.pool, t.priority_weight) for t in t2.tasks} == {("default_pool", 1)}
    assert t2.max_active_tasks != 3  # Airflow's default (core.max_active_tasks_per_dag)


def test_the_config_file_is_read_again_at_each_parse(dm_config: Callable[..., Path]) -> None:
    dm_config({"t1": {}})
    assert set(parse().dag_ids) == {"delta_mirror__t1", *SHARED}

    dm_config({"t1": {}, "orders": {"schedule": "@daily"}})
    bag = parse()
    assert set(bag.dag_ids) == {"delta_mirror__t1", "delta_mirror__orders", *SHARED}
    schedule: object = bag.dags["delta_mirror__orders"].schedule  # a cron preset stays a str
    assert schedule == "@daily"

    dm_config({"orders": {}})
    assert "delta_mirror__t1" not in parse().dag_ids


@pytest.mark.parametrize(
    ("tables", "named"),
    [
        ({"t1": {"retrys": 3}}, ["tables.t1", "'retrys'"]),
        ({"t1": {"lag_slo": "soon"}}, ["tables.t1.lag_slo", "'soon'"]),
        ({"bad name!": {}}, ["invalid table name", "'bad name!'"]),
        ({"t1": {"notify": {"emails": ["a@b.c"]}}}, ["tables.t1.notify", "'emails'"]),
    ],
    ids=["unknown-key", "bad-duration", "bad-table-name", "unknown-notify-key"],
)
def test_an_invalid_config_is_an_import_error_naming_the_key(
    dm_config: Callable[..., Path], tables: dict[str, object], named: list[str]
) -> None:
    path = dm_config(tables)
    bag = parse()
    assert bag.dag_ids == []
    message = import_error(bag)
    assert "ConfigError" in message and str(path) in message
    for text in named:
        assert text in message


def test_a_missing_config_file_is_an_import_error_saying_where_it_was_looked_for(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, airflow_env: dict[str, str]
) -> None:
    monkeypatch.setenv("DELTA_MIRROR_CONFIG", str(tmp_path / "nope.yaml"))
    message = import_error(parse())
    assert "nope.yaml" in message and "DELTA_MIRROR_CONFIG" in message


def test_an_event_driven_table_is_scheduled_by_an_asset_watcher_on_the_store(
    dm_config: Callable[..., Path],
) -> None:
    dm_config(
        {
            "t1": {
                "schedule": "event",
                "poll_interval": "2s",
                "store_conn_id": "dm_store",
                "publish_in": "task",
            }
        }
    )
    from airflow.sdk import Asset

    dag = parse().dags["delta_mirror__t1"]
    assert isinstance(dag.schedule, list)
    (asset,) = dag.schedule
    assert isinstance(asset, Asset)
    assert asset.uri == "x-delta-mirror://commits/t1"  # x-: no provider URI handlers to load
    (watcher,) = asset.watchers
    trigger = watcher.trigger
    assert trigger.serialize() == (
        "delta_mirror.airflow.triggers.StoreCommitTrigger",
        {
            "table": "t1",
            "store_conn_id": "dm_store",
            "poll_interval": 2.0,
            "watermark": None,
            "coalesce_seconds": 300.0,
        },
    )


def test_a_triggerer_publishing_table_has_a_publishing_watcher_and_is_validated_by_the_monitor(
    dm_config: Callable[..., Path],
) -> None:
    """``publish_in: triggerer``: the watcher publishes (with the table's storage connection) and
    the monitor DAG validates those tables, one task per connection pair; task-published tables
    stay with their ``sync`` task's validation."""
    dm_config(
        {
            "fast": {
                "schedule": "event",
                "publish_in": "triggerer",
                "aws_conn_id": "s3",
                "validate_every": "1h",
            },
            "other": {
                "schedule": "event",
                "publish_in": "triggerer",
                "reader": "spark",
                "aws_conn_id": "s3b",
            },
            "plain": {"schedule": "event", "publish_in": "task"},
            "unchecked": {"schedule": "event", "publish_in": "triggerer", "validate": False},
        }
    )
    from delta_mirror.airflow.operators import DeltaMirrorFleetValidateOperator

    bag = parse()
    fast: Any = bag.dags["delta_mirror__fast"].schedule  # a list of one Asset with its watcher
    kwargs = fast[0].watchers[0].trigger.serialize()[1]
    assert (kwargs["publish"], kwargs["aws_conn_id"]) == (True, "s3")
    plain: Any = bag.dags["delta_mirror__plain"].schedule
    assert "publish" not in plain[0].watchers[0].trigger.serialize()[1]
    monitor = bag.dags["delta_mirror_monitor"]
    validates = sorted(t.task_id for t in monitor.tasks if t.task_id.startswith("validate"))
    assert validates == ["validate", "validate_2"]
    first = task_of(monitor, "validate", DeltaMirrorFleetValidateOperator)
    second = task_of(monitor, "validate_2", DeltaMirrorFleetValidateOperator)
    assert (first.aws_conn_id, first.tables) == ("s3", {"fast": {"every": 3600.0, "reader": "deltalake"}})
    assert (second.aws_conn_id, second.tables) == ("s3b", {"other": {"every": 600.0, "reader": "spark"}})


def test_tables_with_their_own_connections_get_their_own_reconcile_and_lag_tasks(
    dm_config: Callable[..., Path],
) -> None:
    dm_config(
        {
            "a": {},
            "b": {"aws_conn_id": "bucket_b"},
            "c": {"store_conn_id": "other_store", "aws_conn_id": "bucket_c"},
        },
        store_conn_id="main_store",
    )
    bag = parse()
    reconcile = bag.dags["delta_mirror_reconcile"]
    reconciles = [
        task_of(reconcile, t.task_id, DeltaMirrorReconcileOperator)
        for t in reconcile.tasks
        if t.task_id.startswith("reconcile")
    ]
    groups = {t.task_id: (t.tables, t.store_conn_id, t.aws_conn_id) for t in reconciles}
    assert sorted(groups.values()) == [
        (["a"], "main_store", None),
        (["b"], "main_store", "bucket_b"),
        (["c"], "other_store", "bucket_c"),
    ]
    assert reconcile.get_task("escalate").upstream_task_ids == set(groups)
    monitor = bag.dags["delta_mirror_monitor"]
    lag_tasks = [
        task_of(monitor, t.task_id, DeltaMirrorLagOperator)
        for t in monitor.tasks
        if t.task_id.startswith("lag")
    ]
    lags = {t.task_id: (t.tables, t.store_conn_id) for t in lag_tasks}
    assert sorted(lags.values()) == [(["a", "b"], "main_store"), (["c"], "other_store")]
    assert monitor.get_task("check_slo").upstream_task_ids == set(lags)


def test_the_maintenance_dag_cleans_each_table_by_its_retention(dm_config: Callable[..., Path]) -> None:
    dm_config(
        {"t1": {"maintenance": {"log_retention": "2d", "dry_run": False}}, "t2": {}},
        maintenance={"schedule": "12h"},
    )
    dag = parse().dags["delta_mirror_maintenance"]
    assert dag.task_ids == ["cleanup__t1", "cleanup__t2"]
    t1 = task_of(dag, "cleanup__t1", DeltaMirrorMaintenanceOperator)
    t2 = task_of(dag, "cleanup__t2", DeltaMirrorMaintenanceOperator)
    assert (t1.cleanup_dry_run, t1.log_retention_seconds) == (False, 2 * 86400)
    assert (t2.cleanup_dry_run, t2.log_retention_seconds) == (True, None)
    assert dag.schedule == timedelta(hours=12)
