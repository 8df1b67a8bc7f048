"""A throwaway MariaDB server for the tests (the MySQL/MariaDB store), like ``PgServer`` for PostgreSQL.

``mariadb-install-db`` makes a fresh data folder under /tmp; ``mariadbd`` runs as a plain child
process on a free port of 127.0.0.1 (``--user=root``: the tests run as root here, and the server
refuses root without it); each test or module gets a database of its own; the session stops the
server by its PID. ``DELTA_MIRROR_TEST_MYSQL`` (a ``mysql+pymysql://`` URL of a user who may create
databases) uses an external server instead.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import shutil
import subprocess
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pymysql
from sqlalchemy.engine import make_url

from support.services import ServiceUnavailable, exit_report, file_tail, free_port, stop_group
from support.waiting import wait_until

MYSQL_ENV = "DELTA_MIRROR_TEST_MYSQL"

# Durability off (the data folder is thrown away): an OS crash may lose commits, a server crash not.
_SERVER_OPTIONS = (
    "--skip-name-resolve",
    "--innodb-flush-log-at-trx-commit=2",
    "--innodb-doublewrite=0",
    "--innodb-buffer-pool-size=256M",
    "--max-connections=300",
)


def _tool(name: str, *fallbacks: str) -> str | None:
    for candidate in (name, *fallbacks):
        found = shutil.which(candidate) or (
            f"/usr/sbin/{candidate}" if os.path.exists(f"/usr/sbin/{candidate}") else None
        )
        if found:
            return found
    return None


def _quote_db(name: str) -> str:
    if not re.fullmatch(r"[a-z_][a-z0-9_]*", name):
        raise ValueError(f"unsafe database name {name!r}")
    return f"`{name}`"


@dataclass
class MariaDbServer:
    """A MariaDB server: one started here (``owned``) or an external one from ``DELTA_MIRROR_TEST_MYSQL``."""

    url: str  # SQLAlchemy URL without a database: create_database() adds one
    owned: bool
    tmpdir: Path | None = None
    port: int = 0
    proc: subprocess.Popen[bytes] | None = None
    options: tuple[str, ...] = ()  # mariadbd options beyond _SERVER_OPTIONS

    @classmethod
    def from_env_or_start(cls) -> MariaDbServer:
        external = os.environ.get(MYSQL_ENV)
        if external:
            server = cls(url=external, owned=False)
            server.wait_ready()
            return server
        return cls.start_new()

    @classmethod
    def start_new(cls, *options: str) -> MariaDbServer:
        """A new server in a fresh data folder; ``options``: more ``mariadbd`` options."""
        install = _tool("mariadb-install-db", "mysql_install_db")
        daemon = _tool("mariadbd", "mysqld")
        if install is None or daemon is None:
            raise ServiceUnavailable(
                "MariaDB binaries (mariadb-install-db, mariadbd) not found on PATH or in /usr/sbin: "
                f"install the 'mariadb-server' package or set {MYSQL_ENV}"
            )
        tmpdir = Path(tempfile.mkdtemp(prefix="dm-mariadb-"))
        server = cls(url="", owned=True, tmpdir=tmpdir, options=tuple(options))
        try:
            proc = subprocess.run(
                [
                    install,
                    "--no-defaults",
                    f"--datadir={server.datadir}",
                    "--user=root",
                    "--auth-root-authentication-method=normal",
                    "--skip-test-db",
                ],
                cwd=tmpdir,
                capture_output=True,
                text=True,
                timeout=300,
            )
            if proc.returncode != 0:
                raise ServiceUnavailable(f"mariadb-install-db failed:\n{(proc.stdout + proc.stderr)[-2000:]}")
            for _attempt in range(5):
                server.port = free_port()
                server._spawn(daemon)
                try:
                    server.wait_ready()
                    break
                except AssertionError:
                    if "already in use" not in file_tail(server.logfile):
                        raise
                    if server.proc is not None:
                        stop_group(server.proc)
            else:
                raise ServiceUnavailable(f"MariaDB did not start:\n{file_tail(server.logfile)}")
        except BaseException:
            server.stop_and_remove()
            raise
        atexit.register(server.stop_and_remove)
        return server

    @property
    def datadir(self) -> Path:
        assert self.tmpdir is not None
        return self.tmpdir / "data"

    @property
    def logfile(self) -> Path:
        assert self.tmpdir is not None
        return self.tmpdir / "mariadb.log"

    def _spawn(self, daemon: str) -> None:
        assert self.tmpdir is not None
        self.url = f"mysql+pymysql://root@127.0.0.1:{self.port}/"
        self.proc = subprocess.Popen(
            [
                daemon,
                "--no-defaults",
                f"--datadir={self.datadir}",
                "--user=root",
                "--bind-address=127.0.0.1",
                f"--port={self.port}",
                f"--socket={self.tmpdir / 'mariadb.sock'}",
                f"--pid-file={self.tmpdir / 'mariadb.pid'}",
                f"--log-error={self.logfile}",
                *_SERVER_OPTIONS,
                *self.options,
            ],
            cwd=self.tmpdir,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )

    def _connect(self, database: str | None = None) -> Any:
        u = make_url(self.url)
        return pymysql.connect(
            host=u.host or "127.0.0.1",
            port=u.port or 3306,
            user=u.username or "root",
            password=str(u.password or ""),
            database=database,
            connect_timeout=10,
            autocommit=True,
        )

    def _answers(self) -> bool:
        try:
            with contextlib.closing(self._connect()) as conn, conn.cursor() as cur:
                cur.execute("SELECT 1")
            return True
        except pymysql.err.OperationalError:
            return False

    def wait_ready(self, seconds: float = 60.0) -> None:
        """Poll until the server answers a query (the deadline stretches with the machine's load)."""
        alive = None
        if self.proc is not None and self.tmpdir is not None:
            procs, log = [self.proc], self.logfile

            def alive() -> str | None:
                return exit_report(procs, log)

        wait_until(self._answers, seconds, f"MariaDB on port {self.port}", interval=0.1, alive=alive)

    def stop_and_remove(self) -> None:
        """Stop the server by its PID (SIGTERM, then SIGKILL) and remove its folder."""
        if not self.owned or self.tmpdir is None:
            return
        if self.proc is not None:
            stop_group(self.proc, grace=20.0)
        shutil.rmtree(self.tmpdir, ignore_errors=True)
        self.tmpdir = None

    # -- databases ---------------------------------------------------------------------------------

    def create_database(self, prefix: str = "dm_") -> str:
        """Create a fresh empty database (the server's default character set: the store's tables
        name theirs); return its SQLAlchemy URL."""
        name = f"{prefix}{uuid.uuid4().hex[:12]}"
        with contextlib.closing(self._connect()) as conn, conn.cursor() as cur:
            cur.execute(f"CREATE DATABASE {_quote_db(name)}")
        return make_url(self.url).set(database=name).render_as_string(hide_password=False)

    def drop_database(self, url: str) -> None:
        name = make_url(url).database
        assert name
        with contextlib.closing(self._connect()) as conn, conn.cursor() as cur:
            # Sessions still open on it (a test's leftover pool) would hold metadata locks: end them.
            cur.execute("SELECT id FROM information_schema.processlist WHERE db = %s", (name,))
            for (session_id,) in cur.fetchall():
                with contextlib.suppress(pymysql.err.MySQLError):
                    cur.execute(f"KILL {int(session_id)}")
            cur.execute(f"DROP DATABASE IF EXISTS {_quote_db(name)}")


__all__ = ["MYSQL_ENV", "MariaDbServer"]
