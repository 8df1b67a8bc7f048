"""The port the Delta model reads and writes a table root through (``ObjectStore``).

It lives beside the model that uses it: ``delta/`` names what it needs from object storage, and
``storage/`` (local folders, S3, Azure, GCS via obstore) implements it, so the dependency points
from the adapter to the model, never back (``tests/test_architecture.py`` keeps it so).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Protocol


class ObjectExistsError(Exception):
    """``put_if_absent`` found an object already at that path (nothing was written)."""


@dataclass(frozen=True)
class ObjectMeta:
    path: str
    size: int
    last_modified: datetime | None = None


class ObjectStore(Protocol):
    """A table root on some object storage. Paths are relative to the root, ``/``-separated."""

    uri: str

    def put_if_absent(self, path: str, data: bytes) -> None:
        """Create ``path`` atomically; raise ``ObjectExistsError`` (and write nothing) if it exists."""

    def put(self, path: str, data: bytes) -> None:
        """Create or atomically replace ``path`` (only for ``_last_checkpoint``)."""

    def get(self, path: str) -> bytes | None:
        """The object's bytes, or ``None`` when it does not exist."""

    def head(self, path: str) -> ObjectMeta | None:
        """Size and modification time, or ``None`` when it does not exist."""

    def list(self, prefix: str) -> list[ObjectMeta]:
        """Every object below ``prefix`` (recursively), sorted by path."""

    def delete(self, path: str) -> None:
        """Delete ``path`` (retention cleanup only); deleting a missing object is not an error."""


__all__ = ["ObjectExistsError", "ObjectMeta", "ObjectStore"]
