"""Validation: the published log and a real reader's view are compared with the SQL store.

Tables are built through the real code (store commit → publisher) on both stores and both kinds of
location; faults are then injected into ``_delta_log/`` the way an operator or a foreign writer
would, and each must come back as one specific, actionable problem.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pyarrow as pa
import pytest
from support.builders import add_body, metadata_body, protocol_body

from delta_mirror.delta.actions import Action
from delta_mirror.delta.checkpoint import CheckpointInput, build_checkpoint
from delta_mirror.delta.log_path import LAST_CHECKPOINT, LOG_DIR, checkpoint_name, commit_name
from delta_mirror.dev.datafiles import delta_schema_string, write_data_file
from delta_mirror.errors import PermanentError
from delta_mirror.jobs.importer import import_table
from delta_mirror.jobs.publisher import Publisher
from delta_mirror.jobs.validate import Problem, ValidationReport, validate_table
from delta_mirror.storage import ObjectStore, local_path, open_store
from delta_mirror.store.sql_store import SqlStore

NAME = "events"
SCHEMA = pa.schema([("id", pa.int64()), ("country", pa.string()), ("day", pa.date32())])
PROTOCOL: Action = ("protocol", protocol_body())
METADATA: Action = (
    "metaData",
    metadata_body(
        id="0f6f1c7e-7a4e-4a53-9d43-6a3c1f0e2b11",
        schema_string=delta_schema_string(SCHEMA),
        partition_columns=["country", "day"],
        configuration={"delta.appendOnly": "false"},
        created_time=1_700_000_000_000,
    ),
)


def _add(location: str, n: int, country: str, day: str) -> Action:
    """An add of a real Parquet file (local tables) or of a file only the log knows (S3)."""
    values: dict[str, str | None] = {"country": country, "day": day}
    root = local_path(location)
    if root is not None:
        data = pa.table({"id": pa.array([n], pa.int64())})
        return ("add", write_data_file(root, data, values))
    path = quote(f"country={country}/day={day}/part-{n:05d}.snappy.parquet", safe="/=-_.~")
    return (
        "add",
        add_body(
            path,
            size=400 + n,
            partitionValues=values,
            modificationTime=1_700_000_000_000 + n,
            stats=json.dumps({"numRecords": 1}),
        ),
    )


def _remove(add: Action) -> Action:
    body = add[1]
    return (
        "remove",
        {
            "path": body["path"],
            "deletionTimestamp": 1_700_000_100_000,
            "dataChange": True,
            "partitionValues": body["partitionValues"],
            "size": body["size"],
        },
    )


def _published_table(store: SqlStore, location: str) -> SqlStore:
    """Versions 0..3: create with two files, append with a txn, replace a file, append again."""
    store.create_table(NAME, location)
    first = _add(location, 0, "a b", "2024-01-01")  # a space: the path is percent-encoded
    store.commit(NAME, [PROTOCOL, METADATA, first, _add(location, 1, "ü%", "2024-01-02")])
    store.commit(NAME, [_add(location, 2, "fr", "2024-01-02"), ("txn", {"appId": "loader", "version": 7})])
    store.commit(NAME, [_remove(first), _add(location, 3, "a b", "2024-01-03")])
    store.commit(NAME, [_add(location, 4, "fr", "2024-01-04"), ("txn", {"appId": "loader", "version": 8})])
    Publisher(store).publish(NAME)
    return store


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'store.db'}"


@pytest.fixture
def table(sqlite_url: str, table_location: str) -> tuple[SqlStore, ObjectStore]:
    """A published table on a SQLite store, at a local folder or on S3."""
    store = SqlStore(sqlite_url)
    store.init()
    _published_table(store, table_location)
    return store, open_store(table_location)


def _log(version: int) -> str:
    return f"{LOG_DIR}/{commit_name(version)}"


def _kinds(report: ValidationReport) -> list[str]:
    return [p.kind for p in report.problems]


def _only(report: ValidationReport, kind: str) -> Problem:
    found = [p for p in report.problems if p.kind == kind]
    assert len(found) == 1, report.problems
    return found[0]


# -- clean tables ------------------------------------------------------------------------------------


def test_a_published_table_validates_ok(store_url: str, table_location: str) -> None:
    store = SqlStore(store_url)
    store.init()
    _published_table(store, table_location)

    report = validate_table(store, NAME)

    assert report.problems == []
    assert report.ok
    assert (report.from_version, report.to_version, report.versions_checked) == (0, 3, 4)
    assert report.to_json() == {
        "table": NAME,
        "location": table_location,
        "from_version": 0,
        "to_version": 3,
        "versions_checked": 4,
        "ok": True,
        "problems": [],
        "limitations": [],
        "fallbacks": [],
    }


def test_a_checkpointed_table_validates_ok(store_url: str, table_location: str) -> None:
    store = SqlStore(store_url)
    store.init()
    _published_table(store, table_location)
    assert Publisher(store).checkpoint(NAME) == 3
    store.commit(NAME, [_add(table_location, 5, "de", "2024-01-05")])
    Publisher(store).publish(NAME)

    report = validate_table(store, NAME)

    assert report.problems == []
    assert report.to_version == 4
    assert open_store(table_location).head(f"{LOG_DIR}/{checkpoint_name(3)}") is not None


def test_a_sub_range_validates_only_those_versions(table: tuple[SqlStore, ObjectStore]) -> None:
    store, _ = table
    report = validate_table(store, NAME, from_version=2, to_version=3)
    assert report.ok, report.problems
    assert (report.from_version, report.to_version, report.versions_checked) == (2, 3, 2)


def test_stray_files_in_the_log_folder_are_ignored(table: tuple[SqlStore, ObjectStore]) -> None:
    store, objects = table
    for stray in (
        ".00000000000000000000.json.crc",
        "00000000000000000003.json.tmp",
        "info.txt",
        "_commits/00000000000000000004.abc.json",
    ):
        objects.put(f"{LOG_DIR}/{stray}", b"junk")
    assert validate_table(store, NAME).problems == []


# -- the log listing -----------------------------------------------------------------------------


def test_a_deleted_commit_is_reported_as_missing_commit(table: tuple[SqlStore, ObjectStore]) -> None:
    store, objects = table
    objects.delete(_log(2))

    report = validate_table(store, NAME)

    problem = _only(report, "missing_commit")
    assert problem.version == 2
    assert commit_name(2) in problem.message
    assert "PENDING" in problem.hint
    assert "reader_error" in _kinds(report)  # deltalake cannot read past the gap either


def test_a_replaced_commit_is_reported_as_hash_mismatch_with_both_hashes(
    table: tuple[SqlStore, ObjectStore],
) -> None:
    store, objects = table
    original = objects.get(_log(1))
    assert original is not None
    forged = original.replace(b'"version":7', b'"version":9')
    objects.put(_log(1), forged)

    report = validate_table(store, NAME)

    problem = _only(report, "hash_mismatch")
    assert problem.version == 1
    assert hashlib.sha256(forged).hexdigest() in problem.message
    assert hashlib.sha256(original).hexdigest() in problem.message
    # The reader sees the forged txn version too, at every version until the next txn.
    txn = [p for p in report.problems if p.kind == "reader_txn"]
    assert [p.version for p in txn] == [1, 2]
    assert "version 9" in txn[0].message and "store 7" in txn[0].message


def test_a_commit_after_the_latest_version_is_reported_as_external_commit(
    table: tuple[SqlStore, ObjectStore],
) -> None:
    store, objects = table
    foreign = b'{"commitInfo":{"operation":"WRITE","engineInfo":"Apache-Spark/4.0"}}\n'
    objects.put_if_absent(_log(4), foreign)

    report = validate_table(store, NAME)

    problem = _only(report, "external_commit")
    assert problem.version == 4
    assert "latest version is 3" in problem.message
    assert "another writer" in problem.hint


def test_a_run_of_foreign_commits_is_one_external_commit_problem(table: tuple[SqlStore, ObjectStore]) -> None:
    store, objects = table
    for version in (4, 5, 6):
        objects.put_if_absent(_log(version), b'{"commitInfo":{"operation":"WRITE"}}\n')

    problem = _only(validate_table(store, NAME), "external_commit")
    assert problem.version == 4
    assert "versions 4..6" in problem.message


def test_a_foreign_file_at_a_committed_but_unpublished_version_is_an_external_commit(
    table: tuple[SqlStore, ObjectStore],
) -> None:
    store, objects = table
    store.commit(NAME, [_add(store.get_table(NAME).location, 9, "fr", "2024-02-01")])  # version 4, pending
    objects.put_if_absent(_log(4), b'{"commitInfo":{"operation":"WRITE"}}\n')

    report = validate_table(store, NAME)

    problem = _only(report, "external_commit")
    assert problem.version == 4
    assert "PENDING" in problem.message
    assert report.to_version == 3  # the default range ends at the last published version


def test_our_own_bytes_at_an_unpublished_version_are_not_a_problem(
    table: tuple[SqlStore, ObjectStore],
) -> None:
    """A publisher that crashed between the write and recording SUCCESS leaves exactly this."""
    store, objects = table
    store.commit(NAME, [_add(store.get_table(NAME).location, 9, "fr", "2024-02-01")])
    table_id = store.get_table(NAME).id
    objects.put_if_absent(_log(4), store.commit_bytes(table_id, 4))

    assert validate_table(store, NAME).problems == []


def test_a_checkpoint_at_an_unknown_version_is_reported_as_unknown_file(
    table: tuple[SqlStore, ObjectStore],
) -> None:
    store, objects = table
    objects.put(f"{LOG_DIR}/{checkpoint_name(10)}", b"PAR1")

    problem = _only(validate_table(store, NAME), "unknown_file")
    assert problem.version == 10
    assert checkpoint_name(10) in problem.message


def test_history_below_the_first_version_is_not_unknown(tmp_path: Path, corpus_dir: Path) -> None:
    """An imported table that starts at a checkpoint keeps older log files around: that is fine."""
    source = corpus_dir / "delta-rs" / "checkpoints_vacuumed"
    table_dir = tmp_path / "vacuumed"
    shutil.copytree(source, table_dir)
    store = SqlStore(f"sqlite:///{tmp_path / 'store.db'}")
    store.init()
    result = import_table(store, str(table_dir), name="vacuumed")
    assert result.start_version == 5
    older = (table_dir / "_delta_log" / commit_name(5)).read_bytes()
    (table_dir / "_delta_log" / commit_name(4)).write_bytes(older)  # history the store never saw

    report = validate_table(store, "vacuumed")

    assert report.problems == []
    assert report.from_version == store.get_table("vacuumed").base_checkpoint_version


# -- checkpoints and _last_checkpoint --------------------------------------------------------------


@pytest.fixture
def checkpointed(table: tuple[SqlStore, ObjectStore]) -> tuple[SqlStore, ObjectStore]:
    store, objects = table
    Publisher(store).checkpoint(NAME, 2)
    return store, objects


def test_last_checkpoint_with_parts_1_is_reported(checkpointed: tuple[SqlStore, ObjectStore]) -> None:
    store, objects = checkpointed
    info = json.loads(objects.get(f"{LOG_DIR}/{LAST_CHECKPOINT}") or b"")
    objects.put(f"{LOG_DIR}/{LAST_CHECKPOINT}", json.dumps({**info, "parts": 1}).encode())

    problem = _only(validate_table(store, NAME), "bad_last_checkpoint")
    assert problem.version == 2
    assert '"parts":1' in problem.message
    assert "Trino" in problem.hint


def test_last_checkpoint_pointing_at_a_missing_checkpoint_is_reported(
    checkpointed: tuple[SqlStore, ObjectStore],
) -> None:
    store, objects = checkpointed
    objects.put(f"{LOG_DIR}/{LAST_CHECKPOINT}", b'{"version":1,"size":4}')

    report = validate_table(store, NAME)

    messages = [p.message for p in report.problems if p.kind == "bad_last_checkpoint"]
    assert any("points at a checkpoint at version 1" in m for m in messages), report.problems
    assert any("older than the store's newest checkpoint 2" in m for m in messages), report.problems
    assert set(_kinds(report)) == {"bad_last_checkpoint"}


def test_last_checkpoint_that_is_not_json_is_reported(checkpointed: tuple[SqlStore, ObjectStore]) -> None:
    store, objects = checkpointed
    objects.put(f"{LOG_DIR}/{LAST_CHECKPOINT}", b'{"version":2,')
    assert "not valid JSON" in _only(validate_table(store, NAME), "bad_last_checkpoint").message


def test_a_deleted_checkpoint_is_reported_as_missing_checkpoint(
    checkpointed: tuple[SqlStore, ObjectStore],
) -> None:
    store, objects = checkpointed
    objects.delete(f"{LOG_DIR}/{checkpoint_name(2)}")

    report = validate_table(store, NAME)

    assert _only(report, "missing_checkpoint").version == 2
    assert _only(report, "bad_last_checkpoint").version == 2  # it points at the deleted file
    assert set(_kinds(report)) == {"missing_checkpoint", "bad_last_checkpoint"}


def test_a_checkpoint_that_lost_a_file_and_a_txn_is_caught_by_the_reader(
    checkpointed: tuple[SqlStore, ObjectStore],
) -> None:
    """The checkpoint is read by deltalake on its own, not only replayed through the commits."""
    store, objects = checkpointed
    t = store.get_table(NAME)
    snap = store.snapshot(t.id, 2)
    adds = [line for batch in store.iter_active_add_lines(t.id, 2) for line in batch]
    wrong = build_checkpoint(
        CheckpointInput(
            version=2,
            protocol=snap.protocol,
            metadata=snap.metadata,
            txns=[],
            domain_metadata=[],
            adds=adds[1:],
            removes=[],
        )
    )
    objects.put(f"{LOG_DIR}/{checkpoint_name(2)}", wrong.files[-1].data)  # a hand-made "repair"

    report = validate_table(store, NAME)

    files = [p for p in report.problems if p.kind == "reader_files"]
    assert [p.version for p in files] == [2, 3]  # version 3 builds on the broken checkpoint
    assert "read from its checkpoint" in files[0].message
    assert "1 missing from the reader" in files[0].message
    txn = _only(report, "reader_txn")  # version 3 sets the txn again
    assert txn.version == 2 and "None" in txn.message
    assert set(_kinds(report)) == {"reader_files", "reader_txn"}  # the log listing itself is fine


# -- the reader's view -------------------------------------------------------------------------------


def test_metadata_changed_in_a_commit_file_is_caught_by_the_reader(
    table: tuple[SqlStore, ObjectStore],
) -> None:
    store, objects = table
    original = objects.get(_log(0)) or b""
    objects.put(_log(0), original.replace(b'"delta.appendOnly":"false"', b'"delta.appendOnly":"true"'))

    report = validate_table(store, NAME)

    assert _only(report, "hash_mismatch").version == 0
    metadata = [p for p in report.problems if p.kind == "reader_metadata"]
    assert [p.version for p in metadata] == [0, 1, 2, 3]
    assert "configuration" in metadata[0].message and "'true'" in metadata[0].message


def test_a_partition_value_changed_in_a_commit_file_is_caught_by_the_reader(
    table: tuple[SqlStore, ObjectStore],
) -> None:
    store, objects = table
    original = objects.get(_log(3)) or b""
    assert b'"day":"2024-01-04"' in original
    objects.put(_log(3), original.replace(b'"day":"2024-01-04"', b'"day":"2024-01-05"'))

    report = validate_table(store, NAME)

    assert _only(report, "hash_mismatch").version == 3
    files = _only(report, "reader_files")
    assert files.version == 3
    assert "1 with a different size or partition values" in files.message
    assert "2024-01-04" in files.message and "2024-01-05" in files.message


def test_deletion_vectors_are_compared_by_file_and_deleted_row_count(
    tmp_path: Path, corpus_dir: Path
) -> None:
    table_dir = tmp_path / "dv"
    shutil.copytree(corpus_dir / "delta-rs" / "table-with-dv-small", table_dir)
    store = SqlStore(f"sqlite:///{tmp_path / 'store.db'}")
    store.init()
    import_table(store, str(table_dir), name="dv")  # in place: the commits are adopted as published
    assert validate_table(store, "dv").problems == []

    log = table_dir / "_delta_log" / commit_name(1)
    log.write_bytes(re.sub(rb',"deletionVector":\{[^}]*\}', b"", log.read_bytes()))  # the DV is "lost"

    report = validate_table(store, "dv")

    assert _only(report, "hash_mismatch").version == 1
    dv = [p for p in report.problems if p.kind == "reader_files" and "deletion vectors differ" in p.message]
    assert [p.version for p in dv] == [1]
    assert "1 files have one only in the store" in dv[0].message


def test_a_table_deltalake_cannot_open_is_one_reader_error(table: tuple[SqlStore, ObjectStore]) -> None:
    store, objects = table
    for version in range(4):
        objects.delete(_log(version))

    report = validate_table(store, NAME)

    missing = _only(report, "missing_commit")
    assert missing.version == 0 and "versions 0..3" in missing.message
    error = _only(report, "reader_error")
    assert error.version is None and "cannot open" in error.message and error.hint


# -- arguments -------------------------------------------------------------------------------------


def test_the_spark_reader_reads_local_and_s3_tables_only(sqlite_url: str) -> None:
    """(The Spark reader itself is tested in tests/spark, with one shared SparkSession.)"""
    store = SqlStore(sqlite_url)
    store.init()
    store.create_table(NAME, "gs://no-such-bucket/table")
    with pytest.raises(PermanentError, match="reads local and S3 tables"):
        validate_table(store, NAME, reader="spark")


@pytest.mark.parametrize(
    ("bounds", "message"),
    [
        ({"to_version": 4}, "outside the published versions 0..3"),
        ({"from_version": 3, "to_version": 1}, "empty version range"),
    ],
)
def test_a_range_outside_the_published_versions_is_refused(
    table: tuple[SqlStore, ObjectStore],
    bounds: dict[str, Any],
    message: str,
) -> None:
    store, _ = table
    with pytest.raises(PermanentError, match=message):
        validate_table(store, NAME, **bounds)


def test_a_table_with_nothing_published_is_refused(sqlite_url: str, tmp_path: Path) -> None:
    store = SqlStore(sqlite_url)
    store.init()
    location = (tmp_path / "t").as_uri()
    store.create_table(NAME, location)
    store.commit(NAME, [PROTOCOL, METADATA])
    with pytest.raises(PermanentError, match="nothing is published yet") as caught:
        validate_table(store, NAME)
    message = caught.value.message
    assert "the publisher" in message and "versions 0..0 are committed in the store" in message
    assert f"run the publisher first: `delta-mirror mirror {NAME}`" in message
