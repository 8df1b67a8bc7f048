"""Validation tells a reader's limitation from a mirror problem.

The fixture is a table with a deletion vector stored with a random path prefix (storage type ``u``,
``pathOrInlineDv = <prefix><z85 UUID>``, the file at ``<prefix>/deletion_vector_<uuid>.bin``), built
here byte by byte: a Parquet file of 10 rows and a deletion-vector file in Delta's format (the same
bytes Delta-Spark writes). A reader that fails on the DV while the file is in storage has a
limitation (exit 0 unless ``--strict``); a DV file that is really absent is a mirror problem.
"""

from __future__ import annotations

import json
import shutil
import struct
import uuid
import zlib
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from deltalake import DeltaTable, QueryBuilder
from support.builders import metadata_body, protocol_body

from delta_mirror.cli import cli
from delta_mirror.delta.log_path import LOG_DIR, commit_name
from delta_mirror.jobs.importer import import_table
from delta_mirror.jobs.validate import validate_table
from delta_mirror.jobs.validate.limits import dv_file_path, judge_dv_failure, unsupported_feature
from delta_mirror.jobs.validate.readers import READERS
from delta_mirror.jobs.validate.report import Limitation, Problem
from delta_mirror.store.sql_store import SqlStore

NAME = "dv_prefixed"
PREFIX = "k7"
DV_UUID = uuid.UUID("2f3c1e4a-5b6d-4e7f-8a9b-0c1d2e3f4a5b")
DELETED = (0, 9)
DATA = "part-00000-fae5310a-a37d-4e51-827b-c3d5516560ca-c000.snappy.parquet"
_Z85 = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"


def _z85(data: bytes) -> str:
    out = []
    for i in range(0, len(data), 4):
        value = int.from_bytes(data[i : i + 4], "big")
        chunk = []
        for _ in range(5):
            value, digit = divmod(value, 85)
            chunk.append(_Z85[digit])
        out.append("".join(reversed(chunk)))
    return "".join(out)


def _dv_file(rows: tuple[int, ...]) -> tuple[bytes, int]:
    """A deletion-vector file holding one DV (PROTOCOL.md "Deletion Vector Format"): version byte,
    then size, magic + a 64-bit RoaringBitmapArray (one 32-bit portable bitmap, array container), CRC."""
    values = sorted(rows)
    bitmap = (
        struct.pack("<II", 12346, 1)  # no run containers, one container
        + struct.pack("<HH", 0, len(values) - 1)
        + struct.pack("<I", 16)  # offset of the container
        + b"".join(struct.pack("<H", v) for v in values)
    )
    data = struct.pack("<I", 1681511377) + struct.pack("<q", 1) + struct.pack("<I", 0) + bitmap
    return b"\x01" + struct.pack(">I", len(data)) + data + struct.pack(">I", zlib.crc32(data)), len(data)


def _prefixed_dv_table(root: Path) -> dict[str, Any]:
    """Version 0 writes 10 rows; version 1 deletes two of them with a prefixed DV. Returns the DV."""
    root.mkdir(parents=True)
    pq.write_table(pa.table({"id": pa.array(range(10), pa.int64())}), root / DATA)
    data, size = _dv_file(DELETED)
    (root / PREFIX).mkdir()
    (root / PREFIX / f"deletion_vector_{DV_UUID}.bin").write_bytes(data)
    dv = {
        "storageType": "u",
        "pathOrInlineDv": PREFIX + _z85(DV_UUID.bytes),
        "offset": 1,
        "sizeInBytes": size,
        "cardinality": len(DELETED),
    }
    file_size = (root / DATA).stat().st_size
    stats = json.dumps({"numRecords": 10})
    add = {"path": DATA, "partitionValues": {}, "size": file_size, "modificationTime": 1, "dataChange": True}
    features = ["deletionVectors"]
    v0 = [
        {"protocol": protocol_body(3, 7, readerFeatures=features, writerFeatures=features)},
        {"metaData": metadata_body(configuration={"delta.enableDeletionVectors": "true"})},
        {"add": {**add, "stats": stats}},
    ]
    v1 = [
        {"remove": {"path": DATA, "deletionTimestamp": 2, "dataChange": True, "size": file_size}},
        {"add": {**add, "stats": stats, "deletionVector": dv}},
    ]
    (root / LOG_DIR).mkdir()
    for version, actions in enumerate((v0, v1)):
        text = "".join(json.dumps(a, separators=(",", ":")) + "\n" for a in actions)
        (root / LOG_DIR / commit_name(version)).write_text(text)
    return dv


