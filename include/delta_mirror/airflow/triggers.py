"""Event-driven publishing: a trigger that polls the store for commits past a watermark.

Used through an ``AssetWatcher``: when a table has committed versions beyond what is published,
the trigger fires and the table's DAG runs within about one ``poll_interval``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseEventTrigger, TriggerEvent


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

    def _check(self) -> tuple[int | None, int | None]:
        from delta_mirror.airflow.hooks import DeltaMirrorHook

        store = DeltaMirrorHook(store_conn_id=self.store_conn_id).store
        try:
            table = store.get_table(self.table)
            return store.latest_version(table.id), store.last_published_version(table.id)
        finally:
            store.close()

    async def run(self) -> AsyncIterator[TriggerEvent]:
        watermark = self.watermark
        while True:
            try:
                latest, published = await asyncio.to_thread(self._check)
            except Exception as exc:
                self.log.warning("polling the store for %s failed: %s", self.table, exc)
                latest, published = None, None
            if watermark is None and latest is not None:
                watermark = published if published is not None else -1
            if latest is not None and watermark is not None and latest > watermark:
                yield TriggerEvent(  # type: ignore[no-untyped-call]  # unannotated in Airflow
                    {"table": self.table, "from_version": watermark + 1, "to_version": latest}
                )
                watermark = latest
            await asyncio.sleep(self.poll_interval)
