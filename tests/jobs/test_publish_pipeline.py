"""The commit writer on its own: order, the bounded queue, the thread switch interval."""

from __future__ import annotations

import hashlib
import sys
import threading
import time

import pytest

from delta_mirror.jobs.publish_pipeline import (
    WRITER_SWITCH_INTERVAL,
    CommitWriter,
    PreparedCommit,
    commit_digest,
)


def _commit(v: int) -> PreparedCommit:
    return PreparedCommit(v, b"x" * 10, "")


def test_commits_are_written_in_order_through_a_small_queue() -> None:
    written: list[int] = []
    gate = threading.Event()

    def put(c: PreparedCommit) -> bool:
        gate.wait(5)
        written.append(c.version)
        return False

    writer = CommitWriter(put, depth=4)
    try:
        threading.Timer(0.05, gate.set).start()  # the queue fills; submit waits for room
        for v in range(50):
            writer.submit(_commit(v))
        writer.drain()
        assert written == list(range(50))
        assert [w.commit.version for w in writer.take_written()] == list(range(50))
    finally:
        writer.close()


def test_a_submitter_waiting_for_bytes_to_drain_is_woken_and_order_is_kept() -> None:
    """The queue is short of bytes, not of slots: the writer still wakes the waiting submitter."""
    written: list[int] = []

    def put(c: PreparedCommit) -> bool:
        time.sleep(0.001)
        written.append(c.version)
        return False

    writer = CommitWriter(put, depth=100, max_bytes=25)  # two 10-byte commits fit, not three
    try:
        for v in range(30):
            writer.submit(_commit(v))
        writer.drain()
        assert written == list(range(30))
    finally:
        writer.close()


def test_the_switch_interval_is_short_while_writers_run_and_restored_after() -> None:
    before = sys.getswitchinterval()
    first, second = CommitWriter(lambda c: False), CommitWriter(lambda c: False)
    try:
        assert sys.getswitchinterval() == min(before, WRITER_SWITCH_INTERVAL)
        first.close()
        assert sys.getswitchinterval() == min(before, WRITER_SWITCH_INTERVAL)  # one still runs
    finally:
        first.close()
        second.close()
    assert sys.getswitchinterval() == before


@pytest.mark.parametrize("size", [0, 1, 2046, 2047, 2048, 4093, 4094, 4095, 100_000])
def test_the_commit_digest_hashed_in_small_chunks_is_the_sha256_of_the_whole_file(size: int) -> None:
    data = bytes(i % 251 for i in range(size))
    assert commit_digest(data) == hashlib.sha256(data).hexdigest()
