"""Crash points, and what the publisher does after a crash or a lost lease (found by ``tests/chaos``).

On every store backend: the crashing publisher is a process of its own, which a DuckDB file allows
once the test's own store has let go of it (one read-write process at a time)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from support.builders import append_rows, create_data_table

from delta_mirror.errors import LeaseHeldError
from delta_mirror.jobs.publisher import Publisher
from delta_mirror.storage import open_store
from delta_mirror.store import SqlStore

pytestmark = pytest.mark.all_backends


def _table(store_url: str, root: Path, versions: int, interval: int) -> SqlStore:
    store = SqlStore(store_url)
    store.init()
    create_data_table(store, root, "t", first_rows=None, checkpoint_interval=interval)
    for i in range(versions):
        append_rows(store, root, "t", [i])
    return store


def test_a_failpoint_kills_the_process_at_its_nth_hit() -> None:
    code = "from delta_mirror.failpoints import failpoint\nfor i in range(5):\n    failpoint('x')\n    print(i, flush=True)"
    env = {**os.environ, "DELTA_MIRROR_FAILPOINTS": "other:1,x:3"}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert proc.returncode == -9
    assert proc.stdout.split() == ["0", "1"]
    quiet = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={k: v for k, v in os.environ.items() if k != "DELTA_MIRROR_FAILPOINTS"},
    )
    assert quiet.returncode == 0 and quiet.stdout.split() == ["0", "1", "2", "3", "4"]


@pytest.mark.parametrize("point", ["checkpoint.before_last_checkpoint", "checkpoint.after_last_checkpoint"])
def test_a_checkpoint_interrupted_by_a_crash_is_finished_by_the_next_run(
    store_url: str, tmp_path: Path, point: str
) -> None:
    root = tmp_path / "t"
    store = _table(store_url, root, versions=3, interval=2)
    env = {**os.environ, "DELTA_MIRROR_FAILPOINTS": f"{point}:1", "DELTA_MIRROR_LEASE_TTL": "1"}
    store.close()  # reopened on its next use, after the crashed process (one process for DuckDB)
    crashed = subprocess.run(
        [sys.executable, "-m", "delta_mirror.cli", "--store", store_url, "mirror", "t"],
        env=env,
        capture_output=True,
        text=True,
    )
    assert crashed.returncode == -9
    table = store.get_table("t")
    assert store.last_published_version(table.id) == 3  # every commit is out: no new publish would come
    time.sleep(1.1)  # the dead publisher's lease expires

    Publisher(store).publish("t")

    rows = store.status_rows(table.id, artifact="checkpoint")
    assert rows and {r.state for r in rows} == {"SUCCESS"}
    pointer = json.loads((root / "_delta_log" / "_last_checkpoint").read_text())
    assert pointer["version"] == rows[-1].version


class _SlowPuts:
    """An object store whose commit puts take ``delay`` seconds (a slow endpoint)."""

    def __init__(self, inner: Any, delay: float) -> None:
        self.inner, self.delay = inner, delay

    def put_if_absent(self, path: str, data: bytes) -> None:
        time.sleep(self.delay)
        self.inner.put_if_absent(path, data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def test_a_publisher_that_lost_its_lease_stops_and_leaves_the_status_to_the_new_owner(
    store_url: str, tmp_path: Path
) -> None:
    root = tmp_path / "t"
    store = _table(store_url, root, versions=6, interval=100)
    table = store.get_table("t")
    # Each put outlasts the 1 s lease (a stalled process): by the next version another publisher has it.
    slow = Publisher(store, lease_ttl=1.0, open_location=lambda loc: _SlowPuts(open_store(loc), 1.2))
    calls: list[str] = []
    original = store.acquire_lease

    def acquire(table_id: int, owner: str, ttl_seconds: float) -> bool:
        calls.append(owner)
        if len(calls) == 2:  # slow's first renewal: its lease has expired, another publisher takes it
            assert original(table_id, "other-publisher", 60)
        return original(table_id, owner, ttl_seconds)

    store.acquire_lease = acquire  # type: ignore[method-assign]
    with pytest.raises(LeaseHeldError, match="another publisher took it"):
        slow.publish("t")

    states = {r.version: r.state for r in store.status_rows(table.id, artifact="json")}
    assert "FAILED" not in states.values()  # the new owner re-drives the rest
    published = [v for v, s in states.items() if s == "SUCCESS"]
    assert published and all((root / "_delta_log" / f"{v:020d}.json").exists() for v in published)


def test_rewriting_last_checkpoint_never_moves_it_behind_a_newer_complete_checkpoint(
    store_url: str, tmp_path: Path
) -> None:
    """The reconciler asks for a rewrite from an audit that listed the log before a publisher moved
    the pointer forward (found by the 2-publisher chaos race: 60 → 41)."""
    root = tmp_path / "t"
    store = _table(store_url, root, versions=4, interval=2)
    publisher = Publisher(store)
    publisher.publish("t")
    publisher.checkpoint("t", 2)
    pointer = root / "_delta_log" / "_last_checkpoint"
    newest = json.loads(pointer.read_text())["version"]
    assert newest == 4

    publisher.rewrite_last_checkpoint("t", 2)  # stale request: 4 is complete and newer
    assert json.loads(pointer.read_text())["version"] == newest

    (root / "_delta_log" / f"{newest:020d}.checkpoint.parquet").unlink()  # now the pointer is bad
    publisher.rewrite_last_checkpoint("t", 2)
    assert json.loads(pointer.read_text())["version"] == 2
