"""The commit service refuses a version whose ``<v>.json`` is already published with other bytes
(issue 40 item 2), on the LogStore's HTTP path against a real ``delta-mirror serve``.

The test plays the LogStore: it POSTs version N and, once answered, writes ``N.json`` itself. The
store (SQLite) is backed up at version 1 with the backup API; versions 2 and 3 are committed and
written; the backup is restored, once under the running service (which acknowledged 3: a post at
or below it makes it learn the frontier again) and once for a fresh one (first sight of the table).
"""

from __future__ import annotations

import contextlib
import sqlite3
import subprocess
from pathlib import Path

import pytest
import sqlalchemy as sa
from support.cli import executable
from support.commit_service import FIRST_COMMIT as V0
from support.commit_service import CommitService, add_line, commit_file, commit_service
from support.services import PgServer
from support.stores import init_store

from delta_mirror.delta.log_path import LOG_DIR, commit_name
from delta_mirror.store import SqlStore


def _sqlite_copy(src: Path, dst: Path) -> None:
    with contextlib.closing(sqlite3.connect(src)) as a, contextlib.closing(sqlite3.connect(dst)) as b:
        a.backup(b)


def _commit_as_logstore(service: CommitService, root: Path, version: int, data: bytes) -> None:
    answer = service.post(root.as_uri(), version, data)
    assert answer.status == 201, answer.body
    folder = root / LOG_DIR
    folder.mkdir(parents=True, exist_ok=True)
    (folder / commit_name(version)).write_bytes(data)  # the LogStore writes N.json after the answer


def _v(n: int) -> bytes:
    return commit_file(add_line(f"part-{n}.parquet"))


def _latest(url: str) -> int | None:
    with contextlib.closing(SqlStore(url)) as store:
        return store.latest_version(store.get_table("t").id)


def _published_to_3_with_backup_at_1(service: CommitService, root: Path, db: Path, backup: Path) -> None:
    _commit_as_logstore(service, root, 0, V0)
    _commit_as_logstore(service, root, 1, _v(1))
    _sqlite_copy(db, backup)
    _commit_as_logstore(service, root, 2, _v(2))
    _commit_as_logstore(service, root, 3, _v(3))


def _assert_refused(service: CommitService, root: Path, version: int, behind: int) -> None:
    answer = service.post(root.as_uri(), version, commit_file(add_line("other.parquet")))
    assert answer.status == 422, answer.body
    body = answer.json()
    assert body["code"] == "store_behind", body
    assert b"\n" not in answer.body.rstrip(b"\n")
    assert f"store behind published log by {behind} version" in body["error"]
    assert "(failover or restore?)" in body["error"]
    assert "delta-mirror recover t" in body["error"], body


def test_a_running_service_refuses_after_the_store_went_back(tmp_path: Path, lake: Path) -> None:
    db, backup = tmp_path / "store.db", tmp_path / "backup.db"
    url, root = f"sqlite:///{db}", lake / "t"
    init_store(url).close()
    with commit_service(url, [lake.as_uri()]) as service:
        _published_to_3_with_backup_at_1(service, root, db, backup)
        _sqlite_copy(backup, db)  # the restore, under the running service
        assert service.latest(root.as_uri()).json()["version"] == 1
        _assert_refused(service, root, 2, behind=2)
        assert _latest(url) == 1  # nothing acknowledged that cannot be published
        # the very bytes published as 2.json are no conflict: a retry, or the log adopted
        assert service.post(root.as_uri(), 2, _v(2)).status == 201
        _assert_refused(service, root, 3, behind=1)


def test_a_fresh_service_on_a_restored_store_refuses_then_recover_lets_writers_continue(
    tmp_path: Path, lake: Path
) -> None:
    db, backup = tmp_path / "store.db", tmp_path / "backup.db"
    url, root = f"sqlite:///{db}", lake / "t"
    init_store(url).close()
    with commit_service(url, [lake.as_uri()]) as service:
        _published_to_3_with_backup_at_1(service, root, db, backup)
    _refused_then_recovered(f"sqlite:///{backup}", lake)


