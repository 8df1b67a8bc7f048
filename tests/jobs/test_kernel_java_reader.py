"""delta-kernel-java as a reader: the jar's view of tables equals deltalake's.

Tables are written with deltalake in tmp_path (plain, partitioned with escaped partition values,
several versions, a checkpoint read without the commits before it); the corpus adds deletion
vectors, a v2 checkpoint, a checkpoint whose schema differs from the JSON commits, and tables with
features the kernel does not implement (they must come back as ReaderLimitation, not ReaderFailure).
deltalake 1.6.6 cannot write deletion vectors (its delete rewrites the files even with
``delta.enableDeletionVectors``), hence the corpus tables for them.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
import pytest
from deltalake import DeltaTable, QueryBuilder, write_deltalake

from delta_mirror.jobs.validate import kernel_java
from delta_mirror.jobs.validate.kernel_java import (
    KernelJavaView,
    ReaderFailure,
    ReaderLimitation,
    ReaderUnavailable,
    read_versions_with_kernel_java,
    read_with_kernel_java,
)

NO_JAR = (
    "the delta-kernel-java reader jar is not built: `make kernel-jar` needs Maven and a JDK 17 "
    "(apt-get install maven openjdk-17-jdk-headless)"
)


@pytest.fixture
def kernel() -> None:
    """Skip (with the reason; fail under CI) where the jar or java is missing; all else must work."""
    from support.services import skip_or_fail

    if kernel_java.kernel_jar() is None:
        skip_or_fail(NO_JAR)
    if kernel_java.java_binary() is None:
        skip_or_fail("no java on PATH or in JAVA_HOME: the kernel-java reader needs Java 17")


# -- deltalake's own view ------------------------------------------------------------------------
def _rows(dt: DeltaTable) -> int:
    reader = QueryBuilder().register("t", dt).execute("SELECT count(*) AS n FROM t")
    return int(pa.table(reader.read_all()).column(0).to_pylist()[0])


def _deltalake_view(path: Path, version: int | None = None) -> dict[str, Any]:
    dt = DeltaTable(str(path), version=version)
    adds = pa.table(dt.get_add_actions(flatten=True))
    protocol = dt.protocol()
    records = adds.column("num_records").to_pylist()
    return {
        "version": dt.version(),
        "schema": json.loads(dt.schema().to_json()),
        "files": sorted(unquote(p) for p in adds.column("path").to_pylist()),
        "num_records": None if None in records else sum(records),  # as the kernel view: all or nothing
        "partition_columns": tuple(dt.metadata().partition_columns),
        "protocol": (
            protocol.min_reader_version,
            protocol.min_writer_version,
            None if protocol.reader_features is None else tuple(sorted(protocol.reader_features)),
            None if protocol.writer_features is None else tuple(sorted(protocol.writer_features)),
        ),
        "rows": _rows(dt),
        "id": dt.metadata().id,
    }


def _kernel_view(view: KernelJavaView) -> dict[str, Any]:
    p = view.protocol
    return {
        "version": view.version,
        "schema": json.loads(view.schema),
        "files": list(view.files),
        "num_records": view.num_records,
        "partition_columns": view.partition_columns,
        "protocol": (p.min_reader_version, p.min_writer_version, p.reader_features, p.writer_features),
        "rows": view.row_count,
        "id": view.table_id,
    }


# -- generated tables ----------------------------------------------------------------------------
def test_plain_table_as_deltalake_sees_it(kernel: None, tmp_path: Path) -> None:
    table = tmp_path / "plain table"  # a space in the root too
    data = pa.table({"id": pa.array([1, 2, 3], pa.int64()), "name": ["a", None, "c"], "x": [0.5, 1.5, None]})
    write_deltalake(str(table), data)

    view = read_with_kernel_java(str(table))

    assert _kernel_view(view) == _deltalake_view(table)
    assert view.row_count == view.num_records == 3
    assert view.deleted_records == 0 and view.logical_records == 3
    assert json.loads(view.schema_string) == json.loads(view.schema)
    assert all((table / f).is_file() for f in view.files)
    # a file: URI is the same table
    assert read_with_kernel_java(table.as_uri(), count_rows=False).files == view.files


def test_partitioned_versions_and_checkpoint(kernel: None, tmp_path: Path) -> None:
    """Escaped partition values, appends, a delete, an overwrite; every version time-travelled;
    then the commits before the checkpoint are removed and the checkpoint alone must do."""
    table = tmp_path / "part"
    first = pa.table({"id": pa.array([1, 2, 3, 4], pa.int64()), "p": ["a b", "x=1", "a b", "ü/%"]})
    write_deltalake(str(table), first, partition_by=["p"])  # v0
    write_deltalake(str(table), first, mode="append", partition_by=["p"])  # v1
    DeltaTable(str(table)).delete("id = 2")  # v2
    DeltaTable(str(table)).create_checkpoint()  # at v2
    second = pa.table({"id": pa.array([9], pa.int64()), "p": ["new"]})
    write_deltalake(str(table), second, mode="append", partition_by=["p"])  # v3
    write_deltalake(str(table), second, mode="overwrite", partition_by=["p"])  # v4
    log = table / "_delta_log"
    assert (log / f"{2:020d}.checkpoint.parquet").is_file()

    read = read_versions_with_kernel_java(str(table), range(5))

    assert sorted(read) == list(range(5))
    views: dict[int, KernelJavaView] = {}
    for version, view in read.items():
        assert isinstance(view, KernelJavaView), view
        views[version] = view
        assert _kernel_view(view) == _deltalake_view(table, version), f"version {version}"
    assert [views[v].row_count for v in range(5)] == [4, 8, 6, 7, 1]
    assert any("%" in f for f in views[0].files)  # decoded names, as on disk

    # --version through the single-read API too (the jar's own flag)
    assert read_with_kernel_java(str(table), 1, count_rows=False).files == views[1].files

    for version in (0, 1):
        (log / f"{version:020d}.json").unlink()
    latest = read_with_kernel_java(str(table), 3)
    assert _kernel_view(latest) == _deltalake_view(table, 3)
    with pytest.raises(ReaderFailure, match="version 1"):
        read_with_kernel_java(str(table), 1)


def test_unknown_reader_feature_is_a_limitation(kernel: None, tmp_path: Path) -> None:
    """A protocol naming a reader feature the kernel lacks: the kernel's own refusal, kind unsupported."""
    table = tmp_path / "future"
    write_deltalake(str(table), pa.table({"id": pa.array([1], pa.int64())}))
    commit = table / "_delta_log" / f"{1:020d}.json"
    protocol = {
        "minReaderVersion": 3,
        "minWriterVersion": 7,
        "readerFeatures": ["someFutureFeature"],
        "writerFeatures": ["someFutureFeature"],
    }
    commit.write_text(json.dumps({"protocol": protocol}) + "\n")

    with pytest.raises(ReaderLimitation) as info:
        read_with_kernel_java(str(table))
    assert "someFutureFeature" in str(info.value)
    assert info.value.phase == "snapshot"
    assert "\n" not in str(info.value)
    # in one JVM: the version before the upgrade reads, the upgraded one is the limitation
    both = read_versions_with_kernel_java(str(table), [0, 1], count_rows=False)
    assert isinstance(both[0], KernelJavaView) and both[0].num_records == 1
    assert isinstance(both[1], ReaderLimitation) and both[1].at_version == 1


