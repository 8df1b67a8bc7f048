"""The Spark checkpoint engine writes what the local engine writes, and readers accept it.

One table in a real PostgreSQL store (partitioned, with tombstones, deletion vectors, stats, tags,
txn and domain metadata, a null partition value and a null extra partitionValues key), published to a
local folder; then the checkpoint of its last version is built twice — the local engine, and the
Spark engine reading the store over JDBC in parallel partitions — as classic, multi-part and V2
(another table with ``v2Checkpoint``). Both must have the same Parquet schema and the same rows (as
sets; per part for multi-part; sidecars pooled for V2). The Spark engine's checkpoint is then
committed by the publisher and read from ``_last_checkpoint`` alone (a copy of the log with no JSON
commits) by deltalake and by Delta-Spark, which must see the store's active files.
"""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from support.builders import add_body, metadata_body, protocol_body, remove_body

from delta_mirror.delta.checkpoint import (
    CHECKPOINT_SCHEMA,
    SIDECAR_SCHEMA,
    V2_CHECKPOINT_SCHEMA,
    CheckpointResult,
)
from delta_mirror.delta.log_path import LOG_DIR
from delta_mirror.jobs.publisher import Publisher
from delta_mirror.spark.checkpoint_engine import SparkCheckpointEngine
from delta_mirror.spark.session import EXTRA_PACKAGES
from delta_mirror.store import SqlStore

pytestmark = pytest.mark.postgres

SCHEMA_STRING = json.dumps(
    {
        "type": "struct",
        "fields": [
            {"name": "id", "type": "long", "nullable": True, "metadata": {}},
            {"name": "part", "type": "string", "nullable": True, "metadata": {}},
        ],
    },
    separators=(",", ":"),
)
FEATURES = ["deletionVectors"]
NOW = 1_900_000_000_000  # tombstones stay inside the retention window


def _protocol(v2: bool) -> dict[str, Any]:
    features = [*FEATURES, *(["v2Checkpoint"] if v2 else [])]
    return protocol_body(3, 7, readerFeatures=features, writerFeatures=features)


def _add(i: int, *, dv: bool = False) -> dict[str, Any]:
    part = None if i % 7 == 0 else ("a" if i % 2 else "b")
    body = add_body(
        f"part={part if part is not None else '__HIVE_DEFAULT_PARTITION__'}/f-{i:05d}.parquet",
        size=1000 + i,
        partitionValues={"part": part},
        modificationTime=1_700_000_000_000 + i,
    )
    if i % 3 == 0:
        body["stats"] = json.dumps(
            {"numRecords": 10, "minValues": {"id": i}, "maxValues": {"id": i + 9}, "nullCount": {"id": 0}},
            separators=(",", ":"),
        )
    if i % 11 == 0:
        body["tags"] = {"INSERTION_TIME": str(1_700_000_000 + i), "ZCUBE": "z1"}
    if i % 13 == 0:
        body["partitionValues"] = {"extra": None, "part": part}  # both engines drop the null extra key
    if dv:
        body["deletionVector"] = {
            "storageType": "u",
            "pathOrInlineDv": f"ab^-aqEH.-t@S}}K%M4{i:04d}",
            "offset": 1,
            "sizeInBytes": 36,
            "cardinality": 2,
        }
    return body


def _remove(add: dict[str, Any], ts: int) -> dict[str, Any]:
    body = remove_body(
        add["path"],
        deletionTimestamp=ts,
        extendedFileMetadata=True,
        partitionValues=add["partitionValues"],
        size=add["size"],
    )
    if "deletionVector" in add:
        body["deletionVector"] = add["deletionVector"]
    return body


