"""Conformance with Delta-Spark, the reference writer (canonical encoding, import).

delta-spark writes one reference table per scenario:

- ``dml``: create, append, overwrite, partitioned append, delete, update, merge, SET TBLPROPERTIES;
- ``schema_evolution``: a ``mergeSchema`` append, ALTER TABLE ADD COLUMNS (a struct too), an
  ``overwriteSchema`` overwrite;
- ``deletion_vectors``: ``delta.enableDeletionVectors`` then DELETE / UPDATE (DVs written, replaced);
- ``column_mapping``: ``delta.columnMapping.mode=name`` then RENAME COLUMN (a partition column
  too), DROP COLUMN, ADD COLUMNS re-using a dropped name;
- ``v2_checkpoints``: ``delta.checkpointPolicy=v2`` (Spark writes UUID-named V2 checkpoints with
  sidecars).

Every table checkpoints every 2 or 3 versions. Each is imported into a store at a fresh location
(data files and deletion vectors copied, the log not), and republished version by version as the
publish DAG would, so the checkpoints of the copy are ours (classic, or V2 with sidecars). Then:

- every commit file is byte-identical to the one Spark wrote;
- Spark and deltalake (``QueryBuilder``: ``to_pyarrow_table`` refuses DV / column-mapping / V2
  tables) read the copy exactly as the original at every version;
- Spark starts from our checkpoints (its ``DeltaLog`` snapshot names our checkpoint file), also
  when nothing but our checkpoint is left to read from;
- ``validate`` is clean with both readers.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, QueryBuilder

from delta_mirror.delta.log_path import LAST_CHECKPOINT, LOG_DIR, SIDECAR_DIR, commit_name
from delta_mirror.jobs.importer import import_table
from delta_mirror.jobs.publisher import Publisher
from delta_mirror.jobs.validate import validate_table
from delta_mirror.store.sql_store import SqlStore


def _dml(spark: Any, path: Path) -> None:
    t = f"delta.`{path}`"
    spark.sql(
        f"CREATE TABLE {t} (id BIGINT, country STRING, amount DOUBLE) USING delta PARTITIONED BY (country) "
        "TBLPROPERTIES ('delta.checkpointInterval' = '2')"
    )
    rows = [(1, "fr", 1.5), (2, "de", 2.5), (3, "fr", None)]
    df = spark.createDataFrame(rows, "id BIGINT, country STRING, amount DOUBLE")
    df.write.format("delta").mode("append").save(str(path))
    more = spark.createDataFrame([(4, "fr", 4.0), (5, "a b", 5.0), (6, None, 6.0)], df.schema)
    more.write.format("delta").mode("overwrite").save(str(path))
    extra = spark.createDataFrame([(7, "de", 7.0), (8, "ü%", 8.0)], df.schema)
    extra.write.format("delta").mode("append").partitionBy("country").save(str(path))
    spark.sql(f"DELETE FROM {t} WHERE id = 4")
    spark.sql(f"UPDATE {t} SET amount = amount * 10 WHERE country = 'de'")
    spark.createDataFrame([(5, "a b", 50.0), (9, "it", 9.0)], df.schema).createOrReplaceTempView("src")
    spark.sql(
        f"MERGE INTO {t} AS d USING src AS s ON d.id = s.id "
        "WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *"
    )
    spark.sql(f"ALTER TABLE {t} SET TBLPROPERTIES ('delta.logRetentionDuration' = 'interval 60 days')")


def _schema_evolution(spark: Any, path: Path) -> None:
    t = f"delta.`{path}`"
    spark.sql(
        f"CREATE TABLE {t} (id BIGINT, name STRING) USING delta TBLPROPERTIES ('delta.checkpointInterval' = '3')"
    )
    spark.createDataFrame([(1, "a"), (2, "b")], "id BIGINT, name STRING").write.format("delta").mode(
        "append"
    ).save(str(path))
    spark.createDataFrame([(3, "c", 3.5)], "id BIGINT, name STRING, score DOUBLE").write.format("delta").mode(
        "append"
    ).option("mergeSchema", "true").save(str(path))
    spark.sql(f"ALTER TABLE {t} ADD COLUMNS (tag STRING, meta STRUCT<k: STRING, n: INT>)")
    spark.sql(f"INSERT INTO {t} VALUES (4, 'd', 4.5, 'x', named_struct('k', 'kk', 'n', 1))")
    spark.sql(f"UPDATE {t} SET tag = 'old' WHERE id < 3")
    spark.createDataFrame([(5, 5)], "id BIGINT, extra INT").write.format("delta").mode("overwrite").option(
        "overwriteSchema", "true"
    ).save(str(path))


def _deletion_vectors(spark: Any, path: Path) -> None:
    t = f"delta.`{path}`"
    spark.sql(
        f"CREATE TABLE {t} (id BIGINT, v STRING) USING delta "
        "TBLPROPERTIES ('delta.enableDeletionVectors' = 'true', 'delta.checkpointInterval' = '3')"
    )
    for lo, hi, files in ((0, 20, 1), (20, 40, 2)):
        rows = spark.range(lo, hi, 1, files).selectExpr("id", "cast(id as string) as v")
        rows.write.format("delta").mode("append").save(str(path))
    spark.sql(f"DELETE FROM {t} WHERE id % 5 = 0")  # a DV on every file
    spark.sql(f"UPDATE {t} SET v = 'u' WHERE id % 7 = 1")  # DVs replaced, a new file
    spark.sql(f"DELETE FROM {t} WHERE id = 3 OR id = 33")
    spark.sql(f"DELETE FROM {t} WHERE id >= 20 AND id < 30")


def _column_mapping(spark: Any, path: Path) -> None:
    t = f"delta.`{path}`"
    spark.sql(
        f"CREATE TABLE {t} (id BIGINT, `first name` STRING, part STRING, x INT) USING delta PARTITIONED BY "
        "(part) TBLPROPERTIES ('delta.columnMapping.mode' = 'name', 'delta.checkpointInterval' = '3')"
    )
    spark.sql(f"INSERT INTO {t} VALUES (1, 'a', 'p1', 10), (2, 'b', 'p2', 20)")
    spark.sql(f"ALTER TABLE {t} RENAME COLUMN `first name` TO fname")
    spark.sql(f"INSERT INTO {t} VALUES (3, 'c', 'p1', 30)")
    spark.sql(f"ALTER TABLE {t} DROP COLUMN x")
    spark.sql(f"ALTER TABLE {t} RENAME COLUMN part TO region")
    spark.sql(f"INSERT INTO {t} VALUES (4, 'd', 'p3')")
    spark.sql(f"ALTER TABLE {t} ADD COLUMNS (x STRING)")  # not the dropped x: a new physical name
    spark.sql(f"INSERT INTO {t} VALUES (5, 'e', 'p1', 'new x')")


def _v2_checkpoints(spark: Any, path: Path) -> None:
    t = f"delta.`{path}`"
    spark.sql(
        f"CREATE TABLE {t} (id BIGINT, c STRING) USING delta PARTITIONED BY (c) "
        "TBLPROPERTIES ('delta.checkpointPolicy' = 'v2', 'delta.checkpointInterval' = '2')"
    )
    for i in range(3):
        row = spark.createDataFrame([(i, f"c{i % 2}")], "id BIGINT, c STRING")
        row.write.format("delta").mode("append").save(str(path))
    spark.sql(f"DELETE FROM {t} WHERE id = 1")
    spark.sql(f"INSERT INTO {t} VALUES (7, 'c0'), (8, 'c1')")


@dataclass(frozen=True)
class Scenario:
    write: Callable[[Any, Path], None]
    operations: list[str]
    checkpoints: list[int]  # versions Spark checkpointed (and so do we: same cadence)


SCENARIOS = {
    "dml": Scenario(
        _dml,
        ["CREATE TABLE", "WRITE", "WRITE", "WRITE", "DELETE", "UPDATE", "MERGE", "SET TBLPROPERTIES"],
        [2, 4, 6],
    ),
    "schema_evolution": Scenario(
        _schema_evolution,
        ["CREATE TABLE", "WRITE", "WRITE", "ADD COLUMNS", "WRITE", "UPDATE", "WRITE"],
        [3, 6],
    ),
    "deletion_vectors": Scenario(
        _deletion_vectors, ["CREATE TABLE", "WRITE", "WRITE", "DELETE", "UPDATE", "DELETE", "DELETE"], [3, 6]
    ),
    "column_mapping": Scenario(
        _column_mapping,
        [
            "CREATE TABLE",
            "WRITE",
            "RENAME COLUMN",
            "WRITE",
            "DROP COLUMNS",
            "RENAME COLUMN",
            "WRITE",
            "ADD COLUMNS",
            "WRITE",
        ],
        [3, 6],
    ),
    "v2_checkpoints": Scenario(
        _v2_checkpoints, ["CREATE TABLE", "WRITE", "WRITE", "WRITE", "DELETE", "WRITE"], [2, 4]
    ),
}


@dataclass(frozen=True)
class Mirrored:
    name: str
    store: SqlStore
    source: Path  # Delta-Spark's table
    target: Path  # the republished copy
    last: int


def _copy_data(src: Path, dst: Path) -> None:
    for item in src.rglob("*"):
        rel = item.relative_to(src)
        if rel.parts[0] == LOG_DIR or item.is_dir():
            continue
        (dst / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(item, dst / rel)


def _rows(records: list[dict[str, Any]]) -> list[str]:
    return sorted(json.dumps(r, sort_keys=True, default=str) for r in records)


def _spark_rows(spark: Any, path: Path, version: int) -> list[str]:
    df = spark.read.format("delta").option("versionAsOf", version).load(str(path))
    return _rows([r.asDict(recursive=True) for r in df.collect()])


def _deltalake_rows(path: Path, version: int) -> list[str]:
    dt = DeltaTable(str(path), version=version)
    return _rows(pa.table(QueryBuilder().register("t", dt).execute("select * from t").read_all()).to_pylist())


def _checkpoint_files(spark: Any, path: Path, version: int) -> list[str]:
    """The top-level checkpoint files Delta-Spark's snapshot at ``version`` starts from (its DeltaLog)."""
    jvm = spark._jvm
    log = jvm.org.apache.spark.sql.delta.DeltaLog.forTable(spark._jsparkSession, str(path))
    defaults = [getattr(log, f"getSnapshotAt$default${i}")() for i in (2, 3, 4)]  # Scala default args
    provider = log.getSnapshotAt(version, *defaults).logSegment().checkpointProvider()
    files = jvm.scala.jdk.javaapi.CollectionConverters.asJava(provider.topLevelFiles())
    return [f.getPath().getName() for f in files]


