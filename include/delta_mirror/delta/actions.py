"""Delta actions as the protocol names them: parsing, validation and canonical encoding.

An action is one JSON object with exactly one key, the action type (``add``, ``remove``,
``metaData``, ``protocol``, ``txn``, ``commitInfo``, ``domainMetadata``, ``cdc``...). Its body keeps
key order and unknown fields; the canonical line is its compact UTF-8 JSON (no ASCII escaping),
which is how Delta-Spark writes commit files. Native commits are held to exactly that; a line of
an imported log may also carry unknown keys beside its action, which readers ignore
(``line_action``).
"""

from __future__ import annotations

import json
import posixpath
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import unquote, urlparse

from delta_mirror.delta.log_path import LOG_DIR
from delta_mirror.delta.protocol import CATALOG_FEATURES, KNOWN_READER_FEATURES
from delta_mirror.errors import InvalidActionError

# fmt: off
KNOWN_ACTIONS = (
    "commitInfo", "protocol", "metaData", "add", "remove", "txn", "domainMetadata", "cdc",
    "checkpointMetadata", "sidecar",
)

# Field order Delta-Spark writes (Jackson serialises case-class fields in declaration order).
SPARK_KEY_ORDER: dict[str, tuple[str, ...]] = {
    "commitInfo": (
        "inCommitTimestamp", "timestamp", "userId", "userName", "operation", "operationParameters",
        "job", "notebook", "clusterId", "readVersion", "isolationLevel", "isBlindAppend",
        "operationMetrics", "userMetadata", "tags", "engineInfo", "txnId",
    ),
    "protocol": ("minReaderVersion", "minWriterVersion", "readerFeatures", "writerFeatures"),
    "metaData": (
        "id", "name", "description", "format", "schemaString", "partitionColumns", "configuration",
        "createdTime",
    ),
    "add": (
        "path", "partitionValues", "size", "modificationTime", "dataChange", "stats", "tags",
        "deletionVector", "baseRowId", "defaultRowCommitVersion", "clusteringProvider",
    ),
    # RemoveFile declares ``stats`` last (it was added after the other fields).
    "remove": (
        "path", "deletionTimestamp", "dataChange", "extendedFileMetadata", "partitionValues", "size",
        "tags", "deletionVector", "baseRowId", "defaultRowCommitVersion", "stats",
    ),
    "txn": ("appId", "version", "lastUpdated"),
    "domainMetadata": ("domain", "configuration", "removed"),
    # AddCDCFile's constructor fields first, then its ``dataChange`` member (always false).
    "cdc": ("path", "partitionValues", "size", "tags", "dataChange"),
}
# fmt: on
_DV_ORDER = ("storageType", "pathOrInlineDv", "offset", "sizeInBytes", "cardinality", "maxRowIndex")

_KNOWN = frozenset(KNOWN_ACTIONS)

Action = tuple[str, dict[str, Any]]


# Same output as json.dumps(..., separators=(",", ":"), ensure_ascii=False); one shared encoder
# saves building a new one per action (300k-action commits exist).
_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def canonical_json(line: Mapping[str, Any]) -> str:
    """The canonical text of one log line (every key of it, in order): compact separators, UTF-8
    kept unescaped, as Delta-Spark (Jackson) writes commit files (docs/how-it-works.md)."""
    obj = line if isinstance(line, dict) else dict(line)
    try:
        return _ENCODER.encode(obj)
    except (TypeError, ValueError) as exc:  # NaN / Infinity, or a value JSON has no form for
        raise InvalidActionError(
            f"action cannot be encoded as JSON: {exc}", hint="actions hold JSON values only (no NaN)"
        ) from exc


def canonical_line(action_type: str, body: Mapping[str, Any]) -> str:
    """The canonical one-line encoding of one action (compact, UTF-8, key order kept)."""
    return canonical_json({action_type: body})


