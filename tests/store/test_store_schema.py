"""The store's schema and ``init``: idempotent, safe to run concurrently, clear about bad store URLs."""

from __future__ import annotations

import threading
from contextlib import closing
from pathlib import Path

import pytest
from sqlalchemy import inspect, select, text
from store.store_kit import add, new_table, state
from support.race import race

from delta_mirror.errors import PermanentError
from delta_mirror.store import SqlStore, db
from delta_mirror.store.reads import latest_action, latest_action_query
from delta_mirror.store.schema import LOOKED_UP_ACTIONS, dl_actions


def test_init_is_idempotent_and_creates_the_schema(store: SqlStore, location: str) -> None:
    names = set(inspect(store.engine).get_table_names())
    assert {
        "dl_tables",
        "dl_commits",
        "dl_actions",
        "dl_files",
        "dl_mirror_status",
        "alembic_version",
    } <= names
    table_id = new_table(store, location)
    before = state(store)
    store.init()
    store.init()
    assert state(store) == before
    assert store.latest_version(table_id) == 0
    with store.engine.connect() as conn:
        assert conn.execute(text("select version_num from alembic_version")).scalars().all() == ["0008"]


def test_action_payloads_are_text_that_keeps_key_order_not_jsonb(store: SqlStore, location: str) -> None:
    if store.engine.dialect.name == "duckdb":  # duckdb-engine cannot reflect columns; TEXT is VARCHAR
        with store.engine.connect() as conn:
            kind = conn.execute(
                text(
                    "SELECT data_type FROM information_schema.columns"
                    " WHERE table_name = 'dl_actions' AND column_name = 'payload'"
                )
            ).scalar()
        assert kind == "VARCHAR"
    else:
        columns = {c["name"]: c["type"] for c in inspect(store.engine).get_columns("dl_actions")}
        # MySQL: LONGTEXT (its TEXT holds only 64 KiB)
        assert type(columns["payload"]).__name__.upper() in ("TEXT", "LONGTEXT")
    table_id = new_table(
        store, location, "t", ("txn", {"version": 3, "appId": "zz", "zUnknown": {"b": 1, "a": 2}})
    )
    with store.engine.connect() as conn:
        payloads = (
            conn.execute(
                select(dl_actions.c.payload).where(
                    dl_actions.c.table_id == table_id, dl_actions.c.action_type == "txn"
                )
            )
            .scalars()
            .all()
        )
    # txn keys in Delta-Spark order, the unknown field kept with its own key order.
    assert payloads == ['{"txn":{"appId":"zz","version":3,"zUnknown":{"b":1,"a":2}}}']


def test_concurrent_init_of_a_fresh_store_succeeds_for_every_caller(store_url: str) -> None:
    def init(_w: int, barrier: threading.Barrier) -> None:
        with closing(SqlStore(store_url)) as s:
            barrier.wait()
            s.init()

    race(3, init)  # no caller fails
    s = SqlStore(store_url)
    s.ensure_initialised()
    s.close()


def test_an_uninitialised_store_says_run_init(store_url: str) -> None:
    s = SqlStore(store_url)
    with pytest.raises(PermanentError, match="not initialised") as info:
        s.ensure_initialised()
    assert "delta-mirror init" in info.value.message
    s.close()


@pytest.mark.parametrize("url", ["mssql://u@h/db", "oracle://x", "not a url", "mongodb://h/db"])
def test_unsupported_store_urls_are_refused_clearly(url: str) -> None:
    with pytest.raises(PermanentError, match=r"unsupported store backend|not valid"):
        SqlStore(url)


def test_a_sqlite_store_in_an_unusable_folder_is_a_clear_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(PermanentError, match="cannot create"):
        SqlStore(f"sqlite:///{blocker}/sub/store.db")


def test_reads_by_action_type_walk_a_partial_index_that_holds_no_file_actions(
    store: SqlStore, location: str
) -> None:
    """``ix_dl_actions_type`` indexes only protocol, metaData, txn and domainMetadata rows (the adds
    and removes that are almost every row cost no index entry), and the newest protocol / metaData
    is still read through it on both backends, not by scanning the table's actions."""
    if store.engine.dialect.name == "duckdb":
        pytest.skip("DuckDB has no partial indexes: it reads by type by scanning the table's actions")
    if store.engine.dialect.name == "mysql":
        pytest.skip("MySQL has no partial indexes: ix_dl_actions_type there holds every action")
    table_id = new_table(store, location, "t", add("b.parquet"))
    with store.engine.connect() as conn:
        if store.engine.dialect.name == "sqlite":
            ddl = conn.execute(
                text("SELECT sql FROM sqlite_master WHERE name = 'ix_dl_actions_type'")
            ).scalar()
            explain = "EXPLAIN QUERY PLAN "
        else:
            ddl = conn.execute(
                text("SELECT indexdef FROM pg_indexes WHERE indexname = 'ix_dl_actions_type'")
            ).scalar()
            conn.execute(text("SET enable_seqscan = off"))
            explain = "EXPLAIN "
        assert "WHERE" in str(ddl) and all(f"'{kind}'" in str(ddl) for kind in LOOKED_UP_ACTIONS), ddl
        for kind in ("protocol", "metaData"):
            query = latest_action_query(table_id, kind, 0)
            sql = str(query.compile(dialect=conn.dialect, compile_kwargs={"literal_binds": True}))
            plan = " ".join(str(r[-1]) for r in conn.execute(text(explain + sql)))
            assert "ix_dl_actions_type" in plan, plan
            assert conn.execute(query).scalar() is not None
    with pytest.raises(ValueError, match="not indexed by type"):
        latest_action_query(table_id, "add", 0)


def test_init_upgrades_a_store_of_the_previous_revision_keeping_its_tables(
    store_url: str, tmp_path: Path
) -> None:
    """A store created before migration 0005 (full type index) is upgraded by ``init``: the index
    becomes partial, the rows stay, commits and snapshot reads carry on."""
    old = SqlStore(store_url)
    db.migrate(old.engine, "0004")
    location = (tmp_path / "table").as_uri()
    table_id = new_table(old, location, "t", add("b.parquet"))
    old.close()
    store = SqlStore(store_url)
    store.init()
    with store.engine.connect() as conn:
        assert conn.execute(text("select version_num from alembic_version")).scalar() == "0008"
        assert latest_action(conn, table_id, "metaData", 0) is not None
    assert store.commit("t", [add("c.parquet")]) == 1
    assert store.count_active_files(table_id, 1) == 3
    store.close()