@pytest.fixture(scope="module", params=list(SCENARIOS))
def mirrored(
    request: pytest.FixtureRequest, spark: Any, tmp_path_factory: pytest.TempPathFactory
) -> Mirrored:
    name = request.param
    base = tmp_path_factory.mktemp(name)
    source, target = base / "spark", base / "mirror"
    SCENARIOS[name].write(spark, source)
    last = len(SCENARIOS[name].operations) - 1
    store = SqlStore(f"sqlite:///{base / 'store.db'}")
    store.init()
    _copy_data(source, target)
    result = import_table(store, str(source), name=name, location=target.as_uri())
    assert (result.start_version, result.end_version) == (0, last)
    publisher = Publisher(store)
    for version in range(last + 1):  # as the publish DAG would: checkpoints fall due on the way
        publisher.publish(name, to_version=version)
    return Mirrored(name, store, source, target, last)


def test_spark_wrote_the_expected_history(spark: Any, mirrored: Mirrored) -> None:
    scenario = SCENARIOS[mirrored.name]
    history = spark.sql(f"DESCRIBE HISTORY delta.`{mirrored.source}`").orderBy("version").collect()
    assert [r["operation"] for r in history] == scenario.operations
    log = mirrored.source / LOG_DIR
    spark_checkpoints = sorted({int(p.name.split(".")[0]) for p in log.glob("0*.checkpoint*")})
    assert spark_checkpoints == scenario.checkpoints
    text = "".join(p.read_text() for p in sorted(log.glob("*.json")))
    features = {
        "deletion_vectors": '"deletionVector":{"storageType":"u"',
        "column_mapping": "delta.columnMapping.physicalName",
        "v2_checkpoints": '"readerFeatures":["v2Checkpoint"]',
    }
    if mirrored.name in features:
        assert features[mirrored.name] in text
    if mirrored.name == "v2_checkpoints":  # UUID-named top-level files, add/remove in sidecars
        assert all(".checkpoint." in p.name and p.name.endswith(".json") for p in log.glob("0*.checkpoint*"))
        assert len(list((log / SIDECAR_DIR).glob("*.parquet"))) == len(scenario.checkpoints)


