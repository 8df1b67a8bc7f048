"""Specification of Delta actions: strict parsing, validation and canonical encoding (no database)."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from support.builders import add_body, metadata_body

from delta_mirror.delta import stored_commit
from delta_mirror.delta.actions import (
    KNOWN_ACTIONS,
    SPARK_KEY_ORDER,
    canonical_json,
    canonical_line,
    check_data_path,
    dv_id,
    line_action,
    parse_actions,
    render_commit,
    spark_ordered,
    validate_action,
)
from delta_mirror.delta.stored_commit import check_stored_commit
from delta_mirror.errors import DataError, InvalidActionError

ROOT = "s3://bucket/table"


def _add(**extra: Any) -> dict[str, Any]:
    return add_body(**{"path": "part-0.parquet", "size": 10, **extra})


def _metadata(**extra: Any) -> dict[str, Any]:
    return metadata_body(
        id="id-1", schema_string=json.dumps({"type": "struct", "fields": []}), created_time=None, **extra
    )


def _validate(kind: str, body: dict[str, object]) -> None:
    validate_action(kind, body, number=1, table="t", version=3, location=ROOT)


# -- canonical encoding ----------------------------------------------------------------------------


def test_canonical_json_keeps_every_key_of_a_line_and_refuses_nan() -> None:
    line = {"commitInfo": {"b": 1, "a": "ü"}, "someFutureAction": [1, None]}
    assert canonical_json(line) == '{"commitInfo":{"b":1,"a":"ü"},"someFutureAction":[1,null]}'
    assert canonical_line("commitInfo", {"b": 1}) == canonical_json({"commitInfo": {"b": 1}})
    with pytest.raises(InvalidActionError, match="cannot be encoded as JSON"):
        canonical_line("add", {"size": float("nan")})


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ({"add": {"path": "p"}}, ("add", {"path": "p"})),
        ({"commitInfo": {}, "some_future_action": [1]}, ("commitInfo", {})),  # unknown key ignored
        ({"x_future": 1, "add": {"path": "p"}}, ("add", {"path": "p"})),  # wherever it sits
        ({"futureAction": [1], "other": 2}, ("futureAction", [1])),  # only unknown: the first
    ],
)
def test_line_action_is_the_known_action_of_a_line(line: dict[str, Any], expected: tuple[str, Any]) -> None:
    assert line_action(line) == expected


@pytest.mark.parametrize(("line", "match"), [({"add": {}, "remove": {}}, "holds 2 actions"), ({}, "empty")])
def test_line_action_refuses_ambiguous_lines(line: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        line_action(line)


def test_native_commits_stay_one_action_per_line_imported_ones_may_carry_unknown_keys() -> None:
    line = '{"commitInfo":{"timestamp":1},"some_future_action":[1]}'
    with pytest.raises(InvalidActionError, match="exactly one key"):
        parse_actions(line.encode() + b"\n", table="t")
    with pytest.raises(InvalidActionError, match="not one JSON object with one key"):
        check_stored_commit([line], table="t", version=1, location=ROOT, native=True)
    check_stored_commit([line, '{"futureAction":[1]}'], table="t", version=1, location=ROOT, native=False)
    with pytest.raises(InvalidActionError, match=r"stored line 1 holds 2 actions"):
        check_stored_commit(['{"add":{},"txn":{}}'], table="t", version=1, location=ROOT, native=False)
    with pytest.raises(InvalidActionError, match="has no object body"):
        check_stored_commit(['{"add":[1],"x":1}'], table="t", version=1, location=ROOT, native=False)


_PLAIN = {
    "path": "p=1/a.parquet",
    "partitionValues": {"p": "1"},
    "size": 5,
    "modificationTime": 1,
    "dataChange": True,
}


@pytest.mark.parametrize(
    "change",
    [
        {},
        {"stats": '{"numRecords":1}', "tags": {"k": "v"}},
        {"path": "../escape.parquet"},
        {"path": "_delta_log/00000000000000000001.json"},
        {"path": "s3://other-bucket/x.parquet"},
        {"path": "a b/é.parquet"},
        {"path": 3},
        {"size": -1},
        {"size": 1.5},
        {"size": True},
        {"modificationTime": "1"},
        {"dataChange": 1},
        {"partitionValues": {"p": 1}},
        {"partitionValues": []},
        {"stats": 1},
        {"deletionVector": {"storageType": "u"}},
        {"deletionVector": {"storageType": "u", "pathOrInlineDv": "x", "sizeInBytes": 1, "cardinality": 1}},
    ],
)
def test_the_stored_check_of_an_add_refuses_what_validate_action_refuses(change: dict[str, Any]) -> None:
    """Publishing takes a fast path for plain adds: it must agree with the full check either way."""
    body = {**_PLAIN, **change}
    try:
        validate_action("add", body, number=1, table="t", version=3, location=ROOT)
        refused = None
    except InvalidActionError as exc:
        refused = exc.what
    lines = [canonical_json({"commitInfo": {}}), canonical_json({"add": body})]
    if refused is None:
        check_stored_commit(lines, table="t", version=3, location=ROOT, native=True)
    else:
        with pytest.raises(InvalidActionError) as caught:
            check_stored_commit(lines, table="t", version=3, location=ROOT, native=True)
        assert caught.value.what == f"stored {refused}".replace("action 1", "action 2")
    check_stored_commit(lines, table="t", version=3, location=ROOT, native=False)  # imported: kept as written


@pytest.mark.parametrize(
    "info",
    [
        {},
        {"timestamp": 1, "inCommitTimestamp": 2, "operation": "WRITE"},
        {"timestamp": None},
        {"timestamp": "yesterday"},
        {"timestamp": True},
        {"inCommitTimestamp": 1.5},
        {"inCommitTimestamp": False},
    ],
)
def test_stored_commit_info_is_refused_exactly_when_the_native_rule_refuses_it(info: dict[str, Any]) -> None:
    """The stored check's fast path for a commitInfo line agrees with ``validate_action``."""
    try:
        _validate("commitInfo", info)
        refused = None
    except InvalidActionError as exc:
        refused = exc.what
    lines = [canonical_json({"commitInfo": info}), canonical_json({"add": _PLAIN})]
    if refused is None:
        check_stored_commit(lines, table="t", version=3, location=ROOT, native=True)
    else:
        with pytest.raises(InvalidActionError) as caught:
            check_stored_commit(lines, table="t", version=3, location=ROOT, native=True)
        assert caught.value.what == f"stored {refused}"
    check_stored_commit(lines, table="t", version=3, location=ROOT, native=False)  # imported: kept as written


