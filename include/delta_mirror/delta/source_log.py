"""Read an existing Delta table's ``_delta_log`` so that it can be imported under SQL authority.

Import must be lossless: every JSON commit is kept as its ordered actions (key order,
unknown fields and unknown action types preserved) *and* as its original bytes, so that a later
republish can be compared byte for byte. When the early commits were cleaned up, the imported
segment starts at the oldest complete checkpoint from which every later commit still exists, and
that checkpoint's actions are turned back into the JSON lines a commit would carry.

Only ``ObjectStore.list`` and ``ObjectStore.get`` are used, so the same code reads local folders
and object storage.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from delta_mirror.delta.last_checkpoint import LastCheckpoint
from delta_mirror.delta.log_listing import CheckpointFiles, LogListing, list_log, sidecar_refs
from delta_mirror.delta.log_path import LOG_DIR, SIDECAR_DIR, LogFileKind
from delta_mirror.delta.protocol import (
    CATALOG_FEATURES,
    KNOWN_READER_FEATURES,
    CheckpointKind,
    unsupported_reasons,
)
from delta_mirror.errors import (
    DataError,
    InvalidActionError,
    NotADeltaTableError,
    TransientError,
    UnsupportedTableError,
)
from delta_mirror.storage import ObjectStore

# Action types whose payload must be a JSON object; unknown types are kept as they are.
_OBJECT_ACTIONS: frozenset[str] = frozenset(
    {
        "add",
        "remove",
        "metaData",
        "protocol",
        "txn",
        "commitInfo",
        "cdc",
        "domainMetadata",
        "checkpointMetadata",
        "sidecar",
    }
)

# Checkpoint columns that are never actions of the table state (Spark never writes them; if a
# writer did, they carry no state).
_IGNORED_CHECKPOINT_COLUMNS: frozenset[str] = frozenset({"commitInfo"})


@dataclass
class SourceCheckpoint:
    """A complete checkpoint the imported segment starts from."""

    version: int
    kind: str  # "classic" | "multipart" | "v2"
    files: list[str]  # log-relative names ("_delta_log/..."), top-level file(s) then sidecars
    actions: list[str]  # canonical JSON lines, without checkpointMetadata / sidecar actions


@dataclass
class SourceLog:
    """Everything the importer needs from a source table's log."""

    location: str
    start_version: int
    end_version: int
    base_checkpoint: SourceCheckpoint | None
    commits: list[tuple[int, list[str], bytes]] = field(default_factory=list)
    checkpoint_versions: list[int] = field(default_factory=list)
    checkpoint_kind: str = "classic"
    multipart_parts: int | None = None
    last_checkpoint: dict[str, Any] | None = None


# --------------------------------------------------------------------------------------------
# JSON commits
# --------------------------------------------------------------------------------------------


# Same output as json.dumps(..., separators=(",", ":"), ensure_ascii=False); one shared encoder
# saves building a new one per action (300k-action commits exist).
_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def canonical_line(action: Mapping[str, Any]) -> str:
    """The canonical text of one action: compact separators, UTF-8 kept unescaped (README, "How it works")."""
    obj = action if isinstance(action, dict) else dict(action)
    try:
        return _ENCODER.encode(obj)
    except (TypeError, ValueError) as exc:
        raise InvalidActionError(f"action cannot be encoded as JSON: {exc}") from exc


def _reject_constant(name: str) -> Any:
    # NaN / Infinity are not JSON; Delta readers (Jackson, serde) reject them.
    raise ValueError(f"non-standard JSON constant {name}")