def test_republished_commits_are_byte_identical(mirrored: Mirrored) -> None:
    different = []
    for version in range(mirrored.last + 1):
        original = (mirrored.source / LOG_DIR / commit_name(version)).read_bytes()
        if (mirrored.target / LOG_DIR / commit_name(version)).read_bytes() != original:
            different.append(version)
    assert not different, f"versions {different} differ from Delta-Spark's commit files"


def test_readers_see_the_republished_table_as_the_original(spark: Any, mirrored: Mirrored) -> None:
    source, target = mirrored.source, mirrored.target
    for version in range(mirrored.last + 1):
        assert _spark_rows(spark, target, version) == _spark_rows(spark, source, version), f"spark v{version}"
        assert _deltalake_rows(target, version) == _deltalake_rows(source, version), f"deltalake v{version}"


def test_spark_starts_from_our_checkpoints(spark: Any, mirrored: Mirrored) -> None:
    """At and after each checkpoint version, Spark's snapshot is built from the checkpoint we wrote
    (the copy's whole log is ours: import copies no log file)."""
    scenario = SCENARIOS[mirrored.name]
    ours = sorted(p.name for p in (mirrored.target / LOG_DIR).glob("0*.checkpoint*"))
    assert sorted({int(name.split(".")[0]) for name in ours}) == scenario.checkpoints
    for version in scenario.checkpoints:
        mine = [name for name in ours if name.startswith(f"{version:020}.")]
        for at in range(version, min(version + 2, mirrored.last + 1)):
            assert _checkpoint_files(spark, mirrored.target, at) == mine, f"version {at}"
    spark_names = {p.name for p in (mirrored.source / LOG_DIR).glob("0*.checkpoint*")}
    if mirrored.name == "v2_checkpoints":  # ours: UUID-named Parquet (Spark's: UUID-named JSON)
        assert all(n.endswith(".parquet") and len(n) > 50 and n not in spark_names for n in ours)
        assert len(list((mirrored.target / LOG_DIR / SIDECAR_DIR).glob("*.parquet"))) == len(ours)
    else:  # classic checkpoints have the same name as Spark's
        assert set(ours) <= spark_names
    last_checkpoint = json.loads((mirrored.target / LOG_DIR / LAST_CHECKPOINT).read_text())
    assert last_checkpoint["version"] == scenario.checkpoints[-1]
    if mirrored.name == "v2_checkpoints":
        assert last_checkpoint["v2Checkpoint"]["path"] in ours


