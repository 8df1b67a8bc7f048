"""The "Delta Mirror" page of the Airflow UI: an ``AirflowPlugin`` with a FastAPI app and a nav entry.

Mounted by Airflow's API server under ``/delta-mirror``:

- ``/delta-mirror/`` overview (HTML): one row per table; ``/delta-mirror/tables/<name>``: lag over
  time (inline SVG, no JavaScript, no CDN), version timeline with failures and retries, checkpoints;
- ``/delta-mirror/api/overview``, ``/delta-mirror/api/tables/<name>``: the same data as JSON;
- ``/delta-mirror/api/health``: 200 when every table is healthy, 503 otherwise (for probes).

The app, its login on every route and who may see which table (a table's own DAG decides) are
``ui_app``; this module holds the data and the HTML.
"""

from __future__ import annotations

import html
import math
import os
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

from airflow.plugins_manager import AirflowPlugin

from delta_mirror.health.monitoring import (
    DEFAULT_LAG_SLO,
    failure_grace_for,
    failure_text,
    health_report,
    lag_slo_for,
    overview_row_of,
    table_detail,
)
from delta_mirror.health.status import LATENCY_TABLES, LATENCY_WINDOWS, fleet_status
from delta_mirror.store import SqlStore

URL_PREFIX = "/delta-mirror"

_STORES: dict[str, SqlStore] = {}
_STORES_LOCK = threading.Lock()


def _config() -> Any:
    from delta_mirror.table_config import default_config_path, load_config

    path = default_config_path()
    return load_config(path) if path.is_file() else None


def _store_for(conn_id: str | None) -> SqlStore:
    """One store (engine and pool) per connection for the life of the API server."""
    key = conn_id or ""
    with _STORES_LOCK:
        if key not in _STORES:
            if conn_id:
                from delta_mirror.airflow.hooks import DeltaMirrorHook

                url = DeltaMirrorHook(store_conn_id=conn_id).store_url
            else:
                url = os.environ.get("DELTA_MIRROR_STORE")
            store = SqlStore(url)
            store.ensure_initialised()
            _STORES[key] = store
        return _STORES[key]


def _stores(config: Any) -> list[SqlStore]:
    ids: list[str | None] = [config.defaults.store_conn_id] if config else [None]
    if config:
        ids += [t.store_conn_id for t in config.tables.values()]
    seen: list[str | None] = []
    for i in ids:
        if i not in seen:
            seen.append(i)
    return [_store_for(i) for i in seen]


def _find(name: str, config: Any) -> tuple[SqlStore, Any]:
    from delta_mirror.errors import TableNotFoundError

    cfg = config.tables.get(name) if config else None
    stores = [_store_for(cfg.store_conn_id)] if cfg else _stores(config)
    for store in stores:
        try:
            return store, store.get_table(name)
        except TableNotFoundError:
            continue
    raise TableNotFoundError(f"no table named '{name}' in the store", table=name)


OVERVIEW_PAGE = 100  # tables per overview page (``?per_page=`` up to ``OVERVIEW_MAX_PAGE``)
OVERVIEW_MAX_PAGE = 1000
_SPARK_POINTS = 48  # the sparkline: the highest version latency of each half hour of the last 24 h


def overview_data(
    page: int = 1, per_page: int = OVERVIEW_PAGE, visible: Callable[[str], bool] | None = None
) -> dict[str, Any]:
    """One page of tables by name, each row with its 24 h sparkline; the verdict and the unhealthy
    count cover every table. A constant number of queries per store whatever the number of tables
    (``fleet_status``, ``lag_peaks`` of the page's tables only)."""
    config = _config()
    per_page = max(1, min(int(per_page), OVERVIEW_MAX_PAGE))
    found: dict[str, tuple[int, Any]] = {}
    stores = _stores(config)
    # only the tables the user may read (``ui_app.TableAccess``): rows, verdict and counts alike
    listed = [[t for t in store.list_tables() if visible is None or visible(t.name)] for store in stores]
    for i, tables in enumerate(listed):
        for t in tables:
            found.setdefault(t.name, (i, t))
    names = sorted(found)
    pages = max(1, math.ceil(len(names) / per_page))
    page = max(1, min(int(page), pages))
    shown = set(names[(page - 1) * per_page : page * per_page])
    now = int(datetime.now(UTC).timestamp() * 1000)
    rows: dict[str, dict[str, Any]] = {}
    unhealthy = 0
    for i, store in enumerate(stores):
        tables = [t for t in listed[i] if found[t.name][0] == i]
        if not tables:
            continue
        page_ids = [t.id for t in tables if t.name in shown]
        # per-version latency from the store's commit and publish times (no sampling gaps), for
        # the page's tables only: the sparkline and the percentiles of each window
        peaks = store.latency_peaks(page_ids, now - _WINDOW_MS["24h"], now, _SPARK_POINTS)
        stats = (  # the percentiles for a page of up to LATENCY_TABLES tables (the default page is 100)
            store.latency_windows(page_ids, {w: now - ms for w, ms in LATENCY_WINDOWS.items()})
            if len(page_ids) <= LATENCY_TABLES
            else {}
        )
        for table, st in zip(tables, fleet_status(store, tables), strict=True):
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
    }


