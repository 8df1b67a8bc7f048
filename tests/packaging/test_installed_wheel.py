"""The wheel as a team that already runs Airflow installs it: nothing copied from a checkout.

One module builds the wheel (from a copy of the sources, without the jars) and two fresh virtualenvs
(pip's cache reused; the versions of the development venv as constraints, so the wheels come from
the cache and the resolution is the one CI tests):

- ``apache-airflow==3.3.2`` and ``delta-mirror[airflow]``: ``pip check`` is clean; ``airflow plugins``
  and ``airflow providers list`` show delta-mirror from its entry points (an empty plugins folder);
  the user's three-line DAG file in a dags folder of its own yields the tables' DAGs, the publishing
  task with the table's asset as outlet; the API server serves the "Delta Mirror" page, which
  Chromium loads after logging in, from the venv's site-packages;
- the base install (no extras): no duckdb, pymysql, uvicorn or Airflow, and the CLI works on a
  SQLite store; a DuckDB or MySQL store is refused in one line naming the extra.

Also: the wheel's Requires-Dist caps no library tighter than the installed ``apache-airflow-core``.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import yaml
from dm_airflow_kit import make_table
from support.browser import open_delta_mirror_page, signed_in_page
from support.builders import action, lines, metadata_body, protocol_body
from support.cli import assert_one_error_line
from support.packaging import (
    REPO,
    Venv,
    airflow_requirements,
    build_wheel,
    capped_tighter_than,
    checked,
    clean_env,
    dev_constraints,
    wheel_entry_points,
    wheel_metadata,
)
from support.services import free_port, skip_or_fail, stop_group
from support.waiting import load_scaled, wait_until

from delta_mirror.store import SqlStore

pytestmark = pytest.mark.packaging

AIRFLOW = "apache-airflow==3.3.2"
TABLES = {"orders": {"tasks": "steps"}, "clicks": {"tasks": "single"}}
#: The DAG file of docs/install.md, as a user writes it.
DAG_FILE = """\
from delta_mirror.airflow import dags_from_config

globals().update(dags_from_config({config!r}))
"""
CHROMIUM = Path("/usr/bin/chromium")


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("wheel")


@pytest.fixture(scope="module")
def wheel(work: Path) -> Path:
    return build_wheel(work / "build")


@pytest.fixture(scope="module")
def constraints(work: Path) -> Path:
    return dev_constraints(work)


def _installed(path: Path, constraints: Path, *requirements: str) -> Venv:
    venv = Venv(path)
    venv.pip("install", "-q", "-c", str(constraints), *requirements)
    return venv


@pytest.fixture(scope="module")
def venvs(work: Path, wheel: Path, constraints: Path) -> Iterator[dict[str, Future[Venv]]]:
    """Both venvs, installed side by side (pip waits on its cache and the network as much as on a core)."""
    with ThreadPoolExecutor(max_workers=2) as pool:
        yield {
            "airflow": pool.submit(
                _installed, work / "airflow-venv", constraints, AIRFLOW, f"{wheel}[airflow]"
            ),
            "base": pool.submit(_installed, work / "base-venv", constraints, str(wheel)),
        }


@pytest.fixture(scope="module")
def airflow_venv(venvs: dict[str, Future[Venv]]) -> Venv:
    return venvs["airflow"].result()


@pytest.fixture(scope="module")
def base_venv(venvs: dict[str, Future[Venv]]) -> Venv:
    return venvs["base"].result()


@pytest.fixture(scope="module")
def site(work: Path) -> dict[str, Path]:
    return make_site(work)


def make_site(work: Path) -> dict[str, Path]:
    """A user's Airflow home (an empty plugins folder), dags folder, table config and store."""
    home, dags, lake = work / "airflow-home", work / "dags", work / "lake"
    for folder in (home / "plugins", dags, lake):
        folder.mkdir(parents=True)
    config = work / "etc" / "tables.yaml"
    config.parent.mkdir()
    defaults: dict[str, object] = {"schedule": None, "deadline": None, "notify": {"email": []}}
    config.write_text(yaml.safe_dump({"defaults": defaults, "tables": TABLES}), encoding="utf-8")
    (dags / "delta_mirror.py").write_text(DAG_FILE.format(config=str(config)), encoding="utf-8")
    store_url = f"sqlite:///{work / 'store.db'}"
    store = SqlStore(store_url)
    store.init()
    for name in TABLES:
        (lake / name).mkdir()
        make_table(store, name, (lake / name).as_uri(), versions=2)
    store.close()
    return {"home": home, "dags": dags, "config": config, "store": Path(store_url.removeprefix("sqlite:///"))}


