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
    items: Iterable[T], *, depth: int = 2, name: str = "delta-mirror-read-ahead"
) -> Generator[T, None, None]:
    """``items``, produced up to ``depth`` ahead of the consumer; an error in the producer is raised
    in the consumer at the point it happened; a consumer that stops early stops the producer."""
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
