"""The storage scenarios every object store must pass, run on Azurite, fake-gcs-server and MinIO
(tests/test_cloud_storage.py).

The same checks the S3 tests make (tests/jobs/test_publisher.py, test_reconcile.py), on a table
whose data files are in the store too, so deltalake can read the rows: publish through the
``delta-mirror mirror`` CLI (credentials from the environment), a racing second writer,
an idempotent re-put, a different existing commit, a full reconcile.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
from collections.abc import Callable, Mapping
from pathlib import Path

import pyarrow as pa

from delta_mirror.delta.log_path import LOG_DIR, commit_name
from delta_mirror.dev.datafiles import create_table_actions, write_data_file
from delta_mirror.errors import PublishConflictError
from delta_mirror.jobs.publisher import Publisher, RetryPolicy
from delta_mirror.jobs.reconcile import reconcile
from delta_mirror.storage import ObjectExistsError, ObjectStore, open_store
from delta_mirror.store import SqlStore
from support.builders import ID_SCHEMA
from support.cli import clean_env, executable
from support.race import race, won_or_refused
from support.waiting import load_scaled

#: Uploads one data file (a path outside ``_delta_log/``, which the mirror's stores refuse to write).
RawPut = Callable[[str, bytes], None]
VERSIONS = 5  # 0..4 with a checkpoint interval of 2: one run writes the newest due checkpoint, 4
NO_RETRY = RetryPolicy(attempts=1)


def make_table(
    store_url: str,
    location: str,
    raw_put: RawPut,
    scratch: Path,
    *,
    name: str = "t",
    versions: int = VERSIONS,
) -> tuple[SqlStore, list[int]]:
    """Table ``name`` at ``location``: version 0 creates it with one data file, each later version
    adds one; the Parquet files go to the store through ``raw_put``. Returns the store and the ids."""
    store = SqlStore(store_url)
    store.init()
    store.create_table(name, location)
    store.update_table(store.get_table(name).id, checkpoint_interval=2)
    ids: list[int] = []
    for version in range(versions):
        rows = [version * 10, version * 10 + 1]
        ids += rows
        body = write_data_file(scratch, pa.table({"id": rows}, schema=ID_SCHEMA))
        raw_put(body["path"], (scratch / body["path"]).read_bytes())
        first = [*create_table_actions(ID_SCHEMA)] if version == 0 else []
        store.commit(name, [*first, ("add", body)])
    return store, sorted(ids)


def publish_with_cli(store_url: str, name: str, env: Mapping[str, str]) -> dict[str, object]:
    """``delta-mirror --store URL mirror NAME --json`` with only ``env``'s storage credentials."""
    proc = subprocess.run(
        [*executable(), "--store", store_url, "mirror", name, "--json"],
        env=clean_env(**env),
        capture_output=True,
        text=True,
        timeout=load_scaled(120),
    )
    assert proc.returncode == 0, proc.stderr
    result: dict[str, object] = json.loads(proc.stdout)
    return result


def assert_published_log(objects: ObjectStore, versions: int = VERSIONS) -> None:
    """Every commit, the checkpoint at 4, and ``_last_checkpoint`` naming it."""
    names = {m.path.removeprefix(f"{LOG_DIR}/") for m in objects.list(LOG_DIR)}
    assert {commit_name(v) for v in range(versions)} <= names, sorted(names)
    assert f"{4:020d}.checkpoint.parquet" in names, sorted(names)
    last = objects.get(f"{LOG_DIR}/_last_checkpoint")
    assert last is not None and json.loads(last)["version"] == 4


def race_put_if_absent(objects_for_writer: Callable[[], ObjectStore], path: str, writers: int = 8) -> None:
    """``writers`` stores (one client each) put different bytes at ``path`` at once: exactly one
    wins, every other gets ``ObjectExistsError``, and the object holds the winner's bytes."""
    stores = [objects_for_writer() for _ in range(writers)]

    def write(i: int, start: threading.Barrier) -> tuple[str, bytes]:
        data = f'{{"commitInfo":{{"writer":{i}}}}}\n'.encode()
        start.wait()
        return won_or_refused(lambda: stores[i].put_if_absent(path, data), ObjectExistsError), data

    outcomes = race(writers, write)
    won = [data for outcome, data in outcomes if outcome == "won"]
    assert len(won) == 1, outcomes  # every other writer got ObjectExistsError (anything else fails the race)
    assert stores[0].get(path) == won[0]


