"""Example pipeline DAGs (manual, from the ``Param`` form).

- ``delta_mirror_example_spark_pipeline``: an ordinary Delta-Spark job (create, append, MERGE,
  DELETE, OPTIMIZE) whose commits go through the commit service into the store → publish →
  validate with deltalake and with Delta-Spark. Needs a running ``delta-mirror serve``.
- ``delta_mirror_example_spark_ingest``: PySpark ingest → publish → validate (the no-JVM-LogStore
  path: our ingest function commits through the store itself).
- ``delta_mirror_example_table_consumer``: a downstream DAG scheduled on the tables' assets
  (``airflow.assets``): each run reads which versions became readable from its triggering events
  and reads each table at its last one (docs/assets.md).

The Spark examples are manual (no schedule); the ``Param`` form picks the table, the source files and how to read them.
The defaults ingest the sample ``examples/events.csv`` of the repository into
``$DELTA_MIRROR_HOME/tables/events_example``, partitioned by ``country``. Owner, retries and failure
notifications come from the config's ``defaults``, like every other delta-mirror DAG.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from airflow.sdk import DAG, AssetAny, Param, task

from delta_mirror.airflow.assets import table_assets
from delta_mirror.airflow.dag_defaults import JUST_PUBLISHED_FROM, JUST_PUBLISHED_TO, conn_args, fleet_dag
from delta_mirror.airflow.operators import (
    DeltaMirrorPublishOperator,
    DeltaMirrorSparkIngestOperator,
    DeltaMirrorSparkPipelineOperator,
    DeltaMirrorValidateOperator,
)
from delta_mirror.config import home
from delta_mirror.table_config import MirrorConfig

DAG_ID = "delta_mirror_example_spark_ingest"
PIPELINE_DAG_ID = "delta_mirror_example_spark_pipeline"
CONSUMER_DAG_ID = "delta_mirror_example_table_consumer"
SAMPLE = Path(__file__).resolve().parents[3] / "examples" / "events.csv"
SAMPLE_SCHEMA = "event_id BIGINT, user STRING, country STRING, ts TIMESTAMP, amount DECIMAL(12,2), day DATE"


def _table_and_source_params(table: str) -> dict[str, Param]:
    """The form fields both example DAGs share: the table, where it lives, its source files."""
    return {
        "table": Param(table, type="string", description="Table name in the store."),
        "source": Param(str(SAMPLE), type="string", description="Source file, folder or glob."),
        "format": Param("csv", type="string", enum=["csv", "parquet", "json"]),
        "schema": Param(
            SAMPLE_SCHEMA,
            type=["null", "string"],
            description="Source schema as DDL (null: inferred for CSV/JSON, Parquet's own).",
        ),
        "location": Param(
            str(home() / "tables" / table),
            type="string",
            description="Table root, used when the first run creates the table.",
        ),
    }


def _publish_then_validate(
    conn: dict[str, Any], readers: dict[str, str], from_version: str, to_version: str
) -> Any:
    """Both examples' tail: publish the form's table, then validate ``from_version..to_version``
    with each reader (task id → reader). Returns the publish task, for the job to precede."""
    publish = DeltaMirrorPublishOperator(task_id="publish", table="{{ params.table }}", **conn)
    publish >> [
        DeltaMirrorValidateOperator(
            task_id=task_id,
            table="{{ params.table }}",
            reader=reader,
            from_version=from_version,
            to_version=to_version,
            **conn,
        )
        for task_id, reader in readers.items()
    ]
    return publish


def spark_ingest_dag(config: MirrorConfig) -> DAG:
    conn = conn_args(config.defaults)
    with fleet_dag(
        DAG_ID,
        config.defaults,
        tags=["example", "spark"],
        params={
            **_table_and_source_params("events_example"),
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
        readers = {"validate": "{{ params.reader }}"}
        ingest >> _publish_then_validate(conn, readers, JUST_PUBLISHED_FROM, JUST_PUBLISHED_TO)
    return dag


# The versions the job committed (as the job reports them), for the validate steps.
_JOB_FROM = "{{ (ti.xcom_pull(task_ids='job') or {}).get('first_version') }}"
_JOB_TO = "{{ (ti.xcom_pull(task_ids='job') or {}).get('last_version') }}"


def spark_pipeline_dag(config: MirrorConfig) -> DAG:
    conn = conn_args(config.defaults)
    with fleet_dag(
        PIPELINE_DAG_ID,
        config.defaults,
        tags=["example", "spark"],
        params={
            **_table_and_source_params("events_pipeline"),
            "delete_where": Param("amount < 50", type="string", description="The DELETE step's predicate."),
            "commit_conn_id": Param(
                None,
                type=["null", "string"],
                description="HTTP connection to `delta-mirror serve` (token as password); "
                "null: DELTA_MIRROR_COMMIT_URL / DELTA_MIRROR_COMMIT_TOKEN.",
            ),
        },
        doc_md="Example data pipeline as an **ordinary Delta-Spark job**: `CREATE TABLE`, append, "
        "`MERGE` upsert, `DELETE`, `OPTIMIZE` — every commit goes through the delta-mirror LogStore to "
        "the commit service, which commits Spark's exact bytes into the SQL store (the authority); then "
        "**publish** (the commit files are already there: nothing to write, only checkpoints) and "
        "**validate** the job's versions with deltalake and with Delta-Spark. Needs a running "
        "`delta-mirror serve` (docs/writing-from-spark.md). A retried job does not append twice "
        "(`txnAppId`/`txnVersion`).",
    ) as dag:
        job = DeltaMirrorSparkPipelineOperator(
            task_id="job",
            table="{{ params.table }}",
            location="{{ params.location }}",
            source="{{ params.source }}",
            source_format="{{ params.format }}",
            schema="{{ params.schema }}",
            partition_by="country",
            delete_where="{{ params.delete_where }}",
            commit_conn_id="{{ params.commit_conn_id }}",
            **conn,
        )
        readers = {f"validate_{reader}": reader for reader in ("deltalake", "spark")}
        job >> _publish_then_validate(conn, readers, _JOB_FROM, _JOB_TO)
    return dag


def table_consumer_dag(config: MirrorConfig) -> DAG:
    tables = table_assets(config)
    with fleet_dag(
        CONSUMER_DAG_ID,
        config.defaults,
        tags=["example", "assets"],
        schedule=AssetAny(*tables.values()) if tables else None,
        doc_md="Example downstream DAG: scheduled on every configured table's **asset** (an event when "
        "a table's versions were published), it reads from its triggering asset events which versions "
        "of which table became readable and reads each table at the last of them. Airflow coalesces "
        "events: one run may cover several publishes, i.e. a version range per table. Starts paused "
        "like every DAG: unpause it to try it. A real consumer schedules on one table: "
        "`schedule=[table_asset('orders')]` (docs/assets.md).",
    ) as dag:

        @task(task_id="read_published_versions")
        def read_published_versions(triggering_asset_events: Any = None) -> dict[str, Any]:
            """Per table in this run's events: first..last version published (over all its
            events), the newest checkpoint among them, and the row count at the last version."""
            from deltalake import DeltaTable

            from delta_mirror.airflow.assets import published_range
            from delta_mirror.airflow.hooks import DeltaMirrorHook
            from delta_mirror.table_config import load_config

            cfg = load_config()
            out: dict[str, Any] = {}
            for asset in triggering_asset_events or {}:
                versions = published_range(triggering_asset_events, asset.name)
                if versions is None:
                    continue
                table = cfg.settings_for(asset.name)
                hook = DeltaMirrorHook(store_conn_id=table.store_conn_id, aws_conn_id=table.aws_conn_id)
                location = hook.store.get_table(asset.name).location
                delta = DeltaTable(
                    location, version=versions.last_version, storage_options=hook.storage_options or None
                )
                out[asset.name] = {**versions.to_json(), "rows": delta.to_pyarrow_dataset().count_rows()}
            return out

        read_published_versions()
    return dag


#: Every example DAG builder; a new example is one more entry here.
EXAMPLES: tuple[Callable[[MirrorConfig], DAG], ...] = (
    spark_ingest_dag,
    spark_pipeline_dag,
    table_consumer_dag,
)


def example_dags(config: MirrorConfig) -> list[Any]:
    return [build(config) for build in EXAMPLES]


__all__ = [
    "CONSUMER_DAG_ID",
    "DAG_ID",
    "EXAMPLES",
    "PIPELINE_DAG_ID",
    "example_dags",
    "spark_ingest_dag",
    "spark_pipeline_dag",
    "table_consumer_dag",
]
