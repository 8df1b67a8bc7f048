"""The store on a DuckDB file: one read-write process, whose threads queue their writes.

DuckDB locks the file for the process that opens it; a second process is refused with one line
naming the file and the holder. Inside the process, two transactions writing the same row would
fail one of them ("Conflict on tuple deletion"): the store's engine queues its write transactions
per file, and DuckDB's errors are told apart by exception class.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from contextlib import closing
from pathlib import Path

import pytest
from sqlalchemy import insert, select, text, update
from sqlalchemy.exc import IntegrityError, OperationalError
from store.store_kit import new_table
from support.cli import assert_one_error_line, clean_env, executable
from support.race import race
from support.waiting import load_scaled

from delta_mirror.errors import TransientError
from delta_mirror.store import SqlStore, db
from delta_mirror.store.backends.duckdb import BACKEND as DUCKDB
from delta_mirror.store.schema import dl_breakers, dl_tables

pytestmark = pytest.mark.duckdb

_HOLDER = """
import sys
from delta_mirror.store import SqlStore
store = SqlStore(sys.argv[1])
store.ensure_initialised()
print("holding", flush=True)
sys.stdin.read()  # until the test closes our stdin
"""


@pytest.fixture
def duck(tmp_path: Path) -> str:
    url = f"duckdb:///{tmp_path / 'store.duckdb'}"
    with closing(SqlStore(url)) as store:
        store.init()
    return url


def test_a_second_process_opening_a_held_store_gets_one_line_naming_the_file_and_its_holder(
    duck: str, tmp_path: Path
) -> None:
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, duck],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=clean_env(),
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "holding\n"
        for command in (["status"], ["init"]):
            out = subprocess.run(
                [*executable(), "--store", duck, *command],
                capture_output=True,
                text=True,
                env=clean_env(),
                timeout=load_scaled(120),
                check=False,
            )
            assert out.returncode != 0, command
            assert_one_error_line(
                out.stderr,
                f"the DuckDB store {tmp_path / 'store.duckdb'} is in use by another process",
                f"PID {holder.pid}",
                "one process at a time",
            )
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(timeout=load_scaled(60))
    # Once the holder is gone, the next process opens the file.
    out = subprocess.run(
        [*executable(), "--store", duck, "status"],
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=load_scaled(120),
        check=False,
    )
    assert out.returncode == 0, out.stderr


def test_writers_of_one_process_queue_on_the_file_instead_of_failing_on_a_conflict(
    duck: str, tmp_path: Path
) -> None:
    """Each writer holds its transaction open over the others' start: without the queue DuckDB
    fails the second write of the same row. Half the writers share one store (its pooled
    connections stay open: the queue must be let go at COMMIT, not when a connection closes)."""
    with closing(SqlStore(duck)) as store, closing(SqlStore(duck)) as shared:
        table_id = new_table(store, (tmp_path / "t").as_uri())

        def writer(w: int, barrier: threading.Barrier) -> int:
            s = shared if w % 2 else SqlStore(duck)
            try:
                barrier.wait()
                with s.engine.begin() as conn:
                    conn.execute(
                        update(dl_tables).where(dl_tables.c.id == table_id).values(lease_owner=f"w{w}")
                    )
                    time.sleep(0.2)
                    return int(
                        conn.execute(
                            update(dl_tables)
                            .where(dl_tables.c.id == table_id, dl_tables.c.lease_owner == f"w{w}")
                            .values(lease_expires_at=w)
                        ).rowcount
                    )
            finally:
                if s is not shared:
                    s.close()

        assert race(6, writer, seconds=30) == [1] * 6  # each updated the row it had set: no conflict
        with shared.engine.begin() as conn:  # and the shared store's connections are free again
            conn.execute(update(dl_tables).values(lease_owner=None))


def test_duckdb_conflicts_and_duplicate_keys_are_told_apart_by_exception_class(duck: str) -> None:
    """Reader connections do not take the write queue: two of them show DuckDB's own outcomes."""
    with closing(SqlStore(duck)) as store:
        row = {"key": "k", "state": "CLOSED", "failures": 0, "updated_at": 1}
        with store.engine.begin() as conn:
            conn.execute(insert(dl_breakers).values(**row))
        with pytest.raises(IntegrityError) as dup, store.engine.begin() as conn:  # at the statement
            conn.execute(insert(dl_breakers).values(**row))
        assert DUCKDB.is_unique_violation(dup.value)

        with store.reader.connect() as a, store.reader.connect() as b:
            a.begin()
            b.begin()
            a.execute(update(dl_breakers).values(failures=1))
            with pytest.raises(OperationalError) as conflict:  # a write-write conflict
                b.execute(update(dl_breakers).values(failures=2))
            a.commit()
            b.rollback()
        error = db.classify_db_error(conflict.value, duck, "testing")
        assert isinstance(error, TransientError) and "DuckDB write conflict" in error.message
        assert not DUCKDB.is_unique_violation(conflict.value)

        with store.reader.connect() as a, store.reader.connect() as b:
            a.begin()
            b.begin()
            a.execute(insert(dl_breakers).values(**{**row, "key": "k2"}))
            b.execute(insert(dl_breakers).values(**{**row, "key": "k2"}))
            a.commit()
            with pytest.raises(OperationalError) as at_commit:  # the same key, found at commit
                b.commit()
        assert DUCKDB.is_unique_violation(at_commit.value)
        with store.reader.connect() as conn:
            assert conn.execute(select(dl_breakers.c.failures).where(dl_breakers.c.key == "k")).scalar() == 1


def test_an_update_on_duckdb_reports_how_many_rows_it_changed(duck: str, tmp_path: Path) -> None:
    """Leases and claims read ``rowcount``; DuckDB's cursor alone says -1."""
    with closing(SqlStore(duck)) as store:
        new_table(store, (tmp_path / "a").as_uri(), "a")
        new_table(store, (tmp_path / "b").as_uri(), "b")
        with store.engine.begin() as conn:
            assert conn.execute(update(dl_tables).values(lease_owner="x")).rowcount == 2
            assert (
                conn.execute(update(dl_tables).where(dl_tables.c.name == "zz").values(state="X")).rowcount
                == 0
            )
            assert conn.execute(text("SELECT count(*) FROM dl_tables")).scalar() == 2
