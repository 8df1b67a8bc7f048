"""Lag history and health: the core of ``delta-mirror health``, the monitor DAG and the UI plugin.

- ``record_lag_sample(store, table)`` measures a table's lag (now − commit time of the oldest
  unpublished version, and versions behind), stores it in ``dl_lag_samples`` and prunes samples
  older than the retention (``lag_history_retention`` in the table config, default 14 days).
- ``table_health(...)`` / ``health_report(...)`` judge each table: unhealthy when its lag breaches
  its lag SLO (``lag_slo``, default 15 minutes), when it is halted, when it has failed or
  conflicting versions, or when its publish attempts have kept failing past the failure grace
  (``failure_grace`` / ``failure_grace_attempts``, default 5 minutes or 2 attempts in a row).
  A table the table config does not list (no DAG publishes it) and a listed table the store lacks
  are not judged by lag: each gets a warning, its ``note`` (``health.coverage``).
- Latency is per version, from the store (``store/latency.py``): the percentiles per window, the
  table page's chart (commit-to-readable seconds per version, versions behind over time) and the
  overview's sparkline; the lag samples only say how far behind a table was when measured.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from typing import Any

from delta_mirror.delta.protocol import now_ms
from delta_mirror.errors import TableNotFoundError
from delta_mirror.health.coverage import Coverage, coverage_of, not_in_store_error
from delta_mirror.health.status import TableStatus, fleet_status, not_in_store_status, table_status
from delta_mirror.store.latency import versions_behind_series
from delta_mirror.store.sql_store import SqlStore, TableInfo
from delta_mirror.store.states import Artifact, CircuitState, TableState
from delta_mirror.table_config import MirrorConfig

DEFAULT_LAG_SLO = timedelta(minutes=15)
DEFAULT_LAG_RETENTION = timedelta(days=14)


@dataclass(frozen=True)
class FailureGrace:
    """How long a table's publish attempts may fail in a row before ``health`` calls it unhealthy:
    ``duration`` since the first failed attempt or ``attempts`` failed attempts, whichever first."""

    duration: timedelta = timedelta(minutes=5)
    attempts: int = 2

    def passed(self, failure: dict[str, Any], now: int) -> bool:
        age = now - int(failure["first_failed_at"])
        return int(failure["attempts"]) >= self.attempts or age >= self.duration.total_seconds() * 1000


DEFAULT_FAILURE_GRACE = FailureGrace()


@dataclass(frozen=True)
class LagSample:
    table: str
    sampled_at: int  # epoch milliseconds
    lag_seconds: float
    versions_behind: int
    pruned: int = 0

    def to_json(self) -> dict[str, Any]:
        """The sample (``pruned`` counts what recording it removed: not part of it)."""
        out = asdict(self)
        del out["pruned"]
        return out


def record_lag_sample(
    store: SqlStore,
    table: TableInfo | str,
    *,
    retention: timedelta | None = DEFAULT_LAG_RETENTION,
    status: TableStatus | None = None,
) -> LagSample:
    """Measure and store one lag sample for ``table``; prune samples older than ``retention``."""
    info = store.get_table(table) if isinstance(table, str) else table
    st = status or table_status(store, info)
    at = store.add_lag_sample(info.id, st.lag_seconds, st.versions_behind)
    pruned = 0
    if retention is not None:
        pruned = store.prune_lag_samples(info.id, at - int(retention.total_seconds() * 1000))
    return LagSample(info.name, at, st.lag_seconds, st.versions_behind, pruned)


def record_lag_samples(
    store: SqlStore,
    tables: Sequence[TableInfo],
    retention_for: Callable[[str], timedelta | None] = lambda _name: DEFAULT_LAG_RETENTION,
    statuses: Sequence[TableStatus] | None = None,
) -> list[TableStatus]:
    """The monitor DAG's lag step: measure every table's status and store one lag sample each, pruning
    samples older than the table's retention; a constant number of statements for any fleet size."""
    sts = list(statuses) if statuses is not None else fleet_status(store, tables)
    at = store.add_lag_samples(
        [(t.id, st.lag_seconds, st.versions_behind) for t, st in zip(tables, sts, strict=True)]
    )
    cutoffs = []
    for t in tables:
        retention = retention_for(t.name)
        if retention is not None:
            cutoffs.append((t.id, at - int(retention.total_seconds() * 1000)))
    store.prune_lag_samples_many(cutoffs)
    return sts


def lag_history(
    store: SqlStore, table: TableInfo | str, since: int | None = None, limit: int = 2000
) -> list[dict[str, Any]]:
    """The table's stored lag samples, oldest first (at most ``limit``, the newest ones)."""
    info = store.get_table(table) if isinstance(table, str) else table
    return [
        {"sampled_at": at, "lag_seconds": lag, "versions_behind": behind}
        for at, lag, behind in store.lag_samples(info.id, since=since, limit=limit)
    ]


