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
    "secure_existing",
]


#: pg_hba.conf: every role, the superuser included, by password (scram) and only from 127.0.0.1.
#: No ``trust``: any local user trusted as superuser could run code as the server's account
#: (``COPY ... TO PROGRAM``).
PG_HBA = (
    "# written by delta_mirror.dev.cluster: every role by password (scram), from this machine only\n"
    "host all all 127.0.0.1/32 scram-sha-256\n"
)


def _run_as(argv: list[str], user: str | None, log: Path, stdin: bytes | None = None) -> int:
    """``argv`` as ``user`` (PostgreSQL refuses root), its output into ``log``; never a secret in
    ``argv`` (``ps`` shows it): secrets go by ``stdin`` or a private file."""
    with open(log, "ab") as out:
        proc = subprocess.run(
            argv,
            input=stdin,
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
    return proc.returncode


def initdb(bindir: Path, datadir: Path, user: str | None, log: Path, password: str) -> None:
    """A PostgreSQL data folder (once): superuser ``postgres`` with ``password`` (the cluster's
    generated ``POSTGRES_SUPERUSER_PASSWORD``, given to initdb in a file of mode 600 removed after),
    every role by password (scram) from 127.0.0.1 (``PG_HBA``)."""
    if (datadir / "PG_VERSION").exists():
        return
    datadir.mkdir(parents=True, exist_ok=True)
    if user is not None:
        account = pwd.getpwnam(user)
        for path in (datadir.parent, datadir):
            os.chown(path, account.pw_uid, account.pw_gid)
    datadir.chmod(0o700)
    pwfile = datadir.parent / ".initdb-pwfile"
    fd = os.open(pwfile, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(password + "\n")
    if user is not None:
        account = pwd.getpwnam(user)
        os.chown(pwfile, account.pw_uid, account.pw_gid)
    argv = [str(bindir / "initdb"), "-D", str(datadir), "-U", "postgres", "-E", "UTF8", "--locale=C"]
    argv += [f"--pwfile={pwfile}", "--auth-local=scram-sha-256", "--auth-host=scram-sha-256", "--no-sync"]
    try:
        code = _run_as(argv, user, log)
    finally:
        pwfile.unlink(missing_ok=True)
    if code != 0:
        raise ClusterError(f"postgres: initdb failed (code {code}): {log_tail(log)} [log: {log}]")
    _write_hba(datadir, user)


def _write_hba(datadir: Path, user: str | None) -> None:
    hba = datadir / "pg_hba.conf"
    hba.write_text(PG_HBA)
    hba.chmod(0o600)
    if user is not None:
        account = pwd.getpwnam(user)
        os.chown(hba, account.pw_uid, account.pw_gid)


def secure_existing(bindir: Path, datadir: Path, user: str | None, log: Path, password: str) -> None:
    """A data folder made before the superuser had a password (its pg_hba.conf trusts it): the
    password set in single-user mode (the server is stopped; the statement goes by stdin, never
    on a command line), then ``PG_HBA`` written."""
    hba = datadir / "pg_hba.conf"
    if not (datadir / "PG_VERSION").exists() or "trust" not in hba.read_text():
        return
    if not password.isalnum():
        raise ClusterError("postgres: the generated superuser password is not alphanumeric")
    statement = f"ALTER ROLE postgres PASSWORD '{password}';\n".encode()
    code = _run_as(
        [str(bindir / "postgres"), "--single", "-D", str(datadir), "postgres"], user, log, statement
    )
    if code != 0:
        raise ClusterError(f"postgres: cannot set the superuser's password (code {code}) [log: {log}]")
    _write_hba(datadir, user)


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


def prepare_postgres(bindir: Path, datadir: Path, user: str | None, log: Path, password: str) -> None:
    """Before each start: the data folder (once), no stale lock file, no trusted superuser."""
    initdb(bindir, datadir, user, log, password)
    clear_stale_pidfile(datadir)
    secure_existing(bindir, datadir, user, log, password)


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
    os.fchmod(fd, 0o600)  # an existing file keeps its mode through O_CREAT: forced on every start
    with os.fdopen(fd, "w") as f:
        json.dump({user: password}, f)
