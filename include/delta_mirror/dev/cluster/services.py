"""How the launcher starts each kind of service as a plain process on 127.0.0.1, and what "ready" is.

One ``Recipe`` per process instance: argv, environment, user, readiness probe, deadline. The kinds
and ports come from docker/stack.yaml, the settings from docker/stack.env (topology.py); secrets are
generated per cluster. Nothing here imports Airflow: Airflow runs as ``airflow`` subprocesses.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shlex
import shutil
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from delta_mirror.dev.cluster import probes, setup
from delta_mirror.dev.cluster.processes import ClusterError
from delta_mirror.dev.cluster.topology import ServiceSpec, Topology

__all__ = ["Instance", "Recipe", "Stack", "find_pg_bindir", "spark_home"]

# Environment passed through from the caller to every service (the rest is built here).
_PASSTHROUGH = ("PATH", "HOME", "LANG", "LC_ALL", "TZ", "JAVA_HOME", "TMPDIR", "USER", "LOGNAME")


@dataclass(frozen=True)
class Instance:
    """One process of a service: ``airflow-triggerer-2`` is replica 2 of ``airflow-triggerer``."""

    name: str
    spec: ServiceSpec
    index: int  # 1-based replica number
    ports: Mapping[str, int]  # role -> port, the roles this launcher listens on


@dataclass
class Recipe:
    """How to start one instance and when it is ready."""

    argv: list[str]
    env: dict[str, str]
    ready: Callable[[list[int]], bool]  # given the live pids of its process group
    what: str  # what readiness means, for the timeout message
    timeout: float  # seconds, before scaling
    user: str | None = None
    oneshot: bool = False
    prepare: Callable[[], None] | None = None  # runs just before the start (data dirs, files)
    after_ready: list[Callable[[], None]] = field(default_factory=list)


def find_pg_bindir() -> Path | None:
    """initdb/pg_ctl/postgres: PATH first, then the newest /usr/lib/postgresql/*/bin."""
    found = shutil.which("initdb")
    if found and (Path(found).resolve().parent / "postgres").exists():
        return Path(found).resolve().parent
    dirs = [d for d in glob.glob("/usr/lib/postgresql/*/bin") if os.path.exists(os.path.join(d, "postgres"))]
    if not dirs:
        return None
    return Path(max(dirs, key=lambda d: [int(x) for x in re.findall(r"\d+", d)] or [0]))


def spark_home() -> Path | None:
    """pyspark's package folder, which carries bin/spark-class and the jars (the driver's Spark)."""
    import importlib.util

    found = importlib.util.find_spec("pyspark")
    if found is None or found.origin is None:
        return None
    home = Path(found.origin).parent
    return home if (home / "bin" / "spark-class").exists() else None


