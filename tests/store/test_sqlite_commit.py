"""Every commit kind on SQLite in one short write transaction (``store/sqlite_commit.py``), with the
transaction path's rows, refusals, race outcomes and crash safety.

The statements a commit runs are counted where SQLite executes them (``sqlite3``'s trace callback
on every store connection, so a statement run around SQLAlchemy counts too): the short transaction
is the ``BEGIN IMMEDIATE`` that takes the write lock, the claim, the rows' inserts and updates and
COMMIT, with no read.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable, Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event
from store.store_kit import (
    COMMIT_KINDS,
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
from support.race import race

from delta_mirror.errors import CommitConflictError, InvalidActionError
from delta_mirror.failpoints import ENV as FAILPOINTS
from delta_mirror.store import SqlStore, sqlite_commit

WRITERS = 8


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'store.db'}"


@pytest.fixture
def sqlite_store(sqlite_url: str) -> Iterator[SqlStore]:
    store = SqlStore(sqlite_url)
    store.init()
    yield store
    store.close()


class Statements:
    """The statements SQLite runs for a store (their first three words; an ``executemany``'s rows
    as one), on every connection opened from ``__init__`` on."""

    def __init__(self, store: SqlStore) -> None:
        self.seen: list[str] = []
        event.listen(
            store.engine, "connect", lambda dbapi_conn, _record: dbapi_conn.set_trace_callback(self._saw)
        )
        store.engine.dispose()  # every connection from now on is traced

    def _saw(self, statement: str) -> None:
        words = " ".join(statement.split()[:3])
        if not self.seen or self.seen[-1] != words:
            self.seen.append(words)

    def of(self, work: Callable[[], object]) -> list[str]:
        self.seen.append("")  # a break: the same statement starting ``work`` is not folded away
        before = len(self.seen)
        work()
        return self.seen[before:]


def short_transaction(actions: list[Action]) -> list[str]:
    """The statements of one commit of ``actions`` (after version 0) in the short transaction."""
    kinds = {k for k, _ in actions}
    return [
        "BEGIN IMMEDIATE",
        "INSERT INTO dl_commits",
        "INSERT INTO dl_actions",
        *(["UPDATE dl_files SET"] if kinds & {"add", "remove"} else []),  # the entries it ends
        *(["INSERT INTO dl_files"] if "add" in kinds else []),
        "INSERT INTO dl_mirror_status",
        "COMMIT",
    ]


@pytest.mark.parametrize("kind", list(COMMIT_KINDS))
def test_every_native_commit_kind_is_one_short_transaction(
    sqlite_store: SqlStore, location: str, kind: str
) -> None:
    sqlite_store.create_table("t", location)
    sqlite_store.commit("t", [protocol(), metadata(), add("a.parquet")])  # the transaction path: remembered
    sqlite_store.commit("t", [add("b.parquet")])
    seen = Statements(sqlite_store)
    assert seen.of(lambda: sqlite_store.commit("t", COMMIT_KINDS[kind])) == short_transaction(
        COMMIT_KINDS[kind]
    )
    assert sqlite_store.latest_version(sqlite_store.get_table("t").id) == 2


@pytest.mark.parametrize("kind", list(COMMIT_KINDS))
def test_every_verbatim_commit_kind_is_one_short_transaction(
    sqlite_store: SqlStore, location: str, kind: str
) -> None:
    sqlite_store.commit_verbatim(location, 0, v0_file(), create_name="t")  # the root is remembered
    sqlite_store.commit_verbatim(location, 1, spark_file(add("b.parquet")))
    seen = Statements(sqlite_store)
    data = spark_file(*COMMIT_KINDS[kind])
    assert seen.of(lambda: sqlite_store.commit_verbatim(location, 2, data)) == short_transaction(
        COMMIT_KINDS[kind]
    )
    assert sqlite_store.commit_bytes(sqlite_store.table_at(location).id, 2) == data


def test_a_merge_on_a_fresh_store_takes_the_transaction_path(sqlite_store: SqlStore, location: str) -> None:
    """What the short transaction is measured against: a store that never saw the table reads it."""
    sqlite_store.create_table("t", location)
    sqlite_store.commit("t", [protocol(), metadata(), add("a.parquet"), add("b.parquet")])
    sqlite_store._tables.clear()
    seen = Statements(sqlite_store)
    statements = seen.of(lambda: sqlite_store.commit("t", [remove("a.parquet"), add("m.parquet")]))
    assert len(statements) > len(short_transaction(COMMIT_KINDS["remove (MERGE)"]))
    assert any(s.startswith("SELECT") for s in statements)


def native_history() -> list[list[Action]]:
    """Every native commit kind, in-commit timestamps on from version 3, fixed commitInfos."""
    ict_on = metadata(**{"delta.enableInCommitTimestamps": "true"})

    def info(n: int) -> Action:
        return (
            "commitInfo",
            {"timestamp": 1700000000000 + n, "operation": "WRITE", "operationParameters": {}},
        )

    return [
        [info(0), protocol(), metadata(), add("a.parquet"), add("b.parquet")],
        [info(1), add("c.parquet", partitionValues={"p": "1"})],
        [info(2), remove("a.parquet"), add("m.parquet")],
        [info(3), ict_on, protocol(minWriterVersion=7, writerFeatures=["inCommitTimestamp"])],
        [info(4), remove("b.parquet"), add("b.parquet", dv=inline_dv(1))],
        [info(2), add("c.parquet", size=5, partitionValues={"p": "1"})],  # ICT: above v4's
        [info(6), remove("c.parquet"), add("c.parquet", size=6)],
        [info(7), remove("m.parquet"), remove("c.parquet"), add("opt.parquet")],
        [info(8), add("z.parquet")],
    ]


def test_native_commits_in_the_short_transaction_write_the_transaction_paths_rows(
    sqlite_store: SqlStore, sqlite_url: str, tmp_path: Path
) -> None:
    sqlite_store.create_table("known", (tmp_path / "known").as_uri())
    sqlite_store.create_table("fresh", (tmp_path / "fresh").as_uri())
    seen = Statements(sqlite_store)
    for version, actions in enumerate(native_history()):
        statements = seen.of(lambda: sqlite_store.commit("known", actions))  # noqa: B023 (called at once)
        assert version == 0 or statements == short_transaction(actions), (version, statements)
        with closing(SqlStore(sqlite_url)) as other:  # a store that never saw the table
            assert other.commit("fresh", actions) == version
    a, b = sqlite_store.get_table("known"), sqlite_store.get_table("fresh")
    assert store_rows(sqlite_store, a.id) == store_rows(sqlite_store, b.id)
    for version in range(len(native_history())):
        assert sqlite_store.commit_bytes(a.id, version) == sqlite_store.commit_bytes(b.id, version)
    assert b'"inCommitTimestamp":1700000000005' in sqlite_store.commit_bytes(a.id, 5)


@pytest.mark.parametrize("writer", ["native", "verbatim"])
def test_a_remove_of_a_file_that_is_not_active_is_refused_as_by_the_transaction_path(
    sqlite_store: SqlStore, sqlite_url: str, location: str, writer: str
) -> None:
    """Removed meanwhile by another store, or never added: the short transaction claims nothing (its
    claim finds the file inactive) and the transaction path refuses with its usual message."""
    sqlite_store.commit_verbatim(location, 0, v0_file(), create_name="t")
    sqlite_store.commit_verbatim(location, 1, spark_file(add("b.parquet")))
    sqlite_store.commit("t", [add("c.parquet")])  # both writers remember the table at version 2

    def commit(version: int, *actions: Action) -> None:
        if writer == "native":
            sqlite_store.commit("t", list(actions), expected_version=version)
        else:
            sqlite_store.commit_verbatim(location, version, spark_file(*actions))

    with closing(SqlStore(sqlite_url)) as other:
        other.commit("t", [remove("a.parquet")])
    sqlite_store.commit("t", [add("d.parquet")])  # remembered again, at version 4
    before = state(sqlite_store)
    seen = Statements(sqlite_store)
    for missing in ("a.parquet", "never.parquet"):
        with pytest.raises(InvalidActionError, match=rf"remove of '{missing}' which is not an active file"):
            commit(5, remove(missing), add("e.parquet"))
    assert state(sqlite_store) == before
    assert seen.seen[:2] == ["BEGIN IMMEDIATE", "INSERT INTO dl_commits"]  # tried, claimed nothing
    assert "INSERT INTO dl_actions" not in seen.seen
    commit(5, remove("b.parquet"), add("e.parquet"))
    table = sqlite_store.table_at(location)
    assert {f.path for f in sqlite_store.active_files(table.id, 5)} == {"c.parquet", "d.parquet", "e.parquet"}


@pytest.mark.parametrize("writer", ["native", "verbatim"])
def test_a_table_re_created_under_a_reused_id_is_not_taken_for_the_remembered_one(
    sqlite_store: SqlStore, sqlite_url: str, location: str, writer: str
) -> None:
    """SQLite gives a re-created table the id of the deleted one: same id, name and root, but what
    this store remembers of the old table (writer version 2) is not the new one's (5), so a change
    to 3 is refused as a downgrade, as the transaction path refuses it."""

    def create(store: SqlStore, writer_version: int) -> int:
        first = [protocol(minWriterVersion=writer_version), metadata(), add("a.parquet")]
        if writer == "native":
            store.create_table("t", location)
            store.commit("t", first)
            store.commit("t", [add("b.parquet")])
        else:
            store.commit_verbatim(location, 0, spark_file(*first), create_name="t")
            store.commit_verbatim(location, 1, spark_file(add("b.parquet")))
        return store.table_at(location).id

    old_id = create(sqlite_store, 2)  # remembered: the table, its protocol
    with closing(SqlStore(sqlite_url)) as other:
        other.delete_table(old_id)
        assert create(other, 5) == old_id
    with pytest.raises(InvalidActionError, match="protocol downgrade: minWriterVersion 5 -> 3"):
        if writer == "native":
            sqlite_store.commit("t", [protocol(minWriterVersion=3)])
        else:
            sqlite_store.commit_verbatim(location, 2, spark_file(protocol(minWriterVersion=3)))
    assert sqlite_store.latest_version(old_id) == 1


def merge_of(w: int, r: int) -> bytes:
    """Writer ``w``'s MERGE in round ``r``: it replaces the shared file and adds one of its own."""
    return spark_file(remove(f"shared-{r}.parquet"), add(f"shared-{r + 1}.parquet"), add(f"w{w}-{r}.parquet"))


