"""Validation batched over the fleet: one process validates every table whose cadence says due.

Tables published from the watcher (``publish_in: triggerer``) have no per-commit run whose ``sync``
task could validate them. Here one task (the monitor DAG's ``validate``) asks ``plan_validation``
for each table, exactly as ``sync`` does after publishing, validates the versions published since
the last recorded validation and records the result (``record_validation``): a failed validation
is due again at once over its range and the new versions, so a retry cannot hide a problem.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from delta_mirror.errors import first_line
from delta_mirror.health.monitoring import record_validation
from delta_mirror.jobs.publisher import PublishResult
from delta_mirror.jobs.sync import ValidationPlan, plan_validation
from delta_mirror.jobs.validate.report import ValidationReport
from delta_mirror.storage import ObjectStore
from delta_mirror.store.sql_store import SqlStore


@dataclass(frozen=True)
class TableValidation:
    """One table's cadence: how often (None: never) and with which reader."""

    every: timedelta | None
    reader: str = "deltalake"


@dataclass
class FleetValidation:
    """A table's outcome: its plan, the report when it was due, or why it could not be validated."""

    table: str
    plan: ValidationPlan
    report: ValidationReport | None = None
    error: str | None = None

    @property
    def failed(self) -> bool:
        return self.error is not None or (self.report is not None and not self.report.ok)

    def line(self) -> str:
        """One line for the task log and the failure message."""
        if self.error is not None:
            return f"{self.table}: could not validate: {self.error}"
        report = self.report
        if report is None:
            return f"{self.table}: {self.plan.state}"
        span = f"versions {report.from_version}..{report.to_version}"
        if report.ok:
            return f"{self.table}: {span} ok ({report.versions_checked} checked)"
        first = report.problems[0]
        return (
            f"{self.table}: {span}: {len(report.problems)} problem(s), first [{first.kind}] "
            f"v{first.version}: {first.message}"
        )

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"table": self.table, "state": self.plan.state, "failed": self.failed}
        if self.report is not None:
            out.update(
                from_version=self.report.from_version,
                to_version=self.report.to_version,
                ok=self.report.ok,
                problems=len(self.report.problems),
            )
        if self.error is not None:
            out["error"] = self.error
        return out


def validate_due_tables(
    store: SqlStore,
    tables: Mapping[str, TableValidation],
    *,
    storage_options: Mapping[str, str] | None = None,
    open_location: Callable[[str], ObjectStore] | None = None,
    now: int | None = None,
) -> list[FleetValidation]:
    """Validate each table whose plan says due (tables not in the store yet are skipped); a table's
    failure (a problem found, or the validation raising) does not stop the others."""
    from delta_mirror.jobs.validate import validate_table

    known = {t.name: t for t in store.list_tables()}
    out: list[FleetValidation] = []
    for name in sorted(tables):
        table = known.get(name)
        if table is None:
            continue
        cadence = tables[name]
        last = store.last_published_version(table.id)
        plan = plan_validation(table, PublishResult(name, last_published=last), cadence.every, now)
        if plan.state != "due":
            out.append(FleetValidation(name, plan))
            continue
        try:
            report = validate_table(
                store,
                name,
                from_version=plan.from_version,
                to_version=plan.to_version,
                reader=cadence.reader,
                open_location=open_location,
                storage_options=storage_options,
            )
        except Exception as exc:  # one table's trouble is reported with the others', not raised
            out.append(FleetValidation(name, plan, error=first_line(exc)))
            continue
        record_validation(store, name, {**report.to_json(), "reader": cadence.reader})
        out.append(FleetValidation(name, plan, report))
    return out


def failures(results: Iterable[FleetValidation]) -> list[str]:
    """One line per failed table (empty: every due validation passed)."""
    return [r.line() for r in results if r.failed]


__all__ = ["FleetValidation", "TableValidation", "failures", "validate_due_tables"]
