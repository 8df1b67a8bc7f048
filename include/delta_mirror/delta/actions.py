"""Delta actions as the protocol names them: parsing, validation and canonical encoding.

An action is one JSON object with exactly one key, the action type (``add``, ``remove``,
``metaData``, ``protocol``, ``txn``, ``commitInfo``, ``domainMetadata``, ``cdc``...). Its body keeps
key order and unknown fields; the canonical line is its compact UTF-8 JSON (no ASCII escaping),
which is how Delta-Spark writes commit files.
"""

from __future__ import annotations

import json
import posixpath
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any
from urllib.parse import unquote, urlparse

from delta_mirror.delta.log_path import LOG_DIR
from delta_mirror.errors import InvalidActionError

KNOWN_ACTIONS = (
    "commitInfo",
    "protocol",
    "metaData",
    "add",
    "remove",
    "txn",
    "domainMetadata",
    "cdc",
    "checkpointMetadata",
    "sidecar",
)

# Field order Delta-Spark writes (Jackson serialises case-class fields in declaration order).
SPARK_KEY_ORDER: dict[str, tuple[str, ...]] = {
    "commitInfo": (
        "inCommitTimestamp",
        "timestamp",
        "userId",
        "userName",
        "operation",
        "operationParameters",
        "job",
        "notebook",
        "clusterId",
        "readVersion",
        "isolationLevel",
        "isBlindAppend",
        "operationMetrics",
        "userMetadata",
        "tags",
        "engineInfo",
        "txnId",
    ),
    "protocol": ("minReaderVersion", "minWriterVersion", "readerFeatures", "writerFeatures"),
    "metaData": (
        "id",
        "name",
        "description",
        "format",
        "schemaString",
        "partitionColumns",
        "configuration",
        "createdTime",
    ),
    "add": (
        "path",
        "partitionValues",
        "size",
        "modificationTime",
        "dataChange",
        "stats",
        "tags",
        "deletionVector",
        "baseRowId",
        "defaultRowCommitVersion",
        "clusteringProvider",
    ),
    # RemoveFile declares ``stats`` last (it was added after the other fields).
    "remove": (
        "path",
        "deletionTimestamp",
        "dataChange",
        "extendedFileMetadata",
        "partitionValues",
        "size",
        "tags",
        "deletionVector",
        "baseRowId",
        "defaultRowCommitVersion",
        "stats",
    ),
    "txn": ("appId", "version", "lastUpdated"),
    "domainMetadata": ("domain", "configuration", "removed"),
    # AddCDCFile's constructor fields first, then its ``dataChange`` member (always false).
    "cdc": ("path", "partitionValues", "size", "tags", "dataChange"),
}
_DV_ORDER = ("storageType", "pathOrInlineDv", "offset", "sizeInBytes", "cardinality", "maxRowIndex")

Action = tuple[str, dict[str, Any]]


def canonical_line(action_type: str, body: Mapping[str, Any]) -> str:
    """The canonical one-line encoding of an action (compact, UTF-8, key order kept)."""
    return json.dumps({action_type: body}, separators=(",", ":"), ensure_ascii=False)


def render_commit(lines: Iterable[str]) -> bytes:
    """Commit file bytes: one action per line, every line ending in ``\\n``, no blank lines."""
    return "".join(line + "\n" for line in lines).encode("utf-8")


def _ordered(body: Mapping[str, Any], order: tuple[str, ...]) -> dict[str, Any]:
    out = {k: body[k] for k in order if k in body}
    out.update((k, v) for k, v in body.items() if k not in out)
    return out


def spark_ordered(action_type: str, body: Mapping[str, Any]) -> dict[str, Any]:
    """Reorder known keys as Delta-Spark writes them; unknown keys follow in their given order."""
    order = SPARK_KEY_ORDER.get(action_type)
    if order is None:
        return dict(body)
    out = _ordered(body, order)
    dv = out.get("deletionVector")
    if isinstance(dv, Mapping):
        out["deletionVector"] = _ordered(dv, _DV_ORDER)
    if action_type == "metaData" and isinstance(out.get("format"), Mapping):
        out["format"] = _ordered(out["format"], ("provider", "options"))
    return out


def dv_id(dv: Mapping[str, Any] | None) -> str:
    """The protocol's unique id of a deletion vector ('' for none): storageType + path [+ '@' + offset]."""
    if not dv:
        return ""
    text = f"{dv.get('storageType', '')}{dv.get('pathOrInlineDv', '')}"
    if dv.get("offset") is not None:
        text += f"@{dv['offset']}"
    return text


