"""Verbatim commits to a known root: one statement where it can, the transaction path's rows."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event, text
from store.store_kit import (
    Action,
    add,
    inline_dv,
    metadata,
    protocol,
    remove,
    spark_file,
    state,
    store_rows,
    v0_file,
)
from support.race import race, won_or_refused

from delta_mirror.errors import CommitConflictError, DataError, InvalidActionError, TableHaltedError
from delta_mirror.store import SqlStore
from delta_mirror.store.schema import dl_commits


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
        spark_file(remove("b.parquet", dv=inline_dv(2)), add("b.parquet", dv=inline_dv(3))),  # a DV update
        spark_file(remove("e.parquet"), add("e.parquet", size=9)),  # removed and re-added in one commit
        spark_file(remove("f.parquet"), remove("g.parquet"), remove("h.parquet"), add("opt.parquet")),
        spark_file(
            protocol(minWriterVersion=4), metadata(**{"delta.logRetentionDuration": "interval 1 days"})
        ),
        spark_file(add("i.parquet")),
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
    if store.engine.dialect.name in ("postgresql", "sqlite"):  # every kind: removes, DV updates, protocols
        assert fast == list(range(1, 17))
    else:
        assert fast == []  # DuckDB (and MySQL): every commit takes the transaction path
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
    assert [f.dv_id for f in store.active_files(a.id, 16) if f.path == "b.parquet"] == ["idv3"]
    assert {f.path for f in store.active_files(a.id, 16)} == {
        "a.parquet",
        "café {1,2}.parquet",
        "p=1/c.parquet",
        "p=2/d.parquet",
        "b.parquet",
        "e.parquet",
        "opt.parquet",
        "i.parquet",
    }
    assert store.commit_bytes(a.id, 6) == known_root_history()[6]


def test_a_commit_to_a_known_root_is_one_statement_on_postgresql(store: SqlStore, location: str) -> None:
    """PostgreSQL: one round trip in libpq's trace for the commit (the statement runs on the driver's
    connection, below SQLAlchemy's statement events) and one after it for its NOTIFY (migration
    0007: sent outside the commit's transaction); SQLite: one short transaction in SQLite's own trace (it
    runs on the sqlite3 connection directly)."""
    from store.test_commit_round_trips import RoundTrips
    from store.test_sqlite_commit import Statements, short_transaction

    store.commit_verbatim(location, 0, v0_file(), create_name="t")
    statements: list[str] = []
    event.listen(store.engine, "before_cursor_execute", lambda *a: statements.append(a[2]))
    trips = RoundTrips(store) if store.engine.dialect.name == "postgresql" else None
    seen = Statements(store) if store.engine.dialect.name == "sqlite" else None
    store.commit_verbatim(location, 1, spark_file(add("b.parquet"), add("c.parquet")))
    if trips is not None:
        assert trips.count() == 2, trips.text  # the commit, then its NOTIFY
    elif seen is not None:  # BEGIN IMMEDIATE, the claim, the other rows, COMMIT (no round trips there)
        assert seen.seen == short_transaction([add("b.parquet"), add("c.parquet")]), seen.seen
    else:
        assert len(statements) == 6, statements
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
    same = spark_file(add("same.parquet"))

    def writer(w: int, barrier: threading.Barrier) -> tuple[str, str]:
        """Two rounds: version 2 with different bytes each, version 3 with the same bytes for all."""
        barrier.wait()
        different = won_or_refused(
            lambda: store.commit_verbatim(location, 2, spark_file(add(f"w{w}.parquet"))), CommitConflictError
        )
        result = store.commit_verbatim(location, 3, same)
        return different, "existing" if result.existing else "committed"

    outcomes = race(writers, writer)
    assert sorted(o[0] for o in outcomes) == ["refused"] * (writers - 1) + ["won"]
    assert sorted(o[1] for o in outcomes) == ["committed"] + ["existing"] * (writers - 1)
    table = store.table_at(location)
    winner = [o[0] for o in outcomes].index("won")
    assert store.commit_bytes(table.id, 2) == spark_file(add(f"w{winner}.parquet"))
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
