"""The fleet watcher (``store/watch.py``, the producer of the triggers' shared stream) and the shared
engine (``db.shared_engine``) on real SQLite and PostgreSQL: one statement per poll for every watched
table, a report only when something changed (or a subscriber asked), NOTIFY wakes it before the poll
interval, a store restart loses no commit, and the connections stay few however many tables."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import pytest
from sqlalchemy import Engine, QueuePool, event, text
from store_kit import add, new_table
from support.waiting import load_scaled

from delta_mirror.jobs.publisher import Publisher
from delta_mirror.store import SqlStore, db
from delta_mirror.store.watch import (
    UNKNOWN,
    CommitWatcher,
    TableVersions,
    VersionsReport,
    latest_versions,
    table_versions,
    wait_at_most,
    watchers,
)

N_TABLES = 50


def make_tables(store: SqlStore, location: str, n: int) -> list[str]:
    names = [f"t{i:03d}" for i in range(n)]
    for name in names:
        new_table(store, f"{location}/{name}", name)
    return names


def count_statements(engine: Any) -> list[str]:
    seen: list[str] = []
    event.listen(engine, "before_cursor_execute", lambda _c, _cu, stmt, *_a: seen.append(stmt))
    return seen


def checked_in(engine: Engine) -> int:
    """Connections idle in the engine's pool."""
    pool = engine.pool
    assert isinstance(pool, QueuePool)
    return pool.checkedin()


