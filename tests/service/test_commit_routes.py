"""Specification of the commit service (docs/commit-service.md) against a real ``delta-mirror serve``.

Each test starts the service as a subprocess on 127.0.0.1 (a free port, readiness polled on
``/health``) over a real store, and talks HTTP to it as the Delta-Spark LogStore does: the exact
bytes of ``<v>.json`` in, a status code and one line of JSON out. After every refusal the store's
rows and the table folder are unchanged.

Every test runs on SQLite, PostgreSQL and MySQL/MariaDB. On DuckDB (one read-write process per file)
the service's one worker owns the file, so there run the tests that do not read the store while the
service runs (``all_backends`` without ``but``): committing, retries, 409s, eight racing writers, a
SIGKILL and restart; and ``--workers 3`` on a DuckDB store is refused in one line.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from sqlalchemy import func, make_url, select
from support.builders import action, add_body, log_line, metadata_body, protocol_body, remove_body
from support.cli import assert_one_error_line
from support.commit_service import TOKEN_ENV, CommitService
from support.commit_service import cli_path as cli
from support.race import race
from support.services import free_port
from support.waiting import load_scaled

from delta_mirror.storage import normalize_commit_root
from delta_mirror.store import SqlStore
from delta_mirror.store.schema import dl_actions, dl_commits, dl_files, dl_mirror_status, dl_tables

Service = CommitService
pytestmark = pytest.mark.all_backends(but="duckdb")  # the tests for DuckDB too say so themselves
MAX_BODY = 64 * 1024


def line(kind: str, body: dict[str, Any]) -> str:
    return log_line(action(kind, body))


def commit_file(*lines: str, operation: str = "WRITE") -> bytes:
    info = line(
        "commitInfo", {"timestamp": 1700000000000, "operation": operation, "engineInfo": "Apache-Spark/4.2.0"}
    )
    return "".join(f"{x}\n" for x in (info, *lines)).encode()


def protocol(reader: int = 1, writer: int = 2, **features: list[str]) -> str:
    return line("protocol", protocol_body(reader, writer, **features))


def metadata() -> str:
    return line(
        "metaData", metadata_body(id="a6b9e1c2-0000-4000-8000-000000000000", created_time=1700000000000)
    )


def add(path: str) -> str:
    return line("add", add_body(path, size=10, modificationTime=1700000000000))


def remove(path: str) -> str:
    return line("remove", remove_body(path, deletionTimestamp=1700000000001))


V0 = commit_file(protocol(), metadata(), add("part-0.parquet"), operation="CREATE TABLE")


# -- the service as a process -----------------------------------------------------------------------


@pytest.fixture
def service(store: SqlStore, lake: Path, tmp_path: Path) -> Iterator[Service]:
    if store.url.startswith("duckdb"):
        store.close()  # the service's worker owns a DuckDB file: the test lets go of it first
    svc = Service(
        store.url,
        [f"file:{lake}/"],
        extra_args=["--max-body-bytes", str(MAX_BODY)],
        log_path=tmp_path / "serve.log",
    ).start()
    yield svc
    svc.stop()
    assert svc.token not in svc.log(), "the token must never be logged"


def hadoop_root(path: Path) -> str:
    return f"file:{path}"  # how Hadoop names a local folder


def rows_and_files(store: SqlStore, lake: Path) -> dict[str, Any]:
    """Row counts of the store's tables and every file under the lake: 'unchanged' means equal."""
    with store.engine.connect() as conn:
        counts = {
            t.name: conn.execute(select(func.count()).select_from(t)).scalar()
            for t in (dl_tables, dl_commits, dl_actions, dl_files, dl_mirror_status)
        }
    files = sorted(str(p.relative_to(lake)) for p in lake.rglob("*"))
    return {"rows": counts, "files": files}


def created(service: Service, root: str) -> None:
    assert service.post(root, 0, V0).status == 201


# -- committing -------------------------------------------------------------------------------------