class Stack:
    """The launch recipes of one cluster: its folder, ports, settings and secrets."""

    def __init__(
        self,
        *,
        root: Path,
        repo: Path,
        topology: Topology,
        ports: Mapping[str, int],
        secrets: Mapping[str, str],
        token: str,
        table_config: Path,
    ) -> None:
        self.root = root
        self.repo = repo
        self.topology = topology
        self.ports = dict(ports)
        self.secrets = dict(secrets)
        self.token = token
        self.table_config = table_config
        self.s = topology.settings
        self.venv_bin = Path(sys.executable).parent
        self.logs = root / "logs"
        self.data = root / "data"
        self.mail = root / "mail"
        self.airflow_home = root / "airflow"

    # -- addresses -----------------------------------------------------------------------------

    def port(self, key: str, index: int = 1) -> int:
        return self.ports[key] + index - 1

    def pg_url(self, db: str, user: str, password: str, driver: str = "postgresql") -> str:
        return f"{driver}://{user}:{password}@127.0.0.1:{self.port('POSTGRES_PORT')}/{db}"

    def pg_admin(self, db: str = "postgres") -> dict[str, Any]:
        return {
            "host": "127.0.0.1",
            "port": self.port("POSTGRES_PORT"),
            "user": "postgres",
            "password": self.secrets["POSTGRES_SUPERUSER_PASSWORD"],
            "dbname": db,
        }

    def airflow_db(self) -> dict[str, Any]:
        s = self.s
        return {
            "host": "127.0.0.1",
            "port": self.port("POSTGRES_PORT"),
            "user": s["POSTGRES_USER"],
            "password": s["POSTGRES_PASSWORD"],
            "dbname": s["AIRFLOW_DB"],
        }

    def store_url(self) -> str:
        s = self.s
        return self.pg_url(s["STORE_DB"], s["STORE_DB_USER"], s["STORE_DB_PASSWORD"], "postgresql+psycopg")

    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.port('AIRFLOW_API_PORT')}"

    def commit_urls(self, replicas: int) -> list[str]:
        return [f"http://127.0.0.1:{self.port('COMMIT_SERVICE_PORT', i)}" for i in range(1, replicas + 1)]

    def spark_master_url(self) -> str:
        return f"spark://127.0.0.1:{self.port('SPARK_MASTER_PORT')}"

    # -- environments --------------------------------------------------------------------------

    def base_env(self) -> dict[str, str]:
        """What every process gets: a few caller variables, no proxy for 127.0.0.1, the marker."""
        env = {k: os.environ[k] for k in _PASSTHROUGH if k in os.environ}
        env["PATH"] = f"{self.venv_bin}{os.pathsep}{env.get('PATH', '/usr/bin:/bin')}"
        env["NO_PROXY"] = env["no_proxy"] = "127.0.0.1,localhost"
        env["DELTA_MIRROR_CLUSTER"] = self.token
        return env

    def client_env(self, commit_replicas: int) -> dict[str, str]:
        """The store, S3, commit service and Spark master as a CLI or Spark driver uses them."""
        s = self.s
        bucket = s["BUCKET"]
        urls = self.commit_urls(commit_replicas)
        env = {
            "DELTA_MIRROR_STORE": self.store_url(),
            "DELTA_MIRROR_CONFIG": str(self.table_config),
            "DELTA_MIRROR_HOME": str(self.root / "delta-mirror"),
            "AWS_ENDPOINT_URL": f"http://127.0.0.1:{self.port('MINIO_PORT')}",
            "AWS_ACCESS_KEY_ID": s["MINIO_ROOT_USER"],
            "AWS_SECRET_ACCESS_KEY": s["MINIO_ROOT_PASSWORD"],
            "AWS_REGION": s["MINIO_REGION"],
            "AWS_ALLOW_HTTP": "true",
            "DELTA_MIRROR_BUCKET": bucket,
            "DELTA_MIRROR_COMMIT_TOKEN": self.secrets["DELTA_MIRROR_COMMIT_TOKEN"],
            "DELTA_MIRROR_COMMIT_ROOTS": f"s3a://{bucket}/,s3://{bucket}/",
            "SPARK_MASTER": self.spark_master_url(),
            "DELTA_MIRROR_CLUSTER_MAIL": str(self.mail),
        }
        if urls:
            env["DELTA_MIRROR_COMMIT_URL"] = ",".join(urls)  # every replica: the LogStore fails over
        return env

    def airflow_env(self, commit_replicas: int) -> dict[str, str]:
        """Every Airflow process: stack.env's AIRFLOW__ options, the cluster's addresses and secrets,
        the connections the table config names (store, minio, smtp_default, spark_default)."""
        s = self.s
        pg = f"{s['POSTGRES_USER']}:{s['POSTGRES_PASSWORD']}@127.0.0.1:{self.port('POSTGRES_PORT')}"
        minio = {
            "conn_type": "aws",
            "login": s["MINIO_ROOT_USER"],
            "password": s["MINIO_ROOT_PASSWORD"],
            "extra": {
                "endpoint_url": f"http://127.0.0.1:{self.port('MINIO_PORT')}",
                "region_name": s["MINIO_REGION"],
            },
        }
        smtp = {
            "conn_type": "smtp",
            "host": "127.0.0.1",
            "port": self.port("SMTP_PORT"),
            "extra": {"disable_tls": True, "disable_ssl": True, "from_email": s["SMTP_FROM_EMAIL"]},
        }
        env = {
            **self.client_env(commit_replicas),
            **self.topology.airflow_options(),
            "AIRFLOW_HOME": str(self.airflow_home),
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"postgresql+psycopg2://{pg}/{s['AIRFLOW_DB']}",
            "AIRFLOW__CELERY__RESULT_BACKEND": f"db+postgresql+psycopg2://{pg}/{s['AIRFLOW_DB']}",
            "AIRFLOW__CELERY__BROKER_URL": f"redis://127.0.0.1:{self.port('REDIS_PORT')}/0",
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{self.api_url()}/execution/",
            "AIRFLOW__API__BASE_URL": self.api_url(),
            "AIRFLOW__CORE__FERNET_KEY": self.secrets["AIRFLOW_FERNET_KEY"],
            "AIRFLOW__API_AUTH__JWT_SECRET": self.secrets["AIRFLOW_JWT_SECRET"],
            "AIRFLOW__API__SECRET_KEY": self.secrets["AIRFLOW_API_SECRET_KEY"],
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(self.airflow_home / "passwords.json"),
            "AIRFLOW__CORE__HOSTNAME_CALLABLE": "delta_mirror.dev.cluster.hostname.hostname",
            "AIRFLOW__CORE__DAGS_FOLDER": str(self.repo / "dags"),
            "AIRFLOW__CORE__PLUGINS_FOLDER": str(self.repo / "plugins"),
            "AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_SERVER_HOST": "127.0.0.1",
            "AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_SERVER_PORT": str(
                self.port("AIRFLOW_SCHEDULER_HEALTH_PORT")
            ),
            "AIRFLOW_CONN_DELTA_MIRROR_STORE": self.pg_url(
                s["STORE_DB"], s["STORE_DB_USER"], s["STORE_DB_PASSWORD"]
            ),
            "AIRFLOW_CONN_MINIO": json.dumps(minio),
            "AIRFLOW_CONN_SMTP_DEFAULT": json.dumps(smtp),
            "AIRFLOW_CONN_SPARK_DEFAULT": self.spark_master_url(),
        }
        return {**self.base_env(), **env}

    # -- recipes -------------------------------------------------------------------------------

    def recipe(self, inst: Instance, commit_replicas: int) -> Recipe:
        """The launch recipe of ``inst`` (its kind decides)."""
        kind = inst.spec.kind
        build: dict[str, Callable[[Instance, int], Recipe]] = {
            "postgres": self._postgres,
            "redis": self._redis,
            "minio": self._minio,
            "smtp": self._smtp,
            "spark-master": self._spark_master,
            "spark-worker": self._spark_worker,
            "airflow-init": self._airflow_init,
            "airflow": self._airflow,
            "commit-service": self._commit_service,
        }
        return build[kind](inst, commit_replicas)

    def _postgres(self, inst: Instance, _replicas: int) -> Recipe:
        bindir = find_pg_bindir()
        if bindir is None:
            raise ClusterError(
                f"{inst.name}: PostgreSQL not found (initdb/postgres on PATH or /usr/lib/postgresql/*/bin): "
                "apt-get install postgresql"
            )
        user = _postgres_user(inst) if os.geteuid() == 0 else None  # postgres refuses to run as root
        datadir = self.data / "postgres"
        port = inst.ports["main"]
        argv = [str(bindir / "postgres"), "-D", str(datadir), "-p", str(port)]
        argv += [
            "-c",
            "listen_addresses=127.0.0.1",
            "-c",
            "unix_socket_directories=",
            "-c",
            "max_connections=300",
        ]
        env = {**self.base_env(), "LC_ALL": "C", "LANG": "C"}
        return Recipe(
            argv=argv,
            env=env,
            user=user,
            ready=lambda _p: probes.postgres_ok(self.pg_admin()),
            what="accepting connections",
            timeout=60,
            prepare=lambda: setup.prepare_postgres(
                bindir,
                datadir,
                user,
                self.logs / f"{inst.name}.log",
                self.secrets["POSTGRES_SUPERUSER_PASSWORD"],
            ),
            after_ready=[lambda: setup.create_databases(self.pg_admin(), self.s)],
        )

    def _redis(self, inst: Instance, _replicas: int) -> Recipe:
        exe = shutil.which("redis-server")
        if exe is None:
            raise ClusterError(
                f"{inst.name}: redis-server not found: apt-get install redis-server (make cluster installs it)"
            )
        datadir = self.data / "redis"
        port = inst.ports["main"]
        argv = [exe, "--bind", "127.0.0.1", "--port", str(port), "--dir", str(datadir), "--save", ""]
        argv += ["--appendonly", "yes", "--protected-mode", "yes", "--daemonize", "no"]
        return Recipe(
            argv=argv,
            env=self.base_env(),
            ready=lambda _p: probes.redis_ping(port),
            what="PING answered",
            timeout=30,
            prepare=lambda: datadir.mkdir(parents=True, exist_ok=True),
        )

    def _minio(self, inst: Instance, _replicas: int) -> Recipe:
        exe = self.repo / ".cache" / "go" / "bin" / "minio"
        if not exe.exists():
            exe_on_path = shutil.which("minio")
            if exe_on_path is None:
                raise ClusterError(
                    f"{inst.name}: MinIO not found at {exe}: bash scripts/install-emulators.sh "
                    f"(go install github.com/minio/minio@{self.s['MINIO_MODULE_VERSION']}; make cluster runs it)"
                )
            exe = Path(exe_on_path)
        datadir = self.data / "minio"
        port, console = inst.ports["main"], inst.ports["console"]
        argv = [str(exe), "server", str(datadir), "--address", f"127.0.0.1:{port}"]
        argv += ["--console-address", f"127.0.0.1:{console}"]
        env = {
            **self.base_env(),
            "MINIO_ROOT_USER": self.s["MINIO_ROOT_USER"],
            "MINIO_ROOT_PASSWORD": self.s["MINIO_ROOT_PASSWORD"],
            "MINIO_UPDATE": "off",
        }
        return Recipe(
            argv=argv,
            env=env,
            ready=lambda _p: probes.http_ok(f"http://127.0.0.1:{port}/minio/health/ready"),
            what="/minio/health/ready",
            timeout=60,
            prepare=lambda: datadir.mkdir(parents=True, exist_ok=True),
            after_ready=[lambda: setup.create_bucket(f"http://127.0.0.1:{port}", self.s)],
        )

    def _smtp(self, inst: Instance, _replicas: int) -> Recipe:
        port = inst.ports["smtp"]
        argv = [sys.executable, "-m", "delta_mirror.dev.cluster.mailcatcher", "--port", str(port)]
        argv += ["--dir", str(self.mail)]
        return Recipe(
            argv=argv,
            env=self.base_env(),
            ready=lambda _p: probes.smtp_banner(port),
            what="SMTP greeting",
            timeout=60,
        )

    def _spark_env(self, home: Path) -> dict[str, str]:
        return {
            **self.base_env(),
            "SPARK_HOME": str(home),
            "SPARK_LOCAL_IP": "127.0.0.1",  # the web UIs bind here too
            "SPARK_LOG_DIR": str(self.logs),
            "SPARK_CONF_DIR": str(self.root / "spark" / "conf"),
        }

    def _spark_class(self, inst: Instance) -> Path:
        home = spark_home()
        if home is None:
            raise ClusterError(
                f"{inst.name}: pyspark with bin/spark-class not found in this Python: make venv"
            )
        if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
            raise ClusterError(f"{inst.name}: java not found: apt-get install openjdk-17-jre-headless")
        return home

    def _spark_master(self, inst: Instance, _replicas: int) -> Recipe:
        home = self._spark_class(inst)
        port, ui = inst.ports["main"], inst.ports["ui"]
        argv = [str(home / "bin" / "spark-class"), "org.apache.spark.deploy.master.Master"]
        argv += ["--host", "127.0.0.1", "--port", str(port), "--webui-port", str(ui)]
        conf = self.root / "spark" / "conf"
        # No REST submission server (Spark 4 starts one on 6066 by default): spark-submit uses 7077.
        env = {**self._spark_env(home), "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false"}
        return Recipe(
            argv=argv,
            env=env,
            ready=lambda _p: probes.http_json(f"http://127.0.0.1:{ui}/json") is not None,
            what=f"web UI /json on {ui}",
            timeout=120,
            prepare=lambda: conf.mkdir(parents=True, exist_ok=True),
        )

    def _spark_worker(self, inst: Instance, _replicas: int) -> Recipe:
        home = self._spark_class(inst)
        port, ui = inst.ports["main"], inst.ports["ui"]
        master_ui = self.port("SPARK_MASTER_UI_PORT")
        work = self.data / "spark-work"
        argv = [
            str(home / "bin" / "spark-class"),
            "org.apache.spark.deploy.worker.Worker",
            self.spark_master_url(),
        ]
        argv += ["--host", "127.0.0.1", "--port", str(port), "--webui-port", str(ui)]
        argv += ["--cores", self.s["SPARK_WORKER_CORES"], "--memory", self.s["SPARK_WORKER_MEMORY"]]
        argv += ["--work-dir", str(work)]
        return Recipe(
            argv=argv,
            env=self._spark_env(home),
            ready=lambda _p: probes.spark_worker_alive(master_ui, port),
            what="listed ALIVE by the master",
            timeout=120,
            prepare=lambda: work.mkdir(parents=True, exist_ok=True),
        )

    def _airflow_exe(self, inst: Instance) -> str:
        exe = self.venv_bin / "airflow"
        if not exe.exists():
            raise ClusterError(f"{inst.name}: {exe} not found: make venv")
        return str(exe)

    def _airflow_init(self, inst: Instance, replicas: int) -> Recipe:
        script = "; ".join(
            [
                "set -e",
                f"{shlex.quote(self._airflow_exe(inst))} db migrate",
                f"{shlex.quote(str(self.venv_bin / 'delta-mirror'))} init",
            ]
        )
        return Recipe(
            argv=["/bin/sh", "-c", script],
            env=self.airflow_env(replicas),
            ready=lambda _p: False,
            what="airflow db migrate and delta-mirror init",
            timeout=600,
            oneshot=True,
            prepare=lambda: setup.airflow_home(
                self.airflow_home, self.s["AIRFLOW_ADMIN_USER"], self.s["AIRFLOW_ADMIN_PASSWORD"]
            ),
        )

    def _airflow(self, inst: Instance, replicas: int) -> Recipe:
        exe = self._airflow_exe(inst)
        env = self.airflow_env(replicas)
        argv = [exe, *inst.spec.command]
        sub = inst.spec.command[-1]
        timeout = 300.0
        ready: Callable[[list[int]], bool]
        if sub == "api-server":
            port = inst.ports["http"]
            argv += ["--host", "127.0.0.1", "--port", str(port)]
            url = f"http://127.0.0.1:{port}/api/v2/monitor/health"
            ready, what = (lambda _p: probes.http_ok(url)), "/api/v2/monitor/health"
        elif sub == "scheduler":
            health = f"http://127.0.0.1:{inst.ports['health']}/health"
            ready, what = (lambda _p: probes.http_ok(health)), "scheduler /health"
        elif sub == "triggerer":
            argv += ["--skip-serve-logs"]  # its log server would bind every interface (stack.yaml)
            ready, what = self._job_ready("TriggererJob", inst.name), "a running TriggererJob heartbeat"
        elif sub == "dag-processor":
            ready, what = self._job_ready("DagProcessorJob", inst.name), "a running DagProcessorJob heartbeat"
        elif sub == "worker":
            argv += ["-H", f"{inst.name}@%h", "--skip-serve-logs"]
            log = self.logs / f"{inst.name}.log"
            start = _size(log)  # the log is appended to: only this run's lines count
            pattern = re.compile(rf"{re.escape(inst.name)}@\S+ ready\.")
            ready, what = (lambda _p: bool(pattern.search(_read(log, start)))), "Celery worker 'ready.'"
        else:
            raise ClusterError(f"{inst.name}: no launch recipe for `airflow {' '.join(inst.spec.command)}`")
        return Recipe(argv=argv, env=env, ready=ready, what=what, timeout=timeout)

    def _job_ready(self, job_type: str, name: str) -> Callable[[list[int]], bool]:
        """Its job row (hostname = ``name``, see hostname.py) beats; rows of an earlier run of the same
        process (killed, not yet timed out) started before this recipe was made, so they do not count."""
        within = float(self.s.get("AIRFLOW__TRIGGERER__TRIGGERER_HEALTH_CHECK_THRESHOLD", "30"))
        since = time.time() - 1.0
        return lambda _p: probes.airflow_job_alive(self.airflow_db(), job_type, name, since, within)

    def _commit_service(self, inst: Instance, _replicas: int) -> Recipe:
        port = inst.ports["http"]
        argv = [str(self.venv_bin / "delta-mirror"), "serve", "--host", "127.0.0.1", "--port", str(port)]
        argv += ["--allow-root", f"s3://{self.s['BUCKET']}/", "--allow-root", f"s3a://{self.s['BUCKET']}/"]
        env = {
            **self.base_env(),
            "DELTA_MIRROR_STORE": self.store_url(),
            "DELTA_MIRROR_COMMIT_TOKEN": self.secrets["DELTA_MIRROR_COMMIT_TOKEN"],
        }
        return Recipe(
            argv=argv,
            env=env,
            ready=lambda _p: probes.http_ok(f"http://127.0.0.1:{port}/health"),
            what="/health",
            timeout=60,
        )


def _postgres_user(inst: Instance) -> str:
    """The ``postgres`` account PostgreSQL runs as when the launcher is root (created if missing)."""
    import pwd
    import subprocess

    try:
        pwd.getpwnam("postgres")
    except KeyError:
        made = subprocess.run(
            ["useradd", "-r", "-m", "postgres"], capture_output=True, text=True, check=False
        )
        if made.returncode != 0:
            raise ClusterError(
                f"{inst.name}: PostgreSQL cannot run as root and there is no 'postgres' user "
                f"(useradd -r -m postgres failed: {made.stderr.strip() or made.returncode})"
            ) from None
    return "postgres"


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _read(path: Path, start: int = 0) -> str:
    """The text of ``path`` from byte ``start`` on ("" when it is missing)."""
    try:
        with open(path, "rb") as f:
            f.seek(start)
            return f.read().decode(errors="replace")
    except OSError:
        return ""
