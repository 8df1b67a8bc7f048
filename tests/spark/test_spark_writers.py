"""Ordinary Delta-Spark writers commit into the SQL store through the authority LogStore.

Real parts only: the shared SparkSession (local mode, real delta-spark jars, the LogStore jar),
``delta-mirror serve`` as a process, SQLite and PostgreSQL stores, local folders and the S3 server
(s3a), deltalake and Spark readers. What each test shows is in its name.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import sqlite3
import subprocess
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pytest
from authority_kit import WriterProcess, go, governed, spark_root
from support.builders import action, protocol_body
from support.commit_service import cli_path, commit_service
from support.services import skip_or_fail
from support.stores import sqlite_store
from support.waiting import load_scaled

from delta_mirror.jobs.publisher import Publisher
from delta_mirror.jobs.reconcile import reconcile
from delta_mirror.jobs.validate import validate_table
from delta_mirror.spark.pipeline import SAMPLE_SCHEMA, run_pipeline
from delta_mirror.store import SqlStore

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _needs_the_logstore(logstore_loaded: bool) -> None:
    if not logstore_loaded:
        skip_or_fail("the authority LogStore jar is not built (`make jar` needs Maven and a JDK 17)")


SAMPLE = REPO / "examples" / "events.csv"


# ------------------------------------------------------------------------------------------------
# helpers


def log_dir(location: Path) -> Path:
    return location / "_delta_log"


def commit_files(location: Path) -> dict[int, bytes]:
    return {int(p.name[:20]): p.read_bytes() for p in sorted(log_dir(location).glob("[0-9]" * 20 + ".json"))}


def store_state(store: SqlStore, name: str) -> tuple[int | None, list[tuple[int, str]]]:
    table = store.get_table(name)
    latest = store.latest_version(table.id)
    rows = [] if latest is None else store.commit_rows(table.id, 0, latest)
    return latest, [(r.version, r.sha256) for r in rows]


def operations(location: Path) -> list[str]:
    out = []
    for _, data in sorted(commit_files(location).items()):
        first = json.loads(data.split(b"\n", 1)[0])
        out.append(first["commitInfo"]["operation"])
    return out


def deltalake_rows(location: Path) -> list[tuple[Any, ...]]:
    from deltalake import DeltaTable, QueryBuilder

    dt = DeltaTable(location.as_uri())
    import pyarrow as pa

    t = pa.table(QueryBuilder().register("t", dt).execute("select event_id, amount from t order by event_id"))
    return [(r["event_id"], None if r["amount"] is None else str(r["amount"])) for r in t.to_pylist()]


def spark_rows(spark: Any, location: Path) -> list[tuple[Any, ...]]:
    df = spark.read.format("delta").load(str(location)).select("event_id", "amount").orderBy("event_id")
    return [(r[0], None if r[1] is None else str(r[1])) for r in df.collect()]


def fails_with(fn: Any, *needles: str) -> str:
    """Run ``fn``, expecting the Spark write to fail; returns the error text (must hold each needle)."""
    with pytest.raises(Exception) as info:
        fn()
    text = str(info.value)
    for needle in needles:
        assert needle in text, text[:2000]
    return text


def logstore_write(spark: Any, location: Path, version: int, lines: list[str]) -> None:
    """``LogStore.write(<version>.json, lines)`` as Delta-Spark calls it, on the session's LogStore class."""
    jvm = spark._jvm
    conf = spark.sparkContext._jsc.hadoopConfiguration()
    store = jvm.io.github.deltamirror.logstore.SqlAuthorityLogStore(conf)
    actions = jvm.java.util.ArrayList()
    for line in lines:
        actions.add(line)
    path = jvm.org.apache.hadoop.fs.Path(f"file:{log_dir(location)}/{version:020d}.json")
    store.write(path, actions.iterator(), False, conf)


def append_rows(spark: Any, location: Path, ids: range, files: int = 1) -> None:
    df = spark.createDataFrame(
        [(i, f"u{i}", "XX") for i in ids], "event_id BIGINT, user STRING, country STRING"
    )
    df.repartition(files).write.format("delta").mode("append").save(str(location))


# ------------------------------------------------------------------------------------------------
# the round trip


