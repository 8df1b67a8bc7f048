"""Every corpus table reads as Delta readers see it; canonical bytes reproduce Delta-Spark's commits."""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from support.source_log_kit import (
    _CHECKPOINT_RE,
    CATALOG_MANAGED,
    CORPUS,
    HAVE_CORPUS,
    INDEX,
    MAY_BE_REFUSED,
    NO_CORPUS,
    UNRECONSTRUCTABLE,
    _fs_versions,
    _no_corpus,
    _params,
    _protocol,
    _read,
    _replay,
)

from delta_mirror.delta.actions import canonical_json
from delta_mirror.delta.source_log import SourceLog, checkpoint_actions, read_source_log
from delta_mirror.errors import DataError, MirrorError, NotADeltaTableError, UnsupportedTableError
from delta_mirror.storage import open_store


@pytest.mark.corpus
@pytest.mark.parametrize("row", _params(INDEX))
def test_corpus_table(row: dict[str, str]) -> None:
    name = row["path"]
    table_dir = CORPUS / name
    category = row["category"]

    if category == "negative" or name in (CATALOG_MANAGED, *UNRECONSTRUCTABLE):
        _check_refusal(table_dir, name)
        return
    try:
        log = _read(table_dir, name)
    except UnsupportedTableError as exc:
        if name in MAY_BE_REFUSED:
            return
        raise AssertionError(f"{name} ({category}) refused: {exc}") from exc
    _check_log(log, row, table_dir)


def _check_refusal(table_dir: Path, name: str) -> None:
    with pytest.raises((NotADeltaTableError, UnsupportedTableError, DataError)) as info:
        _read(table_dir, name)
    message = str(info.value)
    assert name in message and len(message) > 40, message
    if name == "delta-rs/simple_table_features":
        assert isinstance(info.value, UnsupportedTableError) and "blahabl" in message
    if name == "kernel-rs/crc-malformed":
        assert isinstance(info.value, NotADeltaTableError) and "not a Delta table" in message
    if name == CATALOG_MANAGED:
        assert isinstance(info.value, UnsupportedTableError) and "catalogManaged" in message
    if name in UNRECONSTRUCTABLE:
        assert UNRECONSTRUCTABLE[name] in message and info.value.version is not None and info.value.hint


def _check_log(log: SourceLog, row: dict[str, str], table_dir: Path) -> None:
    commits_fs, checkpoints_fs = _fs_versions(table_dir)
    latest = max(commits_fs | checkpoints_fs)
    assert log.end_version == latest
    assert log.location == open_store(str(table_dir)).uri
    if commits_fs == set(range(latest + 1)):
        assert log.start_version == 0 and log.base_checkpoint is None
        assert [v for v, _l, _d in log.commits] == list(range(latest + 1))
    else:
        assert log.base_checkpoint is not None
        assert log.start_version == log.base_checkpoint.version
        assert log.start_version in log.checkpoint_versions
        expected = [v for v in range(log.start_version, latest + 1) if v in commits_fs]
        assert [v for v, _l, _d in log.commits] == expected
        assert all(v in commits_fs for v in range(log.start_version + 1, latest + 1))
        assert any(a.startswith('{"protocol":') for a in log.base_checkpoint.actions)
        assert any(a.startswith('{"metaData":') for a in log.base_checkpoint.actions)
    assert set(log.checkpoint_versions) <= checkpoints_fs

    for version, lines, data in log.commits:
        assert data == (table_dir / "_delta_log" / f"{version:020d}.json").read_bytes()
        for line in lines:
            obj = json.loads(line)
            assert isinstance(obj, dict) and len(obj) >= 1
            assert canonical_json(obj) == line
        assert len(lines) == sum(1 for raw in data.decode("utf-8").split("\n") if raw.strip())

    protocol = _protocol(log)
    if "v2Checkpoint" in (protocol.get("readerFeatures") or []):
        assert log.checkpoint_kind == "v2"
    kinds = row["checkpoint_kinds"]
    if "multipart=" in kinds:
        assert log.multipart_parts is not None and log.multipart_parts > 1
        if "v2Checkpoint" not in (protocol.get("readerFeatures") or []):
            assert log.checkpoint_kind == "multipart"
    if "_last_checkpoint=" in kinds:
        assert log.last_checkpoint is not None and isinstance(log.last_checkpoint["version"], int)


def _with_checkpoints() -> list[dict[str, str]]:
    return [
        r
        for r in INDEX
        if r["category"] != "negative"
        and r["path"] != CATALOG_MANAGED
        and re.search(r"(classic|multipart|v2-json|v2-parquet)=", r["checkpoint_kinds"])
    ]


