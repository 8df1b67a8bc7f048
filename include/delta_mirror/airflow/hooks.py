"""Hooks: Airflow connections → core objects (the SQL store, object-store options).

Secrets stay inside connection objects and the options passed to the storage client; they are
registered with Airflow's secrets masker and never logged.
"""

from __future__ import annotations

import contextlib
import os
from functools import cached_property

from airflow.sdk import BaseHook

from delta_mirror.store import SqlStore


def _mask(value: str | None) -> None:
    if value:
        try:
            from airflow.sdk.log import mask_secret

            mask_secret(value)
        except Exception:
            pass


def _has_port(host: str) -> bool:
    """``db1:5432`` or ``[::1]:5432`` (not a bare IPv6 address)."""
    return host.rsplit("]", 1)[-1].count(":") == 1 if host.startswith("[") else host.count(":") == 1


def _conn_id(value: str | None) -> str | None:
    if value is None or str(value).strip() in ("", "None"):
        return None
    return str(value).strip()


class DeltaMirrorHook(BaseHook):
    """The store (``store_conn_id``: a Postgres connection) and storage options (``aws_conn_id``).

    Without ``store_conn_id`` the store comes from ``DELTA_MIRROR_STORE`` or the embedded SQLite
    default; without ``aws_conn_id`` S3 credentials come from the usual AWS environment variables.

    :param store_conn_id: Airflow connection of the SQL store: a Postgres connection (host, login,
        password, schema as the database) or any connection whose extra holds ``sqlalchemy_url``;
        ``""`` and ``"None"`` (a rendered template) mean none. A replicated PostgreSQL store: every
        host in the host field, comma-separated (``db1:5432,db2:5432``; the port field is the port
        of a host without one) and ``{"target_session_attrs": "read-write"}`` in the extra, as the
        Postgres provider takes libpq options (sslmode, connect_timeout, ... likewise).
    :param aws_conn_id: Airflow connection with the object store's credentials and endpoint
        (``""`` and ``"None"`` mean none).
    """

    conn_name_attr = "store_conn_id"
    conn_type = "delta_mirror"  # the connection type of provider_info.py
    hook_name = "Delta Mirror"

    def __init__(self, store_conn_id: str | None = None, aws_conn_id: str | None = None) -> None:
        super().__init__()
        # Templated ids (the backfill form picks the table at run time) render "" or "None" for none.
        self.store_conn_id = _conn_id(store_conn_id)
        self.aws_conn_id = _conn_id(aws_conn_id)

    @cached_property
    def store_url(self) -> str | None:
        """The store's URL (None: the core's default). A DuckDB store is refused in one line: the
        scheduler, triggerer and workers would open its file from several processes at once."""
        url = self._configured_store_url()
        from delta_mirror.config import store_url as resolved
        from delta_mirror.store.backends.duckdb import refuse_several_processes

        refuse_several_processes(
            resolved(url),
            "Airflow's scheduler, triggerer and workers would open it from several processes at once",
            hint="use a PostgreSQL or MySQL store for Airflow (DuckDB: the CLI or one `delta-mirror serve`)",
        )
        return url

    def _configured_store_url(self) -> str | None:
        if not self.store_conn_id:
            return os.environ.get("DELTA_MIRROR_STORE")
        conn = self.get_connection(self.store_conn_id)
        _mask(conn.password)
        extra = conn.extra_dejson
        from sqlalchemy.engine import URL, make_url

        if extra.get("sqlalchemy_url"):
            url_text = str(extra["sqlalchemy_url"])
            _mask(url_text)
            # the password on its own too (a driver error may quote it without the URL)
            with contextlib.suppress(Exception):
                _mask(make_url(url_text).password)
            return url_text

        from delta_mirror.store.backends import server_backend

        # a MySQL connection is a MySQL/MariaDB store (PyMySQL); any other one a PostgreSQL store
        backend = server_backend(conn.conn_type or "")
        scheme = str(backend.server_scheme)
        hosts = [h.strip() for h in str(conn.host or "").split(",") if h.strip()]
        options = {k: str(v) for k, v in extra.items() if k in backend.url_options and v not in (None, "")}
        multi = backend.multi_host and len(hosts) > 1  # a replicated PostgreSQL store: every host, in order
        port = f":{conn.port}" if conn.port else ""
        url = URL.create(
            scheme,
            username=conn.login or None,
            password=conn.password or None,
            host=None if multi else conn.host or None,
            port=None if multi else conn.port or None,
            database=conn.schema or None,
            query={"host": [h if _has_port(h) else h + port for h in hosts], **options} if multi else options,
        )
        rendered = url.render_as_string(hide_password=False)
        if conn.password:
            _mask(rendered)  # the password appears percent-encoded in it when it has special characters
        return rendered

    @cached_property
    def store(self) -> SqlStore:
        """On the process's shared engine for the URL: one pool per store per process, not an
        engine (and a new connection) per hook; ``store.close()`` leaves that pool open."""
        return SqlStore(self.store_url, shared_engine=True)

    @cached_property
    def storage_options(self) -> dict[str, str]:
        """object_store / deltalake options from the storage connection ``aws_conn_id``: an ``aws``,
        ``wasb``/``adls`` (Azure) or ``google_cloud_platform`` connection (storage_connections.py)."""
        if not self.aws_conn_id:
            return {}
        from delta_mirror.airflow.storage_connections import storage_options_from_connection

        return storage_options_from_connection(self.get_connection(self.aws_conn_id), _mask)

    def commit_service(self, commit_conn_id: str | None = None) -> tuple[str, str | None]:
        """The commit service's base URL and token (``delta-mirror serve``, for Spark writers).

        From an HTTP connection (host with or without ``http(s)://``, port, the token as password;
        an ``url`` extra wins), else ``DELTA_MIRROR_COMMIT_URL`` / ``DELTA_MIRROR_COMMIT_TOKEN``.
        Replicas: every one's URL comma-separated (in the ``url`` extra, the host field or
        ``DELTA_MIRROR_COMMIT_URL``); the URL returned is then that list, which the LogStore fails
        over across.
        """
        from delta_mirror.spark.session import commit_url_from_env, commit_url_list

        conn_id = _conn_id(commit_conn_id)
        if conn_id is None:
            url = commit_url_from_env() or ""
            token = os.environ.get("DELTA_MIRROR_COMMIT_TOKEN") or None
        else:
            conn = self.get_connection(conn_id)
            extra = conn.extra_dejson
            if extra.get("url"):
                url = str(extra["url"])
            else:
                port = f":{conn.port}" if conn.port else ""
                url = ",".join(
                    (h if "://" in h else f"{conn.schema or 'http'}://{h}")
                    + ("" if _has_port(h.split("://")[-1]) else port)
                    for h in (part.strip() for part in str(conn.host or "").split(","))
                    if h
                )
            url = ",".join(commit_url_list(url, f"the connection {conn_id!r}"))
            token = conn.password or None
        _mask(token)
        if not url:
            from delta_mirror.errors import PermanentError

            raise PermanentError(
                "no commit service is configured for Spark writers",
                hint="set commit_conn_id (an HTTP connection to `delta-mirror serve`, token as password) "
                "or DELTA_MIRROR_COMMIT_URL",
            )
        return url, token
