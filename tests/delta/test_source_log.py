"""Reading source Delta logs for import (``delta_mirror.delta.source_log``).

Most tests run over the shared corpus of real tables (``DELTA_MIRROR_CORPUS``); they read it in
place and never write into it. Scenarios that need a modified log (early commits cleaned up, a
missing sidecar or part) work on copies in ``tmp_path``.
"""

from __future__ import annotations

import csv
import json
import os
import re
import shutil
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from support import builders
from support.services import corpus_path

from delta_mirror.delta.actions import canonical_json
from delta_mirror.delta.source_log import (
    SourceLog,
    check_supported,
    checkpoint_actions,
    parse_commit_bytes,
    read_source_log,
)
from delta_mirror.errors import (
    DataError,
    InvalidActionError,
    MirrorError,
    NotADeltaTableError,
    UnsupportedTableError,
)
from delta_mirror.storage import open_store

CORPUS = corpus_path().resolve()
HAVE_CORPUS = (CORPUS / "INDEX.tsv").is_file()
NO_CORPUS = f"shared Delta corpus not found at {CORPUS} (set DELTA_MIRROR_CORPUS)"

CATALOG_MANAGED = "kernel-rs/uc-catalog_managed_0"
MAY_BE_REFUSED = {"kernel-rs/table-with-geo"}
# Logs Delta readers cannot reconstruct at some version (README: "Import: logs readers cannot
# reconstruct"): version 0 of the DLT table has a metaData action without schemaString.
UNRECONSTRUCTABLE = {"delta-rs/delta-live-table": "schemaString"}


def _index() -> list[dict[str, str]]:
    if not HAVE_CORPUS:
        return []
    with open(CORPUS / "INDEX.tsv", newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh, delimiter="\t"))


INDEX = _index()


def _no_corpus(arity: int = 1) -> list[Any]:
    """One visibly skipped case, so a missing corpus shows up in the summary."""
    return [pytest.param(*([None] * arity), id="no-corpus", marks=pytest.mark.skip(reason=NO_CORPUS))]


def _params(rows: Iterable[dict[str, str]]) -> list[Any]:
    return [pytest.param(r, id=r["path"]) for r in rows] or _no_corpus()


def _read(path: Path, name: str | None = None) -> SourceLog:
    return read_source_log(open_store(str(path)), table=name or path.name)


_COMMIT_RE = re.compile(r"^(\d{20})\.json$")
_CHECKPOINT_RE = re.compile(r"^(\d{20})\.checkpoint\.")


def _fs_versions(table_dir: Path) -> tuple[set[int], set[int]]:
    """Commit and checkpoint versions by listing the folder directly (independent of the code)."""
    log = table_dir / "_delta_log"
    commits: set[int] = set()
    checkpoints: set[int] = set()
    if log.is_dir():
        for name in os.listdir(log):
            if m := _COMMIT_RE.match(name):
                commits.add(int(m[1]))
            elif m := _CHECKPOINT_RE.match(name):
                checkpoints.add(int(m[1]))
    return commits, checkpoints


def _dv_id(payload: dict[str, Any]) -> tuple[Any, ...] | None:
    dv = payload.get("deletionVector")
    if not dv:
        return None
    return (dv.get("storageType"), dv.get("pathOrInlineDv"), dv.get("offset"))


def _replay(lines: Iterable[str], active: dict[tuple[str, Any], dict[str, Any]]) -> None:
    """Apply add/remove lines to the active file set, keyed by (path, deletion-vector id)."""
    for line in lines:
        ((kind, payload),) = json.loads(line).items()
        if kind == "add":
            active[(payload["path"], _dv_id(payload))] = payload
        elif kind == "remove":
            active.pop((payload["path"], _dv_id(payload)), None)


def _active_files(log: SourceLog) -> dict[tuple[str, Any], dict[str, Any]]:
    active: dict[tuple[str, Any], dict[str, Any]] = {}
    if log.base_checkpoint is not None:
        _replay(log.base_checkpoint.actions, active)
    for _version, lines, _data in log.commits:
        _replay(lines, active)
    return active


def _deltalake_paths(table_dir: Path) -> set[str]:
    deltalake = pytest.importorskip("deltalake")
    try:
        dt = deltalake.DeltaTable(str(table_dir))
        paths = dt.get_add_actions(flatten=True).column("path").to_pylist()
    except Exception as exc:
        pytest.skip(f"deltalake cannot open {table_dir}: {str(exc)[:200]}")
    return {str(p) for p in paths}


