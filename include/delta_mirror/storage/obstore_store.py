"""The ``ObjectStore`` port on obstore (the Rust ``object_store`` crate): local folders,
S3-compatible, Azure Blob, GCS.

Every store is rooted at a table root. Writes are confined to ``_delta_log/``: the mirror never
touches data files (design invariant 6), and this module is where that is enforced.

Put-if-absent is each store's own precondition, through object_store's ``PutMode::Create``:
S3 ``If-None-Match: *``, Azure Put Blob ``If-None-Match: *`` (409 BlobAlreadyExists), GCS
``x-goog-if-generation-match: 0`` (412); local folders create the file exclusively.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import obstore
from obstore import exceptions as obe
from obstore.store import AzureStore, GCSStore, LocalStore, S3Store, from_url

from delta_mirror.delta.log_path import LOG_DIR
from delta_mirror.delta.object_store import ObjectExistsError, ObjectMeta
from delta_mirror.errors import PermanentError, TransientError
from delta_mirror.storage.locations import (
    AZURE_SCHEMES,
    GCS_SCHEMES,
    S3_SCHEMES,
    local_path,
    normalize_location,
)
from delta_mirror.storage.options import storage_options_for

TIMEOUT_ENV = "DELTA_MIRROR_STORAGE_TIMEOUT"
# object_store client options (not store configuration), with or without the azure_/google_ prefix.
_CLIENT_KEYS = ("allow_http", "timeout", "connect_timeout")


def _check_log_path(path: str) -> None:
    parts = path.split("/")
    if (
        parts[0] != LOG_DIR
        or len(parts) < 2
        or any(p in ("", ".", "..") or unquote(p) in (".", "..") for p in parts)
        or "\\" in path
        or "\x00" in path
    ):
        raise PermanentError(
            f"refusing to write '{path}': the mirror only writes below {LOG_DIR}/",
            hint="this is a bug or a hostile input; report it",
        )


# An HTTP 403 in an error text ("status 403 Forbidden"), not any "403" (e.g. "in 403.02ms").
_HTTP_403 = re.compile(r"\b403 Forbidden\b|\bstatus(?: code)?:? 403\b", re.IGNORECASE)


def _translate(exc: Exception, uri: str, path: str) -> Exception:
    """Map object-store failures to the error classes (storage errors by status/code)."""
    if isinstance(exc, obe.AlreadyExistsError | obe.PreconditionError):
        return ObjectExistsError(path)
    if isinstance(exc, obe.PermissionDeniedError | obe.UnauthenticatedError):
        return PermanentError(
            f"access denied writing {uri}/{path}: {exc}",
            hint="check the credentials (AWS_* / AZURE_STORAGE_* / GOOGLE_* variables or the Airflow "
            "connection) and the bucket's or container's access policy",
        )
    if isinstance(exc, obe.NotFoundError):
        return PermanentError(
            f"not found: {uri}/{path}",
            hint="check that the bucket, container or folder exists and the location is right",
        )
    if isinstance(exc, obe.UnknownConfigurationKeyError | obe.NotSupportedError | obe.InvalidPathError):
        return PermanentError(
            f"storage configuration for {uri} is invalid: {exc}", hint="fix the location or options"
        )
    text = str(exc)
    if isinstance(exc, OSError) or uri.startswith("file://"):
        # Local folders: read-only or full disks need an operator, not retries.
        return PermanentError(
            f"cannot write {uri}/{path}: {exc}", hint="check that the folder is writable and has space"
        )
    if "NoSuchBucket" in text or "ContainerNotFound" in text or "bucket does not exist" in text.lower():
        return PermanentError(
            f"bucket missing for {uri}: {text[:300]}", hint="create the bucket or fix the location"
        )
    if (
        _HTTP_403.search(text)
        or "AccessDenied" in text
        or "InvalidAccessKeyId" in text
        or "SignatureDoesNotMatch" in text
        or "AuthenticationFailed" in text
    ):
        return PermanentError(
            f"access denied for {uri}/{path}", hint="check the credentials and the bucket policy"
        )
    return TransientError(
        f"storage request failed for {uri}/{path}: {text[:300]}",
        hint="retried automatically; if it persists check the storage endpoint's health",
    )


class ObstoreStore:
    """``ObjectStore`` on the Rust ``object_store`` crate (through obstore)."""

    def __init__(self, uri: str, store: Any) -> None:
        self.uri = uri.rstrip("/")
        self._store = store
        self._local_root = local_path(self.uri)

    def _check_write(self, path: str) -> None:
        """``path`` is below ``_delta_log/``, and on a local disk no symlinked folder leads elsewhere."""
        _check_log_path(path)
        if self._local_root is None:
            return
        root = self._local_root.resolve()
        folder = (self._local_root / path).parent  # the nearest folder that exists (or is a link)
        while folder != self._local_root and not os.path.lexists(folder):
            folder = folder.parent
        if folder != self._local_root and not folder.resolve().is_relative_to(root / LOG_DIR):
            raise PermanentError(
                f"refusing to write '{path}' in {self.uri}: {folder} resolves to {folder.resolve()}, "
                f"outside the table's {LOG_DIR}/ (a symlink)",
                hint=f"make {LOG_DIR}/ a real folder inside the table root (symlinks there are refused)",
            )

    def put_if_absent(self, path: str, data: bytes) -> None:
        self._check_write(path)
        try:
            obstore.put(self._store, path, data, mode="create", use_multipart=False)
        except Exception as exc:
            raise _translate(exc, self.uri, path) from exc

    def put(self, path: str, data: bytes) -> None:
        self._check_write(path)
        try:
            obstore.put(self._store, path, data, use_multipart=False)
        except Exception as exc:
            raise _translate(exc, self.uri, path) from exc

    def get(self, path: str) -> bytes | None:
        try:
            return bytes(obstore.get(self._store, path).bytes())
        except FileNotFoundError:
            return None
        except obe.NotFoundError:
            return None
        except Exception as exc:
            raise _translate(exc, self.uri, path) from exc

    def head(self, path: str) -> ObjectMeta | None:
        try:
            meta = obstore.head(self._store, path)
        except (FileNotFoundError, obe.NotFoundError):
            return None
        except Exception as exc:
            raise _translate(exc, self.uri, path) from exc
        return ObjectMeta(str(meta["path"]), int(meta["size"]), meta.get("last_modified"))

    def list(self, prefix: str) -> list[ObjectMeta]:
        out: list[ObjectMeta] = []
        try:
            for batch in obstore.list(self._store, prefix=prefix.rstrip("/") + "/"):
                for meta in batch:
                    out.append(ObjectMeta(str(meta["path"]), int(meta["size"]), meta.get("last_modified")))
        except (FileNotFoundError, obe.NotFoundError):
            return []
        except Exception as exc:
            raise _translate(exc, self.uri, prefix) from exc
        out.sort(key=lambda m: m.path)
        return out

    def delete(self, path: str) -> None:
        self._check_write(path)
        try:
            obstore.delete(self._store, path)
        except (FileNotFoundError, obe.NotFoundError):
            return
        except Exception as exc:
            raise _translate(exc, self.uri, path) from exc


def _split_client_options(opts: Mapping[str, str], prefix: str) -> tuple[dict[str, str], dict[str, Any]]:
    """(store configuration, client options): keys lower-cased as object_store parses them; a
    request timeout (30 s) as for S3, so a hung endpoint becomes a retry."""
    config: dict[str, str] = {}
    client: dict[str, Any] = {"timeout": os.environ.get(TIMEOUT_ENV) or "30s", "connect_timeout": "5s"}
    for key, value in opts.items():
        name = key.lower()
        short = name.removeprefix(prefix)
        if short in _CLIENT_KEYS:
            client[short] = str(value).lower() == "true" if short == "allow_http" else value
        else:
            config[name] = value
    return config, client


_RETRY = {"max_retries": 3, "retry_timeout": timedelta(seconds=60)}


def _open_s3(uri: str, options: Mapping[str, str] | None) -> ObstoreStore:
    parsed = urlparse(uri)
    opts = storage_options_for(uri, options)
    config = {k.lower().removeprefix("aws_"): v for k, v in opts.items()}
    allow_http = str(config.pop("allow_http", "false")).lower() == "true"
    if "endpoint_url" in config:
        config["endpoint"] = config.pop("endpoint_url")
    # A request timeout (30 s) is what turns a hung endpoint into a retry; tunable per
    # location (`timeout` option) or process (DELTA_MIRROR_STORAGE_TIMEOUT, e.g. "2s").
    timeout = config.pop("timeout", None) or os.environ.get(TIMEOUT_ENV) or "30s"
    store = S3Store(
        parsed.netloc,
        prefix=parsed.path.strip("/") or None,
        config={**config, "conditional_put": "etag"},  # type: ignore[arg-type]
        client_options={"allow_http": allow_http, "timeout": timeout, "connect_timeout": "5s"},
        retry_config=_RETRY,  # type: ignore[arg-type]
    )
    return ObstoreStore(uri, store)


def _open_azure(uri: str, options: Mapping[str, str] | None) -> ObstoreStore:
    """``az://container/path``, ``abfss://container@account.dfs.core.windows.net/path``."""
    config, client = _split_client_options(storage_options_for(uri, options), "azure_")
    store = AzureStore.from_url(uri, config=config, client_options=client, retry_config=_RETRY)  # type: ignore[arg-type]
    return ObstoreStore(uri, store)


