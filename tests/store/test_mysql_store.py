"""What only the MySQL/MariaDB store has to get right: READ COMMITTED sessions (checked when a
connection is made), byte-for-byte text comparison, 64 KiB+ action lines, errors by number."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import closing

import pytest
from sqlalchemy import insert, select, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import IntegrityError
from store.store_kit import add, metadata, protocol
from support.mariadb import MariaDbServer
from support.services import ServiceUnavailable, free_port, skip_or_fail

from delta_mirror.errors import PermanentError, TransientError
from delta_mirror.store import SqlStore
from delta_mirror.store.backends import backend_of
from delta_mirror.store.schema import dl_files, dl_tables

pytestmark = pytest.mark.mysql


@pytest.fixture
def mysql_store(mysql_store_url: str) -> Iterator[SqlStore]:
    s = SqlStore(mysql_store_url)
    s.init()
    yield s
    s.close()


def test_every_session_of_a_mysql_store_runs_at_read_committed_in_strict_mode(mysql_store: SqlStore) -> None:
    engine = mysql_store.engine
    with engine.connect() as a, engine.connect() as b:  # two pool connections, each checked
        for conn in (a, b):
            raw = conn.connection.dbapi_connection
            assert raw is not None
            assert engine.dialect.get_isolation_level(raw) == "READ COMMITTED"
            assert "STRICT_ALL_TABLES" in str(conn.execute(text("SELECT @@SESSION.sql_mode")).scalar())


def test_a_mysql_store_compares_table_names_and_paths_byte_for_byte(mysql_store: SqlStore) -> None:
    """MySQL's default collations ignore case and trailing spaces; the store's tables must not."""
    with mysql_store.engine.begin() as conn:
        collations = set(
            conn.execute(
                text(
                    "SELECT DISTINCT table_collation FROM information_schema.tables "
                    "WHERE table_schema = DATABASE() AND table_name LIKE 'dl\\_%'"
                )
            ).scalars()
        )
        assert collations == {"utf8mb4_nopad_bin"}, collations
        for name in ("t", "T", "t "):
            conn.execute(
                insert(dl_tables).values(name=name, location=f"file:///{name}", table_uuid="u", created_at=0)
            )
        for path in ("a.parquet", "A.parquet", "a.parquet ", "ä.parquet"):
            conn.execute(insert(dl_files).values(table_id=1, path=path, dv_id=""))
        assert conn.execute(
            select(dl_files.c.path).where(dl_files.c.path == "a.parquet")
        ).scalars().all() == ["a.parquet"]


def test_an_action_line_longer_than_64_kib_is_stored_whole(mysql_store: SqlStore) -> None:
    fields = [{"name": f"c{i:05d}", "type": "long", "nullable": True, "metadata": {}} for i in range(2000)]
    schema = json.dumps({"type": "struct", "fields": fields})
    assert len(schema) > 70_000
    wide = ("metaData", {**metadata()[1], "schemaString": schema})
    mysql_store.create_table("wide", "file:///tmp/wide")
    assert mysql_store.commit("wide", [protocol(), wide, add("a.parquet")]) == 0
    table_id = mysql_store.get_table("wide").id
    data = mysql_store.commit_bytes(table_id, 0)
    bodies = [json.loads(line) for line in data.decode().splitlines()]
    assert [b["metaData"]["schemaString"] for b in bodies if "metaData" in b] == [schema]


def test_a_duplicate_key_is_a_unique_violation_by_its_error_number(mysql_store: SqlStore) -> None:
    row = {"name": "dup", "location": "file:///dup", "table_uuid": "u", "created_at": 0}
    with mysql_store.engine.begin() as conn:
        conn.execute(insert(dl_tables).values(**row))
    with pytest.raises(IntegrityError) as info, mysql_store.engine.begin() as conn:
        conn.execute(insert(dl_tables).values(**row))
    assert backend_of(mysql_store.engine).is_unique_violation(info.value)


def test_mysql_errors_are_classified_by_number(mysql_store_url: str) -> None:
    url = make_url(mysql_store_url)
    with closing(SqlStore(mysql_store_url)) as empty, pytest.raises(PermanentError, match="not initialised"):
        empty.latest_version(1)  # MySQL error 1146: no such table
    cases = [
        (url.set(password="wrong"), PermanentError, "database login failed"),
        (url.set(database="dm_no_such_database"), PermanentError, "database does not exist"),
        (url.set(port=free_port()), TransientError, "database unavailable"),
    ]
    for bad, kind, needle in cases:
        with closing(SqlStore(bad.render_as_string(hide_password=False))) as s:
            with pytest.raises(kind, match=needle) as info:
                s.latest_version(1)
            assert "wrong" not in str(info.value)  # the password is never shown


def test_a_server_whose_binary_log_is_statement_based_is_refused_in_one_line() -> None:
    """READ COMMITTED writes cannot be logged as statements: the store says so at connect."""
    try:
        server = MariaDbServer.start_new("--log-bin=binlog", "--binlog-format=STATEMENT", "--server-id=1")
    except ServiceUnavailable as exc:
        skip_or_fail(str(exc))
    try:
        url = server.create_database()
        with closing(SqlStore(url)) as s, pytest.raises(PermanentError) as info:
            s.init()
        assert "binlog_format=STATEMENT" in info.value.message
        assert "\n" not in info.value.message
        assert "binlog_format=ROW" in (info.value.hint or "")
    finally:
        server.stop_and_remove()