def _protocol(log: SourceLog) -> dict[str, Any]:
    protocol: dict[str, Any] = {}
    lines = list(log.base_checkpoint.actions) if log.base_checkpoint else []
    for _v, commit_lines, _d in log.commits:
        lines.extend(commit_lines)
    for line in lines:
        if line.startswith('{"protocol":'):
            protocol = json.loads(line)["protocol"]
    return protocol


# --------------------------------------------------------------------------------------------
# Every corpus table
# --------------------------------------------------------------------------------------------


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
# Logs whose early commits were cleaned up
# --------------------------------------------------------------------------------------------


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


# --------------------------------------------------------------------------------------------
# Units: commits, canonical lines, protocol check, synthetic logs
# --------------------------------------------------------------------------------------------


def test_parse_commit_bytes_tolerates_real_world_quirks() -> None:
    data = b'{"commitInfo": {"b": 1, "a": [1, 2]}}\n\n  \n{"protocol":{"minReaderVersion":1,"minWriterVersion":2}}'
    actions = parse_commit_bytes(data, table="t", version=3)
    assert [list(a) for a in actions] == [["commitInfo"], ["protocol"]]
    assert list(actions[0]["commitInfo"]) == ["b", "a"]  # key order kept
    assert canonical_json(actions[0]) == '{"commitInfo":{"b":1,"a":[1,2]}}'


def test_unknown_actions_and_fields_are_kept() -> None:
    data = b'{"futureAction":{"z":1,"a":null}}\n{"add":{"path":"p","newField":[true]}}\n'
    lines = [canonical_json(a) for a in parse_commit_bytes(data, table="t", version=0)]
    assert lines == ['{"futureAction":{"z":1,"a":null}}', '{"add":{"path":"p","newField":[true]}}']


def test_unknown_keys_beside_an_action_are_kept(tmp_path: Path) -> None:
    """Spark's forward-compatible writers put unknown keys beside the action; readers ignore them."""
    line = '{"commitInfo":{"timestamp":1},"some_future_action":[1,{"a":null}]}'
    (obj,) = parse_commit_bytes(line.encode() + b"\n", table="t", version=1)
    assert canonical_json(obj) == line
    _write_commit(tmp_path, 0, [PROTOCOL, METADATA, _add("p=1/a")])
    (tmp_path / "_delta_log" / f"{1:020d}.json").write_text(
        line + "\n" + '{"add":{"path":"p=1/b","partitionValues":{"p":"1"},"size":1,"modificationTime":1,'
        '"dataChange":true,"futureField":{"x":1}},"x_future":2}\n'
    )
    log = _read(tmp_path, "fc")
    assert log.commits[1][1][0] == line and log.commits[1][2] == "\n".join(log.commits[1][1]).encode() + b"\n"
    assert {p for p, _dv in _active_files_any(log)} == {"p=1/a", "p=1/b"}


def _active_files_any(log: SourceLog) -> set[tuple[str, Any]]:
    """Active (path, dv) by replaying with the known action of each line (unknown keys ignored)."""
    from delta_mirror.delta.actions import line_action

    active: set[tuple[str, Any]] = set()
    for _version, lines, _data in log.commits:
        for line in lines:
            kind, payload = line_action(json.loads(line))
            if kind == "add":
                active.add((payload["path"], _dv_id(payload)))
            elif kind == "remove":
                active.discard((payload["path"], _dv_id(payload)))
    return active


def test_canonical_line_keeps_unicode_unescaped() -> None:
    line = canonical_json({"add": {"path": "ä/€/😀", "partitionValues": {"x": None}}})
    assert line == '{"add":{"path":"ä/€/😀","partitionValues":{"x":null}}}'


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (b'{"add":{"path":"\xff"}}\n', "not valid UTF-8"),
        (b'{"add":{}}\n{"add":', "line 2 is not valid JSON"),
        (b'{"add":{},"remove":{}}\n', r"line 1 holds 2 actions \('add', 'remove'\)"),
        (b'{"commitInfo":{}}\n{}\n', "line 2 is an empty object"),
        (b"[1,2]\n", "must be a JSON object holding an action"),
        (b'{"add":5}\n', "must be a JSON object"),
        (b'{"add":{"size":NaN}}\n', "not valid JSON"),
    ],
)
def test_parse_commit_bytes_rejects_invalid(data: bytes, match: str) -> None:
    with pytest.raises(DataError, match=match) as info:
        parse_commit_bytes(data, table="tbl", version=7)
    assert info.value.table == "tbl" and info.value.version == 7
    if b"NaN" not in data and b"\xff" not in data:
        assert isinstance(info.value, InvalidActionError)


