"""The publisher's invariants, one test each, on real folders (and the S3 server where storage
semantics matter): in order with no gaps, never overwrite, deterministic bytes, conflicts halt
naming both hashes, checkpoints follow commits, status tells the truth, writes stay in the log."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
import sqlalchemy as sa
from support.builders import add_body

from delta_mirror.delta.log_path import LOG_DIR, commit_name
from delta_mirror.dev.datafiles import create_table_actions, write_data_file
from delta_mirror.errors import DataError, PermanentError, PublishConflictError, TransientError
from delta_mirror.jobs.publisher import Publisher, RetryPolicy
from delta_mirror.storage import ObjectMeta, ObjectStore, open_store
from delta_mirror.store import SqlStore

SCHEMA = pa.schema([("id", pa.int64())])
NO_RETRY = RetryPolicy(attempts=1)


# The publisher on every store (the MySQL and DuckDB params too: issue 30).
pytestmark = pytest.mark.all_backends


def _store(store_url: str) -> SqlStore:
    store = SqlStore(store_url)
    store.init()
    return store


def _table(store: SqlStore, location: str, versions: int, *, interval: int = 1000) -> None:
    """Versions ``0..versions-1``: the create commit, then one add (log-only paths) per version."""
    store.create_table("t", location)
    store.update_table(store.get_table("t").id, checkpoint_interval=interval)
    store.commit("t", [*create_table_actions(SCHEMA)])
    for i in range(1, versions):
        store.commit("t", [("add", add_body(f"part-{i}.parquet"))])


def _log(folder: Path) -> list[str]:
    return sorted(p.name for p in (folder / LOG_DIR).iterdir() if p.is_file())


class _Recording:
    """An ``ObjectStore`` that records writes and can fail or lose chosen ones."""

    def __init__(self, inner: ObjectStore, *, fail: str | None = None, lose: str | None = None) -> None:
        self.inner, self.fail, self.lose = inner, fail, lose
        self.uri = inner.uri
        self.writes: list[str] = []

    def put_if_absent(self, path: str, data: bytes) -> None:
        self.writes.append(path)
        if path == self.fail:
            raise TransientError(f"injected failure writing {path}", hint="test")
        if path == self.lose:
            return  # acknowledged, never stored
        self.inner.put_if_absent(path, data)

    def put(self, path: str, data: bytes) -> None:
        self.writes.append(path)
        self.inner.put(path, data)

    def get(self, path: str) -> bytes | None:
        return self.inner.get(path)

    def head(self, path: str) -> ObjectMeta | None:
        return self.inner.head(path)

    def list(self, prefix: str) -> list[ObjectMeta]:
        return self.inner.list(prefix)

    def delete(self, path: str) -> None:
        self.inner.delete(path)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def _publisher(store: SqlStore, **kwargs: Any) -> tuple[Publisher, list[_Recording]]:
    opened: list[_Recording] = []

    def open_location(location: str) -> ObjectStore:
        opened.append(_Recording(open_store(location), **kwargs))
        return opened[-1]

    return Publisher(store, retry=NO_RETRY, open_location=open_location), opened


def test_versions_go_out_in_order_and_stop_at_the_first_failure(store_url: str, tmp_path: Path) -> None:
    store = _store(store_url)
    _table(store, tmp_path.as_uri(), 6)
    publisher, opened = _publisher(store, fail=f"{LOG_DIR}/{commit_name(3)}")

    with pytest.raises(TransientError):
        publisher.publish("t")

    assert _log(tmp_path) == [commit_name(v) for v in range(3)]  # no gap: nothing after the failure
    assert [w for w in opened[-1].writes if w.endswith(".json")] == [
        f"{LOG_DIR}/{commit_name(v)}" for v in range(4)
    ]
    table = store.get_table("t")
    assert store.last_published_version(table.id) == 2
    Publisher(store).publish("t")
    assert _log(tmp_path) == [commit_name(v) for v in range(6)]


def test_publish_refuses_to_overwrite_a_different_commit(store_url: str, table_location: str) -> None:
    store = _store(store_url)
    _table(store, table_location, 3)
    objects = open_store(table_location)
    foreign = b'{"commitInfo":{"operation":"WRITE","engineInfo":"someone-else"}}\n'
    objects.put_if_absent(f"{LOG_DIR}/{commit_name(1)}", foreign)

    with pytest.raises(PublishConflictError):
        Publisher(store, retry=NO_RETRY).publish("t")

    assert objects.get(f"{LOG_DIR}/{commit_name(1)}") == foreign
    assert objects.head(f"{LOG_DIR}/{commit_name(2)}") is None


def test_a_conflict_halts_the_table_and_names_both_hashes(store_url: str, tmp_path: Path) -> None:
    store = _store(store_url)
    _table(store, tmp_path.as_uri(), 2)
    table = store.get_table("t")
    foreign = b'{"commitInfo":{"operation":"WRITE"}}\n'
    (tmp_path / LOG_DIR).mkdir()
    (tmp_path / LOG_DIR / commit_name(0)).write_bytes(foreign)
    ours = hashlib.sha256(store.commit_bytes(table.id, 0)).hexdigest()
    theirs = hashlib.sha256(foreign).hexdigest()

    with pytest.raises(PublishConflictError) as caught:
        Publisher(store, retry=NO_RETRY).publish("t")

    assert (caught.value.expected_sha256, caught.value.found_sha256) == (ours, theirs)
    halted = store.get_table("t")
    assert halted.state == "HALTED"
    assert ours in (halted.halted_reason or "") and theirs in (halted.halted_reason or "")
    (row,) = store.status_rows(table.id, artifact="json", from_version=0, to_version=0)
    assert row.state == "CONFLICT"


def test_a_folder_where_a_commit_file_belongs_is_a_permanent_error_saying_what_to_do(
    store_url: str, tmp_path: Path
) -> None:
    """Not "[TRANSIENT] ... retried automatically" forever: no retry removes a folder."""
    store = _store(store_url)
    _table(store, tmp_path.as_uri(), 3)
    (tmp_path / LOG_DIR / commit_name(1)).mkdir(parents=True)

    with pytest.raises(PermanentError) as caught:
        Publisher(store).publish("t")

    assert type(caught.value) is PermanentError and caught.value.version == 1
    assert "is not a file" in caught.value.message and "folder" in caught.value.message
    assert f"remove or rename what is at {LOG_DIR}/{commit_name(1)}" in caught.value.message
    assert "delta-mirror mirror t" in caught.value.message
    table = store.get_table("t")
    (row,) = store.status_rows(table.id, artifact="json", from_version=1, to_version=1)
    assert (row.state, row.error_class) == ("FAILED", "PERMANENT")
    assert store.last_published_version(table.id) == 0
    (tmp_path / LOG_DIR / commit_name(1)).rmdir()  # what the message says to do
    Publisher(store).publish("t")
    assert _log(tmp_path) == [commit_name(v) for v in range(3)]


def test_a_folder_where_a_checkpoint_belongs_is_a_permanent_error_too(store_url: str, tmp_path: Path) -> None:
    store = _store(store_url)
    _table(store, tmp_path.as_uri(), 3)
    publisher = Publisher(store)
    publisher.publish("t")
    folder = tmp_path / LOG_DIR / f"{2:020d}.checkpoint.parquet"
    folder.mkdir()

    with pytest.raises(PermanentError) as caught:
        publisher.checkpoint("t", 2)

    assert "is not a file" in caught.value.message and "remove or rename" in caught.value.message
    folder.rmdir()
    assert publisher.checkpoint("t", 2) == 2


def test_commit_bytes_are_deterministic_and_a_rerun_is_idempotent(store_url: str, tmp_path: Path) -> None:
    store = _store(store_url)
    _table(store, tmp_path.as_uri(), 4)
    table = store.get_table("t")
    first = Publisher(store).publish("t")
    files = {v: (tmp_path / LOG_DIR / commit_name(v)) for v in range(4)}
    before = {v: (p.read_bytes(), p.stat().st_mtime_ns) for v, p in files.items()}
    for row in store.commit_rows(table.id, 0, 3):
        assert hashlib.sha256(before[row.version][0]).hexdigest() == row.sha256
        assert store.commit_bytes(table.id, row.version) == before[row.version][0]

    store.mark_pending(table.id, "json", [0, 1, 2, 3])
    again = Publisher(store).publish("t")

    assert first.published == [0, 1, 2, 3]
    assert again.published == [] and again.already_present == [0, 1, 2, 3]
    assert {v: (p.read_bytes(), p.stat().st_mtime_ns) for v, p in files.items()} == before
    assert {r.state for r in store.status_rows(table.id, artifact="json")} == {"SUCCESS"}


def test_checkpoints_follow_commits_and_last_checkpoint_never_moves_back(
    store_url: str, tmp_path: Path
) -> None:
    store = _store(store_url)
    _table(store, tmp_path.as_uri(), 3, interval=2)
    checkpoints = Publisher(store).publish("t").checkpoints
    for i in (3, 4):
        store.commit(
            "t",
            [("add", add_body(f"late-{i}.parquet"))],
        )
    checkpoints += Publisher(store).publish("t").checkpoints

    assert checkpoints == [2, 4]
    for v in checkpoints:
        assert (tmp_path / LOG_DIR / commit_name(v)).exists()
    pointer = tmp_path / LOG_DIR / "_last_checkpoint"
    assert json.loads(pointer.read_bytes())["version"] == 4

    Publisher(store).checkpoint("t", 2)  # an older checkpoint written again

    assert json.loads(pointer.read_bytes())["version"] == 4


def test_no_checkpoint_is_written_for_a_version_whose_commit_failed(store_url: str, tmp_path: Path) -> None:
    store = _store(store_url)
    _table(store, tmp_path.as_uri(), 3, interval=2)
    publisher, _ = _publisher(store, fail=f"{LOG_DIR}/{commit_name(2)}")

    with pytest.raises(TransientError):
        publisher.publish("t")

    assert not list((tmp_path / LOG_DIR).glob("*.checkpoint*"))
    assert not (tmp_path / LOG_DIR / "_last_checkpoint").exists()


def test_success_is_recorded_only_after_the_file_is_read_back(store_url: str, tmp_path: Path) -> None:
    store = _store(store_url)
    _table(store, tmp_path.as_uri(), 3)
    table = store.get_table("t")
    publisher, _ = _publisher(store, lose=f"{LOG_DIR}/{commit_name(1)}")

    with pytest.raises(TransientError, match="not durable"):
        publisher.publish("t")

    states = {r.version: r.state for r in store.status_rows(table.id, artifact="json")}
    assert states[0] == "SUCCESS" and states[1] != "SUCCESS" and states[2] != "SUCCESS"
    assert store.last_published_version(table.id) == 0


def test_the_publisher_writes_only_under_delta_log(store_url: str, tmp_path: Path) -> None:
    store = _store(store_url)
    store.create_table("t", tmp_path.as_uri())
    store.update_table(store.get_table("t").id, checkpoint_interval=2)
    store.commit("t", [*create_table_actions(SCHEMA)])
    for i in range(3):
        store.commit("t", [("add", write_data_file(tmp_path, pa.table({"id": [i]}, schema=SCHEMA)))])
    data_files = {p: p.stat().st_mtime_ns for p in tmp_path.glob("*.parquet")}
    publisher, opened = _publisher(store)

    publisher.publish("t")

    writes = [w for o in opened for w in o.writes]
    assert writes and all(w.startswith(f"{LOG_DIR}/") for w in writes)
    assert {p: p.stat().st_mtime_ns for p in tmp_path.glob("*.parquet")} == data_files
    with pytest.raises(PermanentError):
        open_store(tmp_path.as_uri()).put_if_absent("part-x.parquet", b"x")


def test_a_stored_commit_that_fails_its_check_stops_the_run_after_the_versions_before_it(
    store_url: str, tmp_path: Path
) -> None:
    """The commits prepared ahead of a bad one are still written, in order; the bad one halts."""
    store = _store(store_url)
    _table(store, tmp_path.as_uri(), 6)
    table = store.get_table("t")
    with store.engine.begin() as conn:
        conn.execute(
            sa.text("UPDATE dl_commits SET sha256 = :s WHERE table_id = :t AND version = 3"),
            {"s": "0" * 64, "t": table.id},
        )

    with pytest.raises(DataError, match="SHA-256"):
        Publisher(store, retry=NO_RETRY).publish("t")

    assert _log(tmp_path) == [commit_name(v) for v in range(3)]
    states = {r.version: r.state for r in store.status_rows(table.id, artifact="json")}
    assert [states[v] for v in range(4)] == ["SUCCESS", "SUCCESS", "SUCCESS", "FAILED"]
    assert store.get_table("t").state == "HALTED"


def test_a_failed_cadence_checkpoint_leaves_the_published_commits_alone(
    store_url: str, tmp_path: Path
) -> None:
    store = _store(store_url)
    _table(store, tmp_path.as_uri(), 5, interval=2)
    table = store.get_table("t")
    publisher, _ = _publisher(store, fail=f"{LOG_DIR}/{4:020d}.checkpoint.parquet")

    with pytest.raises(TransientError, match="injected"):
        publisher.publish("t")

    assert store.last_published_version(table.id) == 4
    assert {r.state for r in store.status_rows(table.id, artifact="json")} == {"SUCCESS"}
    assert store.get_table("t").state != "HALTED"
    assert Publisher(store).publish("t").checkpoints == [4]  # re-driven by the next run
