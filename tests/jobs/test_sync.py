"""``sync_table``: a run's whole work in one call. Pending versions are published, a checkpoint is
written only when the cadence says so, validation runs on its own cadence over the versions
published since the last validation, a problem is reported (and due again at once), the lag sample
is recorded. Real SQLite and PostgreSQL stores, real local folders and Parquet files."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pyarrow as pa
import pytest

from delta_mirror.delta.log_path import LOG_DIR, commit_name
from delta_mirror.dev.datafiles import create_table_actions, write_data_file
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
    store = SqlStore(store_url)
    store.init()
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

    url = f"sqlite:///{tmp_path / 'store.db'}"
    store = SqlStore(url)
    store.init()
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
