"""Specification of the publisher's re-check of stored lines (``delta/stored_commit.py``), case by case.

A version's stored lines become its commit file, so each must be one JSON object per line with
one action readers can tell (PROTOCOL.md: readers ignore unknown actions and fields, so an
imported line keeps what its writer put beside the action); a native commit's lines must also
pass the rules ``SqlStore.commit`` applied (one key, required fields, paths inside the table
root). A store written around delta-mirror halts the table at that version with one message
naming the line, never a file readers would choke on. The fast path for canonical adds and plain
commitInfo lines must accept exactly what the full check accepts.
"""

from __future__ import annotations

import pytest

from delta_mirror.delta.stored_commit import check_stored_commit
from delta_mirror.errors import InvalidActionError

ROOT = "s3://bucket/table"
HINT = "the store was written outside delta-mirror; repair or restore this version, then resume"


def add_line(path: str = "part-0.parquet", rest: str = "") -> str:
    """A canonical add (Delta-Spark's key order, no blanks): the publisher's fast path."""
    return (
        f'{{"add":{{"path":"{path}","partitionValues":{{}},"size":10,"modificationTime":1,'
        f'"dataChange":true{rest}}}}}'
    )


SPACED_ADD = '{"add": {"path": "part-0.parquet", "partitionValues": {}, "size": 10, "modificationTime": 1, "dataChange": true}}'
GOOD = [
    add_line(),
    add_line("p=1/part-0.parquet", ',"stats":"{\\"numRecords\\":1}"'),
    SPACED_ADD,  # not canonical: parsed and checked in full, same verdict
    '{"remove":{"path":"part-0.parquet","deletionTimestamp":1,"dataChange":true}}',
    '{"commitInfo":{"timestamp":1,"operation":"WRITE"}}',
    '{"protocol":{"minReaderVersion":1,"minWriterVersion":2}}',
    '{"txn":{"appId":"app","version":3}}',
]


@pytest.mark.parametrize("native", [True, False], ids=["native", "imported"])
@pytest.mark.parametrize(
    "line", GOOD, ids=["add", "add-with-stats", "spaced-add", "remove", "commitInfo", "protocol", "txn"]
)
def test_a_well_formed_stored_line_is_published(line: str, native: bool) -> None:
    check_stored_commit([line], table="t", version=3, location=ROOT, native=native)


@pytest.mark.parametrize(
    ("lines", "native_refusal", "imported_refusal"),
    [
        ([], "the stored commit holds no actions", "the stored commit holds no actions"),
        (["not json"], "stored action 1 is not valid UTF-8 JSON (JSONDecodeError)", "stored action 1 is not valid UTF-8 JSON (JSONDecodeError)"),
        ([add_line() + "\n" + add_line("b")], "stored action 1 is not valid UTF-8 JSON (JSONDecodeError)", "stored action 1 is not valid UTF-8 JSON (JSONDecodeError)"),  # a raw newline
        (['{"commitInfo":{"x":"\ud800"}}'], "stored action 1 is not valid UTF-8 JSON (UnicodeEncodeError)", "stored action 1 is not valid UTF-8 JSON (UnicodeEncodeError)"),  # a lone surrogate
        (["[1]"], "stored action 1 is not one JSON object with one key", "stored action 1 is not one JSON object"),
        (["{}"], "stored action 1 is not one JSON object with one key", "stored line 1 is an empty object, not an action"),
        (['{"add":{},"remove":{}}'], "stored action 1 is not one JSON object with one key", "stored line 1 holds 2 actions ('add', 'remove'), not one"),
        (['{"add":1}'], "stored action 1 (add) has no object body", "stored action 1 (add) has no object body"),
        ([GOOD[4], '{"txn":{"appId":"a","version":1},"x":1}'], "stored action 2 is not one JSON object with one key", None),  # a field beside it
        (['{"futureAction":1}'], "stored action 1 (futureAction) has no object body", None),  # unknown: readers skip it
        ([add_line("../x.parquet")], "stored action 1 (add): path '../x.parquet' escapes the table root", None),
        ([add_line("_delta_log/x.json")], "stored action 1 (add): path '_delta_log/x.json' points into _delta_log/", None),
        ([add_line("s3://other/x.parquet")], "stored action 1 (add): path 's3://other/x.parquet' is outside the table root s3://bucket/table", None),
        ([add_line().replace('"size":10', '"size":-1')], "stored action 1 (add): size must not be negative (got -1)", None),
        ([add_line().replace('"size":10', '"size":true')], "stored action 1 (add): field 'size' must be an integer", None),
        ([add_line().replace("{}", '{"p":1}', 1)], "stored action 1 (add): 'partitionValues' must map strings to strings (or null)", None),
        (['{"commitInfo":{"timestamp":1.5}}'], "stored action 1 (commitInfo): field 'timestamp' must be int, got float", None),
        (['{"metaData":{"id":"x"}}'], "stored action 1 (metaData): missing required field 'format'", None),
    ],
    ids=[
        "empty", "not-json", "raw-newline", "lone-surrogate", "not-an-object", "no-key", "two-actions",
        "body-not-an-object", "second-line-extra-key", "unknown-action-no-body", "path-escapes-root",
        "path-into-delta-log", "path-outside-root", "negative-size", "boolean-size", "partition-value-not-text",
        "float-timestamp", "metadata-missing-format",
    ],
)  # fmt: skip
def test_a_stored_line_readers_would_choke_on_halts_publishing_naming_the_line(
    lines: list[str], native_refusal: str, imported_refusal: str | None
) -> None:
    """``imported_refusal`` None: an imported line is kept as its writer wrote it and passes."""
    for native, refusal in ((True, native_refusal), (False, imported_refusal)):
        if refusal is None:
            check_stored_commit(lines, table="t", version=3, location=ROOT, native=native)
            continue
        with pytest.raises(InvalidActionError) as refused:
            check_stored_commit(lines, table="t", version=3, location=ROOT, native=native)
        hint = f" — {HINT}" if lines else ""  # every refusal of a line says what to do
        assert refused.value.message == f"table 't', version 3: {refusal}{hint}", native
        assert str(refused.value) == refused.value.message  # what a log line or CLI prints


def test_the_line_named_is_the_first_bad_one_among_good_ones() -> None:
    lines = [GOOD[4], add_line(), add_line("b.parquet"), add_line("../c.parquet"), add_line("../d.parquet")]
    with pytest.raises(InvalidActionError) as refused:
        check_stored_commit(lines, table="t", version=3, location=ROOT, native=True)
    assert refused.value.what == "stored action 4 (add): path '../c.parquet' escapes the table root"