def make_table(store: SqlStore, name: str, location: Path, *, v2: bool, files: int = 600) -> None:
    store.create_table(name, location.as_uri())
    store.update_table(store.get_table(name).id, checkpoint_interval=2**31 - 1)
    metadata = metadata_body(
        id=f"00000000-0000-0000-0000-00000000000{1 if v2 else 0}",
        name=name,
        schema_string=SCHEMA_STRING,
        partition_columns=["part"],
        configuration={"delta.enableDeletionVectors": "true", "delta.checkpointInterval": "1000"},
        created_time=1_700_000_000_000,
    )
    adds = [_add(i) for i in range(files)]
    store.commit(
        name,
        [
            ("protocol", _protocol(v2)),
            ("metaData", metadata),
            ("txn", {"appId": "ingest-1", "version": 7, "lastUpdated": 1_700_000_000_000}),
            ("domainMetadata", {"domain": "delta.rowTracking", "configuration": '{"x":1}', "removed": False}),
            *[("add", a) for a in adds],
        ],
    )
    # removes (tombstones) and new files
    store.commit(
        name,
        [
            *[("remove", _remove(a, NOW)) for a in adds[:40]],
            *[("add", _add(i)) for i in range(files, files + 50)],
        ],
    )
    # deletion vectors: the same path re-added with a DV
    dv_from = 40 + files // 12
    store.commit(
        name,
        [
            *[("remove", _remove(a, NOW)) for a in adds[dv_from : dv_from + 20]],
            *[("add", {**_add(i, dv=True), "dataChange": False}) for i in range(dv_from, dv_from + 20)],
            ("txn", {"appId": "ingest-1", "version": 8, "lastUpdated": 1_700_000_100_000}),
        ],
    )


@pytest.fixture
def pg_store(pg_store_url: str) -> SqlStore:
    store = SqlStore(pg_store_url)
    store.init()
    return store


def _rows(data: bytes) -> list[str]:
    table = pq.read_table(pa.BufferReader(data))
    return [json.dumps(r, sort_keys=True, default=str) for r in table.to_pylist()]


def _schema(data: bytes) -> pa.Schema:
    return pq.read_schema(pa.BufferReader(data)).remove_metadata()


def _parquet_schema(data: bytes) -> str:
    """The Parquet-level schema (repetition, logical types, nested names) without field ids."""
    text = str(pq.ParquetFile(pa.BufferReader(data)).schema)
    return "\n".join(line.split(" field_id")[0] for line in text.splitlines()[1:])


def _build(store: SqlStore, name: str, engine: SparkCheckpointEngine | None) -> CheckpointResult:
    publisher = Publisher(store, checkpoint_builder=engine)
    table = store.get_table(name)
    return publisher._build_checkpoint(table, store.last_published_version(table.id) or 0)


def _compare(local: CheckpointResult, spark: CheckpointResult, kind: str) -> None:
    assert [f.path.rsplit(".", 3)[0] for f in local.files if "_sidecars" not in f.path] == [
        f.path.rsplit(".", 3)[0] for f in spark.files if "_sidecars" not in f.path
    ] or kind == "v2"
    lc_local, lc_spark = json.loads(local.last_checkpoint), json.loads(spark.last_checkpoint)
    for key in ("version", "numOfAddFiles", "parts"):
        assert lc_local.get(key) == lc_spark.get(key), key
    # size counts the actions: with V2, one sidecar action per sidecar file, and the splits differ
    sidecar_counts = [sum(1 for f in r.files if "/_sidecars/" in f.path) for r in (local, spark)]
    assert lc_local["size"] - sidecar_counts[0] == lc_spark["size"] - sidecar_counts[1]
    if kind == "v2":
        sidecars = [[f for f in r.files if "/_sidecars/" in f.path] for r in (local, spark)]
        for files in sidecars:
            for f in files:
                assert _schema(f.data) == SIDECAR_SCHEMA
        assert _parquet_schema(sidecars[0][0].data) == _parquet_schema(sidecars[1][0].data)
        pooled = [Counter(row for f in files for row in _rows(f.data)) for files in sidecars]
        assert pooled[0] == pooled[1]
        tops = [r.files[-1] for r in (local, spark)]
        assert _schema(tops[0].data) == _schema(tops[1].data) == V2_CHECKPOINT_SCHEMA
        strip = [  # sidecar names and sizes differ (different files): compare the other rows
            Counter(r for r in _rows(t.data) if '"sidecar": null' in r) for t in tops
        ]
        assert strip[0] == strip[1]
        assert sum(1 for r in _rows(tops[1].data) if '"sidecar": {' in r) == len(sidecars[1])
        assert lc_spark["v2Checkpoint"]["path"] == tops[1].path.rsplit("/", 1)[-1]
        return
    assert len(local.files) == len(spark.files)
    for a, b in zip(local.files, spark.files, strict=True):
        assert a.path == b.path
        assert _schema(a.data) == _schema(b.data) == CHECKPOINT_SCHEMA
        assert _parquet_schema(a.data) == _parquet_schema(b.data)
        assert Counter(_rows(a.data)) == Counter(_rows(b.data)), a.path


