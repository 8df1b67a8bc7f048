"""Credentials under a real Airflow: from connections (environment) and from a secrets backend,
used by the tasks, and absent from every log file Airflow writes.

A real ``airflow standalone`` (LocalExecutor: each task runs under the task supervisor, which writes
``$AIRFLOW_HOME/logs/...`` through Airflow's secrets masker) publishes three tables whose store
(PostgreSQL) and object storage (the S3 server) credentials carry known secrets:

- ``envconn``: connections from ``AIRFLOW_CONN_*`` variables;
- ``backend``: connections from a secrets backend (``LocalFilesystemBackend`` with a connections
  file, configured by ``AIRFLOW__SECRETS__BACKEND``), nowhere else;
- ``down``: a store connection to a closed port with the same password (a failing task's log).

Afterwards every file under the Airflow home's ``logs/``, the standalone output and the task logs
served by the REST API are searched for each secret.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from airflow_e2e_stack import AirflowStack, save_artifacts
from dm_airflow_kit import S3Writer, config_yaml, make_table
from sqlalchemy.engine import make_url

from delta_mirror.delta.log_path import LOG_DIR, commit_name
from delta_mirror.store.sql_store import SqlStore

pytestmark = [pytest.mark.airflow_e2e, pytest.mark.postgres, pytest.mark.s3, pytest.mark.timeout(420)]

PG_SECRET = "pg-Env-S3cr3t-5d1f0a"
AWS_SECRET = "aws-Env-S3cr3t-8c2e7b"
PG_SECRET_B = "pg-Backend-S3cr3t-a41c9e"
AWS_SECRET_B = "aws-Backend-S3cr3t-3f70d2"
SECRETS = (PG_SECRET, AWS_SECRET, PG_SECRET_B, AWS_SECRET_B)
TABLES = ("envconn", "backend", "down")
DAG_IDS = {f"delta_mirror__{t}" for t in TABLES} | {
    "delta_mirror_backfill",
    "delta_mirror_reconcile",
    "delta_mirror_monitor",
    "delta_mirror_maintenance",
}


def _pg_conn(url: str, password: str, port: int | None = None) -> dict[str, Any]:
    u = make_url(url)
    return {
        "conn_type": "postgres",
        "host": u.host,
        "port": port or u.port,
        "login": u.username,
        "password": password,
        "schema": u.database,
    }


def _aws_conn(s3: Any, secret: str) -> dict[str, Any]:
    return {
        "conn_type": "aws",
        "login": s3.access_key,
        "password": secret,  # the S3 server does not check signatures: any secret works
        "extra": {"endpoint_url": s3.endpoint, "region_name": s3.region},
    }


class Env:
    def __init__(self, stack: AirflowStack, store_url: str, bucket: str) -> None:
        self.stack, self.store_url, self.bucket = stack, store_url, bucket


@pytest.fixture(scope="module")
def airflow(pg_server: Any, s3: Any, e2e_dir: Path) -> Iterator[Env]:
    store_url = pg_server.create_database()
    store = SqlStore(store_url)
    store.init()
    bucket = s3.make_bucket()
    for name in ("envconn", "backend"):
        make_table(store, name, f"s3://{bucket}/{name}", versions=2, s3=S3Writer(s3.client(), bucket, name))
    make_table(store, "down", f"s3://{bucket}/down", versions=1, s3=S3Writer(s3.client(), bucket, "down"))
    store.close()
    config = e2e_dir / "delta_mirror.yaml"
    config.write_text(
        config_yaml(
            {
                "envconn": {"store_conn_id": "dm_store", "aws_conn_id": "dm_s3"},
                "backend": {"store_conn_id": "dm_store_b", "aws_conn_id": "dm_s3_b"},
                "down": {"store_conn_id": "dm_down", "aws_conn_id": "dm_s3", "retries": 0},
            },
            retries=0,
            maintenance={"schedule": None},
            reconcile={"schedule": None},
            monitor={"schedule": None},
        )
    )
    connections = e2e_dir / "connections.json"  # the secrets backend's only source of these two
    connections.write_text(
        json.dumps({"dm_store_b": _pg_conn(store_url, PG_SECRET_B), "dm_s3_b": _aws_conn(s3, AWS_SECRET_B)})
    )
    stack = AirflowStack(
        e2e_dir / "airflow-home",
        {
            "DELTA_MIRROR_CONFIG": str(config),
            "AIRFLOW_CONN_DM_STORE": json.dumps(_pg_conn(store_url, PG_SECRET)),
            "AIRFLOW_CONN_DM_S3": json.dumps(_aws_conn(s3, AWS_SECRET)),
            "AIRFLOW_CONN_DM_DOWN": json.dumps(_pg_conn(store_url, PG_SECRET, port=9)),
            "AIRFLOW__SECRETS__BACKEND": "airflow.secrets.local_filesystem.LocalFilesystemBackend",
            "AIRFLOW__SECRETS__BACKEND_KWARGS": json.dumps({"connections_file_path": str(connections)}),
        },
    )
    stack.start()
    try:
        try:
            stack.wait_ready(DAG_IDS)
        except BaseException:
            print(f"\nAirflow logs saved to {save_artifacts(stack, 'secrets-startup')}")
            raise
        yield Env(stack, store_url, bucket)
    finally:
        stack.stop()
        assert not stack.leftover_pids()
        pg_server.drop_database(store_url)


def test_connection_and_secrets_backend_credentials_are_used_and_never_logged(airflow: Env, s3: Any) -> None:
    stack = airflow.stack
    runs = {t: f"secrets__{uuid.uuid4().hex[:8]}" for t in TABLES}
    for table, run_id in runs.items():
        r = stack.trigger(f"delta_mirror__{table}", run_id=run_id)
        assert r.status_code == 200, r.text
    states = {}
    for table, run_id in runs.items():
        stack.wait_run(f"delta_mirror__{table}", run_id, timeout=180)
        states[table] = stack.task_instances(f"delta_mirror__{table}", run_id)
    # the credentials were used: both tables published to the bucket and validated
    for table in ("envconn", "backend"):
        assert states[table]["publish"] == "success" and states[table]["validate"] == "success", states
        keys = {o["Key"] for o in s3.client().list_objects_v2(Bucket=airflow.bucket)["Contents"]}
        assert {f"{table}/{LOG_DIR}/{commit_name(v)}" for v in (0, 1)} <= keys
    assert states["down"]["publish"] == "failed", states

    texts: dict[str, str] = {}
    logs = stack.home / "logs"
    for path in sorted(logs.rglob("*")):
        if path.is_file():
            texts[str(path.relative_to(stack.home))] = path.read_text(errors="replace")
    texts["standalone output"] = stack.log_path.read_text(errors="replace")
    for table, run_id in runs.items():
        for task in ("publish", "validate"):
            if states[table].get(task) in ("success", "failed"):
                texts[f"REST log {table}.{task}"] = stack.task_log(f"delta_mirror__{table}", run_id, task)
    task_logs = [t for p, t in texts.items() if "run_id=secrets__" in p]
    assert len(task_logs) >= 5, sorted(texts)  # real task log files were written
    joined = "\n".join(texts.values())
    assert "published 2 version(s) of envconn" in joined and "published 2 version(s) of backend" in joined
    assert "port 9" in joined or "127.0.0.1:9" in joined  # the failing task's error was logged
    leaks = {s: [where for where, text in texts.items() if s in text] for s in SECRETS}
    assert leaks == {s: [] for s in SECRETS}