def table_data(name: str, window: str = "24h", versions: int = 200) -> dict[str, Any]:
    """A table page: its latest ``versions`` versions (1..5000) and 50 checkpoints, with the totals."""
    config = _config()
    store, table = _find(name, config)
    return table_detail(
        store,
        table,
        lag_slo_for(config, name),
        window=window,
        versions=max(1, min(versions, 5000)),
        grace=failure_grace_for(config, name),
    )


def health_data(visible: Callable[[str], bool] | None = None) -> dict[str, Any]:
    """The health of the tables ``visible`` accepts (all without it)."""
    config = _config()
    out: dict[str, Any] = {"healthy": True, "tables": []}
    for store in _stores(config):
        report = health_report(store, None, config)
        tables = [t for t in report.tables if visible is None or visible(t.table)]
        out["healthy"] = out["healthy"] and all(t.healthy for t in tables)
        out["tables"] += [t.to_json() for t in tables]
    return out


# -- HTML ------------------------------------------------------------------------------------------

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:16px;color:#1f2933;background:#fff}
h1{font-size:20px;margin:0 0 12px}h2{font-size:16px;margin:20px 0 8px}
table{border-collapse:collapse;width:100%;font-size:13px}
th,td{border-bottom:1px solid #e4e7eb;padding:6px 8px;text-align:left;vertical-align:top}
th{background:#f5f7fa;font-weight:600}td.n{text-align:right;font-variant-numeric:tabular-nums}
.ok{color:#0e7c3a;font-weight:600}.bad{color:#b42318;font-weight:600}
.pill{display:inline-block;padding:1px 8px;border-radius:10px;font-size:12px}
.ACTIVE{background:#e3f8ec;color:#0e7c3a}.HALTED{background:#fde8e8;color:#b42318}
.FAILING{background:#fff3d6;color:#8d5a00;font-weight:600}
.err{color:#b42318}.hint{color:#52606d;font-size:12px;max-width:520px}
.tl{display:flex;flex-wrap:wrap;gap:2px}.v{width:14px;height:14px;border-radius:2px;background:#cbd2d9}
.v.SUCCESS{background:#3ebd73}.v.FAILED{background:#e12d39}.v.CONFLICT{background:#8b0000}
.v.PENDING{background:#cbd2d9}.v.IN_PROGRESS{background:#f0b429}.v.retried{outline:2px solid #f0b429}
a{color:#2f6fde}.muted{color:#7b8794}
"""


def _e(value: Any) -> str:
    return html.escape("-" if value is None else str(value))


# Airflow 3.3 embeds the page in an iframe sandboxed without allow-top-navigation, so target=_top
# links do nothing. The parent is same-origin: push the DAG's URL on its history and tell its router
# (popstate). Times: <time data-ms> shows "2 min ago", the exact UTC time on hover.
_JS = """
document.addEventListener('click', function (e) {
  var a = e.target.closest && e.target.closest('a.af');
  if (!a || window.parent === window) return;
  try {
    var p = window.parent;
    p.history.pushState(p.history.state, '', a.getAttribute('href'));
    p.dispatchEvent(new PopStateEvent('popstate', {state: p.history.state}));
    e.preventDefault();
  } catch (err) { /* not same-origin: a plain link */ }
});
function ago(ms) {
  var s = Math.max(0, (Date.now() - ms) / 1000);
  if (s < 60) return Math.round(s) + ' s ago';
  if (s < 3600) return Math.round(s / 60) + ' min ago';
  if (s < 172800) return Math.round(s / 3600) + ' h ago';
  return Math.round(s / 86400) + ' days ago';
}
function rel() {
  document.querySelectorAll('time[data-ms]').forEach(function (t) {
    t.textContent = ago(Number(t.dataset.ms));
  });
}
rel(); setInterval(rel, 15000);
"""


def _page(title: str, body: str, refresh_s: int | None = None) -> str:
    meta = f"<meta http-equiv='refresh' content='{refresh_s}'>" if refresh_s else ""
    return (
        f"<!doctype html><html lang='en'><head><meta charset='utf-8'>{meta}"
        f"<title>{_e(title)}</title><style>{_CSS}</style></head><body>{body}<script>{_JS}</script></body></html>"
    )


def _when(ms: int | None) -> str:
    """A time as "2 min ago" (by the script), the exact UTC time on hover and without script."""
    if ms is None:
        return "<span class='muted'>-</span>"
    exact = f"{datetime.fromtimestamp(ms / 1000, UTC):%Y-%m-%d %H:%M:%S} UTC"
    return f"<time data-ms='{ms}' title='{exact}'>{exact}</time>"


def sparkline(
    points: list[list[float]],
    slo_seconds: float,
    lag_now: float | None = None,
    width: int = 120,
    height: int = 24,
    now_ms: int | None = None,
) -> str:
    """The last 24 h, small: the highest version latency of each half hour (x: its commit time) and,
    at the right end, the lag right now. y runs from 0 to the SLO or the highest value, whichever is
    higher, so a small lag stays low (a single version is a dot at its height, not at the top)."""
    t1 = now_ms or int(datetime.now(UTC).timestamp() * 1000)
    t0 = t1 - _WINDOW_MS["24h"]
    series = [(float(p[0]), float(p[1])) for p in points if p[0] >= t0]
    if lag_now is not None and (series or lag_now > 0):
        series.append((float(t1), float(lag_now)))
    if not series:
        return "<span class='muted'>no versions in 24 h</span>"
    highest = max(v for _, v in series)
    top = max(highest, slo_seconds, 1.0)
    xy = [((t - t0) / (t1 - t0) * (width - 6) + 3, height - 3 - v / top * (height - 6)) for t, v in series]
    color = "#e12d39" if highest > slo_seconds else "#2f6fde"
    line = (
        f"<polyline fill='none' stroke='{color}' stroke-width='1.2' "
        f"points='{' '.join(f'{x:.1f},{y:.1f}' for x, y in xy)}'/>"
        if len(xy) > 1
        else ""
    )
    return (
        f"<svg class='spark' width='{width}' height='{height}' role='img' data-top='{top:g}' "
        f"aria-label='version latency over the last 24 h'>"
        f"<title>last 24 h: highest version latency {highest:.1f} s (SLO {slo_seconds:.0f} s)"
        f"{'' if lag_now is None else f', lag now {lag_now:.1f} s'}</title>"
        f"<line x1='3' x2='{width - 3}' y1='{height - 3}' y2='{height - 3}' stroke='#e4e7eb'/>{line}"
        f"<circle cx='{xy[-1][0]:.1f}' cy='{xy[-1][1]:.1f}' r='2' fill='{color}'/></svg>"
    )


def _latency_text(stats: dict[str, Any] | None, q: str) -> str:
    return "<span class='muted'>-</span>" if not stats else f"{float(stats[q]):.1f}"


def _dag_link(dag_id: str | None, text: str | None) -> str:
    """A link to the table's DAG; a table without a config entry has none (no dead link)."""
    if not dag_id:
        return "<span class='muted no-dag' title='not in the table config: no DAG publishes it'>no DAG</span>"
    return f"<a class='af' href='/dags/{quote(dag_id, safe='')}'>{_e(text)}</a>"


def _error_cell(text: Any) -> str:
    return f"<td class='err'>{_e(text)}</td>" if text else "<td class='muted'>-</td>"


def overview_html(data: dict[str, Any]) -> str:
    rows = []
    for r in data["tables"]:
        name = quote(r["table"], safe="")
        error = ""
        if r["halted_reason"]:
            error += f"<div class='err'>halted: {_e(r['halted_reason'])}</div>"
        if r.get("failure"):
            error += f"<div class='err failing'>{_e(failure_text(r['failure']))}</div>"
            if r.get("failure_troubleshooting"):
                error += f"<div class='hint'>{_e(r['failure_troubleshooting'])}</div>"
        if r["last_error"]:
            error += f"<div class='err'>[{_e(r['last_error_class'])}] {_e(r['last_error'])}</div>"
            if r["troubleshooting"]:
                error += f"<div class='hint'>{_e(r['troubleshooting'])}</div>"
        verdict = "<span class='ok'>OK</span>" if r["healthy"] else "<span class='bad'>UNHEALTHY</span>"
        if r.get("failure"):  # failing attempts: never "OK", even within the failure grace
            verdict = "<span class='pill FAILING'>FAILING</span>" + (
                "" if r["healthy"] else " <span class='bad'>UNHEALTHY</span>"
            )
        rows.append(
            "<tr>"
            f"<td><a href='{URL_PREFIX}/tables/{name}'>{_e(r['table'])}</a></td>"
            f"<td><span class='pill {_e(r['state'])}'>{_e(r['state'])}</span> {verdict}"
            + (
                f" <span class='pill HALTED'>breaker {_e(r['breaker'])}</span>"
                if r.get("breaker", "CLOSED") != "CLOSED"
                else ""
            )
            + "</td>"
            f"<td class='n'>{_e(r['latest_committed'])}</td><td class='n'>{_e(r['last_published'])}</td>"
            f"<td class='n'>{r['lag_seconds']:.1f}</td>"
            f"<td>{sparkline(r.get('lag_24h', []), r['lag_slo_seconds'], r['lag_seconds'])}</td>"
            f"<td class='n p95'>{_latency_text((r.get('latency') or {}).get('24h'), 'p95')}</td>"
            f"<td class='n'>{r['versions_behind']}</td>"
            f"<td class='n'>{r['lag_slo_seconds']:.0f} s</td>"
            f"<td class='n'>{_e(r['last_checkpoint'])}</td><td>{error or '<span class=muted>none</span>'}</td>"
            f"<td>{_dag_link(r['dag_id'], r['dag_id'])}</td>"
            "</tr>"
        )
    table = (
        "<table id='overview'><thead><tr><th>Table</th><th>State</th><th>Committed</th><th>Published</th>"
        "<th>Lag (s)</th><th>Latency, 24h</th><th title='commit to readable, 95th percentile of the versions "
        "committed in the last 24 h'>p95 (s)</th><th>Behind</th><th>Lag SLO</th><th>Checkpoint</th><th>Last error</th><th>DAG</th>"
        "</tr></thead><tbody>" + "".join(rows) + "</tbody></table>"
        if rows
        else "<p id='no-tables'>No tables in the store yet, or none whose DAG you may read.</p>"
    )
    overall = (
        "<span class='ok'>all healthy</span>" if data["healthy"] else "<span class='bad'>unhealthy</span>"
    )
    total = data.get("total", len(data["tables"]))
    unhealthy = data.get("unhealthy", 0)
    if not data["healthy"] and unhealthy:
        overall = f"<span class='bad'>{unhealthy} unhealthy</span>"
    return _page(
        "Delta Mirror",
        f"<h1>Delta Mirror</h1><p>{total} table(s), {overall}. "
        f"<span class='muted'>as of {_e(str(data['generated_at'])[11:19])} UTC, refreshed every minute · "
        f"<a href='{URL_PREFIX}/api/overview'>JSON</a></span></p>{_pager(data)}{table}{_pager(data)}",
        refresh_s=60,
    )


def _pager(data: dict[str, Any]) -> str:
    """ "tables 101-200 of 1000" with the previous / next pages; nothing when one page holds them all."""
    page, pages, per_page = data.get("page", 1), data.get("pages", 1), data.get("per_page", OVERVIEW_PAGE)
    if pages <= 1:
        return ""
    first = (page - 1) * per_page + 1
    links = [
        f"<a href='{URL_PREFIX}/?page={p}&amp;per_page={per_page}'>{label}</a>"
        for p, label in ((page - 1, "&larr; previous"), (page + 1, "next &rarr;"))
        if 1 <= p <= pages
    ]
    return (
        f"<p class='pager'>tables {first}-{first + len(data['tables']) - 1} of {data['total']} "
        f"(page {page} of {pages}) · {' · '.join(links)}</p>"
    )


_WINDOW_MS = {"1h": 3_600_000, "24h": 86_400_000, "7d": 7 * 86_400_000}


def nice_ticks(top: float, count: int = 4) -> list[float]:
    """Round y-axis ticks (1, 2, 2.5 or 5 times a power of ten) from 0 to at least ``top``."""
    raw = max(top, 1e-9) / count
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= raw)
    return [round(step * i, 12) for i in range(math.ceil(top / step - 1e-9) + 1)] if top > 0 else [0.0, 1.0]


def _tick_label(v: float) -> str:
    return f"{v:.0f}" if v == int(v) else f"{v:g}"


#: More versions than this in the window: one point per pixel column (the column's highest latency).
CHART_DOTS = 600


def _column_peaks(points: list[tuple[float, float, Any]]) -> list[tuple[float, float, Any]]:
    """Per whole pixel column, the point of highest value: a spike survives any number of versions."""
    best: dict[int, tuple[float, float, Any]] = {}
    for p in points:
        col = int(p[0])
        if col not in best or p[1] > best[col][1]:
            best[col] = p
    return [best[c] for c in sorted(best)]


def lag_chart_svg(
    latency: dict[str, Any],
    slo_seconds: float,
    window: str = "24h",
    now_ms: int | None = None,
    width: int = 900,
    height: int = 260,
) -> str:
    """Lag over the window, from the store: each version's commit-to-readable seconds at its commit
    time (a circle; hollow: not published yet, seconds so far), joined, on the left axis (0 up to
    round ticks above the highest); the versions behind over time, reconstructed from the versions'
    commit and publish times, as a grey step line on the right axis; the SLO dashed when in range.
    x: from the window's first version (its start when versions were behind then) to now, so a
    burst of seconds is not one vertical line on a day-wide axis."""
    left, right, top, bottom = 60, 50, 18, 30
    w, h = width - left - right, height - top - bottom
    svg = (
        f"<svg id='lag-chart' xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height}' "
        f"role='img' aria-label='version latency and versions behind over the last {_e(window)}'"
    )
    versions = latency.get("versions") or []
    t1 = int(latency.get("until") or now_ms or datetime.now(UTC).timestamp() * 1000)
    t0 = int(latency.get("since") or t1 - _WINDOW_MS.get(window, _WINDOW_MS["24h"]))
    if not versions:
        return (
            f"{svg} data-t0='{t0}' data-t1='{t1}'><text x='{left}' y='{height // 2}' fill='#7b8794'>"
            "no version committed in this window</text></svg>"
        )
    behind = latency.get("behind") or [[t0, 0], [t1, 0]]
    first = t0 if int(behind[0][1]) > 0 else min(int(v["committed_at"]) for v in versions)
    span = max(t1 - first, 30_000)
    x0 = max(t0, t1 - int(span * 1.05))  # a little room before the first version
    highest = max(float(v["latency_seconds"]) for v in versions)
    ticks_at = nice_ticks(max(highest, 1.0))
    top_value = ticks_at[-1]
    behind_top = nice_ticks(max(max(int(b[1]) for b in behind), 1), 2)[-1]

    def x(t: float) -> float:
        return float(left + (min(max(t, x0), t1) - x0) / max(1, t1 - x0) * w)

    def y(v: float) -> float:
        return top + h - v / top_value * h

    def yb(n: float) -> float:
        return top + h - n / behind_top * h

    pts = [(x(v["committed_at"]), float(v["latency_seconds"]), v) for v in versions]
    if len(pts) > CHART_DOTS:
        pts = _column_peaks(pts)
    line = " ".join(f"{px:.1f},{y(val):.1f}" for px, val, _ in pts)

    def dot(px: float, val: float, v: dict[str, Any]) -> str:
        at = f"{datetime.fromtimestamp(v['committed_at'] / 1000, UTC):%Y-%m-%d %H:%M:%S} UTC"
        color = "#e12d39" if val > slo_seconds else "#2f6fde"
        fill, what = (
            (color, f"readable after {val:.1f} s")
            if v["published"]
            else ("#fff", f"not published yet, {val:.1f} s so far")
        )
        return (
            f"<circle class='v' data-version='{v['version']}' data-seconds='{val:g}' cx='{px:.1f}' "
            f"cy='{y(val):.1f}' r='3' fill='{fill}' stroke='{color}'><title>version {v['version']} committed "
            f"{at}: {what}</title></circle>"
        )

    dots = "".join(dot(px, val, v) for px, val, v in pts)
    # versions behind: a step line; per pixel column up to its highest count, then on from its last
    cols: dict[int, list[int]] = {}  # column -> [highest, last]
    for at, n in behind:
        col = cols.setdefault(int(x(at)), [int(n), int(n)])
        col[0], col[1] = max(col[0], int(n)), int(n)
    steps: list[str] = []
    prev: int | None = None
    for c in sorted(cols):
        highest_n, last_n = cols[c]
        if prev is not None:
            steps.append(f"{c:.1f},{yb(prev):.1f}")
        steps += [f"{c:.1f},{yb(highest_n):.1f}", f"{c:.1f},{yb(last_n):.1f}"]
        prev = last_n
    steps.append(f"{left + w:.1f},{yb(prev or 0):.1f}")
    ticks = "".join(
        f"<line x1='{left}' x2='{left + w}' y1='{y(v):.1f}' y2='{y(v):.1f}' stroke='#e4e7eb'/>"
        f"<text class='ytick' x='{left - 6}' y='{y(v) + 4:.1f}' text-anchor='end' font-size='11' "
        f"fill='#52606d'>{_tick_label(v)}</text>"
        for v in ticks_at
    )
    right_ticks = "".join(
        f"<text class='btick' x='{left + w + 6}' y='{yb(n) + 4:.1f}' font-size='11' fill='#7b8794'>"
        f"{_tick_label(n)}</text>"
        for n in nice_ticks(behind_top, 2)
    )
    fmt = "%m-%d %H:%M" if t1 - x0 > 3_600_000 else "%H:%M:%S"
    labels = (
        f"<text class='xtick' data-ms='{x0}' x='{left}' y='{height - 8}' font-size='11' fill='#52606d'>"
        f"{datetime.fromtimestamp(x0 / 1000, UTC):{fmt}}</text>"
        f"<text class='xtick' data-ms='{t1}' x='{left + w}' y='{height - 8}' font-size='11' fill='#52606d' "
        f"text-anchor='end'>{datetime.fromtimestamp(t1 / 1000, UTC):{fmt}} UTC</text>"
    )
    if slo_seconds <= top_value:
        slo = (
            f"<line id='slo-line' x1='{left}' x2='{left + w}' y1='{y(slo_seconds):.1f}' y2='{y(slo_seconds):.1f}' "
            f"stroke='#e12d39' stroke-dasharray='6 4'/><text x='{left + w - 4}' y='{y(slo_seconds) - 4:.1f}' "
            f"text-anchor='end' font-size='11' fill='#e12d39'>SLO {slo_seconds:.0f} s</text>"
        )
    else:
        slo = (
            f"<text id='slo-note' x='{left + w}' y='12' text-anchor='end' font-size='11' fill='#52606d'>"
            f"SLO {slo_seconds:.0f} s, above this range</text>"
        )
    mid = f"{top + h / 2:.0f}"
    return (
        f"{svg} data-t0='{t0}' data-t1='{t1}' data-x0='{x0}' data-ymax='{top_value:g}' "
        f"data-behind-max='{behind_top:g}' "
        f"data-top='{top}' data-plot-height='{h}'>{ticks}{right_ticks}{slo}"
        f"<polyline id='behind-line' fill='none' stroke='#9aa5b1' stroke-width='1.2' points='{' '.join(steps)}'/>"
        f"<polyline id='latency-line' fill='none' stroke='#2f6fde' stroke-width='1.5' points='{line}'/>{dots}{labels}"
        f"<text x='12' y='{mid}' font-size='11' fill='#52606d' transform='rotate(-90 12 {mid})' "
        f"text-anchor='middle'>commit to readable (s)</text>"
        f"<text x='{width - 8}' y='{mid}' font-size='11' fill='#7b8794' transform='rotate(90 {width - 8} {mid})' "
        f"text-anchor='middle'>versions behind</text></svg>"
    )


def table_html(d: dict[str, Any]) -> str:
    cells = "".join(
        f"<div class='v {_e(v['state'])}{' retried' if v['retried'] else ''}' data-version='{v['version']}' "
        f"title='version {v['version']}: {_e(v['state'])}, {v['attempts']} attempt(s)"
        f"{(' — [' + _e(v['error_class']) + '] ' + _e(v['last_error'])) if v['last_error'] else ''}'></div>"
        for v in d["versions"]
    )
    problems = [v for v in d["versions"] if v["state"] in ("FAILED", "CONFLICT") or v["retried"]]
    problem_rows = "".join(
        f"<tr><td class='n'>{v['version']}</td><td>{_e(v['state'])}</td><td class='n'>{v['attempts']}</td>"
        f"<td>{_e(v['error_class'])}</td>{_error_cell(v['last_error'])}"
        f"<td>{_when(v['finished_at'])}</td></tr>"
        for v in problems
    )
    cps = "".join(
        f"<tr><td class='n'>{c['version']}</td><td>{_e(c['state'])}</td><td class='n'>{c['writes']}</td>"
        f"<td>{_when(c['finished_at'])}</td>{_error_cell(c['last_error'])}</tr>"
        for c in reversed(d["checkpoints"])
    )
    error = ""
    if d["halted_reason"]:
        error += f"<p class='err'>Halted: {_e(d['halted_reason'])}</p>"
    if d.get("failure"):
        grace = d.get("failure_grace") or {}
        error += (
            f"<p class='err' id='failure'><span class='pill FAILING'>FAILING</span> "
            f"{_e(failure_text(d['failure']))} <span class='muted'>(unhealthy after "
            f"{_e(grace.get('attempts'))} attempt(s) or {float(grace.get('seconds', 0)):.0f} s)</span></p>"
        )
        if d.get("failure_troubleshooting"):
            error += f"<p class='hint'>{_e(d['failure_troubleshooting'])}</p>"
    if d["last_error"]:
        error += f"<p class='err'>Last error [{_e(d['last_error_class'])}]: {_e(d['last_error'])}</p>"
        if d["troubleshooting"]:
            error += f"<p class='hint'>{_e(d['troubleshooting'])}</p>"
    name = quote(d["table"], safe="")
    body = (
        f"<p><a href='{URL_PREFIX}/'>&larr; all tables</a></p><h1>{_e(d['table'])}</h1>"
        f"<p><span class='pill {_e(d['state'])}'>{_e(d['state'])}</span> "
        f"committed {_e(d['latest_committed'])} · published {_e(d['last_published'])} · "
        f"lag {d['lag_seconds']:.1f} s ({d['versions_behind']} behind, SLO {d['lag_slo_seconds']:.0f} s) · "
        f"checkpoint {_e(d['last_checkpoint'])} · <span class='muted'>{_e(d['location'])}</span> · "
        f"{_dag_link(d['dag_id'], 'DAG')} · "
        f"<a href='{URL_PREFIX}/api/tables/{name}'>JSON</a></p>{error}"
        f"<h2>Lag over time</h2><p id='windows'>"
        + " · ".join(
            f"<b>last {w}</b>"
            if w == d["lag_window"]
            else f"<a href='{URL_PREFIX}/tables/{name}?window={w}'>last {w}</a>"
            for w in ("1h", "24h", "7d")
        )
        + f"</p>{_latency_html(d)}"
        + lag_chart_svg(d["version_latency"], d["lag_slo_seconds"], d["lag_window"])
        + _validation_html(d.get("last_validation"))
        + f"<h2>Versions (latest {len(d['versions'])} of {d.get('versions_total', len(d['versions']))})</h2>"
        "<p class='muted'>green published · grey pending · amber in progress · red failed · dark red "
        "conflict · amber outline: retried</p>"
        f"<div class='tl' id='timeline'>{cells}</div>"
        "<h2>Failed and retried versions</h2>"
        + (
            "<table id='problems'><thead><tr><th>Version</th><th>State</th><th>Attempts</th><th>Class</th>"
            f"<th>Error</th><th>Finished</th></tr></thead><tbody>{problem_rows}</tbody></table>"
            if problem_rows
            else "<p class='muted'>none</p>"
        )
        + f"<h2>Checkpoints (latest {len(d['checkpoints'])} of {d.get('checkpoints_total', len(d['checkpoints']))})</h2>"
        + (
            "<table id='checkpoints'><thead><tr><th>Version</th><th>State</th>"
            "<th title='times written, deliberate rewrites (delta-mirror checkpoint) included'>Writes</th>"
            f"<th>Written</th><th>Error</th></tr></thead><tbody>{cps}</tbody></table>"
            if cps
            else "<p class='muted'>none yet</p>"
        )
    )
    return _page(f"Delta Mirror: {d['table']}", body)


def _latency_html(d: dict[str, Any]) -> str:
    """The percentiles of each window: seconds from a version's commit to its file being readable."""
    cells = []
    for w, stats in (d.get("latency") or {}).items():
        if not stats:
            cells.append(f"<td>{_e(w)}</td><td colspan='4' class='muted'>no version published</td>")
            continue
        cells.append(
            f"<td>{_e(w)}</td><td class='n'>{stats['versions']}</td>"
            + "".join(f"<td class='n'>{float(stats[q]):.1f}</td>" for q in ("p50", "p95", "p99", "max"))
        )
    lat = d.get("version_latency") or {}
    cut = (
        " <span class='muted'>(the newest versions of the window only)</span>" if lat.get("truncated") else ""
    )
    return (
        "<table id='latency' style='width:auto'><thead><tr><th>Committed in the last</th><th>Versions</th>"
        "<th>p50 (s)</th><th>p95 (s)</th><th>p99 (s)</th><th>max (s)</th></tr></thead><tbody>"
        + "".join(f"<tr>{c}</tr>" for c in cells)
        + "</tbody></table><p class='muted'>Each version's time from its commit in the store to its commit "
        f"file read back at the location (readable), from the store's own times.{cut}</p>"
    )


def _validation_html(v: dict[str, Any] | None) -> str:
    if not v:
        return "<h2>Validation</h2><p class='muted' id='validation'>not validated yet</p>"
    verdict = "OK" if v["ok"] else f"{v['problem_count']} problem(s)"
    rows = "".join(
        f"<li><b>[{_e(p.get('kind'))}]</b> version {_e(p.get('version'))}: {_e(p.get('message'))} "
        f"<span class='hint'>— {_e(p.get('hint'))}</span></li>"
        for p in v.get("problems") or []
    )
    return (
        f"<h2>Validation</h2><p id='validation'>{_when(v['at'])}: versions {_e(v['from_version'])}.."
        f"{_e(v['to_version'])} with {_e(v['reader'])}: <b class='{'ok' if v['ok'] else 'err'}'>{verdict}</b></p>"
        + (f"<ul class='err'>{rows}</ul>" if rows else "")
    )


# -- the app and the plugin ------------------------------------------------------------------------


def create_app() -> Any:
    """The plugin's FastAPI app: routes, login and per-table authorization are ``ui_app``."""
    import sys

    from delta_mirror.airflow.ui_app import create_app as build

    return build(sys.modules[__name__])  # this module's data and HTML functions


class DeltaMirrorPlugin(AirflowPlugin):
    """Registered by ``plugins/delta_mirror_plugin.py`` (Airflow's plugins folder)."""

    name = "delta_mirror"
    fastapi_apps: list[Any] = [  # noqa: RUF012  # AirflowPlugin declares it an instance attribute
        {"app": create_app(), "url_prefix": URL_PREFIX, "name": "Delta Mirror"}
    ]
    external_views: list[Any] = [  # noqa: RUF012  # as fastapi_apps
        {
            "name": "Delta Mirror",
            "href": f"{URL_PREFIX}/",
            "destination": "nav",
            "url_route": "delta-mirror",
        }
    ]


__all__ = [
    "DEFAULT_LAG_SLO",
    "URL_PREFIX",
    "DeltaMirrorPlugin",
    "create_app",
    "health_data",
    "lag_chart_svg",
    "overview_data",
    "overview_html",
    "table_data",
    "table_html",
]
