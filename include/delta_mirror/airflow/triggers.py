"""Event-driven publishing: a trigger that fires when the store has commits past a watermark.

Used through an ``AssetWatcher``: when a table has committed versions beyond what is published,
the trigger fires and the table's DAG runs within about one ``poll_interval`` (at once on
PostgreSQL, which notifies each commit). The triggers of one store connection and poll interval
share one poll loop per triggerer through Airflow's shared stream (``shared_stream_key`` /
``open_shared_stream`` / ``filter_shared_stream``, ``airflow/triggers/shared_stream.py``): its
producer is the store's ``CommitWatcher`` (``delta_mirror.store.watch``: one statement per interval
for every watched table, woken by ``NOTIFY``), the triggerer broadcasts each report to every
trigger of the group, and each trigger keeps its own watermark.

With ``publish=True`` (``publish_in: triggerer``) the trigger publishes the table's new commits
itself (``jobs.watch_publish``, in a thread) and fires only when the run has work left: a
checkpoint is due, or publishing failed (the run publishes with its retries and alerts). A commit
then costs a publish (tens of milliseconds) instead of a task process (seconds of start-up).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
import weakref
from collections import Counter
from collections.abc import AsyncIterator, Collection, Hashable, Iterator
from typing import Any

from airflow.triggers.base import BaseEventTrigger, TriggerEvent

from delta_mirror.airflow.asset_extra import event_extra
from delta_mirror.store.watch import CommitWatcher, TableVersions, VersionsReport, wait_at_most

log = logging.getLogger(__name__)

#: The first item of every ``StoreCommitTrigger.shared_stream_key()``.
STREAM = "delta_mirror.store_commits"


class StoreCommitTrigger(BaseEventTrigger):
    """Fires whenever the table has committed versions past the watermark that are not published.

    The watermark defaults to the last published version, so pending commits fire at once and a
    restarted trigger does not miss commits made while it was down. After firing, the trigger keeps
    running with the watermark at the version it fired for: a watcher that returned would be
    restarted by the triggerer at once, see the same still-unpublished version (the DAG run it
    caused has not published yet) and fire again, i.e. one extra DAG run per commit.

    Coalescing (fleet scale): while the run this trigger started has not published up to the
    version it fired for, newer commits wait (at most ``coalesce_seconds``) and then fire as one
    batch, instead of one queued run each; versions that a run already published (it publishes
    every pending version, not just the fired ones) fire nothing.

    :param table: the mirrored table to watch (its name in the store).
    :param store_conn_id: the Airflow connection of the store (None: ``DELTA_MIRROR_STORE`` or the
        config's store); with ``poll_interval`` it names the shared stream the trigger joins.
    :param poll_interval: seconds between the shared watcher's polls (the fallback when no
        ``NOTIFY`` arrives; SQLite stores are only polled).
    :param watermark: the last version already handled (None: the table's last published version,
        read at start, so a restarted trigger misses nothing).
    :param coalesce_seconds: how long newer commits wait for the run this trigger started to
        publish before they fire anyway (a failed or stuck run).
    :param publish: publish here (``publish_in: triggerer``) and fire only for a due checkpoint or
        a failed publish (payload key ``reason``); a held lease fires nothing and is tried again
        after ``poll_interval``.
    :param aws_conn_id: the storage connection for ``publish``, resolved in the triggerer as the
        operators resolve it.
    """

    def __init__(
        self,
        table: str,
        store_conn_id: str | None = None,
        poll_interval: float = 5.0,
        watermark: int | None = None,
        coalesce_seconds: float = 300.0,
        publish: bool = False,
        aws_conn_id: str | None = None,
    ) -> None:
        super().__init__()  # type: ignore[no-untyped-call]  # BaseTrigger.__init__ is unannotated
        self.table = table
        self.store_conn_id = store_conn_id
        self.poll_interval = poll_interval
        self.watermark = watermark
        self.coalesce_seconds = coalesce_seconds
        self.publish = publish  # publish_in: triggerer (see ``_publish``)
        self.aws_conn_id = aws_conn_id  # the storage connection, as the sync operator gets it

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            "delta_mirror.airflow.triggers.StoreCommitTrigger",
            self._watch_kwargs(
                coalesce_seconds=self.coalesce_seconds,
                # only when on: a task-publishing table's trigger serializes as it did before
                **({"publish": True, "aws_conn_id": self.aws_conn_id} if self.publish else {}),
            ),
        )

    def _watch_kwargs(self, **more: Any) -> dict[str, Any]:
        """The serialized arguments every watch of a table's versions has, then ``more``."""
        return {
            "table": self.table,
            "store_conn_id": self.store_conn_id,
            "poll_interval": self.poll_interval,
            "watermark": self.watermark,
            **more,
        }

    def shared_stream_key(self) -> Hashable:
        """Triggers of one store connection and poll interval share one poll loop in a triggerer."""
        return _key(self.store_conn_id, self.poll_interval)

    @classmethod
    async def open_shared_stream(cls, kwargs: dict[str, Any]) -> AsyncIterator[VersionsReport]:
        """The shared stream's producer (once per group in a triggerer): the store's
        ``CommitWatcher`` over the tables the group's triggers watch, yielding a report per poll
        that changed something. It runs for the group's lifetime: a failed poll is logged and
        polled again (and the connection resolved again: a fixed or moved store is picked up
        without restarting the triggerer), never raised, since a raise would fail every trigger of
        the group."""
        conn_id, interval = kwargs.get("store_conn_id"), float(kwargs.get("poll_interval", 5.0))
        watched = _watched(_key(conn_id, interval))
        while True:
            try:
                url = await asyncio.to_thread(_store_url, conn_id)
            except Exception as exc:
                log.warning("resolving the store of connection %s failed: %s", conn_id, str(exc)[:300])
                await asyncio.sleep(interval)
                continue
            watcher = CommitWatcher(url, interval, watched.names)
            watched.watchers.add(watcher)
            try:
                async with contextlib.aclosing(watcher.reports()) as reports:
                    async for report in reports:
                        if report.error is None:
                            yield report
                        elif await _resolves_elsewhere(conn_id, url):
                            break
            finally:
                watched.watchers.discard(watcher)

    async def filter_shared_stream(self, shared_stream: AsyncIterator[Any]) -> AsyncIterator[TriggerEvent]:
        """This trigger's events from the shared stream's reports: its table's versions against
        its own watermark (and, with ``publish``, its publishing)."""
        latest = _Latest(self.table)
        follower = asyncio.create_task(latest.follow(shared_stream), name=f"delta-mirror follow {self.table}")
        state = _Watermark(self.watermark, self.coalesce_seconds)
        try:
            with _watched(self.shared_stream_key()).watching(self.table):
                while True:
                    # a held batch or a retry is due (never wait_for: it can swallow a cancel)
                    await wait_at_most(latest.wait(), state.hold_left())
                    if follower.done():  # the shared stream ended: its failure is the trigger's
                        follower.result()
                        raise RuntimeError(f"the shared stream of {self.table} ended")
                    if latest.versions is None:
                        continue
                    found = latest.versions
                    if self.publish:
                        payload = await self._publish_pending(
                            latest.url, state, found.latest, found.published
                        )
                    else:
                        fired = state.fire(found.latest, found.published)
                        payload = None if fired is None else self._payload(fired)
                    if payload is not None:
                        yield TriggerEvent(payload)  # type: ignore[no-untyped-call]  # unannotated in Airflow
        finally:
            follower.cancel()
            await asyncio.gather(follower, return_exceptions=True)

    async def run(self) -> AsyncIterator[TriggerEvent]:
        """Alone, outside a triggerer's shared stream (``shared_stream_key`` failed, or a caller
        drives the trigger directly): the same filter over a producer of its own."""
        async for event in self.filter_shared_stream(self.open_shared_stream(self.serialize()[1])):
            yield event

    def _payload(self, fired: tuple[int, int], reason: str | None = None) -> dict[str, Any]:
        payload: dict[str, Any] = {"table": self.table, "from_version": fired[0], "to_version": fired[1]}
        if reason is not None:
            payload["reason"] = reason
        return payload

    async def _publish_pending(
        self, url: str, state: _Watermark, latest: int | None, published: int | None
    ) -> dict[str, Any] | None:
        """``publish_in: triggerer``: publish the versions past the watermark here (a thread, at
        most ``DELTA_MIRROR_TRIGGER_PUBLISHERS`` at once per triggerer); the payload of the event
        to fire when the DAG must run (a checkpoint is due, or publishing failed), else None."""
        pending = state.pending(latest, published)
        if pending is None:
            return None
        async with _publish_slots():
            outcome = await asyncio.to_thread(self._publish_now, url)
        if outcome.action == "lease held":  # that publisher publishes; look again in an interval
            state.retry_in(self.poll_interval)
            return None
        if outcome.action == "failed":
            self.log.warning(
                "publishing %s from the triggerer failed, its DAG run publishes: %s",
                self.table,
                outcome.error,
            )
            state.mark_fired(pending[1])
            return self._payload(pending, outcome.action)
        done = max(pending[1], -1 if outcome.last_published is None else outcome.last_published)
        if outcome.fires and state.wants_checkpoint(outcome.last_checkpoint):
            state.mark_fired(done, checkpoint=True)  # the run writes it
            return self._payload((pending[0], done), outcome.action)
        state.mark_published(done)  # (or the run we started for a checkpoint has not written it yet)
        return None

    def _publish_now(self, url: str) -> Any:
        """On a worker thread: publish the table's pending versions (``jobs.watch_publish``)."""
        from delta_mirror.jobs.watch_publish import WatchPublish, publish_from_watcher

        try:
            store, options = self._publishing_to(url)
        except Exception as exc:
            self._target = None
            return WatchPublish(self.table, "failed", error=f"resolving the storage connection: {exc}"[:300])
        outcome = publish_from_watcher(store, self.table, storage_options=options)
        if outcome.action == "failed":
            self._target = None  # resolve the connections again next time (rotated credentials)
        return outcome

    _target: tuple[str, Any, dict[str, str]] | None = None

    def _publishing_to(self, url: str) -> tuple[Any, dict[str, str]]:
        """The store on the process's shared engine and the storage options of ``aws_conn_id``,
        resolved once per URL (again after a failure)."""
        if self._target is None or self._target[0] != url:
            from delta_mirror.airflow.hooks import DeltaMirrorHook
            from delta_mirror.store.sql_store import SqlStore

            options = DeltaMirrorHook(aws_conn_id=self.aws_conn_id).storage_options
            self._target = (url, SqlStore(url, shared_engine=True), dict(options))
        return self._target[1], self._target[2]


