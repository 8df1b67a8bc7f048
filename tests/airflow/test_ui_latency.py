"""The Delta Mirror page tells the truth (issue 28): lag over time is each version's commit-to-readable
time from the store, drawn where it happened and at its height; a table that cannot publish says so.

The plugin's data functions and the chart are checked here against a real store (SQLite and
PostgreSQL); the page in a real browser, after a burst of commits whose publishing was delayed, in
``test_ui_plugin.py``'s Airflow (its fixtures and browser set-up), with the docs' screenshots (docs/airflow.md).
"""

from __future__ import annotations

import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from dm_airflow_kit import make_table

from delta_mirror.airflow.ui_render import lag_chart_svg, overview_html, sparkline, table_html
from delta_mirror.health.pages import PageStores, overview_data, table_data
from delta_mirror.jobs.publisher import Publisher
from delta_mirror.store import SqlStore

SVG = "{http://www.w3.org/2000/svg}"


def burst_then_publish(store: SqlStore, name: str, burst: int, delay: float) -> None:
    """Commit ``burst`` versions, leave them unpublished for ``delay`` seconds, then publish: the
    versions' commit-to-readable times are ``delay`` and a little more."""
    for i in range(burst):
        store.commit(name, [("txn", {"appId": "burst", "version": i})])
    time.sleep(delay)
    Publisher(store).publish(name)


def steady(store: SqlStore, name: str, commits: int, pause: float = 0.0) -> None:
    """Commits published at once, one by one (``pause`` seconds apart): the baseline."""
    for i in range(commits):
        store.commit(name, [("txn", {"appId": "steady", "version": i})])
        Publisher(store).publish(name)
        time.sleep(pause)


def _chart(svg: str) -> dict[str, Any]:
    root = ET.fromstring(svg)
    circles = [
        {
            "version": int(c.get("data-version", "-1")),
            "seconds": float(c.get("data-seconds", "0")),
            "cy": float(c.get("cy", "0")),
        }
        for c in root.iter(f"{SVG}circle")
    ]
    return {
        "ymax": float(root.get("data-ymax", "0")),
        "top": float(root.get("data-top", "0")),
        "h": float(root.get("data-plot-height", "0")),
        "circles": circles,
        "behind": root.find(f"{SVG}polyline[@id='behind-line']"),
        "behind_max": float(root.get("data-behind-max", "0")),
    }


def _version(n: int, committed: int, published: int | None, now: int) -> dict[str, Any]:
    return {
        "version": n,
        "committed_at": committed,
        "published_at": published,
        "latency_seconds": ((published or now) - committed) / 1000,
        "published": published is not None,
    }


def test_the_lag_chart_draws_a_spike_at_its_height_among_many_versions() -> None:
    now = 1_800_000_000_000
    since = now - 86_400_000
    # 2,000 versions a minute apart readable after 1 s, but version 1500 after 177 s
    versions = [
        _version(
            i,
            since + 60_000 + i * 40_000,
            since + 60_000 + i * 40_000 + (177_000 if i == 1500 else 1_000),
            now,
        )
        for i in range(2000)
    ]
    latency = {"since": since, "until": now, "versions": versions, "behind": [[since, 0], [now, 0]]}
    chart = _chart(lag_chart_svg(latency, 900.0, "24h"))
    assert chart["ymax"] == 200  # round ticks just above the highest
    (spike,) = [
        c for c in chart["circles"] if c["version"] == 1500
    ]  # one point per pixel column: it survives
    assert spike["seconds"] == 177.0
    assert spike["cy"] == pytest.approx(chart["top"] + chart["h"] - 177 / 200 * chart["h"], abs=0.06)
    assert spike["cy"] == min(c["cy"] for c in chart["circles"])  # the highest point drawn
    low = [c for c in chart["circles"] if c["version"] != 1500]
    assert low and all(
        c["cy"] == pytest.approx(chart["top"] + chart["h"] - 1 / 200 * chart["h"], abs=0.06) for c in low
    )


def test_the_sparkline_puts_a_small_lag_low_not_one_dot_at_the_top() -> None:
    """The overview's old sparkline scaled one sample to its own height: a dot at the top, which
    read as a high lag. Now y runs to the SLO (or the highest value above it)."""
    now = 1_800_000_000_000
    one = ET.fromstring(sparkline([[now - 3_600_000, 2.0]], 900.0, None, now_ms=now))
    (dot,) = one.iter("circle")
    assert float(dot.get("cy", "0")) > 20  # of 24: near the bottom
    spike = ET.fromstring(
        sparkline([[now - 7_200_000, 1.0], [now - 3_600_000, 1800.0]], 900.0, 0.0, now_ms=now)
    )
    assert spike.get("data-top") == "1800"
    ys = [float(p.split(",")[1]) for p in spike.find("polyline").get("points", "").split()]  # type: ignore[union-attr]
    assert (
        ys[1] == pytest.approx(3.0) and ys[0] > 20 and ys[2] == pytest.approx(21.0)
    )  # spike at the top, now 0