def test_8_writers_racing_merges_in_the_short_transaction_get_one_winner_per_version(
    sqlite_store: SqlStore, sqlite_url: str, location: str
) -> None:
    """Every writer (its own store, as a service process would be) remembers the root, so each
    round all 8 race through the short transaction for the same version: the winner's claim lands,
    the 7 others claim nothing and get the conflict naming the table and version."""
    sqlite_store.commit_verbatim(
        location, 0, spark_file(protocol(), metadata(), add("shared-0.parquet")), create_name="t"
    )
    rounds = 8

    def writer(w: int, barrier: threading.Barrier) -> list[tuple[str, bool]]:
        outcomes = []
        with closing(SqlStore(sqlite_url)) as s:
            s._tables.remember_root(s.table_at(location))
            short = s._commit_verbatim_fast
            claimed: list[bool] = []  # per round: whether each short transaction claimed the version

            def counted(table: Any, commit: Any) -> Any:
                done = short(table, commit)
                claimed.append(done is not None)
                return done

            s._commit_verbatim_fast = counted  # type: ignore[method-assign]
            for r in range(rounds):
                merge = merge_of(w, r)
                claimed.clear()
                barrier.wait()
                try:
                    s.commit_verbatim(location, r + 1, merge)
                    outcomes.append(("won", claimed == [True]))
                except CommitConflictError as exc:
                    assert (exc.table, exc.version) == ("t", r + 1)
                    outcomes.append(("conflict", claimed == [False]))
        return outcomes

    by_writer = race(WRITERS, writer, seconds=120)
    for r in range(rounds):
        assert sorted(by_writer[w][r] for w in range(WRITERS)) == [("conflict", True)] * (WRITERS - 1) + [
            ("won", True)
        ], r
    table = sqlite_store.table_at(location)
    assert sqlite_store.latest_version(table.id) == rounds
    winners = {
        f"w{w}-{r}.parquet" for w in range(WRITERS) for r in range(rounds) if by_writer[w][r][0] == "won"
    }
    assert {f.path for f in sqlite_store.active_files(table.id, rounds)} == winners | {
        f"shared-{rounds}.parquet"
    }
    for r in range(rounds):  # each version whole: the winner's bytes, its rows
        w = [o[0] for o in (by_writer[w][r] for w in range(WRITERS))].index("won")
        assert sqlite_store.commit_bytes(table.id, r + 1) == merge_of(w, r)
    assert state(sqlite_store)["counts"] == {
        "dl_tables": 1,
        "dl_commits": rounds + 1,
        "dl_actions": 4 * (rounds + 1),
        "dl_files": 1 + 2 * rounds,
        "dl_mirror_status": rounds + 1,
    }