def test_not_a_delta_table_is_a_failure(kernel: None, tmp_path: Path) -> None:
    folder = tmp_path / "plain-folder"
    folder.mkdir()
    (folder / "data.parquet").write_bytes(b"PAR1")

    with pytest.raises(ReaderFailure) as info:
        read_with_kernel_java(str(folder))
    message = str(info.value)
    assert "\n" not in message and "Traceback" not in message
    assert str(folder) in message and "not found" in message
    assert not isinstance(info.value, ReaderLimitation)


def test_timeout_is_a_failure(kernel: None, tmp_path: Path) -> None:
    with pytest.raises(ReaderFailure, match="did not finish"):
        read_with_kernel_java(str(tmp_path), timeout=0.01)


# -- without the reader --------------------------------------------------------------------------
def test_missing_jar_is_unavailable(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(kernel_java.JAR_ENV, str(tmp_path / "nowhere.jar"))
    assert kernel_java.kernel_jar() is None
    if kernel_java.java_binary() is None:
        pytest.skip("no java here: the missing-java message is tested instead")
    with pytest.raises(ReaderUnavailable, match="make kernel-jar"):
        read_with_kernel_java(str(tmp_path))


def test_missing_java_is_unavailable(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))  # no java on it
    with pytest.raises(ReaderUnavailable, match="Java 17") as info:
        read_with_kernel_java(str(tmp_path))
    assert "openjdk-17" in str(info.value)


