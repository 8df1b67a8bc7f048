"""Build Delta checkpoint files (classic, multi-part, V2 with sidecars) from a table snapshot.

Pure functions: the caller hands in the reconciled state of one version (the SQL store computes it
in O(active files)) and gets back file names and bytes; the publisher writes them. Nothing here
touches storage or SQL.

Why it looks the way it does:

* The Parquet schema is Delta-Spark's, with every field nullable (delta-rs #4247, trino #18760);
  Parquet map keys stay ``required`` because the Parquet spec demands it (Spark writes them so).
  Readers look columns up by name, so field order only matters for humans diffing files.
* ``add``/``remove`` lines are parsed with Arrow's JSON reader in bounded chunks instead of one
  Python dict per action: a 300k-file table is checkpointed faster and in less memory than
  deltalake's own ``create_checkpoint``. Chunks the fast path cannot take (inconsistent types,
  odd fields) fall back to ``json.loads`` per line, which also produces the precise error.
* Like Spark, ``dataChange`` is written as ``false`` (a checkpoint changes no data), unknown
  fields are dropped (the schema is fixed), ``remove`` carries no ``stats``/``tags``, and
  ``commitInfo``/``cdc`` are never written.
* ``stats`` is always kept as the JSON string, even when ``delta.checkpoint.writeStatsAsJson`` is
  ``false`` (every reader accepts it); ``stats_parsed``/``partitionValues_parsed``
  (``delta.checkpoint.writeStatsAsStruct``) are not written: they are optional for readers.
* Multi-part checkpoints are clustered with Spark's hash partitioning of ``add.path`` /
  ``remove.path`` (Murmur3, seed 42, pmod), as PROTOCOL.md requires, so our parts agree with
  Delta-Spark's if both ever write the same version with the same number of parts.
* V2 (UUID-named) names come from uuid5 of the checkpoint id and the file's SHA-256: a re-run
  produces the same names and bytes, and different bytes can never collide with an existing name.
"""

from __future__ import annotations

import hashlib
import io
import json
import uuid
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pa_json
import pyarrow.parquet as pq

from delta_mirror.delta.last_checkpoint import LastCheckpoint
from delta_mirror.delta.protocol import CheckpointKind
from delta_mirror.errors import InvalidActionError, PermanentError
from delta_mirror.log_path import (
    LOG_DIR,
    SIDECAR_DIR,
    checkpoint_name,
    multipart_checkpoint_name,
    uuid_checkpoint_name,
)

__all__ = [
    "CHECKPOINT_SCHEMA",
    "SIDECAR_SCHEMA",
    "V2_CHECKPOINT_SCHEMA",
    "CheckpointFile",
    "CheckpointInput",
    "CheckpointResult",
    "CheckpointHeader",
    "build_checkpoint",
    "checkpoint_header",
    "checkpoint_result",
    "non_file_parquet",
    "num_checkpoint_parts",
    "spark_hash_partition",
    "v2_checkpoint_files",
]


@dataclass
class CheckpointInput:
    """The reconciled state of one table version, as canonical JSON action lines."""

    version: int
    protocol: str  # '{"protocol":{...}}'
    metadata: str  # '{"metaData":{...}}'
    txns: list[str]  # latest '{"txn":{...}}' per appId
    domain_metadata: list[str]  # latest '{"domainMetadata":{...}}' per domain, not removed
    adds: Iterable[str] | list[str]  # '{"add":{...}}' lines of the active files
    removes: list[str]  # '{"remove":{...}}' tombstones still within the retention


@dataclass
class CheckpointFile:
    path: str  # relative to the table root, e.g. "_delta_log/<v>.checkpoint.parquet"
    data: bytes


@dataclass
class CheckpointResult:
    files: list[CheckpointFile]  # sidecars first, top-level checkpoint (or parts in order) last
    last_checkpoint: bytes  # the _last_checkpoint JSON bytes
    num_add_files: int
    num_actions: int


# --------------------------------------------------------------------------------------------
# Schema (Delta-Spark's checkpoint schema, all nullable)
# --------------------------------------------------------------------------------------------

_STR = pa.string()
_LONG = pa.int64()
_INT = pa.int32()
_BOOL = pa.bool_()
_MAP = pa.map_(_STR, _STR)  # key required (Parquet rule), value nullable
_LIST = pa.list_(pa.field("element", _STR))


def _struct(*fields: tuple[str, Any]) -> Any:
    return pa.struct([pa.field(name, typ, nullable=True) for name, typ in fields])