def _open_gcs(uri: str, options: Mapping[str, str] | None) -> ObstoreStore:
    """``gs://bucket/path``."""
    config, client = _split_client_options(storage_options_for(uri, options), "google_")
    store = GCSStore.from_url(uri, config=config, client_options=client, retry_config=_RETRY)  # type: ignore[arg-type]
    return ObstoreStore(uri, store)


def open_store(location: str, options: Mapping[str, str] | None = None) -> ObstoreStore:
    """Open the table root ``location`` (local path, ``file://``, ``s3://``, ``az://``/``abfss://``,
    ``gs://``); credentials from ``options``, else the environment (``storage_options_for``)."""
    uri = normalize_location(location)
    parsed = urlparse(uri)
    try:
        if parsed.scheme == "file":
            folder = Path(unquote(parsed.path))
            folder.mkdir(parents=True, exist_ok=True)
            return ObstoreStore(uri, LocalStore(prefix=folder))
        if parsed.scheme in S3_SCHEMES:
            return _open_s3(uri, options)
        if parsed.scheme in AZURE_SCHEMES:
            return _open_azure(uri, options)
        if parsed.scheme in GCS_SCHEMES:
            return _open_gcs(uri, options)
        return ObstoreStore(uri, from_url(uri, **dict(options or {})))  # type: ignore[call-overload]
    except PermanentError:
        raise
    except Exception as exc:
        raise PermanentError(
            f"cannot open storage at {uri}: {exc}", hint="check the location and its options"
        ) from exc


__all__ = ["TIMEOUT_ENV", "ObstoreStore", "open_store"]