def test_remote_location_is_unavailable() -> None:
    with pytest.raises(ReaderUnavailable, match="local tables only"):
        read_with_kernel_java("s3://bucket/table")


# -- the corpus ----------------------------------------------------------------------------------
def _corpus() -> Path:
    from support.services import corpus_path

    root = corpus_path()
    if not (root / "INDEX.tsv").is_file():
        pytest.skip(f"the Delta corpus is absent ({root}; set DELTA_MIRROR_CORPUS)")
    return root


# table -> rows the kernel must return (deltalake's count too)
CORPUS_READS = {
    "delta-rs/table-with-dv-small": 8,  # a deletion vector file (storage type u)
    "kernel-rs/with-short-dv": 7,  # an inline-sized DV, two files
    "delta-rs/checkpoint-v2-table": 44,  # v2 checkpoint (JSON) with sidecars
    "kernel-rs/parquet_row_group_skipping": 5,  # multi-part checkpoint whose schema has `missing`
    "delta-rs/cdc_ict_table": 2,  # stale Hadoop .crc sidecars, which the reader must not verify
}


@pytest.mark.corpus
@pytest.mark.parametrize("name", sorted(CORPUS_READS))
def test_corpus_tables(kernel: None, tmp_path: Path, name: str) -> None:
    source = _corpus() / name
    table = tmp_path / "t"
    shutil.copytree(source, table)  # the corpus is read-only; the kernel only reads, but be safe

    view = read_with_kernel_java(str(table))

    expected = _deltalake_view(table)
    assert view.row_count == CORPUS_READS[name] == expected["rows"]
    assert view.version == expected["version"]
    assert list(view.files) == expected["files"]
    assert json.loads(view.schema) == expected["schema"]
    assert all((table / f).is_file() for f in view.files)
    if "dv" in name:
        assert view.files_with_deletion_vectors >= 1
        assert view.logical_records == view.row_count
    if name == "kernel-rs/parquet_row_group_skipping":
        # the checkpoint's metaData is the table readers see (issue 11, item 2)
        assert "missing" in [f["name"] for f in json.loads(view.schema)["fields"]]


# tables whose features delta-kernel-java 4.4.0 lacks: a limitation, never a failure
CORPUS_LIMITS = {
    "delta-rs/simple_table_features": "reader version 5",  # protocol 5/7 with a bogus reader feature
    "delta-rs/spark-shredded-variant-preview-delta": "variant",  # variant columns when reading data
    "kernel-rs/void-column": "VOID",  # a KernelException, classified by its "unsupported" text
}


@pytest.mark.corpus
@pytest.mark.parametrize("name", sorted(CORPUS_LIMITS))
def test_corpus_unsupported_features(kernel: None, name: str) -> None:
    with pytest.raises(ReaderLimitation) as info:
        read_with_kernel_java(str(_corpus() / name))
    assert CORPUS_LIMITS[name] in str(info.value)
    assert "\n" not in str(info.value)
