"""Hooks: Airflow connections → core objects (the SQL store, object-store options).

Secrets stay inside connection objects and the options passed to the storage client; they are
registered with Airflow's secrets masker and never logged.
"""

from __future__ import annotations

import os
from functools import cached_property
from typing import Any

from airflow.sdk import BaseHook

from delta_mirror.store import SqlStore


def _mask(value: str | None) -> None:
    if value:
        try:
            from airflow.sdk.log import mask_secret

            mask_secret(value)
        except Exception:  # noqa: BLE001 - masking is best effort outside a task
            pass


class DeltaMirrorHook(BaseHook):
    """The store (``store_conn_id``: a Postgres connection) and storage options (``aws_conn_id``).

    Without ``store_conn_id`` the store comes from ``DELTA_MIRROR_STORE`` or the embedded SQLite
    default; without ``aws_conn_id`` S3 credentials come from the usual AWS environment variables.
    """

    conn_name_attr = "store_conn_id"
    hook_name = "Delta Mirror"

    def __init__(self, store_conn_id: str | None = None, aws_conn_id: str | None = None) -> None:
        super().__init__()
        self.store_conn_id = store_conn_id
        self.aws_conn_id = aws_conn_id

    @cached_property
    def store_url(self) -> str | None:
        if not self.store_conn_id:
            return os.environ.get("DELTA_MIRROR_STORE")
        conn = self.get_connection(self.store_conn_id)
        _mask(conn.password)
        extra = conn.extra_dejson
        if extra.get("sqlalchemy_url"):
            _mask(extra["sqlalchemy_url"])
            return str(extra["sqlalchemy_url"])
        from sqlalchemy.engine import URL

        url = URL.create(
            "postgresql+psycopg",
            username=conn.login or None,
            password=conn.password or None,
            host=conn.host or None,
            port=conn.port or None,
            database=conn.schema or None,
        )
        return url.render_as_string(hide_password=False)

    @cached_property
    def store(self) -> SqlStore:
        return SqlStore(self.store_url)

    @cached_property
    def storage_options(self) -> dict[str, str]:
        """object_store / deltalake options from the AWS connection (login/password/extras)."""
        if not self.aws_conn_id:
            return {}
        conn = self.get_connection(self.aws_conn_id)
        extra: dict[str, Any] = conn.extra_dejson
        opts: dict[str, str] = {}
        if conn.login:
            opts["AWS_ACCESS_KEY_ID"] = conn.login
        if conn.password:
            _mask(conn.password)
            opts["AWS_SECRET_ACCESS_KEY"] = conn.password
        token = extra.get("aws_session_token")
        if token:
            _mask(token)
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
