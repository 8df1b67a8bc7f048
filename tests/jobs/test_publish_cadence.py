"""The cadence check's running byte sum: the same answers as one query over the whole span, while
reading only the versions added since the previous question."""

from __future__ import annotations

from typing import Any

from delta_mirror.jobs.publish_cadence import ReplayBytes


class SizesStore:
    """``json_bytes_between`` over fixed commit sizes, counting the versions each call reads."""

    def __init__(self, sizes: dict[int, int]) -> None:
        self.sizes = sizes
        self.read = 0

    def json_bytes_between(self, table_id: int, after_version: int, to_version: int) -> int:
        span = range(after_version + 1, to_version + 1)
        self.read += len(span)
        return sum(self.sizes.get(v, 0) for v in span)


def test_running_sum_matches_the_whole_span_and_reads_each_version_once() -> None:
    store = SizesStore({v: 100 + v for v in range(0, 2001)})
    replay = ReplayBytes()
    store_any: Any = store
    for end in range(500, 2001, 500):
        assert replay.between(store_any, 1, 0, end) == sum(100 + v for v in range(1, end + 1))
    assert store.read == 2000  # not 500 + 1000 + 1500 + 2000
    assert replay.between(store_any, 1, 0, 2000) == sum(100 + v for v in range(1, 2001))  # asked again


def test_a_new_checkpoint_or_an_earlier_version_starts_the_sum_again() -> None:
    store = SizesStore({v: 10 for v in range(0, 101)})
    replay = ReplayBytes()
    store_any: Any = store
    assert replay.between(store_any, 1, 0, 50) == 500
    assert replay.between(store_any, 1, 40, 60) == 200  # a checkpoint at 40 since
    assert replay.between(store_any, 1, 40, 45) == 50  # an earlier version: summed afresh
    assert replay.between(store_any, 1, 40, 100) == 600
