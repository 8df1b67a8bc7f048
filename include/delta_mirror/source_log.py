"""Read an existing Delta table's ``_delta_log`` so that it can be imported under SQL authority.

Import must be lossless (design §6): every JSON commit is kept as its ordered actions (key order,
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

from delta_mirror.errors import (
    DataError,
    InvalidActionError,
    NotADeltaTableError,
    TransientError,
    UnsupportedTableError,
)
from delta_mirror.log_path import LOG_DIR, SIDECAR_DIR, LogFileKind, parse_log_file
from delta_mirror.storage import ObjectStore

# Reader features whose semantics we can carry through import and republish unchanged. Anything
# else may change how the log must be interpreted, so the table is refused (design §6).
KNOWN_READER_FEATURES: frozenset[str] = frozenset(
    {
        "columnMapping",
        "deletionVectors",
        "timestampNtz",
        "typeWidening",
        "typeWidening-preview",
        "v2Checkpoint",
        "vacuumProtocolCheck",
        "variantType",
        "variantType-preview",
        "variantShredding-preview",
        "variantShredding",
        "domainMetadata",
        "icebergCompatV1",
        "icebergCompatV2",
        "rowTracking",
        "inCommitTimestamp",
        "checkConstraints",
        "changeDataFeed",
        "generatedColumns",
        "identityColumns",
        "invariants",
        "appendOnly",
        "allowColumnDefaults",
        "clustering",
        "geospatial",
        "collations-preview",
    }
)

# Features that hand commit authority to a catalog: a plain filesystem reader can no longer read
# the table, which defeats the purpose of mirroring (design §1).
CATALOG_FEATURES: frozenset[str] = frozenset({"catalogManaged", "catalogOwned-preview"})
COORDINATED_COMMITS_PREFIX = "delta.coordinatedCommits."

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
    """The canonical text of one action: compact separators, UTF-8 kept unescaped (design §4)."""
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


def _sidecar_refs(store: ObjectStore, top_level: str, *, table: str, version: int) -> list[str]:
    """The sidecar files a top-level checkpoint references (reads only the ``sidecar`` column)."""
    data = store.get(top_level)
    if data is None:
        raise _MissingCheckpointFile(f"checkpoint file {top_level} is missing", table=table, version=version)
    refs: list[str] = []
    if top_level.endswith(".json"):
        for obj in parse_commit_bytes(data, table=table, version=version):
            if "sidecar" in obj:
                refs.append(_sidecar_path(obj["sidecar"], table=table, version=version))
        return refs
    try:
        pf = pq.ParquetFile(pa.BufferReader(data))
        if "sidecar" not in pf.schema_arrow.names:
            return refs
        column = pf.read(columns=["sidecar"]).column("sidecar")
    except (pa.ArrowException, OSError) as exc:
        raise DataError(
            f"checkpoint {top_level} is not readable Parquet: {exc}", table=table, version=version
        ) from exc
    for ref in column.drop_null().to_pylist():
        refs.append(_sidecar_path(ref, table=table, version=version))
    return refs


# --------------------------------------------------------------------------------------------
# Listing and segment selection
# --------------------------------------------------------------------------------------------


@dataclass
class _Candidate:
    """One checkpoint found by listing (before its contents are read)."""

    version: int
    kind: str  # "classic" | "multipart" | "v2" (UUID-named)
    files: list[str]
    parts_complete: bool = True


@dataclass
class _Listing:
    commits: dict[int, str] = field(default_factory=dict)
    checkpoints: dict[int, list[_Candidate]] = field(default_factory=dict)
    sidecars: set[str] = field(default_factory=set)
    last_checkpoint: str | None = None
    other: list[str] = field(default_factory=list)


_KIND_PREFERENCE = {"classic": 0, "v2": 1, "multipart": 2}


def _list_log(store: ObjectStore) -> _Listing:
    listing = _Listing()
    multipart: dict[tuple[int, int], dict[int, str]] = {}
    log_prefix = f"{LOG_DIR}/"
    sidecar_prefix = f"{LOG_DIR}/{SIDECAR_DIR}/"
    for meta in store.list(LOG_DIR):
        path = meta.path
        if not path.startswith(log_prefix):
            continue
        if path.startswith(sidecar_prefix):
            if "/" not in path[len(sidecar_prefix) :]:
                listing.sidecars.add(path)
            continue
        name = path[len(log_prefix) :]
        if "/" in name:
            continue  # _commits/, _staged_commits/, _autostats/, ...
        lf = parse_log_file(name)
        if lf is None:
            listing.other.append(name)
            continue
        if lf.kind is LogFileKind.COMMIT:
            listing.commits[lf.version] = path
        elif lf.kind is LogFileKind.CHECKPOINT:
            listing.checkpoints.setdefault(lf.version, []).append(_Candidate(lf.version, "classic", [path]))
        elif lf.kind is LogFileKind.UUID_CHECKPOINT:
            listing.checkpoints.setdefault(lf.version, []).append(_Candidate(lf.version, "v2", [path]))
        elif lf.kind is LogFileKind.MULTIPART_CHECKPOINT:
            multipart.setdefault((lf.version, lf.num_parts), {})[lf.part] = path
        elif lf.kind is LogFileKind.LAST_CHECKPOINT:
            listing.last_checkpoint = path
        else:
            listing.other.append(name)  # version checksums (.crc), compacted files
    for (version, num_parts), parts in multipart.items():
        files = [parts[p] for p in sorted(parts)]
        complete = len(parts) == num_parts
        listing.checkpoints.setdefault(version, []).append(_Candidate(version, "multipart", files, complete))
    for candidates in listing.checkpoints.values():
        candidates.sort(key=lambda c: (not c.parts_complete, _KIND_PREFERENCE[c.kind], c.files))
    return listing


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


def _load_candidate(store: ObjectStore, cand: _Candidate, *, table: str) -> SourceCheckpoint:
    if not cand.parts_complete:
        raise _MissingCheckpointFile(
            f"multi-part checkpoint has only {len(cand.files)} of its parts",
            table=table,
            version=cand.version,
        )
    read = _read_checkpoint(store, cand.files, table=table, version=cand.version)
    kind = cand.kind
    if kind == "classic" and read.is_v2:
        kind = "v2"
    return SourceCheckpoint(cand.version, kind, [*cand.files, *read.sidecars], read.actions)


def _candidate_complete(
    store: ObjectStore, cand: _Candidate, sidecars: set[str], *, table: str, v2_table: bool
) -> bool:
    """Whether all files of a checkpoint exist (V2: every referenced sidecar is listed)."""
    if not cand.parts_complete:
        return False
    if cand.kind == "multipart" or (cand.kind == "classic" and not v2_table):
        return True  # sidecars need the v2Checkpoint feature
    try:
        refs = _sidecar_refs(store, cand.files[0], table=table, version=cand.version)
    except DataError:
        return False
    return all(ref in sidecars for ref in refs)


# --------------------------------------------------------------------------------------------
# Protocol check
# --------------------------------------------------------------------------------------------


def check_supported(protocol: Mapping[str, Any], metadata: Mapping[str, Any] | None, *, table: str) -> None:
    """Refuse tables whose protocol we cannot carry unchanged, naming the feature (design §6)."""
    problems: list[str] = []
    reader_features = protocol.get("readerFeatures")
    writer_features = protocol.get("writerFeatures")
    readers = [str(f) for f in reader_features] if isinstance(reader_features, list) else []
    writers = [str(f) for f in writer_features] if isinstance(writer_features, list) else []
    catalog = sorted({f for f in [*readers, *writers] if f in CATALOG_FEATURES})
    if catalog:
        problems.append(
            f"it uses the {', '.join(catalog)} table feature (a catalog owns its commits; plain "
            "filesystem readers cannot read it)"
        )
    configuration = (metadata or {}).get("configuration")
    if isinstance(configuration, dict):
        coordinated = sorted(k for k in configuration if str(k).startswith(COORDINATED_COMMITS_PREFIX))
        if coordinated:
            problems.append(f"it uses coordinated commits ({', '.join(coordinated)})")
    unknown = [f for f in readers if f not in KNOWN_READER_FEATURES and f not in CATALOG_FEATURES]
    if unknown:
        problems.append(f"it requires unknown reader feature(s) {', '.join(repr(f) for f in unknown)}")
    reader_version = protocol.get("minReaderVersion")
    writer_version = protocol.get("minWriterVersion")
    if not isinstance(reader_version, int) or isinstance(reader_version, bool):
        problems.append(f"its protocol has an invalid minReaderVersion {reader_version!r}")
    elif reader_version > 3:
        problems.append(f"it requires minReaderVersion {reader_version} (at most 3 exists)")
    elif reader_features is not None and reader_version != 3:
        problems.append(
            f"its protocol lists readerFeatures with minReaderVersion {reader_version} (must be 3)"
        )
    if not isinstance(writer_version, int) or isinstance(writer_version, bool):
        problems.append(f"its protocol has an invalid minWriterVersion {writer_version!r}")
    elif writer_version > 7:
        problems.append(f"it requires minWriterVersion {writer_version} (at most 7 exists)")
    elif writer_features is not None and writer_version != 7:
        problems.append(
            f"its protocol lists writerFeatures with minWriterVersion {writer_version} (must be 7)"
        )
    elif reader_version == 3 and writer_version != 7:
        problems.append(
            f"its protocol has minReaderVersion 3 with minWriterVersion {writer_version} (must be 7)"
        )
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


def _parse_last_checkpoint(data: bytes | None) -> dict[str, Any] | None:
    """``_last_checkpoint`` is only a hint; a bad one is ignored, as readers do."""
    if data is None:
        return None
    try:
        obj = json.loads(data.decode("utf-8"), parse_constant=_reject_constant)
    except (UnicodeDecodeError, ValueError):
        return None
    if not isinstance(obj, dict):
        return None
    version = obj.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 0:
        return None
    return obj


# --------------------------------------------------------------------------------------------
# The entry point
# --------------------------------------------------------------------------------------------


def read_source_log(store: ObjectStore, *, table: str) -> SourceLog:
    """Read the importable segment of the table at ``store`` (see the module docstring)."""
    location = store.uri
    listing = _list_log(store)
    if not listing.commits and not listing.checkpoints:
        found = f" (found only: {', '.join(sorted(listing.other)[:5])})" if listing.other else ""
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
    complete: dict[int, _Candidate] = {}
    for version in sorted(listing.checkpoints):
        for cand in listing.checkpoints[version]:
            if base is not None and version == base.version and cand.files == base.files[: len(cand.files)]:
                complete[version] = cand
                break
            if _candidate_complete(store, cand, listing.sidecars, table=table, v2_table=v2_table):
                complete[version] = cand
                break
    multiparts = [c for c in complete.values() if c.kind == "multipart"]
    if v2_table:
        kind = "v2"
    elif complete and complete[max(complete)].kind == "multipart":
        kind = "multipart"
    else:
        kind = "classic"
    last_cp = None
    if listing.last_checkpoint is not None:
        last_cp = _parse_last_checkpoint(store.get(listing.last_checkpoint))
    return SourceLog(
        location=location,
        start_version=start,
        end_version=latest,
        base_checkpoint=base,
        commits=commits,
        checkpoint_versions=sorted(complete),
        checkpoint_kind=kind,
        multipart_parts=len(max(multiparts, key=lambda c: c.version).files) if multiparts else None,
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
