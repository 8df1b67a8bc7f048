"""Per-table mirror status and lag, computed from the store (the raw material of metrics).

"How far behind right now" is measured (now − commit time of the oldest unpublished version);
"how long versions took" is per version, from the store's commit and publish times
(``store/latency.py``): p50 / p95 / p99 per window. A failed publish attempt is the table's
``failure`` (``store/table_failures.py``) until the next success.

With a table config (``coverage``), a table it does not list is ``configured: False`` with the
note "not configured: no DAG publishes it" instead of a lag (``health.coverage``): ``versions_behind``
and ``lag_seconds`` still count its unpublished versions, but nothing judges them; a table it lists
that the store lacks is a ``not_in_store_status``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from delta_mirror.delta.protocol import now_ms
from delta_mirror.health.breaker import ENDPOINT_PREFIX, endpoint_key, table_key
from delta_mirror.health.coverage import NOT_CONFIGURED, Coverage, not_in_store_error, without_table
from delta_mirror.store.mirror_status import FleetRow
from delta_mirror.store.sql_store import SqlStore, TableInfo
from delta_mirror.store.states import CircuitState
from delta_mirror.table_config import MirrorConfig

#: The ``state`` of a configured table the store lacks (``not_in_store_status``).
NOT_IN_STORE_STATE = "NOT_IN_STORE"


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
    # the failed publish attempts in a row (error_class, error, first_failed_at, last_failed_at,
    # attempts), None once an attempt succeeded
    failure: dict[str, Any] | None = None
    # per window ("1h", "24h", "7d"): versions, p50, p95, p99, max seconds from commit to readable;
    # None when not asked for (``fleet_status(latency=True)``)
    latency: dict[str, dict[str, Any] | None] | None = None
    # whether the table config lists it (a DAG publishes it); None: no table config was read
    configured: bool | None = None
    in_store: bool = True  # False: the config lists it, the store has never had it
    # instead of a lag: "not configured: no DAG publishes it — ..." or "...: not in store: ..."
    note: str | None = None

    @property
    def lag_judged(self) -> bool:
        """Whether its lag means anything: a DAG (or, without a table config, someone) publishes it."""
        return self.in_store and self.configured is not False

    def to_json(self) -> dict[str, object]:
        return dict(vars(self))  # scalars and small dicts that are not shared: no deep copy per table


def table_status(store: SqlStore, table: TableInfo) -> TableStatus:
    """Lag = now − commit time of the oldest unpublished version (0 when caught up)."""
    return fleet_status(store, [table])[0]


#: The windows of the latency percentiles (``status --json``, ``health --json``, the UI's API).
LATENCY_WINDOWS = {"1h": 3_600_000, "24h": 86_400_000, "7d": 7 * 86_400_000}
#: Percentiles for at most this many tables per call: each reads its windows' versions (at 1,000
#: tables with 1,000 versions each, 3 s on SQLite), so a larger fleet's ``status --json`` stays
#: within its second; ask by name, with ``--limit``, or page the UI's overview.
LATENCY_TABLES = 100


def fleet_status(
    store: SqlStore,
    tables: Sequence[TableInfo],
    *,
    latency: bool = False,
    coverage: Coverage | None = None,
) -> list[TableStatus]:
    """The status of each of ``tables`` (in their order) from a constant number of statements,
    however many tables and versions the store holds (``MirrorStatus.fleet_rows``); ``latency``:
    also the per-version latency percentiles of each window (one statement per 500 tables; for at
    most ``LATENCY_TABLES`` tables, else ``latency`` stays None); ``coverage``: the table config's
    names, which mark the tables it does not list as not configured."""
    if not tables:
        return []
    ids = None if len(tables) > _FEW else [t.id for t in tables]
    rows = store.fleet_rows(ids)  # with each table's failed publish attempts
    breakers = store.breakers_not_closed()
    # Endpoint keys are worked out (a URL parse per table) only when an endpoint breaker is not closed.
    endpoints = any(key.startswith(ENDPOINT_PREFIX) for key in breakers)
    now = now_ms()
    out = [_status(t, rows.get(t.id), breakers, endpoints, now) for t in tables]
    for t, st in zip(tables, out, strict=True):
        row = rows.get(t.id)
        st.failure = None if row is None or row.failure is None else row.failure.to_json()
        if coverage is not None:
            mark_coverage(st, coverage)
    if latency and len(tables) <= LATENCY_TABLES:
        all_ids = [t.id for t in tables]
        stats = store.latency_windows(all_ids, {w: now - ms for w, ms in LATENCY_WINDOWS.items()})
        for t, st in zip(tables, out, strict=True):
            mine = stats.get(t.id, {})
            st.latency = {w: (mine[w].to_json() if w in mine else None) for w in LATENCY_WINDOWS}
    return out


def mark_coverage(status: TableStatus, coverage: Coverage) -> None:
    """The one rule: a table the config does not list has no DAG, so its note replaces its lag."""
    status.configured = coverage.configured(status.table)
    if not status.configured:
        behind = f" ({status.versions_behind} version(s) not published)" if status.versions_behind else ""
        status.note = f"{NOT_CONFIGURED}{behind} — {coverage.not_configured_hint()}"


def not_in_store_status(name: str, config: MirrorConfig | None) -> TableStatus:
    """A table ``config`` lists that the store has never had: nothing to measure, the note says
    what to do (``health.coverage.not_in_store_error``)."""
    return TableStatus(
        table=name,
        location="",
        state=NOT_IN_STORE_STATE,
        halted_reason=None,
        latest_committed=None,
        last_published=None,
        last_checkpoint=None,
        versions_behind=0,
        lag_seconds=0.0,
        pending=0,
        failed=0,
        conflicts=0,
        last_error_class=None,
        last_error=None,
        configured=True,
        in_store=False,
        note=without_table(not_in_store_error(name, config)),
    )


_FEW = 50  # more tables than this: read every table's row (one scan) rather than a long IN list


def _status(
    table: TableInfo, row: FleetRow | None, breakers: dict[str, str], endpoints: bool, now: int
) -> TableStatus:
    row = row or FleetRow(table.id, None, None, None, None, None, 0, 0, 0, None, None)
    if row.first_open is not None:
        # Nothing published yet is None, not first_version - 1 (-1 for a new table).
        published = None if row.first_open <= table.first_version else row.first_open - 1
    else:
        published = row.last_json
    lag = 0.0
    if row.first_open_committed_at is not None:
        lag = max(0.0, (now - row.first_open_committed_at) / 1000.0)
    behind = 0
    if row.latest_committed is not None:
        base = published if published is not None else table.first_version - 1
        behind = max(0, row.latest_committed - base)
    return TableStatus(
        table=table.name,
        location=table.location,
        state=table.state,
        halted_reason=table.halted_reason,
        latest_committed=row.latest_committed,
        last_published=published,
        last_checkpoint=row.last_checkpoint,
        versions_behind=behind,
        lag_seconds=round(lag, 3),
        pending=row.pending,
        failed=row.failed,
        conflicts=row.conflicts,
        last_error_class=row.last_error_class,
        last_error=row.last_error,
        breaker=_breaker(table, breakers, endpoints),
    )


def _breaker(table: TableInfo, not_closed: dict[str, str], endpoints: bool) -> str:
    """The worse of the table's and its storage endpoint's breaker (absent rows are CLOSED)."""
    if not not_closed:
        return CircuitState.CLOSED.value
    keys = (table_key(table.name), endpoint_key(table.location)) if endpoints else (table_key(table.name),)
    states = {not_closed.get(k) for k in keys}
    for state in (CircuitState.OPEN, CircuitState.HALF_OPEN):
        if state in states:
            return state.value
    return CircuitState.CLOSED.value


__all__ = [
    "LATENCY_TABLES",
    "LATENCY_WINDOWS",
    "NOT_IN_STORE_STATE",
    "TableStatus",
    "fleet_status",
    "mark_coverage",
    "not_in_store_status",
    "table_status",
]
