"""The commit NOTIFY on PostgreSQL (migration 0007): every committed version is announced once on
``watch.CHANNEL``, whichever path committed it. The one-statement commits announce it after their
commit, in a transaction of their own (a notifying commit holds PostgreSQL's notify lock through its
WAL flush, so notifying commits never share a flush); every other writer, and a process still on
the code before 0007, notifies in its transaction through the trigger, as migration 0004 did."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import closing
from typing import Any

import psycopg
import pytest
from alembic import command
from alembic.config import Config
from sqlalchemy import text
from store.store_kit import add, metadata, protocol, remove, spark_file, v0_file
from support.waiting import load_scaled

from delta_mirror.errors import CommitConflictError
from delta_mirror.store import SqlStore, db, pg_exec, urls
from delta_mirror.store.watch import CHANNEL, CommitWatcher


class Listener:
    """A connection LISTENing on the commit channel, as a watcher's is."""

    def __init__(self, url: str) -> None:
        self.conn = psycopg.connect(urls.libpq_url(url), autocommit=True)
        self.conn.execute(f"LISTEN {CHANNEL}")

    def heard(self, quiet: float = 0.5) -> list[str]:
        """Every payload delivered until nothing more comes for ``quiet`` seconds (load-scaled)."""
        got: list[str] = []
        while True:
            batch = [n.payload for n in self.conn.notifies(timeout=load_scaled(quiet))]
            if not batch:
                return got
            got += batch


@pytest.fixture
def listener(pg_store: SqlStore) -> Iterator[Listener]:
    heard = Listener(pg_store.url)
    with closing(heard.conn):
        yield heard