@dataclass
class TableHealth:
    table: str
    healthy: bool
    lag_slo_seconds: float
    problems: list[str] = field(default_factory=list)
    status: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)  # e.g. a failed attempt still within the grace

    def to_json(self) -> dict[str, Any]:
        return {
            "table": self.table,
            "healthy": self.healthy,
            "lag_slo_seconds": self.lag_slo_seconds,
            "problems": list(self.problems),
            "warnings": list(self.warnings),
            "status": dict(self.status),
        }


def failure_text(failure: dict[str, Any], now: int | None = None) -> str:
    """ "publishing failed 3 attempt(s) in a row, for 412 s: [PERMANENT] ..." """
    age = max(0.0, ((now_ms() if now is None else now) - int(failure["first_failed_at"])) / 1000)
    return (
        f"publishing failed {failure['attempts']} attempt(s) in a row, for {age:.0f} s: "
        f"[{failure['error_class']}] {failure['error']}"
    )


def judge(
    status: TableStatus,
    lag_slo: timedelta = DEFAULT_LAG_SLO,
    grace: FailureGrace = DEFAULT_FAILURE_GRACE,
    now: int | None = None,
) -> TableHealth:
    """Healthy unless lag > SLO, halted, an open circuit breaker, failed / conflicting versions, or
    publish attempts failing past the failure grace (within it: a warning). The lag of a table no
    DAG publishes (``TableStatus.lag_judged``) is not judged: its note is a warning."""
    slo = lag_slo.total_seconds()
    problems: list[str] = []
    warnings: list[str] = []
    if status.failure is not None:
        at = now_ms() if now is None else now
        if grace.passed(status.failure, at):
            problems.append(failure_text(status.failure, at))
        else:
            warnings.append(
                f"{failure_text(status.failure, at)} (unhealthy after {grace.attempts} attempt(s) "
                f"or {grace.duration.total_seconds():.0f} s)"
            )
    if status.state == TableState.HALTED:
        problems.append(f"halted: {status.halted_reason or 'no reason recorded'}")
    if status.breaker != CircuitState.CLOSED:
        problems.append(
            f"circuit breaker {status.breaker}: publishing paused after repeated transient failures"
        )
    if not status.lag_judged:
        warnings.append(status.note or "not judged by lag")
    elif status.lag_seconds > slo:
        problems.append(
            f"lag {status.lag_seconds:.0f} s breaches the lag SLO of {slo:.0f} s "
            f"({status.versions_behind} version(s) behind)"
        )
    if status.failed or status.conflicts:
        what = f"{status.failed} failed and {status.conflicts} conflicting version(s)"
        if status.last_error:
            what += f"; last error [{status.last_error_class}]: {status.last_error}"
        problems.append(what)
    return TableHealth(status.table, not problems, slo, problems, status.to_json(), warnings)


@dataclass
class HealthReport:
    tables: list[TableHealth]

    @property
    def healthy(self) -> bool:
        return all(t.healthy for t in self.tables)

    def to_json(self) -> dict[str, Any]:
        return {"healthy": self.healthy, "checked_at": now_ms(), "tables": [t.to_json() for t in self.tables]}


def lag_slo_for(config: Any, name: str) -> timedelta:
    """The table's ``lag_slo`` from a ``MirrorConfig`` (its defaults for unconfigured tables)."""
    if config is None:
        return DEFAULT_LAG_SLO
    slo: timedelta = config.settings_for(name).lag_slo
    return slo


def failure_grace_for(config: Any, name: str) -> FailureGrace:
    """The table's ``failure_grace`` / ``failure_grace_attempts`` from a ``MirrorConfig``."""
    if config is None:
        return DEFAULT_FAILURE_GRACE
    cfg = config.settings_for(name)
    return FailureGrace(cfg.failure_grace, cfg.failure_grace_attempts)


def resolve_tables(
    store: SqlStore, names: Sequence[str | TableInfo], config: MirrorConfig | None
) -> list[TableInfo]:
    """``names`` (names or ``TableInfo``s) as the store's tables; a name the store lacks is the
    one-line ``TableNotFoundError`` that says whether the table config lists it."""
    out = []
    for n in names:
        if isinstance(n, TableInfo):
            out.append(n)
            continue
        try:
            out.append(store.get_table(n))
        except TableNotFoundError:
            raise not_in_store_error(n, config) from None
    return out


