"""The Docker Compose stack (docker-compose.yaml, docker/), checked by parsing: no Docker engine needed.

The file is loaded with PyYAML (``<<:`` merge keys resolved), Compose's ``${VAR:-default}``
interpolation is applied with the defaults, i.e. what ``docker compose up`` uses without a ``.env``,
and each service's ``env_file`` is read under its ``environment`` as Compose does. The checks are
about consistency: the connections point at services and ports that exist, the store database is the
one the init script creates, the bucket is the one the tables use, the mounts exist in the
repository, the example table config validates. When a ``docker compose`` CLI is installed,
``docker compose config`` (a parser; it needs no engine) must accept the file too.

One topology, two launchers: the last sections compare this file with what the process launcher
(``make cluster``, delta_mirror.dev.cluster) reads and starts from the same docker/stack.yaml and
docker/stack.env, service by service: the services and replicas, the image versions (and the pinned
pyspark, delta-spark and jars), every Airflow process's environment, the host ports, the mounts, and
the Airflow image's Java and jars.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import unquote, urlsplit

import pytest
import yaml

from delta_mirror.dev.cluster import Cluster
from delta_mirror.dev.cluster.topology import Topology, load_topology, parse_env
from delta_mirror.table_config import MirrorConfig, parse_config

ROOT = Path(__file__).resolve().parents[1]
COMPOSE_FILE = ROOT / "docker-compose.yaml"
DOCKERFILE = ROOT / "docker" / "Dockerfile.airflow"
EXAMPLE_CONFIG = ROOT / "docker" / "delta_mirror.compose.yaml"
POSTGRES_INIT = ROOT / "docker" / "postgres-init"
INIT_SCRIPT = ROOT / "docker" / "airflow-init.sh"
README = ROOT / "docs" / "docker-compose.md"  # the Compose page (README.md before issue 37)
README_SECTION = "# Docker Compose stack"

# docker/stack.yaml + docker/stack.env through the launcher's own parser: the services both launchers
# start (a replicated service is <name>-1, <name>-2, ...).
TOPOLOGY: Topology = load_topology(ROOT / "docker")


def instances_of(*kinds: str) -> tuple[str, ...]:
    return tuple(
        name for spec in TOPOLOGY.services.values() if spec.kind in kinds for name in spec.instance_names()
    )


AIRFLOW_SERVICES = instances_of("airflow")  # the long-running Airflow processes
ONE_SHOTS = tuple(n for s in TOPOLOGY.services.values() if s.oneshot for n in s.instance_names())
COMMIT_SERVICES = instances_of("commit-service")
REQUIRED_SERVICES = tuple(n for spec in TOPOLOGY.services.values() for n in spec.instance_names())
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


def env_files_of(service: dict[str, Any]) -> list[Path]:
    files = service.get("env_file") or []
    files = [files] if isinstance(files, (str, dict)) else files
    return [ROOT / (f["path"] if isinstance(f, dict) else f) for f in files]


def env_of(service: dict[str, Any]) -> dict[str, str]:
    """The container's environment as Compose builds it: the ``env_file`` entries (read with the
    launcher's parser of stack.env), then ``environment`` over them."""
    out: dict[str, str] = {}
    for path in env_files_of(service):
        out.update(parse_env(path.read_text(encoding="utf-8"), str(path)))
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) if "=" in item else (item, "") for item in env)
    out.update({str(k): "" if v is None else str(v) for k, v in env.items()})
    return out


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
    return env_of(services_[instances_of("airflow")[-1]])  # a Celery worker


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
    """The bucket airflow-init creates: BUCKET of stack.env, in its environment."""
    script = INIT_SCRIPT.read_text(encoding="utf-8")
    assert re.search(r"create_bucket\(Bucket=os\.environ\[\"BUCKET\"\]\)", script), (
        f"{INIT_SCRIPT.name} does not create the bucket named by BUCKET"
    )
    env = env_of(services["airflow-init"])
    assert env["BUCKET"] == TOPOLOGY.settings["BUCKET"]
    assert url_parts(env["AWS_ENDPOINT_URL"])["host"] == "minio"
    return env["BUCKET"]


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
    for step in (
        "airflow db migrate",
        "delta-mirror init",
        "SIMPLE_AUTH_MANAGER_PASSWORDS_FILE",
        "create_bucket",
    ):
        assert step in text, f"{script.name} does not run '{step}'"
    assert "airflow users create" not in text, "a FAB command: the stack runs the Simple auth manager"
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
    init = env_of(services["airflow-init"])  # it creates the bucket with these keys
    assert (init["AWS_ACCESS_KEY_ID"], init["AWS_SECRET_ACCESS_KEY"]) == (conn["login"], conn["password"])


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
            assert found == bucket, f"{name} uses s3://{found}/ but airflow-init creates '{bucket}'"
            seen += 1
    assert seen, "no s3:// table location in the example config or the README section"