def _add_line_variants() -> list[str]:
    """Canonical add lines and near misses: each value the fast pattern must judge like the parser."""
    paths = [
        "p=1/a.parquet",
        ".x",
        "a/../b",
        "_delta_log/x",
        "_delta_logx",
        "a b.parquet",
        "é.parquet",
        "a\\b",
        "",
    ]
    values: list[Any] = ["1", None, "", 'q"uote', "back\\slash", "tab\t", "\u2028", "\ud800", "é", 1, True]
    out = []
    for path in paths:
        for value in values:
            body = {**_PLAIN, "path": path, "partitionValues": {"p": value, "k": "v"}}
            out.append(canonical_json({"add": body}))
    changes: list[dict[str, Any]] = [
        {"size": 0},
        {"size": -1},
        {"size": 1.5},
        {"size": 10**30},
        {"modificationTime": -5},
        {"modificationTime": "1"},
        {"dataChange": 1},
        {"stats": None},
        {"stats": '{"numRecords":1,"minValues":{"a":"\\"x"}}'},
        {"stats": 3},
        {"tags": {"k": "v"}},
        {"deletionVector": None},
        {"partitionValues": {}},
        {"partitionValues": []},
    ]
    for change in changes:
        out.append(canonical_json({"add": {**_PLAIN, **change}}))
    line = canonical_json({"add": _PLAIN})
    out += [line, line + " ", line.replace(":", ": ", 1), line[:-1], line.replace('"add"', '"remove"')]
    out += [line.replace("p=1", "p=\\u0031"), line.replace("p=1", "p=\x01"), line.replace("p=1", "p=\ud800")]
    out += [
        line.replace('"1"}', '"\\ud800"}'),
        line.replace('"1"}', '"\ud800"}'),
        line.replace('"1"}', '"\x1f"}'),
    ]
    return out


