"""Specification of what import demands of a source log (``delta.source_state``): the rule for
invalid logs, and how a source checkpoint's state is compared with the JSON replay. Pure: no
database, no files."""

from __future__ import annotations

import json
from typing import Any

import pytest
from support.builders import SCHEMA_STRING, action, add, log_line, metadata_body, protocol_body, remove

from delta_mirror.delta.replay import FileKey
from delta_mirror.delta.source_state import (
    Disagreement,
    ReplayState,
    SegmentCheck,
    check_action,
    check_checkpoint,
    check_segment,
    check_supported,
    checkpoint_state,
    compare_to_checkpoint,
    require_state,
)
from delta_mirror.errors import DataError, UnsupportedTableError

PROTOCOL = log_line(action("protocol", protocol_body()))
METADATA = log_line(action("metaData", metadata_body()))
EXTRA = {"name": "extra", "type": "string", "nullable": True, "metadata": {}}
SCHEMA = json.dumps({"type": "struct", "fields": [*json.loads(SCHEMA_STRING)["fields"], EXTRA]})


def _lines(*actions: dict[str, Any]) -> list[str]:
    return [log_line(a) for a in actions]


# -- the rule for invalid logs ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "body", "problem"),
    [
        ("protocol", protocol_body(1, 2), None),
        ("protocol", {"minWriterVersion": 2}, "has no integer 'minReaderVersion'"),
        ("protocol", {"minReaderVersion": 1, "minWriterVersion": "2"}, "has no integer 'minWriterVersion'"),
        ("protocol", {"minReaderVersion": True, "minWriterVersion": 2}, "has no integer 'minReaderVersion'"),
        ("metaData", metadata_body(), None),
        ("metaData", {**metadata_body(), "id": 7}, "has no 'id' (a string)"),
        ("metaData", {**metadata_body(), "format": {}}, "has no 'format' with a 'provider'"),
        (
            "metaData",
            {**metadata_body(), "partitionColumns": [1]},
            "has no 'partitionColumns' (a list of strings)",
        ),
        ("metaData", {**metadata_body(), "schemaString": None}, "has no 'schemaString'"),
        ("metaData", {**metadata_body(), "schemaString": "{"}, "has a 'schemaString' that"),
        ("add", {"anything": 1}, None),
    ],
    ids=[
        "protocol-ok",
        "protocol-no-reader-version",
        "protocol-writer-version-text",
        "protocol-boolean-version",
        "metadata-ok",
        "metadata-id-not-text",
        "metadata-no-provider",
        "metadata-partition-columns-not-text",
        "metadata-no-schema",
        "metadata-schema-not-json",
        "other-actions-pass",
    ],
)
def test_check_action_refuses_a_protocol_or_metadata_no_reader_can_use(
    kind: str, body: dict[str, Any], problem: str | None
) -> None:
    def run() -> None:
        check_action(kind, body, table="t", version=3, where="commit")

    if problem is None:
        run()
        return
    with pytest.raises(DataError) as info:
        run()
    err = info.value
    assert err.what.startswith(f"cannot import: the {kind} action of commit 3 {problem}")
    assert err.what.endswith("no Delta reader can reconstruct version 3")
    assert (err.table, err.version) == ("t", 3) and err.hint and "repair" in err.hint


@pytest.mark.parametrize(
    ("protocol", "metadata", "missing"),
    [
        (protocol_body(), metadata_body(), None),
        (None, metadata_body(), "protocol"),
        (protocol_body(), None, "metaData"),
        ("not a dict", metadata_body(), "protocol"),
    ],
    ids=["both", "no-protocol", "no-metadata", "protocol-not-an-object"],
)
def test_require_state_needs_a_protocol_and_a_metadata(
    protocol: Any, metadata: Any, missing: str | None
) -> None:
    if missing is None:
        require_state(protocol, metadata, table="t", version=2, where="checkpoint")
        return
    with pytest.raises(DataError, match=f"checkpoint 2 has no {missing} action"):
        require_state(protocol, metadata, table="t", version=2, where="checkpoint")


@pytest.mark.parametrize(
    ("protocol", "configuration", "refusal"),
    [
        (protocol_body(1, 2), {}, None),
        (protocol_body(3, 7, ["deletionVectors"], ["deletionVectors"]), {}, None),
        (protocol_body(3, 7, ["catalogManaged"], ["catalogManaged"]), {}, "catalogManaged table feature"),
        (
            protocol_body(1, 2),
            {"delta.coordinatedCommits.commitCoordinator-preview": "x"},
            "coordinated commits",
        ),
        (protocol_body(3, 7, ["someFutureFeature"], []), {}, "unknown reader feature(s) 'someFutureFeature'"),
    ],
    ids=["plain", "known-feature", "catalog-owned", "coordinated-commits", "unknown-reader-feature"],
)
def test_check_supported_refuses_tables_we_cannot_carry_naming_the_feature(
    protocol: dict[str, Any], configuration: dict[str, str], refusal: str | None
) -> None:
    metadata = metadata_body(configuration=configuration)
    if refusal is None:
        check_supported(protocol, metadata, table="t")
        return
    with pytest.raises(UnsupportedTableError) as info:
        check_supported(protocol, metadata, table="t")
    assert info.value.what.startswith("cannot import: ") and refusal in info.value.what