def assert_second_writer_refused(objects: ObjectStore, path: str) -> None:
    """The loser of a race for ``path`` (already written) gets "already exists"; nothing changes."""
    before = objects.get(path)
    assert before is not None
    try:
        objects.put_if_absent(path, b'{"commitInfo":{"operation":"LATE WRITER"}}\n')
    except ObjectExistsError:
        pass
    else:
        raise AssertionError(f"put_if_absent over an existing {path} succeeded")
    assert objects.get(path) == before


def check_put_if_absent_on_a_real_bucket(location: str) -> None:
    """The opt-in check on a real account or bucket: a second create of one object is refused and
    the first kept; the object is deleted after."""
    objects = open_store(location.rstrip("/") + f"/dm-check-{os.getpid()}")
    path = f"{LOG_DIR}/{commit_name(0)}"
    objects.put_if_absent(path, b"first\n")
    try:
        assert_second_writer_refused(objects, path)
    finally:
        objects.delete(path)


def assert_identical_reput_is_idempotent(store: SqlStore, publisher: Publisher, name: str = "t") -> None:
    """Re-publishing versions already there (same bytes) succeeds as ``already_present``."""
    table = store.get_table(name)
    store.mark_pending(table.id, "json", list(range(VERSIONS)))
    again = publisher.publish(name)
    assert again.published == [] and again.already_present == list(range(VERSIONS))


def assert_a_different_commit_halts(store: SqlStore, publisher: Publisher, objects: ObjectStore) -> None:
    """A foreign ``<1>.json`` at the location: the table halts, the foreign file stays, nothing after it."""
    foreign = b'{"commitInfo":{"operation":"WRITE","engineInfo":"someone-else"}}\n'
    objects.put_if_absent(f"{LOG_DIR}/{commit_name(1)}", foreign)
    try:
        publisher.publish("t")
    except PublishConflictError:
        pass
    else:
        raise AssertionError("publishing over a different commit did not raise PublishConflictError")
    assert store.get_table("t").state == "HALTED"
    assert objects.get(f"{LOG_DIR}/{commit_name(1)}") == foreign
    assert objects.head(f"{LOG_DIR}/{commit_name(2)}") is None


def assert_full_reconcile_repairs(store: SqlStore, publisher: Publisher, objects: ObjectStore) -> None:
    """Lose a commit and a checkpoint and roll ``_last_checkpoint`` back: only ``full`` (which lists
    the store) sees it, and it puts back the same bytes."""
    lost_commit = f"{LOG_DIR}/{commit_name(3)}"
    lost_checkpoint = f"{LOG_DIR}/{4:020d}.checkpoint.parquet"
    commit_bytes = objects.get(lost_commit)
    objects.delete(lost_commit)
    objects.delete(lost_checkpoint)
    objects.put(f"{LOG_DIR}/_last_checkpoint", b'{"version":2,"size":1,"parts":1}')

    assert reconcile(store, strategy="incremental", publisher=publisher).tables[0].action == "up-to-date"
    (entry,) = reconcile(store, strategy="full", publisher=publisher).tables

    assert entry.action in ("published", "repaired"), entry
    assert entry.audit is not None and entry.audit["missing_commits"] == [3]
    assert objects.get(lost_commit) == commit_bytes
    assert objects.head(lost_checkpoint) is not None
    last = objects.get(f"{LOG_DIR}/_last_checkpoint")
    assert last is not None and json.loads(last)["version"] == 4
    again = reconcile(store, strategy="full", publisher=publisher).tables[0]
    assert again.audit is not None and again.action == "up-to-date"


def deltalake_rows(location: str, options: Mapping[str, str]) -> tuple[int, list[int]]:
    """deltalake's version and sorted ids of the table at ``location``."""
    from deltalake import DeltaTable

    table = DeltaTable(location, storage_options=dict(options))
    return table.version(), sorted(table.to_pyarrow_table().column("id").to_pylist())


__all__ = [
    "NO_RETRY",
    "VERSIONS",
    "RawPut",
    "assert_a_different_commit_halts",
    "assert_full_reconcile_repairs",
    "assert_identical_reput_is_idempotent",
    "assert_published_log",
    "assert_second_writer_refused",
    "deltalake_rows",
    "make_table",
    "publish_with_cli",
    "race_put_if_absent",
]