def test_create_table_example_actions() -> None:
    """The README's create-table example commits protocol + metaData (an empty table)."""
    lines = (ROOT / "docker" / "examples" / "create-sales.jsonl").read_text(encoding="utf-8").splitlines()
    kinds = [next(iter(json.loads(line))) for line in lines if line.strip()]
    assert kinds == ["protocol", "metaData"]
    assert "docker/examples/create-sales.jsonl" in readme_section()


@pytest.mark.parametrize("name", COMMIT_SERVICES)
def test_commit_service_serves_the_store_with_a_token(
    services: dict[str, dict[str, Any]], bucket: str, name: str
) -> None:
    """``delta-mirror serve`` on the store the CLI and DAGs use, reachable, authenticated, probed."""
    svc = services[name]
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
    assert depends_on(services["airflow-init"])["minio"]["condition"] == "service_healthy", "the bucket"


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
    for name in ("postgres", "redis", "minio", "mailpit", *COMMIT_SERVICES, *AIRFLOW_SERVICES):
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
    for name in services:  # as this file reads them: environment (env_file under it), image, ports
        theirs = {k: str(v) for k, v in (resolved[name].get("environment") or {}).items()}
        assert theirs == env_of(services[name]), f"{name}: docker compose resolves a different environment"
        assert resolved[name].get("image") == services[name].get("image"), name
        ports = {
            (p.get("host_ip"), int(p["published"]), int(p["target"])) for p in resolved[name].get("ports", [])
        }
        raw_ports = yaml.safe_load(COMPOSE_FILE.read_text(encoding="utf-8"))["services"][name]
        mine = {(p.ip, p.host, p.container) for p in published_ports(raw_ports)}
        assert ports == mine, f"{name}: docker compose publishes {ports}"


# --------------------------------------------------------------------------------------------------
# one topology, two launchers: docker-compose.yaml against what `make cluster` starts
#
# The launcher is delta_mirror.dev.cluster: Cluster(...) reads docker/stack.yaml + docker/stack.env
# and gives each process a launch recipe (argv, environment) without starting anything. Its
# addresses are 127.0.0.1:<stack.env port>; in Compose the same service is <service>:<container
# port>, published on the host at that stack.env port. So a launcher value, with each 127.0.0.1
# address replaced by the Compose service that publishes that host port, must be the Compose value.

# Launcher environment that Compose has no use for: the caller's variables passed through, the
# cluster's marker and its folder (AIRFLOW_HOME, DELTA_MIRROR_HOME, the mail catcher's folder; in the
# image AIRFLOW_HOME and JAVA_HOME are the image's own).
LAUNCHER_ONLY_ENV = frozenset(
    {
        *("PATH", "HOME", "LANG", "LC_ALL", "TZ", "JAVA_HOME", "TMPDIR", "USER", "LOGNAME"),
        *("NO_PROXY", "no_proxy", "DELTA_MIRROR_CLUSTER"),
        *("AIRFLOW_HOME", "DELTA_MIRROR_HOME", "DELTA_MIRROR_CLUSTER_MAIL", "DELTA_MIRROR_CLUSTER_PROCESS"),
        # Every launcher process runs on one host, so a callable gives each its process name; in
        # Compose the container's hostname is that name (checked below).
        "AIRFLOW__CORE__HOSTNAME_CALLABLE",
    }
)
# Compose sets both log servers' ports in every Airflow container (one block for all); the launcher's
# workers and triggerers run without a log server (--skip-serve-logs: it binds every interface).
COMPOSE_ALL_CONTAINERS_ENV = frozenset(
    {"AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT", "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT"}
)
# Secrets the launcher generates per cluster (.cluster/secrets.env); Compose's defaults are
# stack.env's (None: no default, Airflow then runs without a Fernet key).
SECRET_ENV = {
    "AIRFLOW__API_AUTH__JWT_SECRET": "AIRFLOW_JWT_SECRET",
    "AIRFLOW__API__SECRET_KEY": "AIRFLOW_API_SECRET_KEY",
    "AIRFLOW__CORE__FERNET_KEY": None,
    "DELTA_MIRROR_COMMIT_TOKEN": "DELTA_MIRROR_COMMIT_TOKEN",
}
# Paths: the launcher's are files of the checkout, Compose's the same files through a bind mount.
PATH_ENV = frozenset({"AIRFLOW__CORE__DAGS_FOLDER", "AIRFLOW__CORE__PLUGINS_FOLDER", "DELTA_MIRROR_CONFIG"})
# Different on purpose: the password file lives in the cluster's folder vs a volume; a container
# listens on all its interfaces (published on the host's 127.0.0.1 only), the launcher on 127.0.0.1.
MACHINE_ENV = frozenset(
    {
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE",
        "AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_SERVER_HOST",
    }
)
# The address a browser on the host uses (links in the UI and in emails): localhost, the host port.
BROWSER_URL_ENV = frozenset({"AIRFLOW__API__BASE_URL"})
# Environment prefixes of the stack's own settings (what the reverse check looks at).
STACK_PREFIXES = ("AIRFLOW__", "AIRFLOW_CONN_", "DELTA_MIRROR_", "AWS_", "SPARK_")

