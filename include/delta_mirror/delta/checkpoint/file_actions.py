"""``add``/``remove`` lines to Arrow columns: Arrow's JSON reader in bounded chunks, ``json.loads``
per line as the fallback (which also produces the precise error)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pa_json

from delta_mirror.delta.checkpoint.model import CheckpointInput
from delta_mirror.delta.checkpoint.schema import _ADD, _BOOL, _INT, _LONG, _MAP, _MAP_FIELDS, _REMOVE, _STR
from delta_mirror.errors import InvalidActionError

_CHUNK_CHARS = 16 << 20  # text parsed per Arrow JSON call: bounds memory, keeps threads busy
_JSON_BLOCK = 4 << 20


# --------------------------------------------------------------------------------------------
# File actions: Arrow JSON fast path, json.loads fallback
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
    yield from _line_chunks("add", inp.adds, ctx)
    for block in inp.add_blocks:
        yield "add", _parse_block(block, "add", ctx)
    yield from _line_chunks("remove", inp.removes, ctx)


def _line_chunks(column: str, lines: Iterable[str], ctx: _Context) -> Iterator[tuple[str, Any]]:
    batch: list[str] = []
    chars = 0
    for line in lines:
        batch.append(line)
        chars += len(line)
        if chars >= _CHUNK_CHARS:
            yield column, _parse_file_actions(batch, column, ctx)
            batch, chars = [], 0
    if batch:
        yield column, _parse_file_actions(batch, column, ctx)


def _parse_block(data: bytes, column: str, ctx: _Context) -> Any:
    """A block of ``\\n``-terminated UTF-8 lines, parsed without a Python string per line."""
    try:
        return _parse_arrow(data, data.count(b"\n"), column, ctx, _JSON_BLOCK)
    except _Fallback:
        return _parse_slow(data.decode("utf-8").split("\n")[:-1], column, ctx)


class _Fallback(Exception):
    """The Arrow fast path cannot take this chunk; parse it line by line instead."""


def _parse_file_actions(lines: list[str], column: str, ctx: _Context) -> Any:
    try:
        return _parse_fast(lines, column, ctx)
    except _Fallback:
        return _parse_slow(lines, column, ctx)


def _reader_type(column: str) -> Any:
    target = _ADD if column == "add" else _REMOVE
    return pa.struct([f for f in target if f.name not in _MAP_FIELDS])


_READER_SCHEMAS = {c: pa.schema([pa.field(c, _reader_type(c))]) for c in ("add", "remove")}


def _parse_fast(lines: list[str], column: str, ctx: _Context) -> Any:
    try:
        data = "\n".join(lines).encode("utf-8")
    except UnicodeEncodeError as exc:  # lone surrogates: the slow path names the line
        raise _Fallback from exc
    return _parse_arrow(data, len(lines), column, ctx, _JSON_BLOCK)


def _parse_arrow(data: bytes, num_lines: int, column: str, ctx: _Context, block_size: int) -> Any:
    """Parse ``num_lines`` lines with Arrow's multi-threaded JSON reader into the checkpoint's
    struct type; ``_Fallback`` when it cannot (the line-by-line path then finds the culprit)."""
    try:
        table = pa_json.read_json(
            pa.BufferReader(data),
            read_options=pa_json.ReadOptions(use_threads=True, block_size=block_size),
            parse_options=pa_json.ParseOptions(
                explicit_schema=_READER_SCHEMAS[column], unexpected_field_behavior="infer"
            ),
        )
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        if "straddl" in str(exc) and block_size <= len(data):  # a line longer than a block:
            # a JSON object may not straddle blocks, so parse the chunk as one block
            return _parse_arrow(data, num_lines, column, ctx, len(data) + 64)
        raise _Fallback from exc
    if table.num_rows != num_lines:  # blank lines are skipped by the reader
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
            # typed scalars here and below: inferring a Python value's type imports dateutil
            children.append(pa.repeat(pa.scalar(False, _BOOL), n))
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
            return pa.MapArray.from_arrays(
                offsets, pa.repeat(pa.scalar(keys[0], _STR), n), values[0], type=_MAP
            )
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


__all__: list[str] = []  # internal to the checkpoint package