def airflow_env(site: dict[str, Path], **extra: str) -> dict[str, str]:
    return clean_env(
        AIRFLOW_HOME=str(site["home"]),
        AIRFLOW__CORE__LOAD_EXAMPLES="False",
        AIRFLOW__CORE__PLUGINS_FOLDER=str(site["home"] / "plugins"),
        AIRFLOW__CORE__DAGS_FOLDER=str(site["dags"]),
        DELTA_MIRROR_HOME=str(site["home"] / "delta-mirror"),
        DELTA_MIRROR_STORE=f"sqlite:///{site['store']}",
        DELTA_MIRROR_CONFIG=str(site["config"]),
        **extra,
    )


# --------------------------------------------------------------------------------------------------
# the wheel's metadata


def test_the_wheel_declares_the_entry_points_and_caps_nothing_airflow_uses(wheel: Path) -> None:
    points = wheel_entry_points(wheel)
    assert "[airflow.plugins]\ndelta_mirror = delta_mirror.airflow.ui_plugin:DeltaMirrorPlugin" in points
    assert (
        "[apache_airflow_provider]\nprovider_info = delta_mirror.airflow.provider_info:get_provider_info"
        in points
    )
    meta = wheel_metadata(wheel)
    extras = meta["Provides-Extra"]
    assert {"mysql", "duckdb", "service", "spark", "airflow", "all"} <= set(extras)
    requires = meta["Requires-Dist"]
    base = [r for r in requires if "extra ==" not in r]
    assert not [
        r
        for r in base
        if r.split()[0].startswith(("duckdb", "pymysql", "uvicorn", "starlette", "apache-airflow"))
    ]
    assert capped_tighter_than(requires, airflow_requirements(), extras) == []
    assert not (REPO / "include" / "delta_mirror.egg-info").exists()  # built from a copy


# --------------------------------------------------------------------------------------------------
# beside Airflow


def test_pip_check_is_clean_beside_airflow(airflow_venv: Venv) -> None:
    assert airflow_venv.pip("check").strip() == "No broken requirements found."


def test_airflow_lists_the_page_and_the_provider_from_the_entry_points(
    airflow_venv: Venv, site: dict[str, Path]
) -> None:
    env = airflow_env(site)
    assert not any((site["home"] / "plugins").iterdir())
    plugins = json.loads(checked(airflow_venv.run("airflow", "plugins", "-o", "json", env=env)))
    (mine,) = [p for p in plugins if p["name"] == "delta_mirror"]
    assert mine["source"].startswith("delta-mirror==0.1.0: EntryPoint(name='delta_mirror'"), mine["source"]
    assert mine["external_views"][0]["name"] == "Delta Mirror"
    providers = json.loads(checked(airflow_venv.run("airflow", "providers", "list", "-o", "json", env=env)))
    (provider,) = [p for p in providers if p["package_name"] == "delta-mirror"]
    assert provider["version"] == "0.1.0"
    hooks = checked(airflow_venv.run("airflow", "providers", "hooks", "-o", "json", env=env))
    (hook,) = [h for h in json.loads(hooks) if h["connection_type"] == "delta_mirror"]
    assert (
        hook["class"] == "delta_mirror.airflow.hooks.DeltaMirrorHook"
        and hook["package_name"] == "delta-mirror"
    )


PARSE = """
import json, sys
from airflow.dag_processing.dagbag import DagBag
bag = DagBag(dag_folder=sys.argv[1])
print(json.dumps({
    "errors": {k: str(v) for k, v in bag.import_errors.items()},
    "outlets": {d: {t.task_id: [repr(o) for o in t.outlets] for t in bag.dags[d].tasks} for d in bag.dag_ids},
}))
"""