def test_the_stored_checks_fast_pattern_accepts_only_lines_the_full_check_accepts() -> None:
    """A line the pattern matches skips the parse, so it must be a plain add by the full rule; and
    the canonical plain adds publishing sees do match (the fast path is taken)."""
    matched = 0
    for line in _add_line_variants():
        if stored_commit._plain_add_matcher()(line) is None:
            continue
        matched += 1
        assert "\n" not in line and line.encode("utf-8")
        obj = json.loads(line)
        assert list(obj) == ["add"] and stored_commit._plain_add(obj["add"]), line
        check_stored_commit([line], table="t", version=3, location=ROOT, native=True)
    assert matched >= 20
    for change in ({}, {"stats": '{"numRecords":1}'}, {"partitionValues": {"p": None, "q": "é"}}):
        assert stored_commit._plain_add_matcher()(canonical_json({"add": {**_PLAIN, **change}})) is not None


def test_canonical_line_is_compact_utf8_with_non_ascii_unescaped() -> None:
    line = canonical_line("add", {"path": "é/ü ß.parquet", "partitionValues": {"k": "日本"}, "n": None})
    assert line == '{"add":{"path":"é/ü ß.parquet","partitionValues":{"k":"日本"},"n":null}}'
    assert "\\u" not in line


def test_render_commit_ends_every_line_with_a_newline_and_has_no_blank_lines() -> None:
    data = render_commit(['{"a":1}', '{"b":"é"}'])
    assert data == '{"a":1}\n{"b":"é"}\n'.encode()
    assert b"\n\n" not in data


@pytest.mark.parametrize("kind", sorted(SPARK_KEY_ORDER))
def test_known_keys_come_out_in_delta_spark_order_whatever_the_input_order(kind: str) -> None:
    order = SPARK_KEY_ORDER[kind]
    rng = random.Random(kind)
    for _ in range(5):
        shuffled = list(order)
        rng.shuffle(shuffled)
        body = {k: i for i, k in enumerate(shuffled)}
        assert list(spark_ordered(kind, body)) == list(order)


def test_add_comes_out_path_partition_values_size_modification_time_data_change_stats() -> None:
    body = {
        "stats": '{"numRecords":1}',
        "dataChange": True,
        "size": 3,
        "tags": {"a": "b"},
        "modificationTime": 2,
        "partitionValues": {"p": None},
        "path": "x.parquet",
    }
    assert list(spark_ordered("add", body)) == [
        "path",
        "partitionValues",
        "size",
        "modificationTime",
        "dataChange",
        "stats",
        "tags",
    ]


def test_remove_puts_stats_last_as_delta_spark_writes_it() -> None:
    # Delta-Spark's RemoveFile declares stats after defaultRowCommitVersion:
    # {"remove":{"path":..,"deletionTimestamp":..,"dataChange":..,"extendedFileMetadata":..,
    #  "partitionValues":..,"size":..,"tags":..,"deletionVector":..,"stats":..}}
    body = {
        "stats": "{}",
        "size": 1,
        "tags": {},
        "deletionVector": {"storageType": "u", "pathOrInlineDv": "ab", "sizeInBytes": 1, "cardinality": 1},
        "path": "x",
        "dataChange": True,
        "deletionTimestamp": 5,
        "extendedFileMetadata": True,
        "partitionValues": {},
    }
    assert list(spark_ordered("remove", body)) == [
        "path",
        "deletionTimestamp",
        "dataChange",
        "extendedFileMetadata",
        "partitionValues",
        "size",
        "tags",
        "deletionVector",
        "stats",
    ]


