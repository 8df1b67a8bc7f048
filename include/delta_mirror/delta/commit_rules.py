"""The rules every commit obeys, whoever writes it (a native commit or a writer's verbatim file).

Pure functions over plain values: the store reads what the rules need (the previous protocol,
the active files a commit removes, the previous in-commit timestamp) and calls them inside the
commit's transaction, so a refused commit changes nothing.

The rules: each action passes ``validate_action`` (paths inside the root); at most one metaData,
protocol and commitInfo, each file added or removed once; a table's first commit has protocol and
metaData; no catalog feature (:data:`CATALOG_FEATURES`) or ``delta.coordinatedCommits.*``
property; no protocol downgrade except through DROP FEATURE; removes name active (path, deletion
vector) files.
"""

from __future__ import annotations

import uuid
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from delta_mirror.delta.actions import Action, spark_ordered, validate_action
from delta_mirror.delta.protocol import CATALOG_FEATURES, COORDINATED_COMMITS_PREFIX
from delta_mirror.delta.replay import FileKey, file_key
from delta_mirror.errors import InvalidActionError
from delta_mirror.version import ENGINE_INFO

_SINGLE_ACTIONS = ("metaData", "protocol", "commitInfo")
_DROP_FEATURE = "DROP FEATURE"


def check_actions(
    actions: Sequence[Action],
    *,
    table: str,
    version: int,
    location: str | None,
    first_version: int,
    first_commit: bool,
    previous_protocol: Mapping[str, Any] | None = None,
) -> None:
    """Every rule but the active-file one (:func:`check_removes`), in the order refusals are decided.

    ``first_commit``: the table starts here (no base checkpoint), so protocol and metaData are
    due. ``previous_protocol``: the protocol in force before ``version`` (``None`` when there is
    none to compare, e.g. at the first version).
    """
    counts = _check_each_action(actions, table=table, version=version, location=location)
    for kind in _SINGLE_ACTIONS:
        if counts.get(kind, 0) > 1:
            raise InvalidActionError(
                f"{counts[kind]} '{kind}' actions in one commit (at most one allowed)",
                table=table,
                version=version,
                hint=f"merge them into a single {kind}",
            )
    if first_commit:
        for kind in ("protocol", "metaData"):
            if kind not in counts:
                raise InvalidActionError(
                    f"the first commit of a table needs a '{kind}' action",
                    table=table,
                    version=version,
                    hint="add protocol and metaData to version 0",
                )
    for kind, body in actions:
        if kind == "protocol":
            if version > first_version:
                check_no_downgrade(body, previous_protocol, actions, table=table, version=version)
            _check_features(body, table=table, version=version)
        elif kind == "metaData":
            _check_configuration(body, table=table, version=version)


def _check_each_action(
    actions: Sequence[Action], *, table: str, version: int, location: str | None
) -> dict[str, int]:
    """Each action on its own, and each file added or removed once; returns the count per kind."""
    counts: dict[str, int] = {}
    seen: dict[str, set[FileKey]] = {"add": set(), "remove": set()}
    for number, (kind, body) in enumerate(actions, start=1):
        validate_action(kind, body, number=number, table=table, version=version, location=location)
        counts[kind] = counts.get(kind, 0) + 1
        if kind in seen:
            key = file_key(body)
            if key in seen[kind]:
                raise InvalidActionError(
                    f"action {number}: duplicate {kind} of '{key.path}' in one commit",
                    table=table,
                    version=version,
                    hint=f"{kind} each file once per commit",
                )
            seen[kind].add(key)
    return counts


def _check_features(protocol: Mapping[str, Any], *, table: str, version: int) -> None:
    features = set(protocol.get("readerFeatures") or []) | set(protocol.get("writerFeatures") or [])
    for refused in sorted(CATALOG_FEATURES):
        if refused in features:
            raise InvalidActionError(
                f"protocol feature '{refused}' is not allowed",
                table=table,
                version=version,
                hint="it would make the table unreadable to plain filesystem readers",
            )


def _check_configuration(metadata: Mapping[str, Any], *, table: str, version: int) -> None:
    for key in metadata.get("configuration") or {}:
        if key.startswith(COORDINATED_COMMITS_PREFIX):
            raise InvalidActionError(
                f"table property '{key}' is not allowed",
                table=table,
                version=version,
                hint="the store already coordinates commits",
            )