@pytest.fixture
def prefixed(tmp_path: Path) -> tuple[SqlStore, Path]:
    """The table imported in place (its commits adopted as published) into a SQLite store."""
    root = tmp_path / "table"
    _prefixed_dv_table(root)
    store = SqlStore(f"sqlite:///{tmp_path / 'store.db'}")
    store.init()
    import_table(store, str(root), name=NAME)
    return store, root


def _dv_path(root: Path) -> Path:
    return root / PREFIX / f"deletion_vector_{DV_UUID}.bin"


def _without_prefix_error(root: Path) -> str:
    """What a reader that ignores the prefix says: it looks for the file at the table root."""
    return f"DeltaError: External error: Kernel error: File not found: {root}/deletion_vector_{DV_UUID}.bin"


def _fail_like_a_reader_ignoring_the_prefix(monkeypatch: pytest.MonkeyPatch, root: Path) -> None:
    """deltalake reads this fixture; the defect is reproduced by failing its DV read the way a reader
    that drops the prefix does (the file at the root is not there)."""

    original = DeltaTable.deletion_vectors

    def deletion_vectors(self: Any) -> Any:
        if self.version() >= 1:  # the version with the prefixed DV
            raise OSError(_without_prefix_error(root))
        return original(self)

    monkeypatch.setattr(DeltaTable, "deletion_vectors", deletion_vectors)


def _cli(store: SqlStore, *args: str) -> Any:
    return CliRunner().invoke(cli, ["--store", store.url, "validate", NAME, *args], catch_exceptions=False)


# -- the descriptor ------------------------------------------------------------------------------


def test_dv_file_path_follows_the_protocol_example() -> None:
    """PROTOCOL.md: 'ab^-aqEH.-t@S}K{vb[*k^' is prefix 'ab' + UUID d2c639aa-8816-431a-aaf6-d3fe2512ff61."""
    dv = {"storageType": "u", "pathOrInlineDv": "ab^-aqEH.-t@S}K{vb[*k^"}
    assert dv_file_path(dv) == "ab/deletion_vector_d2c639aa-8816-431a-aaf6-d3fe2512ff61.bin"
    assert dv_file_path({**dv, "pathOrInlineDv": "^-aqEH.-t@S}K{vb[*k^"}) == (
        "deletion_vector_d2c639aa-8816-431a-aaf6-d3fe2512ff61.bin"
    )
    assert (
        dv_file_path(
            {"storageType": "i", "pathOrInlineDv": "wi5b=000010000siXQKl0rr91000f55c8Xg0@@D72lkbi5=-{L"}
        )
        is None
    )
    assert dv_file_path({"storageType": "p", "pathOrInlineDv": "s3://b/t/a%20b.bin"}) == "s3://b/t/a b.bin"
    with pytest.raises(ValueError, match="names no file"):
        dv_file_path({"storageType": "u", "pathOrInlineDv": "short"})


def test_the_fixture_is_a_real_delta_table_with_two_rows_deleted(prefixed: tuple[SqlStore, Path]) -> None:
    _, root = prefixed
    dt = DeltaTable(str(root))
    result = QueryBuilder().register("t", dt).execute("select count(*) as n from t").read_all()
    assert pa.table(result).column("n")[0].as_py() == 8


# -- limitation or problem ---------------------------------------------------------------------------


def test_every_reader_that_resolves_the_prefix_validates_the_table_clean(
    prefixed: tuple[SqlStore, Path],
) -> None:
    store, _ = prefixed
    for reader in ("deltalake", "duckdb"):
        report = validate_table(store, NAME, reader=reader)
        assert (report.problems, report.limitations) == ([], []), reader