def run(coro: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(coro())


def test_latest_versions_answers_every_table_in_one_statement(store: SqlStore, location: str) -> None:
    names = make_tables(store, location, 12)
    store.commit("t003", [add("b.parquet")])
    statements = count_statements(store.engine)
    found = latest_versions(store.engine, [*names, "missing"])
    assert found == {name: (1 if name == "t003" else 0) for name in names}
    assert len([s for s in statements if "dl_commits" in s]) == 1


def test_table_versions_publishes_what_last_published_version_says(store: SqlStore, location: str) -> None:
    """The watcher's one statement agrees with ``last_published_version`` for each table: nothing
    published, partly published, all published, and an unfinished version in the middle."""
    names = make_tables(store, location, 4)
    for name in names:
        store.commit(name, [add("b.parquet")])
        store.commit(name, [add("c.parquet")])
    Publisher(store).publish("t001", to_version=0)
    Publisher(store).publish("t002")
    Publisher(store).publish("t003", to_version=1)
    found = table_versions(store.engine, names)
    for name in names:
        table = store.get_table(name)
        assert found[name] == TableVersions(2, store.last_published_version(table.id)), name
    assert [found[n].published for n in names] == [None, 0, 2, 1]


def test_the_shared_engine_is_one_per_url_and_a_forked_child_gets_its_own_connections(
    store: SqlStore,
) -> None:
    first = SqlStore(store.url, shared_engine=True)
    second = SqlStore(store.url, shared_engine=True)
    assert first.engine is second.engine is db.shared_engine(store.url)
    first.close()  # leaves the shared pool to the other users
    assert second.list_tables() == []
    parent_conns = checked_in(first.engine)
    assert parent_conns >= 1
    pid = os.fork()
    if pid == 0:  # the child: the inherited pool was dropped, a query opens its own connection
        code = 1
        try:
            code = 0 if checked_in(first.engine) == 0 and second.list_tables() == [] else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert second.list_tables() == []  # the parent's connection still works after the child left


def pg_backends(url: str) -> int:
    """Connections to the store's database other than this query's own."""
    engine = db.make_engine(url)
    try:
        with engine.connect() as conn:
            return int(
                conn.execute(
                    text(
                        "SELECT count(*) FROM pg_stat_activity "
                        "WHERE datname = current_database() AND pid <> pg_backend_pid()"
                    )
                ).scalar_one()
            )
    finally:
        engine.dispose()


class Reports:
    """A watcher's ``reports()`` read in a task, as the triggerer's shared stream reads its producer."""

    def __init__(self, watcher: CommitWatcher) -> None:
        self.watcher = watcher
        self.seen: list[VersionsReport] = []
        self._queue: asyncio.Queue[VersionsReport] = asyncio.Queue()

    async def __aenter__(self) -> Reports:
        self._task = asyncio.create_task(self._read())
        return self

    async def _read(self) -> None:
        async for report in self.watcher.reports():
            self.seen.append(report)
            self._queue.put_nowait(report)

    async def next(self, timeout: float = 10.0) -> VersionsReport:
        """The next report, within ``timeout`` seconds stretched by the machine's load."""
        return await asyncio.wait_for(self._queue.get(), load_scaled(timeout))

    async def until(self, check: Callable[[VersionsReport], bool], timeout: float = 20.0) -> VersionsReport:
        deadline = asyncio.get_running_loop().time() + load_scaled(timeout)
        while True:
            left = max(0.1, deadline - asyncio.get_running_loop().time())
            report = await asyncio.wait_for(self._queue.get(), left)
            if check(report):
                return report

    async def __aexit__(self, *exc: object) -> None:
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        assert self.watcher not in watchers()  # closed: no poll or LISTEN task left


def latest(report: VersionsReport, names: list[str]) -> list[int | None]:
    return [report.of(n).latest for n in names]


@pytest.mark.postgres
def test_one_watcher_serves_50_tables_with_one_statement_per_poll_and_few_connections(
    pg_store_url: str, location: str
) -> None:
    store = SqlStore(pg_store_url)
    store.init()
    names = make_tables(store, location, N_TABLES)
    store.close()
    statements = count_statements(db.shared_engine(pg_store_url))

    async def main() -> None:
        watcher = CommitWatcher(pg_store_url, 0.1, lambda: names)
        async with Reports(watcher) as reports:
            assert latest(await reports.next(), names) == [0] * N_TABLES
            await asyncio.sleep(0.5)  # the LISTEN connection's first wake-up poll is done
            statements.clear()
            polls, seen = watcher.polls, len(reports.seen)
            await asyncio.sleep(1.0)
            # ~10 polls in that second, each one statement for all 50 tables, and nothing to report
            assert watcher.polls - polls >= 5
            assert len(statements) <= watcher.polls - polls + 1
            assert len(reports.seen) == seen
            assert pg_backends(pg_store_url) <= 3  # the pool's connection and the LISTEN connection

    run(main)


def test_the_watcher_polls_the_names_it_is_given_and_reports_again_when_refreshed(
    store: SqlStore, location: str
) -> None:
    names = make_tables(store, location, 3)
    watched = ["t000"]

    async def main() -> None:
        watcher = CommitWatcher(store.url, 60.0, lambda: watched)
        async with Reports(watcher) as reports:
            first = await reports.next()
            assert dict(first.versions) == {"t000": TableVersions(0, None)}
            assert first.of("t001") == UNKNOWN
            watched.append("t002")
            watcher.refresh()  # nothing changed for t000, but a new subscriber wants the state now
            second = await reports.next(timeout=5.0)
            assert latest(second, names) == [0, None, 0]

    run(main)


@pytest.mark.postgres
def test_notify_wakes_the_watcher_long_before_its_poll_interval(pg_store_url: str, location: str) -> None:
    store = SqlStore(pg_store_url)
    store.init()
    names = make_tables(store, location, 3)

    async def main() -> None:
        watcher = CommitWatcher(pg_store_url, 60.0, lambda: names)
        async with Reports(watcher) as reports:
            assert latest(await reports.next(), names) == [0, 0, 0]
            await asyncio.sleep(0.5)  # the LISTEN connection is up
            loop = asyncio.get_running_loop()
            started = loop.time()
            await asyncio.to_thread(store.commit, "t001", [add("b.parquet")])
            report = await reports.until(lambda r: r.of("t001").latest == 1, timeout=5.0)
            assert loop.time() - started < load_scaled(5.0)  # at most 30 s < the 60 s interval: NOTIFY
            assert latest(report, names) == [0, 1, 0]
            assert watcher.notifications >= 1

    run(main)


@pytest.mark.postgres
def test_a_store_restart_loses_no_commit(
    pg_store_url: str, location: str, pg_restart: Callable[..., None]
) -> None:
    store = SqlStore(pg_store_url)
    store.init()
    names = make_tables(store, location, 5)

    async def main() -> None:
        watcher = CommitWatcher(pg_store_url, 0.2, lambda: names)
        async with Reports(watcher) as reports:
            assert latest(await reports.next(), names) == [0] * 5
            await asyncio.to_thread(pg_restart)
            # the first poll after the restart fails or reconnects; either way the commit arrives
            await asyncio.to_thread(store.commit, "t004", [add("b.parquet")])
            report = await reports.until(lambda r: r.of("t004").latest == 1)
            assert latest(report, names) == [0, 0, 0, 0, 1]

    run(main)


def _loop_until_cancelled(wait: Callable[[asyncio.Event], Awaitable[object]]) -> bool:
    """Whether a loop waiting on an event stops when it is cancelled in the same turn the event is set."""

    async def main() -> bool:
        event = asyncio.Event()

        async def loop() -> None:
            while True:
                await wait(event)
                event.clear()

        task = asyncio.create_task(loop())
        await asyncio.sleep(0.05)  # the loop is waiting on the event
        event.set()
        task.cancel()
        await asyncio.wait([task], timeout=2.0)
        stopped = task.done()
        task.cancel()
        await asyncio.wait([task], timeout=2.0)
        return stopped

    return asyncio.run(main())


def test_a_wait_cancelled_as_its_event_fires_still_stops_the_loop() -> None:
    # The watcher and the trigger wait with wait_at_most: a cancel that arrives with a NOTIFY ends them.
    assert _loop_until_cancelled(lambda event: wait_at_most(event.wait(), 10.0))


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="Python 3.12's wait_for no longer loses a cancel")
def test_asyncio_wait_for_loses_that_cancel_on_this_python() -> None:
    # Why wait_at_most exists (the hang this reproduces was seen in the store-restart test).
    async def wait_for(event: asyncio.Event) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), 10.0)

    assert not _loop_until_cancelled(wait_for)