@pytest.fixture
def fast_commits(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The payloads the one-statement path asked ``pg_exec.scalar`` to notify (proves the path taken)."""
    asked: list[str] = []
    real = pg_exec.scalar

    def spy(engine: Any, sql: str, params: Any, *, notify: str | None = None) -> Any:
        if notify is not None:
            asked.append(notify)
        return real(engine, sql, params, notify=notify)

    monkeypatch.setattr(pg_exec, "scalar", spy)
    return asked


pytestmark = pytest.mark.postgres


def test_every_native_version_is_announced_once_on_the_transaction_and_the_one_statement_path(
    pg_store: SqlStore, location: str, listener: Listener, fast_commits: list[str]
) -> None:
    pg_store.create_table("t", location)
    tid = str(pg_store.get_table("t").id)
    pg_store.commit("t", [protocol(), metadata(), add("a.parquet"), add("b.parquet")])  # transaction path
    assert fast_commits == []
    assert listener.heard() == [tid]
    pg_store.commit("t", [add("c.parquet")])  # an append: APPEND
    pg_store.commit("t", [remove("a.parquet"), add("m.parquet")])  # a remove: COMMIT
    assert fast_commits == [tid, tid]
    assert listener.heard() == [tid, tid]
    pg_store._tables.clear()  # forgotten: the transaction path again
    pg_store.commit("t", [add("d.parquet")])
    assert fast_commits == [tid, tid]
    assert listener.heard() == [tid]
    assert pg_store.latest_version(int(tid)) == 3


def test_every_verbatim_version_is_announced_once_on_either_path(
    pg_store: SqlStore, location: str, listener: Listener, fast_commits: list[str]
) -> None:
    pg_store.commit_verbatim(location, 0, v0_file(), create_name="t")
    tid = str(pg_store.table_at(location).id)
    pg_store.commit_verbatim(location, 1, spark_file(add("b.parquet")))
    pg_store.commit_verbatim(location, 2, spark_file(remove("b.parquet"), add("c.parquet")))
    assert fast_commits == [tid, tid]
    assert listener.heard() == [tid, tid, tid]


def test_a_refused_or_lost_commit_announces_nothing(
    pg_store: SqlStore, pg_store_url: str, location: str, listener: Listener, fast_commits: list[str]
) -> None:
    pg_store.create_table("t", location)
    pg_store.commit("t", [protocol(), metadata(), add("a.parquet")])
    pg_store.commit("t", [add("b.parquet")])
    listener.heard()
    other = SqlStore(pg_store_url)  # another writer takes version 2 behind this store's back
    try:
        other.commit("t", [remove("a.parquet")])
    finally:
        other.close()
    assert len(listener.heard()) == 1
    asked = len(fast_commits)
    with pytest.raises(CommitConflictError):
        pg_store.commit("t", [remove("a.parquet")], expected_version=2)  # the statement claims nothing
    assert len(fast_commits) == asked + 1  # it was tried in one statement
    pg_store.commit_verbatim(location + "v", 0, v0_file(), create_name="v")
    pg_store.commit_verbatim(location + "v", 1, spark_file(add("x.parquet")))
    listener.heard()
    with pytest.raises(CommitConflictError):
        pg_store.commit_verbatim(location + "v", 1, spark_file(add("y.parquet")))  # version taken
    assert listener.heard() == []


def test_the_flag_ends_with_the_commit_and_the_connections_next_transaction_notifies_itself(
    pg_store: SqlStore, location: str, listener: Listener
) -> None:
    pg_store.create_table("t", location)
    pg_store.commit("t", [protocol(), metadata(), add("a.parquet")])
    listener.heard()
    pid = pg_exec.scalar(pg_store.engine, "SELECT pg_backend_pid()", {})
    pg_store.commit("t", [add("b.parquet")])  # one statement on the pooled connection
    assert pg_exec.scalar(pg_store.engine, "SELECT pg_backend_pid()", {}) == pid  # the same connection
    flag = "SELECT current_setting('delta_mirror.notify_after_commit', true)"
    assert pg_exec.scalar(pg_store.engine, flag, {}) in ("", None)
    with pg_store.engine.connect() as conn:
        assert conn.exec_driver_sql("SELECT pg_backend_pid()").scalar() == pid
        assert conn.exec_driver_sql(flag).scalar() in ("", None)
    assert len(listener.heard()) == 1
    pg_store._tables.clear()
    pg_store.commit("t", [add("c.parquet")])  # the transaction path on that connection: the trigger
    assert len(listener.heard()) == 1


def test_a_writer_that_does_not_say_so_is_still_announced_by_the_trigger(
    pg_store: SqlStore, location: str, listener: Listener
) -> None:
    """What a process on the code before migration 0007 runs: a plain insert into ``dl_commits``."""
    pg_store.create_table("t", location)
    tid = pg_store.get_table("t").id
    insert = (
        "INSERT INTO dl_commits (table_id, version, committed_at, action_count, size_bytes, sha256, has_json, "
        f"source) VALUES ({tid}, %s, 0, 0, 0, 'x', true, 'DELTA_MIRROR')"
    )
    with pg_store.engine.begin() as conn:
        conn.exec_driver_sql(insert, (0,))
    assert listener.heard() == [str(tid)]
    with pg_store.engine.begin() as conn:  # one that says it notifies itself and does not: silence
        conn.exec_driver_sql("SELECT set_config('delta_mirror.notify_after_commit', 'on', true)")
        conn.exec_driver_sql(insert, (1,))
    assert listener.heard() == []


def test_a_watcher_wakes_on_a_one_statement_commit_long_before_its_poll_interval(
    pg_store: SqlStore, location: str, fast_commits: list[str]
) -> None:
    pg_store.create_table("t", location)
    pg_store.commit("t", [protocol(), metadata(), add("a.parquet")])

    async def main() -> None:
        watcher = CommitWatcher(pg_store.url, 60.0, lambda: ["t"])
        reports = watcher.reports()
        try:
            first = await asyncio.wait_for(reports.__anext__(), load_scaled(10.0))
            assert first.of("t").latest == 0
            loop = asyncio.get_running_loop()
            deadline = loop.time() + load_scaled(10.0)
            while watcher.notifications == 0 and loop.time() < deadline:  # the LISTEN is up: it woke once
                await asyncio.sleep(0.05)
            heard = watcher.notifications
            started = loop.time()
            await asyncio.to_thread(pg_store.commit, "t", [add("b.parquet")])
            assert fast_commits  # the one-statement path
            report = await asyncio.wait_for(reports.__anext__(), load_scaled(10.0))
            assert report.of("t").latest == 1
            assert loop.time() - started < load_scaled(5.0)  # far below the 60 s interval
            assert watcher.notifications == heard + 1
        finally:
            await reports.aclose()

    asyncio.run(main())


_CONFIG = Config()
_CONFIG.set_main_option("script_location", str(db.MIGRATIONS))


def _function_source(url: str) -> str:
    with closing(psycopg.connect(urls.libpq_url(url))) as conn:
        row = conn.execute(
            "SELECT prosrc FROM pg_proc WHERE proname = 'delta_mirror_notify_commit'"
        ).fetchone()
    assert row is not None
    return str(row[0])


def test_migration_0007_upgrades_and_downgrades_the_trigger_function(pg_store_url: str) -> None:
    store = SqlStore(pg_store_url)
    try:
        db.migrate(store.engine, "0006")
        assert "notify_after_commit" not in _function_source(pg_store_url)
        db.migrate(store.engine)
        assert "notify_after_commit" in _function_source(pg_store_url)
        with store.engine.begin() as conn:
            _CONFIG.attributes["connection"] = conn
            command.downgrade(_CONFIG, "0006")
            assert conn.execute(text("select version_num from alembic_version")).scalar() == "0006"
        assert "notify_after_commit" not in _function_source(pg_store_url)
        assert "pg_notify" in _function_source(pg_store_url)
    finally:
        store.close()


def test_the_commits_notify_on_the_channel_the_watchers_listen_to() -> None:
    """One constant; the triggers of migrations 0004 and 0007 spell it as a literal (history)."""
    from pathlib import Path

    from delta_mirror.store import schema

    assert pg_exec.CHANNEL == CHANNEL == schema.COMMIT_CHANNEL
    versions = Path(schema.__file__).parent / "migrations" / "versions"
    for migration in ("0004_commit_watch.py", "0007_notify_after_commit.py"):
        assert f"pg_notify('{CHANNEL}'" in (versions / migration).read_text()


def test_a_notify_that_fails_after_the_commit_is_logged_not_raised(
    pg_store: SqlStore, listener: Listener, caplog: pytest.LogCaptureFixture
) -> None:
    """The commit before it is durable: its caller hears of its success; watchers find it by polling."""
    got = pg_exec.scalar(pg_store.engine, "SELECT 7", {}, notify="x" * 9000)  # over NOTIFY's 8000 bytes
    assert got == 7
    assert "NOTIFY delta_mirror_commits after a commit failed" in caplog.text
    assert listener.heard() == []
    assert pg_exec.scalar(pg_store.engine, "SELECT 1", {}, notify="1") == 1  # the connection still serves
    assert listener.heard() == ["1"]
