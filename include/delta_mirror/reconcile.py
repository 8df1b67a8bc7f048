"""The reconciler: re-drives what is failed, stuck or lagging, table by table.

Strategy ``incremental`` re-publishes PENDING/FAILED versions and those a crashed publisher left
IN_PROGRESS (its lease expired). It never deletes or overwrites: publishing is put-if-absent, so a
re-drive of a version that did reach storage is an idempotent success.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

from delta_mirror.errors import LeaseHeldError, MirrorError
from delta_mirror.publisher import Publisher
from delta_mirror.store.sql_store import SqlStore, TableInfo, now_ms

STRATEGIES = ("incremental",)


@dataclass
class TableReconcile:
    table: str
    action: str  # "up-to-date" | "published" | "halted" | "failed" | "busy"
    published: int = 0
    checkpoints: list[int] = field(default_factory=list)
    error_class: str | None = None
    error: str | None = None
    persistent_failures: list[dict[str, object]] = field(default_factory=list)


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
    return bool(store.status_rows(table.id, states=("PENDING", "FAILED", "IN_PROGRESS")))


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
        for r in store.status_rows(table.id, states=("FAILED", "CONFLICT"))
        if r.attempts >= after_attempts or r.state == "CONFLICT"
    ]


def _reconcile_table(store: SqlStore, publisher: Publisher, table: TableInfo) -> TableReconcile:
    entry = TableReconcile(table.name, "up-to-date")
    if table.state == "HALTED":
        entry.action = "halted"
        entry.error = table.halted_reason
        return entry
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
        entry = _reconcile_table(store, publisher, table)
        entry.persistent_failures = _persistent_failures(store, table, escalate_after_attempts)
        report.tables.append(entry)
    return report


__all__ = ["STRATEGIES", "ReconcileReport", "TableReconcile", "reconcile"]
