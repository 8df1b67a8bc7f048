"""A store behind its published log (issue 40 item 2): a store backed up at version 1, versions 2
and 3 committed and published, the backup restored. Then the next commit is refused (its
``<v>.json`` is published with other bytes), the publisher says "store behind published log by 2
versions" instead of halting as a split brain, ``delta-mirror recover`` adopts 2..3 byte for byte,
a second run has nothing to recover, and writers continue at version 4.

On SQLite (the backup API's copy of the file), PostgreSQL (a copy of the database made with
``CREATE DATABASE ... TEMPLATE``) and MariaDB (the tables copied into a fresh database).
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from click.testing import CliRunner
from deltalake import DeltaTable
from support.builders import append_rows, create_data_table

from delta_mirror.cli import cli
from delta_mirror.delta.log_path import LOG_DIR, commit_name
from delta_mirror.errors import PermanentError, StoreBehindError, TableNotFoundError
from delta_mirror.health.troubleshooting import troubleshooting
from delta_mirror.jobs.publisher import Publisher
from delta_mirror.jobs.reconcile import reconcile
from delta_mirror.jobs.recover import recover_table
from delta_mirror.store import SqlStore

pytestmark = pytest.mark.all_backends(but="duckdb")


def _copy_store(url: str, request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A backup of the store at ``url`` as it is now (the caller closed its connections), as a
    store URL of its own: restoring the backup is pointing the store URL at it."""
    u = sa.make_url(url)
    if u.get_backend_name() == "sqlite":
        target = tmp_path / "backup.db"
        with (
            contextlib.closing(sqlite3.connect(str(u.database))) as src,
            contextlib.closing(sqlite3.connect(str(target))) as dst,
        ):
            src.backup(dst)
        return f"sqlite:///{target}"
    if u.get_backend_name() == "postgresql":
        server = request.getfixturevalue("pg_server")
        copy = str(server.create_database(prefix="dm_backup_"))
        server.drop_database(copy)  # the name, free again: the copy takes it
        engine = sa.create_engine(server.url, isolation_level="AUTOCOMMIT")
        with engine.connect() as conn:
            conn.exec_driver_sql(f'CREATE DATABASE "{sa.make_url(copy).database}" TEMPLATE "{u.database}"')
        engine.dispose()
        request.addfinalizer(lambda: server.drop_database(copy))
        return copy
    server = request.getfixturevalue("mariadb_server")
    copy = str(server.create_database(prefix="dm_backup_"))
    request.addfinalizer(lambda: server.drop_database(copy))
    src_db, dst_db = u.database, sa.make_url(copy).database
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.exec_driver_sql("SET FOREIGN_KEY_CHECKS=0")
        for (name,) in conn.exec_driver_sql(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = DATABASE()"
        ).all():
            conn.exec_driver_sql(f"CREATE TABLE `{dst_db}`.`{name}` LIKE `{src_db}`.`{name}`")
            conn.exec_driver_sql(f"INSERT INTO `{dst_db}`.`{name}` SELECT * FROM `{src_db}`.`{name}`")
    engine.dispose()
    return copy


def _log_file(root: Path, version: int) -> bytes:
    return (root / LOG_DIR / commit_name(version)).read_bytes()


def _run(url: str, *args: str) -> Any:
    return CliRunner().invoke(cli, ["--store", url, *args], catch_exceptions=False)


@pytest.fixture
def restored(store_url: str, request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, Path]:
    """The store URL of the restored backup (latest 1, versions 0..3 published) and the table root."""
    root = tmp_path / "lake" / "t"
    store = SqlStore(store_url)
    store.init()
    create_data_table(store, root)  # version 0: rows 1
    append_rows(store, root, "t", [2])  # version 1
    Publisher(store).publish("t")
    store.close()
    backup = _copy_store(store_url, request, tmp_path)
    store = SqlStore(store_url)
    append_rows(store, root, "t", [3])  # version 2
    append_rows(store, root, "t", [4])  # version 3
    assert Publisher(store).publish("t").last_published == 3
    store.close()
    return backup, root


def test_the_restored_store_refuses_the_next_commit_naming_recover(restored: tuple[str, Path]) -> None:
    url, root = restored
    published = _log_file(root, 2)
    actions = root.parent / "actions.json"
    actions.write_text(
        json.dumps(
            {
                "add": {
                    "path": "x.parquet",
                    "partitionValues": {},
                    "size": 1,
                    "modificationTime": 1,
                    "dataChange": True,
                }
            }
        )
        + "\n"
    )
    result = _run(url, "commit", "t", "--actions", str(actions))
    assert result.exit_code == 3, result.output
    line = result.stderr.strip()
    assert "\n" not in line and "Traceback" not in line
    assert "store behind published log by 2 versions (failover or restore?)" in line, line
    assert "delta-mirror recover t" in line, line
    with contextlib.closing(SqlStore(url)) as store:
        assert store.latest_version(store.get_table("t").id) == 1  # nothing accepted
    assert _log_file(root, 2) == published