_PUBLISHED = re.compile(
    r"^(?:(?P<ip>[0-9.]+):)?(?P<host>\$\{(?P<var>[A-Z0-9_]+):-(?P<default>\d+)\}|\d+):(?P<container>\d+)(?:/tcp)?$"
)


@dataclass(frozen=True)
class Published:
    ip: str | None
    host: int
    container: int
    variable: str | None  # the ${VAR:-default} that sets the host port, if any


def published_ports(raw_service: dict[str, Any]) -> list[Published]:
    """The raw (uninterpolated) ``ports`` entries: bind address, host port (its variable), container port."""
    out = []
    for entry in raw_service.get("ports") or []:
        m = _PUBLISHED.match(str(entry))
        assert m, f"port mapping {entry!r}: expected [IP:]${{KEY:-PORT}}:CONTAINER_PORT"
        host = int(m["default"] or m["host"])
        out.append(Published(m["ip"], host, int(m["container"]), m["var"]))
    return out


@pytest.fixture(scope="module")
def raw_services(raw: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return raw["services"]  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Cluster:
    """The launcher for this checkout on stack.env's ports, built but never started."""
    return Cluster(tmp_path_factory.mktemp("cluster") / ".cluster", repo=ROOT)


@pytest.fixture(scope="module")
def launcher_env(cluster: Cluster) -> dict[str, dict[str, str]]:
    """The environment the launcher gives each Airflow and commit-service process."""
    stack = cluster.stack()
    replicas = cluster.replicas["commit_replicas"]
    return {
        inst.name: stack.recipe(inst, replicas).env
        for inst in cluster.instances
        if inst.spec.kind in ("airflow", "airflow-init", "commit-service")
    }


@pytest.fixture(scope="module")
def host_ports(raw_services: dict[str, dict[str, Any]]) -> dict[int, tuple[str, int]]:
    """Host port → (the Compose service that publishes it, its container port)."""
    out: dict[int, tuple[str, int]] = {}
    for name, svc in raw_services.items():
        for p in published_ports(svc):
            out[p.host] = (name, p.container)
    return out


def as_compose(key: str, value: str, host_ports: dict[int, tuple[str, int]]) -> Any:
    """A launcher value as Compose must have it: 127.0.0.1:<port> → <service>:<container port>, a
    bare port → the container port, a JSON connection's host and port alike."""

    def address(m: re.Match[str]) -> str:
        port = int(m[1])
        assert port in host_ports, (
            f"{key}: the launcher uses 127.0.0.1:{port}, which Compose does not publish"
        )
        service, container = host_ports[port]
        return f"{service}:{container}"

    if key.endswith("_PORT") and value.isdigit():
        assert int(value) in host_ports, f"{key}={value}: a port Compose does not publish"
        return str(host_ports[int(value)][1])
    if value.lstrip().startswith("{"):
        doc = json.loads(value)

        def walk(node: Any) -> Any:
            if isinstance(node, dict):
                node = {k: walk(v) for k, v in node.items()}
                if node.get("host") == "127.0.0.1" and isinstance(node.get("port"), int):
                    node["host"], node["port"] = host_ports[node["port"]]
                return node
            return re.sub(r"127\.0\.0\.1:(\d+)", address, node) if isinstance(node, str) else node

        return walk(doc)
    return re.sub(r"127\.0\.0\.1:(\d+)", address, value)


def compose_value(value: str) -> Any:
    return json.loads(value) if value.lstrip().startswith("{") else value


def test_compose_runs_the_services_the_launcher_runs(
    services: dict[str, dict[str, Any]], cluster: Cluster
) -> None:
    """Service by service: stack.yaml's services (replicas expanded) are Compose's and the launcher's."""
    from_yaml = set(REQUIRED_SERVICES)
    assert set(cluster.names()) == from_yaml, "the launcher starts what stack.yaml lists"
    assert set(services) == from_yaml, (
        f"only in docker-compose.yaml: {sorted(set(services) - from_yaml)}; "
        f"only in docker/stack.yaml: {sorted(from_yaml - set(services))}"
    )
    for spec in TOPOLOGY.services.values():
        for name in spec.instance_names():
            svc = services[name]
            if spec.replicas > 1:
                assert svc.get("hostname") == name, f"{name}: a replica names itself (logs, job checks)"
            if spec.kind == "airflow":
                argv = svc["command"].split() if isinstance(svc["command"], str) else svc["command"]
                assert tuple(argv) == spec.command, f"{name}: runs `airflow {' '.join(argv)}`"
            if spec.kind in ("spark-master", "spark-worker"):
                assert spec.command[0] in command_text(svc), name
            if spec.kind == "minio":
                assert command_text(svc).replace('"', "").split() == [c.strip('"') for c in spec.command]
            if spec.kind == "commit-service":
                assert svc["command"][0] == spec.command[0] == "serve", name


def test_compose_waits_for_what_stack_yaml_says_each_service_needs(
    services: dict[str, dict[str, Any]],
) -> None:
    for spec in TOPOLOGY.services.values():
        for name in spec.instance_names():
            deps = depends_on(services[name])
            for needed in spec.after:
                for dep in TOPOLOGY.services[needed].instance_names():
                    assert dep in deps, f"{name} starts before {dep} (stack.yaml: after {needed})"
                    wanted = "service_completed_successfully" if dep in ONE_SHOTS else "service_healthy"
                    assert deps[dep]["condition"] == wanted, f"{name} → {dep}"


def test_image_versions_are_stack_env_versions(
    raw_services: dict[str, dict[str, Any]], services: dict[str, dict[str, Any]]
) -> None:
    s = TOPOLOGY.settings
    airflow_base = f"apache/airflow:{s['AIRFLOW_VERSION']}-python{s['AIRFLOW_PYTHON_VERSION']}"
    dockerfile = DOCKERFILE.read_text(encoding="utf-8")
    arg = re.search(r"^ARG\s+AIRFLOW_BASE_IMAGE=(\S+)", dockerfile, re.M)
    assert arg and arg[1] == airflow_base, (
        f"Dockerfile.airflow's base {arg and arg[1]}, stack.env {airflow_base}"
    )
    for name in (*AIRFLOW_SERVICES, *ONE_SHOTS, *COMMIT_SERVICES):
        svc = services[name]
        assert svc["build"]["args"]["AIRFLOW_BASE_IMAGE"] == airflow_base, name
        assert (
            svc["image"] == f"delta-mirror-airflow:{s['AIRFLOW_VERSION']}-python{s['AIRFLOW_PYTHON_VERSION']}"
        )
    assert services["postgres"]["image"] == f"postgres:{s['POSTGRES_VERSION']}"
    assert re.fullmatch(rf"redis:{re.escape(s['REDIS_VERSION'])}(-[a-z]+)?", services["redis"]["image"]), (
        f"redis image {services['redis']['image']}: not the {s['REDIS_VERSION']} minor the launcher runs"
    )
    for name in instances_of("spark-master", "spark-worker"):
        assert services[name]["image"] == f"apache/spark:{s['SPARK_VERSION']}-python3", name
        # the version is the shared setting's, so one override moves both sides
        assert "${SPARK_VERSION:-" in raw_services[name]["image"], name
    for name, key in (("postgres", "POSTGRES_VERSION"), ("redis", "REDIS_VERSION")):
        assert f"${{{key}:-{s[key]}}}" in raw_services[name]["image"], name


def requirement_pins() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "requirements.txt").read_text(encoding="utf-8").splitlines():
        m = re.match(r"^([A-Za-z0-9_.-]+)(?:\[[^\]]*\])?==(\S+)", line.strip())
        if m:
            pins[m[1].lower()] = m[2]
    return pins


