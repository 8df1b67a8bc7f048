"""The test services themselves: PostgreSQL answers, S3 refuses overwrites, restarts recover."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import sqlalchemy as sa
from support.services import PgServer, S3Server

from delta_mirror.storage import ObjectExistsError, open_store

FIRST = "_delta_log/00000000000000000000.json"


def _version(url: str) -> str:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            return str(conn.execute(sa.text("select version()")).scalar_one())
    finally:
        engine.dispose()


def test_postgres_answers(pg_url: str) -> None:
    assert pg_url.startswith("postgresql+psycopg://")
    assert _version(pg_url).startswith("PostgreSQL ")


def test_pg_store_url_is_a_fresh_database(pg_store_url: str, pg_url: str) -> None:
    assert sa.make_url(pg_store_url).database != sa.make_url(pg_url).database
    engine = sa.create_engine(pg_store_url)
    try:
        with engine.begin() as conn:
            assert (
                conn.execute(sa.text("select count(*) from pg_tables where schemaname='public'")).scalar()
                == 0
            )
            conn.execute(sa.text("create table t (x int)"))
    finally:
        engine.dispose()


def test_pg_restart(pg_store_url: str, pg_restart: Callable[..., None]) -> None:
    engine = sa.create_engine(pg_store_url)
    try:
        with engine.begin() as conn:
            conn.execute(sa.text("create table t (x int)"))
            conn.execute(sa.text("insert into t values (1)"))
        old = engine.connect()
        pg_restart()
        with pytest.raises(sa.exc.OperationalError):  # the old connection died with the server
            old.execute(sa.text("select 1"))
        old.close()
        engine.dispose()
        with engine.connect() as conn:
            assert conn.execute(sa.text("select x from t")).scalar_one() == 1
    finally:
        engine.dispose()


def test_pg_store_url_survives_a_stopped_server(pg_server: PgServer, pg_store_url: str) -> None:
    """A fault test may leave the server down; the teardown starts it again before dropping."""
    if not pg_server.owned:
        pytest.skip("needs the throwaway server")
    pg_server.stop()
    assert not pg_server.is_running()


def test_s3_put_if_absent_refuses_the_second_write(s3_env: str, s3: S3Server) -> None:
    store = open_store(f"s3://{s3_env}/t1")
    store.put_if_absent(FIRST, b"first")
    with pytest.raises(ObjectExistsError):
        store.put_if_absent(FIRST, b"second")
    assert store.get(FIRST) == b"first"
    body = s3.client().get_object(Bucket=s3_env, Key=f"t1/{FIRST}")["Body"].read()
    assert body == b"first"


def test_s3_buckets_are_fresh(s3: S3Server) -> None:
    a, b = s3.make_bucket(), s3.make_bucket()
    assert a != b
    assert s3.client().list_objects_v2(Bucket=a).get("KeyCount", 0) == 0
    assert s3.env()["AWS_ENDPOINT_URL"] == s3.endpoint.rstrip("/")


def test_store_url(store_url: str) -> None:
    engine = sa.create_engine(store_url)
    try:
        with engine.begin() as conn:
            conn.execute(sa.text("create table t (x int)"))
            conn.execute(sa.text("insert into t values (7)"))
            assert conn.execute(sa.text("select x from t")).scalar_one() == 7
    finally:
        engine.dispose()


def test_table_location(table_location: str) -> None:
    store = open_store(table_location)
    store.put_if_absent(FIRST, b"{}\n")
    with pytest.raises(ObjectExistsError):
        store.put_if_absent(FIRST, b"{}\n")
    assert [m.path for m in store.list("_delta_log")] == [FIRST]


def test_corpus_dir(corpus_dir: Path) -> None:
    assert any(corpus_dir.iterdir())
