"""The Docker Compose stack (docker-compose.yaml, docker/), checked by parsing: no Docker engine needed.

The file is loaded with PyYAML (``<<:`` merge keys resolved) and Compose's ``${VAR:-default}``
interpolation is applied with the defaults, i.e. what ``docker compose up`` uses without a ``.env``.
The checks are about consistency: the connections point at services and ports that exist, the store
database is the one the init script creates, the bucket is the one the tables use, the mounts exist
in the repository, the example table config validates. When a ``docker compose`` CLI is installed,
``docker compose config`` (a parser; it needs no engine) must accept the file too.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import unquote, urlsplit

import pytest
import yaml

from delta_mirror.table_config import MirrorConfig, parse_config

ROOT = Path(__file__).resolve().parents[1]
COMPOSE_FILE = ROOT / "docker-compose.yaml"
DOCKERFILE = ROOT / "docker" / "Dockerfile.airflow"
EXAMPLE_CONFIG = ROOT / "docker" / "delta_mirror.compose.yaml"
POSTGRES_INIT = ROOT / "docker" / "postgres-init"
README = ROOT / "README.md"
README_SECTION = "## Docker Compose stack"

AIRFLOW_SERVICES = (
    "airflow-api-server",
    "airflow-scheduler",
    "airflow-dag-processor",
    "airflow-triggerer",
    "airflow-worker",
)
ONE_SHOTS = ("airflow-init", "minio-init")
REQUIRED_SERVICES = (
    *AIRFLOW_SERVICES,
    *ONE_SHOTS,
    "postgres",
    "redis",
    "minio",
    "mailpit",
    "spark-master",
    "spark-worker",
    "commit-service",
)
CONNECTION_IDS = ("delta_mirror_store", "minio", "smtp_default")

_VAR = re.compile(
    r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?+])((?:[^{}]|\{[^{}]*\})*))?\}|\$([A-Za-z_][A-Za-z0-9_]*)"
)


# --------------------------------------------------------------------------------------------------
# loading


def interpolate(value: Any) -> Any:
    """Compose interpolation with every variable unset: ``${V:-d}`` → d, ``${V}`` → '', ``$$`` → ``$``."""
    if isinstance(value, str):

        def sub(m: re.Match[str]) -> str:
            if m[0] == "$$":
                return "$"
            op, default = m[2], m[3]
            if op in (":-", "-"):
                return str(interpolate(default))
            if op in (":?", "?"):
                raise AssertionError(f"{m[0]}: a required variable (the stack must start without a .env)")
            return ""

        return _VAR.sub(sub, value)
    if isinstance(value, dict):
        return {k: interpolate(v) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v) for v in value]
    return value


def variables_used(text: str) -> set[str]:
    return {m[1] or m[4] for m in _VAR.finditer(text) if m[0] != "$$"}


@pytest.fixture(scope="module")
def raw() -> dict[str, Any]:
    doc = yaml.safe_load(COMPOSE_FILE.read_text(encoding="utf-8"))  # SafeLoader resolves `<<:` merges
    assert isinstance(doc, dict) and isinstance(doc.get("services"), dict)
    return doc


@pytest.fixture(scope="module")
def compose(raw: dict[str, Any]) -> dict[str, Any]:
    return interpolate(raw)  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return compose["services"]  # type: ignore[no-any-return]


def env_of(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) if "=" in item else (item, "") for item in env)
    return {str(k): "" if v is None else str(v) for k, v in env.items()}


def volumes_of(service: dict[str, Any]) -> list[dict[str, Any]]:
    """Volumes in the long syntax (type, source, target, read_only)."""
    out = []
    for v in service.get("volumes") or []:
        if isinstance(v, dict):
            out.append(v)
            continue
        parts = v.split(":")
        source, target = parts[0], parts[1]
        kind = "bind" if source.startswith((".", "/", "~")) else "volume"
        out.append({"type": kind, "source": source, "target": target, "read_only": "ro" in parts[2:]})
    return out


def ports_of(service: dict[str, Any]) -> list[tuple[str | None, int]]:
    """(published host port or None, container port) for every port mapping."""
    out: list[tuple[str | None, int]] = []
    for p in service.get("ports") or []:
        if isinstance(p, dict):
            published = p.get("published")
            out.append((str(published) if published is not None else None, int(p["target"])))
            continue
        text = str(p).split("/")[0]
        parts = text.rsplit(":", 2)
        if len(parts) == 1:
            out.append((None, int(parts[0])))
        else:
            out.append((parts[-2], int(parts[-1])))
    return out


def container_ports(service: dict[str, Any]) -> set[int]:
    return {c for _, c in ports_of(service)} | {
        int(str(e).split("/")[0]) for e in service.get("expose") or []
    }


def depends_on(service: dict[str, Any]) -> dict[str, dict[str, Any]]:
    deps = service.get("depends_on") or {}
    if isinstance(deps, list):
        return {d: {"condition": "service_started"} for d in deps}
    return {k: (v or {"condition": "service_started"}) for k, v in deps.items()}


def command_text(service: dict[str, Any]) -> str:
    cmd = service.get("command") or ""
    return cmd if isinstance(cmd, str) else " ".join(str(c) for c in cmd)


def host_path(source: str) -> Path:
    return (ROOT / source).resolve() if not source.startswith("/") else Path(source)


def container_to_host(services_: dict[str, dict[str, Any]], service: str, path: str) -> Path | None:
    """The repository file behind a container path, through the service's bind mounts."""
    target = PurePosixPath(path)
    best: tuple[int, Path] | None = None
    for vol in volumes_of(services_[service]):
        if vol["type"] != "bind":
            continue
        mount = PurePosixPath(vol["target"])
        if target == mount or mount in target.parents:
            rel = target.relative_to(mount)
            candidate = host_path(vol["source"]) / rel
            if best is None or len(mount.parts) > best[0]:
                best = (len(mount.parts), candidate)
    return best[1] if best else None


