"""Metrics through Airflow's stats (StatsD / OpenTelemetry, as configured in ``[metrics]``).

Each gauge is emitted with a ``table`` tag and, for plain StatsD (no tags), also under a name that
ends in the table name: ``delta_mirror.lag_seconds.<table>``.

Latency is per version, from the store's commit and publish times: each run's published versions
as ``delta_mirror.version_latency_seconds`` timings (one per version: the StatsD histogram), and
the monitor's ``delta_mirror.version_latency_<p50|p95|p99>_seconds`` gauges per window (1h, 24h,
7d). ``failing`` is 1 while the table's publish attempts fail (``publish_failed_attempts``: how many
in a row).
"""

from __future__ import annotations

from collections.abc import Sequence

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
    _gauge("failing", status.table, 0.0 if status.failure is None else 1.0)
    _gauge(
        "publish_failed_attempts", status.table, float(status.failure["attempts"] if status.failure else 0)
    )
    for window, stats in (status.latency or {}).items():
        if stats is None:
            continue  # no version committed and published in the window: nothing to say
        for q in ("p50", "p95", "p99"):
            name = f"version_latency_{q}_seconds"
            Stats.gauge(f"{PREFIX}.{name}", float(stats[q]), tags={"table": status.table, "window": window})
            Stats.gauge(f"{PREFIX}.{name}.{window}.{status.table}", float(stats[q]))


def emit_version_latencies(table: str, latencies: Sequence[tuple[int, float]]) -> None:
    """One ``delta_mirror.version_latency_seconds`` timing (ms) per published version."""
    for _version, seconds in latencies:
        ms = seconds * 1000.0
        Stats.timing(f"{PREFIX}.version_latency_seconds", ms, tags={"table": table})
        Stats.timing(f"{PREFIX}.version_latency_seconds.{table}", ms)


def emit_step_duration(step: str, table: str, seconds: float) -> None:
    """``delta_mirror.<step>_seconds`` (publish, checkpoint, validate, maintenance): a timing in ms."""
    ms = seconds * 1000.0
    Stats.timing(f"{PREFIX}.{step}_seconds", ms, tags={"table": table})
    Stats.timing(f"{PREFIX}.{step}_seconds.{table}", ms)


def emit_step_failure(step: str, table: str, error_class: str) -> None:
    """``delta_mirror.failures``: a counter per table, step and error class (TRANSIENT, CONFLICT...)."""
    Stats.incr(f"{PREFIX}.failures", tags={"table": table, "step": step, "error_class": error_class})
    Stats.incr(f"{PREFIX}.failures.{table}.{error_class}")


__all__ = [
    "PREFIX",
    "emit_step_duration",
    "emit_step_failure",
    "emit_table_metrics",
    "emit_version_latencies",
]
