"""Specification of the SQL store, on real SQLite and real PostgreSQL (``store_url`` runs each test on both).

The store is the authority: a version is committed exactly once (optimistic concurrency), a refused
commit changes nothing, the SHA-256 of each version's canonical bytes is recorded, and the active
file set at any version is one indexed query.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event, func, inspect, select, text
from support.builders import add_body, metadata_body, protocol_body, remove_body

from delta_mirror.delta.actions import canonical_line, dv_id
from delta_mirror.errors import (
    CommitConflictError,
    CommitTooLargeError,
    DataError,
    InvalidActionError,
    PermanentError,
    TableExistsError,
    TableHaltedError,
    TableNotFoundError,
)
from delta_mirror.store import SqlStore
from delta_mirror.store.schema import dl_actions, dl_commits, dl_files, dl_mirror_status, dl_tables
from delta_mirror.store.sql_store import CommitResult, default_table_name

Action = tuple[str, dict[str, Any]]


# The store takes (kind, body) pairs; the bodies come from support.builders.
def protocol(**extra: Any) -> Action:
    return ("protocol", protocol_body(**extra))


def metadata(**configuration: str) -> Action:
    return ("metaData", metadata_body(configuration=configuration))


def _dv(dv: dict[str, Any] | None) -> dict[str, Any]:
    return {} if dv is None else {"deletionVector": dv}


def add(path: str, size: int = 1, dv: dict[str, Any] | None = None, **extra: Any) -> Action:
    return ("add", add_body(path, size=size, **_dv(dv), **extra))


def remove(path: str, dv: dict[str, Any] | None = None) -> Action:
    return ("remove", remove_body(path, **_dv(dv)))


def inline_dv(n: int) -> dict[str, Any]:
    return {"storageType": "i", "pathOrInlineDv": f"dv{n}", "sizeInBytes": 4, "cardinality": n}


@pytest.fixture
def store(store_url: str) -> Iterator[SqlStore]:
    s = SqlStore(store_url)
    s.init()
    yield s
    s.close()


@pytest.fixture
def location(tmp_path: Path) -> str:
    return (tmp_path / "table").as_uri()


def new_table(store: SqlStore, location: str, name: str = "t", *more: Action) -> int:
    """Create ``name`` and commit version 0 (protocol, metaData, a.parquet, plus ``more``)."""
    table = store.create_table(name, location)
    assert store.commit(name, [protocol(), metadata(), add("a.parquet"), *more]) == 0
    return table.id


def state(store: SqlStore) -> dict[str, Any]:
    """Row counts of every store table and each table's latest version: 'unchanged' means equal."""
    with store.engine.connect() as conn:
        counts = {
            t.name: conn.execute(select(func.count()).select_from(t)).scalar()
            for t in (dl_tables, dl_commits, dl_actions, dl_files, dl_mirror_status)
        }
        latest = dict(
            conn.execute(
                select(dl_commits.c.table_id, func.max(dl_commits.c.version)).group_by(dl_commits.c.table_id)
            ).all()
        )
    return {"counts": counts, "latest": latest}


def versions(store: SqlStore, table_id: int) -> list[int]:
    with store.engine.connect() as conn:
        return list(
            conn.execute(
                select(dl_commits.c.version)
                .where(dl_commits.c.table_id == table_id)
                .order_by(dl_commits.c.version)
            ).scalars()
        )


# -- schema ------------------------------------------------------------------------------------------


def test_init_is_idempotent_and_creates_the_schema(store: SqlStore, location: str) -> None:
    names = set(inspect(store.engine).get_table_names())
    assert {
        "dl_tables",
        "dl_commits",
        "dl_actions",
        "dl_files",
        "dl_mirror_status",
        "alembic_version",
    } <= names
    table_id = new_table(store, location)
    before = state(store)
    store.init()
    store.init()
    assert state(store) == before
    assert store.latest_version(table_id) == 0
    with store.engine.connect() as conn:
        assert conn.execute(text("select version_num from alembic_version")).scalars().all() == ["0003"]


def test_action_payloads_are_text_that_keeps_key_order_not_jsonb(store: SqlStore, location: str) -> None:
    columns = {c["name"]: c["type"] for c in inspect(store.engine).get_columns("dl_actions")}
    assert type(columns["payload"]).__name__.upper() == "TEXT"
    table_id = new_table(
        store, location, "t", ("txn", {"version": 3, "appId": "zz", "zUnknown": {"b": 1, "a": 2}})
    )
    with store.engine.connect() as conn:
        payloads = (
            conn.execute(
                select(dl_actions.c.payload).where(
                    dl_actions.c.table_id == table_id, dl_actions.c.action_type == "txn"
                )
            )
            .scalars()
            .all()
        )
    # txn keys in Delta-Spark order, the unknown field kept with its own key order.
    assert payloads == ['{"txn":{"appId":"zz","version":3,"zUnknown":{"b":1,"a":2}}}']


