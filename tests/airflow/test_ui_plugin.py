"""The "Delta Mirror" UI plugin, in the Airflow that ``make airflow`` starts.

The server is ``scripts/airflow-local.sh`` (``airflow standalone``) in the environment of
``make -s print-local-env`` — the Makefile's LOCAL_ENV, so a missing plugins folder or host binding
there fails here — with only the data moved to temporary folders (Airflow home, store, table
config) and a free port. The password is read from the file the banner names, as a user does.

Airflow does not authenticate plugin apps by itself: every route must refuse anonymous requests
(401) and invalid tokens (403), and answer a JWT from ``POST /auth/token`` with the overview.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest
from dm_airflow_kit import config_yaml, make_table
from support.browser import open_delta_mirror_page, signed_in_page
from support.services import skip_or_fail, stop_group
from support.waiting import load_scaled, wait_until

from delta_mirror.health.monitoring import record_lag_sample
from delta_mirror.jobs.publisher import Publisher
from delta_mirror.store import SqlStore

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "test-artifacts" / "ui_plugin"
LAKE = ARTIFACTS / "lake"
#: DELTA_MIRROR_UPDATE_SCREENSHOTS=1 also copies the screenshots to docs/images/ (docs/airflow.md).
#: (The docs' two screenshots come from test_ui_latency.py: a lag spike and a failing table.)
README_IMAGES: dict[str, str] = {}
#: Variables of the outer environment that must not reach the test's Airflow.
FOREIGN = ("AIRFLOW_CONN_", "AIRFLOW_VAR_", "AIRFLOW__", "AWS_", "DELTA_MIRROR_")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(what: str, check: Callable[[], bool], seconds: float, alive: Callable[[], str | None]) -> None:
    """Poll ``check`` once a second while the server lives; the limit grows with the load."""
    wait_until(check, seconds, what, interval=1.0, alive=alive)


def local_env(port: int) -> dict[str, str]:
    """The Makefile's LOCAL_ENV (``make -s print-local-env``), one VAR=value a line."""
    out = subprocess.run(
        ["make", "-s", "--no-print-directory", "print-local-env", f"AIRFLOW_PORT={port}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


class LocalAirflow:
    """``make airflow``'s start-up script, its output in ``airflow.log``."""

    def __init__(self, root: Path, data_env: dict[str, str]) -> None:
        self.port = _free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.shipped = local_env(self.port)
        self.home = root / "airflow-home"
        self.log_path = root / "airflow.log"
        no_proxy = ",".join(x for x in (os.environ.get("NO_PROXY"), "127.0.0.1", "localhost") if x)
        self.env = {
            **{k: v for k, v in os.environ.items() if not k.startswith(FOREIGN) and k != "AIRFLOW_HOME"},
            **self.shipped,
            "AIRFLOW_HOME": str(self.home),
            **data_env,
            "NO_PROXY": no_proxy,
            "no_proxy": no_proxy,
        }
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [str(REPO / "scripts" / "airflow-local.sh")],
                cwd=REPO,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self.client = httpx.Client(base_url=self.base_url, timeout=load_scaled(30), trust_env=False)

    def exited(self) -> str | None:
        if self.proc.poll() is None:
            return None
        return f"exit {self.proc.returncode}: {self.log_path.read_text(errors='replace')[-3000:]}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self) -> None:
        """Until the script's banner (printed once the UI answers): first starts migrate a database."""
        wait_for("the ready banner", lambda: "==> Airflow UI: " in self.log(), 180, self.exited)

    def password(self) -> str:
        banner = re.search(r"password: in (\S+)", self.log())
        assert banner, self.log()[-2000:]
        return str(json.loads(Path(banner.group(1)).read_text())["admin"])

    def jwt(self) -> str:
        r = self.client.post("/auth/token", json={"username": "admin", "password": self.password()})
        assert r.status_code == 201, r.text
        return str(r.json()["access_token"])

    def stop(self) -> None:
        self.client.close()
        stop_group(self.proc, grace=load_scaled(30))


def fresh_folder(path: Path) -> Path:
    """``path`` as an empty folder (whatever a previous run left there removed)."""
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return path


def store_env(root: Path, url: str, tables: dict[str, object]) -> dict[str, str]:
    """The table config ``tables`` written under ``root``, and the variables that point the
    Airflow processes at it, at the store ``url`` and at a home of their own."""
    config = root / "delta_mirror.yaml"
    config.write_text(config_yaml(tables), encoding="utf-8")
    return {
        "DELTA_MIRROR_HOME": str(root / "dm-home"),
        "DELTA_MIRROR_STORE": url,
        "DELTA_MIRROR_CONFIG": str(config),
    }


@contextmanager
def running_airflow(
    root: Path, data_env: dict[str, str], airflow_db: Path, artifacts: Path
) -> Iterator[LocalAirflow]:
    """A ready ``LocalAirflow`` in ``root``, stopped on exit with its log kept in ``artifacts``; it
    starts from the session's migrated metadata DB when there is one (a quicker start)."""
    server = LocalAirflow(root, data_env)
    server.home.mkdir()
    if (airflow_db / "airflow.db").exists():
        shutil.copy(airflow_db / "airflow.db", server.home / "airflow.db")
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()
        artifacts.mkdir(parents=True, exist_ok=True)
        if server.log_path.exists():
            (artifacts / "airflow.log").write_bytes(server.log_path.read_bytes())


def _fill_store(url: str, root: Path) -> None:
    store = SqlStore(url)
    store.init()
    for name in ("behind", "current", "broken"):
        (root / name).mkdir()
        make_table(store, name, (root / name).as_uri(), versions=3)
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


@pytest.fixture(scope="module")
def api_server(airflow_db: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalAirflow]:
    """One Airflow for the module: ``airflow standalone`` costs tens of seconds to start."""
    root = tmp_path_factory.mktemp("ui-plugin")
    url = f"sqlite:///{root / 'store.db'}"
    # The tables' folders are shown on the table pages: a stable path for the docs' screenshots.
    _fill_store(url, fresh_folder(LAKE))
    data_env = {
        **store_env(root, url, {"behind": {"lag_slo": "1h"}, "current": {}, "broken": {}}),
        # a task's calls to the execution API wait longer on a loaded machine (default 5 s)
        "AIRFLOW__WORKERS__EXECUTION_API_TIMEOUT": str(load_scaled(30)),
    }
    with running_airflow(root, data_env, airflow_db, ARTIFACTS) as server:
        yield server


def test_make_airflow_is_what_runs_here(api_server: LocalAirflow) -> None:
    """The shipped environment: plugins folder, 127.0.0.1, and the banner with URL, user and file."""
    env = api_server.shipped
    assert env["AIRFLOW__CORE__PLUGINS_FOLDER"] == str(REPO / "plugins")
    assert env["AIRFLOW__API__HOST"] == "127.0.0.1"
    assert env["AIRFLOW__CORE__DAGS_FOLDER"] == str(REPO / "dags")
    # tasks reach the execution API on the port the UI listens on (not Airflow's default 8080)
    assert api_server.port != 8080
    assert env["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"] == f"http://127.0.0.1:{api_server.port}/execution/"
    log = api_server.log()
    assert f"==> Airflow UI: http://127.0.0.1:{api_server.port}" in log
    assert "user: admin" in log
    assert f"{api_server.home}/simple_auth_manager_passwords.json.generated" in log


ROUTES = [
    "/delta-mirror/",
    "/delta-mirror/tables/current",
    "/delta-mirror/api/overview",
    "/delta-mirror/api/tables/current",
    "/delta-mirror/api/health",
]


def test_the_plugin_requires_airflow_auth_and_serves_the_overview(api_server: LocalAirflow) -> None:
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
    assert page.text.count("<svg class='spark'") == 3  # every table has versions committed in the last 24h
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


def _chart(frame) -> dict[str, float]:  # type: ignore[no-untyped-def]
    """The chart's window and y range from its data attributes, and its y tick labels."""
    chart = frame.locator("#lag-chart")
    return {
        "window_ms": float(chart.get_attribute("data-t1")) - float(chart.get_attribute("data-t0")),
        "ymax": float(chart.get_attribute("data-ymax")),
    }


def test_a_headless_browser_finds_the_page_in_airflow_and_follows_its_links(api_server: LocalAirflow) -> None:
    """Chromium (Debian package) driven by Playwright, logged in with Airflow's session cookie: the nav
    entry, the embedded overview, a table page and its chart's axes, and the link to the DAG."""
    sync_api = pytest.importorskip("playwright.sync_api")
    if not CHROMIUM.exists():
        skip_or_fail(f"{CHROMIUM} is missing (apt-get install chromium; .ci/run installs it)")
    out = REPO / "test-artifacts" / "ui_plugin"
    out.mkdir(parents=True, exist_ok=True)
    base = api_server.base_url
    token = api_server.jwt()
    # The DAG page below needs the DAG parsed by the dag-processor.
    auth = {"Authorization": f"Bearer {token}"}
    wait_for(
        "the DAG delta_mirror__behind parsed",
        lambda: api_server.client.get("/api/v2/dags/delta_mirror__behind", headers=auth).status_code == 200,
        120,
        api_server.exited,
    )
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
        try:
            anonymous = browser.new_page()
            response = anonymous.goto(f"{base}/delta-mirror/")
            assert response is not None and response.status == 401

            page = signed_in_page(browser, base, token)
            frame = open_delta_mirror_page(page, base)
            assert frame.locator("#overview tbody tr").count() == 3
            overview = frame.locator("#overview").inner_text()
            assert "HALTED" in overview and "3600 s" in overview and "0:15:00" not in overview
            page.wait_for_timeout(500)
            page.screenshot(path=str(out / "overview.png"))

            frame.locator("#overview a[href$='/tables/behind']").click()
            frame.locator("#lag-chart").wait_for()
            box = frame.locator("#lag-chart").bounding_box()
            assert box is not None and box["width"] > 500 and box["height"] > 200
            # Lag over time is per version, from the store (issue 28): the 3 unpublished versions,
            # hollow, at their seconds so far; 3 versions behind at the end of the grey step line.
            dots = frame.locator("#lag-chart circle.v")
            assert dots.count() == 3
            assert frame.locator("#lag-chart circle.v[fill='#fff']").count() == 3
            axes = _chart(frame)
            assert axes["window_ms"] == 86_400_000
            seconds = [float(d.get_attribute("data-seconds")) for d in dots.all()]
            assert 0 < max(seconds) <= axes["ymax"] < 3600
            assert frame.locator("#lag-chart .ytick").all_text_contents()[0] == "0"
            assert frame.locator("#slo-note").count() == 1  # the 1h SLO is above this range
            chart = frame.locator("#lag-chart")
            top, h = float(chart.get_attribute("data-top")), float(chart.get_attribute("data-plot-height"))
            last = frame.locator("#behind-line").get_attribute("points").split()[-1]
            assert (
                float(last.split(",")[1]) == top + h - 3 / float(chart.get_attribute("data-behind-max")) * h
            )
            assert frame.locator("#timeline .v").count() == 3
            assert "not validated yet" in frame.locator("#validation").inner_text()
            page.screenshot(path=str(out / "table_behind.png"))
            frame.locator("#windows a[href$='window=7d']").click()
            frame.locator("#windows b", has_text="last 7d").wait_for()
            assert frame.locator("#lag-chart circle.v").count() == 3  # the same versions
            assert _chart(frame)["window_ms"] == 7 * 86_400_000

            # The DAG link leaves the sandboxed iframe and lands on Airflow's DAG page.
            frame.locator("a.af", has_text="DAG").click()
            page.wait_for_url("**/dags/delta_mirror__behind")
            page.get_by_text("delta_mirror__behind").first.wait_for()
            assert page.locator("iframe").count() == 0

            page.goto(f"{base}/delta-mirror/tables/current")
            assert "OK" in page.locator("#validation").inner_text()
            when = page.locator("#validation time")
            assert when.inner_text().endswith(" ago") and when.get_attribute("title").endswith(" UTC")
            page.goto(f"{base}/delta-mirror/tables/broken")
            assert page.locator("#timeline .v.CONFLICT").count() == 1
            assert "delta-mirror resume" in page.content()
            page.screenshot(path=str(out / "table_broken.png"), full_page=True)
        finally:
            browser.close()
    assert (out / "overview.png").stat().st_size > 5000
    if os.environ.get("DELTA_MIRROR_UPDATE_SCREENSHOTS"):
        for shot, image in README_IMAGES.items():
            shutil.copy(out / shot, REPO / "docs" / "images" / image)


def _listening(session: int) -> list[tuple[str, int]]:
    """(address, port) of every TCP socket listening in the processes of ``session`` (from /proc)."""
    inodes: set[str] = set()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if os.getsid(int(proc.name)) != session:
                continue
            for fd in (proc / "fd").iterdir():
                target = os.readlink(fd)
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
        except (OSError, ValueError):
            continue  # gone meanwhile, or not ours to read
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                address, port = fields[1].split(":")
                raw = bytes.fromhex(address)
                if len(raw) == 4:
                    host = socket.inet_ntop(socket.AF_INET, raw[::-1])
                else:  # /proc prints IPv6 as four little-endian words
                    host = socket.inet_ntop(
                        socket.AF_INET6, b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))
                    )
                found.append((host, int(port, 16)))
    return sorted(set(found))


