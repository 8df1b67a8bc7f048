"""One table's whole per-commit work in one process: publish, checkpoint when due, validate on the
table's cadence, record the lag sample.

The event-driven DAG used to run four task processes per commit (publish → checkpoint → validate
→ metrics): the publish takes milliseconds, each task's start-up seconds, and the follow-up tasks
kept the run (and with ``max_active_runs=1`` the table's next commit) waiting for minutes. Here
the same pieces run back to back in the caller's process (the ``sync`` task, ``delta-mirror
sync``):

1. ``Publisher.publish`` publishes every pending version with the cadence's checkpoints (``local``
   in-process; ``auto`` / ``spark`` through the ``ConfiguredBuilder`` the caller passes, which
   starts Spark only when a checkpoint is due); ``Publisher.checkpoint_if_due`` then applies the same policy at the last
   published version. In a DAG on the ``spark`` engine the checkpoint is a separate spark-submit
   task (``checkpoint_here=False``) and nothing is checkpointed here.
2. Validation is batched on its own cadence (``validate_every``): when the last recorded
   validation (``health.monitoring.record_validation``) is older than the cadence, the versions
   published since it are validated together; a failed validation is due again at once (over its
   range and the new versions), so a retry cannot turn a problem into a success.
   Tables published in the triggerer (``publish_in: triggerer``) have no per-commit run: the
   monitor DAG validates them with the same plan (``jobs.fleet_validate``).
3. ``health.monitoring.record_lag_sample`` stores the table's lag, as the monitor's lag task does.

Problems are returned in the result, not raised: the caller decides (the operator fails the task,
the CLI exits 1).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from delta_mirror.delta.protocol import now_ms
from delta_mirror.health.monitoring import (
    DEFAULT_LAG_RETENTION,
    LagSample,
    record_lag_sample,
    record_validation,
)
from delta_mirror.health.status import TableStatus, table_status
from delta_mirror.jobs.publisher import CheckpointBuilder, Publisher, PublishResult
from delta_mirror.jobs.validate.report import ValidationReport
from delta_mirror.storage import ObjectStore
from delta_mirror.store.sql_store import SqlStore, TableInfo

DEFAULT_VALIDATE_EVERY = timedelta(minutes=10)


@dataclass
class ValidationPlan:
    """Whether this run validates, and which versions: ``state`` is ``due``, ``not due``,
    ``up to date`` (nothing published since the last validation) or ``off``."""

    state: str
    from_version: int | None = None
    to_version: int | None = None
    next_due_at: int | None = None  # epoch ms, when not due


@dataclass
class SyncResult:
    table: str
    publish: PublishResult
    checkpoint: int | None  # written after publishing by the cadence policy (None: not due)
    validation: ValidationPlan
    report: ValidationReport | None
    status: TableStatus
    lag: LagSample

    @property
    def checkpoints(self) -> list[int]:
        """Every checkpoint this run wrote: the cadence's during publishing, then the due one."""
        written = list(self.publish.checkpoints)
        if self.checkpoint is not None and self.checkpoint not in written:
            written.append(self.checkpoint)
        return written

    def to_json(self) -> dict[str, Any]:
        pub = self.publish
        validation: dict[str, Any] = {"state": self.validation.state}
        if self.report is not None:
            validation.update(
                from_version=self.report.from_version,
                to_version=self.report.to_version,
                versions_checked=self.report.versions_checked,
                ok=self.report.ok,
                problems=len(self.report.problems),
                limitations=len(self.report.limitations),
            )
        elif self.validation.next_due_at is not None:
            validation["next_due_at"] = self.validation.next_due_at
        return {
            "table": self.table,
            "published": len(pub.published),
            "first": pub.published[0] if pub.published else None,
            "last_published": pub.last_published,
            "latest_committed": pub.latest_committed,
            "checkpoints": self.checkpoints,
            "validation": validation,
            "lag": self.lag.to_json(),
        }


