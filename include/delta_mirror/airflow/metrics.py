"""Metrics through Airflow's stats (StatsD / OpenTelemetry, as configured in ``[metrics]``).

Each gauge is emitted with a ``table`` tag and, for plain StatsD (no tags), also under a name that
ends in the table name: ``delta_mirror.lag_seconds.<table>``.
"""

from __future__ import annotations

from airflow.sdk.observability.stats import Stats

from delta_mirror.health.status import TableStatus
from delta_mirror.store.states import CircuitState, TableState

PREFIX = "delta_mirror"


def _gauge(name: str, table: str, value: float) -> None:
    Stats.gauge(f"{PREFIX}.{name}", value, tags={"table": table})
    Stats.gauge(f"{PREFIX}.{name}.{table}", value)


def emit_table_metrics(status: TableStatus) -> None:
    """lag_seconds, versions_behind, failed and halted (0/1) for one table."""
    _gauge("lag_seconds", status.table, status.lag_seconds)
    _gauge("versions_behind", status.table, float(status.versions_behind))
    _gauge("failed_versions", status.table, float(status.failed + status.conflicts))
    _gauge("halted", status.table, 1.0 if status.state == TableState.HALTED else 0.0)
    _gauge("breaker_open", status.table, 0.0 if status.breaker == CircuitState.CLOSED else 1.0)


def emit_step_duration(step: str, table: str, seconds: float) -> None:
    """``delta_mirror.<step>_seconds`` (publish, checkpoint, validate, maintenance): a timing in ms."""
    ms = seconds * 1000.0
    Stats.timing(f"{PREFIX}.{step}_seconds", ms, tags={"table": table})
    Stats.timing(f"{PREFIX}.{step}_seconds.{table}", ms)


def emit_step_failure(step: str, table: str, error_class: str) -> None:
    """``delta_mirror.failures``: a counter per table, step and error class (TRANSIENT, CONFLICT...)."""
    Stats.incr(f"{PREFIX}.failures", tags={"table": table, "step": step, "error_class": error_class})
    Stats.incr(f"{PREFIX}.failures.{table}.{error_class}")


__all__ = ["PREFIX", "emit_step_duration", "emit_step_failure", "emit_table_metrics"]
