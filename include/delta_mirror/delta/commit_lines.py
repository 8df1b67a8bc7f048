"""A JSON commit's lines as an import keeps them: each line parsed once, re-encoded canonically,
and what the store indexes of it taken on the way (``delta.line_facts``).

Tolerates what real writers produce (blank lines, no trailing newline, spaces after ``:`` and
``,``, unknown keys beside the action, see ``line_action``) but nothing that would make the
actions ambiguous. The hot loop of an import calls the C scanner and encoder behind ``json``
directly; anything they do not plainly accept goes through ``_parse_line``, which decides and
words every refusal, so the fast path changes no outcome.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from delta_mirror.delta.actions import KNOWN_ACTIONS, canonical_json, line_action
from delta_mirror.delta.line_facts import (
    FileAction,
    FileFieldError,
    LineFacts,
    facts_of_objects,
    file_action,
    partition_values_text,
    refusal,
)
from delta_mirror.errors import DataError, InvalidActionError

# Action types whose payload must be a JSON object; unknown types are kept as they are.
OBJECT_ACTIONS: frozenset[str] = frozenset(KNOWN_ACTIONS)
_JSON_SPACE = " \t\n\r"


def _reject_constant(name: str) -> Any:
    # NaN / Infinity are not JSON; Delta readers (Jackson, serde) reject them.
    raise ValueError(f"non-standard JSON constant {name}")


# ``json.loads``' C scanner without its per-line Python wrapper, and ``canonical_json``'s encoder
# without its own (same settings, same output; parsed JSON holds nothing it could refuse).
_SCAN_ONCE: Callable[[str, int], tuple[Any, int]] = json.JSONDecoder(
    parse_constant=_reject_constant
).scan_once  # type: ignore[attr-defined]
_MAKE_ENCODER: Any = getattr(json.encoder, "c_make_encoder", None)
_C_ENCODE: Callable[[Any, int], Any] | None = (
    _MAKE_ENCODER(None, None, json.encoder.encode_basestring, None, ":", ",", False, False, False)
    if _MAKE_ENCODER is not None
    else None
)


# A canonical plain add line (Delta-Spark's key order, no whitespace), recognised without parsing
# it: ``canonical_json`` of its object is the line itself and its facts are in the groups. Strings
# hold only what the canonical encoder writes (no escape in the path and the partition values; in
# the stats only the escapes it makes), integers as it writes them (no "-0", no leading zero);
# nothing else, no other key. Any other line takes the full path, so the result is the same. A
# partition-values object must also re-encode to itself (no repeated key): ``_plain_partitions``.
_PLAIN = r'[^"\\\x00-\x1f]*'
_CANONICAL_STR = r'"(?:[^"\\\x00-\x1f]|\\["\\bfnrt]|\\u00(?:0[0-7bef]|1[0-9a-f]))*"'
_INT = r"(?:0|-?[1-9][0-9]*)"
_PLAIN_ADD: Callable[[str], re.Match[str] | None] = re.compile(
    r'\{"add":\{"path":"('
    + _PLAIN
    + r')","partitionValues":(\{(?:"'
    + _PLAIN
    + r'":(?:"'
    + _PLAIN
    + r'"|null)(?:,"'
    + _PLAIN
    + r'":(?:"'
    + _PLAIN
    + r'"|null))*)?\})'
    r',"size":(' + _INT + r'),"modificationTime":' + _INT + r',"dataChange":(?:true|false)'
    r'(?:,"stats":(?:' + _CANONICAL_STR + r"|null))?\}\}"
).fullmatch
_PARTITIONS: dict[str, str | None] = {}  # partition-values text -> itself when canonical, else None
_PARTITIONS_MAX = 100_000


def _plain_partitions(text: str) -> str | None:
    """``text`` (one object per partition, shared by its files) when it is what
    ``partition_values_text`` makes of its object, else None."""
    if len(_PARTITIONS) >= _PARTITIONS_MAX:
        _PARTITIONS.clear()
    same = partition_values_text(json.loads(text)) == text
    _PARTITIONS[text] = out = text if same else None
    return out


def _text(data: bytes, *, table: str, version: int) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DataError(
            f"commit file is not valid UTF-8 (invalid byte at offset {exc.start})",
            table=table,
            version=version,
            hint="Delta commit files must be UTF-8; the source file is corrupt or was not written by a Delta writer",
        ) from exc


def parse_commit_bytes(data: bytes, *, table: str, version: int) -> list[dict[str, Any]]:
    """Parse a commit (or V2 JSON checkpoint) into its ordered line objects."""
    lines: list[dict[str, Any]] = []
    # Split on "\n" only: str.splitlines() would also split on U+2028 etc. inside JSON strings.
    for lineno, line in enumerate(_text(data, table=table, version=version).split("\n"), start=1):
        if line and not line.isspace():
            obj = _fast_object(line)
            lines.append(obj if obj is not None else _parse_line(line, lineno, table=table, version=version))
    return lines


# Lines of a large commit handed to ``on_lines`` at a time (an import stores them while the rest of
# the commit is still being parsed); the first chunk is smaller, so the database starts sooner.
LINES_CHUNK = 20_000
FIRST_LINES_CHUNK = 5_000
LinesCallback = Callable[[int, list[str], list[str], list[FileAction]], None]


def adds_only(data: bytes) -> bool:
    """Whether the commit surely holds no ``remove`` (its file actions are adds only): no
    ``"remove"`` in the bytes and no ``\\u`` escape that could spell that key otherwise."""
    return b'"remove"' not in data and b"\\u" not in data


def read_commit(
    data: bytes, *, table: str, version: int, on_lines: LinesCallback | None = None
) -> tuple[list[str], LineFacts]:
    """The commit's canonical lines and their facts: ``parse_commit_bytes``, ``canonical_json``
    and ``facts_of_objects`` in one pass (same results, same refusals). ``on_lines(first_seq,
    kinds, lines, files)`` receives each full ``LINES_CHUNK`` of lines as soon as it is parsed (they
    are also in the result; the first one holds ``FIRST_LINES_CHUNK``), with their file actions when
    the commit holds adds only (``adds_only``; else ``[]``: a store can index a version's adds
    before its end only when no remove of it can come first); a refusal later in the commit still
    raises."""
    if _C_ENCODE is None:
        objects = parse_commit_bytes(data, table=table, version=version)
        return [canonical_json(o) for o in objects], facts_of_objects(objects, table=table, version=version)
    lines: list[str] = []
    facts = LineFacts()
    kinds, files = facts.kinds, facts.files
    sent, cut = 0, min(FIRST_LINES_CHUNK, LINES_CHUNK) if on_lines is not None else -1
    files_sent, early_files = 0, on_lines is not None and adds_only(data)
    plain_add = _PLAIN_ADD
    for lineno, line in enumerate(_text(data, table=table, version=version).split("\n"), start=1):
        if not line or line.isspace():
            continue
        if (m := plain_add(line)) is not None and (pv := _partitions(m[2])):
            files.append((len(kinds), "add", m[1], "", int(m[3]), pv, None))
            kinds.append("add")
            lines.append(line)
        else:
            lines.append(_parsed_line(line, lineno, facts, table=table, version=version))
        if len(lines) == cut and on_lines is not None:
            on_lines(sent, kinds[sent:], lines[sent:], files[files_sent:] if early_files else [])
            sent, cut, files_sent = cut, cut + LINES_CHUNK, len(files)
    return lines, facts


def _partitions(text: str) -> str | None:
    """``_plain_partitions(text)``, remembered."""
    pv = _PARTITIONS.get(text, "")
    return _plain_partitions(text) if pv == "" else pv


def _parsed_line(line: str, lineno: int, facts: LineFacts, *, table: str, version: int) -> str:
    """Any line but a canonical plain add: parsed, its action recorded in ``facts``, its
    canonical text returned (or the line refused)."""
    text = line.strip(_JSON_SPACE)
    try:
        obj, end = _SCAN_ONCE(text, 0)
    except (StopIteration, ValueError):
        obj, end = None, -1
    if end == len(text) and type(obj) is dict and len(obj) == 1:
        ((kind, body),) = obj.items()
        if kind in OBJECT_ACTIONS and type(body) is not dict:
            _parse_line(line, lineno, table=table, version=version)  # refuses it
    else:
        obj = _fast_object(line) or _parse_line(line, lineno, table=table, version=version)
        kind, body = line_action(obj)
    seq = len(facts.kinds)
    facts.kinds.append(kind)
    if kind == "add" or kind == "remove":
        try:
            facts.files.append(file_action(seq, kind, body))
        except FileFieldError as exc:
            raise refusal(exc, table=table, version=version, line=lineno) from None
    elif seq == 0 and kind == "commitInfo":
        facts.in_commit_timestamp = body.get("inCommitTimestamp")
    try:
        return "".join(_C_ENCODE(obj, 0))  # type: ignore[misc]
    except (TypeError, ValueError):
        return canonical_json(obj)


def _fast_object(line: str) -> dict[str, Any] | None:
    """The line's object when it is plainly valid (one object, one known action whose body is an
    object, or an unknown action); None to let ``_parse_line`` decide."""
    text = line.strip(_JSON_SPACE)
    try:
        obj, end = _SCAN_ONCE(text, 0)
    except (StopIteration, ValueError):
        return None
    if end != len(text) or type(obj) is not dict:
        return None
    known = [k for k in obj if k in OBJECT_ACTIONS]
    if len(known) > 1 or (known and type(obj[known[0]]) is not dict) or not obj:
        return None
    return obj


def _parse_line(line: str, lineno: int, *, table: str, version: int) -> dict[str, Any]:
    hint = "the source commit file is corrupt; repair it before importing"
    try:
        obj = json.loads(line, parse_constant=_reject_constant)
    except ValueError as exc:
        raise InvalidActionError(
            f"line {lineno} is not valid JSON: {exc}", table=table, version=version, hint=hint
        ) from exc
    if not isinstance(obj, dict):
        raise InvalidActionError(
            f"line {lineno} must be a JSON object holding an action, got {type(obj).__name__}",
            table=table,
            version=version,
            hint=hint,
        )
    try:
        kind, payload = line_action(obj)
    except ValueError as exc:
        raise InvalidActionError(f"line {lineno} {exc}", table=table, version=version, hint=hint) from None
    if kind in OBJECT_ACTIONS and not isinstance(payload, dict):
        raise InvalidActionError(
            f"line {lineno}: the '{kind}' action must be a JSON object, got {type(payload).__name__}",
            table=table,
            version=version,
        )
    return obj


__all__ = ["LINES_CHUNK", "OBJECT_ACTIONS", "LinesCallback", "adds_only", "parse_commit_bytes", "read_commit"]