def test_cdc_puts_tags_before_data_change_as_delta_spark_writes_it() -> None:
    body = {"dataChange": False, "tags": {"a": "b"}, "size": 1, "partitionValues": {}, "path": "c"}
    assert list(spark_ordered("cdc", body)) == ["path", "partitionValues", "size", "tags", "dataChange"]


def test_commit_info_puts_in_commit_timestamp_first() -> None:
    body = {"operation": "WRITE", "timestamp": 2, "inCommitTimestamp": 3}
    assert list(spark_ordered("commitInfo", body)) == ["inCommitTimestamp", "timestamp", "operation"]


def test_unknown_fields_are_kept_after_known_ones_in_their_given_order() -> None:
    body = {"zeta": 1, "size": 1, "alpha": {"b": 1, "a": 2}, "path": "x"}
    out = spark_ordered("add", body)
    assert list(out) == ["path", "size", "zeta", "alpha"]
    assert list(out["alpha"]) == ["b", "a"]


def test_unknown_action_bodies_keep_their_key_order() -> None:
    body = {"b": 1, "a": 2}
    assert list(spark_ordered("somethingNew", body)) == ["b", "a"]


def test_deletion_vector_and_format_keys_are_ordered_too() -> None:
    dv = {"cardinality": 1, "sizeInBytes": 2, "offset": 1, "pathOrInlineDv": "p", "storageType": "u"}
    out = spark_ordered("add", _add(deletionVector=dv))
    assert list(out["deletionVector"]) == [
        "storageType",
        "pathOrInlineDv",
        "offset",
        "sizeInBytes",
        "cardinality",
    ]
    md = spark_ordered("metaData", _metadata(format={"options": {}, "provider": "parquet"}))
    assert list(md["format"]) == ["provider", "options"]


def test_deletion_vector_id_is_storage_type_path_and_offset() -> None:
    assert dv_id(None) == ""
    assert dv_id({}) == ""
    assert (
        dv_id({"storageType": "u", "pathOrInlineDv": "ab^-aqEH.-t@S}K{vb[*k^"}) == "uab^-aqEH.-t@S}K{vb[*k^"
    )
    assert dv_id({"storageType": "p", "pathOrInlineDv": "s3://b/dv.bin", "offset": 4}) == "ps3://b/dv.bin@4"


# -- protocol rules ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [
        {
            "minReaderVersion": 3,
            "minWriterVersion": 7,
            "readerFeatures": ["deletionVectors"],
            "writerFeatures": ["deletionVectors"],
        },
        {"minReaderVersion": 1, "minWriterVersion": 7, "writerFeatures": ["appendOnly"]},
        {"minReaderVersion": 1, "minWriterVersion": 2},
        {"minReaderVersion": 2, "minWriterVersion": 5},
    ],
)
def test_valid_protocols_are_accepted(body: dict[str, object]) -> None:
    _validate("protocol", body)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            {"minReaderVersion": 2, "minWriterVersion": 7, "readerFeatures": [], "writerFeatures": []},
            "readerFeatures is only allowed with minReaderVersion 3",
        ),
        (
            {"minReaderVersion": 1, "minWriterVersion": 5, "writerFeatures": ["appendOnly"]},
            "writerFeatures is only allowed with minWriterVersion 7",
        ),
        (
            {"minReaderVersion": 3, "minWriterVersion": 7, "writerFeatures": []},
            "minReaderVersion 3 needs readerFeatures",
        ),
        ({"minReaderVersion": 1, "minWriterVersion": 7}, "minWriterVersion 7 needs writerFeatures"),
        (
            {"minReaderVersion": 3, "minWriterVersion": 5, "readerFeatures": []},
            "minReaderVersion 3 needs minWriterVersion 7",
        ),
        ({"minReaderVersion": 1, "minWriterVersion": 7, "writerFeatures": "appendOnly"}, "list of strings"),
        ({"minWriterVersion": 2}, "missing required field 'minReaderVersion'"),
        ({"minReaderVersion": 0, "minWriterVersion": 2}, "must be positive"),
    ],
)
def test_protocol_features_must_match_the_protocol_versions(body: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidActionError, match=message) as info:
        _validate("protocol", body)
    assert info.value.table == "t" and info.value.version == 3