def test_spark_and_delta_versions_match_everywhere() -> None:
    """stack.env = requirements.txt's pins = the installed pyspark / delta-spark = the jars' poms."""
    import importlib.metadata

    s, pins = TOPOLOGY.settings, requirement_pins()
    assert s["SPARK_VERSION"] == pins["pyspark"] == importlib.metadata.version("pyspark")
    assert s["DELTA_SPARK_VERSION"] == pins["delta-spark"] == importlib.metadata.version("delta-spark")
    assert s["AIRFLOW_VERSION"] == pins["apache-airflow"]
    assert s["AIRFLOW_CELERY_PROVIDER_VERSION"] == pins["apache-airflow-providers-celery"]
    pyspark = importlib.util.find_spec("pyspark")
    assert pyspark is not None and pyspark.origin is not None
    jars = Path(pyspark.origin).parent / "jars"
    assert (jars / f"spark-core_2.13-{s['SPARK_VERSION']}.jar").is_file(), "pyspark.__version__ and its jars"
    hadoop = {
        p.name.removeprefix("hadoop-client-api-").removesuffix(".jar")
        for p in jars.glob("hadoop-client-api-*.jar")
    }
    for pom in sorted(ROOT.glob("jvm/*/pom.xml")):
        text = pom.read_text(encoding="utf-8")
        delta = re.search(r"<delta\.version>([^<]+)</delta\.version>", text)
        assert delta and delta[1] == s["DELTA_SPARK_VERSION"], (
            f"{pom.relative_to(ROOT)}: delta {delta and delta[1]}"
        )
        hv = re.search(r"<hadoop\.version>([^<]+)</hadoop\.version>", text)
        assert hv is None or {hv[1]} == hadoop, (
            f"{pom.relative_to(ROOT)}: hadoop {hv[1]}, pyspark ships {hadoop}"
        )


