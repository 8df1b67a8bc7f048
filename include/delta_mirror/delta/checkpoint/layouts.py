"""The three checkpoint layouts (classic, multi-part, V2 with sidecars), their non-file rows and
Parquet output, and the building blocks other engines (Spark) use to produce the same files."""

from __future__ import annotations

import hashlib
import io
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from delta_mirror.delta.checkpoint.file_actions import (
    _action,
    _column_table,
    _Context,
    _file_chunks,
    _partition_keys,
)
from delta_mirror.delta.checkpoint.model import CheckpointFile, CheckpointInput, CheckpointResult
from delta_mirror.delta.checkpoint.schema import CHECKPOINT_SCHEMA, SIDECAR_SCHEMA, V2_CHECKPOINT_SCHEMA
from delta_mirror.delta.checkpoint.spark_hash import _SPARK_HASH_SEED, spark_hash_partition
from delta_mirror.delta.last_checkpoint import LastCheckpoint
from delta_mirror.delta.log_path import (
    LOG_DIR,
    SIDECAR_DIR,
    checkpoint_name,
    multipart_checkpoint_name,
    uuid_checkpoint_name,
)
from delta_mirror.delta.protocol import CheckpointKind
from delta_mirror.errors import InvalidActionError, PermanentError

_ROW_GROUP_ROWS = 1 << 17
_ROW_GROUP_BYTES = 64 << 20
# Dictionary pages only where values repeat from file to file (partition values, tags). Paths and
# stats are unique per file: a dictionary tried on them is built, overflows its page and is thrown
# away, which doubles the encoding time of a 300k-file checkpoint, grows it by a sixth and holds
# ~40 MB more while writing.
_DICTIONARY_COLUMNS = [
    f"{side}.{column}.key_value.{part}"
    for side in ("add", "remove")
    for column in ("partitionValues", "tags")
    for part in ("key", "value")
]
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
    top, top_rows, _v2 = _v2_top_level(
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
            use_dictionary=_DICTIONARY_COLUMNS,
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


__all__: list[str] = [
    "CheckpointHeader",
    "build_checkpoint",
    "checkpoint_header",
    "checkpoint_result",
    "non_file_parquet",
    "num_checkpoint_parts",
    "v2_checkpoint_files",
]
