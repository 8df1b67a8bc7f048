"""Delta-Spark writers given two commit-service replicas keep committing when one is SIGKILLed.

Real parts only: the shared SparkSession (the LogStore jar, ``delta.mirror.commit.url`` set to both
replicas' URLs), two ``delta-mirror serve`` processes over one PostgreSQL store, a local table,
deltalake and Spark readers. The kill lands where it is hardest: with a commit in flight whose
statement PostgreSQL still commits after the replica died (held by a table lock meanwhile), so its
answer is lost; the writer re-sends it to the other replica, which finds it already there. Every
version is committed exactly once, contiguous, and ``<v>.json`` holds the bytes the store committed.
"""

from __future__ import annotations

import hashlib
import json
import signal
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from authority_kit import spark_root
from sqlalchemy import text
from support.commit_service import CommitService
from support.services import skip_or_fail
from support.waiting import load_scaled, wait_until

from delta_mirror.errors import TableNotFoundError
from delta_mirror.jobs.publisher import Publisher
from delta_mirror.jobs.validate import validate_table
from delta_mirror.spark.session import AuthorityConfig
from delta_mirror.spark.session import governed as session_governed
from delta_mirror.store import SqlStore

ROWS_PER_APPEND = 5
TIMEOUT_KEY = "delta.mirror.commit.timeoutMs"


@pytest.fixture(autouse=True)
def _needs_the_logstore(logstore_loaded: bool) -> None:
    if not logstore_loaded:
        skip_or_fail("the authority LogStore jar is not built (`make jar` needs Maven and a JDK 17)")


# ------------------------------------------------------------------------------------------------
# helpers


@contextmanager
def replicas(store_url: str, root: Path, count: int = 2) -> Iterator[list[CommitService]]:
    """``count`` services over ``store_url`` sharing one token, not started (a URL nobody serves)."""
    services = [CommitService(store_url, [root.as_uri()]) for _ in range(count)]
    for s in services[1:]:
        s.token = services[0].token
    assert len({s.port for s in services}) == count
    try:
        yield services
    finally:
        for s in services:
            s.stop()


@contextmanager
def governed(spark: Any, services: Sequence[CommitService], root: Path) -> Iterator[None]:
    """Commits under ``root`` go to ``services``, in this order of preference, while the block runs."""
    url = ",".join(s.url for s in services)
    conf = spark.sparkContext._jsc.hadoopConfiguration()
    # a slow answer on a loaded machine is no failover: only the kill moves the writer
    conf.set(TIMEOUT_KEY, str(int(load_scaled(30) * 1000)))
    try:
        with session_governed(spark, AuthorityConfig(url=url, roots=(spark_root(root),)), services[0].token):
            yield
    finally:
        conf.unset(TIMEOUT_KEY)


@contextmanager
def logstore_log(spark: Any, path: Path) -> Iterator[None]:
    """The LogStore's log lines (JUL, INFO and up) also go to ``path`` while the block runs."""
    jul = spark._jvm.java.util.logging
    handler = jul.FileHandler(str(path))
    handler.setFormatter(jul.SimpleFormatter())
    logger = jul.Logger.getLogger("io.github.deltamirror.logstore")
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        handler.close()


def append(spark: Any, location: Path, batch: int) -> None:
    ids = range(batch * ROWS_PER_APPEND, (batch + 1) * ROWS_PER_APPEND)
    df = spark.createDataFrame([(i, f"u{i}") for i in ids], "event_id BIGINT, user STRING")
    df.coalesce(1).write.format("delta").mode("append").save(str(location))


def commit_files(location: Path) -> dict[int, bytes]:
    log = location / "_delta_log"
    return {int(p.name[:20]): p.read_bytes() for p in sorted(log.glob("[0-9]" * 20 + ".json"))}


def latest_version(store: SqlStore, name: str) -> int | None:
    try:
        return store.latest_version(store.get_table(name).id)
    except TableNotFoundError:  # not created yet
        return None


