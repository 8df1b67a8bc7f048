"""Delta-Spark's checkpoint Parquet schema, every field nullable (delta-rs #4247, trino #18760);
Parquet map keys stay ``required`` because the Parquet spec demands it."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

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


__all__: list[str] = [
    "CHECKPOINT_SCHEMA",
    "SIDECAR_SCHEMA",
    "V2_CHECKPOINT_SCHEMA",
]
