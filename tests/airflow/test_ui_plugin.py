"""The "Delta Mirror" UI plugin, served by a real ``airflow api-server`` on 127.0.0.1.

Airflow does not authenticate plugin apps by itself: every route must refuse anonymous requests
(401) and invalid tokens (403), and answer a JWT from ``POST /auth/token`` with the overview.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from dm_airflow_kit import make_table

from delta_mirror.health.monitoring import record_lag_sample
from delta_mirror.jobs.publisher import Publisher
from delta_mirror.store import SqlStore

REPO = Path(__file__).resolve().parents[2]
ADMIN_PASSWORD = "dm-test-admin-pw"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ApiServer:
    def __init__(self, home: Path, env: dict[str, str]) -> None:
        self.port = _free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.log_path = home / "api-server.log"
        passwords = home / "passwords.json"
        passwords.write_text(json.dumps({"admin": ADMIN_PASSWORD}))
        bin_dir = Path(sys.executable).parent
        no_proxy = ",".join(x for x in (os.environ.get("NO_PROXY"), "127.0.0.1", "localhost") if x)
        self.env = {
            **os.environ,
            **env,
            "AIRFLOW__CORE__PLUGINS_FOLDER": str(REPO / "plugins"),
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:admin",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(passwords),
            "AIRFLOW__API__BASE_URL": self.base_url,
            "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
            "NO_PROXY": no_proxy,
            "no_proxy": no_proxy,
        }
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [str(bin_dir / "airflow"), "api-server", "-H", "127.0.0.1", "-p", str(self.port), "-w", "1"],
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self.client = httpx.Client(base_url=self.base_url, timeout=30, trust_env=False)

    def wait_ready(self, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"api-server exited: {self.log_path.read_text()[-3000:]}")
            try:
                if self.client.get("/api/v2/monitor/health").status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"api-server not ready in {timeout} s: {self.log_path.read_text()[-3000:]}")

    def jwt(self) -> str:
        r = self.client.post("/auth/token", json={"username": "admin", "password": ADMIN_PASSWORD})
        assert r.status_code == 201, r.text
        return str(r.json()["access_token"])

    def stop(self) -> None:
        self.client.close()
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)


@pytest.fixture
def api_server(
    airflow_db: Path, sqlite_store: str, dm_config, airflow_env: dict[str, str], tmp_path: Path
) -> Iterator[ApiServer]:
    store = SqlStore(sqlite_store)
    for name in ("behind", "current", "broken"):
        (tmp_path / name).mkdir()
        make_table(store, name, (tmp_path / name).as_uri(), versions=3)
    Publisher(store).publish("current")
    Publisher(store).publish("broken")
    store.commit("broken", [("txn", {"appId": "loader", "version": 1})])
    broken = store.get_table("broken")
    store.ensure_status(broken.id, 3, "json")
    store.mark_failed(broken.id, 3, "json", "CONFLICT", "CONFLICT", "a different file is already there")
    store.halt_table(broken.id, "conflict at version 3", 3)
    # An hour of history for "behind" (one sample over its 1h SLO), then a real measurement.
    behind = store.get_table("behind")
    hour_ago = int(time.time() * 1000) - 3_600_000
    for i, lag in enumerate((0.0, 120.0, 900.0, 4000.0, 1500.0)):
        store.add_lag_sample(behind.id, lag, i, sampled_at=hour_ago + i * 600_000)
    for name in ("behind", "current"):
        record_lag_sample(store, name)
    store.add_lag_sample(behind.id, 50.0, 0, sampled_at=hour_ago - 3 * 86_400_000)  # only in the 7-day view
    from delta_mirror.health.monitoring import record_validation
    from delta_mirror.jobs.validate import validate_table

    record_validation(store, "current", validate_table(store, "current").to_json())
    store.close()
    dm_config({"behind": {"lag_slo": "1h"}, "current": {}, "broken": {}})
    server = ApiServer(
        tmp_path, {k: v for k, v in os.environ.items() if k.startswith(("AIRFLOW", "DELTA_MIRROR"))}
    )
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()
        shutil_copy = REPO / "test-artifacts" / "ui_plugin"
        shutil_copy.mkdir(parents=True, exist_ok=True)
        if server.log_path.exists():
            (shutil_copy / "api-server.log").write_bytes(server.log_path.read_bytes())


ROUTES = [
    "/delta-mirror/",
    "/delta-mirror/tables/current",
    "/delta-mirror/api/overview",
    "/delta-mirror/api/tables/current",
    "/delta-mirror/api/health",
]


def test_the_plugin_requires_airflow_auth_and_serves_the_overview(api_server: ApiServer) -> None:
    for route in ROUTES:
        assert api_server.client.get(route).status_code == 401, route
        bad = api_server.client.get(route, headers={"Authorization": "Bearer not-a-jwt"})
        assert bad.status_code in (401, 403), (route, bad.status_code)

    auth = {"Authorization": f"Bearer {api_server.jwt()}"}
    r = api_server.client.get("/delta-mirror/api/overview", headers=auth)
    assert r.status_code == 200, r.text
    data = r.json()
    rows = {t["table"]: t for t in data["tables"]}
    assert set(rows) == {"behind", "broken", "current"}
    assert data["healthy"] is False
    cur = rows["current"]
    assert (cur["latest_committed"], cur["last_published"], cur["versions_behind"]) == (2, 2, 0)
    assert cur["lag_seconds"] == 0 and cur["state"] == "ACTIVE" and cur["healthy"] is True
    assert cur["dag_id"] == "delta_mirror__current" and cur["lag_slo_seconds"] == 900
    beh = rows["behind"]
    assert (beh["latest_committed"], beh["last_published"], beh["versions_behind"]) == (2, None, 3)
    assert beh["lag_seconds"] > 0 and beh["lag_slo_seconds"] == 3600 and beh["healthy"] is True
    brk = rows["broken"]
    assert brk["state"] == "HALTED" and brk["healthy"] is False
    assert (brk["latest_committed"], brk["last_published"], brk["versions_behind"]) == (3, 2, 1)
    assert brk["last_error_class"] == "CONFLICT" and "different file" in brk["last_error"]
    assert "halted" in brk["troubleshooting"] and "delta-mirror resume" in brk["troubleshooting"]

    detail = api_server.client.get("/delta-mirror/api/tables/behind", headers=auth).json()
    assert [s["versions_behind"] for s in detail["lag_history"]] == [0, 1, 2, 3, 4, 3]
    assert detail["lag_history"][3]["lag_seconds"] == 4000.0
    assert [v["state"] for v in detail["versions"]] == ["PENDING"] * 3
    broken = api_server.client.get("/delta-mirror/api/tables/broken", headers=auth).json()
    assert broken["versions"][-1]["state"] == "CONFLICT"
    assert api_server.client.get("/delta-mirror/api/tables/nope", headers=auth).status_code == 404

    health = api_server.client.get("/delta-mirror/api/health", headers=auth)
    assert health.status_code == 503 and health.json()["healthy"] is False

    page = api_server.client.get("/delta-mirror/", headers=auth)
    assert page.status_code == 200 and "text/html" in page.headers["content-type"]
    assert "id='overview'" in page.text and "delta_mirror__broken" in page.text
    table_page = api_server.client.get("/delta-mirror/tables/behind", headers=auth)
    assert table_page.status_code == 200 and "<svg id='lag-chart'" in table_page.text
    assert "<polyline" not in table_page.text or "points=" in table_page.text

    # The navigation entry is registered with the UI.
    plugins = api_server.client.get("/api/v2/plugins", headers=auth).json()
    (mine,) = [p for p in plugins["plugins"] if p["name"] == "delta_mirror"]
    assert mine["external_views"][0]["href"] == "/delta-mirror/"
    assert mine["fastapi_apps"][0]["url_prefix"] == "/delta-mirror"


CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def test_a_headless_browser_renders_the_overview_and_the_lag_chart(api_server: ApiServer) -> None:
    """Chromium (Debian package) driven by Playwright, logged in with Airflow's session cookie."""
    sync_api = pytest.importorskip("playwright.sync_api")
    if not CHROMIUM.exists():
        if os.environ.get("CI"):
            pytest.fail("/usr/bin/chromium is missing: .ci/run installs the Debian package")
        pytest.skip("/usr/bin/chromium is missing (apt-get install chromium)")
    out = REPO / "test-artifacts" / "ui_plugin"
    out.mkdir(parents=True, exist_ok=True)
    token = api_server.jwt()
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
        try:
            anonymous = browser.new_page()
            response = anonymous.goto(f"{api_server.base_url}/delta-mirror/")
            assert response is not None and response.status == 401

            context = browser.new_context(viewport={"width": 1280, "height": 800})
            context.add_cookies([{"name": "_token", "value": token, "url": api_server.base_url}])
            page = context.new_page()
            response = page.goto(f"{api_server.base_url}/delta-mirror/")
            assert response is not None and response.status == 200
            rows = page.locator("#overview tbody tr")
            assert rows.count() == 3
            assert "HALTED" in page.locator("#overview").inner_text()
            page.screenshot(path=str(out / "overview.png"), full_page=True)

            page.set_default_timeout(15_000)
            page.click("#overview a[href$='/tables/behind']")
            page.wait_for_url("**/delta-mirror/tables/behind")
            chart = page.locator("#lag-chart")
            box = chart.bounding_box()
            assert box is not None and box["width"] > 500 and box["height"] > 200
            assert page.locator("#lag-chart circle").count() == 6
            assert page.locator("#lag-chart circle[fill='#e12d39']").count() == 1  # over the SLO
            assert page.locator("#timeline .v").count() == 3
            assert "not validated yet" in page.locator("#validation").inner_text()
            page.screenshot(path=str(out / "table_behind.png"), full_page=True)
            page.click("#windows a[href$='window=7d']")
            page.wait_for_url("**/delta-mirror/tables/behind?window=7d")
            assert page.locator("#lag-chart circle").count() == 7  # one more sample, three days old

            page.goto(f"{api_server.base_url}/delta-mirror/tables/current")
            assert "OK" in page.locator("#validation").inner_text()

            page.goto(f"{api_server.base_url}/delta-mirror/tables/broken")
            assert page.locator("#timeline .v.CONFLICT").count() == 1
            assert "delta-mirror resume" in page.content()
            page.screenshot(path=str(out / "table_broken.png"), full_page=True)
        finally:
            browser.close()
    assert (out / "overview.png").stat().st_size > 5000
