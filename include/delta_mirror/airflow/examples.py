"""Example pipeline DAG: PySpark ingest → publish → validate (``delta_mirror_example_spark_ingest``).

Manual (no schedule); the ``Param`` form picks the table, the source files and how to read them.
The defaults ingest the sample ``examples/events.csv`` of the repository into
``$DELTA_MIRROR_HOME/tables/events_example``, partitioned by ``country``. Owner, retries and failure
notifications come from the config's ``defaults``, like every other delta-mirror DAG.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from airflow.sdk import DAG, Param

from delta_mirror.airflow.dag_defaults import (
    BASE_TAGS,
    JUST_PUBLISHED_FROM,
    JUST_PUBLISHED_TO,
    START,
    conn_args,
    default_args,
)
from delta_mirror.airflow.operators import (
    DeltaMirrorPublishOperator,
    DeltaMirrorSparkIngestOperator,
    DeltaMirrorValidateOperator,
)
from delta_mirror.config import home
from delta_mirror.table_config import MirrorConfig

DAG_ID = "delta_mirror_example_spark_ingest"
SAMPLE = Path(__file__).resolve().parents[3] / "examples" / "events.csv"
SAMPLE_SCHEMA = "event_id BIGINT, user STRING, country STRING, ts TIMESTAMP, amount DECIMAL(12,2), day DATE"


def spark_ingest_dag(config: MirrorConfig) -> DAG:
    defaults = config.defaults
    conn = conn_args(defaults)
    with DAG(
        dag_id=DAG_ID,
        schedule=None,
        start_date=START,
        catchup=False,
        max_active_runs=1,
        default_args=default_args(defaults),
        tags=[*BASE_TAGS, "example", "spark"],
        params={
            "table": Param("events_example", type="string", description="Table name in the store."),
            "source": Param(str(SAMPLE), type="string", description="Source file, folder or glob."),
            "format": Param("csv", type="string", enum=["csv", "parquet", "json"]),
            "schema": Param(
                SAMPLE_SCHEMA,
                type=["null", "string"],
                description="Source schema as DDL (null: inferred for CSV/JSON, Parquet's own).",
            ),
            "location": Param(
                str(home() / "tables" / "events_example"),
                type="string",
                description="Table root, used when the first ingest creates the table.",
            ),
            "partition_by": Param(
                ["country"], type="array", items={"type": "string"}, description="For a new table."
            ),
            "mode": Param("append", type="string", enum=["append", "overwrite"]),
            "reader": Param("deltalake", type="string", enum=["deltalake", "spark"]),
        },
        doc_md="Example data pipeline: **ingest** source files (CSV, Parquet, JSON) with PySpark — Parquet "
        "data files written into the table location, their add actions (paths, partition values, stats) "
        "committed through the SQL store as one version — then **publish** it to `_delta_log/` and "
        "**validate** the published versions with a reader (deltalake or Delta-Spark). Manual: trigger it "
        "from the form. A retried ingest task does not ingest twice (a `txn` per run).",
    ) as dag:
        ingest = DeltaMirrorSparkIngestOperator(
            task_id="ingest",
            table="{{ params.table }}",
            source="{{ params.source }}",
            source_format="{{ params.format }}",
            schema="{{ params.schema }}",
            location="{{ params.location }}",
            partition_by="{{ params.partition_by | join(',') }}",
            mode="{{ params.mode }}",
            **conn,
        )
        publish = DeltaMirrorPublishOperator(task_id="publish", table="{{ params.table }}", **conn)
        validate = DeltaMirrorValidateOperator(
            task_id="validate",
            table="{{ params.table }}",
            reader="{{ params.reader }}",
            from_version=JUST_PUBLISHED_FROM,
            to_version=JUST_PUBLISHED_TO,
            **conn,
        )
        ingest >> publish >> validate
    return dag


#: Every example DAG builder; a new example is one more entry here.
EXAMPLES: tuple[Callable[[MirrorConfig], DAG], ...] = (spark_ingest_dag,)


def example_dags(config: MirrorConfig) -> list[Any]:
    return [build(config) for build in EXAMPLES]


__all__ = ["DAG_ID", "EXAMPLES", "example_dags", "spark_ingest_dag"]
