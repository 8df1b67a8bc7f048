"""Run an iterator a few items ahead in a thread.

A checkpoint reads its active files from the store (a COPY loop: Python, but mostly waiting on the
socket) while it parses and writes the previous block (Arrow and Parquet: native code, the GIL
released): done one after the other the two add up, done side by side the slower one sets the
pace. The producer's generator runs, and is closed, in the thread: a database connection it opens
is used by one thread only.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Generator, Iterable
from typing import TypeVar, cast

T = TypeVar("T")

_POLL_S = 0.1  # how soon a producer blocked on a full queue notices the consumer has gone


def read_ahead(
    items: Iterable[T], *, depth: int = 2, name: str = "delta-mirror-read-ahead", eager: bool = False
) -> Generator[T, None, None]:
    """``items``, produced up to ``depth`` ahead of the consumer; an error in the producer is raised
    in the consumer at the point it happened; a consumer that stops early stops the producer.
    ``eager``: the thread starts now, not at the first ``next`` (a query starts on the server while
    the caller prepares); close the generator if it may go unread."""
    run = _run(items, depth, name)
    if eager:
        next(run)  # the thread is started; closing ``run`` stops and joins it
        return cast(Generator[T, None, None], run)
    return _lazy(run)


def _lazy(run: Generator[T | None, None, None]) -> Generator[T, None, None]:
    next(run)
    yield from cast(Generator[T, None, None], run)


def _run(items: Iterable[T], depth: int, name: str) -> Generator[T | None, None, None]:
    """``read_ahead``'s body: yields None once the thread is started, then the items."""
    slots: queue.Queue[tuple[bool, T | BaseException | None]] = queue.Queue(depth)
    gone = threading.Event()

    def put(entry: tuple[bool, T | BaseException | None]) -> bool:
        while not gone.is_set():
            try:
                slots.put(entry, timeout=_POLL_S)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        source = iter(items)
        try:
            for item in source:
                if not put((True, item)):
                    return
            put((False, None))
        except BaseException as exc:  # handed to the consumer, raised there
            put((False, exc))
        finally:
            close = getattr(source, "close", None)
            if close is not None:
                close()

    thread = threading.Thread(target=produce, name=name, daemon=True)
    thread.start()
    try:
        yield None
        while True:
            more, value = slots.get()
            if not more:
                if isinstance(value, BaseException):
                    raise value
                return
            yield cast(T, value)
    finally:
        gone.set()
        thread.join()


__all__ = ["read_ahead"]