def test_spark_operations_are_commits_of_the_store_published_byte_for_byte(
    spark: Any, store: SqlStore, store_url: str, tmp_path: Path
) -> None:
    root = tmp_path / "lake"
    location = root / "events"
    with commit_service(store_url, [root.as_uri()]) as svc, governed(spark, svc, spark_root(root)):
        result = run_pipeline(spark, str(location), str(SAMPLE), schema=SAMPLE_SCHEMA)
        from delta.tables import DeltaTable

        DeltaTable.forPath(spark, str(location)).update("country = 'US'", {"amount": "amount * 2"})

    assert result.versions == {"create": 0, "append": 1, "merge": 2, "delete": 3, "optimize": 4}
    assert operations(location) == ["CREATE TABLE", "WRITE", "MERGE", "DELETE", "OPTIMIZE", "UPDATE"]
    latest, rows = store_state(store, "events")
    assert latest == 5
    files = commit_files(location)
    assert sorted(files) == list(range(6))
    # every <v>.json holds exactly the bytes the store committed (and recorded the SHA-256 of)
    assert rows == [(v, hashlib.sha256(files[v]).hexdigest()) for v in range(6)]
    table = store.get_table("events")
    assert {r.source for r in store.commit_rows(table.id, 0, 5)} == {"spark"}
    for v in range(6):
        assert store.commit_bytes(table.id, v) == files[v]

    # the publisher finds every version already present: nothing to write, nothing to halt
    published = Publisher(store).publish("events")
    assert published.already_present == list(range(6))
    assert published.last_published == 5
    assert store.get_table("events").state == "ACTIVE"

    # the store's active files are deltalake's; deltalake, Spark (no authority) and the store agree
    from deltalake import DeltaTable as DLTable

    adds = DLTable(location.as_uri()).get_add_actions(flatten=True)
    import pyarrow as pa

    dl_files = set(pa.table(adds).column("path").to_pylist())
    # (deltalake hands back paths with non-ASCII characters decoded: compare decoded paths)
    assert {unquote(f.path) for f in store.active_files(table.id, 5)} == {unquote(p) for p in dl_files}
    assert spark_rows(spark, location) == deltalake_rows(location)
    assert len(spark_rows(spark, location)) == result.rows
    report = validate_table(store, "events")
    assert report.ok, report


def test_deletion_vectors_and_restore_written_by_spark_are_versions_of_the_store(
    spark: Any, tmp_path: Path
) -> None:
    store_url, store = sqlite_store(tmp_path)
    root = tmp_path / "lake"
    location = root / "dv"
    with commit_service(store_url, [root.as_uri()]) as svc, governed(spark, svc, spark_root(root)):
        run_pipeline(spark, str(location), str(SAMPLE), steps=("create", "append"), partition_by=())
        from delta.tables import DeltaTable

        DeltaTable.forPath(spark, str(location)).delete("event_id % 3 = 0")

    table = store.get_table("dv")
    latest = store.latest_version(table.id)
    assert latest == 2
    delete = [json.loads(line) for line in commit_files(location)[2].splitlines()]
    dv_adds = [a["add"] for a in delete if "add" in a and a["add"].get("deletionVector")]
    assert dv_adds, "DELETE with deletion vectors on writes an add carrying a deletion vector"
    active = store.active_files(table.id, latest)
    assert {(f.path, bool(f.dv_id)) for f in active} == {(a["path"], True) for a in dv_adds}
    assert [r[0] for r in deltalake_rows(location)] == [i for i in range(1, 25) if i % 3]

    # RESTORE commits through Delta's large-commit path (commitLarge): a version of the store too
    with commit_service(store_url, [root.as_uri()]) as svc, governed(spark, svc, spark_root(root)):
        from delta.tables import DeltaTable

        DeltaTable.forPath(spark, str(location)).restoreToVersion(1)
    assert store.latest_version(table.id) == 3
    assert operations(location)[3] == "RESTORE"
    assert [r[0] for r in deltalake_rows(location)] == list(range(1, 25))
    assert Publisher(store).publish("dv").already_present == [0, 1, 2, 3]
    assert validate_table(store, "dv").ok


def pointer_version(location: Path) -> int | None:
    path = log_dir(location) / "_last_checkpoint"
    return int(json.loads(path.read_text())["version"]) if path.exists() else None


