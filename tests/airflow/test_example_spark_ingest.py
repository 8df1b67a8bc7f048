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


def test_the_ingest_operator_renders_its_template_fields() -> None:
    from airflow.sdk import DAG

    from delta_mirror.airflow.operators.spark import DeltaMirrorSparkIngestOperator, as_dict, as_list

    with DAG("templates"):
        op = DeltaMirrorSparkIngestOperator(
            task_id="ingest",
            table="{{ params.table }}",
            source="{{ params.source }}",
            source_format="{{ params.format }}",
            location="{{ params.location }}",
            partition_by="{{ params.partition_by | join(',') }}",
            mode="{{ params.mode }}",
            schema="{{ params.schema }}",
            options="{{ params.options }}",
        )
    params = {
        "table": "events",
        "source": "/in/*.csv",
        "format": "json",
        "location": "/lake/events",
        "partition_by": ["country", "day"],
        "mode": "overwrite",
        "schema": None,
        "options": {"multiLine": "true"},
    }
    op.render_template_fields({"params": params})
    assert (op.table, op.source, op.source_format, op.location, op.mode) == (
        "events",
        "/in/*.csv",
        "json",
        "/lake/events",
        "overwrite",
    )
    assert as_list(op.partition_by) == ["country", "day"] and op.schema == "None"
    assert as_dict(op.options) == {"multiLine": "true"}
    assert as_list("") is None and as_list("['a']") == ["a"] and as_dict("") == {}
    assert set(op.template_fields) == {
        "table",
        "enabled",
        "store_conn_id",
        "aws_conn_id",
        "source",
        "source_format",
        "location",
        "partition_by",
        "mode",
        "schema",
        "options",
    }