# -- required fields and types -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "body", "message"),
    [
        ("add", {k: v for k, v in _add().items() if k != "path"}, "missing required field 'path'"),
        ("add", {k: v for k, v in _add().items() if k != "size"}, "missing required field 'size'"),
        (
            "add",
            {k: v for k, v in _add().items() if k != "dataChange"},
            "missing required field 'dataChange'",
        ),
        ("add", {k: v for k, v in _add().items() if k != "modificationTime"}, "'modificationTime'"),
        ("add", {k: v for k, v in _add().items() if k != "partitionValues"}, "'partitionValues'"),
        ("add", _add(size=-1), "size must not be negative"),
        ("add", _add(size=True), "must be an integer"),
        ("add", _add(size="10"), "must be int"),
        ("add", _add(stats={"numRecords": 1}), "'stats' must be str"),
        ("add", _add(partitionValues={"p": 1}), "must map strings to strings"),
        ("add", _add(deletionVector={"storageType": "u"}), "deletionVector: missing required field"),
        ("remove", {"path": "x"}, "missing required field 'dataChange'"),
        ("remove", {"path": "x", "dataChange": True, "size": -5}, "size must not be negative"),
        ("metaData", {k: v for k, v in _metadata().items() if k != "schemaString"}, "'schemaString'"),
        ("metaData", _metadata(schemaString="{not json"), "schemaString is not valid JSON"),
        ("metaData", _metadata(schemaString='{"type":"array"}'), "must be a struct type"),
        ("metaData", {k: v for k, v in _metadata().items() if k != "id"}, "'id'"),
        ("metaData", _metadata(configuration={"a": 1}), "must map strings to strings"),
        ("txn", {"appId": "a"}, "missing required field 'version'"),
        ("domainMetadata", {"domain": "d", "configuration": "{}"}, "'removed'"),
        ("commitInfo", {"timestamp": "yesterday"}, "'timestamp' must be int"),
        ("commitInfo", {"inCommitTimestamp": 1.5}, "'inCommitTimestamp' must be int"),
        ("somethingNew", {"a": 1}, "unknown action type 'somethingNew'"),
        ("sidecar", {"path": "x"}, "unknown action type 'sidecar'"),
    ],
)
def test_actions_without_their_required_fields_are_refused(
    kind: str, body: dict[str, object], message: str
) -> None:
    with pytest.raises(InvalidActionError, match=message) as info:
        _validate(kind, body)
    assert isinstance(info.value, DataError)
    assert "table 't', version 3" in info.value.message


def test_complete_actions_are_accepted() -> None:
    _validate("add", _add(stats='{"numRecords":1}', tags={"a": "b"}, partitionValues={"p": None}))
    _validate("remove", {"path": "x", "dataChange": True, "deletionTimestamp": 1})
    _validate("metaData", _metadata())
    _validate("txn", {"appId": "a", "version": 1})
    _validate("domainMetadata", {"domain": "d", "configuration": "{}", "removed": False})
    _validate("commitInfo", {"timestamp": 1, "operation": "WRITE", "anything": [1, 2]})
    _validate(
        "cdc", {"path": "_change_data/c.parquet", "partitionValues": {}, "size": 1, "dataChange": False}
    )
    assert "add" in KNOWN_ACTIONS


