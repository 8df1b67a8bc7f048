"""A PostgreSQL primary and a streaming standby as plain processes, for the failover tests.

``PgPair.start(synchronous=True)`` runs ``initdb`` (superuser ``postgres`` by password, scram, from
127.0.0.1 only), starts the primary on a free port of 127.0.0.1, clones it with ``pg_basebackup -R``
(a replication slot of its own) and starts the standby on a second free port; it returns once the
standby streams (and, in the synchronous mode, is the synchronous one). ``url`` is the multi-host
SQLAlchemy URL a store is given::

    postgresql+psycopg://dm:PW@/dm_store?host=127.0.0.1:P1&host=127.0.0.1:P2&target_session_attrs=read-write

The synchronous mode is ``synchronous_standby_names='*'`` and ``synchronous_commit=on``, set on the
primary (``ALTER SYSTEM``) once the standby is cloned: the standby, once promoted, commits alone (what
Patroni does outside ``synchronous_mode_strict``) instead of waiting for a standby that never comes.

``stall_replication()`` stops the primary's WAL senders (the link to the standby lagging or cut).
``kill_primary()`` is the machine lost: SIGKILL of the postmaster and of every child, by PID.
``promote()`` is ``pg_ctl promote`` of the standby, returning once it takes writes. The old primary
is fenced: it is never started again. ``stop()`` kills what is left by PID and removes the folder
(also at exit). Like services.py, fsync and full_page_writes stay off (they only matter on an OS crash,
which is not what is tested: a killed process's writes are in the page cache).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

import psycopg

from support.services import (
    ServiceUnavailable,
    _ensure_postgres_user,
    find_pg_bindir,
    free_port,
    refuse_unmarked,
)
from support.waiting import wait_until

#: The options both servers run with.
NODE_OPTIONS = (
    "-c listen_addresses=127.0.0.1 -c fsync=off -c full_page_writes=off -c max_connections=200 "
    "-c wal_level=replica -c max_wal_senders=10 -c max_replication_slots=10 -c hot_standby=on "
    "-c wal_sender_timeout=5s -c wal_receiver_status_interval=1s"
)
APP_ROLE = "dm"
APP_DB = "dm_store"


@dataclass
class PgNode:
    """One server of the pair: its port, data folder and log."""

    name: str
    port: int
    datadir: Path
    logfile: Path

    def postmaster_pid(self) -> int | None:
        """The postmaster's PID from ``postmaster.pid`` (None when the server is not there)."""
        try:
            first = (self.datadir / "postmaster.pid").read_text().splitlines()[0]
        except (OSError, IndexError):
            return None
        pid = int(first)
        return pid if Path(f"/proc/{pid}").exists() else None

    def log_tail(self, n: int = 30) -> str:
        try:
            return "\n".join(self.logfile.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""


def _children(pid: int) -> list[int]:
    """Every descendant of ``pid`` (from /proc), deepest last."""
    found: list[int] = []
    todo = [pid]
    while todo:
        parent = todo.pop()
        try:
            kids = Path(f"/proc/{parent}/task/{parent}/children").read_text().split()
        except OSError:
            continue
        for kid in map(int, kids):
            found.append(kid)
            todo.append(kid)
    return found


@dataclass
class PgPair:
    """A primary and a streaming standby on 127.0.0.1 (see the module's docstring)."""

    tmpdir: Path
    bindir: Path
    synchronous: bool
    password: str
    primary: PgNode
    standby: PgNode
    run_as: tuple[str, ...] = ()
    promoted: bool = False
    killed: list[str] = field(default_factory=list)

    # -- life cycle --------------------------------------------------------------------------------

    @classmethod
    @contextlib.contextmanager
    def running(cls, synchronous: bool = True) -> Iterator[PgPair]:
        """A started pair, stopped when the block ends (a fixture's whole body)."""
        pair = cls.start(synchronous=synchronous)
        try:
            yield pair
        finally:
            pair.stop()

    @classmethod
    def start(cls, synchronous: bool = True) -> PgPair:
        refuse_unmarked("a PostgreSQL primary and standby")
        bindir = find_pg_bindir()
        if bindir is None:
            raise ServiceUnavailable("PostgreSQL binaries (initdb, pg_ctl, pg_basebackup) not found")
        tmpdir = Path(tempfile.mkdtemp(prefix="dm-pgpair-"))
        run_as: tuple[str, ...] = ()
        if os.geteuid() == 0:  # postgres refuses to run as root
            user = _ensure_postgres_user()
            os.chown(tmpdir, user.pw_uid, user.pw_gid)
            run_as = ("runuser", "-u", "postgres", "--")
        tmpdir.chmod(0o700)
        pair = cls(
            tmpdir=tmpdir,
            bindir=bindir,
            synchronous=synchronous,
            password=secrets.token_hex(16),
            primary=PgNode("primary", 0, tmpdir / "primary", tmpdir / "primary.log"),
            standby=PgNode("standby", 0, tmpdir / "standby", tmpdir / "standby.log"),
            run_as=run_as,
        )
        try:
            pair._init_primary()
            pair._clone_standby()
        except BaseException:
            pair.stop()
            raise
        atexit.register(pair.stop)
        return pair

    def _run(self, tool: str, *args: str, password: bool = False) -> str:
        argv = [*self.run_as, str(self.bindir / tool), *args]
        env = {**os.environ, "LC_ALL": "C", "LANG": "C"}
        env.pop("PGDATA", None)
        if password:  # by the environment, never on a command line
            env["PGPASSWORD"] = self.password
        proc = subprocess.run(argv, cwd=self.tmpdir, env=env, capture_output=True, text=True, timeout=180)
        if proc.returncode != 0:
            raise ServiceUnavailable(f"{tool} failed ({proc.returncode}): {proc.stderr.strip()[-1500:]}")
        return proc.stdout

    def _start_node(self, node: PgNode) -> None:
        for _attempt in range(5):
            node.port = free_port()
            opts = f"-p {node.port} -k {self.tmpdir} {NODE_OPTIONS}"
            try:
                self._run("pg_ctl", "-D", str(node.datadir), "-l", str(node.logfile), "-o", opts, "-w",
                          "-t", "120", "start")  # fmt: skip
                return
            except ServiceUnavailable:
                tail = node.log_tail()
                if "could not bind" not in tail and "in use" not in tail:
                    raise ServiceUnavailable(f"{node.name} did not start:\n{tail}") from None
        raise ServiceUnavailable(f"{node.name}: no free port after 5 tries:\n{node.log_tail()}")

    def _init_primary(self) -> None:
        pwfile = self.tmpdir / ".pwfile"
        pwfile.write_text(self.password + "\n")
        if self.run_as:
            user = _ensure_postgres_user()
            os.chown(pwfile, user.pw_uid, user.pw_gid)
        pwfile.chmod(0o600)
        try:
            self._run("initdb", "-D", str(self.primary.datadir), "-U", "postgres", f"--pwfile={pwfile}",
                      "--auth-local=scram-sha-256", "--auth-host=scram-sha-256", "-E", "UTF8",
                      "--locale=C", "--no-sync")  # fmt: skip
        finally:
            pwfile.unlink(missing_ok=True)
        self._start_node(self.primary)
        with self._admin(self.primary) as conn:
            conn.execute(f"CREATE ROLE {APP_ROLE} LOGIN PASSWORD '{self.password}'")
            conn.execute(f"CREATE DATABASE {APP_DB} OWNER {APP_ROLE}")

    def _clone_standby(self) -> None:
        self._run("pg_basebackup", "-h", "127.0.0.1", "-p", str(self.primary.port), "-U", "postgres",
                  "-D", str(self.standby.datadir), "-R", "-C", "-S", "standby", "-X", "stream",
                  "--no-sync", "-c", "fast", password=True)  # fmt: skip
        self._start_node(self.standby)
        want = "sync" if self.synchronous else "async"
        if self.synchronous:  # the primary's own settings: the standby's copy was taken before
            with self._admin(self.primary) as conn:
                conn.execute("ALTER SYSTEM SET synchronous_standby_names = '*'")
                conn.execute("ALTER SYSTEM SET synchronous_commit = 'on'")
                conn.execute("SELECT pg_reload_conf()")

        def streaming() -> bool:
            with self._admin(self.primary) as conn:
                row = conn.execute(
                    "SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming' AND sync_state = %s",
                    (want,),
                ).fetchone()
            return bool(row and int(str(row[0])) >= 1)

        wait_until(streaming, 30, f"the standby streaming ({want})")

    def _admin(self, node: PgNode, dbname: str = "postgres") -> psycopg.Connection[tuple[object, ...]]:
        return psycopg.connect(
            host="127.0.0.1", port=node.port, user="postgres", password=self.password, dbname=dbname,
            autocommit=True, connect_timeout=5,
        )  # fmt: skip

    # -- URLs --------------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        """The multi-host SQLAlchemy URL: both nodes, the one that takes writes chosen by libpq."""
        hosts = f"host=127.0.0.1:{self.primary.port}&host=127.0.0.1:{self.standby.port}"
        return (
            f"postgresql+psycopg://{APP_ROLE}:{quote(self.password, safe='')}@/{APP_DB}"
            f"?{hosts}&target_session_attrs=read-write&connect_timeout=3"
        )

    def node_url(self, node: PgNode) -> str:
        """The one-host URL of ``node`` (for reading the standby or the survivor directly)."""
        return (
            f"postgresql+psycopg://{APP_ROLE}:{quote(self.password, safe='')}@127.0.0.1:{node.port}/{APP_DB}"
        )

    # -- faults ------------------------------------------------------------------------------------

    def kill_primary(self) -> float:
        """SIGKILL the primary's postmaster and every child at once (the machine lost); the time of
        the kill (``time.monotonic()``). It is never started again (fenced)."""
        pid = self.primary.postmaster_pid()
        if pid is None:
            raise RuntimeError(f"the primary is not running:\n{self.primary.log_tail()}")
        victims = [pid, *_children(pid)]
        at = time.monotonic()
        for victim in victims:
            with contextlib.suppress(ProcessLookupError):
                os.kill(victim, signal.SIGKILL)
        self.killed.append("primary")
        wait_until(lambda: all(not _alive(v) for v in victims), 10, "the primary's processes to exit")
        return at

    def stall_replication(self) -> int:
        """SIGSTOP the primary's WAL senders: the standby receives nothing more (a replication link
        lagging or cut, as over a real network) while the primary runs on; ``kill_primary`` ends
        them. The number of senders stopped."""
        pid = self.primary.postmaster_pid()
        if pid is None:
            raise RuntimeError("the primary is not running")
        senders = [p for p in _children(pid) if "walsender" in _cmdline(p)]
        for sender in senders:
            with contextlib.suppress(ProcessLookupError):
                os.kill(sender, signal.SIGSTOP)
        return len(senders)

    def promote(self) -> float:
        """``pg_ctl promote`` of the standby; returns once it takes writes (the seconds it took)."""
        started = time.monotonic()
        self._run("pg_ctl", "-D", str(self.standby.datadir), "-w", "-t", "120", "promote")

        def writable() -> bool:
            try:
                with self._admin(self.standby) as conn:
                    row = conn.execute("SELECT pg_is_in_recovery()").fetchone()
                    return row is not None and row[0] is False
            except psycopg.OperationalError:
                return False

        wait_until(writable, 30, "the promoted standby to take writes")
        self.promoted = True
        return time.monotonic() - started

    def replication_state(self) -> list[tuple[str, str]]:
        """(state, sync_state) of every standby the primary serves now."""
        with self._admin(self.primary) as conn:
            rows = conn.execute("SELECT state, sync_state FROM pg_stat_replication").fetchall()
        return [(str(a), str(b)) for a, b in rows]

    def stop(self) -> None:
        """Kill both servers by PID (their data is thrown away) and remove the folder."""
        for node in (self.primary, self.standby):
            pid = node.postmaster_pid()
            if pid is None:
                continue
            for victim in [pid, *_children(pid)]:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(victim, signal.SIGKILL)
            with contextlib.suppress(AssertionError):
                wait_until(lambda p=pid: not _alive(p), 10, f"{node.name} to exit")  # type: ignore[misc]
        shutil.rmtree(self.tmpdir, ignore_errors=True)


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


__all__ = ["PgNode", "PgPair"]
