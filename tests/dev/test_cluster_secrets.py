"""Issue 39 finding 9: the cluster launcher's PostgreSQL and secret files. The superuser has the
cluster's generated password (scram in pg_hba.conf, no ``trust``), a data folder made before that
is secured on its next start, no password is on a command line, and the secret files are mode 600
after every start whatever their mode was. Against the real initdb/postgres binaries."""

from __future__ import annotations

import contextlib
import os
import pwd
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.services import free_port

from delta_mirror.dev.cluster import Cluster, default_repo
from delta_mirror.dev.cluster import setup as cluster_setup
from delta_mirror.dev.cluster.services import find_pg_bindir

PASSWORD = "0a1b2c3d4e5f60718293a4b5c6d7e8f9"


@pytest.fixture
def pg_folder() -> Iterator[tuple[Path, Path, str | None]]:
    """The binaries and a data folder's parent that the ``postgres`` account can reach (root runs
    PostgreSQL as ``postgres``)."""
    bindir = find_pg_bindir()
    if bindir is None:
        pytest.skip("no PostgreSQL binaries (apt-get install postgresql)")
    user = "postgres" if os.geteuid() == 0 else None
    folder = Path(tempfile.mkdtemp(prefix="dm-pg-"))
    folder.chmod(0o755)
    try:
        yield bindir, folder, user
    finally:
        subprocess.run(["rm", "-rf", str(folder)], check=False)


@contextlib.contextmanager
def running(bindir: Path, datadir: Path, user: str | None, log: Path) -> Iterator[int]:
    port = free_port()
    argv = [str(bindir / "postgres"), "-D", str(datadir), "-p", str(port), "-c", "listen_addresses=127.0.0.1"]
    argv += ["-c", "unix_socket_directories="]
    with log.open("ab") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, user=user, group=user, cwd="/")
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if login(port, PASSWORD) or login(port, None):
                break
            time.sleep(0.2)
        yield port
    finally:
        proc.terminate()
        proc.wait(30)


def chown(path: Path, user: str) -> None:
    account = pwd.getpwnam(user)
    os.chown(path, account.pw_uid, account.pw_gid)


def login(port: int, password: str | None) -> bool:
    import psycopg

    try:
        with psycopg.connect(
            host="127.0.0.1",
            port=port,
            user="postgres",
            password=password,
            dbname="postgres",
            connect_timeout=3,
        ) as conn:
            conn.execute("SELECT 1")
        return True
    except psycopg.Error:
        return False


def prepared(bindir: Path, folder: Path, user: str | None) -> tuple[Path, Path]:
    """The launcher's PostgreSQL data folder made in ``folder`` (owned by ``user``): it and its log."""
    datadir, log = folder / "postgres", folder / "pg.log"
    if user is not None:
        chown(folder, user)
    cluster_setup.prepare_postgres(bindir, datadir, user, log, PASSWORD)
    return datadir, log


@pytest.mark.postgres  # starts a PostgreSQL server: not in `make check`
def test_a_new_data_folder_lets_the_superuser_in_only_with_the_generated_password(
    pg_folder: tuple[Path, Path, str | None],
) -> None:
    bindir, folder, user = pg_folder
    datadir, log = prepared(bindir, folder, user)
    hba = (datadir / "pg_hba.conf").read_text()
    assert "trust" not in hba and "scram-sha-256" in hba
    assert not (folder / ".initdb-pwfile").exists(), "the password file given to initdb is removed"
    assert PASSWORD not in log.read_text()
    with running(bindir, datadir, user, log) as port:
        assert login(port, PASSWORD)
        assert not login(port, None) and not login(port, "wrong")


@pytest.mark.postgres  # starts a PostgreSQL server: not in `make check`
def test_a_data_folder_that_trusted_the_superuser_is_secured_on_its_next_start(
    pg_folder: tuple[Path, Path, str | None],
) -> None:
    bindir, folder, user = pg_folder
    datadir, log = prepared(bindir, folder, user)
    (datadir / "pg_hba.conf").write_text(  # as the launcher wrote it before
        "host all postgres 127.0.0.1/32 trust\nhost all all 127.0.0.1/32 scram-sha-256\n"
    )
    with running(bindir, datadir, user, log) as port:
        assert login(port, None), "the old folder trusts the superuser"
    cluster_setup.prepare_postgres(bindir, datadir, user, log, PASSWORD)
    assert "trust" not in (datadir / "pg_hba.conf").read_text()
    with running(bindir, datadir, user, log) as port:
        assert not login(port, None)
        assert login(port, PASSWORD)


def test_secret_files_are_mode_600_after_every_start_and_hold_the_superuser_password(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path, repo=default_repo(), port_base=30000, triggerers=1, workers=1)
    secrets = cluster.stack().secrets
    path = tmp_path / "secrets.env"
    assert len(secrets["POSTGRES_SUPERUSER_PASSWORD"]) == 64
    path.chmod(0o644)
    again = Cluster(tmp_path, repo=default_repo(), port_base=30000, triggerers=1, workers=1).stack().secrets
    assert again == secrets, "generated once, kept"
    assert path.stat().st_mode & 0o777 == 0o600
    assert cluster.stack().pg_admin()["password"] == secrets["POSTGRES_SUPERUSER_PASSWORD"]
    env = tmp_path / "env"
    env.write_text("old\n")
    env.chmod(0o644)
    cluster._write_env_file()
    assert env.stat().st_mode & 0o777 == 0o600
    home = tmp_path / "airflow"
    home.mkdir()
    (home / "passwords.json").write_text("{}")
    (home / "passwords.json").chmod(0o644)
    cluster_setup.airflow_home(home, "admin", "pw")
    assert (home / "passwords.json").stat().st_mode & 0o777 == 0o600


def test_no_recipe_puts_a_password_or_the_store_url_on_a_command_line(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path, repo=default_repo(), port_base=30000, triggerers=1, workers=1)
    stack = cluster.stack()
    # the generated secrets, and stack.env's role passwords as a URL would carry them
    secrets = [
        *stack.secrets.values(),
        f":{stack.s['POSTGRES_PASSWORD']}@",
        f":{stack.s['STORE_DB_PASSWORD']}@",
    ]
    lines = []
    for inst in cluster.instances:
        try:
            recipe = stack.recipe(inst, 1)
        except Exception:  # a binary this machine lacks: that recipe cannot be built here
            continue
        line = " ".join(recipe.argv)
        lines.append(line)
        assert not any(s and s in line for s in secrets), inst.name
        assert "postgresql://" not in line and "postgresql+psycopg://" not in line, inst.name
    assert any("serve" in line for line in lines), "the commit service's recipe was checked"