_DV = _struct(
    ("storageType", _STR),
    ("pathOrInlineDv", _STR),
    ("offset", _INT),
    ("sizeInBytes", _INT),
    ("cardinality", _LONG),
    ("maxRowIndex", _LONG),
)
_TXN = _struct(("appId", _STR), ("version", _LONG), ("lastUpdated", _LONG))
_ADD = _struct(
    ("path", _STR),
    ("partitionValues", _MAP),
    ("size", _LONG),
    ("modificationTime", _LONG),
    ("dataChange", _BOOL),
    ("stats", _STR),
    ("tags", _MAP),
    ("deletionVector", _DV),
    ("baseRowId", _LONG),
    ("defaultRowCommitVersion", _LONG),
    ("clusteringProvider", _STR),
)
_REMOVE = _struct(
    ("path", _STR),
    ("deletionTimestamp", _LONG),
    ("dataChange", _BOOL),
    ("extendedFileMetadata", _BOOL),
    ("partitionValues", _MAP),
    ("size", _LONG),
    ("deletionVector", _DV),
    ("baseRowId", _LONG),
    ("defaultRowCommitVersion", _LONG),
)
_METADATA = _struct(
    ("id", _STR),
    ("name", _STR),
    ("description", _STR),
    ("format", _struct(("provider", _STR), ("options", _MAP))),
    ("schemaString", _STR),
    ("partitionColumns", _LIST),
    ("configuration", _MAP),
    ("createdTime", _LONG),
)
_PROTOCOL = _struct(
    ("minReaderVersion", _INT),
    ("minWriterVersion", _INT),
    ("readerFeatures", _LIST),
    ("writerFeatures", _LIST),
)
_DOMAIN_METADATA = _struct(("domain", _STR), ("configuration", _STR), ("removed", _BOOL))
_CHECKPOINT_METADATA = _struct(("version", _LONG), ("tags", _MAP))
_SIDECAR = _struct(("path", _STR), ("sizeInBytes", _LONG), ("modificationTime", _LONG), ("tags", _MAP))

_COLUMN_TYPES: dict[str, Any] = {
    "txn": _TXN,
    "add": _ADD,
    "remove": _REMOVE,
    "metaData": _METADATA,
    "protocol": _PROTOCOL,
    "domainMetadata": _DOMAIN_METADATA,
    "checkpointMetadata": _CHECKPOINT_METADATA,
    "sidecar": _SIDECAR,
}


def _schema(*names: str) -> Any:
    return pa.schema([pa.field(n, _COLUMN_TYPES[n], nullable=True) for n in names])


#: Classic and multi-part checkpoints (V1 spec).
CHECKPOINT_SCHEMA = _schema("txn", "add", "remove", "metaData", "protocol", "domainMetadata")
#: The top-level file of a V2 checkpoint (Spark keeps the empty add/remove columns there too).
V2_CHECKPOINT_SCHEMA = _schema(
    "txn", "add", "remove", "metaData", "protocol", "domainMetadata", "checkpointMetadata", "sidecar"
)
#: Sidecar files hold file actions only.
SIDECAR_SCHEMA = _schema("add", "remove")

# Field names the JSON reader gets typed up front; partitionValues and tags are free-form maps
# (the Arrow JSON reader has no map type), so the reader infers them as structs and we convert.
_MAP_FIELDS = ("partitionValues", "tags")

_CHUNK_CHARS = 16 << 20  # text parsed per Arrow JSON call: bounds memory, keeps threads busy
_JSON_BLOCK = 4 << 20
_ROW_GROUP_ROWS = 1 << 17
_ROW_GROUP_BYTES = 64 << 20
_SPARK_HASH_SEED = 42
_UUID_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "https://delta-mirror/checkpoint")


# --------------------------------------------------------------------------------------------
# Public entry point
# --------------------------------------------------------------------------------------------


def build_checkpoint(
    inp: CheckpointInput,
    *,
    kind: str = "classic",
    part_size: int | None = None,
    sidecar_size: int = 1_000_000,
    checkpoint_id: str | None = None,
    modification_time_ms: int = 0,
) -> CheckpointResult:
    """Render the checkpoint of ``inp.version`` and its ``_last_checkpoint``.

    ``kind``: ``"classic"`` (``v.checkpoint.parquet``), ``"multipart"`` (``part_size`` file
    actions per part on average, hash-clustered like Spark; a single part is written as classic
    because readers such as Trino reject ``"parts":1``) or ``"v2"`` (UUID-named top-level file plus
    ``_delta_log/_sidecars/<uuid>.parquet`` files of at most ``sidecar_size`` file actions).
    ``checkpoint_id`` seeds the V2 UUIDs (default ``"<metaData.id>/<version>"``).
    ``modification_time_ms`` goes into ``sidecar.modificationTime`` and
    ``_last_checkpoint.v2Checkpoint.modificationTime``; pass the commit time of the version so
    the bytes stay a pure function of the SQL state (storage sets the real mtime anyway).
    """
    if kind not in ("classic", "multipart", "v2"):
        raise ValueError(f"unknown checkpoint kind {kind!r} (classic, multipart or v2)")
    if kind == "multipart" and (part_size is None or part_size < 1):
        raise ValueError("a multipart checkpoint needs part_size >= 1")
    if sidecar_size < 1:
        raise ValueError("sidecar_size must be >= 1")
    version = inp.version
    protocol = _protocol(_action(inp.protocol, "protocol", version))
    metadata = _action(inp.metadata, "metaData", version)
    _check_kind_allowed(kind, protocol, version)
    ctx = _Context(version, _partition_keys(metadata, version))
    non_file = _non_file_rows(inp, protocol, metadata)

    if kind == "v2":
        return _build_v2(
            inp,
            ctx,
            non_file,
            sidecar_size,
            checkpoint_id or f"{metadata.get('id')}/{version}",
            modification_time_ms,
        )
    if kind == "multipart":
        assert part_size is not None
        return _build_multipart(inp, ctx, non_file, part_size)
    return _build_classic(version, non_file, _file_chunks(inp, ctx))


