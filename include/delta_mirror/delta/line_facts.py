"""What the store indexes of each imported log line, taken while the line is parsed once.

An import stores every line verbatim (``dl_actions``) and indexes its ``add`` / ``remove`` actions
(``dl_files``). Parsing a line is most of the cost of reading a log, so the reader keeps, beside
each commit's canonical lines, these facts (the action type of every line, the file key and
fields of its file actions) and the store never parses the lines again.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from delta_mirror.delta.actions import dv_id, line_action
from delta_mirror.errors import InvalidActionError

# An ``add`` or ``remove`` line: (seq, kind, path, deletion vector id, size, partition values as
# compact JSON, deletion timestamp). ``path`` is the action's own value ('' when absent); ``size``
# and ``partitionValues`` are an add's, the timestamp a remove's (None otherwise). Plain tuples: a
# log holds millions of them.
FileAction = tuple[int, str, Any, str, "int | None", "str | None", "int | None"]
SEQ, KIND, PATH, DV_ID, SIZE, PARTITION_VALUES, DELETION_TIMESTAMP = range(7)


@dataclass
class LineFacts:
    """The action type of every line of one commit (or snapshot), its file actions, and the raw
    ``inCommitTimestamp`` of a leading ``commitInfo``."""

    kinds: list[str] = field(default_factory=list)
    files: list[FileAction] = field(default_factory=list)
    in_commit_timestamp: Any = None

    def add(self, kind: str, body: Any) -> None:
        """Record the next line's action (``line_action`` of its object)."""
        seq = len(self.kinds)
        self.kinds.append(kind)
        if kind == "add" or kind == "remove":
            self.files.append(file_action(seq, kind, body))
        elif seq == 0 and kind == "commitInfo":
            self.in_commit_timestamp = body.get("inCommitTimestamp")


def file_action(seq: int, kind: str, body: Any) -> FileAction:
    """The facts of an ``add`` or ``remove`` line (its body)."""
    dv = body.get("deletionVector")
    if kind == "add":
        pv = body.get("partitionValues")
        return (
            seq,
            kind,
            body.get("path", ""),
            dv_id(dv) if dv else "",
            _int_or_none(body.get("size"), kind, "size"),
            None if pv is None else partition_values_text(pv),
            None,
        )
    return (
        seq,
        kind,
        body.get("path", ""),
        dv_id(dv) if dv else "",
        None,
        None,
        _int_or_none(body.get("deletionTimestamp"), kind, "deletionTimestamp"),
    )


class FileFieldError(ValueError):
    """A field the store indexes holds a value no Delta reader accepts (a boolean where an integer
    belongs: JSON ``true`` would otherwise be stored as 1 on SQLite and fail inside PostgreSQL)."""


def _int_or_none(value: Any, kind: str, name: str) -> int | None:
    if type(value) is int or value is None:
        return value
    if isinstance(value, bool):
        raise FileFieldError(f"the {kind} action's '{name}' is {str(value).lower()}, not an integer")
    return value if isinstance(value, int) else None


REPAIR_HINT = (
    "the source log is corrupt; repair the action with a Delta writer (or from a backup), then import again"
)


def refusal(
    exc: FileFieldError, *, table: str | None, version: int | None, line: int | None = None
) -> InvalidActionError:
    """The import's one-line refusal of a ``FileFieldError`` (which line of which version)."""
    where = f"line {line}: " if line is not None else ""
    return InvalidActionError(f"{where}{exc}", table=table, version=version, hint=REPAIR_HINT)


_PV_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)
_PV_CACHE: dict[tuple[tuple[str, str | None], ...], str] = {}
_PV_CACHE_MAX = 100_000


def partition_values_text(pv: Any) -> str:
    """``json.dumps(pv, separators=(",", ":"), ensure_ascii=False)``, remembered for the common
    case (string keys and values): a table has far fewer partitions than files."""
    if type(pv) is not dict:
        return _PV_ENCODER.encode(pv)
    for v in pv.values():
        if type(v) is not str and v is not None:
            return _PV_ENCODER.encode(pv)
    key = tuple(pv.items())
    text = _PV_CACHE.get(key)
    if text is None:
        if len(_PV_CACHE) >= _PV_CACHE_MAX:
            _PV_CACHE.clear()
        text = _PV_CACHE[key] = _PV_ENCODER.encode(pv)
    return text


def facts_of_objects(
    objects: Iterable[Mapping[str, Any]], *, table: str | None = None, version: int | None = None
) -> LineFacts:
    """The facts of already parsed line objects (``LineFacts.add`` for each, inlined: this runs
    once per line of the log). A ``FileFieldError`` is refused naming ``table``, ``version``, line."""
    facts = LineFacts()
    kinds, files = facts.kinds, facts.files
    for seq, obj in enumerate(objects):
        kind, body = line_action(obj) if len(obj) != 1 else next(iter(obj.items()))
        kinds.append(kind)
        if kind == "add" or kind == "remove":
            try:
                files.append(file_action(seq, kind, body))
            except FileFieldError as exc:
                raise refusal(exc, table=table, version=version, line=seq + 1) from None
        elif seq == 0 and kind == "commitInfo":
            facts.in_commit_timestamp = body.get("inCommitTimestamp")
    return facts


def facts_of_lines(
    lines: Iterable[str], *, table: str | None = None, version: int | None = None
) -> LineFacts:
    """The facts of canonical lines (snapshot lines that were not read as objects)."""
    return facts_of_objects((json.loads(line) for line in lines), table=table, version=version)


__all__ = [
    "DELETION_TIMESTAMP",
    "DV_ID",
    "KIND",
    "PARTITION_VALUES",
    "PATH",
    "SEQ",
    "SIZE",
    "FileAction",
    "FileFieldError",
    "LineFacts",
    "facts_of_lines",
    "facts_of_objects",
    "file_action",
    "partition_values_text",
    "refusal",
]