def test_the_publisher_says_store_behind_instead_of_halting(restored: tuple[str, Path]) -> None:
    url, _root = restored
    with contextlib.closing(SqlStore(url)) as store:
        with pytest.raises(StoreBehindError) as caught:
            Publisher(store).publish("t")
        assert caught.value.behind == 2
        table = store.get_table("t")
        assert table.state != "HALTED"
    status = _run(url, "status", "--json")
    row = next(r for r in json.loads(status.output) if r["table"] == "t")
    assert row["state"] != "HALTED"
    assert "store behind published log by 2 versions (failover or restore?)" in row["failure"]["error"]
    assert "delta-mirror recover t" in row["failure"]["error"]
    text = _run(url, "status", "t").output
    assert "store behind published log by 2 versions (failover or restore?)" in text, text
    health = _run(url, "health", "--json")
    assert "delta-mirror recover t" in health.output, health.output
    # the alert's text (task failures, emails) for the error's class names the command too
    assert "delta-mirror recover <table>" in troubleshooting(StoreBehindError("x").error_class)


def test_recover_adopts_the_published_versions_byte_for_byte_once(restored: tuple[str, Path]) -> None:
    url, root = restored
    first = _run(url, "recover", "t")
    assert first.exit_code == 0, first.output
    assert "adopted versions 2..3" in first.output and "writers continue at version 4" in first.output
    with contextlib.closing(SqlStore(url)) as store:
        table = store.get_table("t")
        assert store.latest_version(table.id) == 3
        for v in range(4):
            assert store.commit_bytes(table.id, v) == _log_file(root, v)
        assert store.last_published_version(table.id) == 3  # confirmed published
        assert store.table_failures([table.id]) == {}  # the failure row is gone
    again = _run(url, "recover", "t")
    assert again.exit_code == 0 and "nothing to recover" in again.output, again.output
    # writers continue at the right version, and a reader sees every row
    with contextlib.closing(SqlStore(url)) as store:
        append_rows(store, root, "t", [5])
        assert store.latest_version(store.get_table("t").id) == 4
        assert Publisher(store).publish("t").published == [4]
    assert sorted(DeltaTable(root.as_uri()).to_pyarrow_table()["id"].to_pylist()) == [1, 2, 3, 4, 5]


def test_recover_bad_input_is_one_line_and_changes_nothing(
    restored: tuple[str, Path], tmp_path: Path
) -> None:
    url, _root = restored
    unknown = _run(url, "recover", "nope")
    assert unknown.exit_code == 1
    assert unknown.stderr.count("\n") == 1 and "no table named 'nope'" in unknown.stderr
    assert _run(url, "recover").exit_code == 2  # neither NAME nor --all
    assert _run(url, "recover", "t").exit_code == 0
    not_behind = _run(url, "recover", "--all")
    assert not_behind.exit_code == 0 and "t: nothing to recover" in not_behind.output


def test_a_store_with_other_bytes_at_its_latest_is_a_split_brain_recover_refuses(
    restored: tuple[str, Path],
) -> None:
    """The store accepted version 2 with other bytes than 2.json (before this check existed):
    recover cannot adopt 3 on top of it; nothing changes."""
    url, root = restored
    with contextlib.closing(SqlStore(url)) as store:
        append_rows(store, root, "t", [99])  # the store API does not look at storage: the old accident
        with pytest.raises(PermanentError, match="split brain"):
            recover_table(store, "t")
        assert store.latest_version(store.get_table("t").id) == 2
        with pytest.raises(TableNotFoundError):
            recover_table(store, "nope")


def test_the_reconcile_dag_says_store_behind_instead_of_halting(restored: tuple[str, Path]) -> None:
    """``reconcile --strategy full`` lists the log: the commit files beyond the store's latest are
    the store's lost versions, not an external writer's."""
    url, _root = restored
    with contextlib.closing(SqlStore(url)) as store:
        entry = reconcile(store, strategy="full").tables[0]
        assert entry.action == "failed", entry
        assert "store behind published log by 2 versions" in (entry.error or "")
        assert store.get_table("t").state != "HALTED"
        recover_table(store, "t", publish=Publisher(store).publish)
        assert reconcile(store, strategy="full").tables[0].action != "failed"
