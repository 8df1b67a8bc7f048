"""Specification of the rules every commit obeys (``delta.commit_rules``): pure functions over
plain actions, no database."""

from __future__ import annotations

from typing import Any

import pytest
from support.builders import (
    DELETION_VECTOR,
    DELETION_VECTOR_ID,
    add_body,
    metadata_body,
    protocol_body,
    remove_body,
)

from delta_mirror.delta.actions import Action
from delta_mirror.delta.commit_rules import (
    check_actions,
    check_no_downgrade,
    check_removes,
    drops_a_feature,
    in_commit_timestamps_enabled,
    in_spark_order,
    removed_files,
    with_commit_info,
)
from delta_mirror.delta.replay import FileKey
from delta_mirror.errors import InvalidActionError
from delta_mirror.version import ENGINE_INFO

ROOT = "s3://bucket/table"
DV = DELETION_VECTOR
PROTOCOL: Action = ("protocol", protocol_body(1, 2))
METADATA: Action = ("metaData", metadata_body())


def _check(
    actions: list[Action], *, version: int = 1, first_commit: bool = False, previous: Any = None
) -> None:
    check_actions(
        actions,
        table="t",
        version=version,
        location=ROOT,
        first_version=0,
        first_commit=first_commit,
        previous_protocol=previous,
    )


# -- check_actions -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("actions", "first_commit"),
    [
        ([PROTOCOL, METADATA, ("add", add_body("a.parquet"))], True),
        ([("add", add_body("a.parquet")), ("add", add_body("b.parquet"))], False),
        ([("remove", remove_body("a.parquet")), ("add", add_body("a.parquet"))], False),
        ([("add", add_body("a.parquet")), ("add", add_body("a.parquet", deletionVector=DV))], False),
        ([("commitInfo", {"operation": "WRITE"}), ("add", add_body("a.parquet"))], False),
        ([("txn", {"appId": "app", "version": 3})], False),
    ],
    ids=[
        "first-commit-with-protocol-and-metadata",
        "two-files",
        "remove-and-re-add-one-file",
        "same-path-two-deletion-vectors",
        "one-commit-info",
        "txn-only",
    ],
)
def test_check_actions_accepts_a_valid_commit(actions: list[Action], first_commit: bool) -> None:
    _check(actions, version=0 if first_commit else 1, first_commit=first_commit)


@pytest.mark.parametrize(
    ("actions", "first_commit", "message"),
    [
        ([PROTOCOL, PROTOCOL, METADATA], True, "2 'protocol' actions in one commit"),
        ([METADATA, METADATA], False, "2 'metaData' actions in one commit"),
        ([("commitInfo", {}), ("commitInfo", {})], False, "2 'commitInfo' actions in one commit"),
        ([METADATA], True, "the first commit of a table needs a 'protocol' action"),
        ([PROTOCOL], True, "the first commit of a table needs a 'metaData' action"),
        (
            [("add", add_body("a.parquet")), ("add", add_body("a.parquet"))],
            False,
            "action 2: duplicate add of 'a.parquet' in one commit",
        ),
        (
            [("remove", remove_body("a.parquet")), ("remove", remove_body("a.parquet"))],
            False,
            "action 2: duplicate remove of 'a.parquet' in one commit",
        ),
        (
            [("protocol", protocol_body(3, 7, ["catalogManaged"], ["catalogManaged"]))],
            False,
            "protocol feature 'catalogManaged' is not allowed",
        ),
        (
            [
                (
                    "metaData",
                    metadata_body(configuration={"delta.coordinatedCommits.commitCoordinator-preview": "x"}),
                )
            ],
            False,
            "table property 'delta.coordinatedCommits.commitCoordinator-preview' is not allowed",
        ),
    ],
    ids=[
        "two-protocols",
        "two-metadata",
        "two-commit-infos",
        "first-commit-without-protocol",
        "first-commit-without-metadata",
        "same-file-added-twice",
        "same-file-removed-twice",
        "catalog-feature",
        "coordinated-commits-property",
    ],
)
def test_check_actions_refuses_with_one_clear_message(
    actions: list[Action], first_commit: bool, message: str
) -> None:
    with pytest.raises(InvalidActionError) as info:
        _check(actions, version=0 if first_commit else 1, first_commit=first_commit)
    assert message in str(info.value)
    assert (info.value.table, info.value.version) == ("t", 0 if first_commit else 1)
    assert info.value.hint