# A writer process killed inside its short transaction: every row written, COMMIT not sent.
_KILLED = textwrap.dedent(
    """
    import sys
    from store.store_kit import add, remove, spark_file
    from delta_mirror.store import SqlStore

    url, location, writer = sys.argv[1], sys.argv[2], sys.argv[3]
    store = SqlStore(url)
    if writer == "native":
        store.commit("t", [add("b.parquet")])  # the transaction path: the table is remembered
        store.commit("t", [remove("a.parquet"), add("c.parquet")])  # the short one: killed
    else:
        store.commit_verbatim(location, 1, spark_file(add("b.parquet")))
        store.commit_verbatim(location, 2, spark_file(remove("a.parquet"), add("c.parquet")))
    print("not killed", flush=True)
    """
)


@pytest.mark.parametrize("writer", ["native", "verbatim"])
def test_a_writer_killed_inside_the_short_transaction_leaves_nothing_of_it(
    sqlite_store: SqlStore, sqlite_url: str, location: str, writer: str
) -> None:
    sqlite_store.commit_verbatim(location, 0, v0_file(), create_name="t")
    env = {
        **os.environ,
        FAILPOINTS: f"{sqlite_commit.BEFORE_COMMIT}:1",
        "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent.parent), os.environ.get("PYTHONPATH", "")]),
    }
    proc = subprocess.run(
        [sys.executable, "-c", _KILLED, sqlite_url, location, writer],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stdout + proc.stderr
    table = sqlite_store.table_at(location)
    after_version_1 = state(sqlite_store)
    assert after_version_1["latest"] == {table.id: 1}
    assert after_version_1["counts"]["dl_mirror_status"] == 2
    assert {f.path for f in sqlite_store.active_files(table.id, 1)} == {"a.parquet", "b.parquet"}
    # the write lock went with the process: version 2 is free, for this store's short transaction too
    data = spark_file(remove("a.parquet"), add("d.parquet"))
    seen = Statements(sqlite_store)
    assert seen.of(lambda: sqlite_store.commit_verbatim(location, 2, data))[:2] == [
        "BEGIN IMMEDIATE",
        "INSERT INTO dl_commits",
    ]
    assert sqlite_store.commit_bytes(table.id, 2) == data
    assert {f.path for f in sqlite_store.active_files(table.id, 2)} == {"b.parquet", "d.parquet"}
