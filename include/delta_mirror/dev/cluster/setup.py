"""One-time setup steps of a cluster's services: data folders, databases and roles, the bucket,
the Airflow admin's password file. Each is idempotent: a second ``up`` on the same folder reuses them."""

from __future__ import annotations

import json
import os
import pwd
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from delta_mirror.dev.cluster.processes import ClusterError, alive, log_tail

__all__ = [
    "airflow_home",
    "clear_stale_pidfile",
    "create_bucket",
    "create_databases",
    "initdb",
    "prepare_postgres",
]


def initdb(bindir: Path, datadir: Path, user: str | None, log: Path) -> None:
    """A PostgreSQL data folder (once): superuser ``postgres`` trusted only on 127.0.0.1 from this
    machine, every other role by password (scram)."""
    if (datadir / "PG_VERSION").exists():
        return
    datadir.mkdir(parents=True, exist_ok=True)
    if user is not None:
        account = pwd.getpwnam(user)
        for path in (datadir.parent, datadir):
            os.chown(path, account.pw_uid, account.pw_gid)
    datadir.chmod(0o700)
    argv = [str(bindir / "initdb"), "-D", str(datadir), "-U", "postgres", "-E", "UTF8", "--locale=C"]
    argv += ["--auth-local=trust", "--auth-host=scram-sha-256", "--no-sync"]
    with open(log, "ab") as out:
        proc = subprocess.run(
            argv,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={"PATH": "/usr/bin:/bin", "LC_ALL": "C", "LANG": "C"},
            user=user,
            group=user,
            extra_groups=[] if user else None,
            cwd="/",
            timeout=300,
            check=False,
        )
    if proc.returncode != 0:
        raise ClusterError(f"postgres: initdb failed (code {proc.returncode}): {log_tail(log)} [log: {log}]")
    hba = datadir / "pg_hba.conf"
    hba.write_text(
        "# written by delta_mirror.dev.cluster: the launcher connects as postgres, everyone else by password\n"
        "host all postgres 127.0.0.1/32 trust\n"
        "host all all 127.0.0.1/32 scram-sha-256\n"
    )
    if user is not None:
        account = pwd.getpwnam(user)
        os.chown(hba, account.pw_uid, account.pw_gid)


def clear_stale_pidfile(datadir: Path) -> None:
    """Remove postmaster.pid left by a killed server whose PID no longer runs: PostgreSQL itself
    refuses to start while that PID exists, and a killed postmaster may linger as a zombie until
    something reaps it (the launcher that started it has exited)."""
    pidfile = datadir / "postmaster.pid"
    try:
        pid = int(pidfile.read_text().split("\n", 1)[0])
    except (OSError, ValueError):
        return
    if not alive(pid):
        pidfile.unlink(missing_ok=True)


def prepare_postgres(bindir: Path, datadir: Path, user: str | None, log: Path) -> None:
    """Before each start: the data folder (once), no stale lock file."""
    initdb(bindir, datadir, user, log)
    clear_stale_pidfile(datadir)


def _ensure_role_and_db(conn: object, role: str, password: str, db: str) -> None:
    import psycopg
    from psycopg import sql

    assert isinstance(conn, psycopg.Connection)
    exists = conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,)).fetchone()
    verb = sql.SQL("ALTER ROLE") if exists else sql.SQL("CREATE ROLE")
    conn.execute(sql.SQL("{} {} LOGIN PASSWORD {}").format(verb, sql.Identifier(role), sql.Literal(password)))
    if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (db,)).fetchone():
        conn.execute(sql.SQL("CREATE DATABASE {} OWNER {}").format(sql.Identifier(db), sql.Identifier(role)))


def create_databases(admin: Mapping[str, Any], s: Mapping[str, str]) -> None:
    """The Airflow metadata database and the delta-mirror store database, each with its own role
    (``admin``: superuser conninfo; ``s``: stack.env's settings)."""
    import psycopg

    with psycopg.connect(**admin, autocommit=True, connect_timeout=10) as conn:
        _ensure_role_and_db(conn, s["POSTGRES_USER"], s["POSTGRES_PASSWORD"], s["AIRFLOW_DB"])
        _ensure_role_and_db(conn, s["STORE_DB_USER"], s["STORE_DB_PASSWORD"], s["STORE_DB"])


def create_bucket(endpoint: str, s: Mapping[str, str]) -> None:
    """The bucket the tables publish to (exists already: fine)."""
    import boto3
    from botocore.config import Config
    from botocore.exceptions import ClientError

    client = boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=s["MINIO_ROOT_USER"],
        aws_secret_access_key=s["MINIO_ROOT_PASSWORD"],
        region_name=s["MINIO_REGION"],
        config=Config(retries={"max_attempts": 5, "mode": "standard"}, proxies={}),
    )
    try:
        client.create_bucket(Bucket=s["BUCKET"])
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") not in (
            "BucketAlreadyOwnedByYou",
            "BucketAlreadyExists",
        ):
            raise ClusterError(f"minio: cannot create bucket {s['BUCKET']}: {exc}") from None


def airflow_home(home: Path, user: str, password: str) -> None:
    """AIRFLOW_HOME and the Simple auth manager's password file (the admin of stack.env)."""
    home.mkdir(parents=True, exist_ok=True)
    fd = os.open(home / "passwords.json", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({user: password}, f)
