"""Operators over many tables: reconcile (re-drive failed and stuck versions), lag metrics and
validation of the tables published in the triggerer."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from delta_mirror.airflow.errors import translated
from delta_mirror.airflow.mixins import template_fields_with
from delta_mirror.airflow.operators.base import DeltaMirrorBaseOperator


class DeltaMirrorReconcileOperator(DeltaMirrorBaseOperator):
    """Re-drive FAILED, stuck and lagging versions across tables; returns the report.

    :param tables: the tables to reconcile (one not in the store yet is skipped with a warning);
        None: every table in the store. Templated.
    :param strategy: ``incremental``, ``full`` or ``smart`` (``jobs.reconcile``). Templated.
    :param escalate_after_attempts: attempts after which a failing version is reported as
        persistent (the reconcile DAG emails it).
    """

    template_fields: Sequence[str] = template_fields_with("tables", "strategy")

    def __init__(
        self,
        *,
        tables: Sequence[str] | None = None,
        strategy: str = "incremental",
        escalate_after_attempts: int = 3,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.tables = list(tables) if tables else None
        self.strategy = strategy
        self.escalate_after_attempts = escalate_after_attempts

    @translated
    def execute(self, context: Any) -> dict[str, object]:
        from delta_mirror.jobs.reconcile import reconcile

        tables = self.tables
        if tables:
            # A table that is configured but not created yet must not stop the others' reconcile.
            known = {t.name for t in self.hook.store.list_tables()}
            for name in tables:
                if name not in known:
                    self.log.warning("%s is configured but not in the store yet: skipped", name)
            tables = [n for n in tables if n in known]
            if not tables:
                return {"strategy": self.strategy, "tables": []}
        report = reconcile(
            self.hook.store,
            tables,
            strategy=self.strategy,
            escalate_after_attempts=self.escalate_after_attempts,
            publisher=self.publisher(),
        )
        for t in report.tables:
            self.log.info(
                "%s: %s (%d re-driven)%s", t.table, t.action, t.published, f" — {t.error}" if t.error else ""
            )
        return report.to_json()


class DeltaMirrorLagOperator(DeltaMirrorBaseOperator):
    """Measure lag per table and emit it through Airflow's stats (StatsD / OpenTelemetry).

    :param tables: the tables to measure (one not in the store yet is skipped with a warning);
        None: every table in the store. Templated.
    :param lag_history_retention: seconds (or seconds per table) of lag samples to keep; None: 14 days.
    :param record_samples: store a lag sample per table (``dl_lag_samples``) as well as emitting it.
    """

    template_fields: Sequence[str] = template_fields_with("tables")

    def __init__(
        self,
        *,
        tables: Sequence[str] | None = None,
        lag_history_retention: dict[str, float] | float | None = None,
        record_samples: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.tables = list(tables) if tables else None
        self.lag_history_retention = lag_history_retention
        self.record_samples = record_samples

    def _retention(self, name: str) -> Any:
        from datetime import timedelta

        from delta_mirror.health.monitoring import DEFAULT_LAG_RETENTION

        value = self.lag_history_retention
        if isinstance(value, dict):
            value = value.get(name)
        return DEFAULT_LAG_RETENTION if value is None else timedelta(seconds=float(value))

    @translated
    def execute(self, context: Any) -> list[dict[str, object]]:
        from delta_mirror.airflow.metrics import emit_table_metrics
        from delta_mirror.health.monitoring import record_lag_samples
        from delta_mirror.health.status import fleet_status

        store = self.hook.store
        if self.tables:
            # A table that is configured but not created yet must not hide the others' lag.
            known = {t.name: t for t in store.list_tables()}
            for name in self.tables:
                if name not in known:
                    self.log.warning("%s is configured but not in the store yet: no lag to measure", name)
            tables = [known[n] for n in self.tables if n in known]
        else:
            tables = store.list_tables()
        # Every table's status from a constant number of queries, the samples in one insert.
        statuses = fleet_status(store, tables, latency=True)  # + the per-version latency percentiles
        if self.record_samples:
            record_lag_samples(store, tables, self._retention, statuses)
        out = []
        for status in statuses:
            emit_table_metrics(status)
            self.log.info(
                "%s: %d version(s) behind, lag %.1f s",
                status.table,
                status.versions_behind,
                status.lag_seconds,
            )
            out.append(status.to_json())
        return out


class DeltaMirrorFleetValidateOperator(DeltaMirrorBaseOperator):
    """Validate every table whose cadence says due, in one process (``jobs.fleet_validate``).

    A failed validation fails the task with one line per table (the DAG's failure notifications
    alert); the others are recorded.

    :param tables: name → ``{"every": seconds between validations or None, "reader": ...}``. Templated.
    """

    template_fields: Sequence[str] = template_fields_with("tables")

    def __init__(self, *, tables: dict[str, dict[str, Any]], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.tables = tables

    @translated
    def execute(self, context: Any) -> list[dict[str, Any]]:
        from datetime import timedelta

        from delta_mirror.errors import DataError
        from delta_mirror.jobs.fleet_validate import TableValidation, failures, validate_due_tables

        cadences = {
            name: TableValidation(
                None if spec.get("every") is None else timedelta(seconds=float(spec["every"])),
                str(spec.get("reader") or "deltalake"),
            )
            for name, spec in self.tables.items()
        }
        results = validate_due_tables(self.hook.store, cadences, storage_options=self.hook.storage_options)
        for result in results:
            self.log.info("%s", result.line())
        failed = failures(results)
        if failed:
            raise DataError(
                f"validation failed for {len(failed)} table(s):\n" + "\n".join(failed),
                hint="see docs/troubleshooting.md; `delta-mirror validate <table>` shows every problem",
            )
        return [r.to_json() for r in results]


__all__ = ["DeltaMirrorFleetValidateOperator", "DeltaMirrorLagOperator", "DeltaMirrorReconcileOperator"]
