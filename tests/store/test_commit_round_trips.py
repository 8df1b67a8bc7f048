"""Every commit kind in one round trip to PostgreSQL, with the transaction path's conflict semantics.

A one-statement commit is one round trip; the NOTIFY that announces its version to watchers is a
second one after it, its own transaction (migration 0007: a notifying commit holds PostgreSQL's
notify lock through its WAL flush, so it is not sent in the commit). The counts below are 2 for it.

Round trips are counted where they happen: libpq's protocol trace of every store connection, one
``Query`` (simple protocol) or ``Sync`` (extended protocol) message per round trip, so a pool
pre-ping, a BEGIN or a COMMIT counts as well as the commit's own statements.
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Callable
from contextlib import closing
from pathlib import Path
from typing import IO, Any

import psycopg
import pytest
from sqlalchemy import event, text
from store.store_kit import (
    COMMIT_KINDS,
    Action,
    add,
    inline_dv,
    metadata,
    protocol,
    remove,
    spark_file,
    store_rows,
    v0_file,
)

from delta_mirror.errors import InvalidActionError
from delta_mirror.store import SqlStore

pytestmark = pytest.mark.postgres

_ROUND_TRIP = re.compile(r"^(?:\S+\t)?F\t\d+\t(Query|Sync)\b", re.MULTILINE)


class RoundTrips:
    """The round trips a store's connections make (every connection opened after ``__init__``)."""

    def __init__(self, store: SqlStore) -> None:
        self.traced: list[tuple[Any, IO[str]]] = []
        self.text = ""  # the last trace read (shown when a count is off)
        event.listen(store.engine, "connect", self._trace)
        store.engine.dispose()  # every connection from now on is traced

    def _trace(self, dbapi_conn: Any, _record: Any) -> None:
        out = tempfile.TemporaryFile("w+")  # noqa: SIM115 (closed by the fixture's end)
        self.traced.append((dbapi_conn, out))
        self._start(dbapi_conn, out)

    @staticmethod
    def _start(dbapi_conn: Any, out: IO[str]) -> None:
        dbapi_conn.pgconn.trace(os.dup(out.fileno()))  # libpq's stream is its own (closed by untrace)
        dbapi_conn.pgconn.set_trace_flags(psycopg.pq.Trace.SUPPRESS_TIMESTAMPS)

    def count(self) -> int:
        total = 0
        for dbapi_conn, out in self.traced:
            if not dbapi_conn.closed:
                dbapi_conn.pgconn.untrace()  # flushes
                self._start(dbapi_conn, out)
            out.seek(0)
            self.text = out.read()
            total += len(_ROUND_TRIP.findall(self.text))
        return total

    def of(self, work: Callable[[], object]) -> int:
        before = self.count()
        work()
        return self.count() - before


def info(n: int) -> dict[str, Any]:
    """A fixed commitInfo (a native commit keeps a writer's): equal bytes on both paths."""
    return {"timestamp": 1700000000000 + n, "operation": "WRITE", "operationParameters": {}}


@pytest.mark.parametrize("kind", list(COMMIT_KINDS))
def test_every_native_commit_kind_is_one_round_trip_and_its_notify(
    pg_store: SqlStore, location: str, kind: str
) -> None:
    pg_store.create_table("t", location)
    pg_store.commit("t", [protocol(), metadata(), add("a.parquet")])  # the transaction path: remembered
    pg_store.commit("t", [add("b.parquet")])
    trips = RoundTrips(pg_store)
    n = trips.of(lambda: pg_store.commit("t", COMMIT_KINDS[kind]))
    assert n == 2, trips.text  # the commit, then its NOTIFY
    assert trips.of(lambda: pg_store.commit("t", [add("z.parquet")], expected_version=3)) == 2
    assert pg_store.latest_version(pg_store.get_table("t").id) == 3


