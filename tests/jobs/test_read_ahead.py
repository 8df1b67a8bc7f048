"""read_ahead runs a producer in its own thread, in order, and never outlives its consumer."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from delta_mirror.jobs.read_ahead import read_ahead


def test_items_come_in_order_from_another_thread() -> None:
    threads: set[str] = set()

    def produce() -> Iterator[int]:
        for i in range(50):
            threads.add(threading.current_thread().name)
            yield i

    assert list(read_ahead(produce(), depth=3, name="producer-x")) == list(range(50))
    assert threads == {"producer-x"}


def test_the_producer_runs_ahead_of_the_consumer_by_at_most_depth_items() -> None:
    produced: list[int] = []
    step = threading.Event()

    def produce() -> Iterator[int]:
        for i in range(10):
            produced.append(i)
            yield i
            if i == 5:
                step.set()

    items = read_ahead(produce(), depth=2)
    assert next(items) == 0
    assert not step.wait(0.5)  # item 0 taken, 1 and 2 queued, 3 made and waiting for a slot
    assert len(produced) <= 4
    assert list(items) == list(range(1, 10))


def test_an_error_in_the_producer_is_raised_after_the_items_before_it() -> None:
    def produce() -> Iterator[int]:
        yield 1
        yield 2
        raise LookupError("store read failed")

    seen: list[int] = []
    with pytest.raises(LookupError, match="store read failed"):
        for item in read_ahead(produce()):
            seen.append(item)
    assert seen == [1, 2]


@pytest.mark.parametrize(
    ("eager", "reads"),
    [
        pytest.param(False, 1, id="a-consumer-that-stops-early"),
        pytest.param(True, 0, id="an-eager-read-closed-unread"),  # the build failed first
    ],
)
def test_a_closed_read_stops_its_thread_and_closes_the_producer_in_it(eager: bool, reads: int) -> None:
    """The consumer gives up (after one item, or an eager read before any): the thread must end
    and the generator be closed, in that thread."""
    closed_in: list[str] = []

    def produce() -> Iterator[int]:
        try:
            yield from range(1000)
        finally:
            closed_in.append(threading.current_thread().name)

    name = f"producer-{eager}"
    items = read_ahead(produce(), depth=1, name=name, eager=eager)
    assert [next(items) for _ in range(reads)] == list(range(reads))
    items.close()
    assert closed_in == [name]
    assert not any(t.name == name for t in threading.enumerate())


def test_an_eager_read_starts_before_the_first_item_is_asked_for() -> None:
    started = threading.Event()

    def produce() -> Iterator[int]:
        started.set()
        yield from range(5)

    lazy = read_ahead(produce(), depth=1, name="producer-lazy")
    assert not started.wait(0.2)  # lazy: nothing runs until the first next
    lazy.close()
    items = read_ahead(produce(), depth=1, name="producer-eager", eager=True)
    assert started.wait(30)  # eager: the producer runs before anything is read
    assert list(items) == [0, 1, 2, 3, 4]
    assert not any(t.name == "producer-eager" for t in threading.enumerate())