def test_pyspark_reports_the_stack_spark_version() -> None:
    pyspark = pytest.importorskip("pyspark")
    assert pyspark.__version__ == TOPOLOGY.settings["SPARK_VERSION"]


def test_every_airflow_option_of_stack_env_reaches_every_airflow_container(
    services: dict[str, dict[str, Any]],
) -> None:
    options = TOPOLOGY.airflow_options()
    assert options, "stack.env has AIRFLOW__ options"
    for name in (*AIRFLOW_SERVICES, *ONE_SHOTS):
        env = env_of(services[name])
        differing = {k: (env.get(k), v) for k, v in options.items() if env.get(k) != v}
        assert not differing, f"{name}: (compose, stack.env) differ: {differing}"


def test_compose_defaults_are_stack_env_values() -> None:
    """Every ${KEY:-default} whose KEY is a stack.env setting defaults to stack.env's value."""
    seen = set()

    def check(text: str) -> None:
        for m in _VAR.finditer(text):
            key, op, default = m[1], m[2], m[3]
            if default:
                check(default)  # ${SPARK_IMAGE:-apache/spark:${SPARK_VERSION:-...}-python3}
            if key in TOPOLOGY.settings and op in (":-", "-"):
                assert interpolate(default) == TOPOLOGY.settings[key], (
                    f"${{{key}:-{default}}}: stack.env has {TOPOLOGY.settings[key]!r}"
                )
                seen.add(key)

    check(COMPOSE_FILE.read_text(encoding="utf-8"))
    assert {"AIRFLOW_ADMIN_USER", "POSTGRES_PASSWORD", "MINIO_ROOT_PASSWORD", "SPARK_VERSION"} <= seen


