"""Watching many tables for new commits with one query per interval (the fleet's event path).

An event-driven deployment watches hundreds of tables from one process (Airflow's triggerer). A
poll per table (a new connection, four queries) grows with the fleet; here one
:class:`CommitWatcher` answers "what is each watched table's latest and published version" for all
of them in one statement on the process's pooled engine, and on PostgreSQL wakes early on the
``NOTIFY`` of every committed version: migration 0004's trigger sends it in the committing
transaction, except for the one-statement commits, which send it just after their commit in a
transaction of their own (migration 0007, ``pg_exec.scalar(notify=...)``). Polling stays the
fallback: a lost notification (listener reconnecting, store restart, a connection lost between a
commit and its NOTIFY) costs at most one interval, never a commit.

The watcher is a producer: :meth:`CommitWatcher.reports` yields one :class:`VersionsReport` per
poll that changed something. Handing the reports to the tables' subscribers is the caller's job
(in Airflow, the triggerer's shared stream, ``airflow/triggers.py``); what counts as new (the
watermark) is each subscriber's. No Airflow import here: the core never imports Airflow.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import AsyncGenerator, Awaitable, Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from sqlalchemy import Engine, bindparam, text

from delta_mirror.store import db, urls
from delta_mirror.store.backends import backend_of
from delta_mirror.store.base import CHUNK
from delta_mirror.store.schema import COMMIT_CHANNEL

log = logging.getLogger(__name__)


#: The first pause before reconnecting a lost ``LISTEN`` (doubling up to the poll interval): a
#: promoted standby is listened to again within about a second of taking writes.
LISTEN_RETRY = 0.25

#: ``schema.COMMIT_CHANNEL``, the channel every new version is announced on.
CHANNEL = COMMIT_CHANNEL

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


#: What a report says of a table it does not know (not in the store, or not watched yet).
UNKNOWN = TableVersions(None, None)


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
    quick = backend_of(engine).autocommit_reads
    on = engine.execution_options(isolation_level="AUTOCOMMIT") if quick else db.reader(engine)
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


@dataclass(frozen=True)
class VersionsReport:
    """One poll of the watched tables: each one's versions, or why the poll failed (``error``).

    ``url`` is the store polled (it may carry a password: kept out of ``repr``)."""

    versions: Mapping[str, TableVersions]
    error: str | None = None
    url: str = field(default="", repr=False)

    def of(self, table: str) -> TableVersions:
        """The table's versions in this report (``UNKNOWN`` if it is not in it)."""
        return self.versions.get(table, UNKNOWN)


async def wait_at_most(awaitable: Awaitable[object], timeout: float | None) -> None:
    """Await ``awaitable`` for at most ``timeout`` seconds (None: no limit), then go on either way.

    Not ``asyncio.wait_for``: on Python 3.11 a cancellation that arrives as the awaitable completes
    is swallowed there, and a cancelled watcher or trigger loop then runs on for ever (seen as a
    hung test: a NOTIFY and the cancel in the same loop turn). ``asyncio.wait`` never loses it.
    """
    task = asyncio.ensure_future(awaitable)
    try:
        await asyncio.wait([task], timeout=timeout)
    finally:
        task.cancel()