def url_parts(url: str) -> dict[str, Any]:
    parts = urlsplit(url)
    return {
        "scheme": parts.scheme,
        "host": parts.hostname,
        "port": parts.port,
        "user": unquote(parts.username or ""),
        "password": unquote(parts.password or ""),
        "db": parts.path.lstrip("/"),
    }


def airflow_env(services_: dict[str, dict[str, Any]]) -> dict[str, str]:
    return env_of(services_["airflow-worker"])


def conn_env_name(conn_id: str) -> str:
    return "AIRFLOW_CONN_" + conn_id.upper()


@pytest.fixture(scope="module")
def store_sql() -> dict[str, str]:
    """Role, password and database created by the PostgreSQL init scripts."""
    text = "\n".join(p.read_text(encoding="utf-8") for p in sorted(POSTGRES_INIT.glob("*.sql")))
    db = re.search(r"CREATE\s+DATABASE\s+\"?(\w+)\"?\s+OWNER\s+\"?(\w+)\"?", text, re.I)
    role = re.search(
        r"CREATE\s+(?:ROLE|USER)\s+\"?(\w+)\"?\s+(?:WITH\s+)?LOGIN\s+PASSWORD\s+'([^']*)'", text, re.I
    )
    assert db and role, (
        f"{POSTGRES_INIT}: expected CREATE ROLE ... LOGIN PASSWORD and CREATE DATABASE ... OWNER"
    )
    assert db[2] == role[1], "the store database is owned by the role the connection logs in as"
    return {"db": db[1], "user": role[1], "password": role[2]}


@pytest.fixture(scope="module")
def bucket(services: dict[str, dict[str, Any]]) -> str:
    script = command_text(services["minio-init"])
    alias = re.search(r"mc\s+alias\s+set\s+(\S+)\s+(\S+)", script)
    assert alias, "minio-init sets an mc alias for the minio service"
    parts = url_parts(alias[2])
    assert (parts["host"], parts["port"]) == ("minio", 9000), alias[2]
    made = re.findall(rf"mc\s+mb\s+(?:--?\S+\s+)*{re.escape(alias[1])}/([a-z0-9][a-z0-9.-]+)", script)
    assert len(made) == 1, f"minio-init creates exactly one bucket: {made}"
    return str(made[0])


@pytest.fixture(scope="module")
def example_config() -> MirrorConfig:
    return parse_config(EXAMPLE_CONFIG.read_text(encoding="utf-8"), str(EXAMPLE_CONFIG))