def test_airflow_processes_get_the_launchers_environment(
    services: dict[str, dict[str, Any]],
    launcher_env: dict[str, dict[str, str]],
    host_ports: dict[int, tuple[str, int]],
) -> None:
    """Each Airflow process, launcher against Compose: the same variables, the same values once the
    addresses are the containers' (secrets, paths and listen addresses compared as noted above)."""
    names = (*AIRFLOW_SERVICES, *ONE_SHOTS)
    assert set(names) <= set(launcher_env)
    for name in names:
        theirs, ours = launcher_env[name], env_of(services[name])
        if "AIRFLOW__CORE__HOSTNAME_CALLABLE" in theirs:
            assert services[name].get("hostname") == name, f"{name}: Airflow would know it by another name"
        for key, value in theirs.items():
            if key in LAUNCHER_ONLY_ENV:
                continue
            assert key in ours, f"{name}: the launcher sets {key}, docker-compose.yaml does not"
            if key in SECRET_ENV:
                default = SECRET_ENV[key]
                assert ours[key] == (TOPOLOGY.settings[default] if default else ""), f"{name}: {key}"
            elif key in PATH_ENV:
                host = container_to_host(services, name, ours[key])
                assert host is not None and host.resolve() == Path(value).resolve(), (
                    f"{name}: {key} is {value} for the launcher, {ours[key]} (→ {host}) in Compose"
                )
            elif key in BROWSER_URL_ENV:
                assert ours[key] == value.replace("127.0.0.1", "localhost"), f"{name}: {key}"
            elif key not in MACHINE_ENV:
                assert compose_value(ours[key]) == as_compose(key, value, host_ports), (
                    f"{name}: {key} is {ours[key]!r} in Compose, {value!r} for the launcher"
                )
        extra = {
            k for k in ours if k.startswith(STACK_PREFIXES) and k not in theirs and k not in TOPOLOGY.settings
        } - COMPOSE_ALL_CONTAINERS_ENV
        assert not extra, f"{name}: only Compose sets {sorted(extra)}"


def test_commit_service_replicas_get_the_launchers_settings(
    services: dict[str, dict[str, Any]],
    cluster: Cluster,
    launcher_env: dict[str, dict[str, str]],
    host_ports: dict[int, tuple[str, int]],
) -> None:
    from delta_mirror.storage import normalize_commit_root

    stack = cluster.stack()
    for inst in cluster.instances:
        if inst.spec.kind != "commit-service":
            continue
        ours = env_of(services[inst.name])
        for key, value in launcher_env[inst.name].items():
            if key in LAUNCHER_ONLY_ENV:
                continue
            assert key in ours, f"{inst.name}: the launcher sets {key}, docker-compose.yaml does not"
            if key in SECRET_ENV:
                assert ours[key] == TOPOLOGY.settings[SECRET_ENV[key] or key], f"{inst.name}: {key}"
            else:
                assert ours[key] == as_compose(key, value, host_ports), f"{inst.name}: {key}"
        argv = stack.recipe(inst, cluster.replicas["commit_replicas"]).argv
        theirs = {normalize_commit_root(argv[i + 1]) for i, a in enumerate(argv) if a == "--allow-root"}
        mine = {normalize_commit_root(r) for r in ours["DELTA_MIRROR_COMMIT_ALLOW_ROOTS"].split(",") if r}
        assert theirs == mine, (
            f"{inst.name}: tables may be created under {mine} (Compose), {theirs} (launcher)"
        )


def test_host_ports_are_stack_env_ports_on_127_0_0_1(
    raw_services: dict[str, dict[str, Any]], cluster: Cluster
) -> None:
    """Compose publishes each process's stack.env ports (replica N: the key's port + N - 1), on the
    host's 127.0.0.1 as the launcher listens, and nothing else; the variable is the port key."""
    expected: dict[str, set[tuple[int, str]]] = {name: set() for name in raw_services}
    for inst in cluster.instances:
        for role, key in inst.spec.ports.items():
            port = int(TOPOLOGY.settings[key]) + inst.index - 1
            if role not in inst.spec.compose_only:
                assert inst.ports[role] == port, f"{inst.name}: the launcher's {role} port"
            expected[inst.name].add((port, key if inst.index == 1 else f"{key}_{inst.index}"))
    for name, svc in raw_services.items():
        published = published_ports(svc)
        assert {(p.host, p.variable) for p in published} == expected[name], f"{name}: published ports"
        for p in published:
            assert p.ip == "127.0.0.1", f"{name}: port {p.host} is published on every interface"


def test_containers_listen_on_the_stack_env_port(
    raw_services: dict[str, dict[str, Any]], services: dict[str, dict[str, Any]]
) -> None:
    """Inside its container each replica listens on its key's stack.env port; the processes Compose
    configures say so in their command or environment."""
    for spec in TOPOLOGY.services.values():
        for name in spec.instance_names():
            published = {
                p.variable.removesuffix("_2") if p.variable else None: p
                for p in published_ports(raw_services[name])
            }
            svc = services[name]
            told = (
                command_text(svc)
                + " "
                + " ".join(f"{k}={v}" for k, v in env_of(svc).items() if k.startswith("AIRFLOW__"))
            )
            for role, key in spec.ports.items():
                p = published[key]
                assert p.container == int(TOPOLOGY.settings[key]), f"{name}: {role} inside the container"
                if spec.kind in ("spark-master", "spark-worker", "commit-service") or role in (
                    "log",
                    "health",
                ):
                    assert re.search(rf"(--\S*port\s+|_PORT=){p.container}\b", told), (
                        f"{name}: nothing makes it listen on {p.container} ({role})"
                    )