def test_the_users_three_line_dag_file_yields_the_tables_dags_with_asset_outlets(
    airflow_venv: Venv, site: dict[str, Path]
) -> None:
    assert len(DAG_FILE.splitlines()) == 3
    env = airflow_env(site)
    del env["DELTA_MIRROR_CONFIG"]  # the DAG file names it
    out = checked(airflow_venv.run("python", "-c", PARSE, str(site["dags"]), env=env))
    parsed = json.loads(out.splitlines()[-1])  # after Airflow's log lines
    assert parsed["errors"] == {}
    outlets = parsed["outlets"]
    assert {"delta_mirror__orders", "delta_mirror__clicks", "delta_mirror_reconcile"} <= set(outlets)
    # the publishing task of each table has the table's asset as outlet (issue 37 item 4)
    assert outlets["delta_mirror__orders"]["publish"], outlets["delta_mirror__orders"]
    assert outlets["delta_mirror__clicks"]["sync"], outlets["delta_mirror__clicks"]
    assert "orders" in " ".join(outlets["delta_mirror__orders"]["publish"])


def test_the_page_loads_in_chromium_from_the_installed_package(
    airflow_venv: Venv, site: dict[str, Path], work: Path
) -> None:
    pytest.importorskip("playwright.sync_api")
    if not CHROMIUM.exists():
        skip_or_fail(f"{CHROMIUM} is missing (apt-get install chromium; .ci/run installs it)")
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    no_proxy = ",".join(x for x in (os.environ.get("NO_PROXY"), "127.0.0.1", "localhost") if x)
    env = airflow_env(
        site,
        AIRFLOW__API__HOST="127.0.0.1",
        AIRFLOW__API__PORT=str(port),
        AIRFLOW__API__BASE_URL=base,
        AIRFLOW__API__WORKERS="1",
        AIRFLOW__API_AUTH__JWT_SECRET=secrets.token_hex(16),
        AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS="admin:admin",
        NO_PROXY=no_proxy,
        no_proxy=no_proxy,
    )
    # What the server imports: the venv's copy; nothing of the checkout is on its path.
    where = checked(
        airflow_venv.run(
            "python",
            "-c",
            "import json, sys, delta_mirror.airflow.ui_plugin as m; print(json.dumps([m.__file__, sys.path]))",
            env=env,
            cwd=work,
        )
    )
    module_file, path = json.loads(where.splitlines()[-1])  # after Airflow's log lines
    assert Path(module_file).is_relative_to(airflow_venv.site_packages()), module_file
    assert not [p for p in path if p and Path(p).resolve().is_relative_to(REPO)], path

    checked(airflow_venv.run("airflow", "db", "migrate", env=env, cwd=work))
    log_path = work / "api-server.log"
    with log_path.open("ab") as log:
        server = subprocess.Popen(
            [str(airflow_venv.bin / "airflow"), "api-server"],
            cwd=work,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    client = httpx.Client(base_url=base, timeout=load_scaled(30), trust_env=False)
    try:
        _check_the_page(server, client, site, base, log_path)
    finally:
        client.close()
        stop_group(server, grace=load_scaled(30))


def _check_the_page(
    server: subprocess.Popen[bytes], client: httpx.Client, site: dict[str, Path], base: str, log_path: Path
) -> None:
    def exited() -> str | None:
        if server.poll() is None:
            return None
        return f"exit {server.returncode}: {log_path.read_text(errors='replace')[-3000:]}"

    def healthy() -> bool:
        try:
            return client.get("/api/v2/monitor/health").status_code == 200
        except httpx.HTTPError:
            return False

    wait_until(healthy, 120, "the API server's health endpoint", interval=1.0, alive=exited)
    password = json.loads((site["home"] / "simple_auth_manager_passwords.json.generated").read_text())[
        "admin"
    ]
    r = client.post("/auth/token", json={"username": "admin", "password": password})
    assert r.status_code == 201, r.text
    token = str(r.json()["access_token"])
    plugins = client.get("/api/v2/plugins", headers={"Authorization": f"Bearer {token}"}).json()
    (mine,) = [p for p in plugins["plugins"] if p["name"] == "delta_mirror"]
    assert "EntryPoint" in mine["source"] and "delta-mirror==0.1.0" in mine["source"]
    assert client.get("/delta-mirror/").status_code == 401  # Airflow's login on the page too

    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=str(CHROMIUM), args=["--headless", "--no-sandbox", "--disable-gpu"], headless=True
        )
        try:
            page = signed_in_page(browser, base, token, width=1280, height=800)
            frame = open_delta_mirror_page(page, base)  # the nav entry, the overview's first row
            assert frame.locator("#overview tbody tr").count() == len(TABLES)
            overview = frame.locator("#overview").inner_text()
            assert "orders" in overview and "clicks" in overview
        finally:
            browser.close()


