"""Harness pieces shared by the chaos scenarios: the proxy process, CLI runs, a writer, recovery.

Publishers are real ``delta-mirror`` processes (``python -m delta_mirror.cli``), driven like a
scheduler would: a run that fails with a transient error (exit 5) is simply run again.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chaos_invariants import StoreReader, Verdict, check_table, log_reader
from support.builders import ID_SCHEMA, add_body
from support.services import _wait_port, free_port

from delta_mirror.delta.actions import Action
from delta_mirror.dev.datafiles import create_table_actions
from delta_mirror.errors import MirrorError
from delta_mirror.store import SqlStore

LEASE_TTL = 1.0  # seconds a killed publisher blocks its table (DELTA_MIRROR_LEASE_TTL)
CLIENT_TIMEOUT = "1s"  # the S3 client's request timeout (DELTA_MIRROR_STORAGE_TIMEOUT)
BREAKER_COOLDOWN = 0.5


class ProxyProcess:
    """``chaos_proxy.py`` in its own process, in front of the S3 server."""

    def __init__(self, upstream: str, seed: int) -> None:
        self.port = free_port()
        self._proc = subprocess.Popen(
            [
                sys.executable,
                str(Path(__file__).with_name("chaos_proxy.py")),
                "--upstream",
                upstream,
                "--port",
                str(self.port),
                "--seed",
                str(seed),
            ],
            start_new_session=True,
        )
        _wait_port(self.port)
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def _call(self, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        req = urllib.request.Request(
            f"{self.endpoint}/__chaos__/{path}",
            data=json.dumps(body).encode() if body is not None else None,
            method="POST" if body is not None else "GET",
        )
        with self._opener.open(req, timeout=10) as resp:
            result: dict[str, Any] = json.loads(resp.read())
            return result

    def configure(self, **cfg: Any) -> dict[str, Any]:
        return self._call("config", cfg)

    def stats(self) -> dict[str, Any]:
        return self._call("stats")

    def reset(self) -> dict[str, Any]:
        return self._call("reset")

    def stop(self) -> None:
        self._proc.terminate()
        self._proc.wait(timeout=10)


def cli_env(store_url: str, s3_endpoint: str | None = None, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "DELTA_MIRROR_"))}
    env.update(
        DELTA_MIRROR_STORE=store_url,
        DELTA_MIRROR_LEASE_TTL=str(LEASE_TTL),
        DELTA_MIRROR_STORAGE_TIMEOUT=CLIENT_TIMEOUT,
        DELTA_MIRROR_BREAKER_COOLDOWN=str(BREAKER_COOLDOWN),
        NO_PROXY="127.0.0.1,localhost",
        no_proxy="127.0.0.1,localhost",
    )
    if s3_endpoint:
        env.update(
            AWS_ENDPOINT_URL=s3_endpoint,
            AWS_ACCESS_KEY_ID="testing",
            AWS_SECRET_ACCESS_KEY="testing",
            AWS_REGION="us-east-1",
            AWS_ALLOW_HTTP="true",
        )
    env.update(extra)
    return env


CLI = [sys.executable, "-m", "delta_mirror.cli"]


def cli(env: dict[str, str], *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], env=env, capture_output=True, text=True, timeout=timeout)


def spawn(env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([*CLI, *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def kill_after(proc: subprocess.Popen[str], delay: float) -> bool:
    """SIGKILL ``proc`` after ``delay`` seconds unless it finished; True when it was killed."""
    try:
        proc.wait(timeout=delay)
        return False
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        return True


# --------------------------------------------------------------------------------------------------
# tables and commits


def add_action(i: int) -> Action:
    """A unique ``add`` (the log only: readers and validate never open data files)."""
    stats = {"numRecords": 1, "minValues": {"id": i}, "maxValues": {"id": i}, "nullCount": {"id": 0}}
    path = f"part-{uuid.uuid4()}-c000.snappy.parquet"
    body = add_body(path, size=400 + i, modificationTime=int(time.time() * 1000), stats=json.dumps(stats))
    return ("add", body)


def create_table(store: SqlStore, name: str, location: str, *, interval: int, part_size: int | None) -> None:
    store.create_table(
        name,
        location,
        checkpoint_kind="multipart" if part_size else "classic",
        checkpoint_part_size=part_size,
    )
    store.update_table(store.get_table(name).id, checkpoint_interval=interval)
    store.commit(name, [*create_table_actions(ID_SCHEMA)])


class Writer(threading.Thread):
    """Commits ``versions`` new versions to each table through the store (retrying transient errors)."""

    def __init__(self, store_url: str, tables: list[str], versions: int, pace: float = 0.0) -> None:
        super().__init__(daemon=True)
        self.store = SqlStore(store_url)
        self.tables, self.versions, self.pace = tables, versions, pace
        self.errors = 0

    def run(self) -> None:
        i = 0
        while i < self.versions:  # lower ``versions`` to stop early
            i += 1
            for name in self.tables:
                while True:
                    try:
                        self.store.commit(name, [add_action(i)])
                        break
                    except MirrorError:
                        self.errors += 1  # the store restarting: commit again (a new version)
                        time.sleep(0.2)
            if self.pace:
                time.sleep(self.pace)
        self.store.close()


class Scheduler(threading.Thread):
    """Runs ``mirror`` for each table in turn until stopped, like a scheduler with retries."""

    def __init__(
        self,
        env: dict[str, str],
        tables: list[str],
        stop: threading.Event,
        launch: Callable[[dict[str, str], str], int] | None = None,
    ) -> None:
        super().__init__(daemon=True)
        self.env, self.tables, self.stop_event = env, tables, stop
        self.launch = launch or (lambda env, name: cli(env, "mirror", name).returncode)
        self.exits: dict[int, int] = {}
        self.busy_seconds = 0.0

    def run(self) -> None:
        while not self.stop_event.is_set():
            for name in self.tables:
                started = time.monotonic()
                rc = self.launch(self.env, name)
                self.busy_seconds += time.monotonic() - started
                self.exits[rc] = self.exits.get(rc, 0) + 1
                if rc not in (0, -9):
                    time.sleep(0.05)


class CheckpointWatch(threading.Thread):
    """Samples each table's ``_last_checkpoint`` and records any move backwards."""

    def __init__(self, locations: dict[str, str], s3_client: Any = None) -> None:
        super().__init__(daemon=True)
        self.logs = {n: log_reader(loc, s3_client) for n, loc in locations.items()}
        self.stop_event = threading.Event()
        self.seen: dict[str, int] = {}
        self.violations: list[str] = []

    def sample(self) -> None:
        for name, log in self.logs.items():
            try:
                raw = log.read("_last_checkpoint")
                version = int(json.loads(raw)["version"]) if raw else None
            except Exception:
                continue
            if version is None:
                continue
            moved = f"{name}: _last_checkpoint moved back from {self.seen.get(name)} to {version}"
            if version < self.seen.get(name, -1) and moved not in self.violations:
                self.violations.append(moved)
            self.seen[name] = max(version, self.seen.get(name, -1))

    def run(self) -> None:
        while not self.stop_event.wait(0.05):
            self.sample()

    def finish(self) -> list[str]:
        self.stop_event.set()
        self.join()
        self.sample()
        return self.violations


