"""Airflow glue: hooks, operators, triggers and notifications over the core library.

Everything here is a thin shell: operators call one core service and translate its errors in one
place (``errors.py``). The core (``delta_mirror`` outside this package) never imports Airflow.

The public names below load on first use: ``DeltaMirrorSparkCheckpointOperator`` needs the
optional apache-spark provider, and a DAG that uses none of them should not import them.
"""

from __future__ import annotations

import importlib
from typing import Any

from delta_mirror.extras import require

require("airflow", "airflow", "the Airflow glue (delta_mirror.airflow)")

_MODULES = {
    "DeltaMirrorBaseOperator": "operators",
    "DeltaMirrorCheckpointOperator": "operators",
    "DeltaMirrorHook": "hooks",
    "DeltaMirrorHookMixin": "mixins",
    "DeltaMirrorFleetValidateOperator": "operators",
    "DeltaMirrorLagOperator": "operators",
    "DeltaMirrorMaintenanceOperator": "operators",
    "DeltaMirrorPublishOperator": "operators",
    "DeltaMirrorReconcileOperator": "operators",
    "DeltaMirrorSparkCheckpointOperator": "operators.spark_submit",
    "DeltaMirrorSparkIngestOperator": "operators",
    "DeltaMirrorSparkPipelineOperator": "operators",
    "DeltaMirrorSyncOperator": "operators",
    "DeltaMirrorTableOperator": "operators",
    "DeltaMirrorValidateOperator": "operators",
    "StoreCommitTrigger": "triggers",
    "dags_from_config": "dag_file",
}


def __getattr__(name: str) -> Any:
    if name not in _MODULES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_MODULES[name]}"), name)


__all__ = sorted(_MODULES)
