"""Writing Parquet data files and the ``add`` actions that describe them (local tables).

Used by the demo and by tests that need real data behind a log; the mirror itself never writes
data files.
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from delta_mirror.delta.new_table import create_table_actions, delta_schema_string


def _stat(value: Any) -> Any:
    if hasattr(value, "isoformat"):
        return value.isoformat()
    return value


def write_data_file(
    root: Path, data: pa.Table, partition_values: dict[str, str | None] | None = None
) -> dict[str, Any]:
    """Write ``data`` as a Parquet file under ``root`` and return its ``add`` action body."""
    partition_values = partition_values or {}
    rel_dir = "/".join(
        f"{k}={'__HIVE_DEFAULT_PARTITION__' if v is None else v}" for k, v in partition_values.items()
    )
    name = f"part-00000-{uuid.uuid4()}-c000.snappy.parquet"
    rel = f"{rel_dir}/{name}" if rel_dir else name
    target = root / rel
    target.parent.mkdir(parents=True, exist_ok=True)
    columns = data.drop_columns([c for c in partition_values if c in data.column_names])
    pq.write_table(columns, target, compression="snappy")
    stats: dict[str, Any] = {"numRecords": data.num_rows, "minValues": {}, "maxValues": {}, "nullCount": {}}
    for col in columns.column_names:
        arr = columns[col]
        stats["nullCount"][col] = arr.null_count
        if arr.null_count < len(arr) and not pa.types.is_boolean(arr.type):
            mm = pc.min_max(arr)
            stats["minValues"][col] = _stat(mm["min"].as_py())
            stats["maxValues"][col] = _stat(mm["max"].as_py())
    return {
        "path": quote(rel, safe="/=-_.~"),
        "partitionValues": dict(partition_values),
        "size": target.stat().st_size,
        "modificationTime": int(time.time() * 1000),
        "dataChange": True,
        "stats": json.dumps(stats, separators=(",", ":"), default=str),
    }


__all__ = ["create_table_actions", "delta_schema_string", "write_data_file"]
