"""What every delta-mirror DAG shares: start date, tags, default task arguments, connection
arguments and the templates that hand the published range from ``publish`` to ``validate``.

Used by the generated DAGs (``dag_factory``) and the example DAGs (``examples``) alike.
"""

from __future__ import annotations

from datetime import UTC, datetime
from functools import cache
from typing import Any

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
]