def test_a_dag_run_triggered_in_the_ui_succeeds_on_a_non_default_port(api_server: LocalAirflow) -> None:
    """The Trigger button of a table's DAG, clicked in Chromium, under `make airflow` on a free port:
    the run's tasks reach the execution API there and the run succeeds."""
    sync_api = pytest.importorskip("playwright.sync_api")
    if not CHROMIUM.exists():
        skip_or_fail(f"{CHROMIUM} is missing (apt-get install chromium; .ci/run installs it)")
    assert api_server.port != 8080
    dag = "delta_mirror__current"
    token = api_server.jwt()
    auth = {"Authorization": f"Bearer {token}"}
    wait_for(
        f"the DAG {dag} parsed",
        lambda: api_server.client.get(f"/api/v2/dags/{dag}", headers=auth).status_code == 200,
        120,
        api_server.exited,
    )
    before = {
        r["dag_run_id"]
        for r in api_server.client.get(f"/api/v2/dags/{dag}/dagRuns", headers=auth).json()["dag_runs"]
    }
    out = REPO / "test-artifacts" / "ui_plugin"
    out.mkdir(parents=True, exist_ok=True)
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
        try:
            page = signed_in_page(browser, api_server.base_url, token, timeout=60)
            page.goto(f"{api_server.base_url}/dags/{dag}")
            page.get_by_role("button", name="Trigger Dag").click()
            dialog = page.get_by_role("dialog")
            unpause = dialog.get_by_text(f"Unpause {dag} on trigger")
            unpause.wait_for()  # checked by default: the DAGs start paused
            assert dialog.get_by_role("checkbox").first.is_checked()
            dialog.get_by_role("button", name="Trigger", exact=True).click()
            dialog.wait_for(state="hidden")

            runs: list[dict[str, object]] = []

            def finished() -> bool:
                nonlocal runs
                answer = api_server.client.get(f"/api/v2/dags/{dag}/dagRuns", headers=auth).json()
                runs = [r for r in answer["dag_runs"] if r["dag_run_id"] not in before]
                assert not any(r["state"] == "failed" for r in runs), (runs, api_server.log()[-3000:])
                return any(r["state"] == "success" for r in runs)

            wait_for("the triggered run to succeed", finished, 300, api_server.exited)
            (run,) = runs
            assert run["run_type"] == "manual"
            tasks = api_server.client.get(
                f"/api/v2/dags/{dag}/dagRuns/{run['dag_run_id']}/taskInstances", headers=auth
            ).json()["task_instances"]
            assert tasks and all(t["state"] == "success" for t in tasks), tasks
            page.goto(f"{api_server.base_url}/dags/{dag}/runs/{quote(str(run['dag_run_id']), safe='')}")
            page.get_by_text("success").first.wait_for()
            page.screenshot(path=str(out / "triggered_run.png"))
        finally:
            browser.close()
    # The whole session of `make airflow` listens on the UI's address and port only: no log server
    # (8793, 8794) on any interface, also after a task ran.
    assert _listening(os.getsid(api_server.proc.pid)) == [("127.0.0.1", api_server.port)]
