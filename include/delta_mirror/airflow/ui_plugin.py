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
    health_report,
    lag_slo_for,
    overview_row_of,
    table_detail,
)
from delta_mirror.health.status import fleet_status
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
_SPARK_POINTS = 48  # the sparkline: the highest lag of each half hour of the last 24 h


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
        page_tables = [t for t in tables if t.name in shown]
        peaks = store.lag_peaks([t.id for t in page_tables], now - _WINDOW_MS["24h"], now, _SPARK_POINTS)
        for table, st in zip(tables, fleet_status(store, tables), strict=True):
            row = overview_row_of(st, lag_slo_for(config, table.name))
            unhealthy += not row["healthy"]
            if table.name in shown:
                row["lag_24h"] = peaks.get(table.id, [])
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
        store, table, lag_slo_for(config, name), window=window, versions=max(1, min(versions, 5000))
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


def sparkline(points: list[list[float]], slo_seconds: float, width: int = 120, height: int = 24) -> str:
    """The last 24h of lag, small, from the first sample to now (the table page has the whole window)."""
    if not points:
        return "<span class='muted'>no samples</span>"
    t1 = max(int(datetime.now(UTC).timestamp() * 1000), int(points[-1][0]))
    t0 = min(int(points[0][0]), t1 - 60_000)
    top = max(max(p[1] for p in points), 1.0)
    xy = [((p[0] - t0) / (t1 - t0) * (width - 6) + 3, height - 3 - p[1] / top * (height - 6)) for p in points]
    color = "#e12d39" if points[-1][1] > slo_seconds else "#2f6fde"
    since = datetime.fromtimestamp(t0 / 1000, UTC)
    return (
        f"<svg class='spark' width='{width}' height='{height}' role='img' aria-label='lag since {since:%H:%M} UTC'>"
        f"<title>lag since {since:%Y-%m-%d %H:%M} UTC: {len(points)} sample(s), highest {top:.0f} s, "
        f"last {points[-1][1]:.0f} s</title>"
        f"<polyline fill='none' stroke='{color}' stroke-width='1.2' "
        f"points='{' '.join(f'{x:.1f},{y:.1f}' for x, y in xy)}'/>"
        f"<circle cx='{xy[-1][0]:.1f}' cy='{xy[-1][1]:.1f}' r='2' fill='{color}'/></svg>"
    )


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
        if r["last_error"]:
            error += f"<div class='err'>[{_e(r['last_error_class'])}] {_e(r['last_error'])}</div>"
            if r["troubleshooting"]:
                error += f"<div class='hint'>{_e(r['troubleshooting'])}</div>"
        verdict = "<span class='ok'>OK</span>" if r["healthy"] else "<span class='bad'>UNHEALTHY</span>"
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
            f"<td class='n'>{r['lag_seconds']:.1f}</td><td>{sparkline(r.get('lag_24h', []), r['lag_slo_seconds'])}</td>"
            f"<td class='n'>{r['versions_behind']}</td>"
            f"<td class='n'>{r['lag_slo_seconds']:.0f} s</td>"
            f"<td class='n'>{_e(r['last_checkpoint'])}</td><td>{error or '<span class=muted>none</span>'}</td>"
            f"<td>{_dag_link(r['dag_id'], r['dag_id'])}</td>"
            "</tr>"
        )
    table = (
        "<table id='overview'><thead><tr><th>Table</th><th>State</th><th>Committed</th><th>Published</th>"
        "<th>Lag (s)</th><th>Lag, 24h</th><th>Behind</th><th>Lag SLO</th><th>Checkpoint</th><th>Last error</th><th>DAG</th>"
        "</tr></thead><tbody>" + "".join(rows) + "</tbody></table>"
        if rows
        else "<p>No tables in the store yet.</p>"
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


_WINDOW_MS = {"24h": 86_400_000, "7d": 7 * 86_400_000}


def nice_ticks(top: float, count: int = 4) -> list[float]:
    """Round y-axis ticks (1, 2, 2.5 or 5 times a power of ten) from 0 to at least ``top``."""
    raw = max(top, 1e-9) / count
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= raw)
    return [round(step * i, 12) for i in range(math.ceil(top / step - 1e-9) + 1)] if top > 0 else [0.0, 1.0]