def last_validation(table: TableInfo) -> dict[str, Any] | None:
    """The table's latest recorded validation (``record_validation``), if any."""
    value = table.settings.get("last_validation")
    return value if isinstance(value, dict) else None


def plan_validation(
    table: TableInfo,
    published: PublishResult,
    every: timedelta | None,
    now: int | None = None,
) -> ValidationPlan:
    """Which versions this run validates (see the module docstring); ``every=None``: never."""
    last = published.last_published
    if every is None:
        return ValidationPlan("off")
    if last is None:
        return ValidationPlan("up to date")
    record = last_validation(table)
    if record is None or record.get("to_version") is None:
        # never validated: the versions this run published, else the latest one
        start = published.published[0] if published.published else last
    elif not record.get("ok", True):
        start = int(record.get("from_version") or record["to_version"])  # again, until it passes
    else:
        start = int(record["to_version"]) + 1
        due_at = int(record.get("at") or 0) + int(every.total_seconds() * 1000)
        if start > last:
            return ValidationPlan("up to date")
        if (now_ms() if now is None else now) < due_at:
            return ValidationPlan("not due", start, last, next_due_at=due_at)
    start = max(start, table.first_version)
    if start > last:
        return ValidationPlan("up to date")
    return ValidationPlan("due", start, last)


def _publisher(
    store: SqlStore,
    builder: CheckpointBuilder | None,
    here: bool,
    storage_options: Mapping[str, str] | None,
    open_location: Callable[[str], ObjectStore] | None,
) -> Publisher:
    """``builder`` None: in-process checkpoints; else the caller's (``ConfiguredBuilder`` for
    ``auto`` / ``spark``, which starts Spark only when one is due, as ``delta-mirror mirror``
    does); ``here=False``: none (a separate spark-submit step writes them)."""
    kwargs: dict[str, Any] = {"storage_options": storage_options, "cadence_checkpoints": here}
    if open_location is not None:
        kwargs["open_location"] = open_location
    if here and builder is not None:
        kwargs.update(checkpoint_builder=builder, lease_ttl=3600.0)
    return Publisher(store, **kwargs)


def sync_table(
    store: SqlStore,
    name: str,
    *,
    storage_options: Mapping[str, str] | None = None,
    checkpoint_builder: CheckpointBuilder | None = None,
    checkpoint_here: bool = True,
    validate_every: timedelta | None = DEFAULT_VALIDATE_EVERY,
    reader: str = "deltalake",
    lag_retention: timedelta | None = DEFAULT_LAG_RETENTION,
    open_location: Callable[[str], ObjectStore] | None = None,
) -> SyncResult:
    """Publish every pending version of ``name``, checkpoint when due, validate when the cadence
    says so, record the lag sample. ``checkpoint_builder``: who builds the checkpoints (None: the
    local engine, in process; the callers pass ``spark.checkpoint_engine.ConfiguredBuilder`` for
    ``auto`` / ``spark``: jobs sit below the Spark tier); ``checkpoint_here=False``: checkpoints are
    another step's (the DAG's spark-submit task)."""
    publisher = _publisher(store, checkpoint_builder, checkpoint_here, storage_options, open_location)
    published = publisher.publish(name)
    written = publisher.checkpoint_if_due(name) if checkpoint_here else None
    table = store.get_table(name)  # the settings as they are now (the last validation)
    plan = plan_validation(table, published, validate_every)
    report = None
    if plan.state == "due":
        from delta_mirror.jobs.validate import validate_table

        report = validate_table(
            store,
            name,
            from_version=plan.from_version,
            to_version=plan.to_version,
            reader=reader,
            open_location=open_location,
            storage_options=storage_options,
        )
        record_validation(store, name, {**report.to_json(), "reader": reader})
    status = table_status(store, table)
    lag = record_lag_sample(store, table, retention=lag_retention, status=status)
    return SyncResult(name, published, written, plan, report, status, lag)


__all__ = ["DEFAULT_VALIDATE_EVERY", "SyncResult", "ValidationPlan", "plan_validation", "sync_table"]
