"""The reconciler: re-drives what is failed, stuck or lagging, table by table.

Strategy ``incremental`` re-publishes PENDING/FAILED versions and those a crashed publisher left
IN_PROGRESS (its lease expired). ``full`` also lists ``_delta_log/`` against the store for every
version and repairs what is safe (missing commits and checkpoints, a bad ``_last_checkpoint``);
a different or foreign commit halts the table. ``smart`` runs ``full`` only for tables with signs of
trouble (failures, an unpublished backlog, or a cheap probe of the log's tip that disagrees).
It never deletes or overwrites: publishing is put-if-absent, so a re-drive of a version that did
reach storage is an idempotent success.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

from delta_mirror.delta.log_path import LOG_DIR, commit_name
from delta_mirror.delta.protocol import now_ms
from delta_mirror.errors import ErrorClass, LeaseHeldError, MirrorError, StoreBehindError
from delta_mirror.jobs.log_audit import audit_log
from delta_mirror.jobs.publisher import Publisher
from delta_mirror.storage import ObjectStore
from delta_mirror.store.sql_store import SqlStore, TableInfo
from delta_mirror.store.states import Artifact, PublishState, TableState

STRATEGIES = ("incremental", "full", "smart")
_STUCK = (PublishState.FAILED, PublishState.CONFLICT)  # versions a run did not get out


@dataclass
class TableReconcile:
    table: str
    action: str  # "up-to-date" | "published" | "repaired" | "halted" | "failed" | "busy"
    published: int = 0
    checkpoints: list[int] = field(default_factory=list)
    error_class: str | None = None
    error: str | None = None
    persistent_failures: list[dict[str, object]] = field(default_factory=list)
    audit: dict[str, object] | None = None  # what the full listing found (full / smart)
    # the table's failed publish attempts in a row after this run (``store/table_failures.py``):
    # error_class, error, first_failed_at, last_failed_at, attempts; None when its last attempt worked
    table_failure: dict[str, object] | None = None


@dataclass
class ReconcileReport:
    strategy: str
    tables: list[TableReconcile] = field(default_factory=list)

    @property
    def needs_escalation(self) -> list[TableReconcile]:
        return [t for t in self.tables if t.persistent_failures or t.action == "halted"]

    def to_json(self) -> dict[str, object]:
        return {"strategy": self.strategy, "tables": [asdict(t) for t in self.tables]}


def _needs_work(store: SqlStore, table: TableInfo) -> bool:
    latest = store.latest_version(table.id)
    published = store.last_published_version(table.id)
    if latest is None:
        return False
    if published is None or published < latest:
        return True
    return bool(
        store.status_rows(
            table.id, states=(PublishState.PENDING, PublishState.FAILED, PublishState.IN_PROGRESS)
        )
    )


def _persistent_failures(store: SqlStore, table: TableInfo, after_attempts: int) -> list[dict[str, object]]:
    return [
        {
            "version": r.version,
            "artifact": r.artifact,
            "attempts": r.attempts,
            "error_class": r.error_class,
            "error": r.last_error,
            "age_seconds": round((now_ms() - r.enqueued_at) / 1000, 1),
        }
        for r in store.status_rows(table.id, states=_STUCK)
        if r.attempts >= after_attempts or r.state == PublishState.CONFLICT
    ]


def _troubled(store: SqlStore, publisher: Publisher, table: TableInfo) -> bool:
    """Signs of trouble worth a full listing: failures, a backlog, or a log tip that disagrees."""
    if _needs_work(store, table) or store.status_rows(table.id, states=_STUCK):
        return True
    published = store.last_published_version(table.id)
    if published is None:
        return False
    objects = publisher.open_location(table.location)
    tip = objects.head(f"{LOG_DIR}/{commit_name(published)}")
    beyond = objects.head(f"{LOG_DIR}/{commit_name(published + 1)}")
    rows = store.commit_rows(table.id, published, published)
    return beyond is not None or (bool(rows) and rows[0].has_json and tip is None)


def _repair(store: SqlStore, publisher: Publisher, table: TableInfo, entry: TableReconcile) -> bool:
    """Full listing; returns False when the table had to be halted (never overwrite)."""
    objects = publisher.open_location(table.location)
    audit = audit_log(store, table, objects)
    entry.audit = asdict(audit)
    if audit.foreign_commits and not audit.different_commits and _store_behind(store, table, objects, entry):
        return False
    if audit.different_commits or audit.foreign_commits:
        what = (
            f"different commit file(s) at versions {audit.different_commits}"
            if audit.different_commits
            else f"commit file(s) beyond the store's latest version: {audit.foreign_commits}"
        )
        version = (audit.different_commits or audit.foreign_commits)[0]
        store.halt_table(
            table.id,
            f"external writer: {what}; import the foreign commit or restore the log, then resume",
            version,
        )
        entry.action, entry.error_class = "halted", ErrorClass.CONFLICT.value
        entry.error = f"external writer: {what}"
        return False
    if audit.missing_commits:  # republished first: checkpoints follow their commits
        store.mark_pending(table.id, Artifact.JSON, audit.missing_commits)
        result = publisher.publish(table.name)
        entry.published = len(result.published) + len(result.already_present)
    for version in audit.missing_checkpoints:
        publisher.checkpoint(table.name, version)
        entry.checkpoints.append(version)
    if audit.bad_last_checkpoint and not audit.missing_checkpoints:
        newest = store.last_checkpoint_version(table.id)
        if newest is not None:
            publisher.rewrite_last_checkpoint(table.name, newest)
    if not audit.clean:
        entry.action = "repaired"
    return True


def _store_behind(store: SqlStore, table: TableInfo, objects: ObjectStore, entry: TableReconcile) -> bool:
    """Commit files beyond the store's latest, contiguous from it: the store lost them (an
    asynchronous failover, a restore from backup), not an external writer. The table's failure
    says so and names `delta-mirror recover` (jobs/recover.py); no halt."""
    from delta_mirror.jobs.recover import check_not_behind

    try:
        check_not_behind(store, table, objects)
    except StoreBehindError as exc:
        store.record_table_failure(table.id, exc.error_class.value, exc.message)
        entry.action, entry.error_class, entry.error = "failed", exc.error_class.value, exc.message
        return True
    return False


def _reconcile_table(
    store: SqlStore, publisher: Publisher, table: TableInfo, strategy: str = "incremental"
) -> TableReconcile:
    entry = TableReconcile(table.name, "up-to-date")
    if table.state == TableState.HALTED:
        entry.action = "halted"
        entry.error = table.halted_reason
        return entry
    try:
        repair = strategy == "full" or (strategy == "smart" and _troubled(store, publisher, table))
        if repair and not _repair(store, publisher, table, entry):
            return entry
    except MirrorError as exc:
        # The listing itself failed (the location is unreachable or broken): the re-drive below
        # still runs, so the failure is counted on the versions and escalated like any other.
        entry.audit = {"error": exc.message}
    if not _needs_work(store, table):
        return entry
    try:
        result = publisher.publish(table.name)
    except MirrorError as exc:
        entry.action = "busy" if isinstance(exc, LeaseHeldError) else "failed"
        entry.error_class = exc.error_class.value
        entry.error = exc.message
        return entry
    entry.action = "published"
    entry.published = len(result.published) + len(result.already_present)
    entry.checkpoints = result.checkpoints
    return entry


def reconcile(
    store: SqlStore,
    names: Sequence[str] | None = None,
    *,
    strategy: str = "incremental",
    escalate_after_attempts: int = 3,
    publisher: Publisher | None = None,
) -> ReconcileReport:
    """Re-drive every table (or ``names``); one table's failure does not stop the others."""
    if strategy not in STRATEGIES:
        from delta_mirror.errors import PermanentError

        raise PermanentError(f"unknown strategy '{strategy}'", hint=f"use one of {', '.join(STRATEGIES)}")
    publisher = publisher or Publisher(store)
    tables = [store.get_table(n) for n in names] if names else store.list_tables()
    report = ReconcileReport(strategy)
    for table in tables:
        entry = _reconcile_table(store, publisher, table, strategy)
        entry.persistent_failures = _persistent_failures(store, table, escalate_after_attempts)
        report.tables.append(entry)
    failures = store.table_failures([t.id for t in tables])
    for table, entry in zip(tables, report.tables, strict=True):
        failure = failures.get(table.id)
        entry.table_failure = None if failure is None else failure.to_json()
    return report


__all__ = ["STRATEGIES", "ReconcileReport", "TableReconcile", "reconcile"]