# --------------------------------------------------------------------------------------------
# The three layouts
# --------------------------------------------------------------------------------------------


def _build_classic(
    version: int, non_file: dict[str, list[Any]], chunks: Iterable[tuple[str, Any]]
) -> CheckpointResult:
    sink = _ParquetSink(CHECKPOINT_SCHEMA)
    sink.write(_rows_table(non_file, CHECKPOINT_SCHEMA))
    num_adds = 0
    for column, array in chunks:
        num_adds += len(array) if column == "add" else 0
        sink.write(_column_table(column, array, CHECKPOINT_SCHEMA))
    data = sink.close()
    files = [CheckpointFile(f"{LOG_DIR}/{checkpoint_name(version)}", data)]
    return _result(version, files, num_adds, sink.rows, parts=None, v2=None)


def _build_multipart(
    inp: CheckpointInput, ctx: _Context, non_file: dict[str, list[Any]], part_size: int
) -> CheckpointResult:
    chunks = list(_file_chunks(inp, ctx))
    num_file_actions = sum(len(a) for _, a in chunks)
    num_parts, non_file_part = num_checkpoint_parts(num_file_actions, part_size)
    if num_parts == 1:  # never "parts":1 (Trino rejects it): one part is a classic checkpoint
        return _build_classic(inp.version, non_file, chunks)
    part_ids = [spark_hash_partition(a.field("path"), num_parts) for _, a in chunks]
    files: list[CheckpointFile] = []
    total_rows = 0
    num_adds = sum(len(a) for c, a in chunks if c == "add")
    for part in range(num_parts):
        sink = _ParquetSink(CHECKPOINT_SCHEMA)
        if part == non_file_part:
            sink.write(_rows_table(non_file, CHECKPOINT_SCHEMA))
        for (column, array), ids in zip(chunks, part_ids, strict=True):
            selected = array.filter(pc.equal(ids, part))
            if len(selected):
                sink.write(_column_table(column, selected, CHECKPOINT_SCHEMA))
        data = sink.close()
        total_rows += sink.rows
        name = multipart_checkpoint_name(inp.version, part + 1, num_parts)
        files.append(CheckpointFile(f"{LOG_DIR}/{name}", data))
    return _result(inp.version, files, num_adds, total_rows, parts=num_parts, v2=None)


def _build_v2(
    inp: CheckpointInput,
    ctx: _Context,
    non_file: dict[str, list[Any]],
    sidecar_size: int,
    checkpoint_id: str,
    modification_time_ms: int,
) -> CheckpointResult:
    sidecars: list[CheckpointFile] = []
    sidecar_rows: list[dict[str, Any]] = []
    num_adds = 0
    file_rows = 0
    sink: _ParquetSink | None = None

    def finish(current: _ParquetSink) -> None:
        data = current.close()
        name = _sidecar_name(checkpoint_id, len(sidecars), data)
        sidecars.append(CheckpointFile(f"{LOG_DIR}/{SIDECAR_DIR}/{name}", data))
        sidecar_rows.append(
            {"path": name, "sizeInBytes": len(data), "modificationTime": modification_time_ms, "tags": None}
        )

    for column, array in _file_chunks(inp, ctx):
        num_adds += len(array) if column == "add" else 0
        offset = 0
        while offset < len(array):
            if sink is None:
                sink = _ParquetSink(SIDECAR_SCHEMA)
            take = min(sidecar_size - sink.rows, len(array) - offset)
            sink.write(_column_table(column, array.slice(offset, take), SIDECAR_SCHEMA))
            offset += take
            file_rows += take
            if sink.rows >= sidecar_size:
                finish(sink)
                sink = None
    if sink is not None:
        finish(sink)

    top, top_rows, v2 = _v2_top_level(
        inp.version, non_file, sidecar_rows, checkpoint_id, modification_time_ms
    )
    return _result(inp.version, [*sidecars, top], num_adds, file_rows + top_rows, parts=None, v2=v2)


def _sidecar_name(checkpoint_id: str, index: int, data: bytes) -> str:
    """Deterministic: the same bytes at the same position get the same name on a re-run."""
    digest = hashlib.sha256(data).hexdigest()
    return f"{uuid.uuid5(_UUID_NAMESPACE, f'{checkpoint_id}/sidecar/{index}/{digest}')}.parquet"


