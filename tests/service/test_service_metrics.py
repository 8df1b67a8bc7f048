"""Specification of the commit service's ``GET /metrics`` (docs/commit-service.md, "Metrics").

A real ``delta-mirror serve`` (two worker processes) over a real store (SQLite, PostgreSQL) takes a
load of real commits — appends, retries, racing writers, refusals — while a scraper reads
``/metrics`` over and over; every scrape parses (prometheus_client's parser and a strict check of
the format 0.0.4), and at the end the counters equal what the writers were answered.
"""

from __future__ import annotations

import http.client
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine
from support.cli import assert_one_error_line
from support.commit_service import FIRST_COMMIT as V0
from support.commit_service import TOKEN_ENV, CommitService, commit_file
from support.commit_service import add_line as add
from support.commit_service import cli_path as cli
from support.race import race
from support.services import free_port
from support.waiting import load_scaled

from delta_mirror.service.metrics import BUCKETS, CONTENT_TYPE, OUTCOMES, Metrics, metric_names
from delta_mirror.store import SqlStore

P = "delta_mirror_service_"
WRITERS = 6
COMMITS_PER_WRITER = 12
SAMPLE = re.compile(
    r'(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>[a-zA-Z_][a-zA-Z0-9_]*="[^"\\\n]*"'
    r'(?:,[a-zA-Z_][a-zA-Z0-9_]*="[^"\\\n]*")*)\})? (?P<value>[-+]?(?:[0-9.]+(?:e[-+]?[0-9]+)?|Inf|NaN))'
)


# -- reading a scrape strictly ----------------------------------------------------------------------


def parse(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The samples of a text exposition 0.0.4, checked strictly: each line a HELP, a TYPE or a
    sample of a family typed before it; histogram buckets cumulative, +Inf equal to _count; and
    prometheus_client's own parser reads it too (when it is installed)."""
    assert text.endswith("\n")
    types: dict[str, str] = {}
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for line in text.splitlines():
        if line.startswith("# HELP "):
            assert re.fullmatch(r"# HELP [a-zA-Z_:][a-zA-Z0-9_:]* \S.*", line), line
        elif line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            assert kind in {"counter", "gauge", "histogram"} and name not in types, line
            types[name] = kind
        else:
            match = SAMPLE.fullmatch(line)
            assert match, line
            name = match["name"]
            family = next((f for f in types if name in (f, f"{f}_bucket", f"{f}_sum", f"{f}_count")), None)
            assert family is not None, f"{name}: no TYPE before it"
            labels = tuple(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="([^"]*)"', match["labels"] or ""))
            key = (name, labels)
            assert key not in samples, f"{line}: twice"
            samples[key] = float(match["value"])
    for family, kind in types.items():
        if kind == "histogram":
            buckets = [v for (n, _), v in samples.items() if n == f"{family}_bucket"]
            assert buckets == sorted(buckets) and buckets[-1] == samples[(f"{family}_count", ())]
            les = [dict(lb)["le"] for (n, lb) in samples if n == f"{family}_bucket"]
            assert les == [repr(b) for b in BUCKETS] + ["+Inf"]
    try:
        from prometheus_client.parser import text_string_to_metric_families
    except ImportError:
        return samples
    theirs = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    assert theirs == {(n, tuple(sorted(lb))): v for (n, lb), v in samples.items()}
    return samples


def commits(samples: dict[Any, float]) -> dict[tuple[str, str], float]:
    """``commits_total`` by (outcome, code)."""
    return {
        (dict(lb)["outcome"], dict(lb)["code"]): v
        for (n, lb), v in samples.items()
        if n == f"{P}commits_total"
    }


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=load_scaled(30))
    try:
        conn.request("GET", "/metrics")  # no token
        r = conn.getresponse()
        body = r.read().decode()
        assert (r.status, r.getheader("content-type")) == (200, CONTENT_TYPE), body
        return parse(body)
    finally:
        conn.close()


# -- the service under a load -----------------------------------------------------------------------