def test_spark_reads_the_latest_version_from_our_checkpoint_alone(
    spark: Any, mirrored: Mirrored, tmp_path: Path
) -> None:
    """A copy whose log was cleaned up to our newest checkpoint (kept: it, its sidecars, its commit,
    the later ones and ``_last_checkpoint``): Spark has nothing else to build the snapshot from."""
    checkpoint = SCENARIOS[mirrored.name].checkpoints[-1]
    copy = tmp_path / "copy"
    shutil.copytree(mirrored.target, copy)
    for item in sorted((copy / LOG_DIR).glob("0*")):
        if int(item.name.split(".")[0]) < checkpoint:
            item.unlink()
    found = _checkpoint_files(spark, copy, mirrored.last)
    assert found == _checkpoint_files(spark, mirrored.target, mirrored.last)
    assert _spark_rows(spark, copy, mirrored.last) == _spark_rows(spark, mirrored.source, mirrored.last)
    assert _deltalake_rows(copy, mirrored.last) == _deltalake_rows(mirrored.source, mirrored.last)


@pytest.mark.parametrize("reader", ["deltalake", "spark"])
def test_validate_is_clean(spark: Any, mirrored: Mirrored, reader: str) -> None:
    report = validate_table(mirrored.store, mirrored.name, reader=reader, spark=spark)
    assert report.ok, [f"{p.kind} v{p.version}: {p.message}" for p in report.problems]
    assert report.versions_checked == mirrored.last + 1
