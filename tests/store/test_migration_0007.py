"""Migration 0007 (the commit NOTIFY after the one-statement commit) on every backend: PostgreSQL's
trigger function changes (``test_commit_notify.py``), the other backends have no trigger and go up
and down through it unchanged."""

from __future__ import annotations

from alembic import command
from alembic.config import Config
from sqlalchemy import inspect, text

from delta_mirror.store import SqlStore, db


def test_migration_0007_goes_up_and_down_on_every_backend(store_url: str) -> None:
    store = SqlStore(store_url)
    try:
        db.migrate(store.engine, "0006")
        with store.engine.connect() as conn:
            tables = sorted(inspect(conn).get_table_names())
        db.migrate(store.engine, "0007")
        with store.engine.connect() as conn:
            assert conn.execute(text("select version_num from alembic_version")).scalar() == "0007"
            assert sorted(inspect(conn).get_table_names()) == tables
        cfg = Config()
        cfg.set_main_option("script_location", str(db.MIGRATIONS))
        with store.engine.begin() as conn:
            cfg.attributes["connection"] = conn
            command.downgrade(cfg, "0006")
        with store.engine.connect() as conn:
            assert conn.execute(text("select version_num from alembic_version")).scalar() == "0006"
            assert sorted(inspect(conn).get_table_names()) == tables
    finally:
        store.close()