class PublishedVersionsTrigger(StoreCommitTrigger):
    """Fires whenever the table's published version moves past the last one it fired for: the
    watcher of a ``publish_in: triggerer`` table's asset (``airflow.assets``), whose events would
    otherwise come from no task (the trigger that publishes is the commits asset's, and its events
    start the table's DAG). It reads the shared stream of the table's ``StoreCommitTrigger`` (same
    connection and interval: no poll of its own) and fires for any publisher: the triggerer, the
    DAG's ``sync``, reconcile, a backfill, the CLI.

    The payload is the asset event's extra (``airflow.assets.event_extra``): table, first and last
    version, the newest checkpoint among them. The watermark starts at the published version of
    the first report that knows the table, so versions published while no triggerer ran this
    trigger get no event of their own; the next event starts after them.

    :param table: the table whose publishing it reports.
    :param store_conn_id: as ``StoreCommitTrigger``'s (with ``poll_interval``, the shared stream).
    :param poll_interval: as ``StoreCommitTrigger``'s.
    :param watermark: the last version already reported (None: see above).
    """

    def __init__(
        self,
        table: str,
        store_conn_id: str | None = None,
        poll_interval: float = 5.0,
        watermark: int | None = None,
    ) -> None:
        super().__init__(table, store_conn_id, poll_interval, watermark)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return ("delta_mirror.airflow.triggers.PublishedVersionsTrigger", self._watch_kwargs())

    async def filter_shared_stream(self, shared_stream: AsyncIterator[Any]) -> AsyncIterator[TriggerEvent]:
        latest = _Latest(self.table)
        follower = asyncio.create_task(
            latest.follow(shared_stream), name=f"delta-mirror published {self.table}"
        )
        watermark = self.watermark
        try:
            with _watched(self.shared_stream_key()).watching(self.table):
                while True:
                    await latest.wait()
                    if follower.done():  # the shared stream ended: its failure is the trigger's
                        follower.result()
                        raise RuntimeError(f"the shared stream of {self.table} ended")
                    found = latest.versions
                    if found is None or found.latest is None:
                        continue  # not in the store (or not watched) yet
                    published = -1 if found.published is None else found.published
                    if watermark is None:
                        watermark = published
                    if published <= watermark:
                        continue
                    first, watermark = watermark + 1, published
                    checkpoint = await asyncio.to_thread(self._checkpoint_among, latest.url, first, published)
                    extra = event_extra(
                        self.table, (first, published), () if checkpoint is None else (checkpoint,)
                    )
                    yield TriggerEvent(extra)  # type: ignore[no-untyped-call]  # unannotated in Airflow
        finally:
            follower.cancel()
            await asyncio.gather(follower, return_exceptions=True)

    _store: tuple[str, Any] | None = None

    def _checkpoint_among(self, url: str, first: int, last: int) -> int | None:
        """On a worker thread: the table's newest checkpoint when it is within ``first..last``
        (None: none there, or the store could not say; the event goes anyway)."""
        try:
            if self._store is None or self._store[0] != url:
                from delta_mirror.store.sql_store import SqlStore

                self._store = (url, SqlStore(url, shared_engine=True))
            store = self._store[1]
            version = store.last_checkpoint_version(store.get_table(self.table).id)
        except Exception as exc:
            self._store = None
            self.log.warning("the newest checkpoint of %s: %s", self.table, str(exc)[:300])
            return None
        return version if version is not None and first <= version <= last else None


