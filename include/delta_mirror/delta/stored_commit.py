"""The publisher's re-check of stored action lines: a version's lines must be safe to publish as
its commit file (one JSON object per line, one action readers can tell, and for a native commit
the rules ``SqlStore.commit`` applied). Publishing runs it on every version, so the common lines
(a canonical plain add, a plain commitInfo) take fast paths that accept exactly what the full
check accepts; everything else is parsed and checked in full.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from delta_mirror.delta.actions import (
    _KNOWN,
    _PLAIN_PATH,
    _STRICT_JSON,
    line_action,
    validate_action,
)
from delta_mirror.delta.log_path import LOG_DIR
from delta_mirror.errors import InvalidActionError

#: A JSON string with no raw control character or lone surrogate (the loop unrolled: linear time).
_JSON_STR = (
    r'"[^"\\\x00-\x1f\ud800-\udfff]*(?:\\(?:["\\/bfnrt]|u[0-9a-fA-F]{4})[^"\\\x00-\x1f\ud800-\udfff]*)*"'
)


@functools.cache
def _plain_add_matcher() -> Callable[[str], re.Match[str] | None]:
    """Matches a canonical add line (Delta-Spark key order, no whitespace) that ``_plain_add``
    accepts, without parsing it: a path of ``_PLAIN_PATH``'s characters, not under ``_delta_log``
    and without "..", string-or-null partition values, integer size (>= 0) and time, a bool, a
    string or null stats, nothing else. A line that does not match is parsed and checked in full.
    Compiled on first use (a few ms a process start that publishes nothing should not pay)."""
    return re.compile(
        r'\{"add":\{"path":"(?!' + re.escape(LOG_DIR) + r')(?![^"]*\.\.)[A-Za-z0-9_=+\-.][A-Za-z0-9_=+\-./]*"'
        r',"partitionValues":\{(?:' + _JSON_STR + ":(?:" + _JSON_STR + "|null)"
        r"(?:," + _JSON_STR + ":(?:" + _JSON_STR + r"|null))*)?\}"
        r',"size":(?:0|[1-9][0-9]*),"modificationTime":-?(?:0|[1-9][0-9]*),"dataChange":(?:true|false)'
        r'(?:,"stats":(?:' + _JSON_STR + r"|null))?\}\}"
    ).fullmatch


def _plain_add(body: Mapping[str, Any]) -> bool:
    """The common add, checked in one expression (publishing re-checks every stored line): the
    cheap type tests first, the path's pattern last, the partition values in a plain loop."""
    get = body.get
    path, size, pv, stats = get("path"), get("size"), get("partitionValues"), get("stats")
    if not (
        type(path) is str
        and type(size) is int
        and type(pv) is dict
        and (stats is None or type(stats) is str)
        and type(get("modificationTime")) is int
        and type(get("dataChange")) is bool
        and get("deletionVector") is None
        and size >= 0
        and _PLAIN_PATH.fullmatch(path) is not None
        and ".." not in path
        and not path.startswith(LOG_DIR)
    ):
        return False
    for key, value in pv.items():
        if type(key) is not str or (value is not None and type(value) is not str):
            return False
    return True


def _plain_commit_info(body: Mapping[str, Any]) -> bool:
    """A commitInfo both rules accept as it is (``_check_commit_info``: integer timestamps)."""
    ts, ict = body.get("timestamp"), body.get("inCommitTimestamp")
    return (ts is None or type(ts) is int) and (ict is None or type(ict) is int)


def _parse_all(lines: Sequence[str]) -> list[Any] | None:
    """All lines parsed as one JSON array, or None when any line is not exactly one valid value."""
    joined = ",".join(lines)
    if "\n" in joined:
        return None
    try:
        if not joined.isascii():  # only non-ASCII text can hold a lone surrogate
            joined.encode("utf-8")
        values = _STRICT_JSON.decode(f"[{joined}]")
    except (ValueError, RecursionError, UnicodeEncodeError):  # JSONDecodeError is a ValueError
        return None
    return values if isinstance(values, list) and len(values) == len(lines) else None


def check_stored_commit(
    lines: Sequence[str], *, table: str, version: int, location: str | None, native: bool
) -> None:
    """Stored action lines are safe to publish as ``version``'s commit file, or ``InvalidActionError``.

    Every line is one JSON object with no raw newline. A native commit's line holds exactly one
    action, which also passes ``validate_action`` (paths stay inside the table root); an imported
    line is kept as the source wrote it, so it only needs one action readers can tell (unknown keys
    beside it are theirs to ignore, see ``line_action``). This catches a writer that bypassed
    ``SqlStore.commit`` and wrote the store directly: the publisher halts the table at that version
    instead of publishing a file readers would choke on.
    """
    if not lines:
        raise InvalidActionError("the stored commit holds no actions", table=table, version=version)
    # A canonical plain add (most lines published) is recognised by one pattern, not parsed; the
    # other lines are parsed together in one C-level call and checked one by one.
    plain = _plain_add_matcher()
    rest = [(n, line) for n, line in enumerate(lines, start=1) if plain(line) is None]
    if not rest:
        return
    hint = "the store was written outside delta-mirror; repair or restore this version, then resume"
    parsed = _parse_all([line for _, line in rest])
    for i, (number, line) in enumerate(rest):
        if parsed is not None:
            obj = parsed[i]
            if _plain_line(obj):
                continue
        else:
            obj = _parse_stored(line, number, table, version, hint)
        action_type, body = _stored_action(line, obj, number, table, version, hint, native=native)
        if native and not (action_type == "add" and _plain_add(body)):
            try:
                validate_action(  # its default hint is replaced below
                    action_type, body, number=number, table=table, version=version, location=location
                )
            except InvalidActionError as exc:
                exc.what = f"stored {exc.what}"
                exc.hint = hint
                raise


def _plain_line(obj: Any) -> bool:
    """A parsed one-key {"add": {...}} passing ``_plain_add`` or {"commitInfo": {...}} passing
    ``_plain_commit_info``: what both the native and the imported rules accept as it is."""
    if type(obj) is not dict or len(obj) != 1:
        return False
    add = obj.get("add")
    if add is not None:
        return type(add) is dict and _plain_add(add)
    info = obj.get("commitInfo")
    return type(info) is dict and _plain_commit_info(info)


def _parse_stored(line: str, number: int, table: str, version: int, hint: str) -> Any:
    """One stored line parsed on its own, to name the bad one."""
    try:
        line.encode("utf-8")
        return _STRICT_JSON.decode(line)
    except (json.JSONDecodeError, RecursionError, UnicodeEncodeError) as exc:
        raise InvalidActionError(
            f"stored action {number} is not valid UTF-8 JSON ({type(exc).__name__})",
            table=table,
            version=version,
            hint=hint,
        ) from None


def _stored_action(
    line: str, obj: Any, number: int, table: str, version: int, hint: str, *, native: bool
) -> tuple[str, Any]:
    if "\n" in line or not isinstance(obj, dict) or (native and len(obj) != 1):
        shape = "one JSON object with one key" if native else "one JSON object"
        raise InvalidActionError(
            f"stored action {number} is not {shape}", table=table, version=version, hint=hint
        )
    try:
        action_type, body = line_action(obj)
    except ValueError as exc:
        raise InvalidActionError(
            f"stored line {number} {exc}", table=table, version=version, hint=hint
        ) from None
    if not isinstance(body, dict) and (native or action_type in _KNOWN):
        raise InvalidActionError(
            f"stored action {number} ({action_type}) has no object body",
            table=table,
            version=version,
            hint=hint,
        )
    return action_type, body


__all__ = ["check_stored_commit"]
