"""``sync_table``: a run's whole work in one call. Pending versions are published, a checkpoint is
written only when the cadence says so, validation runs on its own cadence over the versions
published since the last validation, a problem is reported (and due again at once), the lag sample
is recorded. Real SQLite and PostgreSQL stores, real local folders and Parquet files."""

from __future__ import annotations

import json
import threading
import time
from datetime import timedelta
from pathlib import Path

import pyarrow as pa
import pytest
from support.stores import init_store, sqlite_store

from delta_mirror.delta.log_path import LOG_DIR, commit_name
from delta_mirror.dev.datafiles import create_table_actions, write_data_file
from delta_mirror.errors import LeaseHeldError, PermanentError
from delta_mirror.jobs.publisher import Publisher
from delta_mirror.jobs.sync import sync_table
from delta_mirror.store import SqlStore

SCHEMA = pa.schema([("id", pa.int64())])
HOUR = timedelta(hours=1)


def _commit(store: SqlStore, root: Path, n: int) -> None:
    """One version adding a real Parquet file (version 0 also creates the table's schema)."""
    add = ("add", write_data_file(root, pa.table({"id": pa.array([n], pa.int64())})))
    store.commit("t", [*create_table_actions(SCHEMA), add] if n == 0 else [add])


@pytest.fixture
def table(store_url: str, tmp_path: Path) -> tuple[SqlStore, Path]:
    """Table ``t`` with versions 0..1 committed, none published, a checkpoint every 3 versions."""
    store = init_store(store_url)
    root = tmp_path / "t"
    root.mkdir()
    store.create_table("t", root.as_uri())
    store.update_table(store.get_table("t").id, checkpoint_interval=3)
    for n in range(2):
        _commit(store, root, n)
    return store, root


def _samples(store: SqlStore) -> list[tuple[int, float, int]]:
    return list(store.lag_samples(store.get_table("t").id))


def test_pending_versions_are_published_checkpointed_when_due_and_the_lag_recorded(
    table: tuple[SqlStore, Path],
) -> None:
    store, root = table
    first = sync_table(store, "t", validate_every=None).to_json()
    assert (first["published"], first["first"], first["last_published"]) == (2, 0, 1)
    assert first["checkpoints"] == []  # 1 version since none: not due
    assert first["validation"] == {"state": "off"}
    assert first["lag"]["versions_behind"] == 0
    assert len(_samples(store)) == 1

    for n in (2, 3):
        _commit(store, root, n)
    second = sync_table(store, "t", validate_every=None).to_json()
    assert (second["published"], second["first"], second["last_published"]) == (2, 2, 3)
    assert second["checkpoints"] == [3]  # 3 versions since the start: due
    assert store.last_checkpoint_version(store.get_table("t").id) == 3

    _commit(store, root, 4)
    third = sync_table(store, "t", validate_every=None).to_json()
    assert (third["last_published"], third["checkpoints"]) == (4, [])
    assert (root / LOG_DIR / commit_name(4)).is_file()
    assert [behind for _, _, behind in _samples(store)] == [0, 0, 0]


def test_validation_runs_on_its_cadence_over_every_version_published_since_the_last(
    table: tuple[SqlStore, Path],
) -> None:
    store, root = table
    first = sync_table(store, "t", validate_every=HOUR).to_json()["validation"]
    assert first["state"] == "due" and first["ok"] is True
    assert (first["from_version"], first["to_version"]) == (0, 1)

    _commit(store, root, 2)
    second = sync_table(store, "t", validate_every=HOUR).to_json()["validation"]
    assert second["state"] == "not due" and "from_version" not in second and second["next_due_at"] > 0
    assert sync_table(store, "t", validate_every=HOUR).to_json()["validation"]["state"] == "not due"

    _commit(store, root, 3)
    info = store.get_table("t")  # the cadence has passed: the last validation was two hours ago
    record = dict(info.settings["last_validation"])
    record["at"] -= 2 * 3600 * 1000
    store.update_table(info.id, settings={**info.settings, "last_validation": record})
    third = sync_table(store, "t", validate_every=HOUR).to_json()["validation"]
    assert third["state"] == "due" and (third["from_version"], third["to_version"]) == (2, 3)
    assert store.get_table("t").settings["last_validation"]["to_version"] == 3

    # nothing published since: nothing to validate even with a cadence of 0 (every run)
    idle = sync_table(store, "t", validate_every=timedelta(0))
    assert idle.validation.state == "up to date" and idle.report is None