# -- a segment: the base checkpoint and the commits ----------------------------------------------------


def _commit(version: int, *lines: str) -> tuple[int, list[str], bytes]:
    return (version, list(lines), b"")


NEW_METADATA = log_line(action("metaData", metadata_body(name="renamed")))


@pytest.mark.parametrize(
    ("base", "commits", "start", "refusal"),
    [
        (None, [_commit(0, PROTOCOL, METADATA), _commit(1, NEW_METADATA)], 0, None),
        ([PROTOCOL, METADATA], [_commit(6, log_line(add("a")))], 5, None),
        ([PROTOCOL, METADATA], [], 5, None),
        (None, [_commit(0, METADATA)], 0, "the table at version 0 has no protocol action"),
        (None, [_commit(0, PROTOCOL)], 0, "the table at version 0 has no metaData action"),
        ([PROTOCOL], [], 5, "checkpoint 5 has no metaData action"),
        (
            None,
            [
                _commit(0, PROTOCOL, METADATA),
                _commit(1, log_line(action("protocol", {"minReaderVersion": 1}))),
            ],
            0,
            "the protocol action of commit 1 has no integer 'minWriterVersion'",
        ),
    ],
    ids=[
        "from-version-0",
        "from-a-checkpoint",
        "a-checkpoint-alone",
        "first-commit-without-protocol",
        "first-commit-without-metadata",
        "checkpoint-without-metadata",
        "a-later-bad-protocol",
    ],
)
def test_check_segment_refuses_what_no_reader_can_reconstruct(
    base: list[str] | None, commits: list[tuple[int, list[str], bytes]], start: int, refusal: str | None
) -> None:
    if refusal is None:
        state = check_segment(base, commits, start, table="t")
        assert state.protocol == protocol_body() and state.metadata is not None
        return
    with pytest.raises(DataError) as info:
        check_segment(base, commits, start, table="t")
    assert refusal in info.value.what


def test_check_segment_returns_the_latest_protocol_and_metadata() -> None:
    state = check_segment(None, [_commit(0, PROTOCOL, METADATA), _commit(1, NEW_METADATA)], 0, table="t")
    assert state.metadata == metadata_body(name="renamed") and state.files == {}  # files are not replayed


def test_segment_check_takes_one_commit_at_a_time() -> None:
    check = SegmentCheck(None, 0, table="t")
    check.commit(0, [PROTOCOL, METADATA])
    check.commit(1, [log_line(add("a")), NEW_METADATA])
    assert check.finish().metadata == metadata_body(name="renamed")


def test_check_checkpoint_needs_a_well_formed_protocol_and_metadata() -> None:
    check_checkpoint([PROTOCOL, METADATA, log_line(add("a"))], 4, table="t")
    bad = log_line(action("metaData", {**metadata_body(), "format": {}}))
    with pytest.raises(DataError, match="the metaData action of checkpoint 4 has no 'format'"):
        check_checkpoint([PROTOCOL, bad], 4, table="t")


# -- the JSON replay against a source checkpoint --------------------------------------------------------


def test_replay_state_keeps_add_lines_only_when_asked() -> None:
    lines = _lines(add("a"), add("b"))
    plain, kept = ReplayState(), ReplayState(keep_lines=True)
    plain.apply(lines)
    kept.apply(lines)
    assert plain.files == {FileKey("a", ""): "", FileKey("b", ""): ""}
    assert kept.files == {FileKey("a", ""): lines[0], FileKey("b", ""): lines[1]}


def test_checkpoint_state_reads_the_state_and_the_lines_by_role() -> None:
    txn = log_line(action("txn", {"appId": "app", "version": 4}))
    domain = log_line(action("domainMetadata", {"domain": "d", "configuration": "{}", "removed": False}))
    state, by_role = checkpoint_state([PROTOCOL, METADATA, txn, domain, log_line(add("a"))])
    assert by_role == {"protocol": PROTOCOL, "metaData": METADATA, "txn:app": txn, "domainMetadata:d": domain}
    assert state.keep_lines and state.files == {FileKey("a", ""): log_line(add("a"))}


