"""Specification of what the store indexes of each imported line (``delta/line_facts.py``).

From PROTOCOL.md: a file action is known by its path and its deletion vector's unique id
(``storageType + pathOrInlineDv [+ "@" + offset]``); an ``add`` carries ``size`` and
``partitionValues`` (string or null values), a ``remove`` its ``deletionTimestamp``; the
in-commit timestamp is the ``inCommitTimestamp`` of the ``commitInfo`` that must come first in the
commit. Readers ignore unknown fields beside an action. A boolean where an integer belongs is no
Delta value and refuses the import naming the line; other odd values are not indexed.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from delta_mirror.delta.actions import line_action
from delta_mirror.delta.line_facts import (
    REPAIR_HINT,
    LineFacts,
    facts_of_lines,
    facts_of_objects,
    file_action,
    partition_values_text,
)
from delta_mirror.errors import InvalidActionError

#: A deletion vector in a file of its own (storage type "p": an absolute path), 36 bytes at offset 1.
DV = {
    "storageType": "p",
    "pathOrInlineDv": "s3://bucket/t/dv.bin",
    "offset": 1,
    "sizeInBytes": 36,
    "cardinality": 2,
}


@pytest.mark.parametrize(
    ("kind", "body", "facts"),
    [
        ("add", {"path": "a.parquet", "size": 10, "partitionValues": {}}, (0, "add", "a.parquet", "", 10, "{}", None)),
        (
            "add",
            {"path": "p=x/a.parquet", "size": 0, "partitionValues": {"p": "x", "q": None}},
            (0, "add", "p=x/a.parquet", "", 0, '{"p":"x","q":null}', None),
        ),
        (
            "add",
            {"path": "a.parquet", "size": 10, "partitionValues": {}, "deletionVector": DV},
            (0, "add", "a.parquet", "ps3://bucket/t/dv.bin@1", 10, "{}", None),
        ),  # the DV's unique id: storage type + path or inline DV + "@" + offset
        (
            "add",
            {"path": "a.parquet", "size": 10, "partitionValues": {}, "deletionVector": {"storageType": "p", "pathOrInlineDv": "/x/dv.bin"}},
            (0, "add", "a.parquet", "p/x/dv.bin", 10, "{}", None),
        ),  # no offset: none in the id
        ("add", {"path": "a.parquet"}, (0, "add", "a.parquet", "", None, None, None)),  # missing: not indexed
        ("add", {"size": "10", "partitionValues": None}, (0, "add", "", "", None, None, None)),  # odd values: not indexed
        ("remove", {"path": "a.parquet", "deletionTimestamp": 7, "size": 10}, (0, "remove", "a.parquet", "", None, None, 7)),
        ("remove", {"path": "a.parquet", "deletionTimestamp": 1.5}, (0, "remove", "a.parquet", "", None, None, None)),
        ("remove", {"path": "a.parquet", "deletionVector": DV}, (0, "remove", "a.parquet", "ps3://bucket/t/dv.bin@1", None, None, None)),
    ],
    ids=["add", "partitioned", "with-dv", "dv-without-offset", "minimal-add", "odd-add", "remove", "float-timestamp", "remove-with-dv"],
)  # fmt: skip
def test_a_file_action_is_indexed_by_path_dv_id_and_its_own_fields(
    kind: str, body: dict[str, Any], facts: tuple[Any, ...]
) -> None:
    assert file_action(0, kind, body) == facts


@pytest.mark.parametrize(
    ("lines", "kinds", "files", "ict"),
    [
        (
            [{"commitInfo": {"inCommitTimestamp": 5}}, {"add": {"path": "a", "size": 1, "partitionValues": {}}}],
            ["commitInfo", "add"],
            [(1, "add", "a", "", 1, "{}", None)],
            5,
        ),
        (
            [{"add": {"path": "a", "size": 1, "partitionValues": {}}}, {"commitInfo": {"inCommitTimestamp": 5}}],
            ["add", "commitInfo"],
            [(0, "add", "a", "", 1, "{}", None)],
            None,
        ),  # only a leading commitInfo holds the in-commit timestamp
        (
            [{"protocol": {}}, {"metaData": {}}, {"txn": {}}, {"remove": {"path": "b", "deletionTimestamp": 2}}],
            ["protocol", "metaData", "txn", "remove"],
            [(3, "remove", "b", "", None, None, 2)],
            None,
        ),  # seq is the line's place in the commit
        (
            [{"add": {"path": "a"}, "futureField": {"x": 1}}, {"futureAction": {"y": 2}}],
            ["add", "futureAction"],
            [(0, "add", "a", "", None, None, None)],
            None,
        ),  # unknown keys beside an action are skipped; an unknown action is named by its key
    ],
    ids=["commit-info-first", "commit-info-later", "other-actions", "unknown-keys"],
)  # fmt: skip
def test_the_facts_of_a_commit_are_its_line_kinds_file_actions_and_in_commit_timestamp(
    lines: list[dict[str, Any]], kinds: list[str], files: list[tuple[Any, ...]], ict: int | None
) -> None:
    expected = LineFacts(kinds, files, ict)
    assert facts_of_objects(lines) == expected
    assert facts_of_lines(json.dumps(line) for line in lines) == expected
    one_by_one = LineFacts()
    for line in lines:
        one_by_one.add(*line_action(line))
    assert one_by_one == expected  # LineFacts.add and the inlined loop agree


@pytest.mark.parametrize(
    ("lines", "refusal"),
    [
        (
            [{"commitInfo": {}}, {"add": {"path": "b", "size": True}}],
            "table 't', version 2: line 2: the add action's 'size' is true, not an integer",
        ),
        (
            [{"remove": {"path": "b", "deletionTimestamp": False}}],
            "table 't', version 2: line 1: the remove action's 'deletionTimestamp' is false, not an integer",
        ),
    ],
)
def test_a_boolean_where_the_store_indexes_an_integer_refuses_the_import_naming_the_line(
    lines: list[dict[str, Any]], refusal: str
) -> None:
    with pytest.raises(InvalidActionError) as refused:
        facts_of_objects(lines, table="t", version=2)
    assert refused.value.message == f"{refusal} — {REPAIR_HINT}"


@pytest.mark.parametrize(
    ("values", "text"),
    [
        ({}, "{}"),
        ({"p": "x", "q": None}, '{"p":"x","q":null}'),  # compact, nulls kept
        ({"city": "Zürich"}, '{"city":"Zürich"}'),  # not escaped to ASCII
        ({"b": "1", "a": "2"}, '{"b":"1","a":"2"}'),  # the writer's key order
        ({"n": 1}, '{"n":1}'),  # not strings: encoded as they are
        (["x"], '["x"]'),
    ],
)
def test_partition_values_are_stored_as_compact_json_in_the_writers_order(values: Any, text: str) -> None:
    assert partition_values_text(values) == text
    assert partition_values_text(values) == text  # the remembered answer is the same