# --------------------------------------------------------------------------------------------------
# recovery and the final verdict


@dataclass
class Recovery:
    cycles: int
    seconds: float
    verdicts: dict[str, Verdict] = field(default_factory=dict)

    @property
    def recovered(self) -> bool:
        return all(v.recovered for v in self.verdicts.values())


def check_all(
    store_url: str,
    locations: dict[str, str],
    env: dict[str, str],
    s3_client: Any = None,
    foreign: dict[str, dict[str, bytes]] | None = None,
) -> dict[str, Verdict]:
    status = cli(env, "status", "--json")
    rows = {r["table"]: r for r in json.loads(status.stdout)} if status.returncode == 0 else {}
    reader = StoreReader(store_url)
    try:
        return {
            name: check_table(
                reader,
                name,
                log_reader(loc, s3_client),
                foreign=(foreign or {}).get(name),
                status_json=rows.get(name),
            )
            for name, loc in locations.items()
        }
    finally:
        reader.close()


def recover(
    store_url: str,
    locations: dict[str, str],
    env: dict[str, str],
    s3_client: Any = None,
    *,
    max_cycles: int = 5,
    interval: float = LEASE_TTL + BREAKER_COOLDOWN,
) -> Recovery:
    """After the faults stop: reconcile cycles (``delta-mirror reconcile --strategy smart``) until
    every invariant holds and status shows nothing pending, failed or halted.

    Cycles are ``interval`` apart (a scheduler's cadence): a killed publisher's lease expires by then.
    ``seconds`` counts the reconcile runs and the waits between them, not the checking.
    """
    spent = 0.0  # the system's time: cycles and the waits between them, not the checker's own time
    for cycle in range(1, max_cycles + 1):
        started = time.monotonic()
        if cycle > 1:
            time.sleep(interval)
        cli(env, "reconcile", "--strategy", "smart")
        spent += time.monotonic() - started
        verdicts = check_all(store_url, locations, env, s3_client)
        if all(v.recovered for v in verdicts.values()):
            return Recovery(cycle, round(spent, 2), verdicts)
    return Recovery(max_cycles + 1, round(spent, 2), verdicts)


def validate_all(
    store_url: str, names: list[str], s3_env: dict[str, str] | None = None
) -> dict[str, list[str]]:
    """The product's own ``validate`` (deltalake + listing) per table: the problems it reports."""
    from delta_mirror.jobs.validate import validate_table

    saved = {k: os.environ.get(k) for k in (s3_env or {})}
    os.environ.update(s3_env or {})
    store = SqlStore(store_url)
    try:
        return {n: [f"[{p.kind}] {p.message}" for p in validate_table(store, n).problems] for n in names}
    finally:
        store.close()
        for k, old in saved.items():
            if old is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = old


def pick(rng: random.Random, weights: dict[str, float]) -> str:
    return rng.choices(list(weights), list(weights.values()))[0]


__all__ = [
    "CheckpointWatch",
    "ProxyProcess",
    "Recovery",
    "Scheduler",
    "Writer",
    "check_all",
    "cli",
    "cli_env",
    "create_table",
    "kill_after",
    "recover",
    "spawn",
    "validate_all",
]
