"""A ``_delta_log/`` laid out file by file on the local disk, listed the way every reader lists it.

For the unit tests of the listing and ``_last_checkpoint`` rules: the files are real (a local
object store, as for a ``file://`` table), only their contents are as small as the rule needs.
"""

from __future__ import annotations

import io
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from delta_mirror.delta.log_listing import LogListing, SidecarRefs, list_log, sidecar_refs
from delta_mirror.delta.log_path import LOG_DIR
from delta_mirror.storage import open_store

#: A UUID for V2 checkpoint names.
UUID = "80a083e8-7026-4e79-81be-64bd76c43a11"


def v(version: int, rest: str = "json") -> str:
    """``<version, 20 digits>.<rest>``: ``v(3)`` is commit 3, ``v(3, "checkpoint.parquet")`` its checkpoint."""
    return f"{version:020d}.{rest}"


def multipart(version: int, part: int, parts: int) -> str:
    return v(version, f"checkpoint.{part:010d}.{parts:010d}.parquet")


def uuid_checkpoint(version: int, ext: str = "json") -> str:
    return v(version, f"checkpoint.{UUID}.{ext}")


def sidecar_lines(*paths: str) -> bytes:
    """A JSON V2 checkpoint's body naming these sidecars (beside the actions a checkpoint holds)."""
    lines = ['{"checkpointMetadata":{"version":1}}']
    lines += [f'{{"sidecar":{{"path":"{p}","sizeInBytes":1,"modificationTime":0}}}}' for p in paths]
    return ("\n".join(lines) + "\n").encode()


def parquet_rows(column: str, rows: list[dict[str, Any] | None]) -> bytes:
    """A Parquet checkpoint with one struct column ``column`` (``None``: a row of another action)."""
    out = io.BytesIO()
    pq.write_table(pa.table({column: rows}), out)
    return out.getvalue()


def lay_out(root: Path, files: Mapping[str, bytes] | list[str]) -> tuple[LogListing, SidecarRefs]:
    """Write ``files`` (names under ``_delta_log/``; a list: empty files) and list the log once."""
    items = files.items() if isinstance(files, Mapping) else ((name, b"") for name in files)
    for name, data in items:
        path = root / LOG_DIR / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    objects = open_store(root.as_uri())
    return list_log(objects), sidecar_refs(objects)


__all__ = ["UUID", "lay_out", "multipart", "parquet_rows", "sidecar_lines", "uuid_checkpoint", "v"]
