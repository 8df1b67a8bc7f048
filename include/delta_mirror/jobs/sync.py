"""One table's whole per-commit work in one process: publish, checkpoint when due, validate on the
table's cadence, record the lag sample.

The event-driven DAG used to run four task processes per commit (publish → checkpoint → validate
→ metrics): the publish takes milliseconds, each task's start-up seconds, and the follow-up tasks
kept the run (and with ``max_active_runs=1`` the table's next commit) waiting for minutes. Here
the same pieces run back to back in the caller's process (the ``sync`` task, ``delta-mirror
sync``):

1. ``Publisher.publish`` publishes every pending version with the cadence's checkpoints (``local``
   in-process; ``auto`` / ``spark`` through the publisher the caller's ``make_publisher`` builds:
   ``spark.checkpoint_choice.publisher_for``, which starts Spark only when a checkpoint is due and
   holds the long lease); ``Publisher.checkpoint_if_due`` then applies the same policy at the last
   published version. In a DAG on the ``spark`` engine the checkpoint is a separate spark-submit
   task (``checkpoint_here=False``) and nothing is checkpointed here.
2. Validation is batched on its own cadence (``validate_every``): when the last recorded
   validation (``health.monitoring.record_validation``) is older than the cadence, the versions
   published since it are validated together; a failed validation is due again at once (over its
   range and the new versions), so a retry cannot turn a problem into a success.
   Tables published in the triggerer (``publish_in: triggerer``) have no per-commit run: the
   monitor DAG validates them with the same plan (``jobs.fleet_validate``).
3. ``health.monitoring.record_lag_sample`` stores the table's lag, as the monitor's lag task does.

A ``publish_in: triggerer`` table has a second publisher at work: its trigger publishes each
commit and may hold the table's lease (milliseconds) just when the run started for a checkpoint
takes it. Such a run waits for the lease (see ``sync_table``) instead of failing a try for it.

Problems are returned in the result, not raised: the caller decides (the operator fails the task,
the CLI exits 1).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from delta_mirror.delta.protocol import now_ms
from delta_mirror.errors import LeaseHeldError
from delta_mirror.health.monitoring import (
    DEFAULT_LAG_RETENTION,
    LagSample,
    record_lag_sample,
    record_validation,
)
from delta_mirror.health.status import TableStatus, table_status
from delta_mirror.jobs.publisher import Publisher, PublishResult
from delta_mirror.jobs.validate.report import ValidationReport
from delta_mirror.storage import ObjectStore
from delta_mirror.store.sql_store import SqlStore, TableInfo

DEFAULT_VALIDATE_EVERY = timedelta(minutes=10)

#: Seconds a ``publish_in: triggerer`` table's run waits for a held lease, per step (publish, then
#: checkpoint). The trigger holds it for one publish: milliseconds, ~1.5 s at p99 on a loaded
#: fleet (docs/scaling.md). Far below the lease TTL (120 s): a crashed holder's lease, which only
#: its expiry ends, does not keep a worker slot for minutes.
TRIGGERER_LEASE_WAIT = 5.0


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
    # publish_in: triggerer, the lease held past the wait (``sync_table``): publishing was left to
    # the holder; a checkpoint due at this version was not written (it stays due: the next run's)
    published_elsewhere: bool = False
    checkpoint_not_written: int | None = None

    def checkpoint_text(self) -> str:
        """The run's checkpoints in words, for a task log or the CLI."""
        parts = [", ".join(map(str, self.checkpoints))] if self.checkpoints else []
        if self.checkpoint_not_written is not None:
            parts.append(
                f"due at version {self.checkpoint_not_written} NOT written: another publisher held the "
                "table's lease past the wait (it stays due: the next run of the table writes it)"
            )
        return "; ".join(parts) or "not due"

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
            "published_elsewhere": self.published_elsewhere,
            "checkpoint_not_written": self.checkpoint_not_written,
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
    make: Callable[..., Publisher] | None,
    here: bool,
    storage_options: Mapping[str, str] | None,
    open_location: Callable[[str], ObjectStore] | None,
    lease_wait: float,
) -> Publisher:
    """``make`` None: in-process checkpoints; else the caller's factory (its checkpoint engine and
    lease); ``here=False``: none (a separate spark-submit step writes them), so the plain publisher
    and its usual lease."""
    kwargs: dict[str, Any] = {
        "storage_options": storage_options,
        "cadence_checkpoints": here,
        "lease_wait": lease_wait,
    }
    if open_location is not None:
        kwargs["open_location"] = open_location
    if here and make is not None:
        return make(**kwargs)
    return Publisher(store, **kwargs)