def _refused_then_recovered(restored: str, lake: Path) -> None:
    """A fresh service on the restored store: refused at first sight; `recover` adopts 2..3
    byte-identical; the next version is committed."""
    root = lake / "t"
    with commit_service(restored, [lake.as_uri()]) as service:
        _assert_refused(service, root, 2, behind=2)
        assert _latest(restored) == 1
        done = subprocess.run(
            [*executable(), "--store", restored, "recover", "t"], capture_output=True, text=True, check=False
        )
        assert done.returncode == 0, done.stderr
        assert "adopted versions 2..3" in done.stdout
        with contextlib.closing(SqlStore(restored)) as store:
            table = store.get_table("t")
            for v in range(4):
                assert store.commit_bytes(table.id, v) == (root / LOG_DIR / commit_name(v)).read_bytes()
        # the store has 3 again: another writer's bytes for it are a conflict (the LogStore reads
        # the winner), no longer "behind", though this service learned the frontier before
        again = service.post(root.as_uri(), 3, commit_file(add_line("other.parquet")))
        assert again.status == 409, again.body
        _commit_as_logstore(service, root, 4, _v(4))  # writers continue at the right version
        assert _latest(restored) == 4


def test_on_postgresql_a_restored_copy_is_refused_then_recovered(
    pg_server: PgServer, pg_store_url: str, lake: Path, request: pytest.FixtureRequest
) -> None:
    """The same on PostgreSQL: the backup is a copy of the database at version 1
    (``CREATE DATABASE ... TEMPLATE``, with the service stopped: a template has no sessions)."""
    url, root = pg_store_url, lake / "t"
    init_store(url).close()
    with commit_service(url, [lake.as_uri()]) as service:
        _commit_as_logstore(service, root, 0, V0)
        _commit_as_logstore(service, root, 1, _v(1))
    backup = pg_server.create_database(prefix="dm_backup_")
    pg_server.drop_database(backup)  # its name, free: the copy takes it
    engine = sa.create_engine(pg_server.url, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.exec_driver_sql(
            f'CREATE DATABASE "{sa.make_url(backup).database}" TEMPLATE "{sa.make_url(url).database}"'
        )
    engine.dispose()
    request.addfinalizer(lambda: pg_server.drop_database(backup))
    with commit_service(url, [lake.as_uri()]) as service:
        _commit_as_logstore(service, root, 2, _v(2))
        _commit_as_logstore(service, root, 3, _v(3))
    _refused_then_recovered(backup, lake)


def test_a_writer_that_listed_the_lost_tail_and_asks_beyond_it_is_told_store_behind(
    tmp_path: Path, lake: Path
) -> None:
    """The Delta-Spark LogStore lists ``_delta_log`` before it commits: after the store lost 2..3 it
    asks for 4, beyond the store's next version. That is the lost tail, answered ``store_behind``
    naming ``recover`` (before: a bare "version gap ... run reconcile"); after ``recover`` the same
    post is committed. A gap with nothing published at the store's next version stays a gap."""
    db, backup = tmp_path / "store.db", tmp_path / "backup.db"
    url, root = f"sqlite:///{db}", lake / "t"
    init_store(url).close()
    with commit_service(url, [lake.as_uri()]) as service:
        _published_to_3_with_backup_at_1(service, root, db, backup)
        gap = service.post(root.as_uri(), 6, _v(6))  # 4.json is not published: a plain gap
        assert (gap.status, gap.json()["code"]) == (422, "invalid"), gap.body
        assert "version gap: the store's next version is 4, not 6" in gap.json()["error"]
    restored = f"sqlite:///{backup}"
    with commit_service(restored, [lake.as_uri()]) as service:
        answer = service.post(root.as_uri(), 4, _v(4))
        assert answer.status == 422, answer.body
        body = answer.json()
        assert body["code"] == "store_behind", body
        assert "store behind published log by 2 versions (failover or restore?)" in body["error"]
        assert "delta-mirror recover t" in body["error"], body
        assert _latest(restored) == 1  # nothing acknowledged
        done = subprocess.run(
            [*executable(), "--store", restored, "recover", "t"], capture_output=True, text=True, check=False
        )
        assert done.returncode == 0, done.stderr
        _commit_as_logstore(service, root, 4, _v(4))
        assert _latest(restored) == 4