@pytest.mark.corpus
@pytest.mark.parametrize("row", _params(_with_checkpoints()))
def test_every_checkpoint_matches_json_replay(row: dict[str, str]) -> None:
    """Each complete checkpoint's active files equal a replay of the JSON commits up to it."""
    name = row["path"]
    table_dir = CORPUS / name
    log = _read(table_dir, name)
    store = open_store(str(table_dir))
    by_version: dict[int, list[str]] = {}
    for file in sorted(os.listdir(table_dir / "_delta_log")):
        if m := _CHECKPOINT_RE.match(file):
            by_version.setdefault(int(m[1]), []).append(f"_delta_log/{file}")
    checked = 0
    for c in log.checkpoint_versions:
        files = by_version[c]
        uuid_named = [f for f in files if re.search(r"\.checkpoint\.[0-9a-f-]{36}\.", f)]
        if uuid_named:
            files = uuid_named[:1]
        actions = checkpoint_actions(store, files, table=name, version=c)
        kinds = Counter(next(iter(json.loads(a))) for a in actions)
        assert kinds["protocol"] == 1 and kinds["metaData"] == 1, kinds
        assert not {"checkpointMetadata", "sidecar", "commitInfo"} & set(kinds)
        from_cp: dict[tuple[str, Any], dict[str, Any]] = {}
        _replay(actions, from_cp)
        if log.start_version > c or (log.base_checkpoint is not None and c < log.base_checkpoint.version):
            continue
        replayed: dict[tuple[str, Any], dict[str, Any]] = {}
        if log.base_checkpoint is not None:
            _replay(log.base_checkpoint.actions, replayed)
        for version, lines, _data in log.commits:
            if version <= c:
                _replay(lines, replayed)
        assert set(from_cp) == set(replayed), f"checkpoint {c} of {name}"
        for key, add in from_cp.items():
            # add.stats stays a JSON string, sizes stay ints.
            assert isinstance(add["size"], int)
            assert "stats" not in add or isinstance(add["stats"], str)
            assert not any(k.endswith("_parsed") for k in add)
            assert add.get("partitionValues", {}) == replayed[key].get("partitionValues", {})
        checked += 1
    assert checked or not log.checkpoint_versions


# --------------------------------------------------------------------------------------------
# Byte identity with Delta-Spark
# --------------------------------------------------------------------------------------------


def _strip_ws_outside_strings(text: str) -> str:
    out: list[str] = []
    in_string = escaped = False
    for ch in text:
        if in_string:
            out.append(ch)
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
            out.append(ch)
        elif ch not in " \t\r":
            out.append(ch)
    return "".join(out)


def _explain(data: bytes, lines: list[str]) -> list[str]:
    """Why canonical bytes differ from the original file (empty = unexplained)."""
    reasons: list[str] = []
    text = data.decode("utf-8")
    raw = [r for r in text.split("\n") if r.strip()]
    if not text.endswith("\n"):
        reasons.append("no trailing newline")
    pieces = text.split("\n")
    if text.endswith("\n"):
        pieces.pop()
    if any(not p.strip() for p in pieces):
        reasons.append("blank lines")
    for original, canon in zip(raw, lines, strict=True):
        if original == canon:
            continue
        if _strip_ws_outside_strings(original) == canon:
            reasons.append("spaces after ':' or ','")
        elif json.loads(original) == json.loads(canon):
            reasons.append("same JSON, different escapes or number format")
        else:
            return []
    return sorted(set(reasons))


@pytest.mark.corpus
@pytest.mark.skipif(not HAVE_CORPUS, reason=NO_CORPUS)
def test_canonical_bytes_reproduce_spark_commits() -> None:
    identical: Counter[str] = Counter()
    differing: dict[str, list[str]] = {}
    unexplained: list[str] = []
    for row in INDEX:
        name = row["path"]
        try:
            log = _read(CORPUS / name, name)
        except MirrorError:
            continue
        for version, lines, data in log.commits:
            engine = ""
            for line in lines:
                if line.startswith('{"commitInfo":'):
                    engine = str(json.loads(line)["commitInfo"].get("engineInfo", ""))
            writer = "spark" if engine.startswith("Apache-Spark") else "other"
            rendered = ("\n".join(lines) + "\n").encode("utf-8")
            if rendered == data:
                identical[writer] += 1
                continue
            reasons = _explain(data, lines)
            where = f"{name} v{version} ({engine or 'no engineInfo'})"
            if not reasons:
                unexplained.append(where)
            differing.setdefault(writer, []).append(f"{where}: {', '.join(reasons) or 'UNEXPLAINED'}")
    print("\ncanonical re-encoding vs original commit bytes")
    for writer in ("spark", "other"):
        diffs = differing.get(writer, [])
        print(f"  {writer}: {identical[writer]} identical, {len(diffs)} differ")
        for d in diffs:
            print(f"    {d}")
    assert identical["spark"] > 50
    assert not unexplained, unexplained


@pytest.mark.corpus
@pytest.mark.s3
@pytest.mark.parametrize(
    "name",
    [
        pytest.param(n, id=n)
        for n in (
            "delta-rs/checkpoints_vacuumed",
            "kernel-rs/v2-checkpoints-json-with-sidecars",
            "kernel-rs/parquet_row_group_skipping",
        )
    ]
    if HAVE_CORPUS
    else _no_corpus(),
)
def test_reads_the_same_over_s3(s3_env: str, name: str) -> None:
    """Only ObjectStore.list/get are used, so an S3 copy reads exactly like the local folder."""
    src = CORPUS / name
    store = open_store(f"s3://{s3_env}/table")
    for file in sorted((src / "_delta_log").rglob("*")):
        if file.is_file():
            store.put(file.relative_to(src).as_posix(), file.read_bytes())
    local = _read(src, name)
    remote = read_source_log(store, table=name)
    assert remote.location == f"s3://{s3_env}/table"
    remote.location = local.location
    assert remote == local
