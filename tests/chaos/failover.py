"""The store's PostgreSQL primary lost under load (issue 40): ``make chaos-failover``.

A primary and a streaming standby (``support/pg_pair.py``), two ``delta-mirror serve`` replicas on the
multi-host store URL (``target_session_attrs=read-write``), one writer thread per table committing
over HTTP as the LogStore does (half of them also write ``<v>.json`` after the 201, as the LogStore
does; the other half leave publishing to the publishers), and two publisher processes: the first
half of the tables published in a loop by the path of ``delta-mirror mirror``, the rest by the
event-table trigger path (a ``CommitWatcher`` with its ``LISTEN`` on the multi-host URL and
``publish_from_watcher``, as the Airflow trigger runs them). Mid-load the link to the standby stalls for ``stall`` seconds (the primary's WAL
senders SIGSTOPped: the lag a real network has at the worst moment), then the primary is SIGKILLed
(postmaster and children), the standby promoted after ``promote_after`` seconds (what a failover
manager takes), the old primary never started again. In the full run a Delta-Spark job
(``failover_spark.py``: its own process and JVM, the LogStore jar, ``DELTA_MIRROR_COMMIT_URL``
listing both replicas) appends to two tables of its own throughout, from before the kill to after.

Every answer 200/201 is recorded by the writers (version, sha256). Measured and checked after the
load: acknowledged commits missing from the store or stored with other bytes (``lost``), versions
not contiguous or published files whose bytes differ from the store's (``duplicated``,
``other_bytes``), published files beyond the store's latest (``missing_from_store``, after the
recovery), the time from the kill to the first commit answered again and until every acknowledged
version that is still the store's is published. In asynchronous mode ``delta-mirror recover --all``
runs whenever a writer is refused ``store_behind`` (its LogStore wrote a version the new primary
never had) and once at the end.

Run as ``make chaos-failover`` (both modes, JSON in bench-results/chaos-failover.json) or
``PYTHONPATH=tests:tests/chaos .venv/bin/python tests/chaos/failover.py --mode sync --seconds 5``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from failover_spark import SparkJob
from failover_spark import clean as spark_clean
from support.builders import action, add_body, log_line
from support.commit_service import FIRST_COMMIT, TOKEN_ENV, CommitService, cli_path
from support.pg_pair import PgPair
from support.reports import write_report
from support.waiting import load_scaled, wait_until

from delta_mirror.jobs.publisher import Publisher
from delta_mirror.jobs.watch_publish import publish_from_watcher
from delta_mirror.store import SqlStore
from delta_mirror.store.watch import CommitWatcher

HERE = Path(__file__).resolve().parent


@dataclass
class Load:
    tables: int = 8
    before_kill: float = 10.0  # seconds of load before the kill
    after_kill: float = 15.0  # seconds of load after it
    promote_after: float = 0.5  # the failover manager's reaction time
    stall: float = 0.3  # the replication link stalled this long before the kill (WAL senders stopped)
    spark: int = 0  # tables appended to by a Delta-Spark job through the replicas (failover_spark.py)


FULL = Load(spark=2)
REDUCED = Load(tables=4, before_kill=3.0, after_kill=5.0)


@dataclass
class FailoverResult:
    mode: str
    tables: int
    acknowledged: int = 0
    lost: int = 0
    lost_versions: list[str] = field(default_factory=list)
    lost_on_logstore_tables: int = 0  # of ``lost``: tables whose writer wrote <v>.json after the 201
    duplicated: int = 0
    other_bytes: int = 0
    missing_from_store: int = 0
    store_behind_refusals: int = 0
    recover_runs: int = 0
    publishers: list[dict[str, Any]] = field(default_factory=list)  # the loop's, the watcher's
    recover_failures: list[str] = field(default_factory=list)
    stuck_writers: list[str] = field(default_factory=list)
    answers: dict[str, int] = field(default_factory=dict)
    kill_to_first_commit_s: float | None = None
    kill_to_every_writer_committing_s: float | None = None
    kill_to_all_published_s: float | None = None
    writers_stopped_to_all_published_s: float | None = None
    promote_s: float = 0.0
    commits_after_kill: int = 0
    writers_resumed: int = 0
    seconds: float = 0.0
    load_avg: list[float] = field(default_factory=list)
    spark: dict[str, Any] = field(default_factory=dict)  # the Spark job's tables (failover_spark.check)
    spark_start_s: float | None = None  # the job's start until its first commits (JVM, packages)

    def clean(self) -> bool:
        """0 duplicated, 0 other bytes, 0 missing from the store in every mode; 0 lost if synchronous
        (asynchronous: only commits never published, none whose <v>.json readers saw); every writer
        committing again after the kill."""
        lossless = self.lost == 0 or (self.mode == "async" and self.lost_on_logstore_tables == 0)
        return (
            lossless
            and (self.duplicated, self.other_bytes, self.missing_from_store) == (0, 0, 0)
            and self.writers_resumed == self.tables
            and (not self.spark or spark_clean(self.spark))
        )


class Replica(CommitService):
    """``delta-mirror serve`` given its store by ``DELTA_MIRROR_STORE`` (the password stays off ps)."""

    def start(self, ready: int = 200) -> Replica:
        args = [cli_path(), "serve", "--host", "127.0.0.1", "--port", str(self.port)]
        for root in self.allow_roots:
            args += ["--allow-root", root]
        env = {**os.environ, TOKEN_ENV: self.token, "DELTA_MIRROR_STORE": self.store_url}
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT)
        wait_until(
            lambda: _health(self) == ready, 60, f"serve on port {self.port}", alive=lambda: self._exited()
        )
        return self

    def _exited(self) -> str | None:
        assert self.proc is not None
        return None if self.proc.poll() is None else f"exit {self.proc.returncode}: {self.log()[-2000:]}"


def _health(svc: CommitService) -> int:
    try:
        return svc.request("GET", "/health", token=None).status
    except OSError:
        return 0


def cli(store_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DELTA_MIRROR_STORE": store_url}
    return subprocess.run([cli_path(), *args], env=env, capture_output=True, text=True, timeout=300)


def commit_body(table: int, version: int) -> bytes:
    """A commit of its own (a fresh file name each time: a re-sent commit after a gap differs)."""
    info = log_line(action("commitInfo", {"timestamp": 1700000000000, "operation": "WRITE"}))
    add = log_line(action("add", add_body(f"t{table}-v{version}-{uuid.uuid4().hex}.parquet", size=10)))
    return f"{info}\n{add}\n".encode()


class Writer(threading.Thread):
    """One table's writer: posts the next version, retries the same bytes on 503 or a dropped
    connection (on the other replica), re-reads the latest version after a gap or a taken version."""

    def __init__(self, run: Run, table: int) -> None:
        super().__init__(daemon=True, name=f"writer-{table}")
        self.run_, self.table = run, table
        self.root = f"file:{run.lake}/t{table}"
        self.logstore = table % 2 == 0  # writes <v>.json itself after the 201, as the LogStore does
        self.acked: list[tuple[int, str]] = []  # every 200/201, a version answered twice included
        self.answers: dict[str, int] = {}
        self.first_after_kill: float | None = None
        self.after_kill = 0
        self.last = ""
        self.store_behind = 0

    def run(self) -> None:
        replicas, turn = self.run_.replicas, self.table % 2
        version, body = 1, commit_body(self.table, 1)
        while not self.run_.writers_stop.is_set():
            try:
                answer = replicas[turn].post(self.root, version, body)
            except OSError:
                self._count("dropped")
                turn = 1 - turn
                time.sleep(0.05)
                continue
            code = answer.json().get("code", "") if answer.status >= 400 else ""
            self.last = f"v{version}: {answer.status} {answer.body[:300]!r}"
            self._count(f"{answer.status} {code}".strip())
            if answer.status in (200, 201):
                self._acknowledged(version, body)
                version, body = version + 1, commit_body(self.table, version + 1)
            elif answer.status == 503:
                turn = 1 - turn
                time.sleep(min(float(answer.headers.get("retry-after", "1")), 0.2))
            elif code == "store_behind":  # as a Spark writer's transaction fails: read the table again
                self.store_behind += 1
                self.run_.behind.set()
                time.sleep(0.2)
                version = self._latest(replicas[turn]) + 1
                body = commit_body(self.table, version)
            else:  # a gap or a taken version: the store says where the table is
                version = self._latest(replicas[turn]) + 1
                body = commit_body(self.table, version)

    def _acknowledged(self, version: int, body: bytes) -> None:
        self.acked.append((version, hashlib.sha256(body).hexdigest()))
        now = time.monotonic()
        if self.run_.killed_at is not None and now > self.run_.killed_at:
            self.after_kill += 1
            self.first_after_kill = self.first_after_kill or now
        if self.logstore:  # the LogStore writes the file after the 201, never over another one
            path = self.run_.lake / f"t{self.table}" / "_delta_log" / f"{version:020d}.json"
            path.parent.mkdir(parents=True, exist_ok=True)
            try:
                with path.open("xb") as f:
                    f.write(body)
            except FileExistsError:
                self._count("logstore file exists")

    def _latest(self, svc: CommitService) -> int:
        while True:
            try:
                answer = svc.latest(self.root)
                if answer.status == 200:
                    return int(answer.json()["version"])
            except OSError:
                pass
            time.sleep(0.1)

    def _count(self, what: str) -> None:
        self.answers[what] = self.answers.get(what, 0) + 1


class Run:
    """One failover run: the pair, the replicas, the writers, the publisher."""

    def __init__(self, mode: str, load: Load, workdir: Path) -> None:
        self.mode, self.load = mode, load
        self.lake = workdir / "lake"
        self.lake.mkdir(parents=True)
        self.workdir = workdir
        self.stop_file = workdir / "stop-publishing"
        self.publishers: list[subprocess.Popen[str]] = []
        self.writers_stop = threading.Event()
        self.behind = threading.Event()
        self.killed_at: float | None = None
        self.writers_stopped_at = 0.0
        self.replicas: list[CommitService] = []
        self.pair: PgPair | None = None
        self.recover_runs = 0
        self.recover_failures: list[str] = []
        self.spark: SparkJob | None = None

    def execute(self) -> FailoverResult:
        started = time.monotonic()
        result = FailoverResult(self.mode, self.load.tables)
        self.pair = PgPair.start(synchronous=self.mode == "sync")
        try:
            self._serve()
            if self.load.spark:  # its JVM up and committing before the load and the kill
                self.spark = SparkJob(self.workdir, self.lake, self.replicas, self.load.spark).start()
                result.spark_start_s = self.spark.wait_committing()
            writers = [Writer(self, i) for i in range(self.load.tables)]
            self.publishers = self._start_publishers()
            for t in writers:
                t.start()
            time.sleep(self.load.before_kill)
            if self.load.stall > 0:  # the link to the standby lags before the primary is lost
                self.pair.stall_replication()
                time.sleep(self.load.stall)
            self.killed_at = self.pair.kill_primary()
            time.sleep(self.load.promote_after)
            result.promote_s = round(self.pair.promote(), 3)
            self._after_kill(self.load.after_kill)
            self.writers_stop.set()
            for t in writers:
                t.join(load_scaled(60))
            if self.spark is not None:
                self.spark.stop()
            self.writers_stopped_at = time.monotonic()
            self._finish(result, writers)
        finally:
            self.writers_stop.set()
            self.stop_file.touch()
            if self.spark is not None:
                self.spark.kill()
            for proc in self.publishers:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait(30)
            for svc in self.replicas:
                svc.stop()
            self.pair.stop()
        result.seconds = round(time.monotonic() - started, 1)
        result.load_avg = [round(x, 1) for x in os.getloadavg()]
        return result

    def _serve(self) -> None:
        assert self.pair is not None
        out = cli(self.pair.url, "init")
        if out.returncode != 0:
            raise RuntimeError(f"init failed: {out.stderr[-2000:]}")
        first = Replica(self.pair.url, [f"file:{self.lake}/"], log_path=self.workdir / "serve-1.log")
        second = Replica(self.pair.url, [f"file:{self.lake}/"], log_path=self.workdir / "serve-2.log")
        second.token = first.token
        self.replicas = [first.start(), second.start()]
        for table in range(self.load.tables):
            answer = first.post(f"file:{self.lake}/t{table}", 0, FIRST_COMMIT)
            if answer.status != 201:
                raise RuntimeError(f"version 0 of t{table}: {answer.status} {answer.body!r}")

    def _after_kill(self, seconds: float) -> None:
        """The load goes on; in asynchronous mode a store-behind refusal runs the recovery."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if self.spark is not None and self.spark.behind_refused():
                self.behind.set()
            if self.behind.wait(0.2):
                self.behind.clear()
                self._recover()

    def _recover(self) -> None:
        assert self.pair is not None
        out = cli(self.pair.url, "recover", "--all")
        self.recover_runs += 1
        if out.returncode != 0 or os.environ.get("FAILOVER_DEBUG"):
            self.recover_failures.append(f"exit {out.returncode}: {(out.stdout + out.stderr).strip()[-600:]}")

    def _start_publishers(self) -> list[subprocess.Popen[str]]:
        """Two publisher processes: the first half of the tables by ``publish_loop`` (the path of
        ``delta-mirror mirror``), the rest by ``watch_loop`` (the event-table trigger path)."""
        assert self.pair is not None
        env = {**os.environ, "DELTA_MIRROR_STORE": self.pair.url, "PYTHONPATH": os.pathsep.join(sys.path)}
        half = self.load.tables // 2
        procs = []
        for kind, names in (("loop", range(half)), ("watch", range(half, self.load.tables))):
            argv = [sys.executable, __file__, "--publish-loop", kind, str(self.stop_file)]
            argv += [f"t{i}" for i in names]
            procs.append(
                subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            )
        # the kill must find the watcher LISTENing (a loaded machine may start it seconds late)
        watcher = procs[-1]
        wait_until(
            listening_file(self.stop_file).exists,
            30,
            "the watcher process's first LISTEN",
            alive=lambda: None if watcher.poll() is None else f"it exited {watcher.returncode}",
        )
        return procs

    # -- the checks --------------------------------------------------------------------------------

    def _finish(self, result: FailoverResult, writers: list[Writer]) -> None:
        assert self.pair is not None and self.killed_at is not None
        if self.mode == "async":
            self._recover()
        result.recover_runs = self.recover_runs
        for w in writers:
            for k, n in w.answers.items():
                result.answers[k] = result.answers.get(k, 0) + n
            result.acknowledged += len(w.acked)
            result.store_behind_refusals += w.store_behind
            result.commits_after_kill += w.after_kill
        firsts = [w.first_after_kill for w in writers if w.first_after_kill is not None]
        result.writers_resumed = len(firsts)
        result.stuck_writers = [f"t{w.table} {w.last}" for w in writers if w.first_after_kill is None]
        if firsts:
            result.kill_to_first_commit_s = round(min(firsts) - self.killed_at, 3)
            result.kill_to_every_writer_committing_s = round(max(firsts) - self.killed_at, 3)
        stored = {w.table: self._stored(w.root) for w in writers}
        result.kill_to_all_published_s = self._wait_published(stored)
        if result.kill_to_all_published_s is not None:
            since = self.killed_at + result.kill_to_all_published_s - self.writers_stopped_at
            result.writers_stopped_to_all_published_s = round(max(0.0, since), 2)
        for w in writers:
            self._compare(result, w, stored[w.table])
        if self.spark is not None:
            result.spark = self.spark.check(self._stored, self.killed_at)
        self.stop_file.touch()
        for proc in self.publishers:
            out, _ = proc.communicate(timeout=load_scaled(60))
            result.publishers.append(json.loads(out.strip().splitlines()[-1]) if out.strip() else {})
        result.recover_failures = self.recover_failures[-5:]

    def _stored(self, root: str) -> dict[int, str]:
        """Every version the store has of ``root``, with its sha256 (read through a replica)."""
        svc = self.replicas[0]
        latest = int(svc.latest(root).json()["version"])
        out: dict[int, str] = {}
        for v in range(latest + 1):
            answer = svc.get(root, v)
            if answer.status == 200:
                out[v] = hashlib.sha256(answer.body).hexdigest()
        return out

    def _wait_published(self, stored: dict[int, dict[int, str]]) -> float | None:
        """Seconds from the kill until every stored version is on storage (None: not within 120 s)."""

        def published() -> bool:
            for table, versions in stored.items():
                log = self.lake / f"t{table}" / "_delta_log"
                if any(not (log / f"{v:020d}.json").exists() for v in versions):
                    return False
            return True

        try:
            wait_until(published, 60, "every stored version published", interval=0.2)
        except AssertionError:
            return None
        assert self.killed_at is not None
        return round(time.monotonic() - self.killed_at, 2)

    def _compare(self, result: FailoverResult, w: Writer, stored: dict[int, str]) -> None:
        if sorted(stored) != list(range(len(stored))):
            result.duplicated += 1  # not contiguous: a version twice or a hole
        for v, sha in w.acked:
            if stored.get(v) != sha:
                result.lost += 1
                result.lost_on_logstore_tables += w.logstore
                result.lost_versions.append(f"t{w.table}@{v}")
        log = self.lake / f"t{w.table}" / "_delta_log"
        for path in sorted(log.glob("*.json")) if log.exists() else []:
            v = int(path.name.split(".")[0])
            sha = hashlib.sha256(path.read_bytes()).hexdigest()
            if v not in stored:
                result.missing_from_store += 1
            elif stored[v] != sha:
                result.other_bytes += 1


