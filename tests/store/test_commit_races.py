"""Commits with removes under racing writers and SIGKILLed writers: contiguous versions, one winner
per version, nothing half-written (the one-statement path on PostgreSQL, the transaction path
everywhere)."""

from __future__ import annotations

import hashlib
import json
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time
from contextlib import closing

import pytest
from sqlalchemy import func, select, text
from store.store_kit import add, metadata, protocol, remove, spark_file
from support.race import race
from support.waiting import wait_until

from delta_mirror.errors import CommitConflictError
from delta_mirror.store import SqlStore
from delta_mirror.store.schema import dl_actions, dl_commits, dl_mirror_status

WRITERS = 8


def check_whole(store: SqlStore, table_id: int) -> int:
    """Versions 0..latest, each whole: its actions, hash, status row and file index entries as its
    commit file says; the active files are the replay of every commit. Returns the latest version."""
    latest = store.latest_version(table_id)
    assert latest is not None
    with store.engine.connect() as conn:
        commits = conn.execute(
            select(
                dl_commits.c.version, dl_commits.c.action_count, dl_commits.c.sha256, dl_commits.c.size_bytes
            )
            .where(dl_commits.c.table_id == table_id)
            .order_by(dl_commits.c.version)
        ).all()
        actions: dict[int, int] = dict(
            conn.execute(
                select(dl_actions.c.version, func.count())
                .where(dl_actions.c.table_id == table_id)
                .group_by(dl_actions.c.version)
            ).all()
        )
        status: dict[int, int] = dict(
            conn.execute(
                select(dl_mirror_status.c.version, func.count())
                .where(dl_mirror_status.c.table_id == table_id, dl_mirror_status.c.artifact == "json")
                .group_by(dl_mirror_status.c.version)
            ).all()
        )
    assert [c.version for c in commits] == list(range(latest + 1))
    active: set[tuple[str, str]] = set()
    for c in commits:
        data = store.commit_bytes(table_id, c.version)
        assert (hashlib.sha256(data).hexdigest(), len(data)) == (c.sha256, c.size_bytes), c.version
        assert actions.get(c.version) == c.action_count == len(data.splitlines()), c.version
        assert status.get(c.version) == 1, c.version
        for line in data.splitlines():
            ((kind, body),) = json.loads(line).items()
            key = (body.get("path"), (body.get("deletionVector") or {}).get("pathOrInlineDv", ""))
            if kind == "remove":
                active.remove(key)
            elif kind == "add":
                active.add(key)
    assert {f.path for f in store.active_files(table_id, latest)} == {p for p, _ in active}
    assert store.count_active_files(table_id, latest) == len(active)
    return latest


def start_table(store: SqlStore, location: str) -> int:
    store.create_table("t", location)
    store.commit("t", [protocol(), metadata(), add("a.parquet"), add("shared-0.parquet")])
    return store.get_table("t").id


def test_8_writers_racing_merges_native_and_verbatim_get_one_winner_per_version(
    store: SqlStore, store_url: str, location: str
) -> None:
    """Each round all 8 writers (half native, half verbatim, each its own store, as separate
    processes would be) replace the same shared file at the same version: one wins, 7 conflict."""
    table_id = start_table(store, location)
    rounds = 8

    def writer(w: int, barrier: threading.Barrier) -> list[str]:
        outcomes = []
        with closing(SqlStore(store_url)) as s:
            for r in range(rounds):
                merge = [
                    remove(f"shared-{r}.parquet"),
                    add(f"shared-{r + 1}.parquet"),
                    add(f"w{w}-r{r}.parquet"),
                ]
                barrier.wait()
                try:
                    if w % 2:
                        s.commit_verbatim(location, r + 1, spark_file(*merge))
                    else:
                        s.commit("t", merge, expected_version=r + 1)
                    outcomes.append("won")
                except CommitConflictError as exc:
                    assert (exc.table, exc.version) == ("t", r + 1)
                    outcomes.append("conflict")
        return outcomes

    by_writer = race(WRITERS, writer, seconds=120)
    for r in range(rounds):
        assert sorted(by_writer[w][r] for w in range(WRITERS)) == ["conflict"] * (WRITERS - 1) + ["won"], r
    assert check_whole(store, table_id) == rounds
    winners = {
        f"w{w}-r{r}.parquet" for w in range(WRITERS) for r in range(rounds) if by_writer[w][r] == "won"
    }
    assert {f.path for f in store.active_files(table_id, rounds)} == winners | {
        "a.parquet",
        f"shared-{rounds}.parquet",
    }


def test_8_writers_replacing_their_own_files_without_an_expected_version_all_land(
    store: SqlStore, store_url: str, location: str
) -> None:
    """Removes and appends racing for the next version: every commit lands once, contiguously."""
    table_id = start_table(store, location)
    each = 5

    def writer(w: int, barrier: threading.Barrier) -> list[int]:
        landed = []
        with closing(SqlStore(store_url)) as s:
            barrier.wait()
            landed.append(s.commit("t", [add(f"w{w}-0.parquet")]))
            for i in range(1, each):
                landed.append(s.commit("t", [remove(f"w{w}-{i - 1}.parquet"), add(f"w{w}-{i}.parquet")]))
        return landed

    landed = sorted(v for vs in race(WRITERS, writer, seconds=180) for v in vs)
    assert landed == list(range(1, WRITERS * each + 1))
    assert check_whole(store, table_id) == WRITERS * each
    assert {f.path for f in store.active_files(table_id, WRITERS * each)} == {
        f"w{w}-{each - 1}.parquet" for w in range(WRITERS)
    } | {"a.parquet", "shared-0.parquet"}


