"""Watching many tables for new commits with one query per interval (the fleet's event path).

An event-driven deployment watches hundreds of tables from one process (Airflow's triggerer). A
poll per table (a new connection, four queries) grows with the fleet; here one
:class:`CommitWatcher` per store URL and event loop answers "what is each watched table's latest
version" for all of them in one statement on the process's pooled engine, and on PostgreSQL
wakes early on the ``NOTIFY`` that migration 0004 sends in every committing transaction. Polling
stays the fallback: a lost notification (listener reconnecting, store restart) costs at most one
interval, never a commit.

The watcher only reports versions; what counts as new (the watermark) is each subscriber's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import weakref
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass

from sqlalchemy import Engine, bindparam, text

from delta_mirror.store import db
from delta_mirror.store.base import CHUNK

log = logging.getLogger(__name__)


#: The channel migration 0004's trigger notifies (payload: the table id) on every new version.
CHANNEL = "delta_mirror_commits"

# Per table, each an index lookup (never a scan of its history): the latest version (the end of the
# dl_commits primary key), and what is published (as ``last_published_version`` computes it): the
# first JSON version not yet SUCCESS (the partial index ix_dl_mirror_status_open of migration 0004;
# the literal predicate lets both planners use it), else the highest JSON version.
_VERSIONS = text(
    "SELECT t.name, t.first_version, "
    "(SELECT max(c.version) FROM dl_commits c WHERE c.table_id = t.id) AS latest, "
    "(SELECT min(s.version) FROM dl_mirror_status s WHERE s.table_id = t.id AND s.artifact = 'json' "
    "AND s.state <> 'SUCCESS') AS first_open, "
    "(SELECT max(s.version) FROM dl_mirror_status s WHERE s.table_id = t.id AND s.artifact = 'json') AS top "
    "FROM dl_tables t WHERE t.name IN :names"
).bindparams(bindparam("names", expanding=True))


@dataclass(frozen=True)
class TableVersions:
    """A watched table's latest committed version and last published one (None: none yet)."""

    latest: int | None
    published: int | None


def _published(first_version: int, first_open: int | None, top: int | None) -> int | None:
    if first_open is not None:
        return None if first_open <= first_version else int(first_open) - 1
    return None if top is None else int(top)


def table_versions(engine: Engine, names: Iterable[str]) -> dict[str, TableVersions]:
    """Each named table's versions; tables not in the store are absent.

    One statement per ``CHUNK`` names (one for up to 500 tables).
    """
    wanted = sorted(set(names))
    found: dict[str, TableVersions] = {}
    # PostgreSQL: no transaction for one read-only statement (no BEGIN / ROLLBACK round trips)
    pg = engine.dialect.name == "postgresql"
    on = engine.execution_options(isolation_level="AUTOCOMMIT") if pg else db.reader(engine)
    with on.connect() as conn:
        for start in range(0, len(wanted), CHUNK):
            for row in conn.execute(_VERSIONS, {"names": wanted[start : start + CHUNK]}):
                latest = None if row.latest is None else int(row.latest)
                found[str(row.name)] = TableVersions(
                    latest, _published(int(row.first_version), row.first_open, row.top)
                )
    return found


def latest_versions(engine: Engine, names: Iterable[str]) -> dict[str, int | None]:
    """Each named table's latest version (None: no version yet); tables not in the store are absent."""
    return {name: v.latest for name, v in table_versions(engine, names).items()}


class Subscription:
    """One watched table: ``wait`` returns after each poll that saw its versions change (``latest``,
    ``published``), its first answer, or a failed poll (``error``)."""

    def __init__(self, watcher: CommitWatcher, table: str, interval: float) -> None:
        self.watcher = watcher
        self.table = table
        self.interval = interval
        self.latest: int | None = None
        self.published: int | None = None
        self.error: str | None = None
        self.seen = False  # at least one poll answered for this table
        self._changed = asyncio.Event()

    def _report(self, found: dict[str, TableVersions]) -> None:
        versions = found.get(self.table, TableVersions(None, None))
        if not self.seen or versions != TableVersions(self.latest, self.published) or self.error is not None:
            self.latest, self.published, self.seen, self.error = (
                versions.latest,
                versions.published,
                True,
                None,
            )
            self._changed.set()

    def _fail(self, message: str) -> None:
        # every failed poll wakes the subscriber: it may resolve the store's URL again
        self.error = message
        self._changed.set()

    async def wait(self) -> int | None:
        """Wait for the next change (the first answer, new versions or a failed poll); the latest."""
        await self._changed.wait()
        self._changed.clear()
        return self.latest


