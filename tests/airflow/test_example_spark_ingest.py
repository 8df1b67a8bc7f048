"""The example pipeline DAG run end to end by Airflow (``dag.test()``): ingest → publish → validate.

Spark runs inside the task, in this process (the session is shared with the Spark tests when they
run in the same pytest session). The sample CSV of the repository goes in; afterwards Delta-Spark
and deltalake read exactly its rows from the published table.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from dm_airflow_kit import run_dag

from delta_mirror.jobs.validate import validate_table
from delta_mirror.store import SqlStore

pytestmark = pytest.mark.usefixtures("airflow_db")
DAG_ID = "delta_mirror_example_spark_ingest"


def test_the_example_dag_ingests_publishes_and_validates_the_sample(
    spark: Any, dm_config: Callable[..., Path], sqlite_store: str, tmp_path: Path
) -> None:
    from delta_mirror.airflow.examples import SAMPLE, SAMPLE_SCHEMA
    from delta_mirror.spark.ingest import read_source

    dm_config({})
    location = tmp_path / "events"
    conf = {"table": "events_example", "location": str(location), "reader": "spark"}

    run = run_dag(DAG_ID, conf)

    assert run.states() == {"ingest": "success", "publish": "success", "validate": "success"}
    ingested = run.xcom("ingest")
    assert (ingested["version"], ingested["created"], ingested["rows"]) == (0, True, 24)
    assert run.xcom("publish")["last_published"] == 0
    assert run.xcom("validate")["ok"] is True
    expected = sorted(read_source(spark, str(SAMPLE), "csv", schema=SAMPLE_SCHEMA).collect())
    columns = [f.name for f in read_source(spark, str(SAMPLE), "csv", schema=SAMPLE_SCHEMA).schema]
    published = spark.read.format("delta").load(str(location)).select(*columns)
    assert sorted(published.collect()) == expected
    from deltalake import DeltaTable

    dt = DeltaTable(location.as_uri())
    assert sorted(dt.to_pyarrow_table().column("event_id").to_pylist()) == list(range(1, 25))

    # Another run appends the source again, as version 1 (each run is its own txn version).
    again = run_dag(DAG_ID, {**conf, "reader": "deltalake"})
    assert again.states() == {"ingest": "success", "publish": "success", "validate": "success"}
    assert again.xcom("ingest")["version"] == 1
    assert spark.read.format("delta").load(str(location)).count() == 48
    assert validate_table(SqlStore(sqlite_store), "events_example").ok
