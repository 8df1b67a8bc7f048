"""Airflow storage connections become storage options, read as each provider reads its own type.

The module reads any object shaped like Airflow's ``Connection`` (it imports no Airflow), so these
use a small stand-in; the hook's use of it is covered by test_hooks.py (an ``aws`` connection
through ``AIRFLOW_CONN_*``) and the emulator tests (tests/test_cloud_storage.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import pytest

from delta_mirror.airflow.storage_connections import storage_options_from_connection
from delta_mirror.storage import azure_options_from_env, gcs_options_from_env, storage_options_for


@dataclass
class Conn:
    conn_type: str | None
    login: str | None = None
    password: str | None = None
    host: str | None = None
    extra_dejson: dict[str, Any] = field(default_factory=dict)


def _options(conn: Conn) -> tuple[dict[str, str], list[str | None]]:
    masked: list[str | None] = []
    return storage_options_from_connection(conn, masked.append), masked


KEYFILE = {"type": "service_account", "private_key": "-----BEGIN PRIVATE KEY-----x"}
CONNECTION_STRING = (
    "DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey=a2V5;"
    "BlobEndpoint=http://127.0.0.1:10000/devstoreaccount1;"
)
AWS_KEYS = {"AWS_ACCESS_KEY_ID": "AKIA", "AWS_SECRET_ACCESS_KEY": "s3cr3t", "AWS_REGION": "eu-west-1"}


@pytest.mark.parametrize(
    ("conn", "options", "secret"),
    [
        pytest.param(
            Conn("wasb", login="acct", password="k3y==", host="https://acct.blob.core.windows.net"),
            {"AZURE_STORAGE_ACCOUNT_NAME": "acct", "AZURE_STORAGE_ACCOUNT_KEY": "k3y=="},
            "k3y==",
            id="wasb-account-and-key",
        ),
        pytest.param(
            Conn(
                "wasb",
                login="client-id",
                password="client-secret",
                extra_dejson={"extra__wasb__tenant_id": "tenant", "account_name": "acct"},
            ),
            {
                "AZURE_STORAGE_TENANT_ID": "tenant",
                "AZURE_STORAGE_CLIENT_ID": "client-id",
                "AZURE_STORAGE_CLIENT_SECRET": "client-secret",
                "AZURE_STORAGE_ACCOUNT_NAME": "acct",
            },
            "client-secret",
            id="wasb-service-principal-and-prefixed-extras",
        ),
        pytest.param(
            Conn("wasb", extra_dejson={"connection_string": CONNECTION_STRING}),
            {
                "AZURE_STORAGE_ACCOUNT_NAME": "devstoreaccount1",
                "AZURE_STORAGE_ACCOUNT_KEY": "a2V5",
                "AZURE_STORAGE_ENDPOINT": "http://127.0.0.1:10000/devstoreaccount1",
                "AZURE_ALLOW_HTTP": "true",
            },
            "a2V5",
            id="wasb-connection-string",
        ),
        pytest.param(
            Conn("adls", extra_dejson={"account_name": "acct", "sas_token": "sv=1&sig=s"}),
            {"AZURE_STORAGE_ACCOUNT_NAME": "acct", "AZURE_STORAGE_SAS_TOKEN": "sv=1&sig=s"},
            "sv=1&sig=s",
            id="adls-sas-token",
        ),
        pytest.param(
            Conn("wasb", extra_dejson={"use_emulator": True}),
            {"AZURE_STORAGE_USE_EMULATOR": "true"},
            None,
            id="wasb-emulator",
        ),
        pytest.param(
            Conn("google_cloud_platform", extra_dejson={"key_path": "/s/key.json"}),
            {"GOOGLE_SERVICE_ACCOUNT": "/s/key.json"},
            None,
            id="google-key-path",
        ),
        pytest.param(
            Conn(
                "google_cloud_platform",
                extra_dejson={"extra__google_cloud_platform__keyfile_dict": json.dumps(KEYFILE)},
            ),
            {"GOOGLE_SERVICE_ACCOUNT_KEY": KEYFILE},  # compared as JSON
            KEYFILE["private_key"],
            id="google-prefixed-keyfile-dict",
        ),
        # no key: application default credentials (GOOGLE_APPLICATION_CREDENTIALS / metadata server)
        pytest.param(Conn("google_cloud_platform"), {}, None, id="google-without-a-key"),
        pytest.param(
            Conn("aws", login="AKIA", password="s3cr3t", extra_dejson={"region_name": "eu-west-1"}),
            AWS_KEYS,
            "s3cr3t",
            id="aws",
        ),
        pytest.param(
            Conn(None, login="AKIA", password="s3cr3t", extra_dejson={"region_name": "eu-west-1"}),
            AWS_KEYS,
            "s3cr3t",
            id="untyped-read-as-aws",
        ),
    ],
)
def test_a_connection_becomes_the_storage_options_its_provider_reads_and_its_secret_is_masked(
    conn: Conn, options: dict[str, Any], secret: str | None
) -> None:
    found, masked = _options(conn)
    if "GOOGLE_SERVICE_ACCOUNT_KEY" in options:
        found = {**found, "GOOGLE_SERVICE_ACCOUNT_KEY": json.loads(found["GOOGLE_SERVICE_ACCOUNT_KEY"])}
    assert found == options
    assert secret is None or secret in masked


def test_azure_and_gcs_options_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    env = {
        "AZURE_STORAGE_ACCOUNT_NAME": "acct",
        "AZURE_STORAGE_ACCOUNT_KEY": "k",
        "AZURE_STORAGE_ENDPOINT": "http://127.0.0.1:10000/acct",
        "GOOGLE_APPLICATION_CREDENTIALS": "/adc.json",
        "AWS_ACCESS_KEY_ID": "not-for-azure",
    }
    assert azure_options_from_env(env) == {
        "AZURE_STORAGE_ACCOUNT_NAME": "acct",
        "AZURE_STORAGE_ACCOUNT_KEY": "k",
        "AZURE_STORAGE_ENDPOINT": "http://127.0.0.1:10000/acct",
        "AZURE_ALLOW_HTTP": "true",
    }
    assert gcs_options_from_env(env) == {"GOOGLE_APPLICATION_CREDENTIALS": "/adc.json"}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert "AWS_ACCESS_KEY_ID" not in storage_options_for("abfss://c@acct.dfs.core.windows.net/t")
    assert storage_options_for("gs://b/t", {"GOOGLE_ALLOW_HTTP": "true"}) == {
        "GOOGLE_APPLICATION_CREDENTIALS": "/adc.json",
        "GOOGLE_ALLOW_HTTP": "true",
    }
