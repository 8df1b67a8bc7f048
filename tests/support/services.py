"""Real services for the tests: a throwaway PostgreSQL server and an S3-protocol server (moto).

Both bind to 127.0.0.1 on a free port, are started lazily (the first time a test asks for them)
and are stopped at the end of the session. ``conftest.py`` wraps them in fixtures.
"""

from __future__ import annotations

import atexit
import contextlib
import glob
import os
import pwd
import re
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import psycopg
from sqlalchemy.engine import URL, make_url

PG_ENV = "DELTA_MIRROR_TEST_PG"
# fsync/full_page_writes off only risk data on an OS crash. synchronous_commit stays ON: with it off an
# "immediate" stop (our crash test) loses commits that were already reported committed.
PG_SERVER_OPTIONS = (
    "-c listen_addresses=127.0.0.1 -c fsync=off -c full_page_writes=off -c max_connections=200"
)


#: In a run without the ``service`` tests (``-m "not service"``, ``make check``): the test running
#: now (tests/conftest.py sets it around each test). What starts a server or a JVM calls
#: ``refuse_unmarked`` first. (Only there: a session fixture's failure is kept for every later test.)
unmarked_test: list[str] = []


def refuse_unmarked(what: str) -> None:
    """Fail the running test of the inner loop (``make check``) when it starts ``what``: it lacks
    the marker of what it needs, so ``-m "not service"`` did not deselect it."""
    if unmarked_test:
        import pytest

        pytest.fail(
            f"{unmarked_test[0]} starts {what} but is not marked `service`: request the service's "
            "fixture or add its marker (postgres, mysql, s3, emulator, spark, airflow_server; tests/conftest.py)"
        )


class ServiceUnavailable(RuntimeError):
    """A service binary or external server the tests need is not there."""


def in_ci() -> bool:
    """Whether this is a CI run (``CI=true``, as ``.ci/run`` sets), where every service is installed."""
    return os.environ.get("CI", "").strip().lower() in ("true", "1")


def skip_or_fail(reason: str) -> NoReturn:
    """A service or tool the test needs is missing (PostgreSQL, Redis, MinIO, an emulator, Chromium,
    Java, a jar): under CI that is a broken run, so the test fails with ``reason``; elsewhere the
    machine may simply lack it, so the test is skipped with ``reason`` (shown by ``-ra``)."""
    import pytest

    if in_ci():
        pytest.fail(reason, pytrace=False)
    pytest.skip(reason)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def listening(port: int) -> bool:
    """Whether something accepts connections on 127.0.0.1:``port`` now."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def find_tool(env_var: str, local: Path, name: str) -> str | None:
    """A test tool's executable: ``env_var`` if set (a path or a name on PATH; None when it is
    neither), else the project's own install at ``local``, else ``name`` on PATH."""
    explicit = os.environ.get(env_var)
    if explicit:
        return shutil.which(explicit)
    return str(local) if local.exists() else shutil.which(name)


_Service = TypeVar("_Service")


def session_service(
    start: Callable[[], _Service], stop: Callable[[_Service], None], name: str | None = None
) -> Iterator[_Service]:
    """The body of a session fixture: the service from ``start()``, stopped at the end; skipped when
    it is unavailable here, failed under CI (``.ci/run`` installs every service). A server given
    its ``name`` is refused to a test not marked ``service`` in the inner loop (``refuse_unmarked``)."""
    if name is not None:
        refuse_unmarked(name)
    missing: str | None = None
    try:
        server = start()
    except ServiceUnavailable as exc:
        missing = str(exc)
    if missing is not None:  # outside the except: the report is the reason, not a chained traceback
        skip_or_fail(missing)
    try:
        yield server
    finally:
        stop(server)


def file_tail(path: Path, chars: int = 2000) -> str:
    """The end of a service's log, for a failure message ("" when there is none)."""
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return ""


def exit_report(procs: Sequence[subprocess.Popen[Any]], log: Path) -> str | None:
    """For ``wait_until(alive=...)``: None while every process runs, else the first dead one's exit
    code and the end of the log they write."""
    dead = [p for p in procs if p.poll() is not None]
    if not dead:
        return None
    return f"exit {dead[0].returncode}: {file_tail(log)}"


def stop_group(proc: subprocess.Popen[Any], grace: float = 0.0) -> None:
    """Stop the process group ``proc`` leads (started with ``start_new_session``): SIGTERM and up
    to ``grace`` seconds to go, then SIGKILL (at once when there is no grace); gone already is fine."""
    if proc.poll() is not None:
        return
    if grace > 0:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=grace)
            return
        except subprocess.TimeoutExpired:
            pass
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)


def scalar_query(url: str, query: str) -> int:
    """One integer from the store database at ``url`` on a connection of its own (closed after):
    for counting sessions and backends without borrowing the code under test's pool."""
    from sqlalchemy import text

    from delta_mirror.store import db

    engine = db.make_engine(url)
    try:
        with engine.connect() as conn:
            return int(conn.execute(text(query)).scalar_one())
    finally:
        engine.dispose()


