"""Native commits through the store (the ``commit`` CLI and ``SqlStore.commit``) read by Delta-Spark.

A table is created with ``delta-mirror commit --location``, then grows by appends, a remove, a
metadata change (a new column and a new table property) and an append using the new column; it is
published version by version, so our engine checkpoints it (``delta.checkpointInterval`` 2). Spark
must read every version with the right rows and schema, build its snapshots from our checkpoints,
list every commit in ``DESCRIBE HISTORY``; ``validate --reader spark`` is clean.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from click.testing import CliRunner
from support.builders import EVENTS_SCHEMA, event_add, remove_of

from delta_mirror.cli import cli
from delta_mirror.delta.actions import Action
from delta_mirror.delta.log_path import LOG_DIR
from delta_mirror.dev.datafiles import create_table_actions, delta_schema_string
from delta_mirror.jobs.publisher import Publisher
from delta_mirror.jobs.validate import validate_table
from delta_mirror.store.sql_store import SqlStore

NAME = "native"
WIDER = pa.schema([("id", pa.int64()), ("country", pa.string()), ("amount", pa.float64())])


def _cli_commit(store: SqlStore, tmp: Path, actions: list[Action], *extra: str) -> int:
    lines = tmp / "actions.jsonl"
    lines.write_text("".join(json.dumps({kind: body}) + "\n" for kind, body in actions))
    result = CliRunner().invoke(cli, ["--store", store.url, "commit", NAME, "--actions", str(lines), *extra])
    assert result.exit_code == 0, result.output
    return int(result.stdout.strip().splitlines()[-1])


@pytest.fixture
def native(tmp_path: Path) -> tuple[SqlStore, Path, dict[int, list[tuple[Any, ...]]]]:
    root = tmp_path / "table"
    store = SqlStore(f"sqlite:///{tmp_path / 'store.db'}")
    store.init()
    create = create_table_actions(
        EVENTS_SCHEMA, partition_columns=["country"], configuration={"delta.checkpointInterval": "2"}
    )
    first = event_add(root, [1, 2], "a b")
    assert _cli_commit(store, tmp_path, [*create, first], "--location", root.as_uri()) == 0
    assert store.commit(NAME, [event_add(root, [3], "ü%"), event_add(root, [4, 5], "fr")]) == 1
    delete = [remove_of(first), event_add(root, [6], "de")]
    assert _cli_commit(store, tmp_path, delete, "--operation", "DELETE") == 2
    metadata = dict(json.loads(store.snapshot(store.get_table(NAME).id, 2).metadata)["metaData"])
    metadata["schemaString"] = delta_schema_string(WIDER)
    retention = {"delta.logRetentionDuration": "interval 60 days"}
    metadata["configuration"] = {**metadata["configuration"], **retention}
    assert _cli_commit(store, tmp_path, [("metaData", metadata)], "--operation", "ADD COLUMNS") == 3
    assert store.commit(NAME, [event_add(root, [7, 8], "fr", [7.5, None])]) == 4
    publisher = Publisher(store)
    for version in range(5):  # as the publish DAG would: checkpoints fall due on the way
        publisher.publish(NAME, to_version=version)
    rows: dict[int, list[tuple[Any, ...]]] = {0: [(1, "a b"), (2, "a b")]}
    rows[1] = rows[0] + [(3, "ü%"), (4, "fr"), (5, "fr")]
    rows[2] = [*rows[1][2:], (6, "de")]
    rows[3] = [(*r, None) for r in rows[2]]
    rows[4] = rows[3] + [(7, "fr", 7.5), (8, "fr", None)]
    return store, root, rows


def test_spark_reads_every_native_version_and_our_checkpoints(spark: Any, native: Any) -> None:
    store, root, rows = native
    checkpoints = sorted(p.name for p in (root / LOG_DIR).glob("0*.checkpoint*"))
    assert checkpoints == [f"{v:020}.checkpoint.parquet" for v in (2, 4)]
    for version, expected in rows.items():
        df = spark.read.format("delta").option("versionAsOf", version).load(str(root))
        assert df.columns == (["id", "country", "amount"] if version >= 3 else ["id", "country"])
        found = sorted((tuple(r) for r in df.collect()), key=repr)
        assert found == sorted(expected, key=repr), f"version {version}"
    history = spark.sql(f"DESCRIBE HISTORY delta.`{root}`").orderBy("version").collect()
    assert [r["operation"] for r in history] == ["CREATE TABLE", "WRITE", "DELETE", "ADD COLUMNS", "WRITE"]
    jvm = spark._jvm
    log = jvm.org.apache.spark.sql.delta.DeltaLog.forTable(spark._jsparkSession, str(root))
    defaults = [getattr(log, f"getSnapshotAt$default${i}")() for i in (2, 3, 4)]
    for version, checkpoint in ((2, 2), (3, 2), (4, 4)):
        snapshot = log.getSnapshotAt(version, *defaults)
        assert snapshot.logSegment().checkpointProvider().version() == checkpoint
    properties = spark.sql(f"DESCRIBE DETAIL delta.`{root}`").collect()[0]["properties"]
    # the changed metaData, read from our checkpoint at 4
    assert properties["delta.logRetentionDuration"] == "interval 60 days"
    report = validate_table(store, NAME, reader="spark", spark=spark)
    assert report.ok, [f"{p.kind} v{p.version}: {p.message}" for p in report.problems]
    assert report.versions_checked == 5