_PLAIN_PATH = re.compile(r"[A-Za-z0-9_=+\-.][A-Za-z0-9_=+\-./]*")
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


def _reject_constant(name: str) -> Any:
    # NaN / Infinity are not JSON: other readers would reject the commit file.
    raise json.JSONDecodeError(f"{name} is not valid JSON", name, 0)


def parse_actions(data: bytes, *, table: str, version: int | None = None) -> list[Action]:
    """Parse JSON lines of actions strictly (native commits): one object with one key per line."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidActionError(
            f"actions are not valid UTF-8 (byte {exc.start})",
            table=table,
            version=version,
            hint="write the actions file as UTF-8 JSON lines",
        ) from None
    out: list[Action] = []
    # Only '\n' separates actions: str.splitlines() would also split on U+2028, U+0085... which
    # are valid unescaped inside JSON strings.
    for number, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line, parse_constant=_reject_constant)
        except json.JSONDecodeError as exc:
            raise InvalidActionError(
                f"line {number}: malformed JSON ({exc.msg} at column {exc.colno})",
                table=table,
                version=version,
                hint='each line must be one JSON object such as {"add": {...}}',
            ) from None
        except RecursionError:
            raise InvalidActionError(
                f"line {number}: JSON nested too deeply",
                table=table,
                version=version,
                hint="actions are shallow objects; check the writer",
            ) from None
        if _SURROGATE_ESCAPE.search(line):
            try:  # an escaped lone surrogate ("\ud800") is valid JSON but not encodable as UTF-8
                json.dumps(obj, ensure_ascii=False).encode("utf-8")
            except UnicodeEncodeError:
                raise InvalidActionError(
                    f"line {number}: a string holds a lone UTF-16 surrogate escape (not valid Unicode)",
                    table=table,
                    version=version,
                    hint="write strings as valid UTF-8 (surrogate escapes only in pairs)",
                ) from None
        if not isinstance(obj, dict) or len(obj) != 1:
            raise InvalidActionError(
                f"line {number}: an action must be a JSON object with exactly one key (the action type)",
                table=table,
                version=version,
                hint='e.g. {"add": {...}}',
            )
        ((action_type, body),) = obj.items()
        if not isinstance(body, dict):
            raise InvalidActionError(
                f"line {number}: the body of '{action_type}' must be a JSON object",
                table=table,
                version=version,
                hint=f'e.g. {{"{action_type}": {{...}}}}',
            )
        out.append((action_type, body))
    if not out:
        raise InvalidActionError(
            "the commit holds no actions", table=table, version=version, hint="pass at least one action"
        )
    return out


def split_commit(data: bytes, *, table: str, version: int | None = None) -> tuple[list[str], list[Action]]:
    """A writer's commit file as (lines, actions), kept verbatim: ``render_commit(lines) == data``.

    The bytes must be what ``render_commit`` produces — every line one action ending in ``\\n``, no
    blank line — so that the stored lines republish the file byte for byte (Delta-Spark writes
    exactly that). Each line is parsed strictly, as ``parse_actions`` does.
    """
    hint = "send the commit file as Delta-Spark writes it: one JSON action per line, each ending in \\n"
    if not data.endswith(b"\n"):
        raise InvalidActionError(
            "the commit file does not end with a newline", table=table, version=version, hint=hint
        )
    actions = parse_actions(data, table=table, version=version)  # UTF-8 and JSON, line by line
    lines = data[:-1].decode("utf-8").split("\n")
    if len(lines) != len(actions):
        number = next(i for i, line in enumerate(lines, start=1) if not line.strip())
        raise InvalidActionError(f"line {number} is blank", table=table, version=version, hint=hint)
    if render_commit(lines) != data:  # the invariant the verbatim path stands on
        raise AssertionError("render_commit does not reproduce the commit bytes")
    return lines, actions


def _require(
    body: Mapping[str, Any],
    field: str,
    kinds: type | tuple[type, ...],
    where: str,
    table: str,
    version: int | None,
    optional: bool = False,
) -> None:
    if field not in body or body[field] is None:
        if optional:
            return
        raise InvalidActionError(
            f"{where}: missing required field '{field}'",
            table=table,
            version=version,
            hint="see the Delta protocol's action reference",
        )
    value = body[field]
    if isinstance(value, bool) and kinds in (int, (int,)):
        raise InvalidActionError(f"{where}: field '{field}' must be an integer", table=table, version=version)
    if not isinstance(value, kinds):
        names = kinds.__name__ if isinstance(kinds, type) else "/".join(k.__name__ for k in kinds)
        raise InvalidActionError(
            f"{where}: field '{field}' must be {names}, got {type(value).__name__}",
            table=table,
            version=version,
        )


def check_data_path(path: str, *, table: str, version: int | None, where: str, location: str | None) -> None:
    """A data file path must stay inside the table root: no ``..``, no other bucket or folder."""
    if _PLAIN_PATH.fullmatch(path) and ".." not in path and not path.startswith(LOG_DIR):
        return  # the common case, decided without parsing: relative, nothing encoded, no dot-dot
    if not path:
        raise InvalidActionError(f"{where}: empty path", table=table, version=version)
    parsed = urlparse(path)
    if parsed.scheme and len(parsed.scheme) > 1:
        root = (location or "").rstrip("/")
        if not root or not path.startswith(root + "/"):
            raise InvalidActionError(
                f"{where}: path '{path}' is outside the table root {root or '(unknown)'}",
                table=table,
                version=version,
                hint="use a path relative to the table root",
            )
        rel = path[len(root) + 1 :]
    else:
        rel = path
    decoded = unquote(rel)
    if decoded.startswith("/") or "\\" in decoded or "\x00" in decoded:
        raise InvalidActionError(
            f"{where}: path '{path}' must be relative to the table root",
            table=table,
            version=version,
            hint="remove the leading '/'",
        )
    parts = decoded.split("/")
    if ".." in parts or posixpath.normpath(decoded).startswith(".."):
        raise InvalidActionError(
            f"{where}: path '{path}' escapes the table root",
            table=table,
            version=version,
            hint="'..' is not allowed in data file paths",
        )
    if parts[0] == "_delta_log":
        raise InvalidActionError(
            f"{where}: path '{path}' points into _delta_log/",
            table=table,
            version=version,
            hint="data files live outside _delta_log/",
        )


def _check_protocol_features(body: Mapping[str, Any], where: str, table: str, version: int | None) -> None:
    """Versions that exist, reader features we know (as import does), reader ⊆ writer features."""
    from delta_mirror.delta.source_log import CATALOG_FEATURES, KNOWN_READER_FEATURES

    reader, writer = body["minReaderVersion"], body["minWriterVersion"]
    if reader > 3 or writer > 7:
        raise InvalidActionError(
            f"{where}: protocol {reader}/{writer} does not exist (at most minReaderVersion 3, minWriterVersion 7)",
            table=table,
            version=version,
            hint="use table features (3/7) for newer capabilities",
        )
    readers = body.get("readerFeatures") or []
    unknown = [f for f in readers if f not in KNOWN_READER_FEATURES and f not in CATALOG_FEATURES]
    if unknown:
        raise InvalidActionError(
            f"{where}: unknown reader feature(s) {', '.join(repr(f) for f in unknown)}",
            table=table,
            version=version,
            hint="delta-mirror cannot vouch that readers handle it; drop the feature or upgrade delta-mirror",
        )
    missing = [f for f in readers if f not in (body.get("writerFeatures") or [])]
    if missing:
        raise InvalidActionError(
            f"{where}: reader feature(s) {', '.join(repr(f) for f in missing)} missing from writerFeatures",
            table=table,
            version=version,
            hint="the protocol requires every reader feature in writerFeatures too",
        )


def _check_string_map(value: Any, field: str, where: str, table: str, version: int | None) -> None:
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and (v is None or isinstance(v, str)) for k, v in value.items()
    ):
        raise InvalidActionError(
            f"{where}: '{field}' must map strings to strings (or null)", table=table, version=version
        )


def validate_action(
    action_type: str,
    body: Mapping[str, Any],
    *,
    number: int,
    table: str,
    version: int | None,
    location: str | None,
) -> None:
    """Check one action of a native commit against the protocol's required fields."""
    try:
        _validate_action(action_type, body, number=number, table=table, version=version, location=location)
    except InvalidActionError as exc:
        if exc.hint is None:  # every refusal says what to do
            exc.hint = f"fix action {number} of the commit (see the Delta protocol's '{action_type}' action)"
        raise