def _wait_port(port: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not listening(port):
        if time.monotonic() > deadline:
            raise OSError(f"nothing listens on 127.0.0.1:{port} after {timeout:.0f} s")
        time.sleep(0.05)


# --------------------------------------------------------------------------------------------------
# PostgreSQL


def _version_key(path: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", path)) or (0,)


def find_pg_bindir() -> Path | None:
    """The folder holding initdb/pg_ctl/postgres: PATH first, then the newest /usr/lib/postgresql/*/bin."""
    found = shutil.which("initdb")
    if found:
        bindir = Path(found).resolve().parent
        if (bindir / "pg_ctl").exists() and (bindir / "postgres").exists():
            return bindir
    candidates = [
        d for d in glob.glob("/usr/lib/postgresql/*/bin") if os.path.exists(os.path.join(d, "initdb"))
    ]
    if not candidates:
        return None
    return Path(max(candidates, key=_version_key))


def _ensure_postgres_user() -> pwd.struct_passwd:
    try:
        return pwd.getpwnam("postgres")
    except KeyError:
        subprocess.run(["useradd", "-r", "-m", "postgres"], check=True, capture_output=True)
        return pwd.getpwnam("postgres")


def _admin_conninfo(url: URL, dbname: str | None = None) -> dict[str, Any]:
    info: dict[str, Any] = {
        "host": url.host or "127.0.0.1",
        "port": url.port or 5432,
        "user": url.username or "postgres",
        "dbname": dbname or url.database or "postgres",
        "autocommit": True,
        "connect_timeout": 10,
    }
    if url.password:
        info["password"] = url.password
    return info


def _quote_ident(name: str) -> str:
    if not re.fullmatch(r"[a-z_][a-z0-9_]*", name):
        raise ValueError(f"unsafe database name {name!r}")
    return f'"{name}"'


@dataclass
class PgServer:
    """A PostgreSQL server: one started here (``owned``) or an external one from ``DELTA_MIRROR_TEST_PG``."""

    url: str  # SQLAlchemy URL of the session database
    owned: bool
    bindir: Path | None = None
    tmpdir: Path | None = None
    port: int = 0
    _run_as: Sequence[str] = field(default_factory=tuple)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    # -- life cycle --------------------------------------------------------------------------------

    @classmethod
    def from_env_or_start(cls) -> PgServer:
        external = os.environ.get(PG_ENV)
        if external:
            server = cls(url=external, owned=False)
            server.wait_ready()
            return server
        return cls.start_new()

    @classmethod
    def start_new(cls) -> PgServer:
        bindir = find_pg_bindir()
        if bindir is None:
            raise ServiceUnavailable(
                "PostgreSQL binaries (initdb, pg_ctl, postgres) not found on PATH or in /usr/lib/postgresql/*/bin: "
                f"install the 'postgresql' package or set {PG_ENV}"
            )
        tmpdir = Path(tempfile.mkdtemp(prefix="dm-pg-"))
        run_as: tuple[str, ...] = ()
        if os.geteuid() == 0:  # postgres refuses to run as root
            user = _ensure_postgres_user()
            os.chown(tmpdir, user.pw_uid, user.pw_gid)
            run_as = ("runuser", "-u", "postgres", "--") if shutil.which("runuser") else ("su-postgres",)
        server = cls(url="", owned=True, bindir=bindir, tmpdir=tmpdir, _run_as=run_as)
        try:
            server._cmd(
                "initdb",
                "-D",
                str(server.datadir),
                "-U",
                "postgres",
                "--auth=trust",
                "-E",
                "UTF8",
                "--locale=C",
                "--no-sync",
            )
            for _attempt in range(5):
                server.port = free_port()
                try:
                    server._pg_ctl_start()
                    break
                except subprocess.CalledProcessError:
                    if "could not bind" not in server.log_tail() and "in use" not in server.log_tail():
                        raise
            else:
                raise ServiceUnavailable(f"PostgreSQL did not start:\n{server.log_tail()}")
            server.url = f"postgresql+psycopg://postgres@127.0.0.1:{server.port}/dm_test"
            with psycopg.connect(**_admin_conninfo(make_url(server.url), "postgres")) as conn:
                conn.execute("CREATE DATABASE dm_test")
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
        return self.tmpdir / "postgres.log"

    def log_tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.logfile.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def _cmd(self, tool: str, *args: str) -> subprocess.CompletedProcess[str]:
        assert self.bindir is not None and self.tmpdir is not None
        argv = [str(self.bindir / tool), *args]
        if self._run_as == ("su-postgres",):
            argv = ["su", "postgres", "-s", "/bin/sh", "-c", shlex.join(argv)]
        else:
            argv = [*self._run_as, *argv]
        env = {**os.environ, "LC_ALL": "C", "LANG": "C"}
        env.pop("PGDATA", None)
        proc = subprocess.run(argv, cwd=self.tmpdir, env=env, capture_output=True, text=True, timeout=120)
        if proc.returncode != 0:
            raise subprocess.CalledProcessError(proc.returncode, argv, proc.stdout, proc.stderr)
        return proc

    def _pg_ctl_start(self) -> None:
        assert self.tmpdir is not None
        opts = f"-p {self.port} -k {self.tmpdir} {PG_SERVER_OPTIONS}"
        self._cmd(
            "pg_ctl", "-D", str(self.datadir), "-l", str(self.logfile), "-o", opts, "-w", "-t", "60", "start"
        )

    def start(self) -> None:
        """Start the (stopped) server again on the same port."""
        self._require_owned()
        with self._lock:
            self._pg_ctl_start()
        self.wait_ready()

    def stop(self, mode: str = "immediate") -> None:
        """Stop the server (``immediate`` is a crash: no shutdown checkpoint)."""
        self._require_owned()
        with self._lock:
            self._cmd("pg_ctl", "-D", str(self.datadir), "-m", mode, "-w", "-t", "60", "stop")

    def restart(self, mode: str = "immediate") -> None:
        """Stop (crash-style by default) and start the server; existing connections break."""
        self.stop(mode)
        self.start()

    def is_running(self) -> bool:
        if not self.owned:
            return True
        try:
            self._cmd("pg_ctl", "-D", str(self.datadir), "status")
            return True
        except subprocess.CalledProcessError:
            return False

    def stop_and_remove(self) -> None:
        if not self.owned or self.tmpdir is None:
            return
        if (self.datadir / "postmaster.pid").exists():
            with contextlib.suppress(subprocess.CalledProcessError, subprocess.TimeoutExpired):
                self._cmd("pg_ctl", "-D", str(self.datadir), "-m", "immediate", "-w", "stop")
        shutil.rmtree(self.tmpdir, ignore_errors=True)
        self.tmpdir = None

    def _require_owned(self) -> None:
        if not self.owned:
            raise ServiceUnavailable(f"cannot stop/restart an external PostgreSQL server ({PG_ENV})")

    def wait_ready(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        info = _admin_conninfo(make_url(self.url))
        while True:
            try:
                with psycopg.connect(**info) as conn:
                    conn.execute("SELECT 1")
                return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    # -- databases ---------------------------------------------------------------------------------

    def create_database(self, prefix: str = "dm_") -> str:
        """Create a fresh empty database; return its SQLAlchemy URL."""
        name = f"{prefix}{uuid.uuid4().hex[:12]}"
        base = make_url(self.url)
        with psycopg.connect(**_admin_conninfo(base)) as conn:
            conn.execute(f"CREATE DATABASE {_quote_ident(name)}")
        return base.set(database=name).render_as_string(hide_password=False)

    def drop_database(self, url: str) -> None:
        name = make_url(url).database
        assert name
        base = make_url(self.url)
        if name == base.database:
            raise ValueError("refusing to drop the session database")
        with psycopg.connect(**_admin_conninfo(base)) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {_quote_ident(name)} WITH (FORCE)")


# --------------------------------------------------------------------------------------------------
# S3 (moto's server speaking the real S3 protocol over HTTP)


class S3ProtocolServer:
    """What every S3 test server offers once it has ``endpoint``, keys and ``region``: a boto3
    client, fresh buckets and the environment that points deltalake/boto3 at it (moto and MinIO
    share this, so a test written for one runs on the other)."""

    access_key: str
    secret_key: str
    region: str
    endpoint: str
    _client: Any = None

    def client(self) -> Any:
        if self._client is None:
            import boto3

            self._client = boto3.client(
                "s3",
                endpoint_url=self.endpoint,
                aws_access_key_id=self.access_key,
                aws_secret_access_key=self.secret_key,
                region_name=self.region,
            )
        return self._client

    def make_bucket(self, prefix: str = "dm-") -> str:
        name = f"{prefix}{uuid.uuid4().hex[:16]}"
        self.client().create_bucket(Bucket=name)
        return name

    def env(self) -> dict[str, str]:
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_REGION": self.region,
            "AWS_DEFAULT_REGION": self.region,
            "AWS_ALLOW_HTTP": "true",
        }


class S3Server(S3ProtocolServer):
    """moto's S3 server in its own process on 127.0.0.1; buckets are made fresh per test.

    A separate process, not ``ThreadedMotoServer``: deltalake's query engine holds the GIL while
    it waits on HTTP, which deadlocks against a server thread in the same interpreter.
    """

    access_key = "testing"
    secret_key = "testing"
    region = "us-east-1"

    def __init__(self) -> None:
        import subprocess
        import sys

        self.port = free_port()
        self._log = open(os.devnull, "wb")  # noqa: SIM115 - closed in stop()
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=self._log,
            stderr=self._log,
            start_new_session=True,
        )
        _wait_port(self.port)
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._client: Any = None

    def stop(self) -> None:
        self._proc.terminate()
        try:
            self._proc.wait(timeout=10)
        except Exception:
            self._proc.kill()
        self._log.close()


def corpus_path() -> Path:
    """``DELTA_MIRROR_CORPUS``, else ``../shared/corpus`` beside the repository (may not exist)."""
    repo = Path(__file__).resolve().parents[2]
    default = repo.parent / "shared" / "corpus"
    return Path(os.environ.get("DELTA_MIRROR_CORPUS") or default).resolve()
