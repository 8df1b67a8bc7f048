"""A location's storage options (credentials, endpoints) from the environment, as object_store and
deltalake name them (docs/storage.md); options given with the location override them."""

from __future__ import annotations

import os
from collections.abc import Mapping
from urllib.parse import urlparse

from delta_mirror.storage.locations import AZURE_SCHEMES, GCS_SCHEMES, S3_SCHEMES

# Credentials and endpoints read from the environment, as object_store / deltalake name them
# (docs/storage.md). AZURITE_BLOB_STORAGE_URL is read by object_store itself with
# AZURE_STORAGE_USE_EMULATOR=true.
AZURE_ENV = (
    "AZURE_STORAGE_ACCOUNT_NAME",
    "AZURE_STORAGE_ACCOUNT_KEY",
    "AZURE_STORAGE_SAS_TOKEN",
    "AZURE_STORAGE_TOKEN",
    "AZURE_STORAGE_CLIENT_ID",
    "AZURE_STORAGE_CLIENT_SECRET",
    "AZURE_STORAGE_TENANT_ID",
    "AZURE_CLIENT_ID",
    "AZURE_CLIENT_SECRET",
    "AZURE_TENANT_ID",
    "AZURE_FEDERATED_TOKEN_FILE",
    "AZURE_STORAGE_USE_EMULATOR",
    "AZURE_STORAGE_ENDPOINT",
    "AZURE_ALLOW_HTTP",
)
GCS_ENV = (
    "GOOGLE_SERVICE_ACCOUNT",
    "GOOGLE_SERVICE_ACCOUNT_PATH",
    "GOOGLE_SERVICE_ACCOUNT_KEY",
    "GOOGLE_APPLICATION_CREDENTIALS",
    "GOOGLE_BASE_URL",
    "GOOGLE_ALLOW_HTTP",
)


def s3_options_from_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The usual AWS variables, as object_store / deltalake configuration keys."""
    env = os.environ if env is None else env
    keys = (
        "AWS_ENDPOINT_URL",
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "AWS_REGION",
        "AWS_DEFAULT_REGION",
        "AWS_ALLOW_HTTP",
    )
    opts = {k: env[k] for k in keys if env.get(k)}
    if "AWS_REGION" not in opts and "AWS_DEFAULT_REGION" in opts:
        opts["AWS_REGION"] = opts["AWS_DEFAULT_REGION"]
    opts.pop("AWS_DEFAULT_REGION", None)
    if opts.get("AWS_ENDPOINT_URL", "").startswith("http://"):
        opts.setdefault("AWS_ALLOW_HTTP", "true")
    return opts


def _options_from_env(keys: tuple[str, ...], env: Mapping[str, str] | None) -> dict[str, str]:
    env = os.environ if env is None else env
    return {k: env[k] for k in keys if env.get(k)}


def azure_options_from_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The ``AZURE_*`` variables of an Azure Blob location (account, key or SAS or service principal,
    emulator, endpoint); an ``http://`` endpoint (Azurite) allows plain HTTP."""
    opts = _options_from_env(AZURE_ENV, env)
    if opts.get("AZURE_STORAGE_ENDPOINT", "").startswith("http://"):
        opts.setdefault("AZURE_ALLOW_HTTP", "true")
    return opts


def gcs_options_from_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The ``GOOGLE_*`` variables of a GCS location (service account file or key, application
    default credentials, base URL); an ``http://`` base URL (an emulator) allows plain HTTP."""
    opts = _options_from_env(GCS_ENV, env)
    if opts.get("GOOGLE_BASE_URL", "").startswith("http://"):
        opts.setdefault("GOOGLE_ALLOW_HTTP", "true")
    return opts


def storage_options_for(location: str, options: Mapping[str, str] | None = None) -> dict[str, str]:
    """Options as deltalake's ``storage_options`` expects them (environment, then overrides)."""
    opts: dict[str, str] = {}
    scheme = urlparse(location).scheme
    if scheme in S3_SCHEMES:
        opts.update(s3_options_from_env())
        opts.setdefault("AWS_REGION", "us-east-1")
    elif scheme in AZURE_SCHEMES:
        opts.update(azure_options_from_env())
    elif scheme in GCS_SCHEMES:
        opts.update(gcs_options_from_env())
    opts.update(options or {})
    return opts


__all__ = [
    "AZURE_ENV",
    "GCS_ENV",
    "azure_options_from_env",
    "gcs_options_from_env",
    "s3_options_from_env",
    "storage_options_for",
]