def test_code_and_dags_are_mounted_where_the_launcher_reads_them(
    raw: dict[str, Any], services: dict[str, dict[str, Any]]
) -> None:
    """The launcher runs the checkout (its editable install, dags/, plugins/, the compose table
    config); every Airflow container mounts the same folders over the image's copy."""
    import delta_mirror

    assert Path(delta_mirror.__file__).resolve().is_relative_to(ROOT / "include"), (
        "the launcher runs include/"
    )
    dockerfile = DOCKERFILE.read_text(encoding="utf-8")
    project = PurePosixPath(re.search(r'-e\s+"([^"\[]+)', dockerfile)[1])  # type: ignore[index]
    for name in (*AIRFLOW_SERVICES, *ONE_SHOTS, *COMMIT_SERVICES):
        assert (
            container_to_host(services, name, str(project / "include" / "delta_mirror"))
            == ROOT / "include" / "delta_mirror"
        )
        env = env_of(services[name])
        for key, folder in (
            ("AIRFLOW__CORE__DAGS_FOLDER", "dags"),
            ("AIRFLOW__CORE__PLUGINS_FOLDER", "plugins"),
        ):
            if key in env:
                assert container_to_host(services, name, env[key]) == ROOT / folder, f"{name}: {key}"


# --------------------------------------------------------------------------------------------------
# the Airflow image: Java 17 and both jars, built from jvm/ in the image build


def makefile_jar_paths() -> dict[str, str]:
    text = (ROOT / "Makefile").read_text(encoding="utf-8")
    return {k: v.strip() for k, v in re.findall(r"^(LOGSTORE_JAR|KERNEL_JAR)\s*:=\s*(\S+)", text, re.M)}


def test_airflow_image_has_a_java_17_runtime() -> None:
    text = DOCKERFILE.read_text(encoding="utf-8")
    final = text.split("\nFROM ${AIRFLOW_BASE_IMAGE}", 1)[1]
    jre = re.search(r"^COPY --from=eclipse-temurin:17-jre\s+(\S+)\s+(\S+)$", final, re.M)
    assert jre, "no JRE 17 in the image"
    assert jre[1] == jre[2], "the JRE keeps its own path"
    home = re.search(r"^ENV\s+JAVA_HOME=(\S+)", final, re.M)
    assert home and home[1] == jre[2], "JAVA_HOME names the JRE 17 whatever the architecture"
    assert re.search(rf"^RUN ln -sfn {re.escape(jre[2])}/bin/java /usr/local/bin/java", final, re.M), (
        "java on PATH"
    )