@pytest.fixture
def plugin_store(
    store_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[SqlStore, PageStores]]:
    """A store and the pages' own stores over it (``DELTA_MIRROR_STORE``, no table config)."""
    monkeypatch.setenv("DELTA_MIRROR_STORE", store_url)
    monkeypatch.setenv("DELTA_MIRROR_CONFIG", str(tmp_path / "none.yaml"))
    store = SqlStore(store_url)
    store.init()
    stores = PageStores()
    yield store, stores
    stores.close()
    store.close()


def test_overview_and_table_data_carry_per_version_percentiles_and_the_failure(
    plugin_store: tuple[SqlStore, PageStores], tmp_path: Path
) -> None:
    store, stores = plugin_store
    (tmp_path / "sales").mkdir()
    make_table(store, "sales", (tmp_path / "sales").as_uri(), versions=1)
    Publisher(store).publish("sales")
    steady(store, "sales", 3)
    burst_then_publish(store, "sales", burst=4, delay=1.5)
    (tmp_path / "data").mkdir()
    (tmp_path / "blocker").write_text("a regular file")
    make_table(store, "orders", (tmp_path / "data").as_uri(), versions=1)
    store.update_table(store.get_table("orders").id, location=(tmp_path / "blocker" / "orders").as_uri())
    with pytest.raises(Exception, match="Not a directory"):
        Publisher(store).publish("orders")

    data = overview_data(stores)
    rows = {r["table"]: r for r in data["tables"]}
    sales = rows["sales"]
    stats = sales["latency"]["24h"]
    assert stats["versions"] == 8  # version 0, 3 steady, 4 of the burst
    assert 1.5 <= stats["p99"] == stats["max"] < 10 and stats["p50"] < 1.5
    assert 1.5 <= max(p[1] for p in sales["lag_24h"]) < 10  # the sparkline's peak is the burst
    orders = rows["orders"]
    assert orders["failure"]["attempts"] == 1 and "Not a directory" in orders["failure"]["error"]
    assert orders["healthy"] and orders["latency"]["24h"] is None  # within the grace; nothing published
    page = overview_html(data)
    orders_row = page[page.index(">orders</a>") :].split("</tr>")[0]
    assert "FAILING" in orders_row and "<span class='ok'>OK</span>" not in orders_row
    assert "Not a directory" in orders_row

    detail = table_data(stores, "sales")
    lat = detail["version_latency"]
    assert [v["version"] for v in lat["versions"]] == list(range(8))
    burst = [v["latency_seconds"] for v in lat["versions"][4:]]
    assert all(1.5 <= s < 10 for s in burst)
    assert max(n for _, n in lat["behind"]) == 4  # the burst waited together
    assert lat["behind"][-1][1] == 0
    chart = _chart(lag_chart_svg(lat, detail["lag_slo_seconds"], "24h"))
    behind_ys = [float(p.split(",")[1]) for p in chart["behind"].get("points", "").split()]
    four = chart["top"] + chart["h"] - 4 / chart["behind_max"] * chart["h"]
    assert min(behind_ys) == pytest.approx(four, abs=0.06)
    assert behind_ys[-1] == chart["top"] + chart["h"]  # caught up: 0 behind at the end
    top = max(chart["circles"], key=lambda c: c["seconds"])
    assert top["version"] in (4, 5, 6, 7)
    assert top["cy"] == pytest.approx(
        chart["top"] + chart["h"] - top["seconds"] / chart["ymax"] * chart["h"], abs=0.06
    )
    html = table_html(detail)
    assert "id='latency'" in html and "<td>24h</td><td class='n'>8</td>" in html

    failing = table_html(table_data(stores, "orders"))
    assert "id='failure'" in failing and "publishing failed 1 attempt(s)" in failing
    assert "unhealthy after 2 attempt(s) or 300 s" in failing


# -- in a real browser, in the Airflow that ``make airflow`` starts -------------------------------

#: The tables live here while the test runs: the pages show their locations, and a screenshot in
#: the docs must not show a machine's paths (no /work, no /tmp).
LAKE = Path("/dev/shm/delta-mirror-lake")
SHOTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "ui_latency"
#: DELTA_MIRROR_UPDATE_SCREENSHOTS=1 also copies the screenshots to docs/images/ (docs/airflow.md).
README_IMAGES = {"overview.png": "ui-overview.png", "table.png": "ui-table.png"}
BURST, DELAY = 8, 8.0  # versions committed at once, and how long their publishing waits


def _fill_store(url: str) -> None:
    """sales: steady publishing, a burst of 8 commits left unpublished for 8 s, then steady again;
    customers: steady; orders: its location is a folder inside a regular file (two failed attempts)."""
    store = SqlStore(url)
    store.init()
    for name in ("sales", "customers"):
        make_table(store, name, (LAKE / name).as_uri(), versions=1)
        Publisher(store).publish(name)
    steady(store, "customers", 4)
    steady(store, "sales", 6, pause=0.5)
    burst_then_publish(store, "sales", BURST, DELAY)
    steady(store, "sales", 4, pause=0.5)
    (LAKE / "orders").mkdir()
    make_table(store, "orders", (LAKE / "orders").as_uri(), versions=2)
    (LAKE / "blocked").write_text("a regular file where the table's folder should be")
    store.update_table(store.get_table("orders").id, location=(LAKE / "blocked" / "orders").as_uri())
    for _ in range(2):
        with pytest.raises(Exception, match="Not a directory"):
            Publisher(store).publish("orders")
    store.close()