def _v2_top_level(
    version: int,
    non_file: dict[str, list[Any]],
    sidecar_rows: list[dict[str, Any]],
    checkpoint_id: str,
    modification_time_ms: int,
) -> tuple[CheckpointFile, int, dict[str, Any]]:
    """The UUID-named top-level file (checkpointMetadata, non-file actions, sidecar actions)."""
    rows: dict[str, list[Any]] = {"checkpointMetadata": [{"version": version, "tags": None}]}
    rows.update(non_file)
    rows["sidecar"] = sidecar_rows
    top = _ParquetSink(V2_CHECKPOINT_SCHEMA)
    top.write(_rows_table(rows, V2_CHECKPOINT_SCHEMA))
    data = top.close()
    digest = hashlib.sha256(data).hexdigest()
    top_uuid = str(uuid.uuid5(_UUID_NAMESPACE, f"{checkpoint_id}/v2/{digest}"))
    name = uuid_checkpoint_name(version, top_uuid)
    v2 = {"path": name, "sizeInBytes": len(data), "modificationTime": modification_time_ms}
    return CheckpointFile(f"{LOG_DIR}/{name}", data), top.rows, v2


# --------------------------------------------------------------------------------------------
# Building blocks for other engines (the Spark engine writes the file actions itself)
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CheckpointHeader:
    """What a checkpoint of ``version`` holds besides its file actions, validated as the local
    engine validates it: the non-file rows (protocol, metaData, txn, domainMetadata: dicts in
    checkpoint-schema shape), the keys ``partitionValues`` must carry, and the V2 checkpoint id."""

    version: int
    kind: str
    non_file: dict[str, list[Any]]
    partition_keys: tuple[str, ...]
    checkpoint_id: str


def checkpoint_header(inp: CheckpointInput, kind: str, checkpoint_id: str | None = None) -> CheckpointHeader:
    """Validate the non-file state of ``inp`` for ``kind`` (``adds``/``removes`` are not read)."""
    if kind not in ("classic", "multipart", "v2"):
        raise ValueError(f"unknown checkpoint kind {kind!r} (classic, multipart or v2)")
    protocol = _protocol(_action(inp.protocol, "protocol", inp.version))
    metadata = _action(inp.metadata, "metaData", inp.version)
    _check_kind_allowed(kind, protocol, inp.version)
    return CheckpointHeader(
        version=inp.version,
        kind=kind,
        non_file=_non_file_rows(inp, protocol, metadata),
        partition_keys=_partition_keys(metadata, inp.version),
        checkpoint_id=checkpoint_id or f"{metadata.get('id')}/{inp.version}",
    )


def non_file_parquet(header: CheckpointHeader) -> bytes:
    """The header's non-file rows as a Parquet file in ``CHECKPOINT_SCHEMA``."""
    sink = _ParquetSink(CHECKPOINT_SCHEMA)
    sink.write(_rows_table(header.non_file, CHECKPOINT_SCHEMA))
    return sink.close()


