"""Reads from the store: the active file set at any version is one indexed query."""

from __future__ import annotations

import json
import random
import threading
from typing import Any

import pytest
from sqlalchemy import event
from store.store_kit import Action, add, inline_dv, new_table, remove

from delta_mirror.delta.actions import canonical_line, dv_id
from delta_mirror.errors import InvalidActionError
from delta_mirror.store import SqlStore, reads


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
        blocks = list(store.iter_active_add_blocks(table_id, version))
        assert all(b.endswith(b"\n") for b in blocks)
        assert sorted(b"".join(blocks).decode().splitlines()) == sorted(expected.values())
        assert store.count_active_files(table_id, version) == len(expected)
    assert sorted((f.path, dv_id(live[f.path])) for f in store.active_files(table_id, 40)) == sorted(
        (p, dv_id(d)) for p, d in live.items()
    )


def test_active_add_blocks_hold_whole_lines_of_about_the_block_size(
    store: SqlStore, location: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    table_id = new_table(store, location, "t", *(add(f"f{i:03}.parquet", size=i) for i in range(200)))
    expected = sorted(line for batch in store.iter_active_add_lines(table_id, 0) for line in batch)
    monkeypatch.setattr(reads, "_BLOCK_BYTES", 1000)
    blocks = list(store.iter_active_add_blocks(table_id, 0))
    assert len(blocks) > 5
    for block in blocks[:-1]:
        assert 1000 <= len(block) < 1000 + max(map(len, expected)) + 1
    lines = [line for block in blocks for line in block.decode().split("\n")[:-1]]
    assert sorted(lines) == expected  # no line cut, none lost, none twice


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


def test_a_copy_read_that_fails_after_its_first_rows_raises(pg_store_url: str) -> None:
    """``_copy_blocks`` takes the rows libpq holds straight from it, the end included: an error the
    server sends after some rows is raised, not taken for the end of the rows."""
    import psycopg
    from sqlalchemy import create_engine, text

    engine = create_engine(pg_store_url)
    try:
        query = text("SELECT (1 / (5000 - g))::text FROM generate_series(1, :n) g")
        with engine.connect() as conn:
            blocks = reads._copy_blocks(conn, query, {"n": 10_000}, 1 << 20)
            with pytest.raises(psycopg.errors.DivisionByZero):
                list(blocks)
            raw = conn.connection.driver_connection
            assert raw is not None
            raw.rollback()  # usable again (the COPY ran on the driver)
            assert conn.exec_driver_sql("SELECT 1").scalar() == 1
        with engine.connect() as conn:
            whole = b"".join(reads._copy_blocks(conn, query, {"n": 4000}, 1000))
            assert whole.decode().split("\n")[:-1] == [str(1 // (5000 - g)) for g in range(1, 4001)]
    finally:
        engine.dispose()
