"""Per-table mirror status and lag, computed from the store (the raw material of metrics)."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from delta_mirror.delta.protocol import now_ms
from delta_mirror.store.sql_store import SqlStore, TableInfo
from delta_mirror.store.states import Artifact, CircuitState, PublishState

_OPEN = (PublishState.PENDING, PublishState.IN_PROGRESS)  # not yet published
_FAILED = (PublishState.FAILED, PublishState.CONFLICT)


@dataclass
class TableStatus:
    table: str
    location: str
    state: str
    halted_reason: str | None
    latest_committed: int | None
    last_published: int | None
    last_checkpoint: int | None
    versions_behind: int
    lag_seconds: float
    pending: int
    failed: int
    conflicts: int
    last_error_class: str | None
    last_error: str | None
    breaker: str = CircuitState.CLOSED.value  # the worse of the table's and its storage endpoint's breaker

    def to_json(self) -> dict[str, object]:
        return asdict(self)


def table_status(store: SqlStore, table: TableInfo) -> TableStatus:
    """Lag = now − commit time of the oldest unpublished version (0 when caught up)."""
    latest = store.latest_version(table.id)
    published = store.last_published_version(table.id)
    rows = store.status_rows(table.id, artifact=Artifact.JSON, states=(*_OPEN, *_FAILED))
    lag = 0.0
    if rows:
        commits = store.commit_rows(table.id, rows[0].version, rows[0].version)
        if commits:
            lag = max(0.0, (now_ms() - commits[0].committed_at) / 1000.0)
    failed_rows = [r for r in store.status_rows(table.id, states=_FAILED)]
    last_failed = max(failed_rows, key=lambda r: r.finished_at or 0) if failed_rows else None
    behind = 0
    if latest is not None:
        base = published if published is not None else table.first_version - 1
        behind = max(0, latest - base)
    return TableStatus(
        table=table.name,
        location=table.location,
        state=table.state,
        halted_reason=table.halted_reason,
        latest_committed=latest,
        last_published=published,
        last_checkpoint=store.last_checkpoint_version(table.id),
        versions_behind=behind,
        lag_seconds=round(lag, 3),
        pending=sum(1 for r in rows if r.state in _OPEN),
        failed=sum(1 for r in failed_rows if r.state == PublishState.FAILED),
        conflicts=sum(1 for r in failed_rows if r.state == PublishState.CONFLICT),
        last_error_class=last_failed.error_class if last_failed else None,
        last_error=last_failed.last_error if last_failed else None,
        breaker=_breaker(store, table),
    )


def _breaker(store: SqlStore, table: TableInfo) -> str:
    from delta_mirror.health.breaker import CLOSED, HALF_OPEN, OPEN, CircuitBreakers, endpoint_key, table_key

    breakers = CircuitBreakers(store)
    states = {breakers.get(k).state for k in (table_key(table.name), endpoint_key(table.location))}
    for state in (OPEN, HALF_OPEN):
        if state in states:
            return state.value
    return CLOSED.value


__all__ = ["TableStatus", "table_status"]
