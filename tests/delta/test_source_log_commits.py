"""Units of the source log: commits, canonical lines, the protocol check, synthetic logs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from support.source_log_kit import METADATA, PROTOCOL, _add, _dv_id, _read, _write_commit

from delta_mirror.delta.actions import canonical_json
from delta_mirror.delta.source_log import SourceLog, check_supported, parse_commit_bytes
from delta_mirror.errors import DataError, InvalidActionError, NotADeltaTableError, UnsupportedTableError


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