def _validate_action(
    action_type: str,
    body: Mapping[str, Any],
    *,
    number: int,
    table: str,
    version: int | None,
    location: str | None,
) -> None:
    where = f"action {number} ({action_type})"
    req = _require
    if action_type in ("add", "remove", "cdc"):
        req(body, "path", str, where, table, version)
        check_data_path(body["path"], table=table, version=version, where=where, location=location)
        req(body, "dataChange", bool, where, table, version)
        if action_type in ("add", "cdc"):
            req(body, "size", int, where, table, version)
            req(body, "partitionValues", dict, where, table, version)
            _check_string_map(body["partitionValues"], "partitionValues", where, table, version)
        if action_type == "add":
            req(body, "modificationTime", int, where, table, version)
            req(body, "stats", str, where, table, version, optional=True)
        else:
            req(body, "size", int, where, table, version, optional=True)
            req(body, "deletionTimestamp", int, where, table, version, optional=True)
        size = body.get("size")
        if isinstance(size, int) and size < 0:
            raise InvalidActionError(
                f"{where}: size must not be negative (got {size})", table=table, version=version
            )
        dv = body.get("deletionVector")
        if dv is not None:
            if not isinstance(dv, dict):
                raise InvalidActionError(
                    f"{where}: deletionVector must be an object", table=table, version=version
                )
            for field, kind in (
                ("storageType", str),
                ("pathOrInlineDv", str),
                ("sizeInBytes", int),
                ("cardinality", int),
            ):
                req(dv, field, kind, f"{where}.deletionVector", table, version)
    elif action_type == "metaData":
        req(body, "id", str, where, table, version)
        req(body, "format", dict, where, table, version)
        req(body["format"], "provider", str, f"{where}.format", table, version)
        req(body, "schemaString", str, where, table, version)
        try:
            schema = json.loads(body["schemaString"])
        except json.JSONDecodeError:
            raise InvalidActionError(
                f"{where}: schemaString is not valid JSON", table=table, version=version
            ) from None
        if not isinstance(schema, dict) or schema.get("type") != "struct":
            raise InvalidActionError(
                f"{where}: schemaString must be a struct type", table=table, version=version
            )
        req(body, "partitionColumns", list, where, table, version)
        if not all(isinstance(c, str) for c in body["partitionColumns"]):
            raise InvalidActionError(
                f"{where}: partitionColumns must be strings", table=table, version=version
            )
        if "configuration" in body:
            _check_string_map(body["configuration"], "configuration", where, table, version)
    elif action_type == "protocol":
        req(body, "minReaderVersion", int, where, table, version)
        req(body, "minWriterVersion", int, where, table, version)
        reader, writer = body["minReaderVersion"], body["minWriterVersion"]
        if reader < 1 or writer < 1:
            raise InvalidActionError(
                f"{where}: protocol versions must be positive", table=table, version=version
            )
        if "readerFeatures" in body and reader != 3:
            raise InvalidActionError(
                f"{where}: readerFeatures is only allowed with minReaderVersion 3",
                table=table,
                version=version,
                hint="set minReaderVersion to 3 or drop readerFeatures",
            )
        if "writerFeatures" in body and writer != 7:
            raise InvalidActionError(
                f"{where}: writerFeatures is only allowed with minWriterVersion 7",
                table=table,
                version=version,
                hint="set minWriterVersion to 7 or drop writerFeatures",
            )
        # Delta-Spark refuses the converse too ("Mismatched minReaderVersion and readerFeatures").
        if reader == 3 and writer != 7:
            raise InvalidActionError(
                f"{where}: minReaderVersion 3 needs minWriterVersion 7",
                table=table,
                version=version,
                hint="table features need writer version 7",
            )
        for field, level in (("readerFeatures", reader == 3), ("writerFeatures", writer == 7)):
            if level and field not in body:
                what = "minReaderVersion 3" if field == "readerFeatures" else "minWriterVersion 7"
                raise InvalidActionError(
                    f"{where}: {what} needs {field} (a list, possibly empty)",
                    table=table,
                    version=version,
                    hint=f'add "{field}": [...]',
                )
            if field in body and not (
                isinstance(body[field], list) and all(isinstance(f, str) for f in body[field])
            ):
                raise InvalidActionError(
                    f"{where}: {field} must be a list of strings", table=table, version=version
                )
        _check_protocol_features(body, where, table, version)
    elif action_type == "txn":
        req(body, "appId", str, where, table, version)
        req(body, "version", int, where, table, version)
    elif action_type == "domainMetadata":
        req(body, "domain", str, where, table, version)
        req(body, "configuration", str, where, table, version)
        req(body, "removed", bool, where, table, version)
    elif action_type == "commitInfo":
        # Free-form provenance, but the timestamps feed in-commit timestamps and must be integers.
        req(body, "timestamp", int, where, table, version, optional=True)
        req(body, "inCommitTimestamp", int, where, table, version, optional=True)
    else:
        raise InvalidActionError(
            f"{where}: unknown action type '{action_type}'",
            table=table,
            version=version,
            hint=f"native commits take {', '.join(KNOWN_ACTIONS[:8])}",
        )