@pytest.mark.parametrize("kind", list(COMMIT_KINDS))
def test_every_verbatim_commit_kind_is_one_round_trip_and_its_notify(
    pg_store: SqlStore, location: str, kind: str
) -> None:
    pg_store.commit_verbatim(location, 0, v0_file(), create_name="t")  # the root is remembered
    pg_store.commit_verbatim(location, 1, spark_file(add("b.parquet")))
    trips = RoundTrips(pg_store)
    assert trips.of(lambda: pg_store.commit_verbatim(location, 2, spark_file(*COMMIT_KINDS[kind]))) == 2
    assert pg_store.commit_bytes(pg_store.table_at(location).id, 2) == spark_file(*COMMIT_KINDS[kind])


def test_a_commit_on_a_fresh_store_takes_the_transaction_path(pg_store: SqlStore, location: str) -> None:
    """The figures the one-statement path is measured against (a store that never saw the table)."""
    pg_store.create_table("t", location)
    pg_store.commit("t", [protocol(), metadata(), add("a.parquet"), add("b.parquet")])
    pg_store._tables.clear()
    trips = RoundTrips(pg_store)
    assert trips.of(lambda: pg_store.commit("t", [remove("a.parquet"), add("m.parquet")])) > 5


def native_history() -> list[list[Action]]:
    """Every native commit kind, with in-commit timestamps on from version 3 (they read the store's
    greatest one), each with a fixed commitInfo so both paths render the same bytes."""
    ict_on = metadata(**{"delta.enableInCommitTimestamps": "true"})
    return [
        [("commitInfo", info(0)), protocol(), metadata(), add("a.parquet"), add("b.parquet")],
        [("commitInfo", info(1)), add("c.parquet", partitionValues={"p": "1"})],
        [("commitInfo", info(2)), remove("a.parquet"), add("m.parquet")],
        [("commitInfo", info(3)), ict_on, protocol(minWriterVersion=7, writerFeatures=["inCommitTimestamp"])],
        [("commitInfo", info(4)), remove("b.parquet"), add("b.parquet", dv=inline_dv(1))],
        [("commitInfo", info(2)), add("c.parquet", size=5, partitionValues={"p": "1"})],  # ICT: above v4's
        [("commitInfo", info(6)), remove("c.parquet"), add("c.parquet", size=6)],
        [("commitInfo", info(7)), remove("m.parquet"), remove("c.parquet"), add("opt.parquet")],
        [("commitInfo", info(8)), add("z.parquet")],
    ]


def test_native_commits_from_memory_write_the_same_rows_as_the_transaction_path(
    pg_store: SqlStore, pg_store_url: str, tmp_path: Path
) -> None:
    pg_store.create_table("known", (tmp_path / "known").as_uri())
    pg_store.create_table("fresh", (tmp_path / "fresh").as_uri())
    trips = RoundTrips(pg_store)
    for version, actions in enumerate(native_history()):
        one = trips.of(lambda: pg_store.commit("known", actions))  # noqa: B023 (called at once)
        assert one == 2 or version == 0, (version, one)  # the commit and its NOTIFY
        with closing(SqlStore(pg_store_url)) as other:  # a store that never saw the table
            assert other.commit("fresh", actions) == version
    a, b = pg_store.get_table("known"), pg_store.get_table("fresh")
    assert store_rows(pg_store, a.id) == store_rows(pg_store, b.id)
    for version in range(len(native_history())):
        assert pg_store.commit_bytes(a.id, version) == pg_store.commit_bytes(b.id, version)
    assert b'"inCommitTimestamp":1700000000005' in pg_store.commit_bytes(a.id, 5)


