"""Native commits and the Delta rules: contiguous versions, canonical bytes, refusals, concurrency."""

from __future__ import annotations

import hashlib
import itertools
import json
import threading
from contextlib import closing
from pathlib import Path

import pytest
from sqlalchemy import select
from store.store_kit import (
    Action,
    add,
    inline_dv,
    metadata,
    new_table,
    protocol,
    remove,
    spark_file,
    state,
    v0_file,
    versions,
)
from support.race import race

from delta_mirror.errors import CommitConflictError, DataError, InvalidActionError
from delta_mirror.store import SqlStore
from delta_mirror.store.schema import dl_commits

# -- commits -----------------------------------------------------------------------------------------


def test_commits_get_contiguous_versions_from_zero(store: SqlStore, location: str) -> None:
    table_id = new_table(store, location)
    for i in range(1, 6):
        assert store.commit("t", [add(f"f{i}.parquet")]) == i
    assert store.commit("t", [add("g.parquet")], expected_version=6) == 6
    assert versions(store, table_id) == list(range(7))
    assert store.latest_version(table_id) == 6


def test_the_first_commit_needs_protocol_and_metadata(store: SqlStore, location: str) -> None:
    store.create_table("t", location)
    before = state(store)
    with pytest.raises(InvalidActionError, match="needs a 'protocol'"):
        store.commit("t", [metadata(), add("a")])
    assert state(store) == before


def test_each_commit_records_the_sha256_and_size_of_its_canonical_bytes(
    store: SqlStore, location: str
) -> None:
    table_id = new_table(store, location)
    store.commit("t", [add("é/ü.parquet", stats='{"numRecords":1}')])
    store.commit("t", [remove("a.parquet"), ("txn", {"appId": "app", "version": 1})])
    rows = store.commit_rows(table_id, 0, 2)
    assert [r.version for r in rows] == [0, 1, 2]
    for row in rows:
        data = store.commit_bytes(table_id, row.version)
        assert row.sha256 == hashlib.sha256(data).hexdigest()
        assert row.size_bytes == len(data)
        assert row.has_json


def test_commit_bytes_are_canonical(store: SqlStore, location: str) -> None:
    table_id = new_table(store, location)
    body = {
        "zExtra": {"b": 1, "a": "ü"},
        "stats": '{"numRecords":1}',
        "dataChange": True,
        "modificationTime": 4,
        "size": 3,
        "partitionValues": {"p": None},
        "path": "p=%C3%A9/dé.parquet",
    }
    info = ("commitInfo", {"operation": "WRITE", "timestamp": 1700000000000, "userMetadata": "日本"})
    assert store.commit("t", [("add", body), info]) == 1
    data = store.commit_bytes(table_id, 1)
    assert data.endswith(b"\n") and b"\n\n" not in data and b"\r" not in data
    lines = data.decode("utf-8").split("\n")[:-1]
    assert len(lines) == 2
    assert lines[0].startswith('{"commitInfo":{"timestamp":1700000000000,"operation":"WRITE"')
    assert '"userMetadata":"日本"' in lines[0]
    assert lines[1] == (
        '{"add":{"path":"p=%C3%A9/dé.parquet","partitionValues":{"p":null},"size":3,"modificationTime":4,'
        '"dataChange":true,"stats":"{\\"numRecords\\":1}","zExtra":{"b":1,"a":"ü"}}}'
    )


def test_a_commit_info_is_created_first_when_the_writer_gives_none(store: SqlStore, location: str) -> None:
    table_id = new_table(store, location)
    store.commit("t", [add("b.parquet")])
    lines = store.commit_bytes(table_id, 1).decode().splitlines()
    first = json.loads(lines[0])["commitInfo"]
    assert list(first)[:3] == ["timestamp", "operation", "operationParameters"]
    assert first["operation"] == "WRITE" and first["readVersion"] == 0 and first["isBlindAppend"] is True
    assert (
        json.loads(store.commit_bytes(table_id, 0).decode().splitlines()[0])["commitInfo"]["operation"]
        == "CREATE TABLE"
    )