def _publish_or_leave(publisher: Publisher, name: str) -> tuple[PublishResult, bool]:
    """Publish; with the lease still held after the wait, leave it to the holder (True) when it is
    at work: it published meanwhile, or nothing waits to be published. A holder that moved
    nothing while versions wait is taken for a stuck one (a crashed publisher's lease, or one
    commit's publish slower than the wait): ``LeaseHeldError`` as before, the task's retry."""
    store = publisher.store
    table_id = publisher.table_to_publish(name).id  # a table the store lacks: the config's one line
    before = store.last_published_version(table_id)
    try:
        return publisher.publish(name), False
    except LeaseHeldError:
        last, latest = store.last_published_version(table_id), store.latest_version(table_id)
        if last == before and latest is not None and (last is None or last < latest):
            raise
        return PublishResult(name, last_published=last, latest_committed=latest), True


def _checkpoint_or_leave(publisher: Publisher, name: str) -> tuple[int | None, int | None]:
    """(written, not written): a due checkpoint the lease kept from being written stays due."""
    try:
        return publisher.checkpoint_if_due(name), None
    except LeaseHeldError as exc:
        if exc.version is not None:  # taking the lease: the version it was due at
            return None, exc.version
        store = publisher.store  # lost while writing (it expired and was taken): the version is due
        return None, store.last_published_version(store.get_table(name).id)


def sync_table(
    store: SqlStore,
    name: str,
    *,
    storage_options: Mapping[str, str] | None = None,
    make_publisher: Callable[..., Publisher] | None = None,
    checkpoint_here: bool = True,
    validate_every: timedelta | None = DEFAULT_VALIDATE_EVERY,
    reader: str = "deltalake",
    lag_retention: timedelta | None = DEFAULT_LAG_RETENTION,
    open_location: Callable[[str], ObjectStore] | None = None,
    publish_in: str = "task",
    lease_wait: float = TRIGGERER_LEASE_WAIT,
) -> SyncResult:
    """Publish every pending version of ``name``, checkpoint when due, validate when the cadence
    says so, record the lag sample. ``make_publisher``: builds the run's publisher from
    ``Publisher``'s keyword arguments, and with it who builds the checkpoints and the lease that
    needs (None: the local engine, in process; the CLI and the sync operator pass
    ``spark.checkpoint_choice.publisher_for`` bound to the table and its engine: jobs sit below the
    Spark tier, so the engine is chosen there); ``checkpoint_here=False``: checkpoints are another
    step's (the DAG's spark-submit task).

    ``publish_in="triggerer"``: the table's trigger publishes too, so a held lease is its normal
    work, not a failure: each step waits up to ``lease_wait`` seconds for it; then publishing is
    left to the holder (``published_elsewhere``; see ``_publish_or_leave`` for a stuck one) and a
    due checkpoint is reported not written (``checkpoint_not_written``; still due, the next run
    writes it). ``"task"`` (and the CLI): no other publisher is meant to be at work; a held lease
    is an overlapping run or a crashed publisher's, and only the task's retry (``LeaseHeldError``
    is retryable) makes sure the versions this run exists for get published: it fails the try.
    """
    shared = publish_in == "triggerer"
    publisher = _publisher(
        store,
        make_publisher,
        checkpoint_here,
        storage_options,
        open_location,
        lease_wait if shared else 0.0,
    )
    published, elsewhere = _publish_or_leave(publisher, name) if shared else (publisher.publish(name), False)
    written = not_written = None
    if checkpoint_here:
        if shared:
            written, not_written = _checkpoint_or_leave(publisher, name)
        else:
            written = publisher.checkpoint_if_due(name)
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
    return SyncResult(name, published, written, plan, report, status, lag, elsewhere, not_written)


__all__ = [
    "DEFAULT_VALIDATE_EVERY",
    "TRIGGERER_LEASE_WAIT",
    "SyncResult",
    "ValidationPlan",
    "plan_validation",
    "sync_table",
]