PROTOCOL_17 = {"minReaderVersion": 1, "minWriterVersion": 7, "writerFeatures": ["appendOnly"]}


@pytest.mark.parametrize(
    ("protocol", "configuration", "match"),
    [
        (
            {"minReaderVersion": 3, "minWriterVersion": 7, "readerFeatures": ["catalogOwned-preview"]},
            {},
            "catalogOwned-preview",
        ),
        (
            {"minReaderVersion": 1, "minWriterVersion": 7, "writerFeatures": ["catalogManaged"]},
            {},
            "catalogManaged",
        ),
        (PROTOCOL_17, {"delta.coordinatedCommits.commitCoordinator-preview": "uc"}, "coordinated commits"),
        ({"minReaderVersion": 3, "minWriterVersion": 7, "readerFeatures": ["fancyNew"]}, {}, "'fancyNew'"),
        ({"minReaderVersion": 4, "minWriterVersion": 7}, {}, "minReaderVersion 4"),
        ({"minReaderVersion": 1, "minWriterVersion": 8}, {}, "minWriterVersion 8"),
        ({"minReaderVersion": 2, "minWriterVersion": 7, "readerFeatures": []}, {}, "must be 3"),
        ({"minReaderVersion": 1, "minWriterVersion": 5, "writerFeatures": ["appendOnly"]}, {}, "must be 7"),
    ],
)
def test_protocol_refusals(protocol: dict[str, Any], configuration: dict[str, str], match: str) -> None:
    with pytest.raises(UnsupportedTableError, match=match):
        check_supported(protocol, {"configuration": configuration}, table="t")


def test_protocol_accepts_known_features() -> None:
    check_supported(
        {
            "minReaderVersion": 3,
            "minWriterVersion": 7,
            "readerFeatures": ["deletionVectors", "v2Checkpoint", "columnMapping", "variantType"],
            "writerFeatures": ["deletionVectors", "v2Checkpoint", "columnMapping", "someWriterOnlyFeature"],
        },
        {"configuration": {"delta.enableDeletionVectors": "true"}},
        table="t",
    )
    check_supported({"minReaderVersion": 1, "minWriterVersion": 2}, None, table="t")


PROTOCOL = builders.PROTOCOL
METADATA = builders.action(
    "metaData",
    builders.metadata_body(
        id="00000000-0000-0000-0000-000000000000",
        schema_string=builders.EMPTY_SCHEMA_STRING,
        partition_columns=["p"],
    ),
)
_write_commit = builders.write_commit
_add = builders.add


def test_not_a_delta_table(tmp_path: Path) -> None:
    with pytest.raises(NotADeltaTableError, match="is not a Delta table: no _delta_log/") as info:
        _read(tmp_path, "empty")
    assert info.value.hint
    (tmp_path / "_delta_log" / "_commits").mkdir(parents=True)
    (tmp_path / "_delta_log" / "_commits" / "00000000000000000000.uuid.json").write_text("{}")
    (tmp_path / "_delta_log" / "junk.txt").write_text("x")
    with pytest.raises(NotADeltaTableError, match=r"junk\.txt"):
        _read(tmp_path, "empty")


def test_gap_without_checkpoint_names_missing_versions(tmp_path: Path) -> None:
    _write_commit(tmp_path, 0, [PROTOCOL, METADATA])
    for v in (1, 4, 5):
        _write_commit(tmp_path, v, [_add(f"f{v}")])
    with pytest.raises(DataError, match=r"commits 2\.\.3 are missing"):
        _read(tmp_path, "gappy")


def test_stray_files_and_bad_last_checkpoint_are_ignored(tmp_path: Path) -> None:
    _write_commit(tmp_path, 0, [PROTOCOL, METADATA, _add("a")])
    _write_commit(tmp_path, 1, [_add("b")])
    log = tmp_path / "_delta_log"
    for stray in (
        ".00000000000000000000.json.crc",
        "00000000000000000002.json.tmp",
        "00000000000000000000.crc",
        "00000000000000000000.00000000000000000001.compacted.json",
        "info.txt",
        "_staged_commits/00000000000000000002.abc.json",
        "_autostats/x.json",
    ):
        (log / stray).parent.mkdir(parents=True, exist_ok=True)
        (log / stray).write_text("garbage")
    (log / "_last_checkpoint").write_text("{not json")
    result = _read(tmp_path, "t")
    assert (result.start_version, result.end_version, result.last_checkpoint) == (0, 1, None)
    assert [v for v, _l, _d in result.commits] == [0, 1]
    (log / "_last_checkpoint").write_text('{"version":"7"}')
    assert _read(tmp_path, "t").last_checkpoint is None
    (log / "_last_checkpoint").write_text('{"version":1,"size":3}')
    assert _read(tmp_path, "t").last_checkpoint == {"version": 1, "size": 3}