def _json_replay(*commits: list[str]) -> ReplayState:
    replay = ReplayState()
    for lines in commits:
        replay.apply(lines)
    return replay


BASE = [PROTOCOL, METADATA, log_line(add("a")), log_line(add("b"))]


@pytest.mark.parametrize(
    ("checkpoint_extra", "fields", "kept"),
    [
        ([], [], []),
        ([log_line(add("c"))], ["files"], [log_line(add("c"))]),
        ([log_line(action("txn", {"appId": "app", "version": 9}))], ["txn 'app'"], ["txn"]),
        (
            [log_line(action("domainMetadata", {"domain": "d", "configuration": "x", "removed": False}))],
            ["domainMetadata 'd'"],
            ["domainMetadata"],
        ),
    ],
    ids=[
        "same-state",
        "a-file-only-in-the-checkpoint",
        "a-txn-only-in-the-checkpoint",
        "a-domain-only-there",
    ],
)
def test_compare_to_checkpoint_keeps_what_the_checkpoint_adds(
    checkpoint_extra: list[str], fields: list[str], kept: list[str]
) -> None:
    replay = _json_replay(BASE)
    checkpoint, by_role = checkpoint_state(BASE + checkpoint_extra)
    found = compare_to_checkpoint(replay, checkpoint, by_role, 7)
    if not fields:
        assert found is None
        return
    assert found is not None and [d.field for d in found.disagreements] == fields
    assert [
        line if line.startswith('{"add"') else next(iter(json.loads(line))) for line in found.lines
    ] == kept
    assert found.dropped_files == []


def test_compare_to_checkpoint_drops_files_the_checkpoint_no_longer_lists() -> None:
    replay = _json_replay(BASE, _lines(remove("a"), add("c")))
    checkpoint, by_role = checkpoint_state([PROTOCOL, METADATA, log_line(add("b"))])
    found = compare_to_checkpoint(replay, checkpoint, by_role, 1)
    assert found is not None
    (disagreement,) = found.disagreements
    assert found.dropped_files == [FileKey("c", "")] and found.lines == []
    assert disagreement == Disagreement(
        1, "files", "0 active only in the checkpoint, 1 only in the JSON replay, e.g. c"
    )


@pytest.mark.parametrize(
    ("checkpoint_line", "field", "detail"),
    [
        (
            log_line(action("protocol", protocol_body(1, 3))),
            "protocol.minWriterVersion",
            "JSON 2, checkpoint 3",
        ),
        (
            log_line(action("metaData", metadata_body(schema_string=SCHEMA))),
            "metaData.schemaString",
            "column(s) 'extra' only in the checkpoint",
        ),
        (
            log_line(action("metaData", metadata_body(configuration={"k": "v"}))),
            "metaData.configuration",
            'JSON {}, checkpoint {"k": "v"}',
        ),
    ],
    ids=["protocol-version", "schema-column", "configuration"],
)
def test_compare_to_checkpoint_names_the_field_that_differs(
    checkpoint_line: str, field: str, detail: str
) -> None:
    replay = _json_replay(BASE)
    role = next(iter(json.loads(checkpoint_line)))
    lines = [checkpoint_line if line.startswith(f'{{"{role}"') else line for line in BASE]
    checkpoint, by_role = checkpoint_state(lines)
    found = compare_to_checkpoint(replay, checkpoint, by_role, 3)
    assert found is not None and found.lines == [checkpoint_line]
    (disagreement,) = found.disagreements
    assert (disagreement.field, disagreement.detail) == (field, detail)
    assert disagreement.describe().startswith(
        f"version 3: the checkpoint's {field} differs from the JSON commits"
    )
    assert disagreement.to_json() == {"version": 3, "field": field, "detail": detail}


def test_nulls_and_empty_containers_the_parquet_checkpoint_omits_are_no_disagreement() -> None:
    replay = _json_replay(BASE)
    body = {k: v for k, v in metadata_body().items() if k != "configuration"}  # {} in the JSON
    lines = [log_line(action("metaData", body)) if line == METADATA else line for line in BASE]
    checkpoint, by_role = checkpoint_state(lines)
    assert compare_to_checkpoint(replay, checkpoint, by_role, 3) is None


def test_a_txn_only_in_the_json_replay_is_reported_not_recorded() -> None:
    replay = _json_replay(BASE, _lines(action("txn", {"appId": "old", "version": 1})))
    checkpoint, by_role = checkpoint_state(BASE)
    found = compare_to_checkpoint(replay, checkpoint, by_role, 2)
    assert found is not None and found.lines == []
    assert [(d.field, d.detail) for d in found.disagreements] == [
        ("txn 'old'", "in the JSON replay only (not recorded: the store keeps it)")
    ]