@pytest.fixture(scope="module")
def latency_server(airflow_db: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    import shutil

    from test_ui_plugin import fresh_folder, running_airflow, store_env

    root = tmp_path_factory.mktemp("ui-latency")
    url = f"sqlite:///{root / 'store.db'}"
    fresh_folder(LAKE)
    SqlStore(url).init()
    try:
        data_env = store_env(root, url, {"sales": {"lag_slo": "5s"}, "customers": {}, "orders": {}})
        with running_airflow(root, data_env, airflow_db, SHOTS) as server:
            _fill_store(url)  # now, so that the chart's time axis is the burst's, not the start-up's
            yield server
    finally:
        shutil.rmtree(LAKE, ignore_errors=True)


def test_the_browser_shows_the_bursts_lag_at_its_height_and_the_failing_table(latency_server: Any) -> None:
    """Chromium (Debian package) through Playwright, logged in with Airflow's session cookie."""
    import os
    import shutil

    from support.browser import open_delta_mirror_page, signed_in_page
    from support.services import skip_or_fail
    from support.waiting import load_scaled
    from test_ui_plugin import CHROMIUM, CHROMIUM_ARGS

    sync_api = pytest.importorskip("playwright.sync_api")
    if not CHROMIUM.exists():
        skip_or_fail(f"{CHROMIUM} is missing (apt-get install chromium; .ci/run installs it)")
    SHOTS.mkdir(parents=True, exist_ok=True)
    base = latency_server.base_url
    token = latency_server.jwt()
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
        try:
            page = signed_in_page(browser, base, token)
            frame = open_delta_mirror_page(page, base)
            orders = frame.locator("#overview tr", has=frame.locator("a", has_text="orders")).inner_text()
            assert "FAILING" in orders and "UNHEALTHY" in orders and "Not a directory" in orders
            assert "publishing failed 2 attempt(s) in a row" in orders
            sales = frame.locator("#overview tr", has=frame.locator("a", has_text="sales")).inner_text()
            assert "ACTIVE OK" in sales and "FAILING" not in sales  # caught up, its lag now is 0
            spark = frame.locator("#overview tr", has=frame.locator("a", has_text="sales")).locator(
                "svg.spark"
            )
            assert float(spark.get_attribute("data-top") or 0) >= DELAY  # the burst is the sparkline's peak
            visible = page.locator("body").inner_text() + frame.locator("body").inner_text()
            assert "/work" not in visible and "/tmp" not in visible
            page.wait_for_timeout(500)
            page.screenshot(path=str(SHOTS / "overview.png"))

            frame.locator("#overview a[href$='/tables/sales']").click()
            chart = frame.locator("#lag-chart")
            chart.wait_for()
            dots = chart.locator("circle.v")
            assert dots.count() == 1 + 6 + BURST + 4
            seconds = [float(d.get_attribute("data-seconds") or 0) for d in dots.all()]
            top_i = max(range(len(seconds)), key=seconds.__getitem__)
            spike = dots.nth(top_i)
            assert DELAY <= seconds[top_i] < DELAY + load_scaled(20)  # the burst's real wait
            assert sum(s >= DELAY for s in seconds) == BURST and all(s < DELAY for s in seconds[:7])
            ymax = float(chart.get_attribute("data-ymax") or 0)
            top = float(chart.get_attribute("data-top") or 0)
            h = float(chart.get_attribute("data-plot-height") or 0)
            expected = top + h - seconds[top_i] / ymax * h
            assert float(spike.get_attribute("cy") or 0) == pytest.approx(expected, abs=0.06)
            # ... and where the browser drew it: the dot's centre, from the chart's top edge
            box, dot = chart.bounding_box(), spike.bounding_box()
            assert box is not None and dot is not None
            assert dot["y"] + dot["height"] / 2 - box["y"] == pytest.approx(expected, abs=1.0)
            assert seconds[top_i] > 5 and spike.get_attribute("stroke") == "#e12d39"  # over the 5 s SLO
            assert frame.locator("#slo-line").count() == 1
            assert frame.locator("#behind-line").count() == 1
            rows = frame.locator("#latency tbody tr").all_inner_texts()
            assert rows[1].split("\t")[:2] == ["24h", "19"] and float(rows[1].split("\t")[-1]) >= DELAY
            visible = page.locator("body").inner_text() + frame.locator("body").inner_text()
            assert "/work" not in visible and "/tmp" not in visible
            page.wait_for_timeout(300)
            page.screenshot(path=str(SHOTS / "table.png"))
        finally:
            browser.close()
    if os.environ.get("DELTA_MIRROR_UPDATE_SCREENSHOTS"):
        for shot, image in README_IMAGES.items():
            shutil.copy(SHOTS / shot, Path(__file__).resolve().parents[2] / "docs" / "images" / image)