def established(port: int) -> int:
    """TCP connections a server on 127.0.0.1:``port`` holds open (Linux ``/proc/net/tcp``)."""
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "01":
                count += 1
    return count


def assert_committed_once(store: SqlStore, name: str, location: Path, versions: int) -> None:
    """Versions 0..versions-1 in the store and on storage, nothing else, byte for byte."""
    table = store.get_table(name)
    assert store.latest_version(table.id) == versions - 1
    rows = store.commit_rows(table.id, 0, versions - 1)
    files = commit_files(location)
    assert sorted(files) == list(range(versions))
    assert [(r.version, r.sha256) for r in rows] == [
        (v, hashlib.sha256(files[v]).hexdigest()) for v in range(versions)
    ]
    for v in range(versions):
        assert store.commit_bytes(table.id, v) == files[v]
    # Delta's transaction ids: no transaction was committed twice (at v and again at v+1)
    txn_ids = [json.loads(files[v].split(b"\n", 1)[0])["commitInfo"].get("txnId") for v in range(versions)]
    assert len(set(txn_ids)) == versions, txn_ids
    published = Publisher(store).publish(name)
    assert published.already_present == list(range(versions))
    report = validate_table(store, name)
    assert report.ok, report


def event_ids(spark: Any, location: Path) -> tuple[list[int], list[int]]:
    """The table's event ids read by deltalake and by Spark, sorted."""
    import pyarrow as pa
    from deltalake import DeltaTable, QueryBuilder

    dt = DeltaTable(location.as_uri())
    read = pa.table(QueryBuilder().register("t", dt).execute("select event_id from t order by event_id"))
    by_spark = [r[0] for r in spark.read.format("delta").load(str(location)).orderBy("event_id").collect()]
    return [r["event_id"] for r in read.to_pylist()], by_spark


def assert_reads_appends(spark: Any, location: Path, appends: int) -> None:
    """deltalake and Spark both read exactly the rows of batches 0..appends-1, each once."""
    expected = list(range(appends * ROWS_PER_APPEND))
    assert event_ids(spark, location) == (expected, expected)


def lake(store_url: str, tmp_path: Path) -> tuple[SqlStore, Path, Path]:
    """A fresh store, the lake's root (the one the replicas serve) and its ``events`` table's location."""
    store = SqlStore(store_url)
    store.init()
    root = tmp_path / "lake"
    return store, root, root / "events"


# ------------------------------------------------------------------------------------------------
# tests


def send(service: CommitService, sig: signal.Signals) -> None:
    assert service.proc is not None
    service.proc.send_signal(sig)


def lock_waiters(store: SqlStore) -> int:
    """Statements of this store's database waiting for a lock (PostgreSQL)."""
    with store.engine.connect() as conn:
        return int(
            conn.execute(
                text(
                    "select count(*) from pg_stat_activity"
                    " where datname = current_database() and wait_event_type = 'Lock'"
                )
            ).scalar_one()
        )