def test_spark_checkpoints_are_kept_and_the_publisher_alone_moves_last_checkpoint_forward(
    spark: Any, tmp_path: Path
) -> None:
    store_url, store = sqlite_store(tmp_path)
    root = tmp_path / "lake"
    location = root / "cp"
    seen: list[int] = []
    with commit_service(store_url, [root.as_uri()]) as svc:
        for batch in (range(0, 12), range(12, 22)):
            with governed(spark, svc, spark_root(root)):
                for n in batch:  # Spark checkpoints itself at versions 10 and 20
                    append_rows(spark, location, range(n * 10, n * 10 + 10))
            last = batch[-1]
            assert (log_dir(location) / f"{last // 10 * 10:020d}.checkpoint.parquet").exists()
            result = Publisher(store).publish("cp")
            assert result.already_present == list(batch)
            table = store.get_table("cp")
            assert table.state == "ACTIVE"  # Spark's checkpoint files never make a CONFLICT
            recorded = store.last_checkpoint_version(table.id)
            assert recorded is not None and pointer_version(location) == recorded
            seen.append(recorded)
            report = validate_table(store, "cp")
            assert report.ok, report  # every recorded checkpoint is there, complete
            rows = (last + 1) * 10
            assert spark.read.format("delta").load(str(location)).count() == rows
            from deltalake import DeltaTable

            assert DeltaTable(location.as_uri()).to_pyarrow_table().num_rows == rows
    assert seen == sorted(seen) and seen[-1] > seen[0]


def test_last_checkpoint_describes_the_checkpoint_file_spark_wrote_when_the_publisher_keeps_it(
    spark: Any, tmp_path: Path
) -> None:
    """Spark checkpoints itself at version 10; the publisher's checkpoint at 10 finds that file and
    keeps it: the pointer it writes then states that file's bytes, actions and adds, not its own."""
    import pyarrow.parquet as pq

    store_url, store = sqlite_store(tmp_path)
    root = tmp_path / "lake"
    location = root / "sp"
    with commit_service(store_url, [root.as_uri()]) as svc, governed(spark, svc, spark_root(root)):
        for n in range(11):
            append_rows(spark, location, range(n * 10, n * 10 + 10), files=1 + n % 3)
    spark_file = log_dir(location) / f"{10:020d}.checkpoint.parquet"
    spark_bytes = spark_file.read_bytes()
    Publisher(store).publish("sp")
    assert store.last_checkpoint_version(store.get_table("sp").id) == 10  # the publisher's own, at 10
    assert spark_file.read_bytes() == spark_bytes  # kept, never overwritten

    pointer = json.loads((log_dir(location) / "_last_checkpoint").read_text())
    table = pq.read_table(spark_file)
    adds = table.num_rows - table.column("add").null_count
    assert pointer["version"] == 10
    assert pointer["sizeInBytes"] == len(spark_bytes) == spark_file.stat().st_size
    assert (pointer["size"], pointer["numOfAddFiles"]) == (table.num_rows, adds)
    assert adds == sum(1 + n % 3 for n in range(11))  # every file appended is active
    assert "parts" not in pointer and validate_table(store, "sp").ok


# ------------------------------------------------------------------------------------------------
# faults


def test_a_service_killed_mid_job_is_waited_for_and_no_version_is_lost(spark: Any, tmp_path: Path) -> None:
    store_url, store = sqlite_store(tmp_path)
    root = tmp_path / "lake"
    location = root / "flaky"
    with commit_service(store_url, [root.as_uri()]) as svc, governed(spark, svc, spark_root(root)):
        append_rows(spark, location, range(0, 5))
        append_rows(spark, location, range(5, 10))
        svc.kill()
        restarter = threading.Timer(3.0, svc.start)
        restarter.start()
        try:
            append_rows(spark, location, range(10, 15))  # waits (bounded backoff) for the restart
        finally:
            restarter.join()
        append_rows(spark, location, range(15, 20))
    latest, rows = store_state(store, "flaky")
    assert latest == 3
    files = commit_files(location)
    assert rows == [(v, hashlib.sha256(files[v]).hexdigest()) for v in range(4)]
    assert spark.read.format("delta").load(str(location)).count() == 20


# ------------------------------------------------------------------------------------------------
# refusals leave SQL and _delta_log/ unchanged