def test_what_another_writer_changed_meanwhile_is_decided_by_the_transaction_path(
    pg_store: SqlStore, pg_store_url: str, location: str
) -> None:
    """A remembered table that another store committed to: the statement claims nothing and the
    transaction path refuses a remove of a file the other writer removed, with its usual message."""
    pg_store.create_table("t", location)
    pg_store.commit("t", [protocol(), metadata(), add("a.parquet"), add("b.parquet")])
    with closing(SqlStore(pg_store_url)) as other:
        other.commit("t", [remove("a.parquet")])
    with pytest.raises(InvalidActionError, match=r"remove of 'a\.parquet' which is not an active file"):
        pg_store.commit("t", [remove("a.parquet")])
    assert pg_store.commit("t", [remove("b.parquet")]) == 2
    assert pg_store.latest_version(pg_store.get_table("t").id) == 2


def test_a_remove_of_a_file_removed_meanwhile_claims_nothing_in_the_statement(
    pg_store: SqlStore, pg_store_url: str, location: str
) -> None:
    """The verbatim statement itself checks the removed file is active (the other writer's commit
    is the version before, so only that check can stop it): the refusal is the usual one."""
    pg_store.commit_verbatim(location, 0, v0_file(), create_name="t")
    with closing(SqlStore(pg_store_url)) as other:
        other.commit_verbatim(location, 1, spark_file(remove("a.parquet")))
    with pytest.raises(InvalidActionError, match=r"remove of 'a\.parquet' which is not an active file"):
        pg_store.commit_verbatim(location, 2, spark_file(remove("a.parquet")))
    assert pg_store.latest_version(pg_store.table_at(location).id) == 1


def test_a_commit_on_a_connection_the_server_closed_reconnects_without_a_pre_ping(
    pg_store: SqlStore, location: str
) -> None:
    """The server ends the pooled connections (as a restart does): the next commits still land,
    each in one round trip (and its NOTIFY) on a new connection, with no pre-ping before it."""
    pg_store.create_table("t", location)
    pg_store.commit("t", [protocol(), metadata(), add("a.parquet")])
    pg_store.commit_verbatim((Path(location[7:]).parent / "v").as_uri(), 0, v0_file(), create_name="v")
    trips = RoundTrips(pg_store)
    pg_store.commit("t", [add("b.parquet")])
    with pg_store.engine.connect() as conn:
        conn.execute(text("SELECT 1"))
    with closing(SqlStore(pg_store.url)) as admin, admin.engine.connect() as conn:
        ended = conn.execute(
            text(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
        ).scalar()
    assert ended
    assert trips.of(lambda: pg_store.commit("t", [remove("a.parquet")])) == 2
    assert pg_store.latest_version(pg_store.get_table("t").id) == 2


def test_a_commit_whose_connection_dies_under_it_is_sent_once_more(
    pg_store: SqlStore, location: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The connection is found dead only by the statement itself (the check at checkout misses
    it): native and verbatim commits are tried once more on a fresh connection and land once."""
    from delta_mirror.store.backends import postgresql

    pg_store.create_table("t", location)
    pg_store.commit("t", [protocol(), metadata(), add("a.parquet")])
    root = (Path(location[7:]).parent / "v").as_uri()
    pg_store.commit_verbatim(root, 0, v0_file(), create_name="v")

    def kill_pooled() -> None:
        with pg_store.engine.connect() as conn:
            pid = conn.execute(text("SELECT pg_backend_pid()")).scalar()
        with closing(SqlStore(pg_store.url)) as admin, admin.engine.connect() as conn:
            conn.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})

    monkeypatch.setattr(postgresql, "_closed_by_server", lambda _conn: False)
    pg_store.engine.dispose()
    kill_pooled()
    assert pg_store.commit("t", [remove("a.parquet"), add("b.parquet")]) == 1
    kill_pooled()
    assert not pg_store.commit_verbatim(root, 1, spark_file(add("c.parquet"))).existing
    kill_pooled()
    pg_store._tables.clear()  # the transaction path: its first statement finds it dead
    assert pg_store.commit("t", [add("c.parquet")]) == 2
    assert pg_store.latest_version(pg_store.get_table("t").id) == 2
    assert {f.path for f in pg_store.active_files(pg_store.get_table("t").id, 2)} == {
        "b.parquet",
        "c.parquet",
    }