def _tick_label(v: float) -> str:
    return f"{v:.0f}" if v == int(v) else f"{v:g}"


def lag_chart_svg(
    samples: list[dict[str, Any]],
    slo_seconds: float,
    window: str = "24h",
    now_ms: int | None = None,
    width: int = 900,
    height: int = 260,
) -> str:
    """Lag over the chosen window (x: the whole window, ending now; y: fitted to the samples with round
    ticks), the points joined; the SLO as a dashed line when it is in range, else noted above."""
    left, right, top, bottom = 60, 10, 18, 30
    w, h = width - left - right, height - top - bottom
    svg = (
        f"<svg id='lag-chart' xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height}' "
        f"role='img' aria-label='lag over the last {_e(window)}'"
    )
    if not samples:
        return (
            f"{svg}><text x='{left}' y='{height // 2}' fill='#7b8794'>"
            "no lag samples yet (the monitor DAG and each table DAG record one per run)</text></svg>"
        )
    t1 = max(now_ms or int(datetime.now(UTC).timestamp() * 1000), samples[-1]["sampled_at"])
    t0 = t1 - _WINDOW_MS.get(window, _WINDOW_MS["24h"])
    highest = max(s["lag_seconds"] for s in samples)
    ticks_at = nice_ticks(highest if highest > 0 else 1.0)
    top_value = ticks_at[-1]

    def x(t: int) -> float:
        return float(left + (t - t0) / (t1 - t0) * w)

    def y(v: float) -> float:
        return top + h - v / top_value * h

    points = " ".join(f"{x(s['sampled_at']):.1f},{y(s['lag_seconds']):.1f}" for s in samples)
    dots = "".join(
        f"<circle cx='{x(s['sampled_at']):.1f}' cy='{y(s['lag_seconds']):.1f}' r='3' "
        f"fill='{'#e12d39' if s['lag_seconds'] > slo_seconds else '#2f6fde'}'><title>"
        f"{datetime.fromtimestamp(s['sampled_at'] / 1000, UTC):%Y-%m-%d %H:%M:%S} UTC: "
        f"{s['lag_seconds']:.1f} s, {s['versions_behind']} behind</title></circle>"
        for s in samples
    )
    ticks = "".join(
        f"<line x1='{left}' x2='{left + w}' y1='{y(v):.1f}' y2='{y(v):.1f}' stroke='#e4e7eb'/>"
        f"<text class='ytick' x='{left - 6}' y='{y(v) + 4:.1f}' text-anchor='end' font-size='11' "
        f"fill='#52606d'>{_tick_label(v)}</text>"
        for v in ticks_at
    )
    fmt = "%m-%d %H:%M"
    labels = (
        f"<text class='xtick' data-ms='{t0}' x='{left}' y='{height - 8}' font-size='11' fill='#52606d'>"
        f"{datetime.fromtimestamp(t0 / 1000, UTC):{fmt}}</text>"
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
    return (
        f"{svg} data-t0='{t0}' data-t1='{t1}' data-ymax='{top_value:g}'>{ticks}{slo}"
        f"<polyline fill='none' stroke='#2f6fde' stroke-width='1.5' points='{points}'/>{dots}{labels}"
        f"<text x='12' y='{top + h / 2:.0f}' font-size='11' fill='#52606d' "
        f"transform='rotate(-90 12 {top + h / 2:.0f})' text-anchor='middle'>lag (s)</text></svg>"
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
            for w in ("24h", "7d")
        )
        + f"</p>{lag_chart_svg(d['lag_history'], d['lag_slo_seconds'], d['lag_window'])}"
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
    from delta_mirror.airflow.ui_app import create_app as build

    return build()


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