def _fresh_copy(location: Path, dest: Path, version: int, checkpoint_files: list[str]) -> Path:
    """The checkpoint, _last_checkpoint and the commit at the checkpoint's version (Delta-Spark
    wants that one; it is covered by the checkpoint): no earlier commit to fall back on."""
    (dest / LOG_DIR / "_sidecars").mkdir(parents=True)
    for rel in [*checkpoint_files, f"{LOG_DIR}/_last_checkpoint", f"{LOG_DIR}/{version:020d}.json"]:
        shutil.copy(location / rel, dest / rel)
    return dest


@pytest.mark.parametrize("kind", ["classic", "multipart", "v2"])
def test_spark_engine_matches_the_local_engine_and_readers_accept_it(
    spark: Any, pg_store: SqlStore, tmp_path: Path, kind: str
) -> None:
    store = pg_store
    location = tmp_path / "table"
    location.mkdir()
    make_table(store, "t", location, v2=kind == "v2")
    table = store.get_table("t")
    if kind == "multipart":
        store.update_table(table.id, checkpoint_kind="multipart", checkpoint_part_size=100)
    Publisher(store).publish("t")
    engine = SparkCheckpointEngine(spark, num_partitions=3, sidecar_size=250)

    local = _build(store, "t", None)
    built = _build(store, "t", engine)
    if kind == "multipart":
        assert json.loads(built.last_checkpoint)["parts"] == 7  # 610 adds + 60 tombstones, 100 a part
    if kind == "v2":
        # the local engine's sidecar size is its own default: same pooled rows, different split
        assert len([f for f in built.files if "_sidecars" in f.path]) == 3
    _compare(local, built, kind)

    # commit through the publisher (put-if-absent, _last_checkpoint) and read it back fresh
    version = Publisher(store, checkpoint_builder=engine).checkpoint("t")
    assert json.loads((location / LOG_DIR / "_last_checkpoint").read_text()) == json.loads(
        built.last_checkpoint
    )
    copy = _fresh_copy(location, tmp_path / "copy", version, [f.path for f in built.files])
    expected = {(f.path, f.dv_id or None) for f in store.active_files(table.id, version)}
    assert len(expected) == 610

    from deltalake import DeltaTable

    dt = DeltaTable(str(copy))
    assert dt.version() == version
    # (deltalake exposes no deletion-vector ids without reading the DV files: paths only)
    assert set(pa.table(dt.get_add_actions()).column("path").to_pylist()) == {p for p, _ in expected}

    jvm = spark._jvm
    log = jvm.org.apache.spark.sql.delta.DeltaLog.forTable(spark._jsparkSession, str(copy))
    snapshot = log.unsafeVolatileSnapshot()
    assert snapshot.version() == version
    from pyspark.sql import DataFrame

    files = (
        DataFrame(snapshot.allFiles().toDF(), spark)
        .selectExpr("path", "deletionVector.pathOrInlineDv AS dv")
        .collect()
    )
    spark_seen = {(r[0], r[1]) for r in files}
    assert {p for p, _ in spark_seen} == {p for p, _ in expected}
    assert sum(1 for _, dv in spark_seen if dv) == 20
    tombstones = snapshot.tombstones().count()
    assert tombstones == 60


