"""The fleet watcher on a replicated store (issue 40): a real PostgreSQL primary and streaming
standby (``tests/support/pg_pair.py``), the store given by its multi-host URL with
``target_session_attrs=read-write``. The primary is SIGKILLed under the watcher and the standby
promoted: the watcher's ``LISTEN`` reconnects to the promoted node by itself and hears the next
commit's ``NOTIFY``, with polling held off (an hour's interval) so that only a notification can
report it; losing the ``LISTEN`` is logged once at WARNING, getting it back at INFO."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from store_kit import add, new_table
from support.pg_pair import PgPair
from support.waiting import load_scaled

from delta_mirror.store import SqlStore
from delta_mirror.store.watch import CommitWatcher, VersionsReport

pytestmark = pytest.mark.postgres

NO_POLLING = 3600.0  # a report within seconds of a commit is the NOTIFY's, never a poll's


@pytest.fixture
def pair() -> Iterator[PgPair]:
    with PgPair.running(synchronous=True) as pair:
        yield pair


async def next_report(reports: asyncio.Queue[VersionsReport], seconds: float, latest: int) -> VersionsReport:
    """The first report in which table ``t`` is at ``latest`` (errors and older reports skipped)."""
    deadline = asyncio.get_running_loop().time() + seconds
    while True:
        left = deadline - asyncio.get_running_loop().time()
        if left <= 0:
            raise AssertionError(f"no report of version {latest} within {seconds:.0f} s")
        report = await asyncio.wait_for(reports.get(), left)
        if report.error is None and report.of("t").latest == latest:
            return report


async def until(check: object, seconds: float, what: str) -> None:
    deadline = asyncio.get_running_loop().time() + seconds
    while not check():  # type: ignore[operator]
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"{what} not within {seconds:.0f} s")
        await asyncio.sleep(0.05)


def test_the_watcher_keeps_its_listen_across_a_failover_and_hears_the_promoted_primarys_notify(
    pair: PgPair, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "delta_mirror.store.watch")
    store = SqlStore(pair.url)
    store.init()
    new_table(store, (tmp_path / "t").as_uri(), "t")

    async def scenario() -> None:
        watcher = CommitWatcher(pair.url, interval=NO_POLLING, names=lambda: ["t"])
        reports: asyncio.Queue[VersionsReport] = asyncio.Queue()

        async def produce() -> None:
            async for report in watcher.reports():
                await reports.put(report)

        producer = asyncio.create_task(produce())
        try:
            await next_report(reports, load_scaled(20), 0)  # the first poll
            await until(lambda: watcher.listening, load_scaled(20), "the LISTEN")

            await asyncio.to_thread(store.commit, "t", [add("b.parquet")])
            await next_report(reports, load_scaled(10), 1)
            assert watcher.notifications >= 1

            await asyncio.to_thread(pair.kill_primary)
            await until(lambda: not watcher.listening, load_scaled(10), "the LISTEN to notice the kill")
            await asyncio.to_thread(pair.promote)
            await until(lambda: watcher.listens == 2, load_scaled(20), "the LISTEN on the promoted standby")
            polls, heard = watcher.polls, watcher.notifications

            committed = await asyncio.to_thread(store.commit, "t", [add("c.parquet")])
            assert committed == 2
            report = await next_report(reports, load_scaled(10), 2)
            assert report.of("t").latest == 2
            assert watcher.notifications > heard  # woken by the promoted node's NOTIFY ...
            assert watcher.polls <= polls + 2  # ... then polled once (or twice: the reconnect's own poll)
            assert watcher.listening
        finally:
            producer.cancel()
            await asyncio.wait([producer], timeout=10)

    asyncio.run(scenario())
    store.close()
    lost = [r for r in caplog.records if "LISTEN" in r.getMessage() and "failed" in r.getMessage()]
    assert [r.levelno for r in lost] == [logging.WARNING], [r.getMessage() for r in lost]
    assert f"127.0.0.1:{pair.primary.port},127.0.0.1:{pair.standby.port}" in lost[0].getMessage()
    assert pair.password not in caplog.text
    back = [r for r in caplog.records if r.getMessage().endswith(") is back")]
    assert [r.levelno for r in back] == [logging.INFO]
