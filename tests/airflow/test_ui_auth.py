"""Who sees which table on the "Delta Mirror" page, under Airflow's FAB auth manager (per-DAG roles).

A real ``airflow api-server`` with ``FabAuthManager``, the project's DAGs and plugin, set up with
Airflow's own CLI (``db migrate``, ``dags reserialize``, ``sync-perm --include-dags``, ``roles
import``, ``users create``). Tables ``x`` and ``y`` are in the table config (DAGs ``delta_mirror__x``
and ``delta_mirror__y``); ``orphan`` is only in the store (no DAG). Users:

- ``reader_x``: a role that may read the DAG ``delta_mirror__x`` and nothing else;
- ``viewer``: FAB's Viewer (every DAG, not Airflow's configuration);
- ``admin``: FAB's Admin;
- ``nobody``: FAB's Public (no permission at all).

A table follows its own DAG, whatever the query string says; a table without a DAG needs the
``[delta_mirror] tables_without_dag`` permission (default: reading Airflow's configuration).
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from dm_airflow_kit import config_yaml, free_port, make_table
from support.services import stop_group
from support.waiting import load_scaled, wait_until

from delta_mirror.store import SqlStore

REPO = Path(__file__).resolve().parents[2]
FOREIGN = ("AIRFLOW_CONN_", "AIRFLOW_VAR_", "AIRFLOW__", "AWS_", "DELTA_MIRROR_")
FAB = "airflow.providers.fab.auth_manager.fab_auth_manager.FabAuthManager"
USERS = {"admin": "Admin", "viewer": "Viewer", "reader_x": "x_reader", "nobody": "Public"}
ROUTES = [
    "/delta-mirror/",
    "/delta-mirror/tables/x",
    "/delta-mirror/api/overview",
    "/delta-mirror/api/tables/x",
    "/delta-mirror/api/health",
    "/delta-mirror/docs",
    "/delta-mirror/redoc",
    "/delta-mirror/openapi.json",
]

# Airflow's own CLI, one command after the other in one interpreter (each `airflow` process would
# pay Airflow's imports again): the commands a user types, their exit codes checked.
SETUP = """
import sys
from airflow.cli import cli_parser
for argv in {commands!r}:
    args = cli_parser.get_parser().parse_args(argv)
    try:
        args.func(args)
    except SystemExit as exc:
        if exc.code not in (None, 0):
            raise SystemExit(f"airflow {{' '.join(argv)}} exited {{exc.code}}")
