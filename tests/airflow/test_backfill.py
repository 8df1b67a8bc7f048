"""The backfill DAG: a ``Param`` form (table, version range, steps) and checks the schema cannot express.

Bad input is refused with one clear message: by the ``Param`` JSON schema when the run is created
(unknown table, negative version, unknown step), or by ``check_params`` (``from_version`` after
``to_version``), which fails the run before any step runs.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from dm_airflow_kit import make_table, read_rows, run_dag

from delta_mirror.store import SqlStore

TABLES = ["orders", "t1"]


def check(**params: object) -> dict[str, object]:
    from delta_mirror.airflow.backfill import check_backfill_params

    return check_backfill_params({"steps": ["publish", "checkpoint", "validate"], **params}, TABLES)


def test_good_backfill_input_is_normalised() -> None:
    assert check(table="t1", from_version=2, to_version=5) == {
        "table": "t1",
        "from_version": 2,
        "to_version": 5,
        "steps": ["publish", "checkpoint", "validate"],
    }
    assert check(table="t1", from_version=None, to_version=None, steps=["validate"])["steps"] == ["validate"]
    assert check(table="t1", from_version=3, to_version=3)["from_version"] == 3


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"table": "nope"}, "table 'nope' is not configured (choose one of: orders, t1)"),
        ({"table": None}, "table None is not configured"),
        ({"table": "t1", "from_version": 5, "to_version": 2}, "from_version 5 is after to_version 2"),
        ({"table": "t1", "to_version": -1}, "to_version must be a non-negative integer, got -1"),
        ({"table": "t1", "from_version": "3"}, "from_version must be a non-negative integer, got '3'"),
        ({"table": "t1", "from_version": True}, "from_version must be a non-negative integer, got True"),
        ({"table": "t1", "steps": []}, "steps must be a non-empty subset"),
        ({"table": "t1", "steps": ["publish", "vacuum"]}, "steps must be a non-empty subset"),
    ],
)
def test_bad_backfill_input_fails_without_retry_and_says_what_is_wrong(
    params: dict[str, object], message: str
) -> None:
    from airflow.sdk.exceptions import AirflowFailException

    with pytest.raises(AirflowFailException) as exc:
        check(**params)
    assert str(exc.value).startswith("invalid backfill input: ")
    assert message in str(exc.value)


@pytest.fixture
def backfill_table(dm_config: Callable[..., Path], sqlite_store: str, local_location: Path) -> SqlStore:
    store = SqlStore(sqlite_store)
    make_table(store, "t1", local_location.as_uri(), versions=4, checkpoint_interval=100)
    dm_config({"t1": {}, "orders": {}})
    return store


@pytest.mark.usefixtures("airflow_db")
@pytest.mark.parametrize(
    ("conf", "message"),
    [
        ({"table": "nope"}, "Invalid input for param table: 'nope' is not one of ['orders', 't1']"),
        (
            {"table": "t1", "to_version": -1},
            "Invalid input for param to_version: -1 is less than the minimum of 0",
        ),
        ({"table": "t1", "steps": ["vacuum"]}, "Invalid input for param steps: 'vacuum' is not one of"),
    ],
    ids=["unknown-table", "negative-version", "unknown-step"],
)
def test_triggering_the_backfill_with_input_the_form_forbids_is_rejected(
    backfill_table: SqlStore, conf: dict[str, object], message: str
) -> None:
    from airflow.sdk.exceptions import ParamValidationError

    with pytest.raises(ParamValidationError) as exc:
        run_dag("delta_mirror_backfill", conf)
    assert message in str(exc.value)
    assert backfill_table.last_published_version(backfill_table.get_table("t1").id) is None


@pytest.mark.usefixtures("airflow_db")
def test_triggering_the_backfill_with_from_after_to_fails_before_any_step(
    backfill_table: SqlStore, capfd: pytest.CaptureFixture[str]
) -> None:
    run = run_dag("delta_mirror_backfill", {"table": "t1", "from_version": 3, "to_version": 1})

    assert run.state == "failed"
    assert run.tasks["check_params"].state == "failed" and run.tasks["check_params"].try_number == 1
    assert {run.tasks[t].state for t in ("publish", "checkpoint", "validate")} == {"upstream_failed"}
    assert "from_version 3 is after to_version 1 for table 't1'; swap them" in capfd.readouterr().out
    assert backfill_table.last_published_version(backfill_table.get_table("t1").id) is None


@pytest.mark.usefixtures("airflow_db")
def test_a_backfill_runs_only_the_chosen_steps_over_the_chosen_range(
    backfill_table: SqlStore, local_location: Path
) -> None:
    run = run_dag(
        "delta_mirror_backfill",
        {"table": "t1", "from_version": 0, "to_version": 2, "steps": ["publish", "validate"]},
    )

    assert run.states() == {
        "check_params": "success",
        "publish": "success",
        "checkpoint": "skipped",
        "validate": "success",
    }
    assert run.xcom("publish")["last_published"] == 2
    assert (run.xcom("validate")["from_version"], run.xcom("validate")["to_version"]) == (0, 2)
    assert read_rows(local_location.as_uri())[0] == 2
    assert not list((local_location / "_delta_log").glob("*.checkpoint.parquet"))

    run = run_dag("delta_mirror_backfill", {"table": "t1", "to_version": 2, "steps": ["checkpoint"]})
    assert run.tasks["checkpoint"].state == "success" and run.xcom("checkpoint") == 2
    assert (local_location / "_delta_log" / "00000000000000000002.checkpoint.parquet").is_file()


def test_a_backfill_uses_the_connections_of_the_table_it_is_given(dm_config: Callable[..., Path]) -> None:
    from airflow.dag_processing.dagbag import DagBag
    from dm_airflow_kit import DAGS_FOLDER, task_of

    from delta_mirror.airflow.operators import DeltaMirrorTableOperator

    dm_config({"a": {"aws_conn_id": "bucket_a"}, "b": {}}, store_conn_id="main")
    for table, aws_conn_id in (("a", "bucket_a"), ("b", None)):
        for task_id in ("publish", "checkpoint", "validate"):
            dag = DagBag(dag_folder=str(DAGS_FOLDER)).dags["delta_mirror_backfill"]
            task = task_of(dag, task_id, DeltaMirrorTableOperator)
            params = {"table": table, "from_version": None, "to_version": None, "steps": ["publish"]}
            task.render_template_fields({"params": params})
            assert (task.hook.store_conn_id, task.hook.aws_conn_id) == ("main", aws_conn_id), (table, task_id)
