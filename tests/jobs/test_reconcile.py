"""The reconciler re-drives what is pending or failed and reports what it cannot fix."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
from support.builders import append_rows, create_data_table

from delta_mirror.jobs.publisher import Publisher
from delta_mirror.jobs.reconcile import reconcile
from delta_mirror.store import SqlStore

SCHEMA = pa.schema([("id", pa.int64())])


_table = create_data_table


def test_reconcile_publishes_pending_and_failed_versions(store: SqlStore, tmp_path: Path) -> None:
    root = tmp_path / "t"
    _table(store, root)
    Publisher(store).publish("t")
    for i in range(3):
        append_rows(store, root, "t", [i])
    info = store.get_table("t")
    store.mark_failed(info.id, 1, "json", "FAILED", "TRANSIENT", "simulated throttling")

    report = reconcile(store)

    (entry,) = report.tables
    assert entry.action == "published" and entry.published == 3
    assert store.last_published_version(info.id) == 3
    assert {r.state for r in store.status_rows(info.id, artifact="json")} == {"SUCCESS"}
    assert sorted(p.name for p in (root / "_delta_log").glob("*.json"))[-1] == "00000000000000000003.json"
    assert reconcile(store).tables[0].action == "up-to-date"


def test_reconcile_reports_a_conflict_halt_for_escalation_and_never_overwrites(
    store: SqlStore, tmp_path: Path
) -> None:
    root = tmp_path / "t"
    _table(store, root)
    foreign = b'{"commitInfo":{"operation":"WRITE","engineInfo":"someone-else"}}\n'
    (root / "_delta_log").mkdir(parents=True)
    (root / "_delta_log" / "00000000000000000000.json").write_bytes(foreign)

    report = reconcile(store)

    (entry,) = report.tables
    assert entry.action == "failed" and entry.error_class == "CONFLICT"
    assert entry.persistent_failures and entry.persistent_failures[0]["version"] == 0
    assert report.needs_escalation == [entry]
    assert (root / "_delta_log" / "00000000000000000000.json").read_bytes() == foreign
    again = reconcile(store).tables[0]
    assert again.action == "halted" and "different file" in (again.error or "")
    assert json.loads(json.dumps(report.to_json()))["strategy"] == "incremental"


def test_full_reconcile_republishes_lost_commits_and_checkpoints(store: SqlStore, tmp_path: Path) -> None:
    root = tmp_path / "t"
    _table(store, root)
    for i in range(11):
        append_rows(store, root, "t", [i])
    result = Publisher(store).publish("t")
    assert result.checkpoints, "a checkpoint is due after 10 versions"
    log = root / "_delta_log"
    (log / "00000000000000000003.json").unlink()
    (log / f"{result.checkpoints[0]:020d}.checkpoint.parquet").unlink()
    (log / "_last_checkpoint").write_text('{"version":1,"size":1,"parts":1}')

    assert reconcile(store, strategy="incremental").tables[0].action == "up-to-date"  # it cannot see the loss
    (entry,) = reconcile(store, strategy="full").tables

    assert entry.action in ("published", "repaired"), entry
    assert entry.audit is not None and entry.audit["missing_commits"] == [3]
    assert (log / "00000000000000000003.json").exists()
    assert (log / f"{result.checkpoints[0]:020d}.checkpoint.parquet").exists()
    assert json.loads((log / "_last_checkpoint").read_text())["version"] == result.checkpoints[0]
    again = reconcile(store, strategy="full").tables[0]
    assert again.audit is not None and again.action == "up-to-date"


def test_smart_reconcile_reports_a_commit_beyond_the_store_and_leaves_healthy_tables_alone(
    store: SqlStore, tmp_path: Path
) -> None:
    healthy, hijacked = tmp_path / "healthy", tmp_path / "hijacked"
    _table(store, healthy, "healthy")
    _table(store, hijacked, "hijacked")
    Publisher(store).publish("healthy")
    Publisher(store).publish("hijacked")
    foreign = b'{"commitInfo":{"operation":"WRITE","engineInfo":"spark-outside"}}\n'
    (hijacked / "_delta_log" / "00000000000000000001.json").write_bytes(foreign)

    report = reconcile(store, strategy="smart")

    by_name = {t.table: t for t in report.tables}
    assert by_name["healthy"].action == "up-to-date" and by_name["healthy"].audit is None  # no full listing
    # a commit file right after the store's latest: the store lost it (failover, restore) or an
    # external writer wrote it; either way nothing is overwritten, commits are refused, and
    # `delta-mirror recover` adopts what readers saw (issue 40); no split-brain halt
    hijacked_entry = by_name["hijacked"]
    assert hijacked_entry.action == "failed", hijacked_entry
    assert "store behind published log by 1 version (failover or restore?)" in (hijacked_entry.error or "")
    assert "delta-mirror recover hijacked" in (hijacked_entry.error or "")
    assert store.get_table("hijacked").state != "HALTED"
    assert (hijacked / "_delta_log" / "00000000000000000001.json").read_bytes() == foreign