def publish_loop(names: list[str], stop_file: Path) -> dict[str, Any]:
    """The publish path (what ``delta-mirror mirror NAME`` runs) over ``names`` in turn until
    ``stop_file`` exists and a whole turn published nothing; a failure (the store gone mid-publish)
    is retried on the next turn."""
    store = SqlStore(os.environ["DELTA_MIRROR_STORE"])
    publisher = Publisher(store)
    cycles, errors = 0, dict[str, int]()
    try:
        while True:
            stopping, busy = stop_file.exists(), False
            for name in names:
                try:
                    busy |= bool(publisher.publish(name).published)
                except Exception as exc:  # the store or the table failing mid-failover
                    errors[type(exc).__name__] = errors.get(type(exc).__name__, 0) + 1
                    busy = True
                    time.sleep(0.1)
            cycles += 1
            if stopping and not busy:
                break
            if not busy:
                time.sleep(0.1)
    finally:
        store.close()
    return {"cycles": cycles, "errors": errors}


def listening_file(stop_file: Path) -> Path:
    """Made by the watcher process once its first ``LISTEN`` is up."""
    return stop_file.with_name(stop_file.name + ".listening")


def watch_loop(names: list[str], stop_file: Path) -> dict[str, Any]:
    """The event-table trigger path: a ``CommitWatcher`` (``LISTEN`` on the multi-host URL, polling
    every second besides) and ``publish_from_watcher`` for ``names`` on each of its reports, until
    ``stop_file`` exists and a report found nothing to publish."""
    url = os.environ["DELTA_MIRROR_STORE"]
    store = SqlStore(url)
    watcher = CommitWatcher(url, interval=1.0, names=lambda: names)
    actions: dict[str, int] = {}
    errors: list[str] = []

    async def follow() -> None:
        reports: asyncio.Queue[object] = asyncio.Queue()

        async def produce() -> None:
            async for report in watcher.reports():
                await reports.put(report)

        async def announce() -> None:  # the run waits for the first LISTEN before the load and the kill
            while not watcher.listening:
                await asyncio.sleep(0.05)
            listening_file(stop_file).touch()

        producer = asyncio.create_task(produce())
        announcer = asyncio.create_task(announce())
        try:
            while True:
                with contextlib.suppress(TimeoutError):  # no report: look at the stop file anyway
                    await asyncio.wait_for(reports.get(), 1.0)
                stopping, busy = stop_file.exists(), False
                for name in names:
                    out = await asyncio.to_thread(publish_from_watcher, store, name)
                    actions[out.action] = actions.get(out.action, 0) + 1
                    if out.error and len(errors) < 5 and f"{name}: {out.error}" not in errors:
                        errors.append(f"{name}: {out.error}"[:400])
                    busy |= (
                        bool(out.published) or out.action == "failed"
                    )  # a held lease: its holder publishes
                if stopping and not busy:
                    return
        finally:
            producer.cancel()
            announcer.cancel()
            await asyncio.wait([producer, announcer], timeout=10)

    try:
        asyncio.run(follow())
    finally:
        store.close()
    return {
        "watch_actions": actions,
        "errors": errors,
        "listens": watcher.listens,
        "notifications": watcher.notifications,
    }