def line_action(obj: Mapping[str, Any]) -> tuple[str, Any]:
    """The action a log line carries, as Delta readers see it: ``(action type, body)``.

    Readers ignore what they do not know (PROTOCOL.md): keys beside the one known action on a line
    (Spark's forward-compatible writers put some there) are skipped; a line holding only unknown
    keys is an unknown action, named by its first key. Raises ``ValueError`` (with the reason) for a
    line with no key or with two known actions (readers disagree on which one counts).
    """
    known = [k for k in obj if k in _KNOWN]
    if len(known) == 1:
        return known[0], obj[known[0]]
    if known:
        raise ValueError(f"holds {len(known)} actions ({', '.join(repr(k) for k in known)}), not one")
    if not obj:
        raise ValueError("is an empty object, not an action")
    first = next(iter(obj))
    return first, obj[first]


def render_commit(lines: Iterable[str]) -> bytes:
    """Commit file bytes: one action per line, every line ending in ``\\n``, no blank lines."""
    seq = lines if isinstance(lines, list) else list(lines)
    # One join and one concatenation (not a string per line): publishing renders every version.
    return ("\n".join(seq) + "\n").encode("utf-8") if seq else b""


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


# ``json.loads(..., parse_constant=...)`` builds a new decoder per call (about 5 µs); the stored
# lines of every published version go through this one.
_STRICT_JSON = json.JSONDecoder(parse_constant=_reject_constant)


def parse_actions(data: bytes, *, table: str, version: int | None = None) -> list[Action]:
    """Parse JSON lines of actions strictly (native commits): one object with one key per line."""

    def refused(what: str, hint: str) -> InvalidActionError:
        return InvalidActionError(what, table=table, version=version, hint=hint)

    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise refused(
            f"actions are not valid UTF-8 (byte {exc.start})", "write the actions file as UTF-8 JSON lines"
        ) from None
    out: list[Action] = []
    # Only '\n' separates actions: str.splitlines() would also split on U+2028, U+0085... which
    # are valid unescaped inside JSON strings.
    for number, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            # json.loads refuses a leading BOM itself (its message); else the one strict decoder
            obj = (
                json.loads(line, parse_constant=_reject_constant)
                if line.startswith("\ufeff")
                else _STRICT_JSON.decode(line)
            )
        except json.JSONDecodeError as exc:
            raise refused(
                f"line {number}: malformed JSON ({exc.msg} at column {exc.colno})",
                'each line must be one JSON object such as {"add": {...}}',
            ) from None
        except RecursionError:
            raise refused(
                f"line {number}: JSON nested too deeply", "actions are shallow objects; check the writer"
            ) from None
        if _SURROGATE_ESCAPE.search(line):
            try:  # an escaped lone surrogate ("\ud800") is valid JSON but not encodable as UTF-8
                json.dumps(obj, ensure_ascii=False).encode("utf-8")
            except UnicodeEncodeError:
                raise refused(
                    f"line {number}: a string holds a lone UTF-16 surrogate escape (not valid Unicode)",
                    "write strings as valid UTF-8 (surrogate escapes only in pairs)",
                ) from None
        if not isinstance(obj, dict) or len(obj) != 1:
            raise refused(
                f"line {number}: an action must be a JSON object with exactly one key (the action type)",
                'e.g. {"add": {...}}',
            )
        ((action_type, body),) = obj.items()
        if not isinstance(body, dict):
            raise refused(
                f"line {number}: the body of '{action_type}' must be a JSON object",
                f'e.g. {{"{action_type}": {{...}}}}',
            )
        out.append((action_type, body))
    if not out:
        raise refused("the commit holds no actions", "pass at least one action")
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