def test_refused_commits_leave_the_store_and_the_log_unchanged(spark: Any, tmp_path: Path) -> None:
    store_url, store = sqlite_store(tmp_path)
    root = tmp_path / "lake"
    location = root / "guarded"
    with commit_service(store_url, [root.as_uri()], extra_args=["--max-body-bytes", "6000"]) as svc:
        with governed(spark, svc, spark_root(root)):
            append_rows(spark, location, range(0, 3))
        before = (store_state(store, "guarded"), commit_files(location))

        def unchanged() -> None:
            assert (store_state(store, "guarded"), commit_files(location)) == before

        # a wrong token: 401, nothing committed
        with governed(spark, svc, spark_root(root), token="not-the-token"):
            text = fails_with(lambda: append_rows(spark, location, range(3, 6)), "401")
        assert "not-the-token" not in text and svc.token not in text
        unchanged()
        # an oversized commit (many files: a long commit JSON): 413
        with governed(spark, svc, spark_root(root)):
            fails_with(lambda: append_rows(spark, location, range(100, 400), files=40), "413")
        unchanged()
        # a halted table: 423
        table = store.get_table("guarded")
        store.halt_table(table.id, "halted by the test", None)
        with governed(spark, svc, spark_root(root)):
            fails_with(lambda: append_rows(spark, location, range(3, 6)), "halted")
        unchanged()
        store.resume_table(table.id)
        # the catalogManaged table feature: Delta-Spark refuses to add it to a path-based table
        # itself, so the commit is handed to the session's LogStore directly: the store refuses it
        with governed(spark, svc, spark_root(root)):
            fails_with(
                lambda: spark.sql(
                    f"ALTER TABLE delta.`{location}` SET TBLPROPERTIES ('delta.feature.catalogManaged' = 'supported')"
                ),
                "CatalogOwned",
            )
            protocol = action(
                "protocol", protocol_body(3, 7, ["catalogManaged"], ["catalogManaged", "inCommitTimestamp"])
            )
            text = fails_with(
                lambda: logstore_write(
                    spark, location, 1, [json.dumps({"commitInfo": {"timestamp": 1}}), json.dumps(protocol)]
                ),
                "422",
                "catalogManaged",
            )
        unchanged()
        # and the table still takes ordinary commits afterwards
        with governed(spark, svc, spark_root(root)):
            append_rows(spark, location, range(3, 6))
        assert store_state(store, "guarded")[0] == 1


def test_a_rogue_writer_without_the_logstore_is_refused_then_reported_as_a_store_behind_its_log(
    spark: Any, tmp_path: Path
) -> None:
    """A ``<v>.json`` at the store's next version that the store never had: from storage alone that
    is a writer outside the authority or a store that lost the version (a failover, a restore: issue
    40). Either way nothing more is acknowledged and reconcile says so, naming ``recover`` (adopt
    it) without halting; docs/recovery.md says what to do when no failover or restore happened."""
    store_url, store = sqlite_store(tmp_path)
    root = tmp_path / "lake"
    location = root / "rogue"
    with commit_service(store_url, [root.as_uri()]) as svc:
        with governed(spark, svc, spark_root(root)):
            append_rows(spark, location, range(0, 3))
            append_rows(spark, location, range(3, 6))
        append_rows(spark, location, range(6, 9))  # a session without the LogStore: writes 2.json itself
        assert sorted(commit_files(location)) == [0, 1, 2]
        with governed(spark, svc, spark_root(root)):
            text = fails_with(lambda: append_rows(spark, location, range(9, 12)), "422")
        assert "store behind published log by 1 version (failover or restore?)" in text, text[:2000]
        assert "delta-mirror recover rogue" in text, text[:2000]
    assert store_state(store, "rogue")[0] == 1
    report = reconcile(store, ["rogue"], strategy="full")
    (entry,) = report.tables
    assert entry.action == "failed", report
    assert "store behind published log by 1 version (failover or restore?)" in (entry.error or ""), report
    assert "delta-mirror recover rogue" in (entry.error or ""), report
    assert store_state(store, "rogue")[0] == 1  # nothing adopted without the operator


