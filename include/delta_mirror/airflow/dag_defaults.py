"""What every delta-mirror DAG shares: start date, tags, default task arguments, connection
arguments and the templates that hand the published range from ``publish`` to ``validate``.

Used by the generated DAGs (``dag_factory``) and the example DAGs (``examples``) alike.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from functools import cache
from typing import Any

from airflow.sdk import DAG

from delta_mirror.airflow.notifications import task_failure_callback
from delta_mirror.table_config import TableConfig

START = datetime(2026, 1, 1, tzinfo=UTC)
BASE_TAGS = ["delta-mirror"]
STEPS = ["publish", "checkpoint", "validate"]
# Validate what this run published; when nothing new was published, just the latest version.
JUST_PUBLISHED_FROM = (
    "{% set r = ti.xcom_pull(task_ids='publish') or {} %}"
    "{{ r.get('first') if r.get('first') is not none else r.get('last_published') }}"
)
JUST_PUBLISHED_TO = "{{ (ti.xcom_pull(task_ids='publish') or {}).get('last_published') }}"


def default_args(cfg: TableConfig) -> dict[str, Any]:
    """Owner, retries and the failure notification of ``cfg`` as a DAG's ``default_args``."""
    args: dict[str, Any] = {
        "owner": cfg.owner,
        "retries": cfg.retries,
        "retry_delay": cfg.retry_delay,
        "max_retry_delay": cfg.max_retry_delay,
        "on_failure_callback": task_failure_callback(cfg.notify, cfg.name),
    }
    if cfg.retry_exponential_backoff:
        args["retry_exponential_backoff"] = cfg.retry_exponential_backoff
    # fleet knobs: a pool bounds how many delta-mirror tasks run at once across the tables, the
    # weight orders them when its slots are short
    if cfg.pool:
        args["pool"] = cfg.pool
    if cfg.priority_weight != 1:
        args["priority_weight"] = cfg.priority_weight
    return args


@cache
def airflow_dag_settings() -> dict[str, Any]:
    """Airflow's per-DAG defaults (``[core] max_active_tasks_per_dag``, ...), read once.

    A ``DAG`` reads each setting it is not given from Airflow's config, three lookups per DAG: a
    quarter of building a thousand table DAGs. ``build_dags`` clears the cache at each parse.
    """
    from airflow.sdk.configuration import conf

    return {
        "max_active_tasks": conf.getint("core", "max_active_tasks_per_dag"),
        "max_consecutive_failed_dag_runs": conf.getint("core", "max_consecutive_failed_dag_runs_per_dag"),
        "disable_bundle_versioning": conf.getboolean("dag_processor", "disable_bundle_versioning"),
    }


def fleet_dag(
    dag_id: str,
    defaults: TableConfig,
    *,
    tags: Sequence[str],
    doc_md: str,
    schedule: Any = None,
    max_active_runs: int | None = 1,
    **dag_args: Any,
) -> DAG:
    """A DAG beside the tables' own (reconcile, backfill, monitor, maintenance, the examples): no
    catch-up, the config defaults' owner, retries and failure notification, one run at a time
    (``max_active_runs=None``: Airflow's default); ``schedule`` None: manual runs only."""
    if max_active_runs is not None:
        dag_args["max_active_runs"] = max_active_runs
    return DAG(
        dag_id=dag_id,
        schedule=schedule,
        start_date=START,
        catchup=False,
        default_args=default_args(defaults),
        tags=[*BASE_TAGS, *tags],
        doc_md=doc_md,
        **dag_args,
    )


def numbered(task_id: str, index: int) -> str:
    """``task_id`` for the first of a DAG's tasks of one kind, ``task_id_2``, ``_3``... for the next."""
    return task_id if index == 0 else f"{task_id}_{index + 1}"


def conn_args(cfg: TableConfig) -> dict[str, Any]:
    """The connection arguments every delta-mirror operator takes."""
    return {"store_conn_id": cfg.store_conn_id, "aws_conn_id": cfg.aws_conn_id}


__all__ = [
    "BASE_TAGS",
    "JUST_PUBLISHED_FROM",
    "JUST_PUBLISHED_TO",
    "START",
    "STEPS",
    "airflow_dag_settings",
    "conn_args",
    "default_args",
    "fleet_dag",
    "numbered",
]
