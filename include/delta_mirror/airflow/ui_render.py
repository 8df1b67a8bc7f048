"""The "Delta Mirror" pages' HTML: Jinja2 templates (``ui_templates/``) over the data of
``delta_mirror.health.pages``, with the style and script of ``ui_static/`` inlined.

Everything a page prints from the store is escaped by the templates' autoescape; what is computed
here is the charts' geometry (coordinates, ticks, one point per pixel column), which the SVG
templates draw. No JavaScript chart library and no CDN: the charts are inline SVG.
"""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime
from functools import cache
from importlib.resources import files
from typing import Any
from urllib.parse import quote

from jinja2 import Environment, PackageLoader, StrictUndefined
from jinja2.ext import Extension
from markupsafe import Markup

from delta_mirror.health.coverage import NOT_CONFIGURED, NOT_IN_STORE
from delta_mirror.health.monitoring import failure_text
from delta_mirror.health.pages import OVERVIEW_PAGE
from delta_mirror.health.status import LATENCY_WINDOWS

#: Where Airflow's API server mounts the plugin's app.
URL_PREFIX = "/delta-mirror"
#: More versions than this in the window: one point per pixel column (the column's highest latency).
CHART_DOTS = 600


class _JoinLines(Extension):
    """Templates are written one element a line, but a page is sent as one line (as tests and
    scripts compare it): a line break and the indentation after it are not output; a space that
    must start a line is written ``{{ ' ' }}``."""

    def preprocess(self, source: str, name: str | None, filename: str | None = None) -> str:
        return re.sub(r"\n[ \t]*", "", source)


def _dash(value: Any) -> Any:
    return "-" if value is None else value


def _utc(ms: int) -> str:
    return f"{datetime.fromtimestamp(ms / 1000, UTC):%Y-%m-%d %H:%M:%S} UTC"


def _points(xy: list[tuple[float, float]]) -> str:
    return " ".join(f"{x:.1f},{y:.1f}" for x, y in xy)


@cache
def _static(name: str) -> Markup:
    """A file of ``ui_static/`` (package data), ours and trusted: inlined as it is."""
    return Markup(files("delta_mirror.airflow").joinpath("ui_static", name).read_text(encoding="utf-8"))


@cache
def _env() -> Environment:
    env = Environment(
        loader=PackageLoader("delta_mirror.airflow", "ui_templates"),
        autoescape=True,  # every template, .svg included
        auto_reload=False,  # package data: no stat of every template at every render
        undefined=StrictUndefined,
        extensions=[_JoinLines],
    )
    env.filters.update(
        dash=_dash, utc=_utc, points=_points, fmt=format, path=lambda v: quote(str(v), safe="")
    )
    env.globals.update(
        url_prefix=URL_PREFIX,
        default_per_page=OVERVIEW_PAGE,
        css=_static("delta_mirror.css"),
        js=_static("delta_mirror.js"),
        failure_text=failure_text,
        not_configured=NOT_CONFIGURED,
        not_in_store=NOT_IN_STORE,
        sparkline=sparkline,
        lag_chart_svg=lag_chart_svg,
    )
    return env


def _render(template: str, **context: Any) -> Markup:
    return Markup(_env().get_template(template).render(**context))


def overview_html(data: dict[str, Any]) -> str:
    """The overview page of ``pages.overview_data``."""
    return str(_render("overview.html", data=data))


def table_html(d: dict[str, Any]) -> str:
    """A table's page of ``pages.table_data``."""
    return str(_render("table.html", d=d))


def error_html(title: str, detail: Any) -> str:
    """A refusal (403, 404, ...) as a page with the way back to the overview."""
    return str(_render("error.html", title=title, detail=detail))


def sparkline(
    points: list[list[float]],
    slo_seconds: float,
    lag_now: float | None = None,
    width: int = 120,
    height: int = 24,
    now_ms: int | None = None,
) -> Markup:
    """The last 24 h, small: the highest version latency of each half hour (x: its commit time) and,
    at the right end, the lag right now. y runs from 0 to the SLO or the highest value, whichever is
    higher, so a small lag stays low (a single version is a dot at its height, not at the top)."""
    t1 = now_ms or int(datetime.now(UTC).timestamp() * 1000)
    t0 = t1 - LATENCY_WINDOWS["24h"]
    series = [(float(p[0]), float(p[1])) for p in points if p[0] >= t0]
    if lag_now is not None and (series or lag_now > 0):
        series.append((float(t1), float(lag_now)))
    s: dict[str, Any] = {"xy": [], "width": width, "height": height, "slo": slo_seconds, "lag_now": lag_now}
    if series:
        s["highest"] = max(v for _, v in series)
        s["top"] = top = max(s["highest"], slo_seconds, 1.0)
        s["xy"] = [
            ((t - t0) / (t1 - t0) * (width - 6) + 3, height - 3 - v / top * (height - 6)) for t, v in series
        ]
        s["color"] = "#e12d39" if s["highest"] > slo_seconds else "#2f6fde"
    return _render("sparkline.svg", s=s)