def test_a_spark_job_after_the_store_lost_its_tail_is_told_to_recover_then_goes_on(
    spark: Any, tmp_path: Path
) -> None:
    """What an asynchronous failover (or a restore) does to a Delta-Spark writer, made exact: the
    store goes back to a backup taken at version 1 while 2..3 stay published (the LogStore wrote
    them after the service's answers). The job lists the log, asks for 4 and is refused in one
    line naming ``delta-mirror recover``; nothing is acknowledged. After ``recover`` the same job
    appends as version 4, byte for byte in the store, and readers see every row."""
    store_url, store = sqlite_store(tmp_path)
    db = Path(store_url.removeprefix("sqlite:///"))
    backup = tmp_path / "backup-at-1.db"
    root = tmp_path / "lake"
    location = root / "lost"
    with commit_service(store_url, [root.as_uri()]) as svc, governed(spark, svc, spark_root(root)):
        append_rows(spark, location, range(0, 3))
        append_rows(spark, location, range(3, 6))
        with (
            contextlib.closing(sqlite3.connect(db)) as src,
            contextlib.closing(sqlite3.connect(backup)) as dst,
        ):
            src.backup(dst)
        append_rows(spark, location, range(6, 9))
        append_rows(spark, location, range(9, 12))
        with (
            contextlib.closing(sqlite3.connect(backup)) as src,
            contextlib.closing(sqlite3.connect(db)) as dst,
        ):
            src.backup(dst)  # the store is back at version 1; 2.json and 3.json are published
        assert store_state(store, "lost")[0] == 1
        text = fails_with(lambda: append_rows(spark, location, range(12, 15)), "422")
        assert "store behind published log by 2 versions (failover or restore?)" in text, text[:2000]
        assert "delta-mirror recover lost" in text, text[:2000]
        assert store_state(store, "lost")[0] == 1 and sorted(commit_files(location)) == [0, 1, 2, 3]
        done = subprocess.run(
            [cli_path(), "--store", store_url, "recover", "lost"], capture_output=True, text=True, check=False
        )
        assert done.returncode == 0, done.stderr
        assert "adopted versions 2..3" in done.stdout
        append_rows(spark, location, range(12, 15))
    latest, rows = store_state(store, "lost")
    files = commit_files(location)
    assert latest == 4 and sorted(files) == [0, 1, 2, 3, 4]
    assert rows == [(v, hashlib.sha256(files[v]).hexdigest()) for v in range(5)]
    from deltalake import DeltaTable, QueryBuilder

    read = QueryBuilder().register("t", DeltaTable(location.as_uri())).execute("select event_id from t")
    assert sorted(read.read_all().column("event_id").to_pylist()) == list(range(15))


def test_the_service_answers_for_a_table_spark_created_under_an_allowed_root(
    spark: Any, tmp_path: Path
) -> None:
    store_url, _ = sqlite_store(tmp_path)
    root = tmp_path / "lake"
    location = root / "fresh"
    with commit_service(store_url, [root.as_uri()]) as svc, governed(spark, svc, spark_root(root)):
        append_rows(spark, location, range(3))
        deadline = time.monotonic() + load_scaled(5)
        answer = svc.latest(f"file:{location}").json()
        while answer.get("version") != 0 and time.monotonic() < deadline:
            answer = svc.latest(f"file:{location}").json()
    assert answer == {"table": "fresh", "version": 0}


# ------------------------------------------------------------------------------------------------
# separate writer processes (their own JVMs)


def test_writer_processes_race_blind_appends_onto_contiguous_versions_and_conflicting_dml_fails_once(
    spark: Any, pg_store_url: str, tmp_path: Path
) -> None:
    store = SqlStore(pg_store_url)
    store.init()
    root = tmp_path / "lake"
    location = root / "race"
    sync = tmp_path / "sync"
    sync.mkdir()
    with commit_service(pg_store_url, [root.as_uri()]) as svc:
        with governed(spark, svc, spark_root(root)):
            append_rows(spark, location, range(0, 30))
        phases = {
            "a": [
                {"name": "appends", "ops": [{"kind": "append", "start": 100 + 10 * i} for i in range(4)]},
                {"name": "dml", "ops": [{"kind": "delete", "where": "event_id < 10"}]},
            ],
            "b": [
                {"name": "appends", "ops": [{"kind": "append", "start": 200 + 10 * i} for i in range(4)]},
                {"name": "dml", "ops": [{"kind": "update", "where": "event_id < 10", "user": "b"}]},
            ],
        }
        # each POST waits 2 s first: both DML statements read the same snapshot before either commits
        writers = [
            WriterProcess(
                n, svc, f"file:{location}", [spark_root(root)], sync, p, failpoint="delay-before-commit:2000"
            )
            for n, p in phases.items()
        ]
        try:
            for phase in ("appends", "dml"):
                for w in writers:
                    w.wait_ready(phase)
                go(sync, phase)
                outcomes = {w.name: w.result(phase) for w in writers}
                if phase == "appends":
                    assert outcomes == {"a": ["ok"] * 4, "b": ["ok"] * 4}
                    latest, rows = store_state(store, "race")
                    files = commit_files(location)
                    assert latest == 8 and sorted(files) == list(range(9))
                    assert rows == [(v, hashlib.sha256(files[v]).hexdigest()) for v in range(9)]
            assert [w.wait() for w in writers] == [0, 0]
        finally:
            for w in writers:
                w.kill()
    # exactly one DML won version 9; the other got Delta's own conflict exception
    failed = [o[0] for o in outcomes.values() if o != ["ok"]]
    assert len(failed) == 1 and failed[0].startswith("Concurrent"), outcomes
    winner = "DELETE" if outcomes["a"] == ["ok"] else "UPDATE"
    latest, _ = store_state(store, "race")
    assert latest == 9
    assert operations(location)[9] == winner
    assert Publisher(store).publish("race").already_present == list(range(10))
    assert validate_table(store, "race").ok


