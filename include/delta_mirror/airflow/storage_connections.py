"""Airflow storage connections → object_store / deltalake options (``storage_options``).

One function per provider's connection type, read the way that provider reads it, so a
deployment's existing connection works unchanged:

- ``aws`` (Amazon provider): login/password or the ``aws_access_key_id`` / ``aws_secret_access_key``
  / ``aws_session_token`` extras, ``endpoint_url`` (or ``service_config.s3.endpoint_url``),
  ``region_name``.
- ``wasb`` / ``adls`` (Microsoft Azure provider): login = account name and password = account
  key; or ``tenant_id`` with login = client id and password = client secret (a service principal);
  or the ``sas_token``, ``connection_string``, ``account_name`` / ``shared_access_key`` extras.
  The host (or ``account_url``) is the account's blob endpoint; a non-Azure one (Azurite's
  ``http://127.0.0.1:10000/devstoreaccount1``) becomes ``AZURE_STORAGE_ENDPOINT``. The extra
  ``use_emulator: true`` selects Azurite's well-known account (``AZURITE_BLOB_STORAGE_URL``).
- ``google_cloud_platform`` (Google provider): ``key_path`` (a service-account file) or
  ``keyfile_dict`` (its JSON); none of them means application default credentials
  (``GOOGLE_APPLICATION_CREDENTIALS`` or the metadata server). A ``base_url`` extra points at an
  emulator or a private endpoint.

Extras are accepted with or without the provider's ``extra__<type>__`` prefix. Every secret is
handed to ``mask`` (Airflow's secrets masker) before it is returned. This module imports nothing
from Airflow: it reads any object with ``conn_type``, ``login``, ``password``, ``host`` and
``extra_dejson``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any, Protocol
from urllib.parse import urlparse

AZURE_TYPES = ("wasb", "adls", "azure_data_lake", "azure")
GOOGLE_TYPES = ("google_cloud_platform", "gcp")


class ConnectionLike(Protocol):
    """What is read of an Airflow ``Connection``."""

    @property
    def conn_type(self) -> str | None: ...
    @property
    def login(self) -> str | None: ...
    @property
    def password(self) -> str | None: ...
    @property
    def host(self) -> str | None: ...
    @property
    def extra_dejson(self) -> dict[str, Any]: ...


Mask = Callable[[str | None], None]


def _no_mask(_value: str | None) -> None:
    return None


def _extra(conn: ConnectionLike, name: str) -> Any:
    """``name`` from the extras, plain or with the provider's ``extra__<conn_type>__`` prefix."""
    extra = conn.extra_dejson
    if extra.get(name) not in (None, ""):
        return extra[name]
    return extra.get(f"extra__{conn.conn_type}__{name}") or None


def storage_options_from_connection(conn: ConnectionLike, mask: Mask = _no_mask) -> dict[str, str]:
    """The options of ``conn`` by its type (``aws`` and unknown types: the AWS reading)."""
    conn_type = (conn.conn_type or "").lower()
    if conn_type in AZURE_TYPES:
        return azure_options(conn, mask)
    if conn_type in GOOGLE_TYPES:
        return google_options(conn, mask)
    return aws_options(conn, mask)


def aws_options(conn: ConnectionLike, mask: Mask = _no_mask) -> dict[str, str]:
    """Like the Amazon provider: login/password, else the aws_access_key_id/... extras."""
    extra: dict[str, Any] = conn.extra_dejson
    opts: dict[str, str] = {}
    key_id = conn.login or extra.get("aws_access_key_id")
    secret = conn.password or extra.get("aws_secret_access_key")
    if key_id:
        opts["AWS_ACCESS_KEY_ID"] = str(key_id)
    if secret:
        mask(str(secret))
        opts["AWS_SECRET_ACCESS_KEY"] = str(secret)
    token = extra.get("aws_session_token")
    if token:
        mask(str(token))
        opts["AWS_SESSION_TOKEN"] = str(token)
    endpoint = extra.get("endpoint_url") or (extra.get("service_config") or {}).get("s3", {}).get(
        "endpoint_url"
    )
    if endpoint:
        opts["AWS_ENDPOINT_URL"] = str(endpoint)
        if str(endpoint).startswith("http://"):
            opts["AWS_ALLOW_HTTP"] = "true"
    region = extra.get("region_name")
    if region:
        opts["AWS_REGION"] = str(region)
    return opts