def num_checkpoint_parts(num_file_actions: int, part_size: int) -> tuple[int, int]:
    """``(parts, part holding the non-file rows)`` as the local engine splits a multi-part checkpoint;
    one part means a classic checkpoint. The non-file rows have a null key, which hashes to the seed."""
    parts = max(1, -(-num_file_actions // part_size))
    return parts, _SPARK_HASH_SEED % parts


def v2_checkpoint_files(
    header: CheckpointHeader, sidecars: Sequence[bytes], modification_time_ms: int
) -> tuple[list[CheckpointFile], int]:
    """Sidecar files named as the local engine names them, then the top-level file, from sidecar
    bytes written elsewhere (in order). Returns the files and the top-level file's row count."""
    files: list[CheckpointFile] = []
    rows: list[dict[str, Any]] = []
    for i, data in enumerate(sidecars):
        name = _sidecar_name(header.checkpoint_id, i, data)
        files.append(CheckpointFile(f"{LOG_DIR}/{SIDECAR_DIR}/{name}", data))
        rows.append(
            {"path": name, "sizeInBytes": len(data), "modificationTime": modification_time_ms, "tags": None}
        )
    top, top_rows, v2 = _v2_top_level(
        header.version, header.non_file, rows, header.checkpoint_id, modification_time_ms
    )
    files.append(top)
    return files, top_rows


def checkpoint_result(
    version: int,
    files: list[CheckpointFile],
    num_adds: int,
    num_actions: int,
    *,
    parts: int | None = None,
    v2_top: CheckpointFile | None = None,
    modification_time_ms: int = 0,
) -> CheckpointResult:
    """The result (with ``_last_checkpoint``) for files built elsewhere, exactly as the local engine
    describes its own."""
    v2 = None
    if v2_top is not None:
        name = v2_top.path.rsplit("/", 1)[-1]
        v2 = {"path": name, "sizeInBytes": len(v2_top.data), "modificationTime": modification_time_ms}
    return _result(version, files, num_adds, num_actions, parts=parts, v2=v2)


def _result(
    version: int,
    files: list[CheckpointFile],
    num_adds: int,
    num_actions: int,
    *,
    parts: int | None,
    v2: dict[str, Any] | None,
) -> CheckpointResult:
    """The result with its ``_last_checkpoint`` (:meth:`LastCheckpoint.render`)."""
    last = LastCheckpoint(
        version=version,
        size=num_actions,
        parts=parts,
        size_in_bytes=sum(len(f.data) for f in files),
        num_of_add_files=num_adds,
        v2_checkpoint=v2,
    ).render()
    return CheckpointResult(
        files=files, last_checkpoint=last, num_add_files=num_adds, num_actions=num_actions
    )


def _check_kind_allowed(kind: str, protocol: dict[str, Any], version: int) -> None:
    """The v2 rule (:class:`CheckpointKind`)."""
    refusal = CheckpointKind(kind).refusal(protocol)
    if refusal is not None:
        raise PermanentError(refusal[0], version=version, hint=refusal[1])


# --------------------------------------------------------------------------------------------
# Non-file actions (a handful of rows: plain Python is fine)
# --------------------------------------------------------------------------------------------


def _action(line: str, key: str, version: int) -> dict[str, Any]:
    try:
        obj = json.loads(line)
    except (TypeError, ValueError) as exc:
        raise InvalidActionError(f"{key} action is not valid JSON: {exc}", version=version) from exc
    body = obj.get(key) if isinstance(obj, dict) else None
    if not isinstance(body, dict):
        raise InvalidActionError(f"expected a {{{key!r}: {{...}}}} line, got {line[:120]!r}", version=version)
    return body


def _protocol(body: dict[str, Any]) -> dict[str, Any]:
    """Feature lists only with reader 3 / writer 7 (PROTOCOL.md; duckdb-delta #151 chokes otherwise)."""
    body = dict(body)
    if body.get("minReaderVersion") != 3:
        body.pop("readerFeatures", None)
    if body.get("minWriterVersion") != 7:
        body.pop("writerFeatures", None)
    return body


def _non_file_rows(
    inp: CheckpointInput, protocol: dict[str, Any], metadata: dict[str, Any]
) -> dict[str, list[Any]]:
    """Rows in the order protocol, metaData, txn..., domainMetadata... (dicts; unknown keys dropped)."""
    domains = [_action(line, "domainMetadata", inp.version) for line in inp.domain_metadata]
    return {
        "protocol": [protocol],
        "metaData": [metadata],
        "txn": [_action(line, "txn", inp.version) for line in inp.txns],
        # tombstones do not belong in a checkpoint (PROTOCOL.md, Checkpoints)
        "domainMetadata": [d for d in domains if d.get("removed") is not True],
    }


def _rows_table(rows: dict[str, list[Any]], schema: Any) -> Any:
    """One row per action, the action's column set and every other column null."""
    total = sum(len(v) for v in rows.values())
    columns = []
    for field in schema:
        values: list[Any] = [None] * total
        # rows are laid out in the dict's order, one block per action type
        pos = 0
        for name, items in rows.items():
            if name == field.name:
                values[pos : pos + len(items)] = items
            pos += len(items)
        try:
            columns.append(pa.array(values, type=field.type))
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError) as exc:
            raise InvalidActionError(
                f"{field.name} action does not fit the checkpoint schema: {exc}"
            ) from exc
    return pa.Table.from_arrays(columns, schema=schema)


# --------------------------------------------------------------------------------------------
# File actions: Arrow JSON fast path, json.loads fallback
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Context:
    version: int
    partition_keys: tuple[str, ...]  # keys of partitionValues (physical names under column mapping)


def _partition_keys(metadata: dict[str, Any], version: int) -> tuple[str, ...]:
    """Partition columns as they appear in ``partitionValues`` (physical names with column mapping)."""
    columns = metadata.get("partitionColumns") or []
    if not isinstance(columns, list) or not all(isinstance(c, str) for c in columns):
        raise InvalidActionError("metaData.partitionColumns must be a list of strings", version=version)
    config = metadata.get("configuration") or {}
    if not columns or config.get("delta.columnMapping.mode", "none") == "none":
        return tuple(columns)
    try:
        fields = json.loads(metadata.get("schemaString") or "")["fields"]
    except (TypeError, ValueError, KeyError) as exc:
        raise InvalidActionError(
            f"metaData.schemaString is not a Delta schema: {exc}", version=version
        ) from exc
    physical = {
        f.get("name"): (f.get("metadata") or {}).get("delta.columnMapping.physicalName", f.get("name"))
        for f in fields
        if isinstance(f, dict)
    }
    return tuple(str(physical.get(c, c)) for c in columns)


def _file_chunks(inp: CheckpointInput, ctx: _Context) -> Iterator[tuple[str, Any]]:
    """``("add"|"remove", StructArray)`` chunks of bounded text size, adds first."""
    for column, lines in (("add", inp.adds), ("remove", inp.removes)):
        batch: list[str] = []
        chars = longest = 0
        for line in lines:
            batch.append(line)
            size = len(line)
            chars += size
            longest = max(longest, size)
            if chars >= _CHUNK_CHARS:
                yield column, _parse_file_actions(batch, column, ctx, longest)
                batch, chars, longest = [], 0, 0
        if batch:
            yield column, _parse_file_actions(batch, column, ctx, longest)


class _Fallback(Exception):
    """The Arrow fast path cannot take this chunk; parse it line by line instead."""


def _parse_file_actions(lines: list[str], column: str, ctx: _Context, longest: int = 0) -> Any:
    try:
        return _parse_fast(lines, column, ctx, longest)
    except _Fallback:
        return _parse_slow(lines, column, ctx)


def _reader_type(column: str) -> Any:
    target = _ADD if column == "add" else _REMOVE
    return pa.struct([f for f in target if f.name not in _MAP_FIELDS])


_READER_SCHEMAS = {c: pa.schema([pa.field(c, _reader_type(c))]) for c in ("add", "remove")}


def _parse_fast(lines: list[str], column: str, ctx: _Context, longest: int = 0) -> Any:
    """Parse a chunk with Arrow's multi-threaded JSON reader into the checkpoint's struct type."""
    try:
        data = "\n".join(lines).encode("utf-8")
    except UnicodeEncodeError as exc:  # lone surrogates: the slow path names the line
        raise _Fallback from exc
    # a JSON object may not straddle blocks: make room for the longest line (4 bytes per char max)
    block_size = max(_JSON_BLOCK, 4 * longest + 64)
    try:
        table = pa_json.read_json(
            io.BytesIO(data),
            read_options=pa_json.ReadOptions(use_threads=True, block_size=block_size),
            parse_options=pa_json.ParseOptions(
                explicit_schema=_READER_SCHEMAS[column], unexpected_field_behavior="infer"
            ),
        )
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise _Fallback from exc
    del data
    if table.num_rows != len(lines):  # blank lines are skipped by the reader
        raise _Fallback
    parsed = table.column(column).combine_chunks()
    del table
    if parsed.null_count or parsed.field("path").null_count:
        raise _Fallback  # a line without this action, or without a path: let the slow path say which
    n = len(parsed)
    names = {f.name for f in parsed.type}
    children = []
    for field in _ADD if column == "add" else _REMOVE:
        if field.name == "dataChange":
            children.append(pa.repeat(pa.scalar(False), n))
        elif field.name == "partitionValues":
            children.append(
                _struct_to_map(
                    parsed.field(field.name) if field.name in names else None, n, ctx.partition_keys
                )
            )
        elif field.name == "tags":
            children.append(_struct_to_map(parsed.field(field.name) if field.name in names else None, n, ()))
        elif field.name not in names:
            children.append(pa.nulls(n, field.type))
        else:
            children.append(_conform(parsed.field(field.name), field.type))
    target = _ADD if column == "add" else _REMOVE
    return pa.StructArray.from_arrays(children, fields=list(target))


def _conform(array: Any, typ: Any) -> Any:
    """Drop unknown nested fields (e.g. in ``deletionVector``) the reader inferred."""
    if array.type == typ:
        return array
    if not (pa.types.is_struct(array.type) and pa.types.is_struct(typ)):
        raise _Fallback
    present = {f.name for f in array.type}
    children = [
        _conform(array.field(f.name), f.type) if f.name in present else pa.nulls(len(array), f.type)
        for f in typ
    ]
    return pa.StructArray.from_arrays(children, fields=list(typ), mask=array.is_null())


def _struct_to_map(struct: Any, n: int, expected: Sequence[str]) -> Any:
    """Turn a JSON-inferred struct into map<string,string>.

    ``expected`` keys (the partition columns) are always present, null when absent; other keys
    only when they have a value, sorted so the bytes do not depend on inference order.
    """
    if struct is None or pa.types.is_null(struct.type):
        return pa.nulls(n, _MAP)
    if not pa.types.is_struct(struct.type):
        raise _Fallback
    present = {f.name: i for i, f in enumerate(struct.type)}
    wanted = set(expected)
    keys = list(expected) + sorted(k for k in present if k not in wanted)
    if not keys:
        offsets = pa.repeat(pa.scalar(0, _INT), n + 1)
        return pa.MapArray.from_arrays(
            offsets, pa.array([], _STR), pa.array([], _STR), type=_MAP, mask=struct.is_null()
        )
    values = []
    for key in keys:
        if key not in present:
            values.append(pa.nulls(n, _STR))
            continue
        child = struct.field(present[key])
        if pa.types.is_null(child.type):
            child = pa.nulls(n, _STR)
        elif not pa.types.is_string(child.type):
            raise _Fallback  # a non-string value: invalid, the slow path reports it
        values.append(child)
    k = len(keys)
    row_valid = struct.is_valid()
    all_rows = struct.null_count == 0
    if all_rows and k == len(expected):
        # every row has every key: fixed stride, no filtering
        offsets = _arange(n + 1, step=k)
        if k == 1:
            return pa.MapArray.from_arrays(offsets, pa.repeat(pa.scalar(keys[0]), n), values[0], type=_MAP)
        flat_idx, key_idx = _interleave_indices(n, k)
        flat_values = pa.concat_arrays(values).take(flat_idx)
        return pa.MapArray.from_arrays(offsets, pa.array(keys, _STR).take(key_idx), flat_values, type=_MAP)
    include = []
    counts = pa.repeat(pa.scalar(0, _INT), n)
    for j, key in enumerate(keys):
        keep = row_valid if key in wanted else pc.and_(row_valid, values[j].is_valid())
        keep = pc.fill_null(keep, False)
        include.append(keep)
        counts = pc.add(counts, pc.cast(keep, _INT))
    offsets = pa.concat_arrays([pa.array([0], _INT), pc.cumulative_sum(counts)])
    flat_idx, key_idx = _interleave_indices(n, k)
    mask = pa.concat_arrays(include).take(flat_idx)
    flat_values = pa.concat_arrays(values).take(flat_idx).filter(mask)
    flat_keys = pa.array(keys, _STR).take(key_idx).filter(mask)
    return pa.MapArray.from_arrays(offsets, flat_keys, flat_values, type=_MAP, mask=pc.invert(row_valid))


def _arange(length: int, *, step: int = 1) -> Any:
    """int32 ``0, step, 2*step, ...`` of ``length`` values, without a Python loop."""
    if length == 0:
        return pa.array([], _INT)
    ones = pa.repeat(pa.scalar(step, _INT), length)
    return pc.subtract(pc.cumulative_sum(ones), pa.scalar(step, _INT))


def _interleave_indices(n: int, k: int) -> tuple[Any, Any]:
    """Row-major (row i, key j) -> position j*n+i in the key-major concatenation, and j."""
    r = pc.cast(_arange(n * k), _LONG)
    row = pc.divide(r, pa.scalar(k, _LONG))
    key = pc.subtract(r, pc.multiply(row, pa.scalar(k, _LONG)))
    return pc.add(pc.multiply(key, pa.scalar(n, _LONG)), row), key


def _parse_slow(lines: list[str], column: str, ctx: _Context) -> Any:
    target = _ADD if column == "add" else _REMOVE
    rows = [_normalize_file_action(line, column, ctx) for line in lines]
    try:
        return pa.array(rows, type=target)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError) as exc:
        raise InvalidActionError(
            f"{column} action does not fit the checkpoint schema: {exc}", version=ctx.version
        ) from exc


