"""Blocking store calls, run off the event loop on a fixed set of long-lived threads.

One queue feeds ``size`` threads; each result comes back to the event loop with
``call_soon_threadsafe``. That is the whole hop: anyio's ``to_thread`` (a capacity limiter, a cancel
scope and run-variable lookups per call) cost the event loop more than the store call itself on an
append (docs/commit-service.md, "Where the time goes"). Running the store call on the loop instead
serialises the commits' round trips (half the throughput).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from queue import SimpleQueue
from typing import Any, TypeVar

T = TypeVar("T")

_Call = tuple[Callable[[], Any], "asyncio.Future[Any]"]


class StoreThreads:
    """At most ``size`` store calls in flight; more wait in the queue without holding a thread."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._queue: SimpleQueue[_Call | None] = SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()

    async def run(self, fn: Callable[[], T]) -> T:
        """``fn()`` on a store thread; its result or its exception here."""
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        if len(self._threads) < self.size:
            self._start()
        self._queue.put((fn, future))
        return await future

    def _start(self) -> None:
        with self._lock:
            while len(self._threads) < self.size:
                t = threading.Thread(target=self._work, name="store-call", daemon=True)
                t.start()
                self._threads.append(t)

    def _work(self) -> None:
        while (item := self._queue.get()) is not None:
            fn, future = item
            try:
                result, error = fn(), None
            except BaseException as exc:  # handed to the waiting request, answered there
                result, error = None, exc
            with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits for this answer
                future.get_loop().call_soon_threadsafe(_settle, future, result, error)

    def stop(self) -> None:
        """Let every call already queued finish (a commit whose writer hung up still completes), then
        end the threads; the store may be closed after this returns."""
        with self._lock:
            threads, self._threads = self._threads, []
            for _ in threads:
                self._queue.put(None)
        for t in threads:
            t.join()


def _settle(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if future.done():  # the request was cancelled meanwhile
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


__all__ = ["StoreThreads"]