def test_a_validation_problem_is_reported_and_due_again_until_it_passes(
    table: tuple[SqlStore, Path],
) -> None:
    store, root = table
    sync_table(store, "t", validate_every=HOUR)  # validates 0..1: OK
    _commit(store, root, 2)
    info = store.get_table("t")
    record = {**info.settings["last_validation"], "at": 0}  # due
    store.update_table(info.id, settings={**info.settings, "last_validation": record})
    sync_table(store, "t", validate_every=timedelta(days=1))  # not due: version 2 published, unchecked
    (root / LOG_DIR / commit_name(2)).unlink()  # a reader now misses version 2

    _commit(store, root, 3)
    store.update_table(info.id, settings={**store.get_table("t").settings, "last_validation": record})
    failed = sync_table(store, "t", validate_every=HOUR)
    assert failed.report is not None and not failed.report.ok
    assert "missing_commit" in {p.kind for p in failed.report.problems}
    assert (failed.report.from_version, failed.report.to_version) == (2, 3)
    assert failed.to_json()["validation"]["ok"] is False
    assert store.get_table("t").settings["last_validation"]["ok"] is False

    # a retry right after is not "not due": the failed range is validated again
    again = sync_table(store, "t", validate_every=HOUR)
    assert again.validation.state == "due" and again.report is not None and not again.report.ok
    assert (again.report.from_version, again.report.to_version) == (2, 3)