def test_in_commit_timestamps_come_first_and_only_increase(store: SqlStore, location: str) -> None:
    store.create_table("t", location)
    table_id = store.get_table("t").id
    ict_protocol = protocol(minWriterVersion=7, writerFeatures=["inCommitTimestamp"])
    store.commit(
        "t", [ict_protocol, metadata(**{"delta.enableInCommitTimestamps": "true"}), add("a.parquet")]
    )
    for i in range(1, 6):
        # A writer clock that goes backwards must not make the in-commit timestamps go backwards.
        info = ("commitInfo", {"timestamp": 1000 - i, "operation": "WRITE"})
        store.commit("t", [add(f"f{i}.parquet"), info] if i % 2 else [add(f"f{i}.parquet")])
    stamps = []
    with store.engine.connect() as conn:
        recorded = dict(
            conn.execute(
                select(dl_commits.c.version, dl_commits.c.in_commit_timestamp).where(
                    dl_commits.c.table_id == table_id
                )
            ).all()
        )
    for v in range(6):
        first_line = store.commit_bytes(table_id, v).decode().split("\n")[0]
        assert first_line.startswith('{"commitInfo":{"inCommitTimestamp":')
        ict = json.loads(first_line)["commitInfo"]["inCommitTimestamp"]
        assert recorded[v] == ict
        stamps.append(ict)
    assert all(b > a for a, b in itertools.pairwise(stamps)), stamps


def test_without_in_commit_timestamps_none_is_written(store: SqlStore, location: str) -> None:
    table_id = new_table(store, location)
    assert b"inCommitTimestamp" not in store.commit_bytes(table_id, 0)


def test_a_version_gap_is_refused_and_changes_nothing(store: SqlStore, location: str) -> None:
    new_table(store, location)
    before = state(store)
    with pytest.raises(DataError, match="version gap") as info:
        store.commit("t", [add("b.parquet")], expected_version=3)
    assert (info.value.table, info.value.version) == ("t", 3)
    assert state(store) == before


def test_committing_an_existing_version_is_a_conflict_naming_table_and_version(
    store: SqlStore, location: str
) -> None:
    new_table(store, location)
    store.commit("t", [add("b.parquet")], expected_version=1)
    before = state(store)
    with pytest.raises(CommitConflictError) as info:
        store.commit("t", [add("c.parquet")], expected_version=1)
    assert (info.value.table, info.value.version) == ("t", 1)
    assert "table 't', version 1" in info.value.message
    assert state(store) == before


BAD_COMMITS: list[tuple[str, list[Action], type[Exception], str]] = [
    ("remove-unknown", [remove("never-added.parquet")], InvalidActionError, "not an active file"),
    ("remove-wrong-dv", [remove("a.parquet", dv=inline_dv(1))], InvalidActionError, "not an active file"),
    ("two-metadata", [metadata(), metadata()], InvalidActionError, "2 'metaData' actions"),
    ("two-protocols", [protocol(), protocol()], InvalidActionError, "2 'protocol' actions"),
    ("duplicate-add", [add("n.parquet"), add("n.parquet", size=2)], InvalidActionError, "duplicate add"),
    ("negative-size", [add("n.parquet", size=-1)], InvalidActionError, "must not be negative"),
    ("escape", [add("a/../../x")], InvalidActionError, "escapes the table root"),
    ("other-bucket", [add("s3://other-bucket/x")], InvalidActionError, "outside the table root"),
    ("absolute", [add("/abs/path")], InvalidActionError, "relative to the table root"),
    ("unknown-type", [("fooBar", {"a": 1})], InvalidActionError, "unknown action type 'fooBar'"),
    (
        "no-path",
        [("add", {"size": 1, "partitionValues": {}, "modificationTime": 1, "dataChange": True})],
        InvalidActionError,
        "missing required field 'path'",
    ),
    (
        "catalog-managed",
        [
            protocol(
                minReaderVersion=3,
                minWriterVersion=7,
                readerFeatures=["catalogManaged"],
                writerFeatures=["catalogManaged"],
            )
        ],
        InvalidActionError,
        "catalogManaged",
    ),
    (
        "coordinated-commits",
        [metadata(**{"delta.coordinatedCommits.commitCoordinator-preview": "x"})],
        InvalidActionError,
        "coordinatedCommits",
    ),
    # The invalid action comes last: nothing of the valid ones before it may be written.
    (
        "valid-then-invalid",
        [add("ok1"), add("ok2"), ("txn", {"appId": "a", "version": 1}), remove("ghost")],
        InvalidActionError,
        "not an active file",
    ),
]


@pytest.mark.parametrize(
    ("case", "actions", "error", "message"), BAD_COMMITS, ids=[c[0] for c in BAD_COMMITS]
)
def test_an_invalid_commit_is_refused_and_changes_nothing(
    store: SqlStore, location: str, case: str, actions: list[Action], error: type[Exception], message: str
) -> None:
    table_id = new_table(store, location)
    store.commit("t", [add("b.parquet")])
    before = state(store)
    with pytest.raises(error, match=message) as info:
        store.commit("t", actions)
    assert info.value.table == "t" and info.value.version == 2  # type: ignore[attr-defined]
    assert state(store) == before
    assert store.commit("t", [add("c.parquet")]) == 2, "the refused version stays free"
    assert {f.path for f in store.active_files(table_id, 2)} == {"a.parquet", "b.parquet", "c.parquet"}


