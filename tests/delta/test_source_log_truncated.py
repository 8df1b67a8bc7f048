"""Logs whose early commits were cleaned up: reading starts at a complete checkpoint."""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from support.source_log_kit import (
    CORPUS,
    HAVE_CORPUS,
    NO_CORPUS,
    _active_files,
    _deltalake_paths,
    _no_corpus,
    _read,
)

from delta_mirror.delta.source_log import checkpoint_actions
from delta_mirror.errors import DataError
from delta_mirror.storage import open_store


@pytest.mark.corpus
@pytest.mark.skipif(not HAVE_CORPUS, reason=NO_CORPUS)
def test_checkpoints_vacuumed_starts_at_checkpoint() -> None:
    log = _read(CORPUS / "delta-rs/checkpoints_vacuumed")
    assert log.start_version == 5 and log.end_version == 12
    assert log.base_checkpoint is not None
    assert log.base_checkpoint.kind == "classic"
    assert log.base_checkpoint.files == ["_delta_log/00000000000000000005.checkpoint.parquet"]
    assert [v for v, _l, _d in log.commits] == list(range(5, 13))
    assert log.checkpoint_versions == [5, 10]
    assert log.checkpoint_kind == "classic"


@pytest.mark.corpus
@pytest.mark.skipif(not HAVE_CORPUS, reason=NO_CORPUS)
def test_checkpoint_only_table() -> None:
    log = _read(CORPUS / "delta-rs/table-with-domain-metadata")
    assert (log.start_version, log.end_version, log.commits) == (108, 108, [])
    assert log.base_checkpoint is not None
    kinds = Counter(next(iter(json.loads(a))) for a in log.base_checkpoint.actions)
    assert kinds["domainMetadata"] >= 1 and kinds["protocol"] == 1 and kinds["metaData"] == 1


# (table, versions whose JSON commit is deleted in the copy, expected start, expected kind)
TRUNCATIONS = [
    ("delta-rs/checkpoint-v2-table", 6, 6, "v2"),
    ("kernel-rs/v2-checkpoints-json-with-sidecars", 5, 4, "v2"),
    ("kernel-rs/v2-checkpoints-parquet-with-sidecars", 5, 4, "v2"),
    ("kernel-rs/v2-checkpoints-json-without-sidecars", 2, 2, "v2"),
    ("kernel-rs/v2-checkpoints-parquet-without-sidecars", 2, 2, "v2"),
    ("kernel-rs/v2-classic-checkpoint-json", 1, 1, "v2"),
    ("kernel-rs/v2-classic-checkpoint-parquet", 1, 1, "v2"),
    ("kernel-rs/v2-json-sidecars-struct-stats-only", 5, 5, "v2"),
    ("kernel-rs/v2-parquet-sidecars-struct-stats-only", 5, 5, "v2"),
    ("kernel-rs/v1-multi-part-struct-stats-only", 5, 5, "multipart"),
    ("kernel-rs/parquet_row_group_skipping", 1, 1, "multipart"),
    ("delta-rs/table_with_deletion_logs", 11, 10, "classic"),
    ("delta-rs/simple_table_with_checkpoint", 10, 10, "classic"),
]


def _truncated_copy(src: Path, dst: Path, drop_below: int) -> Path:
    """Copy only ``_delta_log`` (data files are not needed) and delete commits < drop_below."""
    shutil.copytree(src / "_delta_log", dst / "_delta_log")
    for v in range(drop_below):
        (dst / "_delta_log" / f"{v:020d}.json").unlink(missing_ok=True)
    return dst