def _normalize_file_action(line: str, column: str, ctx: _Context) -> dict[str, Any]:
    body = _action(line, column, ctx.version)
    if not isinstance(body.get("path"), str):
        raise InvalidActionError(
            f"{column} action without a string path: {line[:120]!r}", version=ctx.version
        )
    row = {f.name: body.get(f.name) for f in (_ADD if column == "add" else _REMOVE)}
    row["dataChange"] = False
    row["partitionValues"] = _map_value(row.get("partitionValues"), ctx.partition_keys, line, ctx)
    if "tags" in row:
        row["tags"] = _map_value(row.get("tags"), (), line, ctx)
    for key in ("stats", "clusteringProvider"):
        if row.get(key) is not None and not isinstance(row[key], str):
            raise InvalidActionError(f"{column}.{key} must be a string: {line[:120]!r}", version=ctx.version)
    return row


def _map_value(
    value: Any, expected: Sequence[str], line: str, ctx: _Context
) -> list[tuple[str, str | None]] | None:
    """Same rule as the fast path: expected keys always, others when set, others sorted."""
    if value is None:
        return None
    if not isinstance(value, dict) or not all(v is None or isinstance(v, str) for v in value.values()):
        raise InvalidActionError(f"expected a string-to-string map in {line[:120]!r}", version=ctx.version)
    wanted = set(expected)
    extra = sorted(k for k, v in value.items() if k not in wanted and v is not None)
    return [(k, value.get(k)) for k in expected] + [(k, value[k]) for k in extra]