def health_report(
    store: SqlStore,
    names: Sequence[str | TableInfo] | None = None,
    config: Any = None,
    *,
    grace: Callable[[str], FailureGrace] | None = None,
    not_in_store: bool | None = None,
) -> HealthReport:
    """Health of every table in the store (or of ``names``: names or ``TableInfo``s), SLOs and
    failure graces from ``config`` (a ``MirrorConfig``) unless ``grace`` says otherwise; with the
    latency percentiles; a constant number of queries for any number of tables. With ``config``,
    ``not_in_store`` (default: when ``names`` are not given) adds the tables it lists that are not
    among them (healthy, with a warning)."""
    tables = resolve_tables(store, names, config) if names else store.list_tables()
    coverage = coverage_of(config)
    statuses = fleet_status(store, tables, latency=True, coverage=coverage)
    if coverage is not None and (not names if not_in_store is None else not_in_store):
        missing = [not_in_store_status(n, config) for n in coverage.missing(t.name for t in tables)]
        statuses = sorted([*statuses, *missing], key=lambda st: st.table)
    grace_of = grace or (lambda name: failure_grace_for(config, name))
    now = now_ms()
    return HealthReport(
        [judge(st, lag_slo_for(config, st.table), grace_of(st.table), now) for st in statuses]
    )


def _troubleshooting(error_class: str | None) -> str | None:
    from delta_mirror.errors import ErrorClass
    from delta_mirror.health.troubleshooting import TROUBLESHOOTING

    try:
        return TROUBLESHOOTING[ErrorClass(error_class)] if error_class else None
    except ValueError:
        return None


def overview_row(
    store: SqlStore,
    table: TableInfo,
    lag_slo: timedelta = DEFAULT_LAG_SLO,
    grace: FailureGrace = DEFAULT_FAILURE_GRACE,
    coverage: Coverage | None = None,
) -> dict[str, Any]:
    """One row of the UI overview: versions, lag, latency, checkpoint, state, failures, what to do."""
    return overview_row_of(fleet_status(store, [table], latency=True, coverage=coverage)[0], lag_slo, grace)


def overview_rows(store: SqlStore, tables: Sequence[TableInfo], config: Any = None) -> list[dict[str, Any]]:
    """The overview rows of ``tables`` (their order) from a constant number of statements."""
    return [
        overview_row_of(st, lag_slo_for(config, st.table), failure_grace_for(config, st.table))
        for st in fleet_status(store, tables, latency=True, coverage=coverage_of(config))
    ]


def overview_row_of(
    st: TableStatus, lag_slo: timedelta = DEFAULT_LAG_SLO, grace: FailureGrace = DEFAULT_FAILURE_GRACE
) -> dict[str, Any]:
    """The overview row of a measured status."""
    health = judge(st, lag_slo, grace)
    failure = st.failure
    return {
        "table": st.table,
        "location": st.location,
        "state": st.state,
        "breaker": st.breaker,
        "halted_reason": st.halted_reason,
        "latest_committed": st.latest_committed,
        "last_published": st.last_published,
        "last_checkpoint": st.last_checkpoint,
        "lag_seconds": st.lag_seconds,
        "versions_behind": st.versions_behind,
        "pending": st.pending,
        "failed": st.failed,
        "conflicts": st.conflicts,
        "last_error_class": st.last_error_class,
        "last_error": st.last_error,
        "troubleshooting": _troubleshooting(st.last_error_class),
        "failure": failure,
        "failure_troubleshooting": _troubleshooting(failure["error_class"]) if failure else None,
        "failure_grace": {"seconds": grace.duration.total_seconds(), "attempts": grace.attempts},
        "latency": st.latency,
        "lag_slo_seconds": health.lag_slo_seconds,
        "healthy": health.healthy,
        "problems": health.problems,
        "warnings": health.warnings,
        "dag_id": None if st.configured is False else f"delta_mirror__{st.table}",  # no config entry: no DAG
        "configured": st.configured,
        "in_store": st.in_store,
        "lag_judged": st.lag_judged,  # False: the note instead of the lag ("not configured: ...")
        "note": st.note,
    }


WINDOWS = {"1h": 3600 * 1000, "24h": 24 * 3600 * 1000, "7d": 7 * 24 * 3600 * 1000}


def record_validation(store: SqlStore, name: str, report: dict[str, Any]) -> None:
    """Keep the table's latest validation result (shown on the UI table page)."""
    table = store.get_table(name)
    problems = list(report.get("problems") or [])
    settings = dict(table.settings)
    settings["last_validation"] = {
        "at": now_ms(),
        "from_version": report.get("from_version"),
        "to_version": report.get("to_version"),
        "versions_checked": report.get("versions_checked"),
        "reader": report.get("reader", "deltalake"),
        "ok": not problems,
        "problems": problems[:20],
        "problem_count": len(problems),
    }
    store.update_table(table.id, settings=settings)


