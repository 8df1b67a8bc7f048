"""What a Delta reader reconstructs from a source log: the rule for invalid logs, and the state at
each checkpoint version.

**The rule for invalid logs.** Import refuses any source a Delta reader cannot reconstruct, naming
the version and the missing or invalid field: every version of the imported segment needs a
``protocol`` (integer ``minReaderVersion`` / ``minWriterVersion``) and a ``metaData`` with ``id``,
``format.provider``, ``partitionColumns`` and a ``schemaString`` that parses as a struct schema;
every ``protocol`` / ``metaData`` action of the segment (commits and checkpoints) must be such a
one, since readers that travel to its version use it; every complete checkpoint of the segment
must be readable and hold both. Checked before anything is written, so a refused import leaves
the store untouched.

**Checkpoint vs JSON.** Readers start from the newest checkpoint at or before the version they
read, so at a checkpoint version the checkpoint's protocol, metadata, transactions and file set
*are* the table, whatever a replay of the JSON commits says. Where the two disagree the import
keeps the checkpoint's state (and reports where and how they differ); the JSON commits are still
kept byte for byte.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from delta_mirror.delta.actions import line_action, schema_problem
from delta_mirror.delta.protocol import unsupported_reasons
from delta_mirror.delta.replay import FileKey, LogReplay
from delta_mirror.errors import DataError, UnsupportedTableError

_FIX_HINT = (
    "repair the source log with a Delta writer (or restore the file from a backup), then import again; "
    "docs/compatibility.md: 'Import: logs readers cannot reconstruct'"
)


def _refuse(what: str, *, table: str, version: int) -> DataError:
    return DataError(
        f"cannot import: {what}; no Delta reader can reconstruct version {version}",
        table=table,
        version=version,
        hint=_FIX_HINT,
    )


def check_action(kind: str, body: Any, *, table: str, version: int, where: str) -> None:
    """A ``protocol`` or ``metaData`` action a reader can use (the rule above); others pass."""
    problem = None
    if kind == "protocol":
        problem = _protocol_problem(body)
    elif kind == "metaData":
        problem = _metadata_problem(body)
    if problem is not None:
        raise _refuse(f"the {kind} action of {where} {version} {problem}", table=table, version=version)


def _protocol_problem(body: Mapping[str, Any]) -> str | None:
    for name in ("minReaderVersion", "minWriterVersion"):
        value = body.get(name)
        if not isinstance(value, int) or isinstance(value, bool):
            return f"has no integer '{name}'"
    return None


def _metadata_problem(body: Mapping[str, Any]) -> str | None:
    if not isinstance(body.get("id"), str):
        return "has no 'id' (a string)"
    fmt = body.get("format")
    if not isinstance(fmt, dict) or not isinstance(fmt.get("provider"), str):
        return "has no 'format' with a 'provider'"
    columns = body.get("partitionColumns")
    if not isinstance(columns, list) or not all(isinstance(c, str) for c in columns):
        return "has no 'partitionColumns' (a list of strings)"
    schema = body.get("schemaString")
    if not isinstance(schema, str):
        return "has no 'schemaString'"
    problem = schema_problem(schema)
    return None if problem is None else f"has a 'schemaString' that {problem}"


def require_state(protocol: Any, metadata: Any, *, table: str, version: int, where: str) -> None:
    """The table at ``version`` has both a protocol and a metaData action."""
    for kind, body in (("protocol", protocol), ("metaData", metadata)):
        if not isinstance(body, dict):
            raise _refuse(f"{where} {version} has no {kind} action", table=table, version=version)


def check_supported(protocol: Mapping[str, Any], metadata: Mapping[str, Any] | None, *, table: str) -> None:
    """Refuse tables whose protocol we cannot carry unchanged, naming the feature (docs/compatibility.md, "Unsupported tables")."""
    problems = unsupported_reasons(protocol, metadata)
    if problems:
        raise UnsupportedTableError(
            "cannot import: " + "; ".join(problems),
            table=table,
            hint="delta-mirror only imports tables that every plain Delta reader can read; "
            "remove the feature (or fix the protocol) in the source table first",
        )


def check_segment(
    base_lines: list[str] | None, commits: list[tuple[int, list[str], bytes]], start: int, *, table: str
) -> ReplayState:
    """Apply the rule to the base checkpoint (its lines, at ``start``) and every commit; returns
    the latest protocol and metaData (files are not replayed)."""
    check = SegmentCheck(base_lines, start, table=table)
    for version, lines, _data in commits:
        check.commit(version, lines)
    return check.finish()


class SegmentCheck:
    """``check_segment`` one commit at a time (a streaming import checks each commit as it reads it)."""

    def __init__(self, base_lines: list[str] | None, start: int, *, table: str) -> None:
        self.start, self.table, self.commits = start, table, 0
        self.state = ReplayState()
        if base_lines is not None:
            check_checkpoint(base_lines, start, table=table)
            self.state.protocol, self.state.metadata = _protocol_and_metadata(base_lines)

    def commit(self, version: int, lines: Iterable[str]) -> None:
        state, table = self.state, self.table
        self.commits += 1
        for line in lines:
            if line.startswith(('{"commitInfo":', '{"add":', '{"remove":')):
                continue  # one known action per line: not a protocol or metaData one
            kind, body = line_action(json.loads(line))
            check_action(kind, body, table=table, version=version, where="commit")
            if kind == "protocol":
                state.protocol = body
            elif kind == "metaData":
                state.metadata = body
        if version == self.start:
            require_state(
                state.protocol, state.metadata, table=table, version=version, where="the table at version"
            )

    def finish(self) -> ReplayState:
        """The latest protocol and metaData (a checkpoint alone must hold both)."""
        if not self.commits:
            require_state(
                self.state.protocol,
                self.state.metadata,
                table=self.table,
                version=self.start,
                where="the table at version",
            )
        return self.state


def check_checkpoint(lines: list[str], version: int, *, table: str) -> None:
    """A checkpoint readers can start from: a well-formed protocol and metaData."""
    protocol, metadata = _protocol_and_metadata(lines)
    require_state(protocol, metadata, table=table, version=version, where="checkpoint")
    check_action("protocol", protocol, table=table, version=version, where="checkpoint")
    check_action("metaData", metadata, table=table, version=version, where="checkpoint")


def _protocol_and_metadata(lines: Iterable[str]) -> tuple[Any, Any]:
    """The last protocol / metaData payloads among canonical checkpoint lines (prefix test first)."""
    protocol = metadata = None
    for line in lines:
        if line.startswith('{"protocol":'):
            protocol = json.loads(line)["protocol"]
        elif line.startswith('{"metaData":'):
            metadata = json.loads(line)["metaData"]
    return protocol, metadata


# --------------------------------------------------------------------------------------------
# Replay and comparison
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Disagreement:
    """One field in which a source checkpoint differs from the JSON replay up to its version."""

    version: int
    field: str  # e.g. "metaData.schemaString", "protocol.readerFeatures", "txn 'app'", "files"
    detail: str

    def describe(self) -> str:
        return (
            f"version {self.version}: the checkpoint's {self.field} differs from the JSON commits "
            f"({self.detail}); readers start from the checkpoint, so the import keeps its value"
        )

    def to_json(self) -> dict[str, object]:
        return {"version": self.version, "field": self.field, "detail": self.detail}


@dataclass
class CheckpointState:
    """Where a source checkpoint disagrees with the JSON replay: what the store must record at
    ``version`` so that its state (and the mirror's own checkpoints) are the checkpoint's."""

    version: int
    disagreements: list[Disagreement]
    lines: list[str]  # protocol / metaData / txn / domainMetadata / add lines of the checkpoint to keep
    dropped_files: list[FileKey]  # active in the JSON replay, absent from the checkpoint


class ReplayState(LogReplay[str]):
    """The JSON replay import compares with a source checkpoint (``delta.replay``); each active
    file holds its add line when ``keep_lines`` (a checkpoint's state, whose lines the store may
    keep), else ''."""

    def __init__(self, *, keep_lines: bool = False) -> None:
        super().__init__()
        self.keep_lines = keep_lines

    def _file(self, key: FileKey, add: dict[str, Any], line: str) -> str:
        return line if self.keep_lines else ""


def compare_to_checkpoint(
    replay: ReplayState, checkpoint: ReplayState, checkpoint_lines: dict[str, str], version: int
) -> CheckpointState | None:
    """How ``checkpoint`` (read with ``keep_lines``) differs from ``replay`` at ``version``; None if not."""
    out = CheckpointState(version, [], [], [])
    assert checkpoint.protocol is not None and checkpoint.metadata is not None
    fields = _protocol_diff(replay.protocol or {}, checkpoint.protocol)
    if fields:
        out.lines.append(checkpoint_lines["protocol"])
        out.disagreements += [Disagreement(version, f"protocol.{f}", d) for f, d in fields]
    fields = _metadata_diff(replay.metadata or {}, checkpoint.metadata)
    if fields:
        out.lines.append(checkpoint_lines["metaData"])
        out.disagreements += [Disagreement(version, f"metaData.{f}", d) for f, d in fields]
    _compare_keyed(out, "txn", replay.txns, checkpoint.txns, checkpoint_lines)
    _compare_keyed(out, "domainMetadata", replay.domains, checkpoint.domains, checkpoint_lines)
    extra = [k for k in checkpoint.files if k not in replay.files]
    out.dropped_files = [k for k in replay.files if k not in checkpoint.files]
    out.lines += [checkpoint.files[k] for k in extra]
    if extra or out.dropped_files:
        sample = ", ".join(str(k.path) for k in (extra + out.dropped_files)[:3])
        out.disagreements.append(
            Disagreement(
                version,
                "files",
                f"{len(extra)} active only in the checkpoint, {len(out.dropped_files)} only in the JSON "
                f"replay, e.g. {sample}",
            )
        )
    return out if out.disagreements else None


def _compare_keyed(
    out: CheckpointState,
    kind: str,
    replay: dict[str, dict[str, Any]],
    checkpoint: dict[str, dict[str, Any]],
    lines: dict[str, str],
) -> None:
    """txn (by appId) / domainMetadata (by domain): changed or added ones are kept; ones the
    checkpoint dropped (expired transactions) are reported only."""
    for key, body in checkpoint.items():
        if not _same(replay.get(key), body):
            out.lines.append(lines[f"{kind}:{key}"])
            was = "absent" if key not in replay else _short(replay[key])
            out.disagreements.append(
                Disagreement(out.version, f"{kind} '{key}'", f"JSON {was}, checkpoint {_short(body)}")
            )
    for key in replay.keys() - checkpoint.keys():
        out.disagreements.append(
            Disagreement(
                out.version, f"{kind} '{key}'", "in the JSON replay only (not recorded: the store keeps it)"
            )
        )


def _same(a: Any, b: Any) -> bool:
    """Equal once nulls and empty containers are dropped (Parquet checkpoints omit what JSON spells out)."""
    return bool(_plain({"v": a}) == _plain({"v": b}))


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        out = {k: _plain(v) for k, v in value.items()}
        return {k: v for k, v in out.items() if v not in (None, {}, [])}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _short(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False, sort_keys=True)
    return text if len(text) <= 80 else text[:77] + "..."


def _protocol_diff(json_side: Mapping[str, Any], cp: Mapping[str, Any]) -> list[tuple[str, str]]:
    out = []
    for name in ("minReaderVersion", "minWriterVersion", "readerFeatures", "writerFeatures"):
        a, b = json_side.get(name), cp.get(name)
        if isinstance(a, list) and isinstance(b, list):
            a, b = sorted(map(str, a)), sorted(map(str, b))
        if not _same(a, b):
            out.append((name, f"JSON {_short(a)}, checkpoint {_short(b)}"))
    return out


def _metadata_diff(json_side: Mapping[str, Any], cp: Mapping[str, Any]) -> list[tuple[str, str]]:
    out = []
    for name in dict.fromkeys([*json_side, *cp]):
        a, b = json_side.get(name), cp.get(name)
        if name == "schemaString" and isinstance(a, str) and isinstance(b, str):
            if json.loads(a) != json.loads(b):
                out.append((name, _schema_change(json.loads(a), json.loads(b))))
        elif not _same(a, b):
            out.append((name, f"JSON {_short(a)}, checkpoint {_short(b)}"))
    return out


def _schema_change(json_schema: Any, cp_schema: Any) -> str:
    """Top-level columns only in one side, or changed (both schemas parse: the rule ran first)."""
    a = {f["name"]: f for f in json_schema.get("fields", [])}
    b = {f["name"]: f for f in cp_schema.get("fields", [])}
    parts = []
    if only := [n for n in b if n not in a]:
        parts.append(f"column(s) {', '.join(repr(n) for n in only)} only in the checkpoint")
    if only := [n for n in a if n not in b]:
        parts.append(f"column(s) {', '.join(repr(n) for n in only)} only in the JSON commits")
    if changed := [n for n in a if n in b and a[n] != b[n]]:
        parts.append(f"column(s) {', '.join(repr(n) for n in changed)} changed")
    return "; ".join(parts) or "field order or schema attributes differ"


def checkpoint_state(lines: Iterable[str]) -> tuple[ReplayState, dict[str, str]]:
    """A checkpoint's lines as a state (add lines kept) and its non-file lines by role."""
    state = ReplayState(keep_lines=True)
    by_role: dict[str, str] = {}
    rest: list[str] = []
    for line in lines:
        kind, body = line_action(json.loads(line))
        if kind in ("protocol", "metaData"):
            by_role[kind] = line
        elif kind == "txn" and isinstance(body, dict):
            by_role[f"txn:{body.get('appId')}"] = line
        elif kind == "domainMetadata" and isinstance(body, dict):
            by_role[f"domainMetadata:{body.get('domain')}"] = line
        rest.append(line)
    state.apply(rest)
    return state, by_role


__all__ = [
    "CheckpointState",
    "Disagreement",
    "ReplayState",
    "SegmentCheck",
    "check_action",
    "check_checkpoint",
    "check_segment",
    "check_supported",
    "checkpoint_state",
    "compare_to_checkpoint",
    "require_state",
]