def test_a_replica_killed_with_a_spark_commit_in_flight_is_failed_over_and_the_commit_counts_once(
    spark: Any, pg_store_url: str, tmp_path: Path
) -> None:
    store, root, location = lake(pg_store_url, tmp_path)
    appends = 6
    said = tmp_path / "logstore.log"
    with (
        replicas(pg_store_url, root) as (a, b),
        governed(spark, (a, b), root),
        logstore_log(spark, said),
    ):
        a.start()
        b.start()
        append(spark, location, 0)
        append(spark, location, 1)
        # the writer uses the first URL only: its pooled connection is to a, none to b
        assert established(a.port) >= 1
        assert established(b.port) == 0
        errors: list[BaseException] = []

        def keep_appending() -> None:
            try:
                for batch in range(2, appends):
                    append(spark, location, batch)
            except BaseException as exc:  # reported by the test
                errors.append(exc)

        writer = threading.Thread(target=keep_appending, name="appends")
        stopped = False
        try:
            with store.engine.connect() as held:
                # commits wait (reads go on): the next POST stays in a's hands, inside its INSERT
                held.execute(text("LOCK TABLE dl_commits IN SHARE MODE"))
                writer.start()
                wait_until(lambda: lock_waiters(store) >= 1, 300, "the commit of version 2 to wait in a")
                send(b, signal.SIGSTOP)  # b takes the re-sent commit only after a's landed
                stopped = True
                a.kill()  # its statement stays queued in PostgreSQL: it commits, unanswered
                held.rollback()
            wait_until(lambda: latest_version(store, "events") == 2, 120, "a's orphaned commit of version 2")
        finally:
            if stopped:
                send(b, signal.SIGCONT)
            if writer.ident is not None:
                writer.join(load_scaled(600))
        assert not writer.is_alive()
        assert not errors, errors
        assert established(b.port) >= 1

    log = said.read_text()
    # which replica failed and why, never the token; and the lost attempt was recognised as ours
    assert f"the commit service replica {a.url} failed" in log, log
    assert a.token not in log
    assert (
        f"version 2 of file:{location} was committed by an attempt whose answer was lost"
        f" (HTTP 200 existing from {b.url})"
    ) in log, log
    assert_committed_once(store, "events", location, appends)
    assert_reads_appends(spark, location, appends)


def test_a_first_url_that_is_down_from_the_start_is_skipped(
    spark: Any, pg_store_url: str, tmp_path: Path
) -> None:
    store, root, location = lake(pg_store_url, tmp_path)
    with replicas(pg_store_url, root) as (down, b), governed(spark, (down, b), root):
        b.start()  # nothing ever listens on the first URL
        for batch in range(3):
            append(spark, location, batch)
    assert_committed_once(store, "events", location, 3)
    assert_reads_appends(spark, location, 3)


def logstore_write(spark: Any, location: Path, version: int, data: bytes) -> None:
    """``LogStore.write(<version>.json)`` of ``data``'s lines, as Delta-Spark calls it."""
    jvm = spark._jvm
    conf = spark.sparkContext._jsc.hadoopConfiguration()
    logstore = jvm.io.github.deltamirror.logstore.SqlAuthorityLogStore(conf)
    actions = jvm.java.util.ArrayList()
    for line in data.decode().splitlines():
        actions.add(line)
    path = jvm.org.apache.hadoop.fs.Path(f"file:{location}/_delta_log/{version:020d}.json")
    logstore.write(path, actions.iterator(), False, conf)


def commit_info(txn: str) -> bytes:
    return (json.dumps({"commitInfo": {"timestamp": int(time.time() * 1000), "txnId": txn}}) + "\n").encode()


def test_a_commit_whose_answer_died_with_its_replica_is_committed_once_through_the_other(
    spark: Any, pg_store_url: str, tmp_path: Path
) -> None:
    store, root, location = lake(pg_store_url, tmp_path)
    ours, theirs = commit_info(str(uuid.uuid4())), commit_info(str(uuid.uuid4()))
    with replicas(pg_store_url, root) as (a, b), governed(spark, (a, b), root):
        a.start()
        b.start()
        append(spark, location, 0)
        # replica a commits version 1, then is killed before the writer hears the answer
        assert a.post(f"file:{location}", 1, ours).status == 201
        a.kill()
        logstore_write(spark, location, 1, ours)  # re-sent to b: 200 existing, not a conflict
        assert commit_files(location)[1] == ours
        # another transaction's bytes at the same version are Delta's conflict, as ever
        with pytest.raises(Exception) as conflict:
            logstore_write(spark, location, 1, theirs)
        assert "java.nio.file.FileAlreadyExistsException" in str(conflict.value)
        append(spark, location, 1)  # version 2, through b
    table = store.get_table("events")
    assert store.latest_version(table.id) == 2
    assert store.commit_bytes(table.id, 1) == ours == commit_files(location)[1]
    assert sorted(commit_files(location)) == [0, 1, 2]
    assert_reads_appends(spark, location, 2)