def test_a_writer_killed_after_the_store_committed_is_recovered_by_listing_and_by_mirror_alone(
    spark: Any, tmp_path: Path
) -> None:
    import subprocess

    store_url, store = sqlite_store(tmp_path)
    root = tmp_path / "lake"
    sync = tmp_path / "sync"
    sync.mkdir()
    tables = {"by_listing": root / "by_listing", "by_mirror": root / "by_mirror"}
    with commit_service(store_url, [root.as_uri()]) as svc:
        with governed(spark, svc, spark_root(root)):
            for location in tables.values():
                append_rows(spark, location, range(0, 3))
        phase = [{"name": "crash", "ops": [{"kind": "append", "start": 3}]}]
        writers = [
            WriterProcess(
                n, svc, f"file:{loc}", [spark_root(root)], sync, phase, failpoint="halt-after-commit"
            )
            for n, loc in tables.items()
        ]
        try:
            for w in writers:
                w.wait_ready("crash")
            go(sync, "crash")
            for w in writers:
                w.wait()  # the JVM halted itself between the SQL insert and the file write
        finally:
            for w in writers:
                w.kill()
        for name, location in tables.items():
            assert store_state(store, name)[0] == 1
            assert sorted(commit_files(location)) == [0], f"{name}: 1.json must be missing after the crash"

        # 1. the next listing by any governed writer or reader writes the missing version
        with governed(spark, svc, spark_root(root)):
            assert spark.read.format("delta").load(str(tables["by_listing"])).count() == 6
    # 2. `delta-mirror mirror` alone (no Spark, no service) publishes it from the store
    done = subprocess.run(
        [cli_path(), "--store", store_url, "mirror", "by_mirror"], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    for name, location in tables.items():
        table = store.get_table(name)
        files = commit_files(location)
        assert sorted(files) == [0, 1]
        assert files[1] == store.commit_bytes(table.id, 1)
        assert hashlib.sha256(files[1]).hexdigest() == store_state(store, name)[1][1][1]
        assert spark.read.format("delta").load(str(location)).count() == 6


def test_spark_commits_to_an_s3_table_through_s3a_are_commits_of_the_store(
    spark: Any, s3: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import boto3

    from delta_mirror.spark.s3a import configure_s3a

    for k, v in s3.env().items():
        monkeypatch.setenv(k, v)
    bucket = s3.make_bucket()
    options = s3.env()
    store_url, store = sqlite_store(tmp_path)
    uri = configure_s3a(spark, f"s3://{bucket}/sales", options)
    with commit_service(store_url, [f"s3://{bucket}/"]) as svc, governed(spark, svc, f"s3a://{bucket}/"):
        run_pipeline(spark, uri, str(SAMPLE), steps=("create", "append", "merge", "delete"))
    table = store.get_table("sales")
    assert table.location == f"s3://{bucket}/sales"
    latest, rows = store_state(store, "sales")
    assert latest == 3
    client = boto3.client(
        "s3",
        endpoint_url=options["AWS_ENDPOINT_URL"],
        aws_access_key_id=options["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=options["AWS_SECRET_ACCESS_KEY"],
        region_name=options.get("AWS_REGION", "us-east-1"),
    )
    for version, digest in rows:
        body = client.get_object(Bucket=bucket, Key=f"sales/_delta_log/{version:020d}.json")["Body"].read()
        assert hashlib.sha256(body).hexdigest() == digest
    result = Publisher(store, storage_options=options).publish("sales")
    assert result.already_present == [0, 1, 2, 3]
    report = validate_table(store, "sales", storage_options=options)
    assert report.ok, report
    import pyarrow as pa
    from deltalake import DeltaTable, QueryBuilder

    dt = DeltaTable(f"s3://{bucket}/sales", storage_options=options)
    counted = pa.table(QueryBuilder().register("t", dt).execute("select count(*) as n from t"))
    assert spark.read.format("delta").load(uri).count() == counted.column("n")[0].as_py() > 0