def readme_section() -> str:
    text = README.read_text(encoding="utf-8")
    assert README_SECTION in text, f"README.md has a '{README_SECTION}' section"
    section = text.split(README_SECTION, 1)[1]
    return re.split(r"\n## ", section, maxsplit=1)[0]


# --------------------------------------------------------------------------------------------------
# services and images


def test_required_services_have_images(services: dict[str, dict[str, Any]]) -> None:
    missing = [s for s in REQUIRED_SERVICES if s not in services]
    assert not missing, f"missing services: {missing}"
    for name in REQUIRED_SERVICES:
        assert services[name].get("image"), f"{name} has no image"
    expected = {
        "postgres": r"^postgres:\d+",
        "redis": r"^redis:\d+",
        "minio": r"^(quay\.io/)?minio/minio:",
        "minio-init": r"^(quay\.io/)?minio/mc:",
        "mailpit": r"^axllent/mailpit:",
        "spark-master": r"^apache/spark:\d+\.\d+",
        "spark-worker": r"^apache/spark:\d+\.\d+",
    }
    for name, pattern in expected.items():
        assert re.match(pattern, services[name]["image"]), f"{name}: image {services[name]['image']}"
    assert services["spark-master"]["image"] == services["spark-worker"]["image"]


def test_airflow_image_is_airflow_3_3(services: dict[str, dict[str, Any]]) -> None:
    dockerfile = DOCKERFILE.read_text(encoding="utf-8")
    arg = re.search(r"^ARG\s+AIRFLOW_BASE_IMAGE=(\S+)", dockerfile, re.M)
    assert arg and re.search(r"^FROM\s+\$\{AIRFLOW_BASE_IMAGE\}", dockerfile, re.M)
    base = arg[1]
    m = re.fullmatch(r"apache/airflow:(3\.3\.\d+)(-python3\.1[1-3])?", base)
    assert m, f"base image {base} is not Airflow 3.3.x"
    # The image runs the Airflow version the project pins and CI tests.
    pins = (ROOT / "requirements.txt").read_text(encoding="utf-8")
    pinned = re.search(r"^apache-airflow(?:\[[^\]]*\])?==(\S+)", pins, re.M)
    assert pinned and pinned[1] == m[1], f"requirements.txt pins Airflow {pinned and pinned[1]}, image {base}"
    assert "pip install" in dockerfile and '-e "/opt/delta-mirror[airflow]"' in dockerfile
    for name in (*AIRFLOW_SERVICES, "airflow-init"):
        svc = services[name]
        build = svc.get("build") or {}
        assert (
            ROOT / build.get("context", ".") / build.get("dockerfile", "Dockerfile")
        ).resolve() == DOCKERFILE
        assert build.get("args", {}).get("AIRFLOW_BASE_IMAGE") == base
        assert "3.3" in svc["image"]


def test_dockerignore_keeps_what_the_install_needs() -> None:
    ignore = (ROOT / "docker" / "Dockerfile.airflow.dockerignore").read_text(encoding="utf-8").split()
    for needed in ("pyproject.toml", "README.md", "requirements.txt", "include/"):
        assert f"!{needed}" in ignore
        assert (ROOT / needed).exists()


def test_celery_executor_with_redis(services: dict[str, dict[str, Any]]) -> None:
    env = airflow_env(services)
    assert env["AIRFLOW__CORE__EXECUTOR"] == "CeleryExecutor"
    broker = url_parts(env["AIRFLOW__CELERY__BROKER_URL"])
    assert broker["scheme"] == "redis" and broker["host"] == "redis"
    assert (broker["port"] or 6379) in container_ports(services["redis"]) | {6379}
    api = url_parts(env["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"])
    assert api["host"] == "airflow-api-server"
    assert api["port"] in container_ports(services["airflow-api-server"])
    assert "api-server" in command_text(services["airflow-api-server"])


# --------------------------------------------------------------------------------------------------
# shared Airflow settings and mounts