MAP = pa.map_(pa.string(), pa.string())
DV = pa.struct(
    [
        ("storageType", pa.string()),
        ("pathOrInlineDv", pa.string()),
        ("offset", pa.int32()),
        ("sizeInBytes", pa.int32()),
        ("cardinality", pa.int64()),
    ]
)
ADD = pa.struct(
    [
        ("path", pa.string()),
        ("partitionValues", MAP),
        ("size", pa.int64()),
        ("modificationTime", pa.int64()),
        ("dataChange", pa.bool_()),
        ("stats", pa.string()),
        ("tags", MAP),
        ("deletionVector", DV),
        ("stats_parsed", pa.struct([("numRecords", pa.int64())])),
        ("partitionValues_parsed", pa.struct([("p", pa.int32())])),
    ]
)
REMOVE = pa.struct(
    [
        ("path", pa.string()),
        ("deletionTimestamp", pa.int64()),
        ("dataChange", pa.bool_()),
        ("partitionValues", MAP),
    ]
)
PROTOCOL_T = pa.struct(
    [
        ("minReaderVersion", pa.int32()),
        ("minWriterVersion", pa.int32()),
        ("readerFeatures", pa.list_(pa.string())),
        ("writerFeatures", pa.list_(pa.string())),
    ]
)
METADATA_T = pa.struct(
    [
        ("id", pa.string()),
        ("name", pa.string()),
        ("format", pa.struct([("provider", pa.string()), ("options", MAP)])),
        ("schemaString", pa.string()),
        ("partitionColumns", pa.list_(pa.string())),
        ("configuration", MAP),
        ("createdTime", pa.int64()),
    ]
)
TXN = pa.struct([("appId", pa.string()), ("version", pa.int64()), ("lastUpdated", pa.int64())])


def _checkpoint_table(rows: list[dict[str, Any]]) -> pa.Table:
    schema = pa.schema(
        [("txn", TXN), ("add", ADD), ("remove", REMOVE), ("metaData", METADATA_T), ("protocol", PROTOCOL_T)]
    )
    columns = {f.name: [r.get(f.name) for r in rows] for f in schema}
    return pa.table({n: pa.array(v, type=schema.field(n).type) for n, v in columns.items()}, schema=schema)


def test_parquet_checkpoint_rows_become_delta_json(tmp_path: Path) -> None:
    rows: list[dict[str, Any]] = [
        {
            "protocol": {
                "minReaderVersion": 1,
                "minWriterVersion": 2,
                "readerFeatures": None,
                "writerFeatures": None,
            }
        },
        {
            "metaData": {
                "id": "m",
                "name": None,
                "format": {"provider": "parquet", "options": []},
                "schemaString": '{"type":"struct","fields":[]}',
                "partitionColumns": ["p"],
                "configuration": [("z", "1"), ("a", "2")],
                "createdTime": 5,
            }
        },
        {"txn": {"appId": "app", "version": 3, "lastUpdated": None}},
        {
            "add": {
                "path": "p=__HIVE_DEFAULT_PARTITION__/f1.parquet",
                "partitionValues": [("p", None)],
                "size": 10,
                "modificationTime": 2,
                "dataChange": False,
                "stats": '{"numRecords":3}',
                "tags": None,
                "deletionVector": {
                    "storageType": "i",
                    "pathOrInlineDv": "wi5b=000010000siXQKl0rr91000f",
                    "offset": None,
                    "sizeInBytes": 23,
                    "cardinality": 1,
                },
                "stats_parsed": {"numRecords": 3},
                "partitionValues_parsed": {"p": None},
            }
        },
        {
            "remove": {
                "path": "p=1/f0.parquet",
                "deletionTimestamp": 9,
                "dataChange": True,
                "partitionValues": [("p", "1")],
            }
        },
    ]
    (tmp_path / "_delta_log").mkdir()
    pq.write_table(
        _checkpoint_table(rows), tmp_path / "_delta_log" / "00000000000000000004.checkpoint.parquet"
    )
    store = open_store(str(tmp_path))
    lines = checkpoint_actions(
        store, ["_delta_log/00000000000000000004.checkpoint.parquet"], table="t", version=4
    )
    assert lines == [
        '{"protocol":{"minReaderVersion":1,"minWriterVersion":2}}',
        '{"metaData":{"id":"m","format":{"provider":"parquet","options":{}},'
        '"schemaString":"{\\"type\\":\\"struct\\",\\"fields\\":[]}",'
        '"partitionColumns":["p"],"configuration":{"z":"1","a":"2"},"createdTime":5}}',
        '{"txn":{"appId":"app","version":3}}',
        '{"add":{"path":"p=__HIVE_DEFAULT_PARTITION__/f1.parquet","partitionValues":{"p":null},"size":10,'
        '"modificationTime":2,"dataChange":false,"stats":"{\\"numRecords\\":3}","deletionVector":'
        '{"storageType":"i","pathOrInlineDv":"wi5b=000010000siXQKl0rr91000f","sizeInBytes":23,"cardinality":1}}}',
        '{"remove":{"path":"p=1/f0.parquet","deletionTimestamp":9,"dataChange":true,"partitionValues":{"p":"1"}}}',
    ]
    # Early commits gone: the log starts at this checkpoint; later commits apply on top.
    _write_commit(tmp_path, 5, [_add("p=2/f2.parquet")])
    log = _read(tmp_path, "t")
    assert log.start_version == 4 and log.base_checkpoint is not None
    assert log.base_checkpoint.kind == "classic" and log.base_checkpoint.actions == lines
    assert {p for p, _dv in _active_files(log)} == {
        "p=__HIVE_DEFAULT_PARTITION__/f1.parquet",
        "p=2/f2.parquet",
    }