class CommitWatcher:
    """Polls the latest and published versions of all subscribed tables of one store; one task.

    ``interval`` is the smallest of the subscribers' poll intervals. On PostgreSQL a second task
    LISTENs on :data:`CHANNEL` and wakes the poll at once; it reconnects on its own.
    """

    def __init__(self, url: str) -> None:
        self.url = url
        self.engine = db.shared_engine(url)
        self.subscriptions: set[Subscription] = set()
        self.polls = 0  # statements the watcher ran (for tests and the fleet benchmark)
        self.notifications = 0
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    @property
    def interval(self) -> float:
        return min((s.interval for s in self.subscriptions), default=5.0)

    @contextlib.asynccontextmanager
    async def subscribe(self, table: str, interval: float) -> AsyncIterator[Subscription]:
        sub = Subscription(self, table, interval)
        self.subscriptions.add(sub)
        self._start()
        self._wake.set()  # a new table is answered at once, not after a full interval
        try:
            yield sub
        finally:
            self.subscriptions.discard(sub)
            if not self.subscriptions:
                await self._stop()

    def _start(self) -> None:
        if self._tasks:
            return
        self._tasks.append(asyncio.create_task(self._poll_loop(), name=f"delta-mirror watch {self.url}"))
        if self.engine.dialect.name == "postgresql":
            self._tasks.append(asyncio.create_task(self._listen_loop(), name="delta-mirror listen"))

    async def _stop(self) -> None:
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        if tasks:  # bounded: a poll stuck in its thread must not hold the last subscriber's exit
            await asyncio.wait(tasks, timeout=5.0)

    async def poll_once(self) -> None:
        subs = list(self.subscriptions)
        if not subs:
            return
        try:
            found = await asyncio.to_thread(table_versions, self.engine, {s.table for s in subs})
        except Exception as exc:
            message = f"polling the store for {len(subs)} table(s) failed: {str(exc).splitlines()[0][:300]}"
            log.warning("%s", message)
            for sub in subs:
                sub._fail(message)
            return
        finally:
            self.polls += 1
        for sub in subs:
            sub._report(found)

    async def _poll_loop(self) -> None:
        while True:
            self._wake.clear()
            await self.poll_once()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.interval)

    async def _listen_loop(self) -> None:
        import psycopg  # PostgreSQL stores only

        conninfo = db.libpq_url(self.url)
        while True:
            try:
                async with await psycopg.AsyncConnection.connect(conninfo, autocommit=True) as conn:
                    await conn.execute(f"LISTEN {CHANNEL}")
                    self._wake.set()  # commits made while (re)connecting: poll once now
                    async for _note in conn.notifies():
                        self.notifications += 1
                        self._wake.set()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.info("LISTEN %s on the store failed (%s); polling meanwhile", CHANNEL, str(exc)[:200])
            await asyncio.sleep(self.interval)


# One watcher per (event loop, store URL): asyncio objects belong to one loop, and Airflow's
# triggerer runs every trigger of the process in one loop.
_WATCHERS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, CommitWatcher]] = (
    weakref.WeakKeyDictionary()
)


def watcher_for(url: str) -> CommitWatcher:
    """The running loop's watcher of the store at ``url`` (made on first use)."""
    per_loop = _WATCHERS.setdefault(asyncio.get_running_loop(), {})
    watcher = per_loop.get(url)
    if watcher is None:
        watcher = per_loop[url] = CommitWatcher(url)
    return watcher


def watchers() -> Sequence[CommitWatcher]:
    """The running loop's watchers (for tests and the fleet benchmark)."""
    return list(_WATCHERS.get(asyncio.get_running_loop(), {}).values())


__all__ = [
    "CHANNEL",
    "CommitWatcher",
    "Subscription",
    "TableVersions",
    "latest_versions",
    "table_versions",
    "watcher_for",
    "watchers",
]
