"""``store/pg_exec``: one statement on the pooled psycopg connection, arrays as literals, errors as
SQLAlchemy raises them (what the commit paths' retries and messages read)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import closing

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.exc import IntegrityError, OperationalError

from delta_mirror.store import db, pg_exec
from delta_mirror.store.backends import postgresql

pytestmark = pytest.mark.postgres

AWKWARD = [
    "",
    "NULL",
    "null",
    " lead and trail ",
    'a "quoted" word',
    'back\\slash and \\" both',
    "{braces},commas",
    "café ☃ \u3000 tab\tnew\nline",
    '{"add":{"path":"p=1/a b.parquet","stats":"{\\"numRecords\\":1}"}}',
]


@pytest.fixture
def engine(pg_store_url: str) -> Iterator[Engine]:
    engine = db.make_engine(pg_store_url)
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE t (k int PRIMARY KEY, words text[], nums bigint[])")
    yield engine
    engine.dispose()


def test_array_literals_carry_every_string_and_number_untouched(engine: Engine) -> None:
    nums = [0, -1, 2**62, None]
    got = pg_exec.scalar(
        engine,
        "INSERT INTO t VALUES (1, %(w)s::text[], %(n)s::bigint[]) RETURNING words = %(w)s::text[]",
        {"w": [*AWKWARD, None], "n": nums},
    )
    assert got is True
    with engine.connect() as conn:
        row = conn.execute(text("SELECT words, nums FROM t")).one()
    assert (row.words, row.nums) == ([*AWKWARD, None], nums)
    assert pg_exec.scalar(engine, "SELECT cardinality(%(e)s::text[])", {"e": []}) == 0


def test_a_statement_runs_in_its_own_transaction_and_leaves_the_pool_as_it_was(engine: Engine) -> None:
    pg_exec.scalar(engine, "INSERT INTO t (k) VALUES (%(k)s) RETURNING k", {"k": 1})
    with engine.connect() as conn:  # the same pooled connection: no longer in autocommit
        conn.exec_driver_sql("INSERT INTO t (k) VALUES (2)")
        conn.rollback()
        assert conn.execute(text("SELECT array_agg(k) FROM t")).scalar() == [1]
    assert pg_exec.scalar(engine, "SELECT k FROM t WHERE k = 99", {}) is None


def test_a_duplicate_key_is_sqlalchemys_integrity_error(engine: Engine) -> None:
    pg_exec.scalar(engine, "INSERT INTO t (k) VALUES (%(k)s) RETURNING k", {"k": 1})
    with pytest.raises(IntegrityError) as caught:
        pg_exec.scalar(engine, "INSERT INTO t (k) VALUES (%(k)s) RETURNING k", {"k": 1})
    assert postgresql.BACKEND.is_unique_violation(caught.value)
    assert pg_exec.scalar(engine, "SELECT count(*) FROM t", {}) == 1  # the connection is still good


def test_a_connection_killed_under_the_statement_is_reported_dead_and_replaced(
    engine: Engine, pg_store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(postgresql, "_closed_by_server", lambda _conn: False)  # the checkout misses it
    pid = pg_exec.scalar(engine, "SELECT pg_backend_pid()", {})
    admin = db.make_engine(pg_store_url)
    with closing(admin.connect()) as conn:
        conn.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
        conn.commit()
    admin.dispose()
    with pytest.raises(OperationalError) as caught:
        pg_exec.scalar(engine, "SELECT 1", {})
    assert db.dead_connection(caught.value)
    assert pg_exec.scalar(engine, "SELECT pg_backend_pid()", {}) != pid  # a fresh connection