def test_airflow_services_share_common_env_and_mounts(
    raw: dict[str, Any], services: dict[str, dict[str, Any]]
) -> None:
    common = interpolate(raw["x-airflow-common"])
    common_env = env_of(common)
    common_volumes = volumes_of(common)
    assert common_env and common_volumes
    for name in (*AIRFLOW_SERVICES, "airflow-init"):
        svc = services[name]
        env = env_of(svc)
        differing = {k for k, v in common_env.items() if env.get(k) != v}
        assert not differing, f"{name}: environment differs from x-airflow-common for {sorted(differing)}"
        vols = volumes_of(svc)
        assert all(v in vols for v in common_volumes), f"{name}: lacks the common mounts"
        assert svc["image"] == common["image"]
    for name in AIRFLOW_SERVICES:
        assert services[name].get("user") == common["user"], name


def test_project_is_mounted_from_existing_paths(
    raw: dict[str, Any], services: dict[str, dict[str, Any]]
) -> None:
    common = interpolate(raw["x-airflow-common"])
    binds = {PurePosixPath(v["source"]).name: v for v in volumes_of(common) if v["type"] == "bind"}
    for needed in ("dags", "config", "include", "pyproject.toml"):
        assert needed in binds, f"x-airflow-common does not mount ./{needed}"
    for name, svc in services.items():
        for vol in volumes_of(svc):
            if vol["type"] == "bind":
                assert host_path(vol["source"]).exists(), (
                    f"{name}: mount source {vol['source']} does not exist"
                )
            elif vol["type"] == "volume":
                assert vol["source"] in (raw.get("volumes") or {}), (
                    f"{name}: undeclared volume {vol['source']}"
                )
    env = env_of(common)
    assert binds["dags"]["target"] == env["AIRFLOW__CORE__DAGS_FOLDER"]
    # The editable install lives where include/ and pyproject.toml are mounted.
    dockerfile = DOCKERFILE.read_text(encoding="utf-8")
    project = PurePosixPath(re.search(r'-e\s+"([^"\[]+)', dockerfile)[1])  # type: ignore[index]
    assert PurePosixPath(binds["include"]["target"]) == project / "include"
    assert PurePosixPath(binds["pyproject.toml"]["target"]) == project / "pyproject.toml"


def test_delta_mirror_config_points_into_a_mount(services: dict[str, dict[str, Any]]) -> None:
    for name in (*AIRFLOW_SERVICES, "airflow-init"):
        path = env_of(services[name])["DELTA_MIRROR_CONFIG"]
        host = container_to_host(services, name, path)
        assert host is not None, f"{name}: DELTA_MIRROR_CONFIG={path} is not under a bind mount"
        assert host.resolve() == EXAMPLE_CONFIG.resolve(), f"{name}: {path} → {host}"


def test_airflow_init_script(services: dict[str, dict[str, Any]]) -> None:
    init = services["airflow-init"]
    cmd = init["command"] if isinstance(init["command"], list) else init["command"].split()
    script = container_to_host(services, "airflow-init", cmd[0])
    assert script is not None and script.is_file(), f"airflow-init runs {cmd[0]}, not a mounted file"
    text = script.read_text(encoding="utf-8")
    for step in ("airflow db migrate", "airflow users create", "delta-mirror init"):
        assert step in text, f"{script.name} does not run '{step}'"
    assert init.get("restart") in (None, "no")


# --------------------------------------------------------------------------------------------------
# connections ↔ services


def test_store_connection_matches_init_script(
    services: dict[str, dict[str, Any]], store_sql: dict[str, str]
) -> None:
    env = airflow_env(services)
    conn = url_parts(env[conn_env_name("delta_mirror_store")])
    cli = url_parts(env["DELTA_MIRROR_STORE"])
    assert conn["scheme"] in ("postgres", "postgresql")
    assert cli["scheme"].startswith("postgresql")
    for parts in (conn, cli):
        assert parts["host"] == "postgres" and (parts["port"] or 5432) == 5432
        assert (parts["db"], parts["user"], parts["password"]) == (
            store_sql["db"],
            store_sql["user"],
            store_sql["password"],
        )
    init_mounts = [
        v for v in volumes_of(services["postgres"]) if v["target"] == "/docker-entrypoint-initdb.d"
    ]
    assert init_mounts and host_path(init_mounts[0]["source"]) == POSTGRES_INIT.resolve()


