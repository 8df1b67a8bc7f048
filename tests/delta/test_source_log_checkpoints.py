"""Parquet checkpoint rows become Delta JSON; a checkpoint that disagrees with JSON replay is reported."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from support.source_log_kit import (
    CORPUS,
    HAVE_CORPUS,
    METADATA,
    NO_CORPUS,
    PROTOCOL,
    _active_files,
    _add,
    _read,
    _write_commit,
)

from delta_mirror.delta.source_log import checkpoint_actions
from delta_mirror.errors import DataError
from delta_mirror.storage import open_store

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
