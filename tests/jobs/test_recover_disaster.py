"""Disaster recovery (issue 40 item 3): the store lost entirely, a fleet rebuilt from storage alone.

Twelve tables on local storage, each with checkpoints (interval 3), removes and real Parquet data,
published; one more commit on table 0 is never published. The store file is deleted; ``delta-mirror
recover --from-storage FILE`` rebuilds every table from its published log. Then every
``_delta_log/<v>.json`` the store holds is byte-identical to what the store returns, a deltalake
reader sees the same rows as before the loss, table 0's unpublished commit is reported lost (its
recovery point is the last published version), writers continue at the next version, and a
second run has nothing to recover.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

import pyarrow as pa
from click.testing import CliRunner
from deltalake import DeltaTable
from support.builders import ID_SCHEMA, create_data_table, remove_body

from delta_mirror.cli import cli
from delta_mirror.delta.log_path import LOG_DIR, commit_name
from delta_mirror.dev.datafiles import write_data_file
from delta_mirror.jobs.publisher import Publisher
from delta_mirror.store import SqlStore

TABLES = 12
VERSIONS = 8  # 0..7: adds, a remove at 4, checkpoints at 3 and 6


def _rows(root: Path) -> list[int]:
    return sorted(DeltaTable(root.as_uri()).to_pyarrow_table()["id"].to_pylist())


def _fleet(store: SqlStore, lake: Path) -> dict[str, Path]:
    roots = {}
    for i in range(TABLES):
        name, root = f"t{i:02d}", lake / f"t{i:02d}"
        create_data_table(store, root, name, first_rows=[i * 100], checkpoint_interval=3)
        adds: list[dict[str, Any]] = []
        for v in range(1, VERSIONS):
            if v == 4:
                store.commit(name, [("remove", remove_body(adds[0]["path"]))])
                continue
            add = write_data_file(root, pa.table({"id": [i * 100 + v]}, schema=ID_SCHEMA))
            adds.append(add)
            store.commit(name, [("add", add)])
        result = Publisher(store).publish(name)
        assert result.last_published == VERSIONS - 1 and result.checkpoints, result
        roots[name] = root
    return roots


def test_a_lost_store_is_rebuilt_from_the_published_logs(tmp_path: Path) -> None:
    db = tmp_path / "store.db"
    url = f"sqlite:///{db}"
    store = SqlStore(url)
    store.init()
    roots = _fleet(store, tmp_path / "lake")
    before = {name: _rows(root) for name, root in roots.items()}
    unpublished = write_data_file(roots["t00"], pa.table({"id": [999]}, schema=ID_SCHEMA))
    assert store.commit("t00", [("add", unpublished)]) == VERSIONS  # committed, never published
    store.close()
    for leftover in tmp_path.glob("store.db*"):
        leftover.unlink()  # the store is lost

    listing = tmp_path / "tables.txt"
    listing.write_text(
        "# name root (kept beside the backups)\n" + "".join(f"{n} {r.as_uri()}\n" for n, r in roots.items())
    )
    runner = CliRunner()
    assert runner.invoke(cli, ["--store", url, "init"]).exit_code == 0
    rebuilt = runner.invoke(cli, ["--store", url, "recover", "--from-storage", str(listing)])
    assert rebuilt.exit_code == 0, rebuilt.output + rebuilt.stderr
    lines = rebuilt.output.splitlines()
    assert len(lines) == TABLES, rebuilt.output
    for name in roots:
        line = next(x for x in lines if x.startswith(f"{name}: "))
        assert f"the recovery point is version {VERSIONS - 1}" in line, line
        assert "anything committed after it and never published is lost" in line

    with contextlib.closing(SqlStore(url)) as store:
        for name, root in roots.items():
            table = store.get_table(name)
            assert store.latest_version(table.id) == VERSIONS - 1  # table 0's version 8 is lost
            versions = range(table.first_version, VERSIONS)
            assert len(versions) >= 2, table.first_version
            for v in versions:
                assert store.commit_bytes(table.id, v) == (root / LOG_DIR / commit_name(v)).read_bytes()
            assert _rows(root) == before[name]
            # writers continue at the next version, published where readers see it
            add = write_data_file(root, pa.table({"id": [7777]}, schema=ID_SCHEMA))
            assert store.commit(name, [("add", add)]) == VERSIONS
            assert Publisher(store).publish(name).published == [VERSIONS]
            assert _rows(root) == sorted([*before[name], 7777])

    again = runner.invoke(cli, ["--store", url, "recover", "--from-storage", str(listing), "--json"])
    assert again.exit_code == 0, again.output + again.stderr
    report = json.loads(again.output)
    assert [r["adopted"] for r in report] == [0] * TABLES
    assert all(r["rebuilt"] is False for r in report)
