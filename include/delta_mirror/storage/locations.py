"""Table locations as URIs: what a table root may be (a local folder or a bucket path of S3,
Azure Blob or GCS) and its one spelling (``normalize_location``), as the store keeps it."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import unquote, urlparse

from delta_mirror.errors import PermanentError

S3_SCHEMES = ("s3", "s3a")
AZURE_SCHEMES = ("az", "abfs", "abfss")
GCS_SCHEMES = ("gs",)


def normalize_location(location: str) -> str:
    """A table root as a URI: local paths become absolute ``file://`` URIs."""
    parsed = urlparse(location)
    if parsed.scheme in ("", "file"):
        path = unquote(parsed.path) if parsed.scheme == "file" else location
        return Path(path).expanduser().resolve().as_uri()
    if parsed.scheme in (*S3_SCHEMES, *AZURE_SCHEMES, *GCS_SCHEMES):
        if not parsed.netloc:
            raise PermanentError(f"location '{location}' has no bucket", hint="use s3://bucket/prefix")
        segments = [unquote(p) for p in parsed.path.split("/")]
        if any(p in (".", "..") for p in segments) or "\\" in parsed.path or parsed.query or parsed.fragment:
            raise PermanentError(
                f"location '{location}' is not a plain table root ('.', '..', '\\', '?' or '#' in it)",
                hint="use s3://bucket/path/to/table",
            )
        return location.rstrip("/")
    raise PermanentError(
        f"unsupported location scheme '{parsed.scheme}' in '{location}'",
        hint="use a local path, file://, s3://, az://, abfss:// or gs://",
    )


def normalize_commit_root(root: str) -> str:
    """A table root as a writer's file system names it (Hadoop: ``file:/x``, ``s3a://b/x``), as the store
    keeps it: ``s3a://`` and ``s3n://`` are ``s3://``, then ``normalize_location``."""
    for alias in ("s3a://", "s3n://"):
        if root[: len(alias)].lower() == alias:
            root = "s3://" + root[len(alias) :]
    return normalize_location(root)


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
