"""``validate_due_tables``: one process validates every table whose cadence says due (the tables
published in the triggerer have no per-commit run to do it), records each result, and reports a
failure as one line per table without stopping the others. Real SQLite store, local folders and
Parquet files."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pyarrow as pa

from delta_mirror.delta.log_path import LOG_DIR, commit_name
from delta_mirror.dev.datafiles import create_table_actions, write_data_file
from delta_mirror.jobs.fleet_validate import TableValidation, failures, validate_due_tables
from delta_mirror.jobs.publisher import Publisher
from delta_mirror.store import SqlStore

SCHEMA = pa.schema([("id", pa.int64())])
HOUR = TableValidation(timedelta(hours=1))


def _table(store: SqlStore, tmp_path: Path, name: str, versions: int = 2) -> Path:
    root = tmp_path / name
    root.mkdir()
    store.create_table(name, root.as_uri())
    for n in range(versions):
        add = ("add", write_data_file(root, pa.table({"id": pa.array([n], pa.int64())})))
        store.commit(name, [*create_table_actions(SCHEMA), add] if n == 0 else [add])
    Publisher(store).publish(name)
    return root


def test_due_tables_are_validated_and_recorded_not_due_ones_wait_and_a_failure_is_one_line(
    tmp_path: Path,
) -> None:
    store = SqlStore(f"sqlite:///{tmp_path / 'store.db'}")
    store.init()
    _table(store, tmp_path, "fresh")  # never validated: due
    _table(store, tmp_path, "recent")
    broken = _table(store, tmp_path, "broken")
    cadences = {"fresh": HOUR, "recent": HOUR, "broken": HOUR, "not_created": HOUR}
    first = {r.table: r for r in validate_due_tables(store, {"recent": HOUR})}
    assert first["recent"].plan.state == "due" and first["recent"].report is not None

    (broken / LOG_DIR / commit_name(1)).write_text("{}\n")  # replaced behind the mirror's back
    results = {r.table: r for r in validate_due_tables(store, cadences)}
    assert sorted(results) == ["broken", "fresh", "recent"]  # a table not in the store is skipped
    assert results["recent"].plan.state == "up to date" and results["recent"].report is None
    fresh = results["fresh"].report
    assert fresh is not None and fresh.ok and (fresh.from_version, fresh.to_version) == (1, 1)
    assert store.get_table("fresh").settings["last_validation"]["ok"] is True
    assert store.get_table("broken").settings["last_validation"]["ok"] is False
    (line,) = failures(results.values())
    assert line.startswith("broken: versions 1..1: ") and "problem(s)" in line

    # the failed range is due again at once; the passed ones wait for their cadence
    again = {r.table: r for r in validate_due_tables(store, cadences)}
    assert again["broken"].plan.state == "due" and again["broken"].failed
    assert again["fresh"].plan.state == "up to date"
    store.commit("fresh", [("txn", {"appId": "loader", "version": 1})])
    Publisher(store).publish("fresh")
    later = {r.table: r for r in validate_due_tables(store, {"fresh": HOUR})}
    assert later["fresh"].plan.state == "not due"
    off = validate_due_tables(store, {"fresh": TableValidation(None)})
    assert off[0].plan.state == "off" and not off[0].failed