def test_version_0_under_an_allowed_root_creates_the_table_and_later_versions_append(
    service: Service, store: SqlStore, lake: Path
) -> None:
    root = hadoop_root(lake / "sales")
    first = service.post(root, 0, V0)
    assert first.status == 201
    assert first.json() == {
        "table": "sales",
        "version": 0,
        "sha256": hashlib.sha256(V0).hexdigest(),
        "size": len(V0),
    }
    v1 = commit_file(add("part-1.parquet"))
    assert service.post(root, 1, v1).status == 201
    got = service.get(root, 1)
    assert (got.status, got.body, got.headers["content-type"]) == (200, v1, "application/octet-stream")
    assert got.headers["x-delta-mirror-sha256"] == hashlib.sha256(v1).hexdigest()
    for spelling in (root, f"file://{lake}/sales/", str(lake / "sales")):
        assert service.latest(spelling).json() == {"table": "sales", "version": 1}
    table = store.get_table("sales")
    assert table.location == (lake / "sales").resolve().as_uri()
    assert [r.source for r in store.commit_rows(table.id, 0, 1)] == ["spark", "spark"]
    assert not (lake / "sales").exists(), "the service writes nothing at the location: the LogStore does"


@pytest.mark.all_backends
def test_a_retry_after_a_lost_response_is_200_existing(service: Service, lake: Path) -> None:
    root = hadoop_root(lake / "t")
    created(service, root)
    v1 = commit_file(add("part-1.parquet"))
    assert service.post(root, 1, v1).status == 201
    again = service.post(root, 1, v1)
    assert again.status == 200
    assert again.json()["existing"] is True and again.json()["sha256"] == hashlib.sha256(v1).hexdigest()
    assert service.post(root, 0, V0).status == 200


def test_a_different_commit_of_a_taken_version_is_409_and_get_returns_the_winner(
    service: Service, store: SqlStore, lake: Path
) -> None:
    root = hadoop_root(lake / "t")
    created(service, root)
    winner = commit_file(add("winner.parquet"))
    assert service.post(root, 1, winner).status == 201
    before = rows_and_files(store, lake)
    loser = service.post(root, 1, commit_file(add("loser.parquet")))
    assert (loser.status, loser.json()["code"]) == (409, "version_taken")
    assert "table 't', version 1" in loser.json()["error"]
    assert service.get(root, 1).body == winner
    assert rows_and_files(store, lake) == before


@pytest.mark.all_backends
def test_get_answers_404_for_a_version_not_committed(service: Service, lake: Path) -> None:
    root = hadoop_root(lake / "t")
    assert service.latest(root).json()["code"] == "unknown_table"
    created(service, root)
    missing = service.get(root, 5)
    assert (missing.status, missing.json()["code"]) == (404, "not_committed")


# -- refusals: the status code says what the LogStore does, and nothing changes ----------------------


def halted(service: Service, store: SqlStore, root: str) -> bytes:
    table = store.table_at(normalize_commit_root(root))
    store.halt_table(table.id, "a foreign commit", 1)
    return commit_file(add("b.parquet"))


def catalog_managed(service: Service, store: SqlStore, root: str) -> bytes:
    return commit_file(protocol(3, 7, readerFeatures=["catalogManaged"], writerFeatures=["catalogManaged"]))


def remove_of_a_file_not_active(service: Service, store: SqlStore, root: str) -> bytes:
    return commit_file(remove("never-added.parquet"))


