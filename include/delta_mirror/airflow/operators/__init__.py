"""Custom operators: each ``execute()`` calls one core service; errors are translated in one place.

All take ``store_conn_id`` (a Postgres connection; default: ``DELTA_MIRROR_STORE`` or the embedded
SQLite store) and ``aws_conn_id`` (S3 credentials and endpoint; default: the AWS environment),
through ``DeltaMirrorHookMixin``. By topic: ``table_steps`` (publish, checkpoint, validate,
maintenance), ``sync`` (the four steps of a run in one task), ``fleet`` (reconcile, lag, fleet
validation), ``spark`` (ingest, Delta-Spark job), ``spark_submit`` (the Spark checkpoint step; it
needs the apache-spark provider, so it is imported only where a table's engine is ``spark``).
"""

from __future__ import annotations

from delta_mirror.airflow.operators.base import DeltaMirrorBaseOperator, DeltaMirrorTableOperator
from delta_mirror.airflow.operators.fleet import (
    DeltaMirrorFleetValidateOperator,
    DeltaMirrorLagOperator,
    DeltaMirrorReconcileOperator,
)
from delta_mirror.airflow.operators.spark import (
    DeltaMirrorSparkIngestOperator,
    DeltaMirrorSparkPipelineOperator,
)
from delta_mirror.airflow.operators.sync import DeltaMirrorSyncOperator
from delta_mirror.airflow.operators.table_steps import (
    DeltaMirrorCheckpointOperator,
    DeltaMirrorMaintenanceOperator,
    DeltaMirrorPublishOperator,
    DeltaMirrorValidateOperator,
)

__all__ = [
    "DeltaMirrorBaseOperator",
    "DeltaMirrorCheckpointOperator",
    "DeltaMirrorFleetValidateOperator",
    "DeltaMirrorLagOperator",
    "DeltaMirrorMaintenanceOperator",
    "DeltaMirrorPublishOperator",
    "DeltaMirrorReconcileOperator",
    "DeltaMirrorSparkIngestOperator",
    "DeltaMirrorSparkPipelineOperator",
    "DeltaMirrorSyncOperator",
    "DeltaMirrorTableOperator",
    "DeltaMirrorValidateOperator",
]
