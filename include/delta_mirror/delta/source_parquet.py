"""A source checkpoint's Parquet rows as Delta actions (the JSON form a commit would carry).

Read column-wise in record batches: each non-null column of a batch is converted with one
function built from its Arrow type (``to_pylist`` then the JSON shape), and the row's action
kept in row order. Part of ``delta.source_log`` (import), apart for size.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from delta_mirror.delta.commit_lines import OBJECT_ACTIONS as _OBJECT_ACTIONS
from delta_mirror.errors import DataError

# Checkpoint columns that are never actions of the table state (Spark never writes them; if a
# writer did, they carry no state).
IGNORED_CHECKPOINT_COLUMNS: frozenset[str] = frozenset({"commitInfo"})
_IGNORED_CHECKPOINT_COLUMNS = IGNORED_CHECKPOINT_COLUMNS


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
        return _struct_converter(t, path)
    if pa.types.is_map(t):
        return _map_converter(t, path)
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        econv = _converter(t.value_type, f"{path}[]")
        if econv is None:
            return None
        return lambda v: [econv(x) if x is not None else None for x in v]
    if pa.types.is_dictionary(t):
        return _converter(t.value_type, path)
    if any(
        check(t)
        for check in (
            pa.types.is_string,
            pa.types.is_large_string,
            pa.types.is_integer,
            pa.types.is_boolean,
            pa.types.is_floating,
            pa.types.is_null,
        )
    ):
        return None

    def conv_unsupported(v: Any) -> Any:
        raise _UnsupportedValue(path, t)

    return conv_unsupported


def _struct_converter(t: Any, path: str) -> _Conv:
    fields: list[tuple[str, _Conv | None]] = []
    for i in range(t.num_fields):
        f = t.field(i)
        if not f.name.endswith("_parsed"):
            fields.append((f.name, _converter(f.type, f"{path}.{f.name}")))

    def conv_struct(v: Any) -> Any:
        out: dict[str, Any] = {}
        for name, conv in fields:
            x = v.get(name)
            if x is not None:
                out[name] = conv(x) if conv is not None else x
        return out

    return conv_struct


def _map_converter(t: Any, path: str) -> _Conv:
    kconv = _converter(t.key_type, f"{path}.key")
    vconv = _converter(t.item_type, f"{path}.value")

    def conv_map(v: Any) -> Any:
        out: dict[Any, Any] = {}
        for k, x in v:
            out[kconv(k) if kconv is not None else k] = (
                vconv(x) if (vconv is not None and x is not None) else x
            )
        return out

    return conv_map


def parquet_actions(data: bytes, *, name: str, table: str, version: int) -> Iterator[tuple[str, Any]]:
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
                    slots[row] = _one_action(
                        slots[row], (col_name, payload), name=name, table=table, version=version
                    )
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


def _one_action(
    other: tuple[str, Any] | None, found: tuple[str, Any], *, name: str, table: str, version: int
) -> tuple[str, Any]:
    """The action of a checkpoint row: its one known action; an unknown column beside it is
    ignored, as readers do (see ``line_action``)."""
    if other is None or other[0] not in _OBJECT_ACTIONS:
        return found if other is None or found[0] in _OBJECT_ACTIONS else other
    if found[0] not in _OBJECT_ACTIONS:
        return other
    raise DataError(
        f"checkpoint {name}: a row holds two actions ('{other[0]}' and '{found[0]}')",
        table=table,
        version=version,
        hint="every checkpoint row must hold exactly one action; the checkpoint is corrupt",
    )


__all__ = ["IGNORED_CHECKPOINT_COLUMNS", "parquet_actions"]
