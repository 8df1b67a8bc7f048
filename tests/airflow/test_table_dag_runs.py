"""The table DAG ``delta_mirror__<table>`` run end to end by Airflow (``dag.test()``).

(a) the embedded default: SQLite store, local folder, no connections;
(b) PostgreSQL through a Postgres connection (``store_conn_id``) and the S3 server through an AWS
    connection with an ``endpoint_url`` extra (``aws_conn_id``), both defined by ``AIRFLOW_CONN_*``
    variables, with no ``AWS_*`` variables in the environment.

Afterwards deltalake reads the published table and ``validate_table`` finds nothing.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pytest
from dm_airflow_kit import S3Writer, make_table, read_rows, run_dag
from support.services import S3Server

from delta_mirror.jobs.validate import validate_table
from delta_mirror.store import SqlStore

pytestmark = pytest.mark.usefixtures("airflow_db")

TASKS = ["publish", "checkpoint", "validate", "metrics"]


def _rendered(dag_id: str, task_id: str) -> dict[str, object]:
    """The template fields Airflow rendered for the latest run of a task (RenderedTaskInstanceFields)."""
    from airflow.models.renderedtifields import RenderedTaskInstanceFields as RTIF
    from airflow.utils.session import create_session

    with create_session() as session:
        row = (
            session.query(RTIF).filter_by(dag_id=dag_id, task_id=task_id).order_by(RTIF.run_id.desc()).first()
        )
        assert row is not None
        return dict(row.rendered_fields)


def test_the_table_dag_publishes_checkpoints_and_validates_on_the_embedded_default(
    dm_config: Callable[..., Path], sqlite_store: str, local_location: Path
) -> None:
    store = SqlStore(sqlite_store)
    expected = make_table(store, "t1", local_location.as_uri(), versions=4, checkpoint_interval=3)
    dm_config({"t1": {"tags": ["e2e"]}})

    run = run_dag("delta_mirror__t1")

    assert run.state == "success", run.states()
    assert run.states() == {t: "success" for t in TASKS}
    published = run.xcom("publish")
    assert published["published"] == 4 and published["first"] == 0 and published["last_published"] == 3
    assert published["checkpoints"] == [3]
    # validate got the versions this run published, through templates rendered from the publish XCom
    assert _rendered("delta_mirror__t1", "validate")["from_version"] == "0"
    assert _rendered("delta_mirror__t1", "validate")["to_version"] == "3"
    assert run.xcom("validate")["ok"] is True
    assert run.xcom("metrics")[0]["versions_behind"] == 0

    log = local_location / "_delta_log"
    assert (log / "00000000000000000003.checkpoint.parquet").is_file()
    assert json.loads((log / "_last_checkpoint").read_text())["version"] == 3
    assert read_rows(local_location.as_uri()) == (3, expected)
    assert validate_table(store, "t1").ok

    # A second run finds nothing new: it still succeeds and validates the latest version.
    again = run_dag("delta_mirror__t1")
    assert again.states() == {t: "success" for t in TASKS}
    assert again.xcom("publish")["published"] == 0
    assert again.xcom("validate")["from_version"] == 3


@pytest.mark.postgres
@pytest.mark.s3
def test_the_table_dag_runs_on_postgres_and_s3_through_airflow_connections(
    dm_config: Callable[..., Path], pg_store_url: str, s3: S3Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sqlalchemy.engine import make_url

    bucket = s3.make_bucket()
    location = f"s3://{bucket}/sales"
    store = SqlStore(pg_store_url)
    store.init()
    expected = make_table(
        store,
        "sales_pg",
        location,
        versions=5,
        checkpoint_interval=2,
        s3=S3Writer(s3.client(), bucket, "sales"),
    )
    pg = make_url(pg_store_url)
    monkeypatch.setenv(
        "AIRFLOW_CONN_DM_STORE",
        f"postgres://{pg.username}:ignored-by-trust-auth@{pg.host}:{pg.port}/{pg.database}",
    )
    monkeypatch.setenv(
        "AIRFLOW_CONN_DM_S3",
        json.dumps(
            {
                "conn_type": "aws",
                "login": s3.access_key,
                "password": s3.secret_key,
                "extra": {"endpoint_url": s3.endpoint, "region_name": s3.region},
            }
        ),
    )
    # a name of its own: its asset (x-delta-mirror://dm_store/…) must not share a name with the
    # x-delta-mirror://default/sales asset other tests leave active in this session's Airflow DB
    # (Airflow keeps an asset inactive while another of its name is active; its scheduler, which
    # dag.test() runs without, would orphan the old one)
    dm_config({"sales_pg": {"store_conn_id": "dm_store", "aws_conn_id": "dm_s3"}})

    run = run_dag("delta_mirror__sales_pg")

    assert run.states() == {t: "success" for t in TASKS}
    assert run.xcom("publish")["last_published"] == 4
    assert run.xcom("publish")["checkpoints"] == [4]
    options = {
        "AWS_ENDPOINT_URL": s3.endpoint,
        "AWS_ACCESS_KEY_ID": s3.access_key,
        "AWS_SECRET_ACCESS_KEY": s3.secret_key,
        "AWS_REGION": s3.region,
        "AWS_ALLOW_HTTP": "true",
    }
    keys = {
        o["Key"] for o in s3.client().list_objects_v2(Bucket=bucket, Prefix="sales/_delta_log/")["Contents"]
    }
    assert "sales/_delta_log/00000000000000000004.checkpoint.parquet" in keys
    assert "sales/_delta_log/_last_checkpoint" in keys
    assert read_rows(location, options) == (4, expected)
    assert validate_table(store, "sales_pg", storage_options=options).ok
    store.close()


def test_an_event_table_runs_one_sync_task_that_publishes_validates_and_records_the_lag(
    dm_config: Callable[..., Path], sqlite_store: str, local_location: Path
) -> None:
    """``schedule: event``, ``publish_in: task``, ``tasks`` unset: the run is one ``sync`` task (one task start-up per
    commit batch). It publishes the new commit; validation waits for its cadence (10 min)."""
    from delta_mirror.dev.datafiles import write_data_file
    from delta_mirror.jobs.sync import sync_table

    store = SqlStore(sqlite_store)
    make_table(store, "ev", local_location.as_uri(), versions=2, checkpoint_interval=3)
    dm_config({"ev": {"schedule": "event", "poll_interval": "1s", "publish_in": "task"}})
    sync_table(store, "ev")  # an earlier run: versions 0..1 published and validated, one lag sample

    store.commit("ev", [("add", write_data_file(local_location, pa.table({"id": [9], "city": ["Oslo"]})))])
    run = run_dag("delta_mirror__ev")
    assert run.states() == {"sync": "success"}
    summary = run.xcom("sync")
    assert (summary["published"], summary["first"], summary["checkpoints"]) == (1, 2, [])
    assert summary["validation"]["state"] == "not due" and summary["lag"]["versions_behind"] == 0
    info = store.get_table("ev")
    assert (info.settings["last_validation"]["to_version"], info.settings["last_validation"]["ok"]) == (
        1,
        True,
    )
    assert len(store.lag_samples(info.id)) == 2
    assert read_rows(local_location.as_uri())[0] == 2


def test_a_validation_problem_fails_the_sync_task_without_retry(
    sqlite_store: str, local_location: Path
) -> None:
    from airflow.sdk.exceptions import AirflowFailException

    from delta_mirror.airflow.operators import DeltaMirrorSyncOperator

    store = SqlStore(sqlite_store)
    make_table(store, "ev", local_location.as_uri(), versions=2)
    op = DeltaMirrorSyncOperator(task_id="sync", table="ev", validate_every=3600)
    assert op.execute({})["validation"]["ok"] is True
    (local_location / "_delta_log" / "00000000000000000001.json").write_text("{}\n")  # replaced by someone
    info = store.get_table("ev")
    store.update_table(info.id, settings={**info.settings, "last_validation": {"to_version": 0, "ok": True}})
    with pytest.raises(
        AirflowFailException, match=r"validation found \d+ problem\(s\): \[hash_mismatch\] v1"
    ):
        op.execute({})