def drops_a_feature(actions: Sequence[Action]) -> bool:
    """Whether the commit's ``commitInfo`` says DROP FEATURE (the one way a protocol goes down)."""
    info = next((b for k, b in actions if k == "commitInfo"), {})
    return bool(info.get("operation") == _DROP_FEATURE)


def check_no_downgrade(
    protocol: Mapping[str, Any],
    previous: Mapping[str, Any] | None,
    actions: Sequence[Action],
    *,
    table: str,
    version: int,
) -> None:
    """Protocol versions only go down through DROP FEATURE (as Delta-Spark allows), never by accident."""
    if previous is None or drops_a_feature(actions):
        return
    for key in ("minReaderVersion", "minWriterVersion"):
        if isinstance(previous.get(key), int) and protocol[key] < previous[key]:
            raise InvalidActionError(
                f"protocol downgrade: {key} {previous[key]} -> {protocol[key]}",
                table=table,
                version=version,
                hint="protocols only go up; a feature is removed with a commitInfo operation 'DROP FEATURE'",
            )


def removed_files(actions: Sequence[Action]) -> list[FileKey]:
    """The (path, deletion vector id) of each ``remove``, in commit order."""
    return [file_key(b) for k, b in actions if k == "remove"]


def check_removes(
    removes: Sequence[FileKey], active: Collection[FileKey], *, table: str, version: int
) -> None:
    """A remove names an active file: the same path text and deletion vector."""
    for key in removes:
        if key not in active:
            raise InvalidActionError(
                f"remove of '{key.path}'"
                + (f" (deletion vector {key.dv_id})" if key.dv_id else "")
                + " which is not an active file",
                table=table,
                version=version,
                hint="remove only files that are in the table (same path text and deletion vector)",
            )


def in_spark_order(actions: Sequence[Action]) -> list[Action]:
    """Delta-Spark's key order for every action (the order the store keeps them in)."""
    return [(kind, spark_ordered(kind, body)) for kind, body in actions]


def in_commit_timestamps_enabled(metadata: Mapping[str, Any]) -> bool:
    """Whether the table property ``delta.enableInCommitTimestamps`` is on."""
    return (metadata.get("configuration") or {}).get("delta.enableInCommitTimestamps") == "true"


def with_commit_info(
    actions: Sequence[Action],
    *,
    version: int,
    first_version: int,
    timestamp: int,
    operation: str | None,
    metadata: Mapping[str, Any],
    previous_ict: int | None,
) -> list[Action]:
    """Put ``commitInfo`` first (Delta-Spark does), creating it when the writer gave none.

    ``metadata``: the table's metaData after this commit. With in-commit timestamps on, the
    commit's ``inCommitTimestamp`` is its timestamp, kept strictly above ``previous_ict``.
    """
    info = next((b for k, b in actions if k == "commitInfo"), None)
    rest = [(k, b) for k, b in actions if k != "commitInfo"]
    if info is None:
        info = _new_commit_info(rest, version, first_version, timestamp, operation)
    if in_commit_timestamps_enabled(metadata):
        ict = max(int(info.get("timestamp", timestamp)), int(previous_ict or 0) + 1)
        info = {"inCommitTimestamp": ict, **{k: v for k, v in info.items() if k != "inCommitTimestamp"}}
    return [("commitInfo", spark_ordered("commitInfo", info)), *rest]


def _new_commit_info(
    rest: Sequence[Action], version: int, first_version: int, timestamp: int, operation: str | None
) -> dict[str, Any]:
    kinds = {k for k, _ in rest}
    op = operation or (
        "CREATE TABLE"
        if "metaData" in kinds and version == first_version
        else "DELETE"
        if kinds == {"remove"}
        else "WRITE"
    )
    info: dict[str, Any] = {"timestamp": timestamp, "operation": op, "operationParameters": {}}
    if version > 0:
        info["readVersion"] = version - 1
    info["isolationLevel"] = "Serializable"
    info["isBlindAppend"] = "remove" not in kinds
    info["engineInfo"] = ENGINE_INFO
    info["txnId"] = str(uuid.uuid4())
    return info


__all__ = [
    "check_actions",
    "check_no_downgrade",
    "check_removes",
    "drops_a_feature",
    "in_commit_timestamps_enabled",
    "in_spark_order",
    "removed_files",
    "with_commit_info",
]
