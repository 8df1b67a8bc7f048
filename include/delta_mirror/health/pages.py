"""What the "Delta Mirror" pages show, read from the store: the overview, a table's page, health.

Plain dicts, which the pages' JSON API returns as they are; no HTML and no Airflow, so the rules
(paging, which rows get a sparkline and percentiles, a constant number of queries per store) are
tested without a server. The Airflow plugin renders them (``airflow/ui_render.py``) and decides who
sees which table (``airflow/ui_app.py``), passed in here as ``visible``.
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from delta_mirror.errors import TableNotFoundError
from delta_mirror.health.coverage import coverage_of, effective_config, not_in_store_error, without_table
from delta_mirror.health.monitoring import (
    failure_grace_for,
    health_report,
    judge,
    lag_slo_for,
    overview_row_of,
    table_detail,
)
from delta_mirror.health.status import LATENCY_TABLES, LATENCY_WINDOWS, fleet_status, not_in_store_status
from delta_mirror.store import SqlStore
from delta_mirror.store.sql_store import TableInfo
from delta_mirror.table_config import ConfigError, MirrorConfig

OVERVIEW_PAGE = 100  # tables per overview page (``per_page`` up to ``OVERVIEW_MAX_PAGE``)
OVERVIEW_MAX_PAGE = 1000
SPARK_POINTS = 48  # the sparkline: the highest version latency of each half hour of the last 24 h
TABLE_VERSIONS = 200  # a table page's timeline: its latest versions (``versions`` up to 5,000)
MAX_TABLE_VERSIONS = 5000

#: Who may see a table, by name (``None``: everyone).
Visible = Callable[[str], bool] | None


def page_config() -> MirrorConfig | None:
    """The table config, read at each request (edits show without a restart); none without a file."""
    return effective_config()


class PageStores:
    """One ``SqlStore`` (engine and pool) per store connection for the life of the server.

    ``url_of`` turns a table config's ``store_conn_id`` into the store's URL (the plugin reads
    Airflow's connections); no connection id: ``DELTA_MIRROR_STORE``.
    """

    def __init__(self, url_of: Callable[[str], str | None] | None = None) -> None:
        self._url_of = url_of
        self._stores: dict[str, SqlStore] = {}
        self._lock = threading.Lock()

    def store(self, conn_id: str | None) -> SqlStore:
        key = conn_id or ""
        with self._lock:
            if key not in self._stores:
                store = SqlStore(self._url(conn_id))
                store.ensure_initialised()
                self._stores[key] = store
            return self._stores[key]

    def _url(self, conn_id: str | None) -> str | None:
        if not conn_id:
            return os.environ.get("DELTA_MIRROR_STORE")
        if self._url_of is None:
            raise ConfigError(
                f"the table config names the store connection '{conn_id}'",
                hint="store connections are Airflow connections: read the pages in Airflow",
            )
        return self._url_of(conn_id)

    def of(self, config: MirrorConfig | None) -> list[SqlStore]:
        """Every store the config names (its defaults' first), each once; without a config, the default."""
        ids: list[str | None] = [config.defaults.store_conn_id] if config else [None]
        if config:
            ids += [t.store_conn_id for t in config.tables.values()]
        return [self.store(i) for i in dict.fromkeys(ids)]

    def find(self, name: str, config: MirrorConfig | None) -> tuple[SqlStore, TableInfo]:
        """The table's store (its config entry's, else the first store that has it) and the table;
        none: the one line that says whether the config lists it (``not_in_store_error``)."""
        cfg = config.tables.get(name) if config else None
        for store in [self.store(cfg.store_conn_id)] if cfg else self.of(config):
            try:
                return store, store.get_table(name)
            except TableNotFoundError:
                continue
        raise not_in_store_error(name, config)

    def close(self) -> None:
        with self._lock:
            for store in self._stores.values():
                store.close()
            self._stores.clear()


def _not_in_store(config: MirrorConfig | None, present: set[str], visible: Visible) -> list[dict[str, Any]]:
    """The tables ``config`` lists that no store has (those ``visible`` accepts): name, DAG, the line."""
    coverage = coverage_of(config)
    if config is None or coverage is None:
        return []
    return [
        {"table": n, "dag_id": config.tables[n].dag_id, "note": without_table(not_in_store_error(n, config))}
        for n in coverage.missing(present)
        if visible is None or visible(n)
    ]


def overview_data(
    stores: PageStores, page: int = 1, per_page: int = OVERVIEW_PAGE, visible: Visible = None
) -> dict[str, Any]:
    """One page of tables by name, each row with its 24 h sparkline; the verdict and the unhealthy
    count cover every table. A constant number of queries per store whatever the number of tables
    (``fleet_status``, the latency of the page's tables only). A table the config does not list is
    "not configured" instead of a lag; ``not_in_store``: the listed tables no store has."""
    config = page_config()
    coverage = coverage_of(config)
    per_page = max(1, min(int(per_page), OVERVIEW_MAX_PAGE))
    found: dict[str, int] = {}  # name -> the first store that has it
    in_stores = stores.of(config)
    everything = [s.list_tables() for s in in_stores]
    # only the tables the user may read: rows, verdict and counts alike
    listed = [[t for t in tables if visible is None or visible(t.name)] for tables in everything]
    for i, tables in enumerate(listed):
        for t in tables:
            found.setdefault(t.name, i)
    names = sorted(found)
    pages = max(1, math.ceil(len(names) / per_page))
    page = max(1, min(int(page), pages))
    shown = set(names[(page - 1) * per_page : page * per_page])
    now = int(datetime.now(UTC).timestamp() * 1000)
    rows: dict[str, dict[str, Any]] = {}
    unhealthy = 0
    for i, store in enumerate(in_stores):
        tables = [t for t in listed[i] if found[t.name] == i]
        if not tables:
            continue
        page_ids = [t.id for t in tables if t.name in shown]
        # per-version latency from the store's commit and publish times (no sampling gaps), for
        # the page's tables only: the sparkline and the percentiles of each window
        peaks = store.latency_peaks(page_ids, now - LATENCY_WINDOWS["24h"], now, SPARK_POINTS)
        stats = (  # the percentiles for a page of up to LATENCY_TABLES tables (the default page is 100)
            store.latency_windows(page_ids, {w: now - ms for w, ms in LATENCY_WINDOWS.items()})
            if len(page_ids) <= LATENCY_TABLES
            else {}
        )
        for table, st in zip(tables, fleet_status(store, tables, coverage=coverage), strict=True):
            row = overview_row_of(st, lag_slo_for(config, table.name), failure_grace_for(config, table.name))
            unhealthy += not row["healthy"]
            if table.name in shown:
                row["lag_24h"] = peaks.get(table.id, [])
                mine = stats.get(table.id, {})
                row["latency"] = {w: (mine[w].to_json() if w in mine else None) for w in LATENCY_WINDOWS}
                rows[table.name] = row
    return {
        "generated_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "healthy": unhealthy == 0,
        "total": len(names),
        "unhealthy": unhealthy,
        "page": page,
        "pages": pages,
        "per_page": per_page,
        "tables": [rows[n] for n in sorted(rows)],
        "not_in_store": _not_in_store(config, {t.name for tables in everything for t in tables}, visible),
    }


def table_data(
    stores: PageStores, name: str, window: str = "24h", versions: int = TABLE_VERSIONS
) -> dict[str, Any]:
    """A table page: its latest ``versions`` versions (1..5000) and 50 checkpoints, with the totals."""
    config = page_config()
    store, table = stores.find(name, config)
    return table_detail(
        store,
        table,
        lag_slo_for(config, name),
        window=window,
        versions=max(1, min(versions, MAX_TABLE_VERSIONS)),
        grace=failure_grace_for(config, name),
        coverage=coverage_of(config),
    )


def health_data(stores: PageStores, visible: Visible = None) -> dict[str, Any]:
    """The health of the tables ``visible`` accepts (all without it)."""
    config = page_config()
    out: dict[str, Any] = {"healthy": True, "tables": []}
    present: set[str] = set()
    for store in stores.of(config):
        # the tables the config lists that no store has: once, below, not once per store
        report = health_report(store, None, config, not_in_store=False)
        present.update(t.table for t in report.tables)
        tables = [t for t in report.tables if visible is None or visible(t.table)]
        out["healthy"] = out["healthy"] and all(t.healthy for t in tables)
        out["tables"] += [t.to_json() for t in tables]
    for missing in _not_in_store(config, present, visible):
        out["tables"].append(judge(not_in_store_status(missing["table"], config)).to_json())
    return out


__all__ = [
    "OVERVIEW_MAX_PAGE",
    "OVERVIEW_PAGE",
    "PageStores",
    "Visible",
    "health_data",
    "overview_data",
    "page_config",
    "table_data",
]