def _plain_add(body: Mapping[str, Any]) -> bool:
    """The common add, checked in one expression (publishing re-checks every stored line)."""
    path, size, pv, stats = body.get("path"), body.get("size"), body.get("partitionValues"), body.get("stats")
    return (
        type(path) is str
        and _PLAIN_PATH.fullmatch(path) is not None
        and ".." not in path
        and not path.startswith(LOG_DIR)
        and type(size) is int
        and size >= 0
        and type(body.get("modificationTime")) is int
        and type(body.get("dataChange")) is bool
        and type(pv) is dict
        and all(type(k) is str and (v is None or type(v) is str) for k, v in pv.items())
        and (stats is None or type(stats) is str)
        and body.get("deletionVector") is None
    )


def _parse_all(lines: Sequence[str]) -> list[Any] | None:
    """All lines parsed as one JSON array, or None when any line is not exactly one valid value."""
    joined = ",".join(lines)
    if "\n" in joined:
        return None
    try:
        joined.encode("utf-8")
        values = json.loads(f"[{joined}]", parse_constant=_reject_constant)
    except (ValueError, RecursionError, UnicodeEncodeError):  # JSONDecodeError is a ValueError
        return None
    return values if isinstance(values, list) and len(values) == len(lines) else None


def check_stored_commit(
    lines: Sequence[str], *, table: str, version: int, location: str | None, native: bool
) -> None:
    """Stored action lines are safe to publish as ``version``'s commit file, or ``InvalidActionError``.

    Every line is one JSON object holding one action, with no raw newline; a native commit's
    actions also pass ``validate_action`` (paths stay inside the table root). This catches a
    writer that bypassed ``SqlStore.commit`` and wrote the store directly: the publisher halts the
    table at that version instead of publishing a file readers would choke on.
    """
    if not lines:
        raise InvalidActionError("the stored commit holds no actions", table=table, version=version)
    hint = "the store was written outside delta-mirror; repair or restore this version, then resume"
    parsed = _parse_all(lines)  # one C-level parse: publishing re-checks every stored line
    for number, line in enumerate(lines, start=1):
        if parsed is not None:
            obj = parsed[number - 1]
        else:  # something is wrong: parse line by line to name the bad action
            try:
                line.encode("utf-8")
                obj = json.loads(line, parse_constant=_reject_constant)
            except (json.JSONDecodeError, RecursionError, UnicodeEncodeError) as exc:
                raise InvalidActionError(
                    f"stored action {number} is not valid UTF-8 JSON ({type(exc).__name__})",
                    table=table,
                    version=version,
                    hint=hint,
                ) from None
        if "\n" in line or not isinstance(obj, dict) or len(obj) != 1:
            raise InvalidActionError(
                f"stored action {number} is not one JSON object with one key",
                table=table,
                version=version,
                hint=hint,
            )
        ((action_type, body),) = obj.items()
        if not isinstance(body, dict):
            raise InvalidActionError(
                f"stored action {number} ({action_type}) has no object body",
                table=table,
                version=version,
                hint=hint,
            )
        if native and not (action_type == "add" and _plain_add(body)):
            try:
                _validate_action(
                    action_type, body, number=number, table=table, version=version, location=location
                )
            except InvalidActionError as exc:
                exc.what = f"stored {exc.what}"
                exc.hint = hint
                raise


__all__ = [
    "KNOWN_ACTIONS",
    "SPARK_KEY_ORDER",
    "Action",
    "canonical_line",
    "check_data_path",
    "check_stored_commit",
    "dv_id",
    "parse_actions",
    "render_commit",
    "spark_ordered",
    "split_commit",
    "validate_action",
]