def test_the_cli_syncs_with_the_table_config_and_exits_1_on_a_problem(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from click.testing import CliRunner

    from delta_mirror.cli import cli

    url, store = sqlite_store(tmp_path)
    root = tmp_path / "t"
    root.mkdir()
    store.create_table("t", root.as_uri())
    for n in range(2):
        _commit(store, root, n)
    config = tmp_path / "delta_mirror.yaml"
    config.write_text("tables: {t: {validate_every: 0s}}\n")
    monkeypatch.setenv("DELTA_MIRROR_CONFIG", str(config))
    runner = CliRunner()

    done = runner.invoke(cli, ["--store", url, "sync", "t", "--json"])
    assert done.exit_code == 0, done.output
    summary = json.loads(done.output)
    assert (summary["published"], summary["validation"]["ok"], summary["lag"]["versions_behind"]) == (
        2,
        True,
        0,
    )

    (root / LOG_DIR / commit_name(1)).write_text("{}\n")  # replaced behind the mirror's back
    _commit(store, root, 2)
    info = store.get_table("t")  # as if version 1 had not been validated yet: the run covers 1..2
    store.update_table(info.id, settings={**info.settings, "last_validation": {"to_version": 0, "ok": True}})
    failed = runner.invoke(cli, ["--store", url, "sync", "t"])
    assert failed.exit_code == 1, failed.output
    assert "validation versions 1..2: 3 problem(s)" in failed.output  # the hash, and what a reader sees
    assert "PROBLEM [hash_mismatch] version 1" in failed.output


# -- publish_in: triggerer: the table's trigger holds the lease while the run takes it --------------
TRIGGER = "triggerer-host:1:abcd"  # the trigger's publisher (its owner, as ``default_owner`` makes)


def _published_by_trigger(store: SqlStore) -> None:
    """What the trigger does: publish every pending version, no checkpoint (``watch_publish``)."""
    Publisher(store, owner=TRIGGER, cadence_checkpoints=False).publish("t")


def test_a_triggerer_run_waits_for_the_triggers_lease_and_writes_the_due_checkpoint(
    table: tuple[SqlStore, Path], store_url: str
) -> None:
    """The race of the fleet benchmark: the run started for a checkpoint takes the lease while the
    trigger publishes the next commit. It waits, publishes nothing twice, writes the checkpoint."""
    store, root = table
    _published_by_trigger(store)  # 0..1
    for n in (2, 3):
        _commit(store, root, n)
    table_id = store.get_table("t").id
    assert store.acquire_lease(table_id, TRIGGER, 60.0)  # the trigger is at work on 2..3

    def trigger_publishes() -> None:
        time.sleep(0.4)
        _published_by_trigger(SqlStore(store_url))

    trigger = threading.Thread(target=trigger_publishes)
    trigger.start()
    try:
        started = time.monotonic()
        result = sync_table(store, "t", validate_every=None, publish_in="triggerer")
        waited = time.monotonic() - started
    finally:
        trigger.join()
    assert waited >= 0.3  # it did wait for the trigger's lease
    assert (result.publish.published, result.publish.already_present) == ([], [])  # nothing twice
    summary = result.to_json()
    assert (summary["last_published"], summary["checkpoints"]) == (3, [3])
    assert (summary["published_elsewhere"], summary["checkpoint_not_written"]) == (False, None)
    assert store.last_checkpoint_version(table_id) == 3
    assert (root / LOG_DIR / commit_name(3)).is_file()


def test_a_lease_held_past_the_wait_leaves_the_checkpoint_due_without_failing_the_run(
    table: tuple[SqlStore, Path],
) -> None:
    store, root = table
    for n in (2, 3):
        _commit(store, root, n)
    _published_by_trigger(store)  # 0..3: a checkpoint is due at 3
    table_id = store.get_table("t").id
    assert store.acquire_lease(table_id, TRIGGER, 60.0)  # held for longer than the run waits

    started = time.monotonic()
    held = sync_table(store, "t", validate_every=None, publish_in="triggerer", lease_wait=0.2)
    assert time.monotonic() - started >= 0.4  # both steps waited
    summary = held.to_json()
    assert (summary["published"], summary["last_published"], summary["checkpoints"]) == (0, 3, [])
    assert (summary["published_elsewhere"], summary["checkpoint_not_written"]) == (True, 3)
    assert held.checkpoint_text().startswith("due at version 3 NOT written: another publisher held")
    assert store.last_checkpoint_version(table_id) is None  # not written, and not pretended

    store.release_lease(table_id, TRIGGER)
    after = sync_table(store, "t", validate_every=None, publish_in="triggerer", lease_wait=0.2)
    assert (after.checkpoints, after.checkpoint_not_written, after.checkpoint_text()) == ([3], None, "3")
    assert store.last_checkpoint_version(table_id) == 3


def test_a_stuck_lease_over_pending_versions_and_a_task_tables_held_lease_still_fail_the_try(
    table: tuple[SqlStore, Path],
) -> None:
    """A holder that publishes nothing while versions wait (a crashed publisher's lease) is not
    "published elsewhere": the try fails, retryably, as a ``task`` table's does at once."""
    store, _ = table
    table_id = store.get_table("t").id
    assert store.acquire_lease(table_id, "crashed-publisher", 60.0)
    with pytest.raises(LeaseHeldError) as stuck:
        sync_table(store, "t", validate_every=None, publish_in="triggerer", lease_wait=0.2)
    assert stuck.value.retryable
    started = time.monotonic()
    with pytest.raises(LeaseHeldError, match="another publisher holds this table's lease"):
        sync_table(store, "t", validate_every=None)  # publish_in: task: no wait, as before
    assert time.monotonic() - started < 0.2
    assert store.last_published_version(table_id) is None

    store.release_lease(table_id, "crashed-publisher")
    store.halt_table(table_id, "a conflict", 1)  # other errors: unchanged, not waited for or left
    with pytest.raises(PermanentError, match="the table is halted"):
        sync_table(store, "t", validate_every=None, publish_in="triggerer", lease_wait=0.2)
