"""The store's URL as the Spark checkpoint engine's JDBC source (``store.db.jdbc_url``)."""

from __future__ import annotations

import pytest

from delta_mirror.errors import PermanentError
from delta_mirror.store.db import jdbc_url


def test_a_postgresql_store_url_becomes_a_jdbc_url_with_its_credentials_and_options() -> None:
    url, props = jdbc_url("postgresql+psycopg://mirror:p%40ss@db.example:6543/meta?sslmode=require")
    assert url == "jdbc:postgresql://db.example:6543/meta"
    assert props == {
        "driver": "org.postgresql.Driver",
        "user": "mirror",
        "password": "p@ss",
        "sslmode": "require",
    }


def test_a_postgresql_url_without_host_or_port_gets_libpq_defaults_and_no_password() -> None:
    url, props = jdbc_url("postgresql+psycopg://mirror@/meta")
    assert url == "jdbc:postgresql://localhost:5432/meta"
    assert "password" not in props


def test_a_sqlite_store_has_no_jdbc_mapping_and_says_so() -> None:
    with pytest.raises(PermanentError, match="no JDBC mapping for a sqlite store"):
        jdbc_url("sqlite:///tmp/store.db")
