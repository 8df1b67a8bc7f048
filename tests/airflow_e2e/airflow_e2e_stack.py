"""A real Airflow for the end-to-end tests: ``airflow standalone`` in its own process group.

Scheduler, dag-processor, triggerer and api-server run as in production (LocalExecutor, each task
in its own process, deadline callbacks and asset watchers in the triggerer), bound to 127.0.0.1 on
free ports, with a temporary ``AIRFLOW_HOME``. Also: an SMTP server (aiosmtpd) that keeps every
message it receives, and a small client for Airflow's REST API (a JWT from ``POST /auth/token``).

Every process the stack starts inherits a unique marker variable; ``stop()`` ends the process group,
then any process that still carries the marker (task processes run in process groups of their
own), so nothing is left behind.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import httpx
from support.mailserver import MailBox, SmtpServer, body_text  # noqa: F401 - re-exported for the tests
from support.services import free_port

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = REPO / ".venv" / "bin"
ARTIFACTS = REPO / "test-artifacts" / "airflow-e2e"
MARKER = "DELTA_MIRROR_E2E_STACK"
TERMINAL = {"success", "failed"}


class StackError(RuntimeError):
    pass


# --------------------------------------------------------------------------------------------------
# SMTP


# --------------------------------------------------------------------------------------------------
# Airflow


def _stack_pids(token: str, pgid: int | None) -> list[int]:
    """Live processes of one stack: in its process group, or carrying its marker variable (task
    processes run in process groups of their own). Zombies are left to their parent / init."""
    needle = f"{MARKER}={token}".encode()
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
            state, group = fields[0], int(fields[3])
            if state == b"Z":
                continue
            if pgid is not None and group == pgid:
                pids.append(int(entry))
                continue
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    pids.append(int(entry))
        except (OSError, IndexError, ValueError):
            continue
    return pids


class AirflowStack:
    """``airflow standalone`` with a temporary home; ``api()`` talks to its REST API."""

    def __init__(self, home: Path, extra_env: Mapping[str, str], metadata_url: str | None = None) -> None:
        self.home = home
        self.home.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.token = uuid.uuid4().hex
        self.log_path = home / "standalone.log"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "DELTA_MIRROR_"))}
        no_proxy = ",".join(x for x in (os.environ.get("NO_PROXY"), "127.0.0.1", "localhost") if x)
        env.update(
            {
                "AIRFLOW_HOME": str(home),
                "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
                "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
                "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
                "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
                "AIRFLOW__CORE__PARALLELISM": "8",
                "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": metadata_url or f"sqlite:///{home / 'airflow.db'}",
                "AIRFLOW__API__HOST": "127.0.0.1",
                "AIRFLOW__API__PORT": str(self.port),
                "AIRFLOW__API__BASE_URL": self.base_url,
                "AIRFLOW__API__WORKERS": "1",
                # a task's calls to the execution API time out after 5 s by default: on a busy machine the
                # api-server answers later and the task dies before it starts (a failed run, no retry)
                "AIRFLOW__WORKERS__EXECUTION_API_TIMEOUT": "60",
                # the log servers of the scheduler and the triggerer default to fixed ports 8793 / 8794
                "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(free_port()),
                "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(free_port()),
                "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
                "NO_PROXY": no_proxy,
                "no_proxy": no_proxy,
                "NO_COLOR": "1",
                MARKER: self.token,
                **extra_env,
            }
        )
        self.env = env
        self.proc: subprocess.Popen[bytes] | None = None
        self._client: httpx.Client | None = None
        self._jwt: str | None = None

    # -- life cycle --------------------------------------------------------------------------------

    def start(self) -> None:
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [str(VENV_BIN / "airflow"), "standalone"],
                cwd=self.home,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # its own process group: killpg reaches every component
            )
        self._client = httpx.Client(base_url=self.base_url, timeout=30, trust_env=False)

    def wait_ready(self, dag_ids: set[str], timeout: float = 150.0) -> float:
        """Wait until every component heartbeats and the DAGs are parsed; returns the seconds taken."""
        t0 = time.monotonic()
        deadline = t0 + timeout
        stage = "api-server"
        while time.monotonic() < deadline:
            self._check_alive()
            try:
                if stage == "api-server":
                    health = self.client.get("/api/v2/monitor/health").json()
                    if all(
                        (health.get(c) or {}).get("status") == "healthy"
                        for c in ("metadatabase", "scheduler", "triggerer", "dag_processor")
                    ):
                        stage = "dags"
                if stage == "dags":
                    errors = self.api("GET", "/api/v2/importErrors").json()
                    if errors.get("total_entries"):
                        raise StackError(f"DAG import errors: {json.dumps(errors)[:3000]}")
                    dags = self.api("GET", "/api/v2/dags", params={"limit": 100}).json()
                    if dag_ids <= {d["dag_id"] for d in dags["dags"]}:
                        return time.monotonic() - t0
            except (httpx.HTTPError, ValueError):
                pass
            time.sleep(0.5)
        raise StackError(f"Airflow not ready after {timeout:.0f} s (waiting for {stage})")

    def _check_alive(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            raise StackError(f"airflow standalone exited with {self.proc.returncode}; see {self.log_path}")

    def stop(self, timeout: float = 30.0) -> list[int]:
        """Stop like Ctrl-C, then make sure: returns the PIDs that had to be KILLed.

        SIGINT to ``airflow standalone`` alone: it SIGTERMs each component, and the scheduler sends
        its LocalExecutor workers their shutdown message. (A SIGTERM to the whole group instead kills
        the scheduler before it can, and the workers wait on their queue forever.) What is still
        there after that gets SIGTERM, then SIGKILL: the group and every process with the marker.
        """
        if self._client is not None:
            self._client.close()
        if self.proc is None:
            return []
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        if self._gone_within(timeout):
            return []
        for pid in self.leftover_pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        if self._gone_within(5.0):
            return []
        killed = self._kill_leftovers()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)
        return killed

    def _gone_within(self, seconds: float) -> bool:
        """Whether every process of the stack has exited within ``seconds`` (reaping the leader)."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            assert self.proc is not None
            self.proc.poll()
            if not self.leftover_pids():
                return True
            time.sleep(0.2)
        return False

    def _kill_leftovers(self) -> list[int]:
        """SIGKILL the process group and every marked process, a few rounds; the PIDs killed."""
        assert self.proc is not None
        pgid = self.proc.pid  # start_new_session: the leader's pid is the group id
        killed: list[int] = []
        for _ in range(5):
            left = self.leftover_pids()
            if not left:
                break
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)
            for pid in left:
                try:
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
                except ProcessLookupError:
                    pass
            time.sleep(0.3)
        return sorted(set(killed))

    def leftover_pids(self) -> list[int]:
        return _stack_pids(self.token, self.proc.pid if self.proc is not None else None)

    # -- REST API ----------------------------------------------------------------------------------

    @property
    def client(self) -> httpx.Client:
        assert self._client is not None, "start() first"
        return self._client

    def admin_password(self) -> str:
        """standalone's SimpleAuthManager writes the generated admin password here (JSON)."""
        path = self.home / "simple_auth_manager_passwords.json.generated"
        return str(json.loads(path.read_text())["admin"])

    def jwt(self) -> str:
        if self._jwt is None:
            r = self.client.post("/auth/token", json={"username": "admin", "password": self.admin_password()})
            if r.status_code != 201:
                raise StackError(f"POST /auth/token: {r.status_code} {r.text}")
            self._jwt = str(r.json()["access_token"])
        return self._jwt

    def api(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        headers = {"Authorization": f"Bearer {self.jwt()}", **kwargs.pop("headers", {})}
        return self.client.request(method, path, headers=headers, **kwargs)

    def trigger(
        self, dag_id: str, conf: dict[str, Any] | None = None, run_id: str | None = None
    ) -> httpx.Response:
        body: dict[str, Any] = {"logical_date": None, "conf": conf or {}}
        if run_id:
            body["dag_run_id"] = run_id
        return self.api("POST", f"/api/v2/dags/{dag_id}/dagRuns", json=body)

    def dag_run(self, dag_id: str, run_id: str) -> dict[str, Any]:
        r = self.api("GET", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}")
        r.raise_for_status()
        return dict(r.json())

    def dag_runs(self, dag_id: str) -> list[dict[str, Any]]:
        r = self.api("GET", f"/api/v2/dags/{dag_id}/dagRuns", params={"limit": 100, "order_by": "run_after"})
        r.raise_for_status()
        return list(r.json()["dag_runs"])

    def task_instances(self, dag_id: str, run_id: str) -> dict[str, str | None]:
        r = self.api("GET", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances")
        r.raise_for_status()
        return {ti["task_id"]: ti["state"] for ti in r.json()["task_instances"]}

    def task_log(self, dag_id: str, run_id: str, task_id: str, try_number: int = 1) -> str:
        r = self.api(
            "GET",
            f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/logs/{try_number}",
            params={"full_content": "true"},
            headers={"Accept": "application/json"},
        )
        r.raise_for_status()
        return json.dumps(r.json().get("content"), ensure_ascii=False)

    def wait_run(self, dag_id: str, run_id: str, timeout: float = 90.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            self._check_alive()
            run = self.dag_run(dag_id, run_id)
            if run["state"] in TERMINAL:
                return run
            if time.monotonic() > deadline:
                raise StackError(
                    f"{dag_id} run {run_id} still {run['state']} after {timeout:.0f} s: "
                    f"{self.task_instances(dag_id, run_id)}"
                )
            time.sleep(0.5)

    # -- CLI ---------------------------------------------------------------------------------------

    def cli(self, *args: str, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(VENV_BIN / "airflow"), *args],
            cwd=self.home,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            start_new_session=True,
        )

    # -- artifacts ---------------------------------------------------------------------------------

    def save_logs(self, dest: Path) -> Path:
        """Copy the standalone output and Airflow's task / triggerer / processor logs to ``dest``."""
        shutil.rmtree(dest, ignore_errors=True)
        dest.mkdir(parents=True)
        if self.log_path.exists():
            shutil.copy2(self.log_path, dest / "standalone.log")
        logs = self.home / "logs"
        if logs.is_dir():
            shutil.copytree(logs, dest / "logs", dirs_exist_ok=True)
        cfg = self.home / "airflow.cfg"
        if cfg.exists():
            shutil.copy2(cfg, dest / "airflow.cfg")
        return dest


def save_artifacts(stack: AirflowStack, name: str) -> Path:
    """Keep the logs of a failed test in ``test-artifacts/airflow-e2e/<name>/``."""
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", name)[:120]
    return stack.save_logs(ARTIFACTS / safe)


def metadata_url(request: Any) -> str | None:
    """Airflow's metadata DB: SQLite in AIRFLOW_HOME (default) or, with
    ``DELTA_MIRROR_E2E_METADATA=postgres``, a fresh database on the throwaway PostgreSQL server."""
    if os.environ.get("DELTA_MIRROR_E2E_METADATA", "sqlite").lower() != "postgres":
        return None
    pg = request.getfixturevalue("pg_server")
    url = str(pg.create_database(prefix="airflow_"))
    request.addfinalizer(lambda: pg.drop_database(url))
    return url.replace("postgresql+psycopg://", "postgresql+psycopg2://")