def test_checkpoint_row_with_two_actions_is_rejected(tmp_path: Path) -> None:
    rows: list[dict[str, Any]] = [
        {
            "txn": {"appId": "a", "version": 1, "lastUpdated": None},
            "protocol": {
                "minReaderVersion": 1,
                "minWriterVersion": 2,
                "readerFeatures": None,
                "writerFeatures": None,
            },
        }
    ]
    (tmp_path / "_delta_log").mkdir()
    pq.write_table(
        _checkpoint_table(rows), tmp_path / "_delta_log" / "00000000000000000000.checkpoint.parquet"
    )
    with pytest.raises(DataError, match="two actions"):
        checkpoint_actions(
            open_store(str(tmp_path)),
            ["_delta_log/00000000000000000000.checkpoint.parquet"],
            table="t",
            version=0,
        )


def test_checkpoint_column_beside_a_known_action_is_ignored(tmp_path: Path) -> None:
    """An unknown column set on a row with a known action is ignored, as readers do; alone, it is
    kept as an unknown action (like an unknown line in a commit)."""
    rows = [_protocol_row(), _metadata_row(METADATA["metaData"]["schemaString"]), _add_row("p=1/a"), {}]
    table = _checkpoint_table(rows).append_column(
        "futureAction", pa.array([None, None, {"x": 1}, {"x": 2}], pa.struct([("x", pa.int64())]))
    )
    (tmp_path / "_delta_log").mkdir()
    pq.write_table(table, tmp_path / "_delta_log" / f"{0:020d}.checkpoint.parquet")
    lines = checkpoint_actions(
        open_store(str(tmp_path)), [f"_delta_log/{0:020d}.checkpoint.parquet"], table="t", version=0
    )
    assert [next(iter(json.loads(line))) for line in lines] == ["protocol", "metaData", "add", "futureAction"]
    assert lines[3] == '{"futureAction":{"x":2}}'


def _protocol_row() -> dict[str, Any]:
    return {
        "protocol": {
            "minReaderVersion": 1,
            "minWriterVersion": 2,
            "readerFeatures": None,
            "writerFeatures": None,
        }
    }


def _metadata_row(schema_string: str | None) -> dict[str, Any]:
    return {
        "metaData": {
            "id": METADATA["metaData"]["id"],
            "name": None,
            "format": {"provider": "parquet", "options": []},
            "schemaString": schema_string,
            "partitionColumns": ["p"],
            "configuration": [],
            "createdTime": METADATA["metaData"].get("createdTime"),
        }
    }


def _add_row(path: str) -> dict[str, Any]:
    return {
        "add": {
            "path": path,
            "partitionValues": [("p", "1")],
            "size": 1,
            "modificationTime": 1,
            "dataChange": False,
        }
    }