def parse_commit_bytes(data: bytes, *, table: str, version: int) -> list[dict[str, Any]]:
    """Parse a commit (or V2 JSON checkpoint) into ordered single-key action dicts.

    Tolerates what real writers produce (blank lines, no trailing newline, spaces after ``:`` and
    ``,``) but nothing that would make the actions ambiguous.
    """
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DataError(
            f"commit file is not valid UTF-8 (invalid byte at offset {exc.start})",
            table=table,
            version=version,
            hint="Delta commit files must be UTF-8; the source file is corrupt or was not written by a Delta writer",
        ) from exc
    actions: list[dict[str, Any]] = []
    # Split on "\n" only: str.splitlines() would also split on U+2028 etc. inside JSON strings.
    for lineno, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line, parse_constant=_reject_constant)
        except ValueError as exc:
            raise InvalidActionError(
                f"line {lineno} is not valid JSON: {exc}",
                table=table,
                version=version,
                hint="the source commit file is corrupt; repair it before importing",
            ) from exc
        if not isinstance(obj, dict) or len(obj) != 1:
            what = f"an object with keys {list(obj)[:5]}" if isinstance(obj, dict) else type(obj).__name__
            raise InvalidActionError(
                f"line {lineno} must be a JSON object with exactly one key (the action type), got {what}",
                table=table,
                version=version,
                hint="the source commit file is corrupt; repair it before importing",
            )
        ((kind, payload),) = obj.items()
        if kind in _OBJECT_ACTIONS and not isinstance(payload, dict):
            raise InvalidActionError(
                f"line {lineno}: the '{kind}' action must be a JSON object, got {type(payload).__name__}",
                table=table,
                version=version,
            )
        actions.append(obj)
    return actions


# --------------------------------------------------------------------------------------------
# Checkpoints
# --------------------------------------------------------------------------------------------


class _MissingCheckpointFile(DataError):
    """A checkpoint part or sidecar is absent: the checkpoint is incomplete."""


class _UnsupportedValue(Exception):
    def __init__(self, column: str, type_: Any) -> None:
        super().__init__(f"column '{column}' has type {type_}, which has no JSON form in a Delta log")
        self.column = column


_Conv = Callable[[Any], Any]


def _converter(t: Any, path: str) -> _Conv | None:
    """A function turning ``to_pylist()`` output of type ``t`` into Delta's JSON form (None = as is).

    Structs drop null fields (Delta JSON omits them) and ``*_parsed`` fields (derived from the
    JSON strings, never part of an action); maps become objects in stored order and keep null
    values (a null partition value is JSON ``null``).
    """
    if pa.types.is_struct(t):
        fields: list[tuple[str, _Conv | None]] = []
        for i in range(t.num_fields):
            f = t.field(i)
            if f.name.endswith("_parsed"):
                continue
            fields.append((f.name, _converter(f.type, f"{path}.{f.name}")))

        def conv_struct(v: Any) -> Any:
            out: dict[str, Any] = {}
            for name, conv in fields:
                x = v.get(name)
                if x is None:
                    continue
                out[name] = conv(x) if conv is not None else x
            return out

        return conv_struct
    if pa.types.is_map(t):
        kconv = _converter(t.key_type, f"{path}.key")
        vconv = _converter(t.item_type, f"{path}.value")

        def conv_map(v: Any) -> Any:
            out: dict[Any, Any] = {}
            for k, x in v:
                if kconv is not None:
                    k = kconv(k)
                out[k] = vconv(x) if (vconv is not None and x is not None) else x
            return out

        return conv_map
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        econv = _converter(t.value_type, f"{path}[]")
        if econv is None:
            return None

        def conv_list(v: Any) -> Any:
            return [econv(x) if x is not None else None for x in v]

        return conv_list
    if pa.types.is_dictionary(t):
        return _converter(t.value_type, path)
    if (
        pa.types.is_string(t)
        or pa.types.is_large_string(t)
        or pa.types.is_integer(t)
        or pa.types.is_boolean(t)
        or pa.types.is_floating(t)
        or pa.types.is_null(t)
    ):
        return None

    def conv_unsupported(v: Any) -> Any:
        raise _UnsupportedValue(path, t)

    return conv_unsupported