def run_mode(mode: str, load: Load) -> FailoverResult:
    workdir = Path(tempfile.mkdtemp(prefix=f"dm-failover-{mode}-"))
    try:
        return Run(mode, load, workdir).execute()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def main() -> int:
    if sys.argv[1:2] == ["--publish-loop"]:  # a publisher process of a run: KIND STOP_FILE NAME...
        loop = watch_loop if sys.argv[2] == "watch" else publish_loop
        print(json.dumps(loop(sys.argv[4:], Path(sys.argv[3]))))
        return 0
    parser = argparse.ArgumentParser(description="the store's PostgreSQL primary lost under load")
    parser.add_argument("--mode", choices=["sync", "async", "both"], default="both")
    parser.add_argument("--tables", type=int, default=FULL.tables)
    parser.add_argument("--seconds", type=float, default=FULL.before_kill, help="load before the kill")
    parser.add_argument("--after", type=float, default=FULL.after_kill, help="load after the kill")
    parser.add_argument("--spark", type=int, default=FULL.spark, help="tables of the Spark job (0: none)")
    parser.add_argument("--stall", type=float, default=FULL.stall, help="replication stalled before the kill")
    parser.add_argument("--out", default=str(HERE.parents[1] / "bench-results" / "chaos-failover.json"))
    args = parser.parse_args()
    load = Load(args.tables, args.seconds, args.after, stall=args.stall, spark=args.spark)
    modes = ["sync", "async"] if args.mode == "both" else [args.mode]
    load_before = [round(x, 1) for x in os.getloadavg()]
    results = [run_mode(m, load) for m in modes]
    report: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "load": asdict(load),
        "load_avg_before": load_before,
        "cores": os.cpu_count(),
        "runs": [asdict(r) for r in results],
        "clean": all(r.clean() for r in results),
    }
    return write_report(Path(args.out), report, report["clean"])


if __name__ == "__main__":
    sys.exit(main())
