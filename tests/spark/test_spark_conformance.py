"""Conformance with Delta-Spark, the reference writer (design.md §4, §6).

delta-spark writes a reference table through create, append, overwrite, partitioned append,
delete, update, merge, ALTER TABLE SET TBLPROPERTIES (with checkpoints every 2 versions). It is
imported into a store at a fresh location (data files copied), republished, and then:

- every commit file is byte-identical to the one Spark wrote;
- Spark and deltalake read the republished table exactly as the original at every version;
- ``validate`` is clean with both readers.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, QueryBuilder

from delta_mirror.importer import import_table
from delta_mirror.log_path import LOG_DIR, commit_name
from delta_mirror.publisher import Publisher
from delta_mirror.store.sql_store import SqlStore
from delta_mirror.validate import validate_table

OPERATIONS = [
    "CREATE TABLE",
    "WRITE",  # append
    "WRITE",  # overwrite
    "WRITE",  # partitioned append
    "DELETE",
    "UPDATE",
    "MERGE",
    "SET TBLPROPERTIES",
]


def _write_reference(spark: Any, path: Path) -> int:
    """The reference table; returns its last version."""
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
    return len(OPERATIONS) - 1


def _copy_data(src: Path, dst: Path) -> None:
    for item in src.rglob("*"):
        rel = item.relative_to(src)
        if rel.parts[0] == LOG_DIR or item.is_dir():
            continue
        (dst / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(item, dst / rel)


def _spark_rows(spark: Any, path: Path, version: int) -> list[tuple[Any, ...]]:
    df = spark.read.format("delta").option("versionAsOf", version).load(str(path))
    return sorted((tuple(r) for r in df.collect()), key=repr)


def _deltalake_rows(path: Path, version: int) -> list[tuple[Any, ...]]:
    dt = DeltaTable(str(path), version=version)
    result = pa.table(
        QueryBuilder().register("t", dt).execute("select id, country, amount from t").read_all()
    )
    return sorted(
        zip(*(result.column(c).to_pylist() for c in ("id", "country", "amount")), strict=True), key=repr
    )


@pytest.fixture(scope="module")
def mirrored(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[SqlStore, Path, Path, int]:
    base = tmp_path_factory.mktemp("conformance")
    source, target = base / "spark", base / "mirror"
    last = _write_reference(spark, source)
    store = SqlStore(f"sqlite:///{base / 'store.db'}")
    store.init()
    _copy_data(source, target)
    result = import_table(store, str(source), name="ref", location=target.as_uri())
    assert (result.start_version, result.end_version) == (0, last)
    Publisher(store).publish("ref")
    return store, source, target, last


def test_spark_wrote_the_expected_history(spark: Any, mirrored: Any) -> None:
    _, source, _, _ = mirrored
    history = spark.sql(f"DESCRIBE HISTORY delta.`{source}`").orderBy("version").collect()
    assert [r["operation"] for r in history] == OPERATIONS
    assert (source / LOG_DIR / "00000000000000000002.checkpoint.parquet").exists()


def test_republished_commits_are_byte_identical(mirrored: Any) -> None:
    _, source, target, last = mirrored
    different = []
    for version in range(last + 1):
        original = (source / LOG_DIR / commit_name(version)).read_bytes()
        mirrored_bytes = (target / LOG_DIR / commit_name(version)).read_bytes()
        if mirrored_bytes != original:
            different.append(version)
    assert not different, f"versions {different} differ from Delta-Spark's commit files"


def test_readers_see_the_republished_table_as_the_original(spark: Any, mirrored: Any) -> None:
    _, source, target, last = mirrored
    for version in range(last + 1):
        assert _spark_rows(spark, target, version) == _spark_rows(spark, source, version), f"spark v{version}"
        assert _deltalake_rows(target, version) == _deltalake_rows(source, version), f"deltalake v{version}"


@pytest.mark.parametrize("reader", ["deltalake", "spark"])
def test_validate_is_clean(spark: Any, mirrored: Any, reader: str) -> None:
    store, _, _, _ = mirrored
    report = validate_table(store, "ref", reader=reader, spark=spark)
    assert report.ok, [f"{p.kind} v{p.version}: {p.message}" for p in report.problems]