def _load(svc: CommitService, lake: Path) -> Counter[int]:
    """Writers appending to their own tables, a race on one version, retries and refusals; the
    statuses they were answered."""
    statuses: Counter[int] = Counter()
    lock = threading.Lock()

    def writer(w: int, barrier: threading.Barrier) -> None:
        root = f"file:{lake}/t{w}"
        conn = http.client.HTTPConnection("127.0.0.1", svc.port, timeout=load_scaled(60))
        got = []
        try:
            barrier.wait()
            got.append(svc.post(root, 0, V0, conn=conn).status)
            for v in range(1, COMMITS_PER_WRITER):
                got.append(svc.post(root, v, commit_file(add(f"w{w}-{v}.parquet")), conn=conn).status)
            got.append(
                svc.post(root, 1, commit_file(add(f"w{w}-1.parquet")), conn=conn).status
            )  # a retry: 200
            got.append(svc.post(root, 1, commit_file(add("other.parquet")), conn=conn).status)  # 409
            got.append(svc.post(root, 99, commit_file(add("x.parquet")), conn=conn, token="wrong").status)
            got.append(svc.post(root, COMMITS_PER_WRITER, b"not json\n", conn=conn).status)  # 422
        finally:
            conn.close()
        with lock:
            statuses.update(got)

    race(WRITERS, writer, seconds=240)
    shared = f"file:{lake}/shared"
    assert svc.post(shared, 0, V0).status == 201
    statuses[201] += 1

    def racer(w: int, barrier: threading.Barrier) -> int:
        conn = http.client.HTTPConnection("127.0.0.1", svc.port, timeout=load_scaled(60))
        conn.connect()
        barrier.wait()
        try:
            return svc.post(shared, 1, commit_file(add(f"r{w}.parquet")), conn=conn).status
        finally:
            conn.close()

    statuses.update(race(8, racer))
    return statuses


@pytest.mark.parametrize("where", ["commit port", "--metrics-bind"])
def test_metrics_count_every_commit_of_a_load_by_outcome_across_two_workers(
    store: SqlStore, lake: Path, tmp_path: Path, where: str
) -> None:
    metrics_port = free_port()
    extra = ["--workers", "2"]
    if where == "--metrics-bind":
        extra += ["--metrics-bind", f"127.0.0.1:{metrics_port}"]
    svc = CommitService(store.url, [f"file:{lake}/"], extra_args=extra, log_path=tmp_path / "serve.log")
    svc.start()
    port = svc.port if where == "commit port" else metrics_port
    try:
        deadline = time.monotonic() + load_scaled(60)
        while (before := scrape(port))[(f"{P}worker_processes", ())] < 2:  # the second one starting
            assert time.monotonic() < deadline, before
            time.sleep(0.1)
        assert set(commits(before).values()) == {0.0}
        scrapes: list[dict[Any, float]] = []
        done = threading.Event()

        def scraper() -> None:
            while not done.is_set():
                scrapes.append(scrape(port))
                time.sleep(0.05)

        watcher = threading.Thread(target=scraper)
        watcher.start()
        try:
            statuses = _load(svc, lake)
        finally:
            done.set()
            watcher.join(load_scaled(60))
        after = scrape(port)
        if where == "--metrics-bind":
            on_commit_port = svc.request("GET", "/metrics", token=None)
            assert (on_commit_port.status, on_commit_port.json()["code"]) == (404, "not_found")
    finally:
        svc.stop()
    assert statuses[409] == 7 + WRITERS and statuses[401] == statuses[422] == WRITERS
    assert statuses[201] == WRITERS * COMMITS_PER_WRITER + 2 and statuses[200] == WRITERS
    counted = commits(after)
    assert set(counted) == {(o, str(c)) for o, c in OUTCOMES}
    assert counted[("created", "201")] == statuses[201]
    assert counted[("existing", "200")] == statuses[200]
    assert counted[("conflict", "409")] == statuses[409]
    assert counted[("refused", "401")] == statuses[401]
    assert counted[("refused", "422")] == statuses[422]
    assert sum(counted.values()) == sum(statuses.values())
    hist = f"{P}commit_duration_seconds"
    assert after[(f"{hist}_count", ())] == sum(statuses.values())
    assert 0 < after[(f"{hist}_sum", ())] < sum(statuses.values()) * load_scaled(30)
    assert after[(f"{P}commits_in_flight", ())] == 0
    assert after[(f"{P}worker_processes", ())] == 2
    assert len(scrapes) >= 2, "the scraper ran during the load"
    for earlier, later in zip([before, *scrapes], [*scrapes, after], strict=True):
        for key, value in earlier.items():
            if key[0].endswith(("_total", "_bucket", "_count", "_sum")):
                assert later[key] >= value, (key, value, later[key])
    assert svc.token not in svc.log()