def _key(store_conn_id: str | None, poll_interval: float) -> Hashable:
    return (STREAM, store_conn_id, float(poll_interval))


def _store_url(store_conn_id: str | None) -> str:
    """The store's URL from its Airflow connection (blocking: a connection lookup)."""
    from delta_mirror.airflow.hooks import DeltaMirrorHook
    from delta_mirror.config import store_url

    return store_url(DeltaMirrorHook(store_conn_id=store_conn_id).store_url)


async def _resolves_elsewhere(store_conn_id: str | None, url: str) -> bool:
    """Whether the connection now names another store (after a failed poll)."""
    try:
        return await asyncio.to_thread(_store_url, store_conn_id) != url
    except Exception:
        return False


class _Watched:
    """The tables the triggers of one shared stream watch in this event loop, and its producers.

    Airflow builds a group's producer from one trigger's arguments (``open_shared_stream(kwargs)``)
    and tells it nothing of the others, so the triggers name their tables here; a joining table
    asks the producers for a report at once (a late subscriber gets no earlier broadcast)."""

    def __init__(self) -> None:
        self.tables: Counter[str] = Counter()
        self.watchers: set[CommitWatcher] = set()

    def names(self) -> Collection[str]:
        return list(self.tables)

    @contextlib.contextmanager
    def watching(self, table: str) -> Iterator[None]:
        self.tables[table] += 1
        for watcher in self.watchers:
            watcher.refresh()
        try:
            yield
        finally:
            self.tables[table] -= 1
            if self.tables[table] <= 0:
                del self.tables[table]


