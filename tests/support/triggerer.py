"""Event triggers driven as Airflow's triggerer drives them: through its shared-stream manager.

A trigger with a ``shared_stream_key()`` does not run its own ``run()`` in the triggerer: the
triggerer subscribes it to a ``SharedStreamManager`` (one producer per key, broadcast to every
subscriber) and iterates ``filter_shared_stream`` over its stream, then unsubscribes it
(``airflow/jobs/triggerer_job_runner.py``, ``run_trigger``). :class:`Triggerer` does the same in
the caller's event loop, with Airflow's own manager, so tests and the fleet benchmark exercise the
path a deployed trigger takes.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncGenerator, AsyncIterator, Iterable
from typing import Any


class Triggerer:
    """One event loop's shared streams, as one triggerer process holds them."""

    def __init__(self, max_subscriber_queue: int | None = None) -> None:
        """``max_subscriber_queue``: ``[triggerer] shared_stream_subscriber_queue_size`` (Airflow's
        default, 1,024, when None)."""
        from airflow.triggers.shared_stream import DEFAULT_SUBSCRIBER_QUEUE_MAX, SharedStreamManager

        self.manager = SharedStreamManager(
            max_subscriber_queue=max_subscriber_queue or DEFAULT_SUBSCRIBER_QUEUE_MAX
        )
        self._ids = itertools.count(1)

    async def events(self, trigger: Any) -> AsyncGenerator[dict[str, Any], None]:
        """The payloads ``trigger`` fires, run as the triggerer runs it (until the caller stops)."""
        trigger_id = next(self._ids)
        key = trigger.shared_stream_key()
        assert key is not None, "the trigger does not share a stream"
        stream = self.manager.subscribe(trigger_id=trigger_id, trigger=trigger, key=key)
        try:
            async for event in trigger.filter_shared_stream(stream):
                yield dict(event.payload)
        finally:
            await self.manager.unsubscribe(trigger_id, key)

    @contextlib.asynccontextmanager
    async def collecting(
        self, triggers: Iterable[Any], events: list[dict[str, Any]]
    ) -> AsyncIterator[list[asyncio.Task[None]]]:
        """Run ``triggers`` for the block (their payloads appended to ``events``, their tasks
        yielded); then cancel them and stop every stream."""

        async def collect(trigger: Any) -> None:
            async for payload in self.events(trigger):
                events.append(payload)

        tasks = [asyncio.create_task(collect(trigger)) for trigger in triggers]
        try:
            yield tasks
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self.stop()

    async def stop(self) -> None:
        await self.manager.stop_all()


__all__ = ["Triggerer"]
