"""Builders for Delta actions in tests: one home for ``protocol`` / ``metaData`` / ``add`` /
``remove`` bodies, the ``{kind: body}`` actions made of them, and commit files.

Key order follows Delta-Spark (tests compare bytes), and ``**extra`` adds or overrides fields.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from delta_mirror.dev.datafiles import create_table_actions, write_data_file

if TYPE_CHECKING:
    from delta_mirror.store import SqlStore

#: One nullable ``id: long`` column.
SCHEMA_STRING = json.dumps(
    {"type": "struct", "fields": [{"name": "id", "type": "long", "nullable": True, "metadata": {}}]}
)
EMPTY_SCHEMA_STRING = '{"type":"struct","fields":[]}'
#: The same column as an Arrow schema, for tables with real data files.
ID_SCHEMA = pa.schema([("id", pa.int64())])
TABLE_ID = "0e0c5a4e-1111-4222-8333-444455556666"


def protocol_body(reader: int = 1, writer: int = 2, **extra: Any) -> dict[str, Any]:
    return {"minReaderVersion": reader, "minWriterVersion": writer, **extra}


def metadata_body(
    *,
    id: str = TABLE_ID,
    schema_string: str = SCHEMA_STRING,
    partition_columns: Sequence[str] = (),
    configuration: dict[str, str] | None = None,
    created_time: int | None = 1,
    **extra: Any,
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": id,
        "format": {"provider": "parquet", "options": {}},
        "schemaString": schema_string,
        "partitionColumns": list(partition_columns),
        "configuration": dict(configuration or {}),
    }
    if created_time is not None:
        body["createdTime"] = created_time
    return {**body, **extra}


def add_body(path: str = "n.parquet", *, size: int = 1, **extra: Any) -> dict[str, Any]:
    return {
        "path": path,
        "partitionValues": {},
        "size": size,
        "modificationTime": 1,
        "dataChange": True,
        **extra,
    }


def remove_body(path: str, **extra: Any) -> dict[str, Any]:
    return {"path": path, "deletionTimestamp": 2, "dataChange": True, **extra}


def action(kind: str, body: dict[str, Any]) -> dict[str, Any]:
    return {kind: body}


def add(path: str, **extra: Any) -> dict[str, Any]:
    return action("add", add_body(path, **extra))


def remove(path: str, **extra: Any) -> dict[str, Any]:
    return action("remove", remove_body(path, **extra))


PROTOCOL = action("protocol", protocol_body())
METADATA = action("metaData", metadata_body())


def lines(*actions: dict[str, Any]) -> bytes:
    """Actions as commit input (``json.dumps`` defaults, one per line)."""
    return "".join(json.dumps(a) + "\n" for a in actions).encode()


def write_commit(root: Path, version: int, actions: Iterable[dict[str, Any]]) -> Path:
    """``<root>/_delta_log/<version>.json`` with compact lines, as a Delta writer would leave it."""
    log = root / "_delta_log"
    log.mkdir(parents=True, exist_ok=True)
    path = log / f"{version:020d}.json"
    path.write_text("".join(json.dumps(a, separators=(",", ":")) + "\n" for a in actions), encoding="utf-8")
    return path


def append_rows(store: SqlStore, root: Path, name: str, ids: Sequence[int]) -> None:
    """Commit one version adding a real Parquet file (``id`` values ``ids``) under ``root``."""
    data = pa.table({"id": list(ids)}, schema=ID_SCHEMA)
    store.commit(name, [("add", write_data_file(root, data))])


def create_data_table(
    store: SqlStore,
    root: Path,
    name: str = "t",
    *,
    first_rows: Sequence[int] | None = (1,),
    checkpoint_interval: int | None = None,
) -> None:
    """A table at ``root`` whose version 0 creates it (with one data file of ``first_rows``, if any)."""
    store.create_table(name, root.as_uri())
    if checkpoint_interval is not None:
        store.update_table(store.get_table(name).id, checkpoint_interval=checkpoint_interval)
    actions: list[Any] = [*create_table_actions(ID_SCHEMA)]
    if first_rows is not None:
        actions.append(("add", write_data_file(root, pa.table({"id": list(first_rows)}, schema=ID_SCHEMA))))
    store.commit(name, actions)


__all__ = [
    "EMPTY_SCHEMA_STRING",
    "ID_SCHEMA",
    "METADATA",
    "PROTOCOL",
    "SCHEMA_STRING",
    "TABLE_ID",
    "action",
    "add",
    "add_body",
    "append_rows",
    "create_data_table",
    "lines",
    "metadata_body",
    "protocol_body",
    "remove",
    "remove_body",
    "write_commit",
]
