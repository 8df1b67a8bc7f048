"""Table locations as URIs: what a table root may be (a local folder or a bucket path of S3,
Azure Blob or GCS) and its one spelling (``normalize_location``, which is
``delta.locations.normalize_table_root``: one function for every location stored or compared)."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import unquote, urlparse

from delta_mirror.delta.locations import normalize_table_root

S3_SCHEMES = ("s3", "s3a")
AZURE_SCHEMES = ("az", "abfs", "abfss")
GCS_SCHEMES = ("gs",)


#: A table root in its one spelling, as the store keeps and compares it: the one normaliser,
#: ``delta.locations.normalize_table_root`` (scheme aliases, ``//``, trailing ``/``,
#: percent-encoding; refuses NUL, control characters, over-long segments, ``..``, trailing dots).
normalize_location = normalize_table_root
#: The same function, by the name the commit service's callers knew (a writer's ``s3a://``/``file:/``).
normalize_commit_root = normalize_table_root


def local_path(location: str) -> Path | None:
    """The folder of a ``file://`` location, else ``None``."""
    parsed = urlparse(location)
    if parsed.scheme == "file":
        return Path(unquote(parsed.path))
    return None


__all__ = [
    "AZURE_SCHEMES",
    "GCS_SCHEMES",
    "S3_SCHEMES",
    "local_path",
    "normalize_commit_root",
    "normalize_location",
]