def test_checkpoint_that_disagrees_with_json_replay_wins_and_is_reported(tmp_path: Path) -> None:
    _write_commit(tmp_path, 0, [PROTOCOL, METADATA, _add("p=1/a")])
    _write_commit(tmp_path, 1, [_add("p=1/b")])
    _write_commit(tmp_path, 2, [_add("p=1/c")])
    schema = json.loads(METADATA["metaData"]["schemaString"])
    schema["fields"].append({"name": "extra", "type": "long", "nullable": True, "metadata": {}})
    rows = [_protocol_row(), _metadata_row(json.dumps(schema)), _add_row("p=1/a"), _add_row("p=1/z")]
    pq.write_table(_checkpoint_table(rows), tmp_path / "_delta_log" / f"{1:020d}.checkpoint.parquet")
    log = _read(tmp_path, "cp")
    assert log.start_version == 0 and log.checkpoint_versions == [1]
    (state,) = log.checkpoint_states
    fields = {d.field: d.detail for d in state.disagreements}
    assert state.version == 1 and set(fields) == {"metaData.schemaString", "files"}
    assert "'extra' only in the checkpoint" in fields["metaData.schemaString"]
    assert "1 active only in the checkpoint, 1 only in the JSON replay" in fields["files"]
    assert state.dropped_files == [("p=1/b", "")]
    kinds = [next(iter(json.loads(line))) for line in state.lines]
    assert kinds == ["metaData", "add"] and "p=1/z" in state.lines[1]


def test_checkpoint_that_agrees_with_json_replay_records_nothing(tmp_path: Path) -> None:
    _write_commit(tmp_path, 0, [PROTOCOL, METADATA, _add("p=1/a")])
    _write_commit(tmp_path, 1, [_add("p=1/b")])
    rows = [
        _protocol_row(),
        _metadata_row(METADATA["metaData"]["schemaString"]),
        _add_row("p=1/a"),
        _add_row("p=1/b"),
    ]
    pq.write_table(_checkpoint_table(rows), tmp_path / "_delta_log" / f"{1:020d}.checkpoint.parquet")
    assert _read(tmp_path, "cp").checkpoint_states == []


@pytest.mark.parametrize("missing", ["protocol", "metaData"])
def test_checkpoint_without_protocol_or_metadata_is_refused(tmp_path: Path, missing: str) -> None:
    _write_commit(tmp_path, 0, [PROTOCOL, METADATA, _add("p=1/a")])
    _write_commit(tmp_path, 1, [_add("p=1/b")])
    rows = [_protocol_row(), _metadata_row(METADATA["metaData"]["schemaString"]), _add_row("p=1/a")]
    rows = [r for r in rows if missing not in r]
    pq.write_table(_checkpoint_table(rows), tmp_path / "_delta_log" / f"{1:020d}.checkpoint.parquet")
    with pytest.raises(DataError, match=f"checkpoint 1 has no {missing} action") as info:
        _read(tmp_path, "cp")
    assert info.value.version == 1 and info.value.hint


@pytest.mark.corpus
@pytest.mark.skipif(not HAVE_CORPUS, reason=NO_CORPUS)
def test_parquet_row_group_skipping_checkpoint_schema_is_reported() -> None:
    """Its multi-part checkpoint's metaData has a column 'missing' the JSON commits lack."""
    log = _read(CORPUS / "kernel-rs/parquet_row_group_skipping")
    (state,) = log.checkpoint_states
    fields = {d.field: d.detail for d in state.disagreements}
    assert state.version == 1 and "metaData.schemaString" in fields
    assert "'missing' only in the checkpoint" in fields["metaData.schemaString"]
    (meta,) = [line for line in state.lines if line.startswith('{"metaData":')]
    assert "missing" in json.loads(json.loads(meta)["metaData"]["schemaString"])["fields"][-1]["name"]


def test_catalog_managed_in_later_commit_is_refused(tmp_path: Path) -> None:
    _write_commit(tmp_path, 0, [PROTOCOL, METADATA])
    _write_commit(
        tmp_path,
        1,
        [
            {
                "protocol": {
                    "minReaderVersion": 3,
                    "minWriterVersion": 7,
                    "readerFeatures": ["catalogManaged"],
                    "writerFeatures": ["catalogManaged", "inCommitTimestamp"],
                }
            }
        ],
    )
    with pytest.raises(UnsupportedTableError, match="catalogManaged") as info:
        _read(tmp_path, "cm")
    assert info.value.table == "cm"


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