def _parquet_actions(data: bytes, *, name: str, table: str, version: int) -> Iterator[tuple[str, Any]]:
    """(action type, payload) for each row of a checkpoint Parquet file, in row order."""
    try:
        pf = pq.ParquetFile(pa.BufferReader(data))
        batches: Iterable[Any] = pf.iter_batches(batch_size=65536)
        converters: dict[str, _Conv | None] = {}
        for batch in batches:
            n = batch.num_rows
            slots: list[tuple[str, Any] | None] = [None] * n
            for col_name, col in zip(batch.schema.names, batch.columns, strict=True):
                if col_name in _IGNORED_CHECKPOINT_COLUMNS or col.null_count == n:
                    continue
                if col_name not in converters:
                    converters[col_name] = _converter(col.type, col_name)
                conv = converters[col_name]
                mask = pc.is_valid(col)
                rows = pc.indices_nonzero(mask).to_pylist()
                values = col.filter(mask).to_pylist()
                for row, value in zip(rows, values, strict=True):
                    payload = conv(value) if conv is not None else value
                    if payload == {} and pa.types.is_struct(col.type):
                        continue  # a struct whose fields are all null carries no action
                    if (other := slots[row]) is not None:
                        raise DataError(
                            f"checkpoint {name}: a row holds two actions ('{other[0]}' and '{col_name}')",
                            table=table,
                            version=version,
                            hint="every checkpoint row must hold exactly one action; the checkpoint is corrupt",
                        )
                    slots[row] = (col_name, payload)
            for slot in slots:
                if slot is not None:
                    yield slot
    except _UnsupportedValue as exc:
        raise DataError(f"checkpoint {name}: {exc}", table=table, version=version) from exc
    except (pa.ArrowException, OSError) as exc:
        raise DataError(
            f"checkpoint {name} is not readable Parquet: {exc}",
            table=table,
            version=version,
            hint="the checkpoint is corrupt or truncated",
        ) from exc


def _file_actions(store: ObjectStore, path: str, *, table: str, version: int) -> Iterator[tuple[str, Any]]:
    data = store.get(path)
    if data is None:
        raise _MissingCheckpointFile(
            f"checkpoint file {path} is missing",
            table=table,
            version=version,
            hint="the checkpoint is incomplete (a part or sidecar was deleted)",
        )
    if path.endswith(".json"):
        for obj in parse_commit_bytes(data, table=table, version=version):
            ((kind, payload),) = obj.items()
            yield kind, payload
    else:
        yield from _parquet_actions(data, name=path, table=table, version=version)


def _sidecar_path(ref: Any, *, table: str, version: int) -> str:
    """Where a ``sidecar`` action's file lives: always ``_delta_log/_sidecars/<name>``."""
    path = ref.get("path") if isinstance(ref, dict) else None
    if not isinstance(path, str) or not path:
        raise DataError("checkpoint has a sidecar action without a path", table=table, version=version)
    # The protocol allows a full URI but requires the file to sit in _delta_log/_sidecars/.
    name = unquote(path.rstrip("/").rsplit("/", 1)[-1])
    if name in ("", ".", ".."):
        raise DataError(f"checkpoint names an invalid sidecar path '{path}'", table=table, version=version)
    return f"{LOG_DIR}/{SIDECAR_DIR}/{name}"


@dataclass
class _ReadCheckpoint:
    actions: list[str]
    sidecars: list[str]
    is_v2: bool


def _read_checkpoint(store: ObjectStore, files: list[str], *, table: str, version: int) -> _ReadCheckpoint:
    sidecar_prefix = f"{LOG_DIR}/{SIDECAR_DIR}/"
    top_level = [f for f in files if not f.startswith(sidecar_prefix)]
    actions: list[str] = []
    sidecars: list[str] = []
    is_v2 = False
    for path in top_level:
        for kind, payload in _file_actions(store, path, table=table, version=version):
            if kind == "checkpointMetadata":
                is_v2 = True
            elif kind == "sidecar":
                is_v2 = True
                sidecars.append(_sidecar_path(payload, table=table, version=version))
            elif kind not in _IGNORED_CHECKPOINT_COLUMNS:
                actions.append(canonical_line({kind: payload}))
    for path in sidecars:
        for kind, payload in _file_actions(store, path, table=table, version=version):
            if kind in ("checkpointMetadata", "sidecar") or kind in _IGNORED_CHECKPOINT_COLUMNS:
                continue
            actions.append(canonical_line({kind: payload}))
    return _ReadCheckpoint(actions, sidecars, is_v2)