def test_duplicate_removes_of_one_file_in_a_commit_are_refused(store: SqlStore, location: str) -> None:
    new_table(store, location)
    before = state(store)
    with pytest.raises(InvalidActionError, match="duplicate remove"):
        store.commit("t", [remove("a.parquet"), remove("a.parquet")])
    assert state(store) == before


def test_last_published_version_is_none_before_anything_is_published(store: SqlStore, location: str) -> None:
    table_id = new_table(store, location)
    store.commit("t", [add("b")])
    assert store.last_published_version(table_id) is None
    store.mark_succeeded(table_id, "json", [(0, "x", 1)])
    assert store.last_published_version(table_id) == 0


# -- optimistic concurrency --------------------------------------------------------------------------


def test_racing_writers_get_exactly_one_winner_per_version(
    store: SqlStore, store_url: str, location: str
) -> None:
    table_id = new_table(store, location)
    writers, rounds = 4, 12

    def writer(w: int, barrier: threading.Barrier) -> list[tuple[str, object]]:
        """Each round every writer commits at the same expected version: (won, version) or the
        conflict's (table, version)."""
        outcomes: list[tuple[str, object]] = []
        with closing(SqlStore(store_url)) as s:
            for r in range(rounds):
                barrier.wait()
                try:
                    outcomes.append(
                        ("won", s.commit("t", [add(f"w{w}-r{r}.parquet")], expected_version=r + 1))
                    )
                except CommitConflictError as exc:
                    outcomes.append(("conflict", (exc.table, exc.version)))
        return outcomes

    by_writer = race(writers, writer)
    for r in range(rounds):
        round_outcomes = sorted(by_writer[w][r] for w in range(writers))
        assert round_outcomes == [("conflict", ("t", r + 1))] * (writers - 1) + [("won", r + 1)], r
    assert versions(store, table_id) == list(range(rounds + 1))
    winners = {
        f"w{w}-r{r}.parquet" for w in range(writers) for r in range(rounds) if by_writer[w][r][0] == "won"
    }
    assert {f.path for f in store.active_files(table_id, rounds)} == winners | {"a.parquet"}


def test_concurrent_writers_without_an_expected_version_all_land_contiguously(
    store: SqlStore, store_url: str, location: str
) -> None:
    table_id = new_table(store, location)
    writers, each = 4, 8

    def writer(w: int, barrier: threading.Barrier) -> list[int]:
        with closing(SqlStore(store_url)) as s:
            barrier.wait()
            return [s.commit("t", [add(f"w{w}-{i}.parquet")]) for i in range(each)]

    results = [version for landed in race(writers, writer) for version in landed]
    assert sorted(results) == list(range(1, writers * each + 1))
    assert versions(store, table_id) == list(range(writers * each + 1))
    assert store.count_active_files(table_id, writers * each) == writers * each + 1


def test_a_protocol_change_is_checked_against_the_newest_protocol_not_the_remembered_one(
    store: SqlStore, store_url: str, location: str, tmp_path: Path
) -> None:
    """Each path remembers writer version 3; another store raises it to 5; a change to 4 is a
    downgrade for both paths (native and verbatim): the one-statement commit (PostgreSQL) and the
    short transaction (SQLite) check the protocol in force, and the transaction path refuses it."""
    store.create_table("t", location)
    store.commit("t", [protocol(), metadata(), add("a.parquet")])
    store.commit("t", [protocol(minWriterVersion=3)])
    root = (tmp_path / "v").as_uri()
    store.commit_verbatim(root, 0, v0_file(), create_name="v")
    store.commit_verbatim(root, 1, spark_file(protocol(minWriterVersion=3)))
    with closing(SqlStore(store_url)) as other:
        other.commit("t", [protocol(minWriterVersion=5)])
        other.commit_verbatim(root, 2, spark_file(protocol(minWriterVersion=5)))
    with pytest.raises(InvalidActionError, match="protocol downgrade: minWriterVersion 5 -> 4"):
        store.commit("t", [protocol(minWriterVersion=4)])
    with pytest.raises(InvalidActionError, match="protocol downgrade: minWriterVersion 5 -> 4"):
        store.commit_verbatim(root, 3, spark_file(protocol(minWriterVersion=4)))
    assert store.commit("t", [protocol(minWriterVersion=6)]) == 3
    assert store.commit_verbatim(root, 3, spark_file(protocol(minWriterVersion=6))).version == 3