def test_airflow_metadata_db_matches_postgres(
    services: dict[str, dict[str, Any]], store_sql: dict[str, str]
) -> None:
    pg = env_of(services["postgres"])
    env = airflow_env(services)
    for key in ("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", "AIRFLOW__CELERY__RESULT_BACKEND"):
        parts = url_parts(env[key])
        assert parts["host"] == "postgres" and (parts["port"] or 5432) == 5432, key
        assert (parts["db"], parts["user"], parts["password"]) == (
            pg["POSTGRES_DB"],
            pg["POSTGRES_USER"],
            pg["POSTGRES_PASSWORD"],
        ), key
    assert pg["POSTGRES_DB"] != store_sql["db"], "the store has its own database"


def test_minio_connection_matches_minio(services: dict[str, dict[str, Any]]) -> None:
    env = airflow_env(services)
    conn = json.loads(env[conn_env_name("minio")])
    minio = env_of(services["minio"])
    assert conn["conn_type"] == "aws"
    assert (conn["login"], conn["password"]) == (minio["MINIO_ROOT_USER"], minio["MINIO_ROOT_PASSWORD"])
    endpoint = url_parts(conn["extra"]["endpoint_url"])
    assert endpoint["scheme"] == "http" and endpoint["host"] == "minio" and endpoint["port"] == 9000
    assert 9000 in container_ports(services["minio"])
    assert "--address" not in command_text(services["minio"]), "MinIO serves S3 on its default :9000"
    # The CLI inside the containers uses the same endpoint and keys.
    assert env["AWS_ENDPOINT_URL"] == conn["extra"]["endpoint_url"]
    assert (env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"]) == (conn["login"], conn["password"])
    init = env_of(services["minio-init"])
    assert (init["MINIO_ROOT_USER"], init["MINIO_ROOT_PASSWORD"]) == (conn["login"], conn["password"])


def test_smtp_connection_is_mailpit(services: dict[str, dict[str, Any]]) -> None:
    conn = json.loads(airflow_env(services)[conn_env_name("smtp_default")])
    assert conn["conn_type"] == "smtp"
    assert (conn["host"], int(conn["port"])) == ("mailpit", 1025)
    assert {1025, 8025} <= container_ports(services["mailpit"])
    assert conn["extra"].get("disable_tls") is True and conn["extra"].get("disable_ssl") is True


def test_spark_master_and_worker_agree(services: dict[str, dict[str, Any]]) -> None:
    master = command_text(services["spark-master"])
    assert "deploy.master.Master" in master
    port = int(re.search(r"--port\s+(\d+)", master)[1])  # type: ignore[index]
    worker = command_text(services["spark-worker"])
    assert "deploy.worker.Worker" in worker and f"spark://spark-master:{port}" in worker
    conn = url_parts(airflow_env(services)[conn_env_name("spark_default")])
    assert (conn["scheme"], conn["host"], conn["port"]) == ("spark", "spark-master", port)


def test_connections_parse_as_airflow_connections(
    services: dict[str, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Airflow reads the AIRFLOW_CONN_* values, and the delta-mirror hook turns them into a store URL and S3 options."""
    pytest.importorskip("airflow")
    from airflow.models.connection import Connection

    from delta_mirror.airflow.hooks import DeltaMirrorHook

    env = airflow_env(services)
    conns = {}
    for conn_id in CONNECTION_IDS:
        value = env[conn_env_name(conn_id)]
        if value.lstrip().startswith("{"):
            conns[conn_id] = Connection.from_json(value, conn_id=conn_id)
        else:
            conns[conn_id] = Connection(conn_id=conn_id, uri=value)
    assert conns["delta_mirror_store"].conn_type == "postgres"
    assert conns["smtp_default"].host == "mailpit" and conns["smtp_default"].port == 1025

    monkeypatch.setattr(DeltaMirrorHook, "get_connection", classmethod(lambda cls, conn_id: conns[conn_id]))
    hook = DeltaMirrorHook(store_conn_id="delta_mirror_store", aws_conn_id="minio")
    store = url_parts(hook.store_url or "")
    cli = url_parts(env["DELTA_MIRROR_STORE"])
    assert store == cli, "the DAGs (connection) and the CLI (DELTA_MIRROR_STORE) use the same store"
    assert hook.storage_options == {
        "AWS_ACCESS_KEY_ID": env["AWS_ACCESS_KEY_ID"],
        "AWS_SECRET_ACCESS_KEY": env["AWS_SECRET_ACCESS_KEY"],
        "AWS_ENDPOINT_URL": env["AWS_ENDPOINT_URL"],
        "AWS_ALLOW_HTTP": "true",
        "AWS_REGION": env["AWS_REGION"],
    }


# --------------------------------------------------------------------------------------------------
# the example table config and the bucket


def test_example_table_config_validates(
    example_config: MirrorConfig, services: dict[str, dict[str, Any]]
) -> None:
    assert example_config.tables, "the example config defines at least one table"
    env = airflow_env(services)
    # The reconcile and monitor DAGs use the defaults' connections, the table DAGs their own.
    for cfg in (example_config.defaults, *example_config.tables.values()):
        assert cfg.store_conn_id == "delta_mirror_store", cfg.name
        assert cfg.aws_conn_id == "minio", cfg.name
        assert cfg.notify.smtp_conn_id == "smtp_default", cfg.name
        for conn_id in (cfg.store_conn_id, cfg.aws_conn_id, cfg.notify.smtp_conn_id):
            assert conn_env_name(conn_id) in env, f"{cfg.name}: connection {conn_id} is not defined"


def test_bucket_matches_table_locations(bucket: str) -> None:
    sources = {
        EXAMPLE_CONFIG.name: EXAMPLE_CONFIG.read_text(encoding="utf-8"),
        "README.md": readme_section(),
    }
    seen = 0
    for name, text in sources.items():
        for found in re.findall(r"s3://([a-z0-9][a-z0-9.-]+)/", text):
            assert found == bucket, f"{name} uses s3://{found}/ but minio-init creates '{bucket}'"
            seen += 1
    assert seen, "no s3:// table location in the example config or the README section"


def test_create_table_example_actions() -> None:
    """The README's create-table example commits protocol + metaData (an empty table)."""
    lines = (ROOT / "docker" / "examples" / "create-sales.jsonl").read_text(encoding="utf-8").splitlines()
    kinds = [next(iter(json.loads(line))) for line in lines if line.strip()]
    assert kinds == ["protocol", "metaData"]
    assert "docker/examples/create-sales.jsonl" in readme_section()


def test_commit_service_serves_the_store_with_a_token(
    services: dict[str, dict[str, Any]], bucket: str
) -> None:
    """``delta-mirror serve`` on the store the CLI and DAGs use, reachable, authenticated, probed."""
    svc = services["commit-service"]
    argv = [*svc["entrypoint"], *svc["command"]]
    assert argv[:2] == ["delta-mirror", "serve"] and "--no-auth" not in argv
    port = int(argv[argv.index("--port") + 1])
    assert argv[argv.index("--host") + 1] == "0.0.0.0"
    assert port in container_ports(svc)
    env = env_of(svc)
    assert env["DELTA_MIRROR_STORE"] == airflow_env(services)["DELTA_MIRROR_STORE"]
    assert env["DELTA_MIRROR_COMMIT_TOKEN"], "serve refuses to start without a token"
    assert env["DELTA_MIRROR_COMMIT_ALLOW_ROOTS"].startswith(f"s3://{bucket}/")
    assert f"localhost:{port}/health" in str(svc["healthcheck"]["test"])
    deps = depends_on(svc)
    assert deps["postgres"]["condition"] == "service_healthy"
    assert deps["airflow-init"]["condition"] == "service_completed_successfully", "the store schema first"
    common = interpolate(yaml.safe_load(COMPOSE_FILE.read_text(encoding="utf-8"))["x-airflow-common"])
    assert svc["image"] == common["image"], "the image with delta-mirror installed"


# --------------------------------------------------------------------------------------------------
# dependencies, ports, healthchecks


def test_depends_on_references_existing_services(services: dict[str, dict[str, Any]]) -> None:
    for name, svc in services.items():
        for dep, spec in depends_on(svc).items():
            assert dep in services, f"{name} depends on unknown service {dep}"
            assert dep != name
            condition = spec.get("condition", "service_started")
            assert condition in ("service_started", "service_healthy", "service_completed_successfully")
            if condition == "service_healthy":
                assert services[dep].get("healthcheck"), (
                    f"{name} waits for {dep} to be healthy: no healthcheck"
                )
            if condition == "service_completed_successfully":
                assert dep in ONE_SHOTS, f"{name} waits for {dep} to complete, but it is not a one-shot"
    for name in AIRFLOW_SERVICES:
        deps = depends_on(services[name])
        assert deps.get("airflow-init", {}).get("condition") == "service_completed_successfully", name
        assert deps.get("postgres", {}).get("condition") == "service_healthy", name
        assert deps.get("redis", {}).get("condition") == "service_healthy", name
    assert depends_on(services["airflow-init"])["minio-init"]["condition"] == "service_completed_successfully"


def test_no_dependency_cycle(services: dict[str, dict[str, Any]]) -> None:
    state: dict[str, int] = {}

    def visit(name: str, path: tuple[str, ...]) -> None:
        if state.get(name) == 2:
            return
        assert state.get(name) != 1, f"dependency cycle: {' -> '.join((*path, name))}"
        state[name] = 1
        for dep in depends_on(services[name]):
            visit(dep, (*path, name))
        state[name] = 2

    for name in services:
        visit(name, ())


def test_published_ports_are_unique(services: dict[str, dict[str, Any]]) -> None:
    published: dict[str, str] = {}
    for name, svc in services.items():
        for host, _ in ports_of(svc):
            if host is None:
                continue
            port = host.rsplit(":", 1)[-1]
            assert port not in published, f"host port {port}: {published.get(port)} and {name}"
            published[port] = name
    for port in ("8080", "9001", "8025"):
        assert port in published, f"host port {port} is not published"


def test_healthchecks(services: dict[str, dict[str, Any]]) -> None:
    for name in ("postgres", "redis", "minio", "mailpit", "commit-service", *AIRFLOW_SERVICES):
        check = services[name].get("healthcheck") or {}
        assert check.get("test") and not check.get("disable"), f"{name} has no healthcheck"
    assert "pg_isready" in str(services["postgres"]["healthcheck"]["test"])


def test_readme_section(services: dict[str, dict[str, Any]]) -> None:
    section = readme_section()
    assert "docker compose up -d" in section
    published = {host.rsplit(":", 1)[-1] for svc in services.values() for host, _ in ports_of(svc) if host}
    urls = set(re.findall(r"http://localhost:(\d+)", section))
    assert {"8080", "9001", "8025"} <= urls
    assert urls <= published, f"README URLs on ports {sorted(urls - published)} are not published"
    assert "docker compose exec" in section and "delta-mirror" in section


# --------------------------------------------------------------------------------------------------
# docker compose itself, when installed (a parser: no engine needed)


def _compose_cli() -> list[str] | None:
    candidates = []
    if shutil.which("docker"):
        candidates.append(["docker", "compose"])
    if shutil.which("docker-compose"):
        candidates.append(["docker-compose"])
    for cmd in candidates:
        try:
            out = subprocess.run([*cmd, "version"], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            continue
        # Compose v1 (docker-compose 1.x, Python) predates the Compose Specification: not a reference.
        if out.returncode == 0 and not re.search(r"version 1\.", out.stdout):
            return cmd
    return None


def test_docker_compose_config_accepts_the_file(tmp_path: Path, services: dict[str, dict[str, Any]]) -> None:
    cmd = _compose_cli()
    if cmd is None:
        pytest.skip("no `docker compose` CLI installed (the file is checked by parsing above)")
    env = dict(os.environ)
    for var in variables_used(COMPOSE_FILE.read_text(encoding="utf-8")):
        env.pop(var, None)  # the defaults, as without a .env
    empty = tmp_path / "empty.env"
    empty.write_text("")
    out = subprocess.run(
        [
            *cmd,
            "--project-directory",
            str(ROOT),
            "-f",
            str(COMPOSE_FILE),
            "--env-file",
            str(empty),
            "config",
            "--format",
            "json",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr
    resolved = json.loads(out.stdout)["services"]
    assert set(resolved) == set(services)
    for name in (*AIRFLOW_SERVICES, "airflow-init"):
        theirs = {k: str(v) for k, v in (resolved[name].get("environment") or {}).items()}
        assert theirs == env_of(services[name]), f"{name}: docker compose resolves a different environment"