def test_the_session_ships_the_jdbc_driver_to_executors_even_beside_the_logstore_jar(
    spark: Any, logstore_loaded: bool
) -> None:
    """Executors get only the jars the driver registered (fetched from it, no shared file system).

    The engine's JDBC reads run on executors, so the PostgreSQL driver (``EXTRA_PACKAGES``, resolved
    by Ivy) must be registered — also when the session sets its own ``spark.jars`` (the LogStore
    jar), which once replaced the resolved packages: every JDBC task on a standalone cluster failed
    with ``ClassNotFoundException: org.postgresql.Driver`` while local mode worked.
    """
    registered = {
        uri.rsplit("/", 1)[-1] for uri in spark.sparkContext._jsc.sc().listJars().mkString(",").split(",")
    }
    for coordinate in EXTRA_PACKAGES:
        group, artifact, version = coordinate.split(":")
        assert f"{group}_{artifact}-{version}.jar" in registered, coordinate
    if logstore_loaded:
        assert "delta-mirror-logstore.jar" in registered


def test_cli_engine_option_and_table_config(
    spark: Any, pg_store: SqlStore, pg_store_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``delta-mirror checkpoint NAME --engine spark``; without it the table config decides (auto)."""
    from click.testing import CliRunner

    from delta_mirror.cli import cli

    location = tmp_path / "table"
    location.mkdir()
    make_table(pg_store, "t", location, v2=False, files=100)
    Publisher(pg_store).publish("t")
    monkeypatch.setenv("DELTA_MIRROR_CONFIG", str(tmp_path / "absent.yaml"))
    runner = CliRunner()

    result = runner.invoke(
        cli, ["checkpoint", "t", "--version", "1", "--engine", "spark", "--store", pg_store_url]
    )
    assert result.exit_code == 0, result.output
    assert "at version 1 (spark engine)" in result.output
    assert json.loads((location / LOG_DIR / "_last_checkpoint").read_text())["version"] == 1

    config = tmp_path / "delta_mirror.yaml"
    config.write_text("tables:\n  t:\n    checkpoint: {engine: auto, spark_threshold_files: 100}\n")
    monkeypatch.setenv("DELTA_MIRROR_CONFIG", str(config))
    result = runner.invoke(cli, ["checkpoint", "t", "--store", pg_store_url])
    assert result.exit_code == 0, result.output
    assert "at version 2 (spark engine)" in result.output  # 110 active files >= 100
    config.write_text("tables:\n  t:\n    checkpoint: {engine: auto, spark_threshold_files: 1000}\n")
    result = runner.invoke(cli, ["checkpoint", "t", "--version", "2", "--store", pg_store_url])
    assert "(local engine)" in result.output
    assert json.loads((location / LOG_DIR / "_last_checkpoint").read_text())["version"] == 2

    config.write_text("tables:\n  t:\n    checkpoint: {engine: fast}\n")
    result = runner.invoke(cli, ["checkpoint", "t", "--store", pg_store_url])
    assert result.exit_code == 1
    assert "tables.t.checkpoint.engine: expected local, spark or auto, got 'fast'" in result.output


def test_mirror_writes_its_cadence_checkpoints_with_the_configured_engine(
    spark: Any, pg_store: SqlStore, pg_store_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``delta-mirror mirror`` follows ``checkpoint.engine`` too, and starts Spark only when one is due."""
    from click.testing import CliRunner

    from delta_mirror.cli import cli

    location = tmp_path / "table"
    location.mkdir()
    make_table(pg_store, "t", location, v2=False, files=100)
    pg_store.update_table(pg_store.get_table("t").id, checkpoint_interval=2)  # due at version 2, not 1
    config = tmp_path / "delta_mirror.yaml"
    config.write_text("tables:\n  t:\n    checkpoint: {engine: spark}\n")
    monkeypatch.setenv("DELTA_MIRROR_CONFIG", str(config))
    runner = CliRunner()

    result = runner.invoke(cli, ["mirror", "t", "--to-version", "1", "--store", pg_store_url])
    assert result.exit_code == 0, result.output
    assert "checkpoint" not in result.output  # none due: no engine used
    result = runner.invoke(cli, ["mirror", "t", "--store", pg_store_url])
    assert result.exit_code == 0, result.output
    assert "checkpoint at 2 (spark engine)" in result.output
    assert json.loads((location / LOG_DIR / "_last_checkpoint").read_text())["version"] == 2
    assert (location / LOG_DIR / "00000000000000000002.checkpoint.parquet").is_file()