def checkpoint_actions(store: ObjectStore, files: list[str], *, table: str, version: int) -> list[str]:
    """The checkpoint's actions as canonical JSON lines (all parts, sidecars followed).

    Order: the rows of the top-level file(s) in file order, then each sidecar's rows in the order
    the sidecars are referenced (order carries no meaning in a checkpoint; this keeps it stable).

    ``files`` are log-relative names of the top-level checkpoint file(s) (multi-part: in part
    order). Sidecar files listed among them are ignored: the ``sidecar`` actions of the
    top-level file are authoritative. ``checkpointMetadata``/``sidecar`` actions are omitted.
    """
    return _read_checkpoint(store, files, table=table, version=version).actions


# --------------------------------------------------------------------------------------------
# Listing and segment selection
# --------------------------------------------------------------------------------------------


def _ranges(versions: list[int]) -> str:
    """``[0, 1, 2, 5]`` → ``"0..2, 5"`` (for error messages)."""
    out: list[str] = []
    i = 0
    while i < len(versions):
        j = i
        while j + 1 < len(versions) and versions[j + 1] == versions[j] + 1:
            j += 1
        out.append(str(versions[i]) if i == j else f"{versions[i]}..{versions[j]}")
        i = j + 1
    if len(out) > 10:
        out = [*out[:5], f"... ({len(out) - 10} more ranges) ...", *out[-5:]]
    return ", ".join(out)


def _missing_versions(commits: Mapping[int, str], latest: int) -> list[int]:
    return [v for v in range(latest + 1) if v not in commits]


def _load_candidate(store: ObjectStore, cand: CheckpointFiles, *, table: str) -> SourceCheckpoint:
    if not cand.parts_complete:
        raise _MissingCheckpointFile(
            f"multi-part checkpoint has only {len(cand.paths)} of its parts",
            table=table,
            version=cand.version,
        )
    read = _read_checkpoint(store, list(cand.paths), table=table, version=cand.version)
    kind = cand.kind.value
    if kind == "classic" and read.is_v2:
        kind = "v2"
    return SourceCheckpoint(cand.version, kind, [*cand.paths, *read.sidecars], read.actions)


def _other_files(listing: LogListing) -> list[str]:
    """Names in ``_delta_log/`` that are neither commits nor checkpoints (for error messages)."""
    extra = [f.name for _, f in listing.entries if f.kind in (LogFileKind.CRC, LogFileKind.COMPACTED)]
    return [*listing.strays, *extra]


# --------------------------------------------------------------------------------------------
# Protocol check
# --------------------------------------------------------------------------------------------


def check_supported(protocol: Mapping[str, Any], metadata: Mapping[str, Any] | None, *, table: str) -> None:
    """Refuse tables whose protocol we cannot carry unchanged, naming the feature (README, "Unsupported tables")."""
    problems = unsupported_reasons(protocol, metadata)
    if problems:
        raise UnsupportedTableError(
            "cannot import: " + "; ".join(problems),
            table=table,
            hint="delta-mirror only imports tables that every plain Delta reader can read; "
            "remove the feature (or fix the protocol) in the source table first",
        )


def _scan_state(lines: Iterable[str], protocol: Any, metadata: Any) -> tuple[Any, Any]:
    """The last protocol / metaData payloads among canonical lines (cheap prefix test first)."""
    for line in lines:
        if line.startswith('{"protocol":'):
            protocol = json.loads(line)["protocol"]
        elif line.startswith('{"metaData":'):
            metadata = json.loads(line)["metaData"]
    return protocol, metadata


# --------------------------------------------------------------------------------------------
# The entry point
# --------------------------------------------------------------------------------------------