def _column_table(column: str, array: Any, schema: Any) -> Any:
    n = len(array)
    return pa.Table.from_arrays(
        [array if f.name == column else pa.nulls(n, f.type) for f in schema], schema=schema
    )


# --------------------------------------------------------------------------------------------
# Parquet output
# --------------------------------------------------------------------------------------------


class _ParquetSink:
    """An in-memory Parquet file; small writes are coalesced into row groups of bounded size."""

    def __init__(self, schema: Any) -> None:
        # BytesIO, not pa.BufferOutputStream: getvalue() hands over its buffer without a copy,
        # which halves peak memory for big checkpoints (the output sits in memory once).
        self._out = io.BytesIO()
        self._writer = pq.ParquetWriter(
            self._out,
            schema,
            compression="snappy",
            use_compliant_nested_type=True,  # list/element and key_value/key/value, as Spark writes
            store_schema=False,  # no ARROW:schema blob: readers use the Parquet schema only
            data_page_version="1.0",
        )
        self._pending: list[Any] = []
        self._pending_rows = 0
        self._pending_bytes = 0
        self.rows = 0

    def write(self, table: Any) -> None:
        if table.num_rows == 0:
            return
        self._pending.append(table)
        self._pending_rows += table.num_rows
        self._pending_bytes += table.nbytes
        self.rows += table.num_rows
        if self._pending_rows >= _ROW_GROUP_ROWS or self._pending_bytes >= _ROW_GROUP_BYTES:
            self._flush()

    def _flush(self) -> None:
        if self._pending:
            table = pa.concat_tables(self._pending)
            self._pending, self._pending_rows, self._pending_bytes = [], 0, 0
            self._writer.write_table(table, row_group_size=max(table.num_rows, 1))

    def close(self) -> bytes:
        self._flush()
        self._writer.close()
        return self._out.getvalue()


