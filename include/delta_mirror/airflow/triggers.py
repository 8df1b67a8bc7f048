"""Event-driven publishing: a trigger that polls the store for commits past a watermark.

Used through an ``AssetWatcher``: when a table has committed versions beyond what is published,
the trigger fires and the table's DAG runs within about one ``poll_interval`` (at once on
PostgreSQL, which notifies each commit). All the triggers of one triggerer share one watcher per
store (``delta_mirror.store.watch``): one query per interval for the whole fleet, on one pool.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseEventTrigger, TriggerEvent


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
    """

    def __init__(
        self,
        table: str,
        store_conn_id: str | None = None,
        poll_interval: float = 5.0,
        watermark: int | None = None,
        coalesce_seconds: float = 300.0,
    ) -> None:
        super().__init__()  # type: ignore[no-untyped-call]  # BaseTrigger.__init__ is unannotated
        self.table = table
        self.store_conn_id = store_conn_id
        self.poll_interval = poll_interval
        self.watermark = watermark
        self.coalesce_seconds = coalesce_seconds

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            "delta_mirror.airflow.triggers.StoreCommitTrigger",
            {
                "table": self.table,
                "store_conn_id": self.store_conn_id,
                "poll_interval": self.poll_interval,
                "watermark": self.watermark,
                "coalesce_seconds": self.coalesce_seconds,
            },
        )

    def _store_url(self) -> str:
        from delta_mirror.airflow.hooks import DeltaMirrorHook
        from delta_mirror.config import store_url

        return store_url(DeltaMirrorHook(store_conn_id=self.store_conn_id).store_url)

    async def run(self) -> AsyncIterator[TriggerEvent]:
        """Subscribe to the process's shared watcher of the store (``store/watch.py``): one query
        per interval for every watched table, woken by ``NOTIFY`` on PostgreSQL. The watermark
        stays this trigger's own. When polls fail the store URL is resolved again (a connection
        that was fixed or moved is picked up without restarting the triggerer)."""
        from delta_mirror.store.watch import watcher_for

        state = _Watermark(self.watermark, self.coalesce_seconds)
        while True:
            try:
                url = await asyncio.to_thread(self._store_url)
            except Exception as exc:
                self.log.warning("resolving the store of %s failed: %s", self.table, exc)
                await asyncio.sleep(self.poll_interval)
                continue
            async with watcher_for(url).subscribe(self.table, self.poll_interval) as sub:
                while True:
                    with contextlib.suppress(TimeoutError):  # a held batch is due: decide again
                        await asyncio.wait_for(sub.wait(), state.hold_left())
                    if sub.error is not None:
                        self.log.warning("watching %s: %s", self.table, sub.error)
                        if await self._moved(url):
                            break
                        continue
                    fired = state.fire(sub.latest, sub.published)
                    if fired is not None:
                        yield TriggerEvent(  # type: ignore[no-untyped-call]  # unannotated in Airflow
                            {"table": self.table, "from_version": fired[0], "to_version": fired[1]}
                        )

    async def _moved(self, url: str) -> bool:
        """Whether the store's URL now resolves to another one (after a pause of one interval)."""
        await asyncio.sleep(self.poll_interval)
        try:
            return await asyncio.to_thread(self._store_url) != url
        except Exception:
            return False


class _Watermark:
    """A trigger's watermark and its coalescing hold (no I/O: the decisions only)."""

    def __init__(self, watermark: int | None, coalesce_seconds: float) -> None:
        self.watermark = watermark
        self.coalesce_seconds = coalesce_seconds
        self.fired_at: float | None = None  # when the last event fired (monotonic)

    def hold_left(self) -> float | None:
        """Seconds until a held batch fires anyway (None: nothing is held)."""
        if self.fired_at is None:
            return None
        return max(0.0, self.fired_at + self.coalesce_seconds - time.monotonic())

    def fire(self, latest: int | None, published: int | None) -> tuple[int, int] | None:
        """The (from, to) versions to fire for now, moving the watermark; None: nothing (yet)."""
        if self.fired_at is not None and time.monotonic() - self.fired_at >= self.coalesce_seconds:
            self.fired_at = None  # held long enough (the run failed or is slow): fire what is new
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
        fired = (self.watermark + 1, latest)
        self.watermark, self.fired_at = latest, time.monotonic()
        return fired