"""


class FabAirflow:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.passwords = {user: secrets.token_urlsafe(12) for user in USERS}
        store = root / "store.db"
        config = root / "delta_mirror.yaml"
        config.write_text(config_yaml({"x": {}, "y": {}}), encoding="utf-8")
        no_proxy = ",".join(x for x in (os.environ.get("NO_PROXY"), "127.0.0.1", "localhost") if x)
        self.env = {
            **{k: v for k, v in os.environ.items() if not k.startswith(FOREIGN) and k != "AIRFLOW_HOME"},
            "AIRFLOW_HOME": str(root / "airflow-home"),
            "AIRFLOW__CORE__AUTH_MANAGER": FAB,
            "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
            "AIRFLOW__CORE__PLUGINS_FOLDER": str(REPO / "plugins"),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__API__HOST": "127.0.0.1",
            "AIRFLOW__API__PORT": str(self.port),
            "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_urlsafe(32),
            "AIRFLOW__API__SECRET_KEY": secrets.token_urlsafe(32),
            "DELTA_MIRROR_STORE": f"sqlite:///{store}",
            "DELTA_MIRROR_CONFIG": str(config),
            "DELTA_MIRROR_HOME": str(root / "dm-home"),
            "NO_PROXY": no_proxy,
            "no_proxy": no_proxy,
            "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",
        }
        self.log_path = root / "api-server.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.client = httpx.Client(base_url=self.base_url, timeout=load_scaled(30), trust_env=False)

    def setup(self) -> None:
        roles = self.root / "roles.json"
        roles.write_text(
            json.dumps([{"name": "x_reader", "resource": "DAG:delta_mirror__x", "action": "can_read"}])
        )
        commands = [
            ["db", "migrate"],
            ["dags", "reserialize"],
            ["sync-perm", "--include-dags"],
            ["roles", "import", str(roles)],
        ]
        for user, role in USERS.items():
            commands.append(
                [
                    *("users", "create", "--username", user, "--role", role),
                    # one argument: a password may start with "-", which argparse reads as an option
                    f"--password={self.passwords[user]}",
                    *("--email", f"{user}@example.com"),
                    *("--firstname", user, "--lastname", "test"),
                ]
            )
        with self.log_path.open("ab") as log:
            subprocess.run(
                [sys.executable, "-c", SETUP.format(commands=commands)],
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                check=True,
                timeout=load_scaled(600),
            )

    def start(self) -> None:
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "airflow", "api-server", "--port", str(self.port)],
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )

        def up() -> bool:
            try:
                return self.client.get("/api/v2/version").status_code in (200, 401, 403)
            except httpx.HTTPError:
                return False

        wait_until(up, load_scaled(180), "the api-server", interval=1.0, alive=self.exited)

    def exited(self) -> str | None:
        if self.proc is None or self.proc.poll() is None:
            return None
        return f"exit {self.proc.returncode}: {self.log_path.read_text(errors='replace')[-3000:]}"

    def headers(self, user: str) -> dict[str, str]:
        r = self.client.post("/auth/token", json={"username": user, "password": self.passwords[user]})
        assert r.status_code in (200, 201), r.text
        return {"Authorization": f"Bearer {r.json()['access_token']}"}

    def stop(self) -> None:
        self.client.close()
        if self.proc is not None:
            stop_group(self.proc, grace=load_scaled(30))


@pytest.fixture(scope="module")
def fab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FabAirflow]:
    pytest.importorskip("airflow.providers.fab", reason="apache-airflow-providers-fab (requirements.txt)")
    root = tmp_path_factory.mktemp("ui-auth")
    server = FabAirflow(root)
    store = SqlStore(server.env["DELTA_MIRROR_STORE"])
    store.init()
    for name in ("x", "y", "orphan"):
        (root / "lake" / name).mkdir(parents=True)
        make_table(store, name, (root / "lake" / name).as_uri(), versions=2)
    store.close()
    try:
        server.setup()
        server.start()
        yield server
    finally:
        server.stop()
        out = REPO / "test-artifacts" / "ui_auth"
        out.mkdir(parents=True, exist_ok=True)
        if server.log_path.exists():
            (out / "api-server.log").write_bytes(server.log_path.read_bytes())


def _tables(fab: FabAirflow, user: str, query: str = "") -> list[str]:
    r = fab.client.get(f"/delta-mirror/api/overview{query}", headers=fab.headers(user))
    assert r.status_code == 200, r.text
    return [t["table"] for t in r.json()["tables"]]


def test_every_route_docs_included_needs_a_login(fab: FabAirflow) -> None:
    for route in ROUTES:
        assert fab.client.get(route).status_code == 401, route
        bad = fab.client.get(route, headers={"Authorization": "Bearer not-a-jwt"})
        assert bad.status_code in (401, 403), (route, bad.status_code)


def test_a_reader_of_one_dag_sees_its_table_only_whatever_the_query_string(fab: FabAirflow) -> None:
    assert _tables(fab, "reader_x") == ["x"]
    for query in ("?dag_id=delta_mirror__y", "?dag_id=delta_mirror__x", "?dag_id=~"):
        assert _tables(fab, "reader_x", query) == ["x"], query
    auth = fab.headers("reader_x")
    for path in ("/delta-mirror/api/tables/x", "/delta-mirror/tables/x"):
        assert fab.client.get(path, headers=auth).status_code == 200, path
    for name in ("y", "orphan", "no-such-table"):
        for query in ("", "?dag_id=delta_mirror__x", f"?dag_id=delta_mirror__{name}"):
            api = fab.client.get(f"/delta-mirror/api/tables/{name}{query}", headers=auth)
            assert api.status_code == 403, (name, query, api.text)
            page = fab.client.get(f"/delta-mirror/tables/{name}{query}", headers=auth)
            assert page.status_code == 403 and "text/html" in page.headers["content-type"], (name, query)
            assert "<h1>Not allowed</h1>" in page.text
    health = fab.client.get("/delta-mirror/api/health?dag_id=delta_mirror__y", headers=auth).json()
    assert [t["table"] for t in health["tables"]] == ["x"]
    overview = fab.client.get("/delta-mirror/", headers=auth).text
    assert "tables/x'" in overview and "tables/y'" not in overview and "orphan" not in overview


def test_a_user_of_no_dag_sees_an_empty_overview_that_says_why(fab: FabAirflow) -> None:
    """``nobody``: no DAG role at all; the page does not claim the store is empty."""
    assert _tables(fab, "nobody") == []
    page = fab.client.get("/delta-mirror/", headers=fab.headers("nobody"))
    assert page.status_code == 200 and "none whose DAG you may read" in page.text
    health = fab.client.get("/delta-mirror/api/health", headers=fab.headers("nobody")).json()
    assert health["tables"] == []


def test_a_viewer_reads_every_dag_but_not_tables_without_one(fab: FabAirflow) -> None:
    assert _tables(fab, "viewer") == ["x", "y"]
    auth = fab.headers("viewer")
    assert fab.client.get("/delta-mirror/api/tables/y", headers=auth).status_code == 200
    refused = fab.client.get("/delta-mirror/api/tables/orphan", headers=auth)
    assert refused.status_code == 403 and "tables_without_dag" in refused.json()["detail"]


def test_admin_sees_every_table_and_a_table_without_a_dag_has_no_dag_link(fab: FabAirflow) -> None:
    assert _tables(fab, "admin") == ["orphan", "x", "y"]
    auth = fab.headers("admin")
    rows = {
        t["table"]: t for t in fab.client.get("/delta-mirror/api/overview", headers=auth).json()["tables"]
    }
    assert rows["x"]["dag_id"] == "delta_mirror__x" and rows["orphan"]["dag_id"] is None
    overview = fab.client.get("/delta-mirror/", headers=auth).text
    assert "href='/dags/delta_mirror__x'" in overview and "/dags/delta_mirror__orphan" not in overview
    assert "no DAG" in overview
    page = fab.client.get("/delta-mirror/tables/orphan", headers=auth)
    assert page.status_code == 200 and "/dags/delta_mirror__orphan" not in page.text
    assert fab.client.get("/delta-mirror/api/tables/orphan", headers=auth).json()["dag_id"] is None


def test_an_unknown_table_is_an_html_404_page_not_json(fab: FabAirflow) -> None:
    auth = fab.headers("admin")
    page = fab.client.get("/delta-mirror/tables/no-such-table", headers=auth)
    assert page.status_code == 404 and "text/html" in page.headers["content-type"]
    assert "<h1>No such table</h1>" in page.text and "no-such-table" in page.text
    assert not page.text.lstrip().startswith("{")
    assert fab.client.get("/delta-mirror/api/tables/no-such-table", headers=auth).status_code == 404


def test_the_openapi_schema_and_docs_answer_a_logged_in_user(fab: FabAirflow) -> None:
    auth = fab.headers("reader_x")
    schema = fab.client.get("/delta-mirror/openapi.json", headers=auth)
    assert schema.status_code == 200, schema.text
    assert {"/", "/api/overview", "/api/tables/{name}", "/api/health"} <= set(schema.json()["paths"])
    for viewer in ("/delta-mirror/docs", "/delta-mirror/redoc"):
        page = fab.client.get(viewer, headers=auth)
        assert page.status_code == 200 and "/delta-mirror/openapi.json" in page.text, viewer


@pytest.mark.parametrize(
    ("setting", "role", "sees_orphan"),
    [
        ("configuration", "viewer", True),  # the Simple auth manager lets a viewer read the configuration
        ("authenticated", "viewer", True),
        ("nobody", "admin", False),
        (" Nobody ", "admin", False),
    ],
)
def test_tables_without_a_dag_follow_the_setting(setting: str, role: str, sees_orphan: bool) -> None:
    """The setting's values, asked of Airflow's Simple auth manager (roles, no per-DAG grants)."""
    from airflow.api_fastapi.auth.managers.simple.simple_auth_manager import SimpleAuthManager
    from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser

    from delta_mirror.airflow.ui_app import TableAccess
    from delta_mirror.table_config import parse_config

    config = parse_config(config_yaml({"x": {}}))
    manager = SimpleAuthManager()  # type: ignore[no-untyped-call]
    access = TableAccess(SimpleAuthManagerUser(username=role, role=role), config, manager, setting)
    assert access.visible("x") and access.may_read("x")
    assert access.visible("orphan") is sees_orphan and access.may_read("orphan") is sees_orphan


def test_an_unknown_setting_is_one_clear_message() -> None:
    from delta_mirror.airflow.ui_app import SettingError, tables_without_dag_setting

    assert tables_without_dag_setting(None) == "configuration"  # unset: the default
    with pytest.raises(SettingError) as info:
        tables_without_dag_setting("admins")
    message = str(info.value)
    assert "AIRFLOW__DELTA_MIRROR__TABLES_WITHOUT_DAG" in message and "'admins'" in message
    assert "configuration, authenticated, nobody" in message
