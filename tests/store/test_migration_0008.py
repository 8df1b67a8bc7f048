"""Migration 0008 (issue 39 finding 8): stored object-store locations take the one spelling of
``delta.locations.normalize_table_root``, so the commit service's lookup by normalised root finds a
table ``delta-mirror import`` stored before as ``s3a://…//t``; local locations, refused ones and
two spellings of one root are left as they were."""

from __future__ import annotations

import pytest
from alembic import command
from alembic.config import Config
from sqlalchemy import text

from delta_mirror.errors import TableNotFoundError
from delta_mirror.store import SqlStore, db

#: (name, location as the code before 0008 could store it, location after the upgrade)
STORED = [
    ("a", "s3a://lake/w//a", "s3://lake/w/a"),
    ("b", "s3://lake/w/%62", "s3://lake/w/b"),
    ("c", "S3N://lake//w/c", "s3://lake/w/c"),
    ("d", "gs://bucket//d", "gs://bucket/d"),
    ("e", "file:///data/e", "file:///data/e"),  # local: stored resolved already, never re-resolved
    ("f", "s3://lake/w/f.", "s3://lake/w/f."),  # refused by the normaliser: left, with a warning
    ("g", "s3://lake/w/g", "s3://lake/w/g"),
    ("g2", "s3a://lake/w//g", "s3a://lake/w//g"),  # a second spelling of g's root: left, with a warning
]


def test_migration_0008_normalises_stored_object_store_locations(
    store_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    store = SqlStore(store_url)
    try:
        db.migrate(store.engine, "0007")
        with store.engine.begin() as conn:
            for name, old, _ in STORED:
                conn.execute(
                    text(
                        "INSERT INTO dl_tables (name, location, table_uuid, created_at)"
                        " VALUES (:n, :l, :u, 1)"
                    ),
                    {"n": name, "l": old, "u": f"00000000-0000-0000-0000-{len(name):06d}{ord(name[0]):06d}"},
                )
        with caplog.at_level("WARNING", logger="delta_mirror.store.migrations"):
            store.init()
        with store.engine.connect() as conn:
            assert conn.execute(text("select version_num from alembic_version")).scalar() == "0008"
        assert {t.name: t.location for t in store.list_tables()} == {n: new for n, _, new in STORED}
        assert store.table_at("s3://lake/w/a").name == "a", "the service's lookup by root finds it"
        assert "s3://lake/w/f." in caplog.text and "s3a://lake/w//g" in caplog.text
        cfg = Config()
        cfg.set_main_option("script_location", str(db.MIGRATIONS))
        with store.engine.begin() as conn:
            cfg.attributes["connection"] = conn
            command.downgrade(cfg, "0007")
        assert store.table_at("s3://lake/w/b").name == "b", "the downgrade keeps the new spellings"
        with pytest.raises(TableNotFoundError):
            store.table_at("s3a://lake/w//a")
    finally:
        store.close()