def _parse_connection_string(text: str) -> dict[str, str]:
    """``AccountName=...;AccountKey=...;BlobEndpoint=...`` (Azure's connection string) as a dict."""
    parts = (p.split("=", 1) for p in text.split(";") if "=" in p)
    return {k.strip(): v.strip() for k, v in parts}


def _azure_endpoint(opts: dict[str, str], endpoint: str | None) -> None:
    """An account URL: ``https://<account>.blob.core.windows.net`` names the account; any other
    (Azurite, a private endpoint) is the endpoint itself."""
    if not endpoint:
        return
    url = endpoint if "://" in endpoint else f"https://{endpoint}"
    host = urlparse(url).hostname or ""
    for suffix in (".blob.core.windows.net", ".dfs.core.windows.net"):
        if host.endswith(suffix):
            opts.setdefault("AZURE_STORAGE_ACCOUNT_NAME", host.removesuffix(suffix))
            return
    opts["AZURE_STORAGE_ENDPOINT"] = url.rstrip("/")
    if url.startswith("http://"):
        opts["AZURE_ALLOW_HTTP"] = "true"


def azure_options(conn: ConnectionLike, mask: Mask = _no_mask) -> dict[str, str]:
    """A ``wasb`` / ``adls`` connection as ``AZURE_*`` options."""
    opts: dict[str, str] = {}
    cs = _parse_connection_string(str(_extra(conn, "connection_string") or ""))
    mask(cs.get("AccountKey"))
    mask(cs.get("SharedAccessSignature"))
    tenant = _extra(conn, "tenant_id")
    if tenant:  # a service principal: login/password are the client id and secret
        opts["AZURE_STORAGE_TENANT_ID"] = str(tenant)
        if conn.login:
            opts["AZURE_STORAGE_CLIENT_ID"] = conn.login
        if conn.password:
            mask(conn.password)
            opts["AZURE_STORAGE_CLIENT_SECRET"] = conn.password
    account = _extra(conn, "account_name") or cs.get("AccountName") or (None if tenant else conn.login)
    key = _extra(conn, "shared_access_key") or cs.get("AccountKey") or (None if tenant else conn.password)
    sas = _extra(conn, "sas_token") or cs.get("SharedAccessSignature")
    if account:
        opts["AZURE_STORAGE_ACCOUNT_NAME"] = str(account)
    if key:
        mask(str(key))
        opts["AZURE_STORAGE_ACCOUNT_KEY"] = str(key)
    if sas:
        mask(str(sas))
        opts["AZURE_STORAGE_SAS_TOKEN"] = str(sas)
    _azure_endpoint(opts, _extra(conn, "account_url") or cs.get("BlobEndpoint") or conn.host or None)
    if str(_extra(conn, "use_emulator") or "").lower() == "true" or cs.get("UseDevelopmentStorage") == "true":
        opts["AZURE_STORAGE_USE_EMULATOR"] = "true"
    return opts


def google_options(conn: ConnectionLike, mask: Mask = _no_mask) -> dict[str, str]:
    """A ``google_cloud_platform`` connection as ``GOOGLE_*`` options."""
    opts: dict[str, str] = {}
    key_path = _extra(conn, "key_path")
    keyfile = _extra(conn, "keyfile_dict")
    if key_path:
        opts["GOOGLE_SERVICE_ACCOUNT"] = str(key_path)
    if keyfile:
        text = keyfile if isinstance(keyfile, str) else json.dumps(keyfile)
        mask(text)
        if isinstance(keyfile, Mapping) or text.lstrip().startswith("{"):
            private = (json.loads(text) if isinstance(keyfile, str) else keyfile).get("private_key")
            mask(private)
        opts["GOOGLE_SERVICE_ACCOUNT_KEY"] = text
    base_url = _extra(conn, "base_url")
    if base_url:
        opts["GOOGLE_BASE_URL"] = str(base_url).rstrip("/")
        if str(base_url).startswith("http://"):
            opts["GOOGLE_ALLOW_HTTP"] = "true"
    return opts


__all__ = [
    "AZURE_TYPES",
    "GOOGLE_TYPES",
    "ConnectionLike",
    "aws_options",
    "azure_options",
    "google_options",
    "storage_options_from_connection",
]
