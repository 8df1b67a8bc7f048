"""Specification of the protocol facts the mirror relies on (``delta/protocol.py``), case by case.

From PROTOCOL.md: table features exist only with reader version 3 and writer version 7 (feature
lists go with exactly those); a reader must refuse a table needing a reader feature it does not
know; catalog-managed tables hand commits to a catalog; durations such as
``delta.logRetentionDuration`` are ``interval <n> <unit>`` texts with protocol defaults (30 days
of log, 1 week of tombstones); writers never write multi-part checkpoints on a ``v2Checkpoint``
table and only write UUID-named (V2) checkpoints on one.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from delta_mirror.delta.protocol import (
    DEFAULT_LOG_RETENTION_MS,
    DEFAULT_TOMBSTONE_RETENTION_MS,
    DELETED_FILE_RETENTION,
    LOG_RETENTION,
    CheckpointKind,
    parse_interval_ms,
    property_duration_ms,
    reader_features,
    unsupported_reasons,
    writer_features,
)

DAY = 86_400_000


def features(reader: list[str], writer: list[str] | None = None) -> dict[str, Any]:
    """A table-features protocol (3/7) with these reader and writer features."""
    return {
        "minReaderVersion": 3,
        "minWriterVersion": 7,
        "readerFeatures": reader,
        "writerFeatures": reader if writer is None else writer,
    }


# -- durations ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "ms"),
    [
        ("interval 1 week", 7 * DAY),
        ("interval 30 days", 30 * DAY),
        ("INTERVAL 2 HOURS", 2 * 3_600_000),  # case does not matter
        ("  interval 5 minutes  ", 5 * 60_000),  # nor surrounding blanks
        ("7 days", 7 * DAY),  # "interval" may be left out
        ("1 day", DAY),  # singular and plural units
        ("interval 90 seconds", 90_000),
        ("interval 250 milliseconds", 250),
        ("interval 0 days", 0),
    ],
)
def test_a_duration_text_is_read_in_milliseconds(text: str, ms: int) -> None:
    assert parse_interval_ms(text, default=-1) == ms


@pytest.mark.parametrize(
    "text",
    [
        None,
        "",
        "a week",  # no number
        "interval 1 fortnight",  # no such unit
        "interval 1 month",  # months have no fixed length: not a Delta duration
        "interval -1 days",  # negative
        "interval 1.5 days",  # fractions
        "interval 1 week 2 days",  # compound intervals
    ],
)
def test_an_unreadable_duration_falls_back_to_the_default(text: str | None) -> None:
    assert parse_interval_ms(text, default=123) == 123


@pytest.mark.parametrize(
    ("configuration", "key", "default", "ms"),
    [
        (None, LOG_RETENTION, DEFAULT_LOG_RETENTION_MS, 30 * DAY),  # no configuration: the default
        ({}, DELETED_FILE_RETENTION, DEFAULT_TOMBSTONE_RETENTION_MS, 7 * DAY),
        ({LOG_RETENTION: "interval 2 days"}, LOG_RETENTION, DEFAULT_LOG_RETENTION_MS, 2 * DAY),
        ({LOG_RETENTION: 5}, LOG_RETENTION, DEFAULT_LOG_RETENTION_MS, 30 * DAY),  # not a text: default
        ({DELETED_FILE_RETENTION: "1 hour"}, LOG_RETENTION, DEFAULT_LOG_RETENTION_MS, 30 * DAY),  # other key
    ],
)
def test_a_duration_property_is_read_from_the_configuration_or_defaults(
    configuration: dict[str, Any] | None, key: str, default: int, ms: int
) -> None:
    assert property_duration_ms(configuration, key, default) == ms


# -- which tables can be carried --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("protocol", "metadata"),
    [
        ({"minReaderVersion": 1, "minWriterVersion": 2}, None),
        (
            {"minReaderVersion": 2, "minWriterVersion": 5},
            {"configuration": {"delta.columnMapping.mode": "name"}},
        ),
        ({"minReaderVersion": 1, "minWriterVersion": 7, "writerFeatures": ["appendOnly"]}, None),
        (features(["deletionVectors", "v2Checkpoint", "columnMapping"]), None),
        (features(["timestampNtz"], ["timestampNtz", "someFutureWriterFeature"]), None),  # writers: not ours
    ],
    ids=[
        "legacy-1-2",
        "legacy-2-5",
        "writer-features-only",
        "known-reader-features",
        "unknown-writer-feature",
    ],
)
def test_a_protocol_every_reader_can_follow_is_carried(
    protocol: dict[str, Any], metadata: dict[str, Any] | None
) -> None:
    assert unsupported_reasons(protocol, metadata) == []


@pytest.mark.parametrize(
    ("protocol", "metadata", "reasons"),
    [
        (
            features(["catalogManaged"]),
            None,
            [
                "it uses the catalogManaged table feature (a catalog owns its commits; plain filesystem "
                "readers cannot read it)"
            ],
        ),
        (
            features([], ["catalogOwned-preview"]),
            None,
            [
                "it uses the catalogOwned-preview table feature (a catalog owns its commits; plain "
                "filesystem readers cannot read it)"
            ],
        ),
        (
            {"minReaderVersion": 1, "minWriterVersion": 2},
            {"configuration": {"delta.coordinatedCommits.commitCoordinator-preview": "dynamodb"}},
            ["it uses coordinated commits (delta.coordinatedCommits.commitCoordinator-preview)"],
        ),
        (
            features(["deletionVectors", "futureFeature", "otherOne"]),
            None,
            ["it requires unknown reader feature(s) 'futureFeature', 'otherOne'"],
        ),
        (
            {"minReaderVersion": 4, "minWriterVersion": 7},
            None,
            ["it requires minReaderVersion 4 (at most 3 exists)"],
        ),
        (
            {"minReaderVersion": 1, "minWriterVersion": 8},
            None,
            ["it requires minWriterVersion 8 (at most 7 exists)"],
        ),
        (
            {"minReaderVersion": "3", "minWriterVersion": True},
            None,
            [
                "its protocol has an invalid minReaderVersion '3'",
                "its protocol has an invalid minWriterVersion True",
            ],
        ),
        (
            {"minReaderVersion": 2, "minWriterVersion": 7, "readerFeatures": ["columnMapping"]},
            None,
            ["its protocol lists readerFeatures with minReaderVersion 2 (must be 3)"],
        ),
        (
            {"minReaderVersion": 1, "minWriterVersion": 6, "writerFeatures": ["appendOnly"]},
            None,
            ["its protocol lists writerFeatures with minWriterVersion 6 (must be 7)"],
        ),
        (
            {"minReaderVersion": 3, "minWriterVersion": 5},
            None,
            ["its protocol has minReaderVersion 3 with minWriterVersion 5 (must be 7)"],
        ),
    ],
    ids=[
        "catalog-managed",
        "catalog-owned",
        "coordinated-commits",
        "unknown-reader-features",
        "reader-version-too-high",
        "writer-version-too-high",
        "versions-not-integers",
        "reader-features-without-3",
        "writer-features-without-7",
        "reader-3-without-writer-7",
    ],
)
def test_a_protocol_some_reader_could_not_follow_is_refused_with_each_reason(
    protocol: dict[str, Any], metadata: dict[str, Any] | None, reasons: list[str]
) -> None:
    assert unsupported_reasons(protocol, metadata) == reasons


@pytest.mark.parametrize(
    ("protocol", "readers", "writers"),
    [
        (features(["a"], ["a", "b"]), ["a"], ["a", "b"]),
        ({"minReaderVersion": 1, "minWriterVersion": 2}, [], []),
        ({"readerFeatures": None, "writerFeatures": "appendOnly"}, [], []),  # not lists: none
    ],
)
def test_feature_lists_are_read_only_from_lists(
    protocol: dict[str, Any], readers: list[str], writers: list[str]
) -> None:
    assert (reader_features(protocol), writer_features(protocol)) == (readers, writers)


# -- checkpoint kinds ---------------------------------------------------------------------------------

V2_TABLE = features(["v2Checkpoint"])
V1_TABLE = {"minReaderVersion": 1, "minWriterVersion": 2}
V2_READER_ONLY = features(["v2Checkpoint"], ["appendOnly"])


@pytest.mark.parametrize(
    ("protocol", "preferred", "kind"),
    [
        (V2_TABLE, "classic", CheckpointKind.V2),  # the feature decides, whatever the table chose
        (V2_TABLE, "multipart", CheckpointKind.V2),
        (V1_TABLE, "classic", CheckpointKind.CLASSIC),
        (V1_TABLE, "multipart", CheckpointKind.MULTIPART),
        (V1_TABLE, "v2", CheckpointKind.CLASSIC),  # never V2 without the feature
    ],
)
def test_the_checkpoint_kind_of_a_table_follows_the_v2_checkpoint_feature(
    protocol: dict[str, Any], preferred: str, kind: CheckpointKind
) -> None:
    assert CheckpointKind.for_table(json.dumps({"protocol": protocol}), preferred) is kind


@pytest.mark.parametrize(
    ("kind", "protocol", "refused"),
    [
        (CheckpointKind.CLASSIC, V1_TABLE, None),  # always allowed
        (CheckpointKind.CLASSIC, V2_TABLE, None),
        (CheckpointKind.MULTIPART, V1_TABLE, None),
        (CheckpointKind.V2, V2_TABLE, None),
        (CheckpointKind.V2, V1_TABLE, "a V2 (UUID-named) checkpoint needs the v2Checkpoint table feature"),
        (
            CheckpointKind.V2,
            V2_READER_ONLY,
            "a V2 (UUID-named) checkpoint needs the v2Checkpoint table feature",
        ),
        (
            CheckpointKind.MULTIPART,
            V2_TABLE,
            "multi-part checkpoints are forbidden on tables with the v2Checkpoint feature",
        ),
    ],
)
def test_a_checkpoint_kind_the_protocol_forbids_is_refused_with_a_hint(
    kind: CheckpointKind, protocol: dict[str, Any], refused: str | None
) -> None:
    refusal = kind.refusal(protocol)
    if refused is None:
        assert refusal is None
    else:
        assert refusal is not None and refusal[0] == refused and refusal[1]
