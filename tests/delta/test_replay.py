"""Specification of the one log replay (``delta.replay``): how a Delta reader reconstructs a
table's state from its actions (PROTOCOL.md, "Action Reconciliation"). Pure: no database."""

from __future__ import annotations

from typing import Any

import pytest
from support.builders import (
    DELETION_VECTOR,
    DELETION_VECTOR_ID,
    action,
    add,
    log_line,
    metadata_body,
    protocol_body,
    remove,
)

from delta_mirror.delta.replay import FileKey, LogReplay, file_key

DV, DV_ID = DELETION_VECTOR, DELETION_VECTOR_ID


class Lines(LogReplay[str]):
    """A replay keeping each active file's add line."""

    def __init__(self) -> None:
        super().__init__()
        self.gone: list[FileKey] = []

    def _file(self, key: FileKey, add: dict[str, Any], line: str) -> str:
        return line

    def _removed(self, key: FileKey) -> None:
        self.gone.append(key)


def _replay(*commits: list[dict[str, Any]]) -> Lines:
    replay = Lines()
    for commit in commits:
        replay.apply([log_line(a) for a in commit])
    return replay


def _paths(replay: LogReplay[Any]) -> list[str]:
    return sorted(key.path for key in replay.files)


# -- file keys --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ({"path": "a.parquet"}, FileKey("a.parquet", "")),
        ({"path": "a.parquet", "deletionVector": None}, FileKey("a.parquet", "")),
        ({"path": "a.parquet", "deletionVector": DV}, FileKey("a.parquet", DV_ID)),
        (
            {
                "path": "a.parquet",
                "deletionVector": {
                    "storageType": "i",
                    "pathOrInlineDv": "wi5b=000010000siXQKl0rr91000f55c8Xg0@@D72lkbi5=-{L",
                },
            },
            FileKey("a.parquet", "iwi5b=000010000siXQKl0rr91000f55c8Xg0@@D72lkbi5=-{L"),
        ),
        ({"path": "p%20q.parquet"}, FileKey("p%20q.parquet", "")),  # the path text as written
        ({}, FileKey("", "")),
    ],
    ids=["no-dv", "null-dv", "dv-storage-path-offset", "inline-dv-no-offset", "path-text-kept", "no-path"],
)
def test_file_key_is_the_path_and_the_deletion_vector_unique_id(
    body: dict[str, Any], expected: FileKey
) -> None:
    assert file_key(body) == expected
    assert (file_key(body).path, file_key(body).dv_id) == tuple(expected)


def test_file_key_equals_and_hashes_as_the_plain_pair() -> None:
    """Keys read from the store as (path, dv_id) rows find the same entries."""
    assert {FileKey("a", ""): 1}[("a", "")] == 1  # type: ignore[index]


# -- removes before adds -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("commits", "active"),
    [
        ([[add("a"), add("b")]], ["a", "b"]),
        ([[add("a")], [remove("a")]], []),
        ([[add("a")], [remove("a"), add("a")]], ["a"]),
        ([[add("a")], [add("a"), remove("a")]], ["a"]),
        ([[add("a"), remove("a")]], ["a"]),
        ([[remove("never-added")]], []),
        ([[add("a")], [remove("a")], [add("a")]], ["a"]),
        ([[add("a"), add("b")], [remove("a"), add("c")], [remove("c")]], ["b"]),
    ],
    ids=[
        "adds-accumulate",
        "remove-drops-an-active-file",
        "remove-then-add-in-one-commit-keeps-it",
        "add-then-remove-in-one-commit-keeps-it",
        "add-and-remove-in-the-first-commit-keeps-it",
        "remove-of-an-unknown-file-is-a-no-op",
        "re-added-in-a-later-commit",
        "history",
    ],
)
def test_within_a_commit_removes_apply_before_adds(
    commits: list[list[dict[str, Any]]], active: list[str]
) -> None:
    assert _paths(_replay(*commits)) == active


def test_a_re_added_file_holds_its_newest_add() -> None:
    replay = _replay([add("a", size=1)], [add("a", size=2)])
    assert replay.files == {FileKey("a", ""): log_line(add("a", size=2))}


def test_a_remove_skipped_for_a_key_the_commit_re_adds_does_not_reach_the_removal_hook() -> None:
    replay = _replay([add("a"), add("b")], [add("a"), remove("a"), remove("b")])
    assert replay.gone == [FileKey("b", "")]


@pytest.mark.parametrize(
    ("commits", "active"),
    [
        ([[add("a")], [remove("a", deletionVector=DV)]], [FileKey("a", "")]),
        ([[add("a", deletionVector=DV)], [remove("a")]], [FileKey("a", DV_ID)]),
        ([[add("a")], [remove("a"), add("a", deletionVector=DV)]], [FileKey("a", DV_ID)]),
        ([[add("a", deletionVector=DV)], [remove("a", deletionVector=DV)]], []),
    ],
    ids=[
        "remove-with-a-dv-leaves-the-file-without",
        "remove-without-a-dv-leaves-the-file-with",
        "dv-update-is-remove-plus-add",
        "same-dv-removes",
    ],
)
def test_a_file_is_keyed_by_path_and_deletion_vector(
    commits: list[list[dict[str, Any]]], active: list[FileKey]
) -> None:
    assert list(_replay(*commits).files) == active