_WATCHED: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[Hashable, _Watched]] = (
    weakref.WeakKeyDictionary()
)


def _watched(key: Hashable) -> _Watched:
    """The running loop's registry of the shared stream ``key`` (Airflow's triggerer runs every
    trigger of the process in one loop)."""
    per_loop = _WATCHED.setdefault(asyncio.get_running_loop(), {})
    found = per_loop.get(key)
    if found is None:
        found = per_loop[key] = _Watched()
    return found


class _Latest:
    """One trigger's table in the newest report of the shared stream.

    The stream is read in a task of its own, so the triggerer's queue for this trigger is always
    drained: a trigger that publishes (or waits for a publish slot) would otherwise let it fill,
    and a full queue fails the trigger (``_fail_overflowed_subscriber`` in Airflow's
    ``shared_stream.py``); only the newest versions matter anyway.

    :param table: the trigger's table, looked up in each report.
    """

    def __init__(self, table: str) -> None:
        self.table = table
        self.versions: TableVersions | None = None  # None: no report yet
        self.url = ""  # the store the newest report is from
        self._changed = asyncio.Event()

    async def follow(self, stream: AsyncIterator[Any]) -> None:
        try:
            async for report in stream:
                versions = report.of(self.table)
                self.url = report.url
                if versions != self.versions:
                    self.versions = versions
                    self._changed.set()
        finally:
            self._changed.set()  # the stream ended: wake the trigger

    async def wait(self) -> None:
        await self._changed.wait()
        self._changed.clear()