def test_check_actions_refuses_a_protocol_downgrade_after_the_first_version() -> None:
    with pytest.raises(InvalidActionError, match="protocol downgrade: minWriterVersion 7 -> 2"):
        _check([PROTOCOL], version=5, previous=protocol_body(1, 7))
    _check([PROTOCOL, METADATA], version=0, first_commit=True, previous=protocol_body(1, 7))  # the first


# -- protocol downgrades -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("new", "previous", "actions", "refused"),
    [
        (protocol_body(1, 2), protocol_body(1, 2), [], False),
        (protocol_body(3, 7), protocol_body(1, 2), [], False),
        (protocol_body(1, 2), None, [], False),
        (protocol_body(1, 2), protocol_body(1, 7), [], True),
        (protocol_body(1, 7), protocol_body(3, 7), [], True),
        (protocol_body(1, 2), protocol_body(3, 7), [("commitInfo", {"operation": "DROP FEATURE"})], False),
        (protocol_body(1, 2), protocol_body(3, 7), [("commitInfo", {"operation": "WRITE"})], True),
        (protocol_body(1, 2), {"minReaderVersion": "3"}, [], False),
    ],
    ids=[
        "same",
        "upgrade",
        "nothing-before",
        "writer-down",
        "reader-down",
        "drop-feature",
        "other-operation",
        "previous-not-an-integer",
    ],
)
def test_protocol_versions_only_go_down_through_drop_feature(
    new: dict[str, Any], previous: dict[str, Any] | None, actions: list[Action], refused: bool
) -> None:
    def run() -> None:
        check_no_downgrade(new, previous, actions, table="t", version=4)

    if refused:
        with pytest.raises(InvalidActionError, match="protocol downgrade"):
            run()
    else:
        run()


@pytest.mark.parametrize(
    ("actions", "expected"),
    [
        ([("commitInfo", {"operation": "DROP FEATURE"})], True),
        ([("commitInfo", {"operation": "WRITE"})], False),
        ([("commitInfo", {})], False),
        ([("add", add_body())], False),
    ],
    ids=["drop-feature", "write", "no-operation", "no-commit-info"],
)
def test_drops_a_feature_reads_the_commit_info_operation(actions: list[Action], expected: bool) -> None:
    assert drops_a_feature(actions) is expected


# -- removes -----------------------------------------------------------------------------------------


def test_removed_files_are_the_keys_of_the_removes_in_commit_order() -> None:
    actions: list[Action] = [
        ("remove", remove_body("b.parquet")),
        ("add", add_body("c.parquet")),
        ("remove", remove_body("a.parquet", deletionVector=DV)),
    ]
    assert removed_files(actions) == [
        FileKey("b.parquet", ""),
        FileKey("a.parquet", DELETION_VECTOR_ID),
    ]


@pytest.mark.parametrize(
    ("removes", "active", "message"),
    [
        ([FileKey("a", "")], {FileKey("a", "")}, None),
        ([FileKey("a", "u1")], {FileKey("a", "u1"), FileKey("b", "")}, None),
        ([], set(), None),
        ([FileKey("a", "")], set(), "remove of 'a' which is not an active file"),
        (
            [FileKey("a", "u1")],
            {FileKey("a", "")},
            "remove of 'a' (deletion vector u1) which is not an active file",
        ),
        ([FileKey("a", "")], {FileKey("a", "u1")}, "remove of 'a' which is not an active file"),
        ([FileKey("a%20b", "")], {FileKey("a b", "")}, "remove of 'a%20b' which is not an active file"),
    ],
    ids=[
        "active",
        "active-with-dv",
        "no-removes",
        "not-active",
        "dv-differs",
        "active-only-with-a-dv",
        "path-text-differs",
    ],
)
def test_a_remove_names_an_active_file_by_path_text_and_deletion_vector(
    removes: list[FileKey], active: set[FileKey], message: str | None
) -> None:
    if message is None:
        check_removes(removes, active, table="t", version=2)
        return
    with pytest.raises(InvalidActionError) as info:
        check_removes(removes, active, table="t", version=2)
    assert info.value.what == message


