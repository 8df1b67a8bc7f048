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


def test_a_wasb_connection_with_account_and_key() -> None:
    options, masked = _options(
        Conn("wasb", login="acct", password="k3y==", host="https://acct.blob.core.windows.net")
    )
    assert options == {"AZURE_STORAGE_ACCOUNT_NAME": "acct", "AZURE_STORAGE_ACCOUNT_KEY": "k3y=="}
    assert "k3y==" in masked


def test_a_wasb_service_principal_and_the_prefixed_extras() -> None:
    options, masked = _options(
        Conn(
            "wasb",
            login="client-id",
            password="client-secret",
            extra_dejson={"extra__wasb__tenant_id": "tenant", "account_name": "acct"},
        )
    )
    assert options == {
        "AZURE_STORAGE_TENANT_ID": "tenant",
        "AZURE_STORAGE_CLIENT_ID": "client-id",
        "AZURE_STORAGE_CLIENT_SECRET": "client-secret",
        "AZURE_STORAGE_ACCOUNT_NAME": "acct",
    }
    assert "client-secret" in masked


def test_an_azure_connection_string_and_a_sas_token() -> None:
    text = "DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey=a2V5;BlobEndpoint=http://127.0.0.1:10000/devstoreaccount1;"
    options, masked = _options(Conn("wasb", extra_dejson={"connection_string": text}))
    assert options == {
        "AZURE_STORAGE_ACCOUNT_NAME": "devstoreaccount1",
        "AZURE_STORAGE_ACCOUNT_KEY": "a2V5",
        "AZURE_STORAGE_ENDPOINT": "http://127.0.0.1:10000/devstoreaccount1",
        "AZURE_ALLOW_HTTP": "true",
    }
    assert "a2V5" in masked
    options, masked = _options(Conn("adls", extra_dejson={"account_name": "acct", "sas_token": "sv=1&sig=s"}))
    assert options == {"AZURE_STORAGE_ACCOUNT_NAME": "acct", "AZURE_STORAGE_SAS_TOKEN": "sv=1&sig=s"}
    assert "sv=1&sig=s" in masked
    options, _ = _options(Conn("wasb", extra_dejson={"use_emulator": True}))
    assert options == {"AZURE_STORAGE_USE_EMULATOR": "true"}


def test_a_google_connection_key_path_keyfile_dict_or_none() -> None:
    assert _options(Conn("google_cloud_platform", extra_dejson={"key_path": "/s/key.json"}))[0] == {
        "GOOGLE_SERVICE_ACCOUNT": "/s/key.json"
    }
    keyfile = {"type": "service_account", "private_key": "-----BEGIN PRIVATE KEY-----x"}
    options, masked = _options(
        Conn(
            "google_cloud_platform",
            extra_dejson={"extra__google_cloud_platform__keyfile_dict": json.dumps(keyfile)},
        )
    )
    assert json.loads(options["GOOGLE_SERVICE_ACCOUNT_KEY"]) == keyfile
    assert keyfile["private_key"] in masked
    # no key: application default credentials (GOOGLE_APPLICATION_CREDENTIALS / metadata server)
    assert _options(Conn("google_cloud_platform"))[0] == {}


def test_an_aws_or_untyped_connection_keeps_the_aws_reading() -> None:
    for conn_type in ("aws", None):
        options, masked = _options(
            Conn(conn_type, login="AKIA", password="s3cr3t", extra_dejson={"region_name": "eu-west-1"})
        )
        assert options == {
            "AWS_ACCESS_KEY_ID": "AKIA",
            "AWS_SECRET_ACCESS_KEY": "s3cr3t",
            "AWS_REGION": "eu-west-1",
        }
        assert "s3cr3t" in masked


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