# --------------------------------------------------------------------------------------------------
# the base install


def test_the_base_install_has_no_extra_and_its_cli_works_on_sqlite(base_venv: Venv, work: Path) -> None:
    found = checked(
        base_venv.run(
            "python",
            "-c",
            "import importlib.util as u, json; "
            "print(json.dumps({m: u.find_spec(m) is not None for m in "
            "('duckdb', 'duckdb_engine', 'pymysql', 'uvicorn', 'starlette', 'pyspark', 'airflow', 'deltalake')}))",
        )
    )
    assert json.loads(found) == {
        "duckdb": False,
        "duckdb_engine": False,
        "pymysql": False,
        "uvicorn": False,
        "starlette": False,
        "pyspark": False,
        "airflow": False,
        "deltalake": True,
    }
    assert base_venv.pip("check").strip() == "No broken requirements found."
    env = clean_env(DELTA_MIRROR_HOME=str(work / "base-home"))
    assert "Publish Delta logs" in checked(base_venv.run("delta-mirror", "--help", env=env))
    store = f"sqlite:///{work / 'base-store.db'}"
    checked(base_venv.run("delta-mirror", "init", "--store", store, env=env))
    # a table committed and published by the base install: the store, the publisher, deltalake
    actions = work / "actions.jsonl"
    actions.write_bytes(lines(action("protocol", protocol_body()), action("metaData", metadata_body())))
    root = work / "base-lake" / "events"
    dm = ("delta-mirror", "--store", store)
    checked(
        base_venv.run(
            *dm, "commit", "events", "--location", root.as_uri(), "--actions", str(actions), env=env
        )
    )
    checked(base_venv.run(*dm, "mirror", "events", env=env))
    (row,) = json.loads(checked(base_venv.run(*dm, "status", "--json", env=env)))
    assert (row["table"], row["latest_committed"], row["last_published"]) == ("events", 0, 0)
    assert (root / "_delta_log" / "00000000000000000000.json").is_file()

    for url, extra, what in (
        (f"duckdb:///{work / 'x.duckdb'}", "duckdb", "the DuckDB store"),
        ("mysql+pymysql://u:p@127.0.0.1:1/db", "mysql", "the MySQL/MariaDB store"),
    ):
        out = base_venv.run("delta-mirror", "status", "--store", url, env=env)
        assert out.returncode == 1, out
        assert_one_error_line(
            out.stderr, f"{what} needs the {extra} extra", f"pip install 'delta-mirror[{extra}]'"
        )
    assert not (work / "x.duckdb").exists()
    for command, extra, what in (
        (("validate", "events", "--reader", "duckdb"), "duckdb", "the duckdb reader"),
        (("checkpoint", "events", "--engine", "spark"), "spark", "Spark"),
    ):
        out = base_venv.run(*dm, *command, env=env)
        assert out.returncode == 1, out
        assert_one_error_line(out.stderr, f"{what} needs the {extra} extra", f"delta-mirror[{extra}]")
    serve = base_venv.run(*dm, "serve", "--no-auth", env=env)
    assert serve.returncode == 1, serve
    assert_one_error_line(serve.stderr, "needs the service extra", "delta-mirror[service]")


def test_the_base_install_refuses_the_airflow_glue_in_one_line(base_venv: Venv) -> None:
    out = base_venv.run("python", "-c", "import delta_mirror.airflow")
    assert out.returncode == 1
    assert "MissingExtraError: the Airflow glue (delta_mirror.airflow) needs the airflow extra" in out.stderr