# -- protocol, metadata, transactions, domains ---------------------------------------------------------


def test_the_latest_protocol_and_metadata_replace_the_earlier_ones() -> None:
    p1, p2 = protocol_body(1, 2), protocol_body(3, 7, ["deletionVectors"], ["deletionVectors"])
    m1, m2 = metadata_body(name="one"), metadata_body(name="two")
    replay = _replay([action("protocol", p1), action("metaData", m1)], [add("a")])
    assert (replay.protocol, replay.metadata) == (p1, m1)
    replay.apply([log_line(action("metaData", m2))])
    assert (replay.protocol, replay.metadata) == (p1, m2)
    replay.apply([log_line(action("protocol", p2))])
    assert (replay.protocol, replay.metadata) == (p2, m2)


def test_a_new_replay_has_no_protocol_or_metadata() -> None:
    replay = Lines()
    assert (replay.protocol, replay.metadata, replay.txns, replay.domains, replay.files) == (
        None,
        None,
        {},
        {},
        {},
    )


def _txn(app: str, version: int) -> dict[str, Any]:
    return action("txn", {"appId": app, "version": version, "lastUpdated": 1})


def _domain(name: str, config: str, *, removed: bool = False) -> dict[str, Any]:
    return action("domainMetadata", {"domain": name, "configuration": config, "removed": removed})


@pytest.mark.parametrize(
    ("commits", "txns", "domains"),
    [
        ([[_txn("app", 1)], [_txn("app", 2)]], {"app": 2}, {}),
        ([[_txn("app", 5)], [_txn("app", 3)]], {"app": 3}, {}),  # the latest seen, not the highest
        ([[_txn("a", 1), _txn("b", 4)], [_txn("a", 2)]], {"a": 2, "b": 4}, {}),
        ([[_txn("app", 1), _txn("app", 2)]], {"app": 2}, {}),
        ([[_domain("d", "1")], [_domain("d", "2")]], {}, {"d": "2"}),
        ([[_domain("d", "1"), _domain("e", "x")], [_domain("d", "", removed=True)]], {}, {"e": "x"}),
        ([[_domain("d", "1")], [_domain("d", "", removed=True)], [_domain("d", "3")]], {}, {"d": "3"}),
        ([[_domain("d", "", removed=True)]], {}, {}),
    ],
    ids=[
        "txn-later-wins",
        "txn-latest-seen-not-highest",
        "txn-per-app-id",
        "txn-within-one-commit",
        "domain-later-wins",
        "domain-removed-is-a-tombstone",
        "domain-re-added-after-removal",
        "domain-removed-unknown",
    ],
)
def test_the_latest_txn_per_app_id_and_domain_metadata_per_domain_win(
    commits: list[list[dict[str, Any]]], txns: dict[str, int], domains: dict[str, str]
) -> None:
    replay = _replay(*commits)
    assert {app: body["version"] for app, body in replay.txns.items()} == txns
    assert {name: body["configuration"] for name, body in replay.domains.items()} == domains


@pytest.mark.parametrize(
    "line",
    [
        log_line(action("commitInfo", {"timestamp": 1, "operation": "WRITE"})),
        log_line(action("cdc", {"path": "c.parquet", "partitionValues": {}, "size": 1, "dataChange": False})),
        log_line(action("someFutureAction", {"x": 1})),
        log_line({"add": None}),
    ],
    ids=["commitInfo", "cdc", "unknown-action", "null-body"],
)
def test_actions_outside_the_state_change_nothing(line: str) -> None:
    replay = _replay([action("protocol", protocol_body()), add("a")])
    before = (replay.protocol, replay.metadata, dict(replay.txns), dict(replay.domains), dict(replay.files))
    replay.apply([line])
    assert (replay.protocol, replay.metadata, replay.txns, replay.domains, replay.files) == before


# -- restarting at a version ----------------------------------------------------------------------------


def test_a_replay_started_from_a_checkpoint_at_a_version_reaches_the_same_state() -> None:
    """Readers start from the newest checkpoint: its lines replayed as one commit, then the later
    commits, give the state a replay from version 0 gives."""
    commits = [
        [action("protocol", protocol_body()), action("metaData", metadata_body()), add("a"), add("b")],
        [remove("a"), add("c", deletionVector=DV), _txn("app", 1), _domain("d", "1")],
        [remove("b"), add("d"), _txn("app", 2)],
        [remove("c", deletionVector=DV), add("c"), _domain("d", "", removed=True)],
    ]
    full = _replay(*commits)
    at_1 = _replay(*commits[:2])
    checkpoint = [
        log_line(action("protocol", at_1.protocol or {})),
        log_line(action("metaData", at_1.metadata or {})),
        *(log_line(action("txn", t)) for t in at_1.txns.values()),
        *(log_line(action("domainMetadata", d)) for d in at_1.domains.values()),
        *at_1.files.values(),
    ]
    restarted = Lines()
    restarted.apply(checkpoint)
    for commit in commits[2:]:
        restarted.apply([log_line(a) for a in commit])
    for field in ("protocol", "metadata", "txns", "domains", "files"):
        assert getattr(restarted, field) == getattr(full, field), field
    assert _paths(full) == ["c", "d"]