def test_a_dv_failure_with_the_file_in_storage_is_a_deltalake_limitation(
    prefixed: tuple[SqlStore, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    store, root = prefixed
    _fail_like_a_reader_ignoring_the_prefix(monkeypatch, root)

    report = validate_table(store, NAME)

    assert report.problems == []
    assert report.ok and report.passed() and not report.passed(strict=True)
    (limit,) = report.limitations
    assert (limit.reader, limit.version) == ("deltalake", 1)
    assert "random path prefix" in limit.message and "every deletion vector file" in limit.message
    assert "spark" in limit.use_instead
    assert report.to_json()["limitations"][0]["use_instead"] == limit.use_instead


def test_validate_exits_0_on_a_limitation_and_1_with_strict(
    prefixed: tuple[SqlStore, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    store, root = prefixed
    _fail_like_a_reader_ignoring_the_prefix(monkeypatch, root)

    lenient = _cli(store)
    strict = _cli(store, "--strict")

    assert lenient.exit_code == 0, lenient.output
    assert "LIMITATION [deltalake] version 1:" in lenient.output
    assert "read it with: spark" in lenient.output
    assert "PROBLEM" not in lenient.output
    assert strict.exit_code == 1, strict.output
    assert "1 reader limitation(s) (--strict)" in strict.output


def test_a_really_missing_dv_file_is_still_a_mirror_problem(prefixed: tuple[SqlStore, Path]) -> None:
    store, root = prefixed
    _dv_path(root).unlink()

    report = validate_table(store, NAME)
    result = _cli(store)

    assert report.limitations == []
    (problem,) = [p for p in report.problems if p.kind == "missing_deletion_vector"]
    assert problem.version == 1
    assert f"{PREFIX}/deletion_vector_{DV_UUID}.bin" in problem.message and DATA in problem.message
    assert "restore it" in problem.hint
    assert result.exit_code == 1
    assert "PROBLEM [missing_deletion_vector]" in result.output


def test_a_dv_file_moved_to_the_root_is_a_problem_not_a_limitation(prefixed: tuple[SqlStore, Path]) -> None:
    """The log says the file is under the prefix: a copy elsewhere does not make the table right."""
    store, root = prefixed
    shutil.move(_dv_path(root), root / f"deletion_vector_{DV_UUID}.bin")

    verdict = judge_dv_failure(
        READERS["deltalake"],
        1,
        "File not found",
        [(DATA, _prefixed_dv_descriptor())],
        lambda p: (root / p).exists(),
    )

    assert isinstance(verdict, Problem) and verdict.kind == "missing_deletion_vector"
    assert [p.kind for p in validate_table(store, NAME).problems] == ["missing_deletion_vector"]


def _prefixed_dv_descriptor() -> dict[str, Any]:
    return {"storageType": "u", "pathOrInlineDv": PREFIX + _z85(DV_UUID.bytes), "offset": 1}


def test_an_unsupported_feature_in_the_reader_error_is_a_limitation() -> None:
    """deltalake 1.6.6 on kernel-rs/type-widening and spark-shredded-variant-preview-delta."""
    error = "DeltaError: External error: Transaction failed: Unsupported table features required: [VariantShreddingPreview]"
    limit = unsupported_feature(READERS["deltalake"], 2, error)
    assert isinstance(limit, Limitation) and limit.version == 2 and "VariantShreddingPreview" in limit.message
    assert unsupported_feature(READERS["deltalake"], 2, "Kernel error: File not found: x.json") is None


def test_duckdb_is_checked_against_the_store_too(prefixed: tuple[SqlStore, Path]) -> None:
    """The DuckDB reader is not a rubber stamp: a DV dropped from the published log is caught."""
    store, root = prefixed
    log = root / LOG_DIR / commit_name(1)
    log.write_text(log.read_text().replace(',"deletionVector":', ',"_dv":'))

    kinds = {p.kind for p in validate_table(store, NAME, reader="duckdb").problems}

    assert {"hash_mismatch", "reader_files", "reader_rows"} <= kinds


def test_auto_without_spark_keeps_the_limitation(
    prefixed: tuple[SqlStore, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    store, root = prefixed
    _fail_like_a_reader_ignoring_the_prefix(monkeypatch, root)
    monkeypatch.setattr("importlib.util.find_spec", lambda name, *a: None)

    report = validate_table(store, NAME, reader="auto")

    assert [lim.version for lim in report.limitations] == [1] and report.fallbacks == []


@pytest.mark.spark
def test_auto_reads_with_spark_the_versions_deltalake_cannot(
    prefixed: tuple[SqlStore, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("pyspark")
    from support.spark import shared_spark

    store, root = prefixed
    _fail_like_a_reader_ignoring_the_prefix(monkeypatch, root)

    report = validate_table(store, NAME, reader="auto", spark=shared_spark())

    assert (report.problems, report.limitations) == ([], [])
    assert report.fallbacks == ["version 1 read with spark (deltalake cannot read it)"]
