"""Event-driven publishing: a trigger that polls the store for commits past a watermark.

Used through an ``AssetWatcher``: when a table has committed versions beyond what is published,
the trigger fires and the table's DAG runs within about one ``poll_interval`` (at once on
PostgreSQL, which notifies each commit). All the triggers of one triggerer share one watcher per
store (``delta_mirror.store.watch``): one query per interval for the whole fleet, on one pool.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from airflow.triggers.base import BaseEventTrigger, TriggerEvent

if TYPE_CHECKING:
    from delta_mirror.store.watch import CommitWatcher


class StoreCommitTrigger(BaseEventTrigger):
    """Fires whenever the table's latest committed version passes the watermark.

    The watermark defaults to the last published version, so pending commits fire at once and a
    restarted trigger does not miss commits made while it was down. After firing, the trigger keeps
    running with the watermark at the version it fired for: a watcher that returned would be
    restarted by the triggerer at once, see the same still-unpublished version (the DAG run it
    caused has not published yet) and fire again, i.e. one extra DAG run per commit.
    """

    def __init__(
        self,
        table: str,
        store_conn_id: str | None = None,
        poll_interval: float = 5.0,
        watermark: int | None = None,
    ) -> None:
        super().__init__()  # type: ignore[no-untyped-call]  # BaseTrigger.__init__ is unannotated
        self.table = table
        self.store_conn_id = store_conn_id
        self.poll_interval = poll_interval
        self.watermark = watermark

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            "delta_mirror.airflow.triggers.StoreCommitTrigger",
            {
                "table": self.table,
                "store_conn_id": self.store_conn_id,
                "poll_interval": self.poll_interval,
                "watermark": self.watermark,
            },
        )

    def _store_url(self) -> str:
        from delta_mirror.airflow.hooks import DeltaMirrorHook
        from delta_mirror.config import store_url

        return store_url(DeltaMirrorHook(store_conn_id=self.store_conn_id).store_url)

    def _published(self, url: str) -> int | None:
        from delta_mirror.store import SqlStore

        store = SqlStore(url, shared_engine=True)
        return store.last_published_version(store.get_table(self.table).id)

    async def _first_watermark(self, watcher: CommitWatcher) -> int:
        """The last published version (-1: none), read once; retried while the store fails."""
        while True:
            try:
                published = await watcher.read(lambda: self._published(watcher.url))
                return -1 if published is None else published
            except Exception as exc:
                self.log.warning("reading what is published of %s failed: %s", self.table, exc)
            await asyncio.sleep(self.poll_interval)

    async def run(self) -> AsyncIterator[TriggerEvent]:
        """Subscribe to the process's shared watcher of the store (``store/watch.py``): one query
        per interval for every watched table, woken by ``NOTIFY`` on PostgreSQL. The watermark
        stays this trigger's own. When polls fail the store URL is resolved again (a connection
        that was fixed or moved is picked up without restarting the triggerer)."""
        from delta_mirror.store.watch import watcher_for

        watermark = self.watermark
        while True:
            try:
                url = await asyncio.to_thread(self._store_url)
            except Exception as exc:
                self.log.warning("resolving the store of %s failed: %s", self.table, exc)
                await asyncio.sleep(self.poll_interval)
                continue
            watcher = watcher_for(url)
            async with watcher.subscribe(self.table, self.poll_interval) as sub:
                while True:
                    latest = await sub.wait()
                    if sub.error is not None:
                        self.log.warning("watching %s: %s", self.table, sub.error)
                        if await self._moved(url):
                            break
                        continue
                    if latest is None:
                        continue
                    if watermark is None:
                        watermark = await self._first_watermark(watcher)
                    if latest > watermark:
                        yield TriggerEvent(  # type: ignore[no-untyped-call]  # unannotated in Airflow
                            {"table": self.table, "from_version": watermark + 1, "to_version": latest}
                        )
                        watermark = latest

    async def _moved(self, url: str) -> bool:
        """Whether the store's URL now resolves to another one (after a pause of one interval)."""
        await asyncio.sleep(self.poll_interval)
        try:
            return await asyncio.to_thread(self._store_url) != url
        except Exception:
            return False
