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
    from delta_mirror.delta.actions import Action
    from delta_mirror.store import SqlStore

#: One nullable ``id: long`` column.
SCHEMA_STRING = json.dumps(
    {"type": "struct", "fields": [{"name": "id", "type": "long", "nullable": True, "metadata": {}}]}
)
EMPTY_SCHEMA_STRING = '{"type":"struct","fields":[]}'
#: The same column as an Arrow schema, for tables with real data files.
ID_SCHEMA = pa.schema([("id", pa.int64())])
#: ``id: long, country: string``, partitioned by ``country``: the Spark tests' event tables.
EVENTS_SCHEMA = pa.schema([("id", pa.int64()), ("country", pa.string())])
TABLE_ID = "0e0c5a4e-1111-4222-8333-444455556666"


def protocol_body(
    reader: int = 1,
    writer: int = 2,
    reader_features: Sequence[str] | None = None,
    writer_features: Sequence[str] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """``readerFeatures`` / ``writerFeatures`` only when given (``None``: the key is absent)."""
    body: dict[str, Any] = {"minReaderVersion": reader, "minWriterVersion": writer}
    if reader_features is not None:
        body["readerFeatures"] = reader_features
    if writer_features is not None:
        body["writerFeatures"] = writer_features
    return {**body, **extra}


def metadata_body(
    *,
    id: str = TABLE_ID,
    name: str | None = None,
    schema_string: str = SCHEMA_STRING,
    partition_columns: Sequence[str] = (),
    configuration: dict[str, str] | None = None,
    created_time: int | None = 1,
    **extra: Any,
) -> dict[str, Any]:
    body: dict[str, Any] = {"id": id} if name is None else {"id": id, "name": name}
    body |= {
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


def cdc_body(path: str, **extra: Any) -> dict[str, Any]:
    return {"path": path, "partitionValues": {}, "size": 1, "dataChange": False, **extra}


def event_add(
    root: Path, ids: Sequence[int], country: str, amounts: Sequence[float | None] | None = None
) -> Action:
    """``add`` of a real Parquet file under ``root`` in partition ``country`` (``EVENTS_SCHEMA`` rows,
    plus an ``amount: double`` column when ``amounts`` is given)."""
    columns: dict[str, Any] = {"id": pa.array(ids, pa.int64()), "country": pa.array([country] * len(ids))}
    if amounts is not None:
        columns["amount"] = pa.array(amounts, pa.float64())
    return ("add", write_data_file(root, pa.table(columns), {"country": country}))


def remove_of(add: Action, deletion_timestamp: int = 1_700_000_100_000) -> Action:
    """The ``remove`` (tombstone) of an earlier ``add``: its path, partition values and size."""
    body = add[1]
    return (
        "remove",
        remove_body(
            body["path"],
            deletionTimestamp=deletion_timestamp,
            partitionValues=body["partitionValues"],
            size=body["size"],
        ),
    )


def action(kind: str, body: dict[str, Any]) -> dict[str, Any]:
    return {kind: body}


def add(path: str, **extra: Any) -> dict[str, Any]:
    return action("add", add_body(path, **extra))


def remove(path: str, **extra: Any) -> dict[str, Any]:
    return action("remove", remove_body(path, **extra))


#: A deletion vector descriptor (a UUID-relative one, as Delta-Spark writes) and its unique id.
DELETION_VECTOR = {
    "storageType": "u",
    "pathOrInlineDv": "ab^-aqEH.-t@S}K{vb[*k^",
    "offset": 4,
    "sizeInBytes": 40,
    "cardinality": 6,
}
DELETION_VECTOR_ID = "uab^-aqEH.-t@S}K{vb[*k^@4"

PROTOCOL = action("protocol", protocol_body())
METADATA = action("metaData", metadata_body())


def log_line(action: dict[str, Any]) -> str:
    """One action as a compact log line (no spaces), as Delta writers and our store write it."""
    return json.dumps(action, separators=(",", ":"))


def lines(*actions: dict[str, Any]) -> bytes:
    """Actions as commit input (``json.dumps`` defaults, one per line)."""
    return "".join(json.dumps(a) + "\n" for a in actions).encode()


def write_commit(root: Path, version: int, actions: Iterable[dict[str, Any]]) -> Path:
    """``<root>/_delta_log/<version>.json`` with compact lines, as a Delta writer would leave it."""
    log = root / "_delta_log"
    log.mkdir(parents=True, exist_ok=True)
    path = log / f"{version:020d}.json"
    path.write_text("".join(log_line(a) + "\n" for a in actions), encoding="utf-8")
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
    "EVENTS_SCHEMA",
    "ID_SCHEMA",
    "METADATA",
    "PROTOCOL",
    "SCHEMA_STRING",
    "TABLE_ID",
    "action",
    "add",
    "add_body",
    "append_rows",
    "cdc_body",
    "create_data_table",
    "event_add",
    "lines",
    "log_line",
    "metadata_body",
    "protocol_body",
    "remove",
    "remove_body",
    "remove_of",
    "write_commit",
]
