"""Checkpoints built by delta_mirror.delta.checkpoint must be read by deltalake exactly like the log they replace.

Each round trip: take a real table, reconcile its JSON commits into a CheckpointInput, build the
checkpoint, publish it into a *copy* of the table with every JSON commit at or before the
checkpoint version deleted, and compare what deltalake sees with the original table.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import deltalake
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import CommitProperties, DeltaTable, TableFeatures, Transaction, write_deltalake
from support.builders import action, log_line, protocol_body
from support.checkpoint_roundtrip import log_state, publish, roundtrip, rows, spark_murmur3

from delta_mirror.delta.checkpoint import (
    CHECKPOINT_SCHEMA,
    SIDECAR_SCHEMA,
    V2_CHECKPOINT_SCHEMA,
    build_checkpoint,
    spark_hash_partition,
)
from delta_mirror.delta.checkpoint import file_actions as ck
from delta_mirror.delta.log_path import LogFileKind, parse_log_file
from delta_mirror.errors import InvalidActionError, PermanentError

V2_PROTOCOL = log_line(
    action("protocol", protocol_body(3, 7, readerFeatures=["v2Checkpoint"], writerFeatures=["v2Checkpoint"]))
)


@pytest.fixture
def appended_table(tmp_path: Path) -> Path:
    """Three appends (one with an application transaction id) and a schema-compatible fourth."""
    path = tmp_path / "appends"
    for i in range(3):
        write_deltalake(
            str(path), pa.table({"id": [i * 10 + j for j in range(5)], "s": ["x"] * 5}), mode="append"
        )
    write_deltalake(
        str(path),
        pa.table({"id": [100], "s": ["y"]}),
        mode="append",
        commit_properties=CommitProperties(app_transactions=[Transaction("stream-1", 7, 1700000000000)]),
    )
    return path


# ------------------------------------------------------------------------------------------
# classic
# ------------------------------------------------------------------------------------------


def test_classic_checkpoint_after_several_appends_reads_back_as_the_same_table(
    appended_table: Path, tmp_path: Path
) -> None:
    result = roundtrip(appended_table, tmp_path)
    assert [f.path for f in result.files] == ["_delta_log/00000000000000000003.checkpoint.parquet"]
    copy = tmp_path / "copy-classic"
    assert DeltaTable(str(copy)).transaction_version("stream-1") == 7
    assert not list((copy / "_delta_log").glob("*.json"))


def test_classic_checkpoint_rows_are_protocol_metadata_txn_then_adds(appended_table: Path) -> None:
    state = log_state(appended_table)
    result = build_checkpoint(state)
    kinds = [next(iter(r)) for r in rows(result.files[0].data)]
    assert kinds == ["protocol", "metaData", "txn"] + ["add"] * 4
    assert result.num_add_files == 4 and result.num_actions == 7


def test_partitioned_table_with_a_null_partition_value_keeps_the_null(tmp_path: Path) -> None:
    path = tmp_path / "partitioned"
    data = pa.table({"id": [1, 2, 3, 4], "p": ["a", None, "b", None], "q": [1, 1, None, 2]})
    write_deltalake(str(path), data, partition_by=["p", "q"])
    write_deltalake(str(path), pa.table({"id": [5], "p": [None], "q": [3]}).cast(data.schema), mode="append")
    result = roundtrip(path, tmp_path)
    values = [r["add"]["partitionValues"] for r in rows(result.files[0].data) if "add" in r]
    assert ("p", None) in [kv for pv in values for kv in pv]
    assert all([k for k, _ in pv] == ["p", "q"] for pv in values)  # partition column order, always both


def test_table_with_deletes_keeps_active_files_and_tombstones(tmp_path: Path) -> None:
    path = tmp_path / "deletes"
    write_deltalake(str(path), pa.table({"id": list(range(10))}))
    write_deltalake(str(path), pa.table({"id": list(range(10, 20))}), mode="append")
    DeltaTable(str(path)).delete("id % 3 = 0")
    state = log_state(path)
    assert state.removes, "the delete must have produced tombstones"
    result = roundtrip(path, tmp_path)
    found = rows(result.files[0].data)
    assert {r["remove"]["path"] for r in found if "remove" in r} == {
        json.loads(line)["remove"]["path"] for line in state.removes
    }
    assert all(r["remove"]["dataChange"] is False for r in found if "remove" in r)


def test_last_checkpoint_of_a_classic_checkpoint_has_no_parts(appended_table: Path) -> None:
    result = build_checkpoint(log_state(appended_table))
    info = json.loads(result.last_checkpoint)
    assert list(info) == ["version", "size", "sizeInBytes", "numOfAddFiles"]
    assert info == {"version": 3, "size": 7, "sizeInBytes": len(result.files[0].data), "numOfAddFiles": 4}
    assert result.last_checkpoint.endswith(b"}\n")


# ------------------------------------------------------------------------------------------
# schema
# ------------------------------------------------------------------------------------------


def test_every_parquet_field_is_nullable_except_map_keys(appended_table: Path) -> None:
    state = log_state(appended_table)
    state.protocol = V2_PROTOCOL
    outputs = [
        build_checkpoint(log_state(appended_table)).files[0].data,
        *[f.data for f in build_checkpoint(state, kind="v2", sidecar_size=2).files],
    ]
    for data in outputs:
        parquet_schema = pq.ParquetFile(pa.BufferReader(data)).schema
        text = str(parquet_schema)
        lines = [line.strip() for line in text.splitlines()]
        root = lines.index("required group field_id=-1 schema {")
        required = [line for line in lines[root + 1 :] if line.startswith("required")]
        assert required and all(
            re.fullmatch(r"required binary field_id=-1 key \(String\);", r) for r in required
        )
        arrow_schema = pq.read_schema(pa.BufferReader(data))
        for field in arrow_schema:
            assert field.nullable
            _assert_nested_nullable(field.type)


def _assert_nested_nullable(typ: Any) -> None:
    if pa.types.is_struct(typ):
        for field in typ:
            assert field.nullable, field
            _assert_nested_nullable(field.type)
    elif pa.types.is_list(typ):
        assert typ.value_field.nullable
    elif pa.types.is_map(typ):
        assert typ.item_field.nullable


def test_schema_uses_spark_field_order_and_parquet_names() -> None:
    assert CHECKPOINT_SCHEMA.names == ["txn", "add", "remove", "metaData", "protocol", "domainMetadata"]
    assert V2_CHECKPOINT_SCHEMA.names == [*CHECKPOINT_SCHEMA.names, "checkpointMetadata", "sidecar"]
    assert SIDECAR_SCHEMA.names == ["add", "remove"]
    add = CHECKPOINT_SCHEMA.field("add").type
    assert [f.name for f in add] == [
        "path", "partitionValues", "size", "modificationTime", "dataChange", "stats", "tags",
        "deletionVector", "baseRowId", "defaultRowCommitVersion", "clusteringProvider",
    ]  # fmt: skip
    remove = CHECKPOINT_SCHEMA.field("remove").type
    assert [f.name for f in remove] == [
        "path", "deletionTimestamp", "dataChange", "extendedFileMetadata", "partitionValues", "size",
        "deletionVector", "baseRowId", "defaultRowCommitVersion",
    ]  # fmt: skip
    dv = add.field("deletionVector").type
    assert [(f.name, str(f.type)) for f in dv] == [
        ("storageType", "string"), ("pathOrInlineDv", "string"), ("offset", "int32"),
        ("sizeInBytes", "int32"), ("cardinality", "int64"), ("maxRowIndex", "int64"),
    ]  # fmt: skip


def test_lists_and_maps_use_the_names_spark_writes(appended_table: Path) -> None:
    data = build_checkpoint(log_state(appended_table)).files[0].data
    text = str(pq.ParquetFile(pa.BufferReader(data)).schema)
    assert "repeated group field_id=-1 key_value" in text
    assert "repeated group field_id=-1 list {\n        optional binary field_id=-1 element (String);" in text
    assert pq.ParquetFile(pa.BufferReader(data)).metadata.row_group(0).column(0).compression == "SNAPPY"


def test_unknown_fields_are_dropped_and_commit_info_and_cdc_never_written(appended_table: Path) -> None:
    state = log_state(appended_table)
    adds = [json.loads(line) for line in state.adds]
    adds[0]["add"]["futureField"] = {"nested": [1, 2]}
    adds[1]["add"]["deletionVector"] = {
        "storageType": "u", "pathOrInlineDv": "ab", "offset": 1, "sizeInBytes": 2, "cardinality": 3, "newDvField": 9,
    }  # fmt: skip
    state.adds = [json.dumps(a) for a in adds]
    result = build_checkpoint(state)
    schema = pq.read_schema(pa.BufferReader(result.files[0].data))
    assert "commitInfo" not in schema.names and "cdc" not in schema.names
    found = [r["add"] for r in rows(result.files[0].data) if "add" in r]
    assert "futureField" not in found[0]
    assert found[1]["deletionVector"] == {
        "storageType": "u", "pathOrInlineDv": "ab", "offset": 1, "sizeInBytes": 2, "cardinality": 3, "maxRowIndex": None,
    }  # fmt: skip
    assert all(a["dataChange"] is False for a in found)  # like Spark: a checkpoint changes no data


# ------------------------------------------------------------------------------------------
# the Arrow fast path and the json.loads fallback agree
# ------------------------------------------------------------------------------------------

_ODD_ADDS = [
    '{"add":{"path":"p=a/1.parquet","partitionValues":{"p":"a"},"size":1,"modificationTime":5,"dataChange":true,'
    '"stats":"{\\"numRecords\\":1}","tags":{"Z":"1","A":"2"}}}',
    '{"add":{"path":"p=__HIVE_DEFAULT_PARTITION__/2.parquet","partitionValues":{"p":null},"size":2,'
    '"modificationTime":6,"dataChange":false,"tags":null,"deletionVector":{"storageType":"i","pathOrInlineDv":"x",'
    '"sizeInBytes":4,"cardinality":1}}}',
    '{"add":{"path":"3.parquet","partitionValues":{},"size":3,"modificationTime":7,"dataChange":true,'
    '"baseRowId":10,"defaultRowCommitVersion":2,"clusteringProvider":"liquid","tags":{"N":null}}}',
    '{"add":{"path":"4.parquet","partitionValues":{"p":"b","extra":"e"},"size":4,"modificationTime":8,"dataChange":true}}',
]


@pytest.mark.parametrize("column", ["add", "remove"])
def test_arrow_fast_path_and_json_fallback_build_identical_arrays(column: str) -> None:
    lines = [line.replace('{"add"', '{"' + column + '"', 1) for line in _ODD_ADDS]
    if column == "remove":
        lines = [line.replace('"modificationTime"', '"deletionTimestamp"') for line in lines]
    ctx = ck._Context(version=1, partition_keys=("p",))
    fast = ck._parse_fast(lines, column, ctx)
    slow = ck._parse_slow(lines, column, ctx)
    assert fast.equals(slow), (fast.to_pylist(), slow.to_pylist())
    first = fast.to_pylist()[0]
    assert first["partitionValues"] == [("p", "a")]
    if column == "add":
        assert first["tags"] == [("A", "2"), ("Z", "1")]
        assert fast.to_pylist()[2]["partitionValues"] == [("p", None)]  # a missing partition key is null


def test_inconsistent_json_types_fall_back_to_the_line_parser() -> None:
    lines = [f'{{"add":{{"path":"f{i}","partitionValues":{{}},"size":1,"x":"s"}}}}' for i in range(3)]
    lines.append('{"add":{"path":"f9","partitionValues":{},"size":1,"x":{"an":"object"}}}')
    ctx = ck._Context(version=1, partition_keys=())
    with pytest.raises(ck._Fallback):
        ck._parse_fast(lines, "add", ctx)
    assert [r["path"] for r in ck._parse_file_actions(lines, "add", ctx).to_pylist()] == [
        "f0",
        "f1",
        "f2",
        "f9",
    ]


def test_many_chunks_and_a_generator_of_adds_give_the_same_actions(
    appended_table: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = log_state(appended_table)
    expected = rows(build_checkpoint(state).files[0].data)
    monkeypatch.setattr(ck, "_CHUNK_CHARS", 10)  # one line per Arrow JSON call
    lines = list(state.adds)
    state.adds = (line for line in lines)
    assert rows(build_checkpoint(state).files[0].data) == expected


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"add":{"size":1}}', "without a string path"),
        ('{"add":{"path":"a","stats":{"numRecords":1}}}', "stats must be a string"),
        ('{"add":{"path":"a","partitionValues":{"p":1}}}', "string-to-string map"),
        ('{"remove":{"path":"a"}}', "expected a {'add'"),
        ("not json", "not valid JSON"),
        ('{"add":{"path":"a","size":"big"}}', "does not fit the checkpoint schema"),
    ],
)
def test_an_invalid_add_line_is_a_data_error(appended_table: Path, line: str, message: str) -> None:
    state = log_state(appended_table)
    state.adds = [*state.adds, line]
    with pytest.raises(InvalidActionError, match=re.escape(message)):
        build_checkpoint(state)


def test_a_broken_protocol_line_is_a_data_error(appended_table: Path) -> None:
    state = log_state(appended_table)
    state.protocol = '{"metaData":{}}'
    with pytest.raises(InvalidActionError):
        build_checkpoint(state)


def test_domain_metadata_tombstones_are_not_written(appended_table: Path) -> None:
    state = log_state(appended_table)
    state.domain_metadata = [
        '{"domainMetadata":{"domain":"delta.clustering","configuration":"{}","removed":false}}',
        '{"domainMetadata":{"domain":"gone","configuration":"","removed":true}}',
    ]
    found = [
        r["domainMetadata"] for r in rows(build_checkpoint(state).files[0].data) if "domainMetadata" in r
    ]
    assert found == [{"domain": "delta.clustering", "configuration": "{}", "removed": False}]


def test_column_mapping_partition_keys_are_physical_names() -> None:
    schema = {
        "type": "struct",
        "fields": [
            {"name": "Country", "type": "string", "nullable": True,
             "metadata": {"delta.columnMapping.id": 1, "delta.columnMapping.physicalName": "col-abc"}},
        ],
    }  # fmt: skip
    meta = {"partitionColumns": ["Country"], "schemaString": json.dumps(schema),
            "configuration": {"delta.columnMapping.mode": "name"}}  # fmt: skip
    assert ck._partition_keys(meta, 1) == ("col-abc",)
    meta["configuration"] = {}
    assert ck._partition_keys(meta, 1) == ("Country",)


# ------------------------------------------------------------------------------------------
# multi-part
# ------------------------------------------------------------------------------------------


@pytest.fixture
def ten_file_table(tmp_path: Path) -> Path:
    path = tmp_path / "ten"
    for i in range(10):
        write_deltalake(
            str(path), pa.table({"id": [i], "p": [f"v{i % 3}"]}), mode="append", partition_by=["p"]
        )
    return path


def test_multipart_checkpoint_names_parts_and_last_checkpoint(ten_file_table: Path, tmp_path: Path) -> None:
    result = roundtrip(ten_file_table, tmp_path, kind="multipart", part_size=3)
    names = [f.path for f in result.files]
    assert names == [
        f"_delta_log/00000000000000000009.checkpoint.{o:010d}.0000000004.parquet" for o in (1, 2, 3, 4)
    ]
    info = json.loads(result.last_checkpoint)
    assert list(info) == ["version", "size", "parts", "sizeInBytes", "numOfAddFiles"]
    assert info["parts"] == 4 and info["size"] == 12 and info["numOfAddFiles"] == 10
    assert info["sizeInBytes"] == sum(len(f.data) for f in result.files)


def test_multipart_parts_follow_spark_hash_partitioning(ten_file_table: Path) -> None:
    result = build_checkpoint(log_state(ten_file_table), kind="multipart", part_size=3)
    for part, f in enumerate(result.files):
        for r in rows(f.data):
            if "add" in r:
                assert spark_murmur3(r["add"]["path"].encode()) % 4 == part
            else:  # a null key hashes to the seed: protocol and metaData share part 42 % 4
                assert part == 42 % 4


def test_multipart_that_fits_in_one_part_is_written_as_classic(ten_file_table: Path) -> None:
    result = build_checkpoint(log_state(ten_file_table), kind="multipart", part_size=10)
    assert [f.path for f in result.files] == ["_delta_log/00000000000000000009.checkpoint.parquet"]
    assert b"parts" not in result.last_checkpoint


def test_multipart_is_refused_on_a_v2_checkpoint_table(appended_table: Path) -> None:
    state = log_state(appended_table)
    state.protocol = V2_PROTOCOL
    with pytest.raises(PermanentError, match="forbidden"):
        build_checkpoint(state, kind="multipart", part_size=1)


def test_bad_arguments_are_programming_errors(appended_table: Path) -> None:
    with pytest.raises(ValueError, match="kind"):
        build_checkpoint(log_state(appended_table), kind="v3")
    with pytest.raises(ValueError, match="part_size"):
        build_checkpoint(log_state(appended_table), kind="multipart")


def test_spark_hash_matches_the_reference_for_odd_lengths_and_non_ascii() -> None:
    samples = ["", "a", "ab", "abc", "abcd", "abcde", "é", "漢字", "😀x", "part=é/f-00001.snappy.parquet"]
    samples += [f"s3://bucket/table/p={i}/part-{i:05d}-{'ü' * (i % 5)}.parquet" for i in range(200)]
    for parts in (2, 3, 7, 64):
        got = spark_hash_partition(pa.array(samples).slice(0), parts).to_pylist()
        assert got == [spark_murmur3(s.encode()) % parts for s in samples]


def test_spark_hash_places_files_where_a_databricks_multipart_checkpoint_has_them(corpus_dir: Path) -> None:
    log = corpus_dir / "kernel-rs/v1-multi-part-struct-stats-only/_delta_log"
    for part in sorted(log.glob("*.checkpoint.*.*.parquet")):
        lf = parse_log_file(part.name)
        assert lf is not None
        paths = [r["add"]["path"] for r in pq.read_table(part).to_pylist() if r.get("add")]
        if paths:
            assert spark_hash_partition(pa.array(paths), lf.num_parts).to_pylist() == [lf.part - 1] * len(
                paths
            )


# ------------------------------------------------------------------------------------------
# V2 (UUID-named, sidecars)
# ------------------------------------------------------------------------------------------


@pytest.fixture
def v2_table(tmp_path: Path) -> Path:
    path = tmp_path / "v2"
    write_deltalake(str(path), pa.table({"id": [0, 1]}))
    DeltaTable(str(path)).alter.add_feature(TableFeatures.V2Checkpoint, allow_protocol_versions_increase=True)
    for i in range(1, 5):
        write_deltalake(str(path), pa.table({"id": [i * 10]}), mode="append")
    DeltaTable(str(path)).delete("id = 10")
    return path


def test_v2_checkpoint_with_sidecars_is_read_by_deltalake(v2_table: Path, tmp_path: Path) -> None:
    result = roundtrip(v2_table, tmp_path, kind="v2", sidecar_size=2, checkpoint_id="table-uuid/6")
    *sidecars, top = result.files
    assert len(sidecars) == 3  # 4 adds + 1 tombstone, two per sidecar
    assert all(re.fullmatch(r"_delta_log/_sidecars/[0-9a-f-]{36}\.parquet", s.path) for s in sidecars)
    lf = parse_log_file(top.path.rsplit("/", 1)[1])
    assert lf is not None and lf.kind == LogFileKind.UUID_CHECKPOINT and lf.version == 6
    top_rows = rows(top.data)
    assert [next(iter(r)) for r in top_rows] == ["checkpointMetadata", "protocol", "metaData"] + [
        "sidecar"
    ] * 3
    assert top_rows[0]["checkpointMetadata"] == {"version": 6, "tags": None}
    assert [r["sidecar"]["path"] for r in top_rows[3:]] == [s.path.rsplit("/", 1)[1] for s in sidecars]
    assert [r["sidecar"]["sizeInBytes"] for r in top_rows[3:]] == [len(s.data) for s in sidecars]
    for s in sidecars:
        assert pq.read_schema(pa.BufferReader(s.data)).names == ["add", "remove"]
    info = json.loads(result.last_checkpoint)
    assert info["v2Checkpoint"] == {"path": lf.name, "sizeInBytes": len(top.data), "modificationTime": 0}
    assert info["size"] == 5 + 6 and info["numOfAddFiles"] == 4 and "parts" not in info
    assert info["sizeInBytes"] == sum(len(f.data) for f in result.files)
    assert result.num_actions == info["size"]


def test_v2_checkpoint_without_file_actions_has_no_sidecars(tmp_path: Path) -> None:
    path = tmp_path / "empty"
    DeltaTable.create(str(path), schema=deltalake.Schema.from_arrow(pa.schema([("id", pa.int64())])))
    DeltaTable(str(path)).alter.add_feature(TableFeatures.V2Checkpoint, allow_protocol_versions_increase=True)
    result = roundtrip(path, tmp_path, kind="v2")
    assert len(result.files) == 1
    assert [next(iter(r)) for r in rows(result.files[0].data)] == [
        "checkpointMetadata",
        "protocol",
        "metaData",
    ]


def test_v2_checkpoint_is_refused_without_the_table_feature(appended_table: Path) -> None:
    with pytest.raises(PermanentError, match="v2Checkpoint"):
        build_checkpoint(log_state(appended_table), kind="v2")


def test_same_input_gives_the_same_names_and_bytes(v2_table: Path, ten_file_table: Path) -> None:
    cases: list[tuple[Path, dict[str, Any]]] = [
        (v2_table, {"kind": "v2", "sidecar_size": 2, "checkpoint_id": "t/6"}),
        (ten_file_table, {"kind": "multipart", "part_size": 3}),
        (ten_file_table, {}),
    ]
    for table, kwargs in cases:
        first = build_checkpoint(log_state(table), **kwargs)
        second = build_checkpoint(log_state(table), **kwargs)
        assert [(f.path, f.data) for f in first.files] == [(f.path, f.data) for f in second.files]
        assert first.last_checkpoint == second.last_checkpoint


def test_v2_names_depend_on_the_checkpoint_id_and_on_the_content(v2_table: Path) -> None:
    def names(**kwargs: Any) -> list[str]:
        return [f.path for f in build_checkpoint(log_state(v2_table), kind="v2", **kwargs).files]

    base = names(checkpoint_id="t/6", sidecar_size=2)
    assert names(checkpoint_id="other/6", sidecar_size=2) != base
    changed = names(checkpoint_id="t/6", sidecar_size=3)
    assert not set(changed) & set(base)  # different bytes never reuse a name
    # without a checkpoint id the table's own id and the version seed the names
    meta_id = json.loads(log_state(v2_table).metadata)["metaData"]["id"]
    assert names(sidecar_size=2) == names(checkpoint_id=f"{meta_id}/6", sidecar_size=2)


def test_v2_modification_time_is_written_where_readers_expect_it(v2_table: Path) -> None:
    result = build_checkpoint(log_state(v2_table), kind="v2", modification_time_ms=1_700_000_000_123)
    top = rows(result.files[-1].data)
    assert {r["sidecar"]["modificationTime"] for r in top if "sidecar" in r} == {1_700_000_000_123}
    assert json.loads(result.last_checkpoint)["v2Checkpoint"]["modificationTime"] == 1_700_000_000_123


# ------------------------------------------------------------------------------------------
# real tables from the corpus (Spark, Databricks, delta-rs writers)
# ------------------------------------------------------------------------------------------

CORPUS_TABLES = [
    ("delta-rs/table-with-dv-small", "classic", True),  # deletion vectors
    ("kernel-rs/cdf-table-with-dv", "classic", True),  # DVs updated across commits, tombstones
    ("delta-rs/cdf-table-with-cdc-and-dvs", "multipart", True),  # 26 commits, MERGE/OPTIMIZE
    ("delta-rs/table_with_column_mapping", "classic", True),  # partition key with spaces, name mapping
    ("kernel-rs/partition_cm/id", "classic", True),
    ("kernel-rs/app-txn-no-checkpoint", "classic", True),  # txn
    ("kernel-rs/crc-full", "classic", True),  # domainMetadata, row tracking
    ("delta-rs/table_with_liquid_clustering", "classic", True),  # clusteringProvider, domainMetadata
    ("kernel-rs/mixed-nulls", "classic", True),  # null partition values
    ("delta-rs/delta-0.8.0-special-partition", "classic", True),  # escaped partition paths
    ("delta-rs/simple_table", "multipart", True),  # 31 removes
    ("kernel-rs/v2-checkpoints-parquet-without-sidecars", "v2", True),  # a Spark V2 table
    ("delta-rs/checkpoints", "classic", False),  # log only: data files absent
]


@pytest.mark.parametrize(("name", "kind", "read_data"), CORPUS_TABLES, ids=[t[0] for t in CORPUS_TABLES])
def test_corpus_table_round_trips_through_our_checkpoint(
    corpus_dir: Path, name: str, kind: str, read_data: bool, tmp_path: Path
) -> None:
    table = corpus_dir / name
    kwargs: dict[str, Any] = {"kind": kind}
    if kind == "multipart":
        kwargs["part_size"] = 2
    if kind == "v2":
        kwargs["sidecar_size"] = 1
    state = log_state(table)
    result = roundtrip(table, tmp_path, read_data=read_data, **kwargs)
    written = [r for f in result.files for r in rows(f.data)]
    assert sum("domainMetadata" in r for r in written) == len(state.domain_metadata)
    assert sum("txn" in r for r in written) == len(state.txns)
    assert sum("remove" in r for r in written) == len(state.removes)


def test_300k_file_corpus_table_checkpoints_and_reads_back(corpus_dir: Path, tmp_path: Path) -> None:
    table = corpus_dir / "kernel-rs/300k-add-files-100-col-partitioned"
    state = log_state(table)
    result = build_checkpoint(state)
    assert result.num_add_files == 300_000 and result.num_actions == 300_002
    copy = publish(table, result, state.version, tmp_path / "copy")
    dt = DeltaTable(str(copy))
    assert dt.version() == 4 and len(dt.file_uris()) == 300_000
    assert build_checkpoint(log_state(table)).files[0].data == result.files[0].data  # deterministic


def test_feature_lists_are_written_only_with_reader_3_and_writer_7(appended_table: Path) -> None:
    state = log_state(appended_table)
    state.protocol = log_line(
        action(
            "protocol", protocol_body(1, 7, readerFeatures=["columnMapping"], writerFeatures=["appendOnly"])
        )
    )
    (protocol,) = [r["protocol"] for r in rows(build_checkpoint(state).files[0].data) if "protocol" in r]
    assert protocol == {
        "minReaderVersion": 1,
        "minWriterVersion": 7,
        "readerFeatures": None,
        "writerFeatures": ["appendOnly"],
    }


def test_a_line_longer_than_a_json_block_stays_on_the_fast_path() -> None:
    stats = json.dumps({"numRecords": 1, "minValues": {f"c{i}": "x" * 50 for i in range(120_000)}})
    lines = [json.dumps({"add": {"path": "big", "partitionValues": {}, "size": 1, "stats": stats}})]
    lines.append('{"add":{"path":"small","partitionValues":{},"size":2}}')
    parsed = ck._parse_fast(lines, "add", ck._Context(1, ()))  # _Fallback would raise here
    assert parsed.field("stats")[0].as_py() == stats
    block = ("\n".join(lines) + "\n").encode()
    assert ck._parse_block(block, "add", ck._Context(1, ())).equals(parsed)


def _blocks(lines: list[str], per_block: int) -> list[bytes]:
    return [
        "".join(line + "\n" for line in lines[i : i + per_block]).encode()
        for i in range(0, len(lines), per_block)
    ]


def test_add_blocks_give_the_checkpoint_the_add_lines_give(appended_table: Path) -> None:
    state = log_state(appended_table)
    expected = build_checkpoint(state).files[0].data
    lines, state.adds = list(state.adds), []
    state.add_blocks = _blocks(lines, len(lines))
    assert build_checkpoint(state).files[0].data == expected  # one block: the same bytes
    state.add_blocks = iter(_blocks(lines, 1))
    assert rows(build_checkpoint(state).files[0].data) == rows(expected)  # one line per block


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"add":{"path":"a","stats":{"numRecords":1}}}', "stats must be a string"),
        ("not json", "not valid JSON"),
        ('{"add":{"path":"a","size":"big"}}', "does not fit the checkpoint schema"),
    ],
)
def test_an_invalid_line_in_an_add_block_is_the_same_data_error(
    appended_table: Path, line: str, message: str
) -> None:
    state = log_state(appended_table)
    lines, state.adds = list(state.adds), []
    state.add_blocks = _blocks([*lines, line], 2)
    with pytest.raises(InvalidActionError, match=re.escape(message)):
        build_checkpoint(state)


def test_partition_values_are_dictionary_encoded_and_paths_and_stats_are_not(tmp_path: Path) -> None:
    # unique per file, a dictionary on paths and stats is built, overflows and is thrown away
    path = tmp_path / "parted"
    write_deltalake(
        str(path), pa.table({"id": list(range(40)), "p": ["a", "b"] * 20}), partition_by=["p"], mode="append"
    )
    meta = pq.ParquetFile(pa.BufferReader(build_checkpoint(log_state(path)).files[0].data)).metadata
    encodings = {
        meta.row_group(0).column(i).path_in_schema: set(meta.row_group(0).column(i).encodings)
        for i in range(meta.num_columns)
    }
    dictionary = {"PLAIN_DICTIONARY", "RLE_DICTIONARY"}
    assert encodings["add.partitionValues.key_value.value"] & dictionary
    assert not encodings["add.path"] & dictionary
    assert not encodings["add.stats"] & dictionary


def test_a_lone_surrogate_in_an_add_line_is_a_data_error(appended_table: Path) -> None:
    state = log_state(appended_table)
    state.adds = [*state.adds, '{"add":{"path":"\ud800","partitionValues":{},"size":1}}']
    with pytest.raises(InvalidActionError):
        build_checkpoint(state)