# A writer process: commits forever, native (no expected version) and verbatim (the next version it
# reads), each commit removing the writer's own last file and adding the next one ("merges": on
# PostgreSQL the full one-statement COMMIT) or only adding one ("appends": pg_commit.APPEND).
_WRITER = textwrap.dedent(
    """
    import json, sys
    from delta_mirror.errors import CommitConflictError, InvalidActionError, TransientError
    from delta_mirror.store import SqlStore

    url, location, w, kind = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
    store = SqlStore(url)
    table = store.get_table("t")
    i = 0
    print("ready", flush=True)
    while True:
        mine = sorted(f.path for f in store.active_files(table.id, store.latest_version(table.id))
                      if f.path.startswith(f"w{w}-"))
        i += 1
        new = f"w{w}-{i}-{len(mine)}-{id(mine)}.parquet"
        actions = [("remove", {"path": p, "deletionTimestamp": 2, "dataChange": True}) for p in mine[:1 if kind == "merges" else 0]]
        actions.append(("add", {"path": new, "partitionValues": {}, "size": 1, "modificationTime": 1,
                                "dataChange": True}))
        try:
            if i % 2:
                store.commit("t", actions)
            else:
                data = "".join(json.dumps({k: b}) + "\\n" for k, b in
                               [("commitInfo", {"operation": "MERGE"}), *actions]).encode()
                store.commit_verbatim(location, store.latest_version(table.id) + 1, data)
        except (CommitConflictError, InvalidActionError):
            pass  # another writer (or this one's killed predecessor, still landing) got there first
        except TransientError:
            pass  # retried, as clients do: on MySQL a deadlock victim among racers of one version
    """
)


@pytest.mark.all_backends(but="duckdb")  # writer processes: a DuckDB file takes one (test_duckdb_store.py)
@pytest.mark.parametrize("kind", ["merges", "appends"])
def test_writers_sigkilled_mid_commit_leave_contiguous_whole_versions(
    store: SqlStore, store_url: str, location: str, kind: str
) -> None:
    """Three writer processes commit merges (or appends) as fast as they can; one of them is SIGKILLed every
    fraction of a second (mid-commit, mostly: they do nothing else) and restarted."""
    table_id = start_table(store, location)
    rng = random.Random(31)

    def spawn(w: int) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            [sys.executable, "-c", _WRITER, store_url, location, str(w), kind],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        return proc

    procs = [spawn(w) for w in range(3)]
    try:
        kills = 0
        for _ in range(10):
            time.sleep(rng.uniform(0.2, 0.6))
            w = rng.randrange(3)
            procs[w].send_signal(signal.SIGKILL)
            assert procs[w].wait(30) == -signal.SIGKILL
            kills += 1
            procs[w] = spawn(w)
        time.sleep(0.5)
    finally:
        for p in procs:
            p.kill()
            p.wait(30)
    latest = check_whole(store, table_id)
    assert kills == 10 and latest > 10


@pytest.mark.postgres
def test_a_writer_sigkilled_while_its_statement_waits_lands_whole_or_not_at_all(
    pg_store_url: str, location: str
) -> None:
    """The writer's one statement waits on another transaction's hold of the version's key when the
    writer dies: the server finishes the statement on its own, so the version lands whole."""
    with closing(SqlStore(pg_store_url)) as store:
        store.init()
        table_id = start_table(store, location)
        child = textwrap.dedent(
            """
            import sys
            from delta_mirror.store import SqlStore
            store = SqlStore(sys.argv[1])
            store.commit("t", [("add", {"path": "b.parquet", "partitionValues": {}, "size": 1,
                                        "modificationTime": 1, "dataChange": True})])
            print("remembered", flush=True)
            sys.stdin.readline()
            store.commit("t", [("remove", {"path": "a.parquet", "deletionTimestamp": 2, "dataChange": True}),
                               ("add", {"path": "c.parquet", "partitionValues": {}, "size": 1,
                                        "modificationTime": 1, "dataChange": True})])
            print("committed", flush=True)
            """
        )
        proc = subprocess.Popen(
            [sys.executable, "-c", child, pg_store_url],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert proc.stdout is not None and proc.stdout.readline().strip() == "remembered"
            with closing(SqlStore(pg_store_url)) as other, other.engine.connect() as hold:
                hold.execute(
                    dl_commits.insert().values(
                        table_id=table_id, version=2, committed_at=1, action_count=0, size_bytes=0, sha256=""
                    )
                )  # uncommitted: the writer's claim of version 2 waits for it
                assert proc.stdin is not None
                proc.stdin.write("go\n")
                proc.stdin.flush()
                with other.engine.connect() as probe:
                    wait_until(
                        lambda: bool(
                            probe.execute(text("SELECT count(*) FROM pg_locks WHERE NOT granted")).scalar()
                        ),
                        30,
                        "the writer's statement waiting on the held key",
                    )
                proc.send_signal(signal.SIGKILL)
                assert proc.wait(30) == -signal.SIGKILL
                hold.rollback()
            wait_until(
                lambda: store.latest_version(table_id) == 2, 30, "the dead writer's statement finishing"
            )
        finally:
            proc.kill()
            proc.wait(30)
        assert check_whole(store, table_id) == 2
        assert {f.path for f in store.active_files(table_id, 2)} == {
            "shared-0.parquet",
            "b.parquet",
            "c.parquet",
        }