def test_airflow_image_builds_both_jars_from_jvm_and_the_package_finds_them(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from delta_mirror.jobs.validate import kernel_java
    from delta_mirror.spark import session

    text = DOCKERFILE.read_text(encoding="utf-8")
    stage = re.search(r"^FROM\s+maven:3\.9-eclipse-temurin-17\s+AS\s+(\w+)", text, re.M)
    assert stage, "no Maven build stage"
    modules = sorted(p.parent.name for p in ROOT.glob("jvm/*/pom.xml"))
    assert modules == ["kernel-reader", "logstore"]
    jar_paths = makefile_jar_paths()
    env = dict(re.findall(r"(DELTA_MIRROR_\w+_JAR)=(\S+)", text))
    readers = {"logstore": session.LOGSTORE_JAR_ENV, "kernel-reader": kernel_java.JAR_ENV}
    makefile_key = {"logstore": "LOGSTORE_JAR", "kernel-reader": "KERNEL_JAR"}
    for module in modules:
        pom = (ROOT / "jvm" / module / "pom.xml").read_text(encoding="utf-8")
        jar = re.search(r"<finalName>([^<]+)</finalName>", pom)[1] + ".jar"  # type: ignore[index]
        assert PurePosixPath(jar_paths[makefile_key[module]]).name == jar, module
        assert re.search(rf"^COPY\s+jvm/{module}\s+\S+", text, re.M), (
            f"jvm/{module} is not in the build stage"
        )
        assert re.search(rf"cd\s+\S*jvm/{module}\s+&&\s+mvn\s+-B\b[^\n]*\bpackage\b", text), (
            f"{module}: no mvn package"
        )
        copied = re.search(
            rf"^COPY\s+--from={stage[1]}\s+(?:--\S+\s+)*\S*/jvm/{module}/target/{re.escape(jar)}\s+\\?\s*(\S+)",
            text,
            re.M,
        )
        assert copied, f"{jar} is not copied from the {stage[1]} stage"
        # the package is pointed at it (Compose mounts include/ over the installed copy) ...
        assert env.get(readers[module]) == copied[1], f"{readers[module]} does not name {copied[1]}"
        # ... and the Makefile's place in the package links to it, for a container without the mount
        assert re.search(
            rf'ln -sf\s+"\$\{{{readers[module]}\}}"\s+\\?\s*/opt/delta-mirror/{re.escape(jar_paths[makefile_key[module]])}',
            text,
        ), module
    # The package reads those variables (a jar elsewhere than include/ is found).
    fake = tmp_path / "some.jar"
    fake.write_bytes(b"PK")
    monkeypatch.setenv(session.LOGSTORE_JAR_ENV, str(fake))
    monkeypatch.setenv(kernel_java.JAR_ENV, str(fake))
    assert session.logstore_jar() == fake
    assert kernel_java.kernel_jar() == fake


def dockerignore_includes(patterns: list[str], path: str) -> bool:
    """Docker's rule: the last pattern matching the path or one of its parent folders decides."""

    def regex(pattern: str) -> re.Pattern[str]:
        out, i = "", 0
        while i < len(pattern):
            if pattern.startswith("**/", i):
                out, i = out + "(?:.*/)?", i + 3
            elif pattern.startswith("**", i):
                out, i = out + ".*", i + 2
            elif pattern[i] == "*":
                out, i = out + "[^/]*", i + 1
            elif pattern[i] == "?":
                out, i = out + "[^/]", i + 1
            else:
                out, i = out + re.escape(pattern[i]), i + 1
        return re.compile(out)

    parts = path.split("/")
    prefixes = ["/".join(parts[: n + 1]) for n in range(len(parts))]
    included = True
    for raw_pattern in patterns:
        negate = raw_pattern.startswith("!")
        pattern = raw_pattern.lstrip("!").strip("/")
        if any(regex(pattern).fullmatch(p) for p in prefixes):
            included = negate
    return included


def test_dockerignore_sends_the_jvm_sources_and_no_build_output() -> None:
    lines = (ROOT / "docker" / "Dockerfile.airflow.dockerignore").read_text(encoding="utf-8").splitlines()
    patterns = [line.strip() for line in lines if line.strip() and not line.startswith("#")]
    tracked = subprocess.run(
        ["git", "ls-files", "jvm", "include", "requirements.txt", "pyproject.toml", "README.md"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=True,
    ).stdout.split()
    assert any(p.startswith("jvm/kernel-reader/src/") for p in tracked)
    for path in tracked:
        assert dockerignore_includes(patterns, path), f"{path} is not in the image's build context"
    for path in (
        "jvm/logstore/target/delta-mirror-logstore.jar",
        "jvm/kernel-reader/target/classes/x.class",
        *(f"include/{p.removeprefix('include/')}" for p in makefile_jar_paths().values()),
        "include/delta_mirror/__pycache__/x.pyc",
        ".venv/bin/python",
        "tests/test_compose.py",
    ):
        assert not dockerignore_includes(patterns, path), f"{path} would be sent to the image build"


def test_no_jar_is_committed() -> None:
    jars = subprocess.run(["git", "ls-files", "*.jar"], capture_output=True, text=True, cwd=ROOT, check=True)
    assert jars.stdout.split() == [], "jars are built (make jar, the image's Maven stage), never committed"


def test_readme_says_the_image_has_java_and_names_compose_services(
    services: dict[str, dict[str, Any]],
) -> None:
    section = readme_section()
    assert "has no Java runtime" not in section
    assert re.search(r"Java 17", section), "the README says the Airflow image has Java"
    named = [m[1] for m in re.finditer(r"docker compose (?:exec|logs)(?: -T)?\s+([a-z0-9-]+)", section)]
    for m in re.finditer(r"docker compose restart\s+([a-z0-9\s-]+?)`", section):
        named += m[1].split()
    assert "airflow-worker-1" in named and "airflow-triggerer-2" in named
    for word in named:
        assert word in services, f"README: `docker compose ... {word}`, not a service of docker-compose.yaml"