def nice_ticks(top: float, count: int = 4) -> list[float]:
    """Round y-axis ticks (1, 2, 2.5 or 5 times a power of ten) from 0 to at least ``top``."""
    raw = max(top, 1e-9) / count
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= raw)
    return [round(step * i, 12) for i in range(math.ceil(top / step - 1e-9) + 1)] if top > 0 else [0.0, 1.0]


def _tick_label(v: float) -> str:
    return f"{v:.0f}" if v == int(v) else f"{v:g}"


def _column_peaks(points: list[tuple[float, float, Any]]) -> list[tuple[float, float, Any]]:
    """Per whole pixel column, the point of highest value: a spike survives any number of versions."""
    best: dict[int, tuple[float, float, Any]] = {}
    for p in points:
        col = int(p[0])
        if col not in best or p[1] > best[col][1]:
            best[col] = p
    return [best[c] for c in sorted(best)]


def _behind_steps(behind: list[list[int]], x: Any, yb: Any, right: float) -> list[tuple[float, float]]:
    """Versions behind as a step line: per pixel column up to its highest count, then on from its last."""
    cols: dict[int, list[int]] = {}  # column -> [highest, last]
    for at, n in behind:
        col = cols.setdefault(int(x(at)), [int(n), int(n)])
        col[0], col[1] = max(col[0], int(n)), int(n)
    steps: list[tuple[float, float]] = []
    prev: int | None = None
    for c in sorted(cols):
        highest_n, last_n = cols[c]
        if prev is not None:
            steps.append((c, yb(prev)))
        steps += [(c, yb(highest_n)), (c, yb(last_n))]
        prev = last_n
    steps.append((right, yb(prev or 0)))
    return steps


def _dot(px: float, py: float, val: float, v: dict[str, Any], slo_seconds: float) -> tuple[Any, ...]:
    """One version's circle, its numbers formatted here (up to ~800 a chart: the template only
    prints them): version, seconds, cx, cy, fill, stroke, its tooltip."""
    color = "#e12d39" if val > slo_seconds else "#2f6fde"
    fill, what = (
        (color, f"readable after {val:.1f} s")
        if v["published"]
        else ("#fff", f"not published yet, {val:.1f} s so far")
    )
    tip = f"version {v['version']} committed {_utc(v['committed_at'])}: {what}"
    return v["version"], f"{val:g}", f"{px:.1f}", f"{py:.1f}", fill, color, tip


def lag_chart_svg(
    latency: dict[str, Any],
    slo_seconds: float,
    window: str = "24h",
    now_ms: int | None = None,
    width: int = 900,
    height: int = 260,
) -> Markup:
    """Lag over the window, from the store: each version's commit-to-readable seconds at its commit
    time (a circle; hollow: not published yet, seconds so far), joined, on the left axis (0 up to
    round ticks above the highest); the versions behind over time, reconstructed from the versions'
    commit and publish times, as a grey step line on the right axis; the SLO dashed when in range.
    x: from the window's first version (its start when versions were behind then) to now, so a
    burst of seconds is not one vertical line on a day-wide axis."""
    left, right, top, bottom = 60, 50, 18, 30
    w, h = width - left - right, height - top - bottom
    versions = latency.get("versions") or []
    t1 = int(latency.get("until") or now_ms or datetime.now(UTC).timestamp() * 1000)
    t0 = int(latency.get("since") or t1 - LATENCY_WINDOWS.get(window, LATENCY_WINDOWS["24h"]))
    c: dict[str, Any] = {"width": width, "height": height, "window": window, "t0": t0, "t1": t1}
    c.update(left=left, right=left + w, top=top, h=h, dots=[], slo=slo_seconds)
    if not versions:
        return _render("lag_chart.svg", c=c)
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
    fmt = "%m-%d %H:%M" if t1 - x0 > 3_600_000 else "%H:%M:%S"
    c.update(
        x0=x0,
        ymax=top_value,
        behind_max=behind_top,
        ticks=[(y(v), _tick_label(v)) for v in ticks_at],
        behind_ticks=[(yb(n), _tick_label(n)) for n in nice_ticks(behind_top, 2)],
        slo_y=y(slo_seconds) if slo_seconds <= top_value else None,
        steps=_behind_steps(behind, x, yb, left + w),
        line=[(px, y(val)) for px, val, _ in pts],
        dots=[_dot(px, y(val), val, v, slo_seconds) for px, val, v in pts],
        x0_label=f"{datetime.fromtimestamp(x0 / 1000, UTC):{fmt}}",
        t1_label=f"{datetime.fromtimestamp(t1 / 1000, UTC):{fmt}}",
        mid=f"{top + h / 2:.0f}",
    )
    return _render("lag_chart.svg", c=c)


__all__ = [
    "CHART_DOTS",
    "URL_PREFIX",
    "error_html",
    "lag_chart_svg",
    "nice_ticks",
    "overview_html",
    "sparkline",
    "table_html",
]