def oversized(service: Service, store: SqlStore, root: str) -> bytes:
    return commit_file(*(add(f"part-{i:05d}.parquet") for i in range(MAX_BODY // 100)))


def gap(service: Service, store: SqlStore, root: str) -> bytes:
    return commit_file(add("b.parquet"))


REFUSALS = [
    # (case, make the body, version, token, root under the lake, status, code)
    ("halted", halted, 1, True, "t", 423, "halted"),
    ("catalogManaged", catalog_managed, 1, True, "t", 422, "invalid"),
    ("remove of a file that is not active", remove_of_a_file_not_active, 1, True, "t", 422, "invalid"),
    ("oversized", oversized, 1, True, "t", 413, "too_large"),
    ("wrong token", gap, 1, "not-the-token", "t", 401, "unauthorized"),
    ("missing token", gap, 1, None, "t", 401, "unauthorized"),
    ("root outside the allowed prefixes", lambda *a: V0, 0, True, "/elsewhere/t", 403, "root_not_allowed"),
    ("unknown root past version 0", gap, 1, True, "other", 404, "unknown_table"),
    ("version gap", gap, 3, True, "t", 422, "invalid"),
]


@pytest.mark.parametrize(
    ("case", "make", "version", "token", "where", "status", "code"), REFUSALS, ids=[r[0] for r in REFUSALS]
)
def test_a_refused_commit_answers_its_status_and_changes_nothing(
    service: Service,
    store: SqlStore,
    lake: Path,
    case: str,
    make: Any,
    version: int,
    token: Any,
    where: str,
    status: int,
    code: str,
) -> None:
    created(service, hadoop_root(lake / "t"))
    root = f"file:{where}" if where.startswith("/") else hadoop_root(lake / where)
    body = make(service, store, root)
    before = rows_and_files(store, lake)
    answer = service.post(root, version, body, token=token)
    assert (answer.status, answer.json()["code"]) == (status, code), answer.body
    assert answer.body.count(b"\n") == 0 and answer.json()["error"]
    assert rows_and_files(store, lake) == before
    if case == "version gap":
        assert "outside the authority" in answer.json()["error"]
        assert "delta-mirror reconcile t --strategy full" in answer.json()["error"]
    if token not in (True, None):
        assert str(token) not in answer.body.decode()


def test_the_body_limit_holds_for_a_chunked_body_without_a_length(
    service: Service, store: SqlStore, lake: Path
) -> None:
    root = hadoop_root(lake / "t")
    created(service, root)
    before = rows_and_files(store, lake)
    chunks = (b"x" * 8192 for _ in range(MAX_BODY // 8192 + 2))
    answer = service.post(root, 1, chunks)
    assert (answer.status, answer.json()["code"]) == (413, "too_large")
    assert rows_and_files(store, lake) == before


def test_an_unreachable_store_is_503_with_retry_after(lake: Path, tmp_path: Path) -> None:
    dead = f"postgresql+psycopg://mirror:hunter2@127.0.0.1:{free_port()}/mirror"
    service = Service(dead, [f"file:{lake}/"], log_path=tmp_path / "serve.log").start(ready=503)
    try:
        health = service.request("GET", "/health", token=None)
        post = service.post(hadoop_root(lake / "t"), 0, V0)
    finally:
        service.stop()
    for answer in (health, post):
        assert answer.status == 503 and answer.headers["retry-after"].isdigit()
        assert b"hunter2" not in answer.body
    assert post.json()["code"] == "unavailable"
    assert "hunter2" not in service.log() and service.token not in service.log()


def test_health_with_a_stopped_store_never_names_the_store(
    pg_server: Any, pg_store_url: str, lake: Path, tmp_path: Path
) -> None:
    """The compose healthcheck curls /health without a token: it gets the status and nothing else;
    with the token the kind of failure and what to do, but never the URL, user, host, port or
    database (the service's log has them)."""
    if not pg_server.owned:
        pytest.skip("stopping PostgreSQL needs the throwaway server")
    SqlStore(pg_store_url).init()
    url = make_url(pg_store_url)
    secrets = [str(url.username), str(url.host), str(url.port), str(url.database), "postgresql"]
    service = Service(pg_store_url, [f"file:{lake}/"], log_path=tmp_path / "serve.log").start()
    try:
        up = service.request("GET", "/health", token=None)
        assert (up.status, up.json()) == (200, {"status": "ok"})
        pg_server.stop("fast")
        try:
            anonymous = service.request("GET", "/health", token=None)
            detailed = service.request("GET", "/health")
            wrong = service.request("GET", "/health", token="not-the-token")
        finally:
            pg_server.start()
        back = service.request("GET", "/health", token=None)
    finally:
        service.stop()
    assert (anonymous.status, anonymous.json()) == (503, {"status": "unavailable"})
    assert (wrong.status, wrong.json()) == (503, {"status": "unavailable"})
    assert anonymous.headers["retry-after"].isdigit()
    assert detailed.status == 503 and detailed.json()["status"] == "unavailable"
    assert "TRANSIENT" in detailed.json()["error"] and "retried automatically" in detailed.json()["error"]
    for answer in (anonymous, detailed, wrong):
        assert answer.body.count(b"\n") == 0
        for secret in secrets:
            assert secret not in answer.body.decode(), (secret, answer.body)
    assert back.status == 200


BAD_VERSIONS = ["9223372036854775808", "99999999999999999999999999", "-1", "1.5", "one", "0x10"]


@pytest.mark.parametrize("raw", BAD_VERSIONS)
def test_a_version_outside_0_to_2_63_is_one_400_on_post_and_get(
    service: Service, store: SqlStore, lake: Path, raw: str
) -> None:
    root = hadoop_root(lake / "t")
    created(service, root)
    before = rows_and_files(store, lake)
    query = f"?root={quote(root, safe='')}"
    for method, body in (("POST", commit_file(add("b.parquet"))), ("GET", None)):
        answer = service.request(method, f"/v1/commits/{raw}{query}", body)
        assert (answer.status, answer.json()["code"]) == (400, "bad_request"), (method, answer.body)
        assert answer.body.count(b"\n") == 0
        assert "a version is an integer from 0 to 9223372036854775807" in answer.json()["error"]
        anonymous = service.request(method, f"/v1/commits/{raw}{query}", body, token=None)
        assert anonymous.status == 401  # the token is checked before anything else
    assert rows_and_files(store, lake) == before


def test_posts_beside_the_commit_route_answer_404_or_405_in_one_json_line(
    service: Service, lake: Path
) -> None:
    root = quote(hadoop_root(lake / "t"), safe="")
    for path, status, code in (
        ("/v1/commits/", 404, "not_found"),
        (f"/v1/commits/1/extra?root={root}", 404, "not_found"),
        ("/v1/nothing", 404, "not_found"),
    ):
        answer = service.request("POST", path, commit_file(add("a.parquet")))
        assert (answer.status, answer.json()["code"]) == (status, code), (path, answer.body)
        assert answer.body.count(b"\n") == 0
    answer = service.request("PUT", f"/v1/commits/1?root={root}", commit_file(add("a.parquet")))
    assert (answer.status, answer.json()["code"]) == (405, "method_not_allowed")


@pytest.mark.slow
def test_one_keep_alive_connection_carries_every_commit_of_a_writer(service: Service, lake: Path) -> None:
    root = hadoop_root(lake / "t")
    conn = http.client.HTTPConnection("127.0.0.1", service.port, timeout=load_scaled(30))
    try:
        answer = service.post(root, 0, V0, conn=conn)
        assert answer.status == 201, answer.body
        sock = conn.sock
        for v in range(1, 21):
            data = commit_file(add(f"part-{v}.parquet"))
            answer = service.post(root, v, data, conn=conn)
            assert answer.status == 201, answer.body
            assert answer.json() == {
                "table": "t",
                "version": v,
                "sha256": hashlib.sha256(data).hexdigest(),
                "size": len(data),
            }
            assert answer.headers["content-type"] == "application/json"
        assert conn.sock is sock, "the service closed the keep-alive connection between commits"
        # A writer committing every few seconds keeps its connection too (uvicorn's default closes
        # a connection idle for 5 s; the service keeps it KEEP_ALIVE_SECONDS).
        time.sleep(6)
        answer = service.post(root, 21, commit_file(add("part-21.parquet")), conn=conn)
        assert answer.status == 201, answer.body
        assert conn.sock is sock, "the service closed the keep-alive connection after 6 idle seconds"
    finally:
        conn.close()


@pytest.mark.all_backends
def test_the_largest_version_is_valid_on_get(service: Service, lake: Path) -> None:
    root = hadoop_root(lake / "t")
    created(service, root)
    answer = service.get(root, (1 << 63) - 1)
    assert (answer.status, answer.json()["code"]) == (404, "not_committed")


# -- concurrency and restarts -----------------------------------------------------------------------


@pytest.mark.all_backends
def test_eight_writers_racing_on_one_version_get_one_201_and_seven_409(service: Service, lake: Path) -> None:
    root = hadoop_root(lake / "t")
    created(service, root)
    writers = 8

    def writer(w: int, barrier: threading.Barrier) -> int:
        conn = http.client.HTTPConnection("127.0.0.1", service.port, timeout=load_scaled(60))
        conn.connect()  # connected before the start: the race is on the commit, not the handshake
        barrier.wait()
        try:
            return service.post(root, 1, commit_file(add(f"w{w}.parquet")), conn=conn).status
        finally:
            conn.close()

    assert sorted(race(writers, writer)) == [201] + [409] * (writers - 1)
    assert service.latest(root).json()["version"] == 1


@pytest.mark.all_backends
def test_a_service_killed_with_sigkill_and_restarted_goes_on_committing(service: Service, lake: Path) -> None:
    root = hadoop_root(lake / "t")
    created(service, root)
    assert service.post(root, 1, commit_file(add("a.parquet"))).status == 201
    service.kill()
    service.start()
    assert service.post(root, 1, commit_file(add("a.parquet"))).status == 200  # the LogStore's retry
    assert service.post(root, 2, commit_file(add("b.parquet"))).status == 201
    assert service.latest(root).json() == {"table": "t", "version": 2}


# -- publishing what the service committed ----------------------------------------------------------


def test_the_publisher_writes_the_posted_bytes_and_counts_an_identical_existing_file_as_published(
    service: Service, store: SqlStore, lake: Path
) -> None:
    root = hadoop_root(lake / "t")
    posted = [V0, commit_file(add("a.parquet")), commit_file(remove("a.parquet"), add("b.parquet"))]
    for version, data in enumerate(posted):
        assert service.post(root, version, data).status == 201
    log_dir = lake / "t" / "_delta_log"
    log_dir.mkdir(parents=True)
    (log_dir / f"{2:020d}.json").write_bytes(posted[2])  # the LogStore wrote it after its 201
    out = subprocess.run(
        [cli(), "--store", store.url, "mirror", "t", "--json"], capture_output=True, text=True, check=False
    )
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert (result["published"], result["already_present"], result["last_published"]) == (2, 1, 2)
    for version, data in enumerate(posted):
        assert (log_dir / f"{version:020d}.json").read_bytes() == data
    table = store.get_table("t")
    assert store.last_published_version(table.id) == 2
    assert [s.state for s in store.status_rows(table.id, artifact="json")] == ["SUCCESS"] * 3


# -- starting the service ---------------------------------------------------------------------------


def test_serve_refuses_to_start_without_a_token_unless_no_auth(store: SqlStore) -> None:
    env = {k: v for k, v in os.environ.items() if k != TOKEN_ENV}
    out = subprocess.run(
        [cli(), "--store", store.url, "serve", "--port", str(free_port())],
        env=env,
        capture_output=True,
        text=True,
        timeout=load_scaled(60),
        check=False,
    )
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1 and TOKEN_ENV in out.stderr and "--no-auth" in out.stderr


def test_several_worker_processes_share_one_store_and_log_no_request_lines(
    store: SqlStore, lake: Path, tmp_path: Path
) -> None:
    """``--workers 3``: racing writers through any of the processes land on contiguous versions, each
    exactly once; without ``--access-log`` no line per request is logged (and never the token)."""
    svc = Service(store.url, [f"file:{lake}/"], extra_args=["--workers", "3"], log_path=tmp_path / "w.log")
    svc.start()
    try:
        root = hadoop_root(lake / "t")
        assert svc.post(root, 0, V0).status == 201

        def writer(w: int, barrier: threading.Barrier) -> list[tuple[int, int]]:
            conn = http.client.HTTPConnection("127.0.0.1", svc.port, timeout=load_scaled(30))
            version, outcomes = 1, []
            try:
                barrier.wait()
                for n in range(8):
                    while True:  # as Delta does after a 409: the next version
                        answer = svc.post(root, version, commit_file(add(f"w{w}-{n}.parquet")), conn=conn)
                        if answer.status != 409:
                            break
                        version += 1
                    outcomes.append((answer.status, version))
                    version += 1
            finally:
                conn.close()
            return outcomes

        landed = race(4, writer, seconds=120)
        assert sorted(o for outcomes in landed for o in outcomes) == [(201, v) for v in range(1, 33)]
        table = store.table_at(normalize_commit_root(root))
        assert store.latest_version(table.id) == 32
        assert len(store.active_files(table.id, 32)) == 33
    finally:
        svc.stop()
    log = svc.log()
    assert "3 worker processes" in log and svc.token not in log
    assert "POST /v1/commits" not in log


@pytest.mark.duckdb
def test_several_worker_processes_on_a_duckdb_store_are_refused_in_one_line(tmp_path: Path) -> None:
    """A DuckDB file takes one read-write process: ``serve --workers 3`` would open it from three."""
    url = f"duckdb:///{tmp_path / 'store.duckdb'}"
    store = SqlStore(url)
    store.init()
    store.close()  # so the refusal is the rule's, not a lock held by this process
    out = subprocess.run(
        [cli(), "--store", url, "serve", "--port", str(free_port()), "--workers", "3"],
        env={**os.environ, TOKEN_ENV: "tok-x"},
        capture_output=True,
        text=True,
        timeout=load_scaled(30),  # refused before serving: a service that starts runs until then
        check=False,
    )
    assert out.returncode != 0
    line = assert_one_error_line(out.stderr, "DuckDB", "one process")
    assert "in use by another process" not in line, line


def test_roots_are_normalised_as_hadoop_and_s3_spell_them() -> None:
    assert normalize_commit_root("file:/data/sales") == "file:///data/sales"
    assert normalize_commit_root("file:///data/sales/") == "file:///data/sales"
    assert normalize_commit_root("s3a://lake/sales/") == "s3://lake/sales"
    assert normalize_commit_root("s3n://lake/sales") == "s3://lake/sales"