# -- paths stay inside the table root -----------------------------------------------------------------


@pytest.mark.parametrize(
    "path",
    [
        "../x",
        "a/../../x",
        "a/../b",
        "%2E%2E/x",
        "%2e%2e/x",
        "a/%2E%2E/%2E%2E/x",
        "s3://other-bucket/x",
        "s3://bucket/table-other/x",
        "s3://bucket/table/../x",
        "/abs/path",
        "%2Fabs/path",
        "file:///etc/passwd",
        "_delta_log/00000000000000000000.json",
        "a\\..\\x",
        "",
    ],
)
def test_data_paths_escaping_the_table_root_are_refused(path: str) -> None:
    with pytest.raises(InvalidActionError) as info:
        check_data_path(path, table="t", version=1, where="action 1 (add)", location=ROOT)
    assert info.value.table == "t"


@pytest.mark.parametrize(
    "path",
    ["x.parquet", "p=1/x.parquet", "p=a%20b/x%3A1.parquet", "s3://bucket/table/p=1/x.parquet", "deep/er/x"],
)
def test_data_paths_inside_the_table_root_are_accepted(path: str) -> None:
    check_data_path(path, table="t", version=1, where="action 1 (add)", location=ROOT)


# -- strict parsing of native commits ---------------------------------------------------------------


def test_parse_keeps_action_order_key_order_and_unknown_fields() -> None:
    data = b'{"add":{"size":1,"path":"x","zzz":{"b":1,"a":2}}}\n\n{"txn":{"appId":"a","version":1}}\n'
    actions = parse_actions(data, table="t")
    assert [k for k, _ in actions] == ["add", "txn"]
    assert list(actions[0][1]) == ["size", "path", "zzz"]
    assert list(actions[0][1]["zzz"]) == ["b", "a"]


def test_parse_accepts_crlf_and_a_missing_final_newline() -> None:
    actions = parse_actions(
        b'{"txn":{"appId":"a","version":1}}\r\n{"txn":{"appId":"b","version":1}}', table="t"
    )
    assert [b["appId"] for _, b in actions] == ["a", "b"]


def test_parse_keeps_line_separator_characters_inside_json_strings() -> None:
    # U+2028 / U+0085 are valid unescaped inside JSON strings; only '\n' separates actions.
    line = '{"commitInfo":{"userMetadata":"a\u2028b\x85c\u2029d"}}'
    actions = parse_actions(line.encode(), table="t")
    assert actions == [("commitInfo", {"userMetadata": "a\u2028b\x85c\u2029d"})]
    assert canonical_line(*actions[0]) == line


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b'{"add":{"path":"x"}\n', "line 1: malformed JSON"),
        (b'{"txn":{"appId":"a","version":1}}\n{"add":\n', "line 2: malformed JSON"),
        (b'{"add":{"path":"x","n":NaN}}\n', "line 1: malformed JSON"),
        (b'{"add":{"path":"x","n":Infinity}}\n', "line 1: malformed JSON"),
        (b"[1,2]\n", "exactly one key"),
        (b'{"add":{},"remove":{}}\n', "exactly one key"),
        (b"{}\n", "exactly one key"),
        (b'{"add":[1]}\n', "must be a JSON object"),
        (b"\n\n", "no actions"),
        (b"\xff\xfe{}", "not valid UTF-8"),
        (b'{"add":{"path":"caf\xe9"}}', "not valid UTF-8"),
    ],
)
def test_malformed_input_is_refused_with_the_line_and_table(data: bytes, message: str) -> None:
    with pytest.raises(InvalidActionError, match=message) as info:
        parse_actions(data, table="t")
    assert info.value.table == "t"
    assert "\n" not in info.value.message