def test_concurrent_init_of_a_fresh_store_succeeds_for_every_caller(store_url: str) -> None:
    errors: list[BaseException] = []
    barrier = threading.Barrier(3, timeout=30)

    def run() -> None:
        s = SqlStore(store_url)
        try:
            barrier.wait()
            s.init()
        except BaseException as exc:
            errors.append(exc)
        finally:
            s.close()

    threads = [threading.Thread(target=run) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    s = SqlStore(store_url)
    s.ensure_initialised()
    s.close()


def test_an_uninitialised_store_says_run_init(store_url: str) -> None:
    s = SqlStore(store_url)
    with pytest.raises(PermanentError, match="not initialised") as info:
        s.ensure_initialised()
    assert "delta-mirror init" in info.value.message
    s.close()


@pytest.mark.parametrize("url", ["mysql://u@h/db", "oracle://x", "not a url", "mongodb://h/db"])
def test_unsupported_store_urls_are_refused_clearly(url: str) -> None:
    with pytest.raises(PermanentError, match=r"unsupported store backend|not valid"):
        SqlStore(url)


def test_a_sqlite_store_in_an_unusable_folder_is_a_clear_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(PermanentError, match="cannot create"):
        SqlStore(f"sqlite:///{blocker}/sub/store.db")


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


def test_committing_to_an_unknown_table_is_refused(store: SqlStore) -> None:
    with pytest.raises(TableNotFoundError, match="no table named 'nope'"):
        store.commit("nope", [add("a")])


def test_creating_a_table_twice_is_refused(store: SqlStore, location: str) -> None:
    new_table(store, location)
    before = state(store)
    with pytest.raises(TableExistsError):
        store.create_table("t", location)
    assert state(store) == before


def test_commit_with_a_location_creates_the_table_in_the_same_transaction(
    store: SqlStore, location: str
) -> None:
    before = state(store)
    with pytest.raises(InvalidActionError):
        store.commit("t", [protocol(), metadata(), add("../escape")], location=location)
    assert state(store) == before, "a refused first commit must not leave an empty table behind"
    assert store.commit("t", [protocol(), metadata(), add("a")], location=location) == 0
    assert store.get_table("t").location == location
    assert store.commit("t", [add("b")], location=location) == 1


@pytest.mark.parametrize(
    "name",
    ["x'; drop table dl_tables;--", 'a"b', "", "a b", "../x", "t\n", "x" * 200, "-lead", "tab\tle", "é"],
)
def test_invalid_table_names_are_refused_and_the_store_stays_intact(
    store: SqlStore, location: str, name: str
) -> None:
    new_table(store, location)
    before = state(store)
    for call in (
        lambda: store.create_table(name, location),
        lambda: store.get_table(name),
        lambda: store.commit(name, [protocol(), metadata()], location=location),
    ):
        with pytest.raises(PermanentError, match="invalid table name"):
            call()
    assert state(store) == before
    assert [t.name for t in store.list_tables()] == ["t"]


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
    barrier = threading.Barrier(writers, timeout=60)
    wins: dict[int, list[int]] = {}
    conflicts: dict[int, list[tuple[str | None, int | None]]] = {}
    unexpected: list[BaseException] = []
    lock = threading.Lock()

    def writer(w: int) -> None:
        s = SqlStore(store_url)
        try:
            for r in range(rounds):
                version = r + 1
                barrier.wait()
                try:
                    got = s.commit("t", [add(f"w{w}-r{r}.parquet")], expected_version=version)
                    with lock:
                        wins.setdefault(version, []).append(w)
                    assert got == version
                except CommitConflictError as exc:
                    with lock:
                        conflicts.setdefault(version, []).append((exc.table, exc.version))
        except BaseException as exc:
            unexpected.append(exc)
            barrier.abort()
        finally:
            s.close()

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert unexpected == []
    for version in range(1, rounds + 1):
        assert len(wins[version]) == 1, (version, wins.get(version))
        assert conflicts[version] == [("t", version)] * (writers - 1)
    assert versions(store, table_id) == list(range(rounds + 1))
    winners = {f"w{wins[r + 1][0]}-r{r}.parquet" for r in range(rounds)}
    assert {f.path for f in store.active_files(table_id, rounds)} == winners | {"a.parquet"}


def test_concurrent_writers_without_an_expected_version_all_land_contiguously(
    store: SqlStore, store_url: str, location: str
) -> None:
    table_id = new_table(store, location)
    writers, each = 4, 8
    results: list[int] = []
    unexpected: list[BaseException] = []
    barrier = threading.Barrier(writers, timeout=60)

    def writer(w: int) -> None:
        s = SqlStore(store_url)
        try:
            barrier.wait()
            for i in range(each):
                results.append(s.commit("t", [add(f"w{w}-{i}.parquet")]))
        except BaseException as exc:
            unexpected.append(exc)
        finally:
            s.close()

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert unexpected == []
    assert sorted(results) == list(range(1, writers * each + 1))
    assert versions(store, table_id) == list(range(writers * each + 1))
    assert store.count_active_files(table_id, writers * each) == writers * each + 1


# -- the active file set -----------------------------------------------------------------------------


def _replay(store: SqlStore, table_id: int, version: int) -> dict[tuple[str, str], str]:
    """The naive way: replay every commit up to ``version``; (path, dv id) -> add line."""
    active: dict[tuple[str, str], str] = {}
    for _v, lines in sorted(store.commit_lines(table_id, 0, version).items()):
        for line in lines:
            ((kind, body),) = json.loads(line).items()
            key = (body.get("path"), dv_id(body.get("deletionVector")))
            if kind == "add":
                active[key] = line
            elif kind == "remove":
                active.pop(key, None)
    return active


def test_active_files_at_past_versions_match_a_naive_replay(store: SqlStore, location: str) -> None:
    table_id = new_table(store, location)
    rng = random.Random(20261125)
    live: dict[str, dict[str, Any] | None] = {"a.parquet": None}  # path -> current dv
    n = 0
    for _ in range(40):
        actions: list[Action] = []
        paths = sorted(live)
        touched: set[str] = set()
        for path in rng.sample(paths, k=min(len(paths), rng.randint(0, 3))):
            touched.add(path)
            choice = rng.random()
            if choice < 0.5:
                actions.append(remove(path, live.pop(path)))
            elif choice < 0.8:  # a deletion vector update: remove the old (path, dv), add the new one
                n += 1
                actions.append(remove(path, live[path]))
                live[path] = inline_dv(n)
                actions.append(add(path, size=7, dv=live[path]))
            else:  # a re-add of the same (path, dv) supersedes the entry (e.g. recomputed stats)
                actions.append(add(path, size=9, dv=live[path], stats='{"numRecords":3}'))
        for _ in range(rng.randint(1 if not actions else 0, 3)):
            n += 1
            path = f"p={n % 3}/f{n}.parquet"
            live[path] = None
            actions.append(add(path, size=n, partitionValues={"p": str(n % 3)}))
        store.commit("t", actions)
    latest = store.latest_version(table_id)
    assert latest == 40
    for version in (0, 1, 7, 13, 20, 29, 33, 39, 40):
        expected = _replay(store, table_id, version)
        files = store.active_files(table_id, version)
        assert sorted((f.path, f.dv_id) for f in files) == sorted(expected)
        for f in files:
            body = json.loads(expected[(f.path, f.dv_id)])["add"]
            assert f.size == body["size"] and f.partition_values == body["partitionValues"]
        add_lines = [
            line for batch in store.iter_active_add_lines(table_id, version, batch=7) for line in batch
        ]
        assert sorted(add_lines) == sorted(expected.values())
        assert store.count_active_files(table_id, version) == len(expected)
    assert sorted((f.path, dv_id(live[f.path])) for f in store.active_files(table_id, 40)) == sorted(
        (p, dv_id(d)) for p, d in live.items()
    )


def test_the_active_file_set_is_one_query(store: SqlStore, location: str) -> None:
    table_id = new_table(store, location)
    for i in range(20):
        store.commit("t", [add(f"f{i}.parquet"), *([remove(f"f{i - 1}.parquet")] if i % 2 else [])])
    statements: list[str] = []

    def record(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        if statement.lstrip().upper().startswith("SELECT"):
            statements.append(statement)

    event.listen(store.engine, "before_cursor_execute", record)
    try:
        files = store.active_files(table_id, 10)
        count = store.count_active_files(table_id, 10)
    finally:
        event.remove(store.engine, "before_cursor_execute", record)
    assert len(statements) == 2, statements
    assert len(files) == count == len(_replay(store, table_id, 10))


def test_a_remove_repeats_the_add_path_text_byte_for_byte(store: SqlStore, location: str) -> None:
    table_id = new_table(store, location, "t", add("p=a%20b/x%3A1.parquet"))
    with pytest.raises(InvalidActionError, match="not an active file"):
        store.commit("t", [remove("p=a b/x:1.parquet")])
    store.commit("t", [remove("p=a%20b/x%3A1.parquet")])
    assert {f.path for f in store.active_files(table_id, 1)} == {"a.parquet"}
    assert canonical_line(*remove("p=a%20b/x%3A1.parquet")) in store.commit_bytes(table_id, 1).decode()


def test_a_long_read_does_not_block_writers(store: SqlStore, store_url: str, location: str) -> None:
    # The publisher streams the active files of big tables; commits must not queue behind it
    # (on SQLite only writers take the write lock up front: BEGIN IMMEDIATE).
    table_id = new_table(store, location, "t", *(add(f"f{i}.parquet") for i in range(5)))
    batches = store.iter_active_add_lines(table_id, 0, batch=1)
    assert len(next(batches)) == 1  # the read transaction is open now
    done: list[int] = []
    writer = SqlStore(store_url)
    thread = threading.Thread(target=lambda: done.append(writer.commit("t", [add("new.parquet")])))
    thread.start()
    thread.join(15)
    finished = not thread.is_alive()
    rest = [line for batch in batches for line in batch]
    thread.join(60)
    writer.close()
    assert finished, "a commit waited for a reader to finish"
    assert done == [1]
    assert len(rest) == 5  # the reader kept its snapshot: version 0 has a.parquet + f0..f4


# -- verbatim commits (a writer's exact commit file: Delta-Spark through the commit service) ---------


def spark_file(*actions: Action, commit_info: dict[str, Any] | None = None) -> bytes:
    """A commit file as Delta-Spark writes it: commitInfo first, one action per line, each ending in
    ``\\n`` — here with a non-ASCII escape and keys out of Spark's order, which a re-encoding would
    change: only a verbatim store keeps these bytes."""
    info = commit_info or {
        "timestamp": 1700000000000,
        "operation": "WRITE",
        "engineInfo": "Apache-Spark/4.2.0",
    }
    lines = [json.dumps({"commitInfo": info}, separators=(",", ":"))]
    for kind, body in actions:
        lines.append(json.dumps({kind: dict(reversed(list(body.items())))}, separators=(",", ":")))
    lines[0] = lines[0].replace('"WRITE"', '"WRIT\\u00c9"')
    return "".join(line + "\n" for line in lines).encode()


def v0_file(**configuration: str) -> bytes:
    return spark_file(protocol(), metadata(**configuration), add("a.parquet"))


def test_a_verbatim_commit_keeps_the_writers_bytes_and_waits_for_the_publisher(
    store: SqlStore, location: str
) -> None:
    data0, data1 = v0_file(), spark_file(add("b.parquet"), remove("a.parquet"))
    first = store.commit_verbatim(location, 0, data0, create_name="sales")
    second = store.commit_verbatim(location, 1, data1)
    assert (first.table, first.version, first.existing) == ("sales", 0, False)
    assert (second.version, second.sha256, second.size) == (1, hashlib.sha256(data1).hexdigest(), len(data1))
    table = store.table_at(location)
    assert store.commit_bytes(table.id, 0) == data0 and store.commit_bytes(table.id, 1) == data1
    rows = store.commit_rows(table.id, 0, 1)
    assert [(r.source, r.sha256, r.size_bytes) for r in rows] == [
        ("spark", hashlib.sha256(d).hexdigest(), len(d)) for d in (data0, data1)
    ]
    assert [(s.version, s.state) for s in store.status_rows(table.id, artifact="json")] == [
        (0, "PENDING"),
        (1, "PENDING"),
    ]
    assert {f.path for f in store.active_files(table.id, 1)} == {"b.parquet"}


def test_a_verbatim_commit_records_its_in_commit_timestamp(store: SqlStore, location: str) -> None:
    info = {"inCommitTimestamp": 1700000000123, "timestamp": 1700000000100, "operation": "WRITE"}
    store.commit_verbatim(location, 0, v0_file(), create_name="t")
    store.commit_verbatim(location, 1, spark_file(add("b.parquet"), commit_info=info))
    with store.engine.connect() as conn:
        ict = conn.execute(select(dl_commits.c.in_commit_timestamp).where(dl_commits.c.version == 1)).scalar()
    assert ict == 1700000000123


def test_a_verbatim_retry_of_the_same_bytes_is_the_existing_commit_and_other_bytes_conflict(
    store: SqlStore, location: str
) -> None:
    store.commit_verbatim(location, 0, v0_file(), create_name="t")
    data = spark_file(add("b.parquet"))
    done = store.commit_verbatim(location, 1, data)
    before = state(store)
    again = store.commit_verbatim(location, 1, data)
    assert again == CommitResult("t", 1, done.sha256, done.size, existing=True)
    with pytest.raises(CommitConflictError) as info:
        store.commit_verbatim(location, 1, spark_file(add("c.parquet")))
    assert (info.value.table, info.value.version) == ("t", 1)
    assert state(store) == before


def test_a_verbatim_version_gap_points_at_a_writer_outside_the_authority(
    store: SqlStore, location: str
) -> None:
    store.commit_verbatim(location, 0, v0_file(), create_name="t")
    before = state(store)
    with pytest.raises(
        DataError, match=r"_delta_log/00000000000000000002\.json outside the authority"
    ) as info:
        store.commit_verbatim(location, 3, spark_file(add("b.parquet")))
    assert "delta-mirror reconcile t --strategy full" in info.value.message
    assert state(store) == before


def test_a_halted_table_refuses_verbatim_commits(store: SqlStore, location: str) -> None:
    store.commit_verbatim(location, 0, v0_file(), create_name="t")
    table = store.table_at(location)
    store.halt_table(table.id, "a foreign commit at version 1", 1)
    before = state(store)
    with pytest.raises(TableHaltedError, match="halted at version 1: a foreign commit") as info:
        store.commit_verbatim(location, 1, spark_file(add("b.parquet")))
    assert "delta-mirror resume t" in info.value.message
    assert state(store) == before


def test_version_0_of_an_unknown_root_creates_the_table_named_after_its_root(
    store: SqlStore, tmp_path: Path
) -> None:
    first, second = (tmp_path / "a" / "sales").as_uri(), (tmp_path / "b" / "sales").as_uri()
    assert store.commit_verbatim(first, 0, v0_file(), create_name="sales").table == "sales"
    taken = store.commit_verbatim(second, 0, v0_file(), create_name="sales")
    assert taken.table == "sales-" + hashlib.sha256(second.encode()).hexdigest()[:8]
    assert store.get_table(taken.table).location == second
    assert default_table_name("s3://lake/warehouse/Sales Data%20x/") == "Sales_Data_x"


def test_an_unknown_root_is_not_created_past_version_0_or_without_a_name(
    store: SqlStore, location: str
) -> None:
    with pytest.raises(TableNotFoundError) as info:
        store.commit_verbatim(location, 1, spark_file(add("b.parquet")), create_name="t")
    assert info.value.version == 1
    with pytest.raises(TableNotFoundError):
        store.commit_verbatim(location, 0, v0_file())
    assert state(store)["counts"]["dl_tables"] == 0


VERBATIM_REFUSALS = [
    ("no trailing newline", lambda: v0_file()[:-1], InvalidActionError, "does not end with a newline"),
    ("a blank line", lambda: v0_file() + b"\n", InvalidActionError, "line 5 is blank"),
    ("not UTF-8", lambda: v0_file() + b'{"add":"\xff"}\n', InvalidActionError, "not valid UTF-8"),
    ("malformed JSON", lambda: v0_file() + b'{"add":\n', InvalidActionError, "malformed JSON"),
    ("no metaData in version 0", lambda: spark_file(protocol()), InvalidActionError, "needs a 'metaData'"),
    (
        "catalogManaged",
        lambda: spark_file(
            protocol(
                minReaderVersion=3,
                minWriterVersion=7,
                readerFeatures=["catalogManaged"],
                writerFeatures=["catalogManaged"],
            ),
            metadata(),
        ),
        InvalidActionError,
        "'catalogManaged' is not allowed",
    ),
    (
        "coordinated commits",
        lambda: spark_file(
            protocol(), metadata(**{"delta.coordinatedCommits.commitCoordinator-preview": "x"})
        ),
        InvalidActionError,
        "delta.coordinatedCommits",
    ),
    (
        "a path outside the root",
        lambda: spark_file(protocol(), metadata(), add("../x.parquet")),
        InvalidActionError,
        "escapes the table root",
    ),
    (
        "a remove of no active file",
        lambda: spark_file(protocol(), metadata(), remove("nope.parquet")),
        InvalidActionError,
        "not an active file",
    ),
]


@pytest.mark.parametrize(
    ("case", "make", "error", "message"), VERBATIM_REFUSALS, ids=[c[0] for c in VERBATIM_REFUSALS]
)
def test_a_verbatim_commit_obeys_the_native_rules_and_a_refusal_changes_nothing(
    store: SqlStore, location: str, case: str, make: Any, error: type[Exception], message: str
) -> None:
    before = state(store)
    with pytest.raises(error, match=message):
        store.commit_verbatim(location, 0, make(), create_name="t")
    assert state(store) == before


def test_verbatim_commits_refuse_a_protocol_downgrade_and_the_size_limits(
    store: SqlStore, location: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    store.commit_verbatim(location, 0, spark_file(protocol(minWriterVersion=4), metadata()), create_name="t")
    before = state(store)
    with pytest.raises(InvalidActionError, match="protocol downgrade"):
        store.commit_verbatim(location, 1, spark_file(protocol()))
    monkeypatch.setenv("DELTA_MIRROR_MAX_COMMIT_BYTES", "200")
    with pytest.raises(CommitTooLargeError, match="more than the limit of 200"):
        store.commit_verbatim(location, 1, spark_file(add("b.parquet"), add("c.parquet")))
    monkeypatch.setenv("DELTA_MIRROR_MAX_COMMIT_BYTES", "100000")
    monkeypatch.setenv("DELTA_MIRROR_MAX_COMMIT_ACTIONS", "2")
    with pytest.raises(CommitTooLargeError, match="3 actions, more than the limit of 2"):
        store.commit_verbatim(location, 1, spark_file(add("b.parquet"), add("c.parquet")))
    assert state(store) == before


def test_racing_verbatim_writers_of_one_version_get_exactly_one_winner(
    store: SqlStore, store_url: str, location: str
) -> None:
    store.commit_verbatim(location, 0, v0_file(), create_name="t")
    writers = 6
    barrier = threading.Barrier(writers, timeout=60)
    outcomes: list[str] = []

    def writer(w: int) -> None:
        s = SqlStore(store_url)
        try:
            barrier.wait()
            s.commit_verbatim(location, 1, spark_file(add(f"w{w}.parquet")))
            outcomes.append(f"won:{w}")
        except CommitConflictError:
            outcomes.append("conflict")
        finally:
            s.close()

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    winners = [o for o in outcomes if o.startswith("won:")]
    assert len(winners) == 1 and outcomes.count("conflict") == writers - 1
    table = store.table_at(location)
    assert store.commit_bytes(table.id, 1) == spark_file(add(f"w{winners[0][4:]}.parquet"))


def store_rows(store: SqlStore, table_id: int) -> dict[str, list[tuple[Any, ...]]]:
    """Every row a table's commits wrote, without ids and clock times: equal rows, equal commits."""
    with store.engine.connect() as conn:
        return {
            "commits": [
                tuple(r)
                for r in conn.execute(
                    select(
                        dl_commits.c.version,
                        dl_commits.c.in_commit_timestamp,
                        dl_commits.c.action_count,
                        dl_commits.c.size_bytes,
                        dl_commits.c.sha256,
                        dl_commits.c.has_json,
                        dl_commits.c.source,
                    )
                    .where(dl_commits.c.table_id == table_id)
                    .order_by(dl_commits.c.version)
                )
            ],
            "actions": [
                tuple(r)
                for r in conn.execute(
                    select(
                        dl_actions.c.version, dl_actions.c.part, dl_actions.c.seq, dl_actions.c.action_type
                    )
                    .add_columns(dl_actions.c.payload)
                    .where(dl_actions.c.table_id == table_id)
                    .order_by(dl_actions.c.version, dl_actions.c.part, dl_actions.c.seq)
                )
            ],
            "files": sorted(
                tuple(r)
                for r in conn.execute(
                    select(*[c for c in dl_files.c if c.name not in ("id", "table_id")]).where(
                        dl_files.c.table_id == table_id
                    )
                )
            ),
            "status": [
                tuple(r)
                for r in conn.execute(
                    select(
                        dl_mirror_status.c.version,
                        dl_mirror_status.c.artifact,
                        dl_mirror_status.c.state,
                        dl_mirror_status.c.attempts,
                    )
                    .where(dl_mirror_status.c.table_id == table_id)
                    .order_by(dl_mirror_status.c.version)
                )
            ],
        }


def raw_utf8_file(*actions: Action) -> bytes:
    """A commit file with raw UTF-8 (no escapes) and braces, commas, quotes and backslashes in its
    strings: what a SQL array literal or a bind parameter must carry untouched."""
    lines = [json.dumps({"commitInfo": {"operation": "WRITE"}}, separators=(",", ":"))]
    lines += [json.dumps({k: b}, separators=(",", ":"), ensure_ascii=False) for k, b in actions]
    return "".join(line + "\n" for line in lines).encode()


def known_root_history() -> list[bytes]:
    """Commits that take the known-root statement (adds, re-adds, partitions, deletion vectors, tags,
    an in-commit timestamp, a metadata change) and two that do not (a remove, a protocol)."""
    ict = {"inCommitTimestamp": 1700000000999, "timestamp": 1700000000100, "operation": "WRITE"}
    return [
        v0_file(),
        spark_file(add("b.parquet")),
        spark_file(
            add("p=1/c.parquet", partitionValues={"p": "1"}),
            add("p=2/d.parquet", partitionValues={"p": None}),
        ),
        spark_file(add("a.parquet", size=7, stats='{"numRecords":3}')),  # a re-add supersedes a.parquet
        spark_file(add("b.parquet", dv=inline_dv(2))),
        spark_file(add("e.parquet", tags={"k": "v"})),
        raw_utf8_file(add("café {1,2}.parquet", stats='{"q":"\\\\ \\"€\\" NULL"}')),
        spark_file(add("f.parquet"), commit_info=ict),
        spark_file(metadata(**{"delta.appendOnly": "false"})),
        spark_file(add("g.parquet"), remove("b.parquet")),
        spark_file(protocol(minWriterVersion=3)),
        spark_file(add("h.parquet")),
    ]


def test_commits_to_a_known_root_write_the_same_rows_as_the_transaction_path(
    store: SqlStore, store_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One store remembers the root (its later commits take the one-statement path); the other
    forgets it before each commit (every commit takes the transaction path): the rows are equal."""
    known, fresh = (tmp_path / "known").as_uri(), (tmp_path / "fresh").as_uri()
    fast: list[int] = []
    one_statement = store._commit_verbatim_fast

    def counted(table: Any, commit: Any) -> Any:
        done = one_statement(table, commit)
        fast.extend([commit.version] if done is not None else [])
        return done

    monkeypatch.setattr(store, "_commit_verbatim_fast", counted)
    for version, data in enumerate(known_root_history()):
        assert store.commit_verbatim(known, version, data, create_name="known").version == version
        other = SqlStore(store_url)
        try:
            assert other.commit_verbatim(fresh, version, data, create_name="fresh").version == version
        finally:
            other.close()
    assert fast == [1, 2, 3, 4, 5, 6, 7, 8, 11]  # not version 0 (creates), 9 (a remove), 10 (a protocol)
    a, b = store.table_at(known), store.table_at(fresh)
    assert store_rows(store, a.id) == store_rows(store, b.id)
    assert {f.path for f in store.active_files(a.id, 11)} == {
        "a.parquet",
        "café {1,2}.parquet",
        "p=1/c.parquet",
        "p=2/d.parquet",
        "b.parquet",
        "e.parquet",
        "f.parquet",
        "g.parquet",
        "h.parquet",
    }
    assert [f.dv_id for f in store.active_files(a.id, 11) if f.path == "b.parquet"] == ["idv2"]
    assert store.commit_bytes(a.id, 6) == known_root_history()[6]


def test_a_commit_to_a_known_root_is_one_statement_on_postgresql(store: SqlStore, location: str) -> None:
    store.commit_verbatim(location, 0, v0_file(), create_name="t")
    statements: list[str] = []
    event.listen(store.engine, "before_cursor_execute", lambda *a: statements.append(a[2]))
    store.commit_verbatim(location, 1, spark_file(add("b.parquet"), add("c.parquet")))
    # SQLite: BEGIN IMMEDIATE, then the claim and the other rows (no round trips there)
    expected = 1 if store.engine.dialect.name == "postgresql" else 6
    assert len(statements) == expected, statements
    assert store.commit_bytes(store.table_at(location).id, 1) == spark_file(
        add("b.parquet"), add("c.parquet")
    )


def test_a_known_root_recreated_as_another_table_gets_the_commit(
    store: SqlStore, store_url: str, location: str
) -> None:
    store.commit_verbatim(location, 0, v0_file(), create_name="t")
    store.commit_verbatim(location, 1, spark_file(add("b.parquet")))
    other = SqlStore(store_url)  # another service process drops the table; version 0 re-creates it
    try:
        other.delete_table(other.table_at(location).id)
        other.commit_verbatim(location, 0, v0_file(), create_name="t2")
    finally:
        other.close()
    with pytest.raises(CommitConflictError):  # version 1 of the old table is no longer the next one...
        store.commit_verbatim(location, 0, spark_file(add("x.parquet")))
    done = store.commit_verbatim(location, 1, spark_file(add("c.parquet")))  # ...of the new one it is
    table = store.table_at(location)
    assert (done.table, table.name) == ("t2", "t2")
    assert {f.path for f in store.active_files(table.id, 1)} == {"a.parquet", "c.parquet"}


def test_a_known_root_refuses_in_the_usual_order(store: SqlStore, location: str) -> None:
    """Taken version before invalid actions, halted before both, as for an unknown root."""
    store.commit_verbatim(location, 0, v0_file(), create_name="t")
    store.commit_verbatim(location, 1, spark_file(add("b.parquet")))
    invalid = spark_file(add("../outside.parquet"))
    before = state(store)
    with pytest.raises(CommitConflictError):
        store.commit_verbatim(location, 1, invalid)
    with pytest.raises(InvalidActionError, match="escapes the table root"):
        store.commit_verbatim(location, 2, invalid)
    with pytest.raises(DataError, match="version gap"):
        store.commit_verbatim(location, 3, spark_file(add("c.parquet")))
    store.halt_table(store.table_at(location).id, "by a test", None)
    after_halt = state(store)
    for version, data in ((1, invalid), (2, invalid), (2, spark_file(add("c.parquet")))):
        with pytest.raises(TableHaltedError):
            store.commit_verbatim(location, version, data)
    assert state(store) == after_halt and after_halt["latest"] == before["latest"]


def test_racing_writers_of_a_known_root_get_one_winner_and_a_retry_its_existing_commit(
    store: SqlStore, location: str
) -> None:
    store.commit_verbatim(location, 0, v0_file(), create_name="t")
    store.commit_verbatim(location, 1, spark_file(add("b.parquet")))  # the root is known now
    writers = 6
    barrier = threading.Barrier(writers, timeout=60)
    outcomes: list[str] = []
    same = spark_file(add("same.parquet"))

    def writer(w: int) -> None:
        try:
            barrier.wait()
            # two rounds: version 2 with different bytes each, version 3 with the same bytes for all
            store.commit_verbatim(location, 2, spark_file(add(f"w{w}.parquet")))
            outcomes.append(f"won:{w}")
        except CommitConflictError:
            outcomes.append("conflict")
        result = store.commit_verbatim(location, 3, same)
        outcomes.append("existing" if result.existing else "committed")

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    winners = [o for o in outcomes if o.startswith("won:")]
    assert len(winners) == 1 and outcomes.count("conflict") == writers - 1
    assert outcomes.count("committed") == 1 and outcomes.count("existing") == writers - 1
    table = store.table_at(location)
    assert store.commit_bytes(table.id, 2) == spark_file(add(f"w{winners[0][4:]}.parquet"))
    assert store.latest_version(table.id) == 3


def test_a_known_root_losing_the_race_inside_the_statement_is_a_conflict(
    store: SqlStore, store_url: str, location: str
) -> None:
    """Another writer holds version 2 uncommitted: the store's commit of 2 waits for it (on the
    primary key on PostgreSQL, the write lock on SQLite), then gets 409, never a database error."""
    store.commit_verbatim(location, 0, v0_file(), create_name="t")
    store.commit_verbatim(location, 1, spark_file(add("b.parquet")))  # the root is known now
    table = store.table_at(location)
    outcome: list[Any] = []

    def commit() -> None:
        try:
            outcome.append(store.commit_verbatim(location, 2, spark_file(add("c.parquet"))))
        except Exception as exc:
            outcome.append((type(exc), getattr(exc, "table", None), getattr(exc, "version", None)))

    other = SqlStore(store_url)
    try:
        with other.engine.begin() as conn:
            conn.execute(
                dl_commits.insert().values(
                    table_id=table.id,
                    version=2,
                    committed_at=1,
                    action_count=1,
                    size_bytes=1,
                    sha256="0" * 64,
                    has_json=True,
                    source="spark",
                )
            )
            thread = threading.Thread(target=commit)
            thread.start()
            if store.engine.dialect.name == "postgresql":  # until the commit waits on the key
                deadline = time.monotonic() + 30
                while (
                    time.monotonic() < deadline
                    and not other.engine.connect()
                    .execute(text("SELECT count(*) FROM pg_locks WHERE NOT granted"))
                    .scalar()
                ):
                    time.sleep(0.02)
            else:
                time.sleep(0.5)
        thread.join(60)
    finally:
        other.close()
    assert outcome == [(CommitConflictError, "t", 2)]


# Commits in the corpus that Delta-Spark did not write through LogStore.write, refused on purpose.
CORPUS_REFUSALS = {
    "delta-rs/delta-live-table": "does not end with a newline",  # Databricks DLT, no LogStore
    "delta-rs/simple_table_features": "readerFeatures is only allowed",  # a deliberately invalid log
    "kernel-rs/table-with-cdf": "not an active file",  # v2 "Manual Update": removes of fake paths
    "kernel-rs/uc-catalog_managed_0": "'catalogManaged' is not allowed",
}


def test_every_commit_delta_spark_wrote_in_the_corpus_commits_verbatim(
    corpus_dir: Path, tmp_path: Path
) -> None:
    """Replay each Spark/Databricks-written table's JSON commits through ``commit_verbatim``."""
    import csv
    import re

    from delta_mirror.errors import MirrorError

    store = SqlStore(f"sqlite:///{tmp_path / 'store.db'}")
    store.init()
    with (corpus_dir / "INDEX.tsv").open(encoding="utf-8") as f:
        rows = [
            r for r in csv.DictReader(f, delimiter="\t") if r["writer"].startswith(("Spark", "Databricks"))
        ]
    replayed, refused = 0, {}
    for row in rows:
        root = corpus_dir / row["path"]
        commits = sorted(
            p for p in (root / "_delta_log").glob("*.json") if re.fullmatch(r"\d{20}\.json", p.name)
        )
        if not commits or commits[0].name != f"{0:020d}.json":
            continue  # early commits cleaned up: such a table is imported, not replayed
        location = root.resolve().as_uri()
        for path in commits:
            try:
                result = store.commit_verbatim(
                    location, int(path.name[:20]), path.read_bytes(), create_name="t"
                )
            except MirrorError as exc:
                refused[row["path"]] = exc.message
                break
            assert store.commit_bytes(store.get_table(result.table).id, result.version) == path.read_bytes()
            replayed += 1
    assert {p: m for p, m in refused.items() if p not in CORPUS_REFUSALS} == {}
    for refused_path, message in refused.items():
        assert CORPUS_REFUSALS[refused_path] in message, (refused_path, message)
    assert replayed >= 300, replayed
    store.close()
