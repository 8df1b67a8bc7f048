"""The hook keeps a replicated store and every commit-service replica (issue 40): a Postgres
connection with several hosts and ``target_session_attrs`` becomes a multi-host store URL that
every connection derived from it keeps; the commit service's URL is the one list the LogStore
fails over across, from ``DELTA_MIRROR_COMMIT_URL`` or an HTTP connection."""

from __future__ import annotations

import json

import pytest

from delta_mirror.errors import PermanentError
from delta_mirror.store.urls import hosts, jdbc_url, libpq_url

TWO = "http://127.0.0.1:8787,http://127.0.0.1:8788"


def hook(**kwargs: str | None):  # type: ignore[no-untyped-def]
    from delta_mirror.airflow.hooks import DeltaMirrorHook

    return DeltaMirrorHook(**kwargs)


def test_a_postgres_connection_with_several_hosts_and_target_session_attrs_is_a_multi_host_store(
    monkeypatch: pytest.MonkeyPatch, airflow_env: dict[str, str]
) -> None:
    monkeypatch.setenv(
        "AIRFLOW_CONN_DM_HA",
        json.dumps(
            {
                "conn_type": "postgres",
                "host": "db1.internal:5001, db2.internal",
                "port": 5432,
                "login": "mirror",
                "password": "p@ss",
                "schema": "delta",
                "extra": {"target_session_attrs": "read-write", "sslmode": "require", "cursor": "dictcursor"},
            }
        ),
    )
    url = hook(store_conn_id="dm_ha").store_url
    assert url == (
        "postgresql+psycopg://mirror:p%40ss@/delta?host=db1.internal%3A5001&host=db2.internal%3A5432"
        "&sslmode=require&target_session_attrs=read-write"
    )
    assert hosts(url) == [("db1.internal", 5001), ("db2.internal", 5432)]
    assert "host=db1.internal,db2.internal port=5001,5432" in libpq_url(url)
    assert (
        jdbc_url(url)[0]
        == "jdbc:postgresql://db1.internal:5001,db2.internal:5432/delta?targetServerType=primary"
    )


def test_a_single_host_postgres_connection_keeps_its_libpq_options(
    monkeypatch: pytest.MonkeyPatch, airflow_env: dict[str, str]
) -> None:
    monkeypatch.setenv(
        "AIRFLOW_CONN_DM_ONE",
        json.dumps(
            {
                "conn_type": "postgres",
                "host": "db",
                "port": 6543,
                "login": "m",
                "schema": "d",
                "extra": {"connect_timeout": 5},
            }
        ),
    )
    assert hook(store_conn_id="dm_one").store_url == "postgresql+psycopg://m@db:6543/d?connect_timeout=5"


def test_the_commit_service_from_the_environment_is_every_replica(
    monkeypatch: pytest.MonkeyPatch, airflow_env: dict[str, str]
) -> None:
    monkeypatch.delenv("DELTA_MIRROR_COMMIT_URLS", raising=False)
    monkeypatch.setenv("DELTA_MIRROR_COMMIT_URL", TWO + "/")
    monkeypatch.setenv("DELTA_MIRROR_COMMIT_TOKEN", "tok")
    assert hook().commit_service() == (TWO, "tok")


def test_an_http_connection_lists_its_replicas_in_the_url_extra_or_the_host_field(
    monkeypatch: pytest.MonkeyPatch, airflow_env: dict[str, str]
) -> None:
    monkeypatch.setenv(
        "AIRFLOW_CONN_DM_COMMIT",
        json.dumps({"conn_type": "http", "password": "tok", "extra": {"url": TWO}}),
    )
    assert hook().commit_service("dm_commit") == (TWO, "tok")
    monkeypatch.setenv(
        "AIRFLOW_CONN_DM_HOSTS",
        json.dumps({"conn_type": "http", "host": "127.0.0.1:8787,127.0.0.1:8788", "port": 9999}),
    )
    assert hook().commit_service("dm_hosts") == (TWO, None)


def test_a_commit_url_that_is_not_http_is_one_line_naming_the_connection(
    monkeypatch: pytest.MonkeyPatch, airflow_env: dict[str, str]
) -> None:
    monkeypatch.setenv(
        "AIRFLOW_CONN_DM_BAD", json.dumps({"conn_type": "http", "extra": {"url": "http://a:1,ftp://b:2"}})
    )
    with pytest.raises(PermanentError, match="the connection 'dm_bad' holds 'ftp://b:2'"):
        hook().commit_service("dm_bad")