def test_check_removes_accepts_active_keys_read_as_plain_pairs() -> None:
    """The store reads active files as (path, dv_id) rows: the same keys."""
    check_removes([FileKey("a", "")], {("a", "")}, table="t", version=2)  # type: ignore[arg-type]


# -- ordering, in-commit timestamps, commitInfo ------------------------------------------------------


def test_in_spark_order_reorders_known_keys_and_keeps_unknown_ones_after() -> None:
    body = {"zzz": 1, "size": 3, "path": "a.parquet", "dataChange": True}
    ((kind, ordered),) = in_spark_order([("add", body)])
    assert kind == "add" and list(ordered) == ["path", "size", "dataChange", "zzz"]


@pytest.mark.parametrize(
    ("configuration", "enabled"),
    [
        ({"delta.enableInCommitTimestamps": "true"}, True),
        ({"delta.enableInCommitTimestamps": "false"}, False),
        ({"delta.enableInCommitTimestamps": True}, False),
        ({}, False),
        (None, False),
    ],
    ids=["true", "false", "a-boolean-is-not-the-string", "absent", "no-configuration"],
)
def test_in_commit_timestamps_are_on_only_when_the_property_is_the_string_true(
    configuration: dict[str, Any] | None, enabled: bool
) -> None:
    assert in_commit_timestamps_enabled({"configuration": configuration}) is enabled


def _with_info(
    actions: list[Action], *, version: int = 3, ict: bool = False, previous: int | None = None
) -> list[Action]:
    config = {"delta.enableInCommitTimestamps": "true"} if ict else {}
    return with_commit_info(
        actions,
        version=version,
        first_version=0,
        timestamp=1_000,
        operation=None,
        metadata={"configuration": config},
        previous_ict=previous,
    )


@pytest.mark.parametrize(
    ("actions", "version", "operation", "blind"),
    [
        ([PROTOCOL, METADATA], 0, "CREATE TABLE", True),
        ([("add", add_body())], 3, "WRITE", True),
        ([("remove", remove_body("a"))], 3, "DELETE", False),
        ([("remove", remove_body("a")), ("add", add_body())], 3, "WRITE", False),
        ([METADATA], 3, "WRITE", True),
    ],
    ids=["create-table", "append", "delete", "overwrite", "metadata-change-later"],
)
def test_a_commit_without_commit_info_gets_one_first_naming_its_operation(
    actions: list[Action], version: int, operation: str, blind: bool
) -> None:
    out = _with_info(actions, version=version)
    kind, info = out[0]
    assert kind == "commitInfo" and out[1:] == actions
    assert (info["operation"], info["isBlindAppend"], info["engineInfo"]) == (operation, blind, ENGINE_INFO)
    assert info.get("readVersion") == (version - 1 if version > 0 else None)


def test_a_writers_commit_info_moves_first_and_is_kept() -> None:
    out = _with_info([("add", add_body()), ("commitInfo", {"operation": "MERGE", "timestamp": 5})])
    assert out[0] == ("commitInfo", {"timestamp": 5, "operation": "MERGE"}) and out[1][0] == "add"


@pytest.mark.parametrize(
    ("given", "previous", "expected"),
    [
        (5_000, None, 5_000),
        (5_000, 4_000, 5_000),
        (5_000, 5_000, 5_001),
        (5_000, 9_000, 9_001),
    ],
    ids=["first", "later", "same-millisecond", "clock-behind"],
)
def test_the_in_commit_timestamp_is_the_commit_timestamp_kept_strictly_increasing(
    given: int, previous: int | None, expected: int
) -> None:
    out = _with_info(
        [("commitInfo", {"timestamp": given, "operation": "WRITE"})], ict=True, previous=previous
    )
    info = out[0][1]
    assert next(iter(info)) == "inCommitTimestamp" and info["inCommitTimestamp"] == expected


def test_without_in_commit_timestamps_none_is_added() -> None:
    assert "inCommitTimestamp" not in _with_info([("add", add_body())])[0][1]