def _check_protocol_features(w: _Where, body: Mapping[str, Any]) -> None:
    """Versions that exist, reader features we know (as import does), reader ⊆ writer features."""
    reader, writer = body["minReaderVersion"], body["minWriterVersion"]
    if reader > 3 or writer > 7:
        raise w.fail(
            f"protocol {reader}/{writer} does not exist (at most minReaderVersion 3, minWriterVersion 7)",
            "use table features (3/7) for newer capabilities",
        )
    readers = body.get("readerFeatures") or []
    unknown = [f for f in readers if f not in KNOWN_READER_FEATURES and f not in CATALOG_FEATURES]
    if unknown:
        raise w.fail(
            f"unknown reader feature(s) {', '.join(repr(f) for f in unknown)}",
            "delta-mirror cannot vouch that readers handle it; drop the feature or upgrade delta-mirror",
        )
    missing = [f for f in readers if f not in (body.get("writerFeatures") or [])]
    if missing:
        raise w.fail(
            f"reader feature(s) {', '.join(repr(f) for f in missing)} missing from writerFeatures",
            "the protocol requires every reader feature in writerFeatures too",
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
    w = _Where(action_type, f"action {number} ({action_type})", table, version, location)
    check = _CHECKS.get(action_type)
    if check is None:
        raise w.fail(
            f"unknown action type '{action_type}'", f"native commits take {', '.join(KNOWN_ACTIONS[:8])}"
        )
    try:
        check(w, body)
    except InvalidActionError as exc:
        if exc.hint is None:  # every refusal says what to do
            exc.hint = f"fix action {number} of the commit (see the Delta protocol's '{action_type}' action)"
        raise


@dataclass(frozen=True)
class _Where:
    """Which action is being checked, for the messages."""

    action_type: str
    where: str
    table: str
    version: int | None
    location: str | None

    def req(
        self, body: Mapping[str, Any], field: str, kinds: type | tuple[type, ...], *, optional: bool = False
    ) -> None:
        """``body[field]`` is present (unless optional) and of type ``kinds`` (a bool is no int)."""
        if field not in body or body[field] is None:
            if optional:
                return
            raise self.fail(f"missing required field '{field}'", "see the Delta protocol's action reference")
        value = body[field]
        if isinstance(value, bool) and kinds is int:
            raise self.fail(f"field '{field}' must be an integer")
        if not isinstance(value, kinds):
            names = kinds.__name__ if isinstance(kinds, type) else "/".join(k.__name__ for k in kinds)
            raise self.fail(f"field '{field}' must be {names}, got {type(value).__name__}")

    def inside(self, field: str) -> _Where:
        return replace(self, where=f"{self.where}.{field}")

    def fail(self, what: str, hint: str | None = None) -> InvalidActionError:
        return InvalidActionError(f"{self.where}: {what}", table=self.table, version=self.version, hint=hint)


def _check_file_action(w: _Where, body: Mapping[str, Any]) -> None:
    """``add``, ``remove`` and ``cdc``: a path inside the table root, sizes, partition values, DV."""
    w.req(body, "path", str)
    check_data_path(body["path"], table=w.table, version=w.version, where=w.where, location=w.location)
    w.req(body, "dataChange", bool)
    if w.action_type in ("add", "cdc"):
        w.req(body, "size", int)
        w.req(body, "partitionValues", dict)
        _check_string_map(body["partitionValues"], "partitionValues", w.where, w.table, w.version)
    if w.action_type == "add":
        w.req(body, "modificationTime", int)
        w.req(body, "stats", str, optional=True)
    else:
        w.req(body, "size", int, optional=True)
        w.req(body, "deletionTimestamp", int, optional=True)
    size = body.get("size")
    if isinstance(size, int) and size < 0:
        raise w.fail(f"size must not be negative (got {size})")
    dv = body.get("deletionVector")
    if dv is not None:
        if not isinstance(dv, dict):
            raise w.fail("deletionVector must be an object")
        for field, kind in (
            ("storageType", str),
            ("pathOrInlineDv", str),
            ("sizeInBytes", int),
            ("cardinality", int),
        ):
            w.inside("deletionVector").req(dv, field, kind)


def _check_metadata(w: _Where, body: Mapping[str, Any]) -> None:
    w.req(body, "id", str)
    w.req(body, "format", dict)
    w.inside("format").req(body["format"], "provider", str)
    w.req(body, "schemaString", str)
    problem = schema_problem(body["schemaString"])
    if problem is not None:
        raise w.fail(f"schemaString {problem}")
    w.req(body, "partitionColumns", list)
    if not all(isinstance(c, str) for c in body["partitionColumns"]):
        raise w.fail("partitionColumns must be strings")
    if "configuration" in body:
        _check_string_map(body["configuration"], "configuration", w.where, w.table, w.version)


def schema_problem(schema_string: str) -> str | None:
    """Why ``schemaString`` is not a Delta schema a reader can parse (None when it is one)."""
    try:
        schema = json.loads(schema_string)
    except (TypeError, ValueError):
        return "is not valid JSON"
    if not isinstance(schema, dict) or schema.get("type") != "struct":
        return "must be a struct type"
    fields = schema.get("fields")
    if not isinstance(fields, list) or not all(
        isinstance(f, dict) and isinstance(f.get("name"), str) and "type" in f for f in fields
    ):
        return "must list its fields, each with a name and a type"
    return None


def _check_protocol(w: _Where, body: Mapping[str, Any]) -> None:
    w.req(body, "minReaderVersion", int)
    w.req(body, "minWriterVersion", int)
    reader, writer = body["minReaderVersion"], body["minWriterVersion"]
    if reader < 1 or writer < 1:
        raise w.fail("protocol versions must be positive")
    if "readerFeatures" in body and reader != 3:
        raise w.fail(
            "readerFeatures is only allowed with minReaderVersion 3",
            "set minReaderVersion to 3 or drop readerFeatures",
        )
    if "writerFeatures" in body and writer != 7:
        raise w.fail(
            "writerFeatures is only allowed with minWriterVersion 7",
            "set minWriterVersion to 7 or drop writerFeatures",
        )
    # Delta-Spark refuses the converse too ("Mismatched minReaderVersion and readerFeatures").
    if reader == 3 and writer != 7:
        raise w.fail("minReaderVersion 3 needs minWriterVersion 7", "table features need writer version 7")
    for field, level in (("readerFeatures", reader == 3), ("writerFeatures", writer == 7)):
        if level and field not in body:
            what = "minReaderVersion 3" if field == "readerFeatures" else "minWriterVersion 7"
            raise w.fail(f"{what} needs {field} (a list, possibly empty)", f'add "{field}": [...]')
        if field in body and not (
            isinstance(body[field], list) and all(isinstance(f, str) for f in body[field])
        ):
            raise w.fail(f"{field} must be a list of strings")
    _check_protocol_features(w, body)


def _check_txn(w: _Where, body: Mapping[str, Any]) -> None:
    w.req(body, "appId", str)
    w.req(body, "version", int)


def _check_domain_metadata(w: _Where, body: Mapping[str, Any]) -> None:
    w.req(body, "domain", str)
    w.req(body, "configuration", str)
    w.req(body, "removed", bool)


def _check_commit_info(w: _Where, body: Mapping[str, Any]) -> None:
    # Free-form provenance, but the timestamps feed in-commit timestamps and must be integers.
    w.req(body, "timestamp", int, optional=True)
    w.req(body, "inCommitTimestamp", int, optional=True)


_CHECKS: dict[str, Callable[[_Where, Mapping[str, Any]], None]] = {
    "add": _check_file_action,
    "remove": _check_file_action,
    "cdc": _check_file_action,
    "metaData": _check_metadata,
    "protocol": _check_protocol,
    "txn": _check_txn,
    "domainMetadata": _check_domain_metadata,
    "commitInfo": _check_commit_info,
}


__all__ = [
    "KNOWN_ACTIONS",
    "SPARK_KEY_ORDER",
    "Action",
    "canonical_json",
    "canonical_line",
    "check_data_path",
    "dv_id",
    "line_action",
    "parse_actions",
    "render_commit",
    "schema_problem",
    "spark_ordered",
    "split_commit",
    "validate_action",
]