@pytest.mark.postgres
def test_store_reconnects_are_counted_when_the_database_drops_the_service_s_connections(
    pg_store_url: str, lake: Path, tmp_path: Path
) -> None:
    SqlStore(pg_store_url).init()
    svc = CommitService(pg_store_url, [f"file:{lake}/"], log_path=tmp_path / "serve.log").start()
    admin = create_engine(pg_store_url, isolation_level="AUTOCOMMIT")
    try:
        root = f"file:{lake}/t"
        assert svc.post(root, 0, V0).status == 201
        assert scrape(svc.port)[(f"{P}store_reconnects_total", ())] == 0
        with admin.connect() as conn:
            killed = conn.exec_driver_sql(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()"
            ).scalar()
        assert killed and killed >= 1
        time.sleep(0.5)  # the server's FATAL reaches the idle connections
        assert svc.post(root, 1, commit_file(add("a.parquet"))).status == 201
        after = scrape(svc.port)
    finally:
        admin.dispose()
        svc.stop()
    assert after[(f"{P}store_reconnects_total", ())] >= 1
    assert commits(after)[("created", "201")] == 2


def test_a_bad_or_taken_metrics_bind_is_one_error_line(store: SqlStore) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        for bind, needle in (
            ("nonsense", "is not HOST:PORT"),
            ("127.0.0.1:99999", "is not HOST:PORT"),
            (f"127.0.0.1:{taken.getsockname()[1]}", "cannot listen for metrics"),
        ):
            out = subprocess.run(
                [cli(), "--store", store.url, "serve", "--port", str(free_port()), "--metrics-bind", bind],
                env={**os.environ, TOKEN_ENV: "tok-x"},
                capture_output=True,
                text=True,
                timeout=load_scaled(60),
                check=False,
            )
            assert out.returncode != 0
            assert_one_error_line(out.stderr, needle, "--metrics-bind")


def test_every_series_the_docs_and_dashboards_may_name_is_exported(store: SqlStore) -> None:
    svc = CommitService(store.url).start()
    try:
        names = {name for name, _ in scrape(svc.port)}
    finally:
        svc.stop()
    assert names == set(metric_names())
    assert len(OUTCOMES) == len({c for _, c in OUTCOMES})  # one outcome per status code


def created_by(worker_file: Path, alone: Path) -> float:
    """The commits one worker created, read from its file alone (a folder of its own)."""
    alone.mkdir()
    shutil.copy(worker_file, alone / worker_file.name)
    return commits(parse(Metrics(alone, record=False).exposition()))[("created", "201")]


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
def test_a_worker_killed_and_restarted_keeps_its_commits_in_the_totals(
    store: SqlStore, lake: Path, tmp_path: Path
) -> None:
    """The counters are summed over every worker that ran in the service: one that uvicorn replaces
    after a SIGKILL takes nothing away from them."""
    svc = CommitService(
        store.url, [f"file:{lake}/"], extra_args=["--workers", "2"], log_path=tmp_path / "serve.log"
    ).start()
    try:
        folder = Path(tempfile.gettempdir()) / f"delta-mirror-serve-{svc.port}-metrics-{os.getuid()}"
        deadline = time.monotonic() + load_scaled(60)
        while len(workers := sorted(folder.glob("worker-*.slots"))) < 2:
            assert time.monotonic() < deadline, workers
            time.sleep(0.1)
        for n in range(10):  # a connection each: the kernel hands them to either worker
            assert svc.post(f"file:{lake}/t{n}", 0, V0).status == 201
        assert commits(scrape(svc.port))[("created", "201")] == 10
        own = {path: created_by(path, tmp_path / path.stem) for path in workers}
        victim = max(own, key=lambda p: own[p])
        assert own[victim] > 0 and sum(own.values()) == 10
        os.kill(int(victim.stem.removeprefix("worker-")), signal.SIGKILL)
        while len(list(folder.glob("worker-*.slots"))) < 3:  # uvicorn started a new worker
            assert time.monotonic() < deadline + load_scaled(60)
            time.sleep(0.1)
        while (after := scrape(svc.port))[(f"{P}worker_processes", ())] != 2:
            assert time.monotonic() < deadline + load_scaled(90), after
            time.sleep(0.1)
        assert svc.post(f"file:{lake}/t10", 0, V0).status == 201
        after = scrape(svc.port)
    finally:
        svc.stop()
    assert commits(after)[("created", "201")] == 11
    assert after[(f"{P}commit_duration_seconds_count", ())] == 11
    assert after[(f"{P}commits_in_flight", ())] == 0