# --------------------------------------------------------------------------------------------
# Spark's hash partitioning (multi-part checkpoints)
# --------------------------------------------------------------------------------------------

_U32 = pa.uint32()


def _u32(value: int) -> Any:
    return pa.scalar(value & 0xFFFFFFFF, _U32)


def _rotl(x: Any, r: int) -> Any:
    return pc.bit_wise_or(pc.shift_left(x, _u32(r)), pc.shift_right(x, _u32(32 - r)))


def _mix_k1(k: Any) -> Any:
    k = pc.multiply(k, _u32(0xCC9E2D51))
    return pc.multiply(_rotl(k, 15), _u32(0x1B873593))


def _mix_h1(h: Any, k: Any) -> Any:
    h = _rotl(pc.bit_wise_xor(h, k), 13)
    return pc.add(pc.multiply(h, _u32(5)), _u32(0xE6546B64))


def spark_hash_partition(paths: Any, num_parts: int) -> Any:
    """``pmod(murmur3(path, 42), num_parts)`` per path, exactly as Spark's ``repartition`` does.

    Spark hashes a string with ``Murmur3_x86_32.hashUnsafeBytes``: little-endian 4-byte blocks,
    then each trailing byte *sign-extended* as its own block (not standard Murmur3). Vectorised
    with Arrow compute so a million paths take well under a second. Returns int64 part indexes.
    """
    if isinstance(paths, pa.ChunkedArray):
        paths = paths.combine_chunks()
    paths = pc.cast(paths, pa.large_binary())
    n = len(paths)
    if n == 0:
        return pa.array([], _LONG)
    if paths.null_count:
        raise ValueError("paths must not be null")
    offsets_buf, data_buf = paths.buffers()[1], paths.buffers()[2]
    all_offsets = pa.Array.from_buffers(_LONG, n + 1, [None, offsets_buf], offset=paths.offset)
    starts = all_offsets.slice(0, n)
    lengths = pc.subtract(all_offsets.slice(1, n), starts)
    data_len = data_buf.size if data_buf is not None else 0
    data = pa.Array.from_buffers(pa.uint8(), data_len, [None, data_buf]) if data_len else None
    h = pa.repeat(_u32(_SPARK_HASH_SEED), n)
    max_len = pc.max(lengths).as_py() or 0
    zero = pa.scalar(0, _LONG)

    def byte_at(index: Any, active: Any) -> Any:
        assert data is not None
        return pc.cast(data.take(pc.if_else(active, index, zero)), _U32)

    for block in range(max_len // 4):
        active = pc.greater_equal(lengths, pa.scalar(4 * block + 4, _LONG))
        base = pc.add(starts, pa.scalar(4 * block, _LONG))
        word = byte_at(base, active)
        for t in (1, 2, 3):
            b = byte_at(pc.add(base, pa.scalar(t, _LONG)), active)
            word = pc.bit_wise_or(word, pc.shift_left(b, _u32(8 * t)))
        h = pc.if_else(active, _mix_h1(h, _mix_k1(word)), h)
    aligned = pc.subtract(lengths, pc.bit_wise_and(lengths, pa.scalar(3, _LONG)))
    for t in range(3):
        active = pc.greater(pc.subtract(lengths, aligned), pa.scalar(t, _LONG))
        if not pc.any(active).as_py():
            break
        b = byte_at(pc.add(pc.add(starts, aligned), pa.scalar(t, _LONG)), active)
        signed = pc.if_else(pc.greater(b, _u32(127)), pc.bit_wise_or(b, _u32(0xFFFFFF00)), b)
        h = pc.if_else(active, _mix_h1(h, _mix_k1(signed)), h)
    # fmix
    h = pc.bit_wise_xor(h, pc.cast(lengths, _U32))
    h = pc.bit_wise_xor(h, pc.shift_right(h, _u32(16)))
    h = pc.multiply(h, _u32(0x85EBCA6B))
    h = pc.bit_wise_xor(h, pc.shift_right(h, _u32(13)))
    h = pc.multiply(h, _u32(0xC2B2AE35))
    h = pc.bit_wise_xor(h, pc.shift_right(h, _u32(16)))
    # to signed int32, then pmod
    wide = pc.cast(h, _LONG)
    signed_h = pc.if_else(
        pc.greater_equal(wide, pa.scalar(1 << 31, _LONG)), pc.subtract(wide, pa.scalar(1 << 32, _LONG)), wide
    )
    p = pa.scalar(num_parts, _LONG)
    rem = pc.subtract(signed_h, pc.multiply(pc.divide(signed_h, p), p))
    return pc.if_else(pc.less(rem, zero), pc.add(rem, p), rem)