def _publish_slots() -> asyncio.Semaphore:
    """The running loop's bound on publishes at once (``DELTA_MIRROR_TRIGGER_PUBLISHERS``, default
    2): 500 tables committing together must not start 500 threads in the triggerer."""
    loop = asyncio.get_running_loop()
    slots = _SLOTS.get(loop)
    if slots is None:
        try:
            size = max(1, int(os.environ.get("DELTA_MIRROR_TRIGGER_PUBLISHERS", "2")))
        except ValueError:
            size = 2
        slots = _SLOTS[loop] = asyncio.Semaphore(size)
    return slots


_SLOTS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = weakref.WeakKeyDictionary()


class _Watermark:
    """A trigger's watermark and its coalescing hold (no I/O: the decisions only).

    Both modes share the rules: versions up to the watermark are handled (fired for, or published
    by the trigger itself); while a run this trigger started has not published what it fired for,
    newer versions wait (at most ``coalesce_seconds``) and then go as one batch.

    :param watermark: the last version already handled (None: the table's last published version
        in the first report).
    :param coalesce_seconds: how long newer versions wait for the run this trigger started.
    """

    def __init__(self, watermark: int | None, coalesce_seconds: float) -> None:
        self.watermark = watermark
        self.coalesce_seconds = coalesce_seconds
        self.fired_at: float | None = None  # when the last event fired (monotonic)
        self.retry_at: float | None = None  # publish mode: when to try again (a lease was held)
        # publish mode: the version a run was started to checkpoint at, and when
        self.checkpoint_for: tuple[int, float] | None = None

    def hold_left(self) -> float | None:
        """Seconds until a held batch fires anyway or a retry is due (None: nothing waits)."""
        due = [t for t in (self.retry_at, self._hold_ends()) if t is not None]
        return max(0.0, min(due) - time.monotonic()) if due else None

    def _hold_ends(self) -> float | None:
        return None if self.fired_at is None else self.fired_at + self.coalesce_seconds

    def retry_in(self, seconds: float) -> None:
        self.retry_at = time.monotonic() + seconds

    def pending(self, latest: int | None, published: int | None) -> tuple[int, int] | None:
        """The (from, to) versions to handle now (fire for, or publish); None: nothing (yet).
        Does not move the watermark past them: ``mark_fired`` / ``mark_published`` do."""
        self.retry_at = None
        if self.fired_at is not None and time.monotonic() - self.fired_at >= self.coalesce_seconds:
            self.fired_at = None  # held long enough (the run failed or is slow): go with what is new
        if latest is None:
            return None
        if self.watermark is None:
            self.watermark = -1 if published is None else published
        done = -1 if published is None else published
        if self.fired_at is not None and done >= self.watermark:
            self.fired_at = None  # the run we started has published what it fired for
        if latest <= self.watermark:
            return None
        if done >= latest:  # a run already published these (it publishes every pending version)
            self.watermark = latest
            return None
        if self.fired_at is not None:
            return None  # our run has not published yet: newer commits join the next batch
        return (self.watermark + 1, latest)

    def mark_fired(self, to_version: int, checkpoint: bool = False) -> None:
        self.watermark, self.fired_at = to_version, time.monotonic()
        if checkpoint:
            self.checkpoint_for = (to_version, self.fired_at)

    def wants_checkpoint(self, last_checkpoint: int | None) -> bool:
        """Whether a due checkpoint needs a run: not while the run started for one has not written
        it yet (commits published meanwhile would each start another run), unless it is
        ``coalesce_seconds`` late."""
        if self.checkpoint_for is None:
            return True
        version, at = self.checkpoint_for
        written = last_checkpoint is not None and last_checkpoint >= version
        if written or time.monotonic() - at >= self.coalesce_seconds:
            self.checkpoint_for = None
            return True
        return False

    def mark_published(self, to_version: int) -> None:
        self.watermark = max(self.watermark if self.watermark is not None else -1, to_version)

    def fire(self, latest: int | None, published: int | None) -> tuple[int, int] | None:
        """The (from, to) versions to fire for now, moving the watermark; None: nothing (yet)."""
        fired = self.pending(latest, published)
        if fired is not None:
            self.mark_fired(fired[1])
        return fired
