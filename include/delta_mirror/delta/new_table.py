"""The actions that create a plain Delta table: ``protocol`` and ``metaData`` from an Arrow schema.

Used by the PySpark ingest, the demo and tests; the store's commit rules then check them like any
other commit.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import pyarrow as pa

_DELTA_TYPES = {
    pa.int64(): "long",
    pa.int32(): "integer",
    pa.int16(): "short",
    pa.int8(): "byte",
    pa.string(): "string",
    pa.large_string(): "string",
    pa.float64(): "double",
    pa.float32(): "float",
    pa.bool_(): "boolean",
    pa.date32(): "date",
    pa.timestamp("us", tz="UTC"): "timestamp",
}


def delta_schema_string(schema: pa.Schema) -> str:
    """The ``schemaString`` of a flat Arrow schema."""
    fields = []
    for f in schema:
        if f.type not in _DELTA_TYPES:
            raise ValueError(f"unsupported column type {f.type} for column {f.name}")
        fields.append({"name": f.name, "type": _DELTA_TYPES[f.type], "nullable": True, "metadata": {}})
    return json.dumps({"type": "struct", "fields": fields}, separators=(",", ":"))


def create_table_actions(
    schema: pa.Schema | str,
    *,
    partition_columns: list[str] | None = None,
    configuration: dict[str, str] | None = None,
) -> list[tuple[str, dict[str, Any]]]:
    """The ``protocol`` and ``metaData`` actions that create a plain table (reader 1, writer 2).

    ``schema`` is a flat Arrow schema, or a ready ``schemaString`` (e.g. a Spark schema's JSON).
    """
    return [
        ("protocol", {"minReaderVersion": 1, "minWriterVersion": 2}),
        (
            "metaData",
            {
                "id": str(uuid.uuid4()),
                "format": {"provider": "parquet", "options": {}},
                "schemaString": schema if isinstance(schema, str) else delta_schema_string(schema),
                "partitionColumns": list(partition_columns or []),
                "configuration": dict(configuration or {}),
                "createdTime": int(time.time() * 1000),
            },
        ),
    ]


__all__ = ["create_table_actions", "delta_schema_string"]