LATENCY_POINTS = 20_000  # the table page's chart: the newest this many versions of the window


def version_latency(
    store: SqlStore,
    table: TableInfo,
    window: str = "24h",
    now: int | None = None,
    limit: int = LATENCY_POINTS,
) -> dict[str, Any]:
    """The table page's "lag over time", from the store's commit and publish times: each version
    committed in the window with its commit-to-readable seconds (an unpublished one: so far), and
    the versions behind over the window, reconstructed — no gaps where nothing sampled."""
    now = now_ms() if now is None else now
    since = now - WINDOWS.get(window, WINDOWS["24h"])
    times, cut = store.version_times(table.id, since, limit)
    return {
        "since": since,
        "until": now,
        "truncated": cut,
        "versions": [
            {
                "version": v.version,
                "committed_at": v.committed_at,
                "published_at": v.published_at,
                "latency_seconds": round(max(0, (v.published_at or now) - v.committed_at) / 1000, 3),
                "published": v.published_at is not None,
            }
            for v in times
            if v.committed_at >= since or v.published_at is None
        ],
        "behind": versions_behind_series(times, since, now),
    }


def table_detail(
    store: SqlStore,
    table: TableInfo,
    lag_slo: timedelta = DEFAULT_LAG_SLO,
    versions: int = 200,
    samples: int = 2000,
    window: str = "24h",
    checkpoints: int = 50,
    grace: FailureGrace = DEFAULT_FAILURE_GRACE,
    coverage: Coverage | None = None,
) -> dict[str, Any]:
    """The UI table page: overview row, per-version latency over the window, the latest ``versions``
    versions (failures, retries), the latest ``checkpoints`` checkpoints (with their ``writes``: a
    commit file is written once unless retried, a checkpoint also on request); ``versions_total`` /
    ``checkpoints_total`` count them all, so a long history shows "latest 200 of 1,000,000" and reads
    only what it shows. ``lag_history``: the lag samples (how far behind when measured)."""
    row = overview_row(store, table, lag_slo, grace, coverage)
    latest = row["latest_committed"]
    since = None if latest is None else max(table.first_version, int(latest) - versions + 1)
    json_rows = store.status_rows(table.id, artifact=Artifact.JSON, from_version=since)
    commit_times: dict[int, int] = {}
    if json_rows:
        commit_times = {
            c.version: c.committed_at
            for c in store.commit_rows(table.id, json_rows[0].version, json_rows[-1].version)
        }

    def status(r: Any) -> dict[str, Any]:
        return {
            "version": r.version,
            "state": r.state,
            "attempts": r.attempts,
            "retried": r.attempts > 1,
            "error_class": r.error_class,
            "last_error": r.last_error,
            "enqueued_at": r.enqueued_at,
            "started_at": r.started_at,
            "finished_at": r.finished_at,
        }

    def checkpoint(r: Any) -> dict[str, Any]:
        # `delta-mirror checkpoint` rewrites a checkpoint on purpose, which counts as a write too:
        # a checkpoint's writes are not retries, so it is never flagged "retried".
        item = status(r)
        item["writes"] = item.pop("attempts")
        del item["retried"]
        return item

    timeline = []
    for r in json_rows:
        item = status(r)
        item["committed_at"] = commit_times.get(r.version)
        timeline.append(item)
    cp_rows = store.status_rows(table.id, artifact=Artifact.CHECKPOINT, newest=checkpoints)
    return {
        **row,
        "lag_window": window if window in WINDOWS else "24h",
        "version_latency": version_latency(store, table, window if window in WINDOWS else "24h"),
        "lag_history": lag_history(
            store, table, since=now_ms() - WINDOWS.get(window, WINDOWS["24h"]), limit=samples
        ),
        "last_validation": table.settings.get("last_validation"),
        "versions": timeline,
        "versions_total": store.count_status(table.id, Artifact.JSON),
        "checkpoints": [checkpoint(r) for r in cp_rows],
        "checkpoints_total": store.count_status(table.id, Artifact.CHECKPOINT),
    }


__all__ = [
    "DEFAULT_FAILURE_GRACE",
    "DEFAULT_LAG_RETENTION",
    "DEFAULT_LAG_SLO",
    "FailureGrace",
    "HealthReport",
    "LagSample",
    "TableHealth",
    "failure_grace_for",
    "failure_text",
    "health_report",
    "judge",
    "lag_history",
    "lag_slo_for",
    "overview_row",
    "overview_row_of",
    "overview_rows",
    "record_lag_sample",
    "record_lag_samples",
    "resolve_tables",
    "table_detail",
    "version_latency",
]
