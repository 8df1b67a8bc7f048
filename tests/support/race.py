"""The thread race the concurrency tests run: N writers released together, each one's result kept.

Why one harness: the store, the commit service and the object stores all promise the same thing
under a race (exactly one writer wins a version, the others are refused cleanly), and each test
used to hand-write the threads, the barrier, the error list and the joins, some without a check
that every thread finished. Here a writer's uncaught exception fails the race (and aborts the
barrier, so nobody waits forever for it), and so does a writer still running at the deadline.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

from support.waiting import load_scaled

T = TypeVar("T")


def race(writers: int, work: Callable[[int, threading.Barrier], T], *, seconds: float = 60) -> list[T]:
    """Run ``work(w, barrier)`` for ``w`` in ``range(writers)``, each on its own thread, and return
    their results in writer order. ``work`` calls ``barrier.wait()`` where the writers must line up
    (once, or once per round). The barrier and the joins wait ``seconds`` stretched by the load."""
    barrier = threading.Barrier(writers, timeout=load_scaled(seconds))
    results: dict[int, T] = {}
    failures: list[tuple[int, BaseException]] = []

    def run(w: int) -> None:
        try:
            results[w] = work(w, barrier)
        except BaseException as exc:
            failures.append((w, exc))
            barrier.abort()

    threads = [threading.Thread(target=run, args=(w,), name=f"racer-{w}") for w in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(load_scaled(seconds))
    stuck = [t.name for t in threads if t.is_alive()]
    assert not stuck, f"writers still running after {seconds:.0f} s (load-scaled): {stuck}"
    if failures:
        causes = [f for f in failures if not isinstance(f[1], threading.BrokenBarrierError)] or failures
        w, first = causes[0]  # the cause, not a writer the aborted barrier let go
        raise AssertionError(f"writer {w} failed: {first!r} (all failures: {failures})") from first
    return [results[w] for w in range(writers)]


def won_or_refused(attempt: Callable[[], object], *refusals: type[BaseException]) -> str:
    """``"won"`` when ``attempt()`` returns, ``"refused"`` when it raises one of ``refusals`` (any
    other exception fails the race): the outcome of one writer of a put-if-absent style race."""
    try:
        attempt()
    except refusals:
        return "refused"
    return "won"


__all__ = ["race", "won_or_refused"]