def read_source_log(store: ObjectStore, *, table: str) -> SourceLog:
    """Read the importable segment of the table at ``store`` (see the module docstring)."""
    location = store.uri
    listing = list_log(store)
    if not listing.commits and not listing.checkpoints:
        other = _other_files(listing)
        found = f" (found only: {', '.join(sorted(other)[:5])})" if other else ""
        raise NotADeltaTableError(
            f"{location} is not a Delta table: no _delta_log/ with commits or checkpoints{found}",
            table=table,
            hint="point the location at the table root (the folder that holds _delta_log/), "
            "or create a new table instead of importing one",
        )
    latest = max([*listing.commits, *listing.checkpoints])
    missing = _missing_versions(listing.commits, latest)

    base: SourceCheckpoint | None = None
    if missing:
        floor = missing[-1]  # every commit after the base checkpoint must exist
        reasons: list[str] = []
        for version in sorted(v for v in listing.checkpoints if v >= floor):
            for cand in listing.checkpoints[version]:
                try:
                    base = _load_candidate(store, cand, table=table)
                except DataError as exc:
                    reasons.append(f"checkpoint {version} ({cand.kind}) unusable: {exc.what}")
                    continue
                break
            if base is not None:
                break
        if base is None:
            older = sorted(v for v in listing.checkpoints if v < floor)
            detail = f"; checkpoints at {_ranges(older)} are older than the gap" if older else ""
            if reasons:
                detail += "; " + "; ".join(reasons)
            raise DataError(
                f"cannot import {location}: commits {_ranges(missing)} are missing and no complete "
                f"checkpoint at version {floor} or later covers them{detail}",
                table=table,
                hint="restore the missing commit files, or write a checkpoint at the latest version "
                "with a Delta writer, then import again",
            )
        start = base.version
    else:
        start = 0

    commits: list[tuple[int, list[str], bytes]] = []
    protocol: Any = None
    metadata: Any = None
    if base is not None:
        protocol, metadata = _scan_state(base.actions, None, None)
    for version in range(start, latest + 1):
        path = listing.commits.get(version)
        if path is None:
            continue  # only the base checkpoint's own version may lack its JSON
        data = store.get(path)
        if data is None:
            raise TransientError(
                f"commit {path} disappeared while it was being read",
                table=table,
                version=version,
                hint="another process is cleaning up the log; retry the import",
            )
        lines = [canonical_line(a) for a in parse_commit_bytes(data, table=table, version=version)]
        protocol, metadata = _scan_state(lines, protocol, metadata)
        commits.append((version, lines, data))

    if not isinstance(protocol, dict):
        raise DataError(
            f"{location} has no protocol action in versions {start}..{latest}",
            table=table,
            hint="the log is corrupt or incomplete; a Delta table's first commit or checkpoint holds its protocol",
        )
    if not isinstance(metadata, dict):
        raise DataError(
            f"{location} has no metaData action in versions {start}..{latest}",
            table=table,
            hint="the log is corrupt or incomplete; a Delta table's first commit or checkpoint holds its metadata",
        )
    check_supported(protocol, metadata, table=table)

    reader_features = protocol.get("readerFeatures")
    v2_table = isinstance(reader_features, list) and "v2Checkpoint" in reader_features
    refs = sidecar_refs(store)
    complete: dict[int, CheckpointFiles] = {}
    for version in sorted(listing.checkpoints):
        for cand in listing.checkpoints[version]:
            if (
                base is not None
                and version == base.version
                and list(cand.paths) == base.files[: len(cand.paths)]
            ):
                complete[version] = cand
                break
            if listing.is_complete(cand, refs, v2_table=v2_table):
                complete[version] = cand
                break
    multiparts = [c for c in complete.values() if c.kind is CheckpointKind.MULTIPART]
    if v2_table:
        kind = "v2"
    elif complete and complete[max(complete)].kind is CheckpointKind.MULTIPART:
        kind = "multipart"
    else:
        kind = "classic"
    last_cp = None  # only a hint: a bad one is ignored, as readers do
    if listing.last_checkpoint is not None and (
        pointer := LastCheckpoint.read(store.get(listing.last_checkpoint))
    ):
        last_cp = pointer.fields
    return SourceLog(
        location=location,
        start_version=start,
        end_version=latest,
        base_checkpoint=base,
        commits=commits,
        checkpoint_versions=sorted(complete),
        checkpoint_kind=kind,
        multipart_parts=len(max(multiparts, key=lambda c: c.version).paths) if multiparts else None,
        last_checkpoint=last_cp,
    )


__all__ = [
    "CATALOG_FEATURES",
    "KNOWN_READER_FEATURES",
    "SourceCheckpoint",
    "SourceLog",
    "canonical_line",
    "check_supported",
    "checkpoint_actions",
    "parse_commit_bytes",
    "read_source_log",
]
