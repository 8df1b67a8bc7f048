"""Delta-Spark reads what the store published: every version, with the right rows; validate is clean."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from support.builders import EVENTS_SCHEMA, event_add, metadata_body, protocol_body, remove_of

from delta_mirror.delta.actions import Action
from delta_mirror.delta.log_path import LOG_DIR, commit_name
from delta_mirror.dev.datafiles import delta_schema_string
from delta_mirror.jobs.publisher import Publisher
from delta_mirror.jobs.validate import validate_table
from delta_mirror.store.sql_store import SqlStore

NAME = "events"
PROTOCOL: Action = ("protocol", protocol_body())
METADATA: Action = (
    "metaData",
    metadata_body(
        id="5d3f0f6e-1c1e-4e0f-9a43-2b7c1f0e2b11",
        schema_string=delta_schema_string(EVENTS_SCHEMA),
        partition_columns=["country"],
        configuration={"delta.checkpointInterval": "3"},
        created_time=1_700_000_000_000,
    ),
)


@pytest.fixture
def published(tmp_path: Path) -> tuple[SqlStore, Path, dict[int, list[tuple[int, str]]]]:
    """Versions 0..4 committed through the store with real Parquet files, then published."""
    root = tmp_path / "table"
    store = SqlStore(f"sqlite:///{tmp_path / 'store.db'}")
    store.init()
    store.create_table(NAME, root.as_uri())
    first = event_add(root, [1, 2], "a b")  # a space: the path is percent-encoded
    store.commit(NAME, [PROTOCOL, METADATA, first, event_add(root, [3], "ü%")])
    store.commit(NAME, [event_add(root, [4, 5], "fr"), ("txn", {"appId": "loader", "version": 7})])
    store.commit(NAME, [remove_of(first), event_add(root, [6], "a b")])
    store.commit(NAME, [event_add(root, [7], "fr")])
    store.commit(NAME, [event_add(root, [8, 9], "de")])
    Publisher(store).publish(NAME)
    rows = {
        0: [(1, "a b"), (2, "a b"), (3, "ü%")],
    }
    rows[1] = rows[0] + [(4, "fr"), (5, "fr")]
    rows[2] = [r for r in rows[1] if r[0] not in (1, 2)] + [(6, "a b")]
    rows[3] = rows[2] + [(7, "fr")]
    rows[4] = rows[3] + [(8, "de"), (9, "de")]
    return store, root, rows


def test_spark_reads_every_published_version(spark: Any, published: Any) -> None:
    store, root, rows = published
    assert (root / LOG_DIR / commit_name(4)).exists()
    for version, expected in rows.items():
        df = spark.read.format("delta").option("versionAsOf", version).load(str(root))
        found = sorted((r["id"], r["country"]) for r in df.collect())
        assert found == sorted(expected), f"version {version}"
    history = spark.sql(f"DESCRIBE HISTORY delta.`{root}`").select("version").collect()
    assert sorted(r["version"] for r in history) == [0, 1, 2, 3, 4]
    report = validate_table(store, NAME, reader="spark", spark=spark)
    assert report.ok, [f"{p.kind} v{p.version}: {p.message}" for p in report.problems]
    assert report.versions_checked == 5


def test_spark_reader_reports_a_lost_file(spark: Any, published: Any) -> None:
    """An add dropped from a published commit (the file vanished for Spark) is a reader_files problem."""
    store, root, _ = published
    log = root / LOG_DIR / commit_name(1)  # version 4 is read from its checkpoint
    lines = log.read_bytes().decode().splitlines(keepends=True)
    dropped = next(json.loads(line)["add"]["path"] for line in lines if line.startswith('{"add"'))
    log.write_bytes("".join(line for line in lines if dropped not in line).encode())
    report = validate_table(store, NAME, to_version=2, reader="spark", spark=spark)
    kinds = {(p.kind, p.version) for p in report.problems}
    assert ("hash_mismatch", 1) in kinds
    assert ("reader_files", 1) in kinds, report.problems
    files = next(p for p in report.problems if p.kind == "reader_files")
    assert "1 missing from Spark" in files.message


def test_cli_validate_with_the_spark_reader(spark: Any, published: Any, tmp_path: Path) -> None:
    """In-process, the CLI uses the active SparkSession (get_spark() reuses it)."""
    from click.testing import CliRunner

    from delta_mirror.cli import cli

    result = CliRunner().invoke(
        cli,
        ["--store", f"sqlite:///{tmp_path / 'store.db'}", "validate", NAME, "--reader", "spark", "--json"],
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout[result.stdout.index("{") :])
    assert report["ok"] and report["versions_checked"] == 5