@pytest.mark.corpus
@pytest.mark.parametrize(
    ("name", "drop_below", "start", "kind"),
    [pytest.param(*t, id=t[0]) for t in TRUNCATIONS] if HAVE_CORPUS else _no_corpus(4),
)
def test_truncated_log_starts_at_checkpoint(
    tmp_path: Path, name: str, drop_below: int, start: int, kind: str
) -> None:
    src = CORPUS / name
    full = _read(src, name)
    table_dir = _truncated_copy(src, tmp_path / "t", drop_below)
    log = _read(table_dir, name)
    assert log.start_version == start and log.end_version == full.end_version
    base = log.base_checkpoint
    assert base is not None and base.kind == kind and base.version == start
    sidecar_files = [f for f in base.files if f.startswith("_delta_log/_sidecars/")]
    sidecar_adds = 0
    for f in sidecar_files:
        sidecar_adds += pq.read_table(table_dir / f, columns=["add"]).column("add").drop_null().length()
    if "with-sidecars" in name or "sidecars-struct" in name or name == "delta-rs/checkpoint-v2-table":
        assert sidecar_files and sidecar_adds > 0
    base_adds = sum(1 for a in base.actions if a.startswith('{"add":'))
    assert base_adds >= sidecar_adds
    assert not any(a.startswith(('{"checkpointMetadata":', '{"sidecar":')) for a in base.actions)
    store = open_store(str(table_dir))
    assert checkpoint_actions(store, base.files, table=name, version=start) == base.actions
    if kind == "multipart":
        assert len(base.files) > 1 and log.multipart_parts == len(base.files)
    # Same active files as the full log replayed from version 0, and as deltalake sees them.
    assert set(_active_files(log)) == set(_active_files(full))
    assert {p for p, _dv in _active_files(log)} == _deltalake_paths(table_dir)


@pytest.mark.corpus
@pytest.mark.parametrize(
    "name",
    [
        pytest.param(n, id=n)
        for n in (
            "delta-rs/checkpoints_vacuumed",
            "delta-rs/checkpoint-cdf-table",
            "delta-rs/checkpoint_with_partitions",
            "delta-rs/table-with-domain-metadata",
            "delta-rs/table_with_deletion_logs",
            "kernel-rs/v2-checkpoints-parquet-with-sidecars",
            "kernel-rs/v1-multi-part-partitioned-struct-stats-only",
            "kernel-rs/cdf-table-with-dv",
            "delta-rs/delta-0.8.0-special-partition",
        )
    ]
    if HAVE_CORPUS
    else _no_corpus(),
)
def test_active_files_match_deltalake(name: str) -> None:
    log = _read(CORPUS / name, name)
    ours = {p for p, _dv in _active_files(log)}
    assert ours == _deltalake_paths(CORPUS / name)


@pytest.mark.corpus
@pytest.mark.skipif(not HAVE_CORPUS, reason=NO_CORPUS)
def test_missing_sidecar_skips_to_next_checkpoint(tmp_path: Path) -> None:
    name = "kernel-rs/v2-checkpoints-json-with-sidecars"
    table_dir = _truncated_copy(CORPUS / name, tmp_path / "t", 5)
    for f in (table_dir / "_delta_log" / "_sidecars").glob(
        "00000000000000000004.checkpoint.0000000002.*.parquet"
    ):
        f.unlink()
    log = _read(table_dir, name)
    assert log.start_version == 5 and log.base_checkpoint is not None
    assert 4 not in log.checkpoint_versions and 5 in log.checkpoint_versions
    # Without any usable checkpoint the import is refused, naming the missing commits.
    for f in (table_dir / "_delta_log" / "_sidecars").glob("0000000000000000000[56].checkpoint.*.parquet"):
        f.unlink()
    with pytest.raises(DataError, match=r"commits 0\.\.4 are missing") as info:
        _read(table_dir, name)
    assert "is missing" in str(info.value)


@pytest.mark.corpus
@pytest.mark.skipif(not HAVE_CORPUS, reason=NO_CORPUS)
def test_incomplete_multipart_checkpoint_is_not_used(tmp_path: Path) -> None:
    name = "kernel-rs/v1-multi-part-struct-stats-only"
    table_dir = _truncated_copy(CORPUS / name, tmp_path / "t", 5)
    next(iter((table_dir / "_delta_log").glob("*.checkpoint.0000000002.0000000003.parquet"))).unlink()
    with pytest.raises(DataError, match=r"multi-part checkpoint has only 2 of its parts"):
        _read(table_dir, name)