class CommitWatcher:
    """Polls the latest and published versions of the tables ``names()`` returns, in one statement.

    ``reports()`` polls every ``interval`` (at once after ``refresh()`` or, on PostgreSQL, a
    ``NOTIFY`` on :data:`CHANNEL`, heard by a second task on its own connection that reconnects on
    its own) and yields the first answer, every answer that differs from the previous one, the next
    answer after ``refresh()`` (a new subscriber wants the current state), and every failed poll.
    """

    def __init__(self, url: str, interval: float = 5.0, names: Callable[[], Collection[str]] = tuple) -> None:
        self.url = url
        self.interval = interval
        self.names = names
        self.engine = db.shared_engine(url)
        self.polls = 0  # statements the watcher ran (for tests and the fleet benchmark)
        self.notifications = 0
        self.listening = False  # a LISTEN connection is up now
        self.listens = 0  # LISTEN connections made (a reconnect after a failover adds one)
        self._wake = asyncio.Event()
        self._refresh = False

    def refresh(self) -> None:
        """Poll now and report the answer even if nothing changed (a subscriber joined)."""
        self._refresh = True
        self._wake.set()

    async def poll_once(self) -> VersionsReport:
        """One statement for every watched table (none when nothing is watched)."""
        names = sorted(self.names())
        if not names:
            return VersionsReport({}, url=self.url)
        try:
            found = await asyncio.to_thread(table_versions, self.engine, names)
        except Exception as exc:
            message = f"polling the store for {len(names)} table(s) failed: {str(exc).splitlines()[0][:300]}"
            log.warning("%s", message)
            return VersionsReport({}, error=message, url=self.url)
        finally:
            self.polls += 1
        return VersionsReport(found, url=self.url)

    async def reports(self) -> AsyncGenerator[VersionsReport, None]:
        """Poll until cancelled (or closed), yielding what changed; see the class docstring."""
        listener = None
        if backend_of(self.engine).notifies:
            listener = asyncio.create_task(self._listen_loop(), name="delta-mirror listen")
        _live().add(self)
        last: Mapping[str, TableVersions] | None = None
        try:
            while True:
                self._wake.clear()
                forced, self._refresh = self._refresh, False
                report = await self.poll_once()
                if report.error is not None:
                    last = None  # a recovered store reports everything again
                    yield report
                elif forced or report.versions != last:
                    last = report.versions
                    yield report
                await wait_at_most(self._wake.wait(), self.interval)
        finally:
            _live().discard(self)
            if listener is not None:  # bounded: the listener must not hold the producer's exit
                listener.cancel()
                await asyncio.wait([listener], timeout=5.0)

    async def _listen_loop(self) -> None:
        """``LISTEN`` on every host of the store URL (``urls.libpq_url``: a replicated store's
        standby is skipped, and after a failover the promoted one is found). Losing it is logged at
        WARNING once per outage (polling every ``interval`` meanwhile), getting it back at INFO."""
        import psycopg  # PostgreSQL stores only

        conninfo = urls.libpq_url(self.url, primary=True)
        where = urls.hosts_text(self.url)
        failing = False
        pause = LISTEN_RETRY
        while True:
            try:
                async with await psycopg.AsyncConnection.connect(conninfo, autocommit=True) as conn:
                    await conn.execute(f"LISTEN {CHANNEL}")
                    self.listening = True
                    self.listens += 1
                    if failing:
                        log.info("LISTEN %s on the store (%s) is back", CHANNEL, where)
                        failing = False
                    pause = LISTEN_RETRY
                    self._wake.set()  # commits made while (re)connecting: poll once now
                    async for _note in conn.notifies():
                        self.notifications += 1
                        self._wake.set()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if not failing:
                    log.warning(
                        "LISTEN %s on the store (%s) failed (%s); polling every %ss until it is back",
                        CHANNEL,
                        where,
                        " ".join(str(exc).split())[:300],
                        self.interval,
                    )
                failing = True
            finally:
                self.listening = False
            await asyncio.sleep(min(pause, self.interval))
            pause *= 2  # a store down for long is retried every interval, a failover within a second


# The watchers polling in each event loop (for tests and the fleet benchmark).
_LIVE: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, weakref.WeakSet[CommitWatcher]] = (
    weakref.WeakKeyDictionary()
)


def _live() -> weakref.WeakSet[CommitWatcher]:
    return _LIVE.setdefault(asyncio.get_running_loop(), weakref.WeakSet())


def watchers() -> Sequence[CommitWatcher]:
    """The running loop's watchers that are polling now (for tests and the fleet benchmark)."""
    return list(_live())


__all__ = [
    "CHANNEL",
    "UNKNOWN",
    "CommitWatcher",
    "TableVersions",
    "VersionsReport",
    "latest_versions",
    "table_versions",
    "wait_at_most",
    "watchers",
]
