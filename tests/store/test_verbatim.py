"""Verbatim commits: a writer's exact commit file (Delta-Spark through the commit service)."""

from __future__ import annotations

import hashlib
import threading
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select
from store.store_kit import add, metadata, protocol, remove, spark_file, state, v0_file
from support.race import race, won_or_refused

from delta_mirror.errors import (
    CommitConflictError,
    CommitTooLargeError,
    DataError,
    InvalidActionError,
    TableHaltedError,
    TableNotFoundError,
)
from delta_mirror.store import SqlStore
from delta_mirror.store.schema import dl_commits
from delta_mirror.store.sql_store import CommitResult, default_table_name


def test_a_verbatim_commit_keeps_the_writers_bytes_and_waits_for_the_publisher(
    store: SqlStore, location: str
) -> None:
    data0, data1 = v0_file(), spark_file(add("b.parquet"), remove("a.parquet"))
    first = store.commit_verbatim(location, 0, data0, create_name="sales")
    second = store.commit_verbatim(location, 1, data1)
    assert (first.table, first.version, first.existing) == ("sales", 0, False)
    assert (second.version, second.sha256, second.size) == (1, hashlib.sha256(data1).hexdigest(), len(data1))
    table = store.table_at(location)
    assert store.commit_bytes(table.id, 0) == data0 and store.commit_bytes(table.id, 1) == data1
    rows = store.commit_rows(table.id, 0, 1)
    assert [(r.source, r.sha256, r.size_bytes) for r in rows] == [
        ("spark", hashlib.sha256(d).hexdigest(), len(d)) for d in (data0, data1)
    ]
    assert [(s.version, s.state) for s in store.status_rows(table.id, artifact="json")] == [
        (0, "PENDING"),
        (1, "PENDING"),
    ]
    assert {f.path for f in store.active_files(table.id, 1)} == {"b.parquet"}


def test_a_verbatim_commit_records_its_in_commit_timestamp(store: SqlStore, location: str) -> None:
    info = {"inCommitTimestamp": 1700000000123, "timestamp": 1700000000100, "operation": "WRITE"}
    store.commit_verbatim(location, 0, v0_file(), create_name="t")
    store.commit_verbatim(location, 1, spark_file(add("b.parquet"), commit_info=info))
    with store.engine.connect() as conn:
        ict = conn.execute(select(dl_commits.c.in_commit_timestamp).where(dl_commits.c.version == 1)).scalar()
    assert ict == 1700000000123


def test_a_verbatim_retry_of_the_same_bytes_is_the_existing_commit_and_other_bytes_conflict(
    store: SqlStore, location: str
) -> None:
    store.commit_verbatim(location, 0, v0_file(), create_name="t")
    data = spark_file(add("b.parquet"))
    done = store.commit_verbatim(location, 1, data)
    before = state(store)
    again = store.commit_verbatim(location, 1, data)
    assert again == CommitResult("t", 1, done.sha256, done.size, existing=True)
    with pytest.raises(CommitConflictError) as info:
        store.commit_verbatim(location, 1, spark_file(add("c.parquet")))
    assert (info.value.table, info.value.version) == ("t", 1)
    assert state(store) == before


def test_a_verbatim_version_gap_points_at_a_writer_outside_the_authority(
    store: SqlStore, location: str
) -> None:
    store.commit_verbatim(location, 0, v0_file(), create_name="t")
    before = state(store)
    with pytest.raises(
        DataError, match=r"_delta_log/00000000000000000002\.json outside the authority"
    ) as info:
        store.commit_verbatim(location, 3, spark_file(add("b.parquet")))
    assert "delta-mirror reconcile t --strategy full" in info.value.message
    assert state(store) == before


def test_a_halted_table_refuses_verbatim_commits(store: SqlStore, location: str) -> None:
    store.commit_verbatim(location, 0, v0_file(), create_name="t")
    table = store.table_at(location)
    store.halt_table(table.id, "a foreign commit at version 1", 1)
    before = state(store)
    with pytest.raises(TableHaltedError, match="halted at version 1: a foreign commit") as info:
        store.commit_verbatim(location, 1, spark_file(add("b.parquet")))
    assert "delta-mirror resume t" in info.value.message
    assert state(store) == before


def test_version_0_of_an_unknown_root_creates_the_table_named_after_its_root(
    store: SqlStore, tmp_path: Path
) -> None:
    first, second = (tmp_path / "a" / "sales").as_uri(), (tmp_path / "b" / "sales").as_uri()
    assert store.commit_verbatim(first, 0, v0_file(), create_name="sales").table == "sales"
    taken = store.commit_verbatim(second, 0, v0_file(), create_name="sales")
    assert taken.table == "sales-" + hashlib.sha256(second.encode()).hexdigest()[:8]
    assert store.get_table(taken.table).location == second
    assert default_table_name("s3://lake/warehouse/Sales Data%20x/") == "Sales_Data_x"


def test_an_unknown_root_is_not_created_past_version_0_or_without_a_name(
    store: SqlStore, location: str
) -> None:
    with pytest.raises(TableNotFoundError) as info:
        store.commit_verbatim(location, 1, spark_file(add("b.parquet")), create_name="t")
    assert info.value.version == 1
    with pytest.raises(TableNotFoundError):
        store.commit_verbatim(location, 0, v0_file())
    assert state(store)["counts"]["dl_tables"] == 0


VERBATIM_REFUSALS = [
    ("no trailing newline", lambda: v0_file()[:-1], InvalidActionError, "does not end with a newline"),
    ("a blank line", lambda: v0_file() + b"\n", InvalidActionError, "line 5 is blank"),
    ("not UTF-8", lambda: v0_file() + b'{"add":"\xff"}\n', InvalidActionError, "not valid UTF-8"),
    ("malformed JSON", lambda: v0_file() + b'{"add":\n', InvalidActionError, "malformed JSON"),
    ("no metaData in version 0", lambda: spark_file(protocol()), InvalidActionError, "needs a 'metaData'"),
    (
        "catalogManaged",
        lambda: spark_file(
            protocol(
                minReaderVersion=3,
                minWriterVersion=7,
                readerFeatures=["catalogManaged"],
                writerFeatures=["catalogManaged"],
            ),
            metadata(),
        ),
        InvalidActionError,
        "'catalogManaged' is not allowed",
    ),
    (
        "coordinated commits",
        lambda: spark_file(
            protocol(), metadata(**{"delta.coordinatedCommits.commitCoordinator-preview": "x"})
        ),
        InvalidActionError,
        "delta.coordinatedCommits",
    ),
    (
        "a path outside the root",
        lambda: spark_file(protocol(), metadata(), add("../x.parquet")),
        InvalidActionError,
        "escapes the table root",
    ),
    (
        "a remove of no active file",
        lambda: spark_file(protocol(), metadata(), remove("nope.parquet")),
        InvalidActionError,
        "not an active file",
    ),
]


@pytest.mark.parametrize(
    ("case", "make", "error", "message"), VERBATIM_REFUSALS, ids=[c[0] for c in VERBATIM_REFUSALS]
)
def test_a_verbatim_commit_obeys_the_native_rules_and_a_refusal_changes_nothing(
    store: SqlStore, location: str, case: str, make: Any, error: type[Exception], message: str
) -> None:
    before = state(store)
    with pytest.raises(error, match=message):
        store.commit_verbatim(location, 0, make(), create_name="t")
    assert state(store) == before


def test_verbatim_commits_refuse_a_protocol_downgrade_and_the_size_limits(
    store: SqlStore, location: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    store.commit_verbatim(location, 0, spark_file(protocol(minWriterVersion=4), metadata()), create_name="t")
    before = state(store)
    with pytest.raises(InvalidActionError, match="protocol downgrade"):
        store.commit_verbatim(location, 1, spark_file(protocol()))
    monkeypatch.setenv("DELTA_MIRROR_MAX_COMMIT_BYTES", "200")
    with pytest.raises(CommitTooLargeError, match="more than the limit of 200"):
        store.commit_verbatim(location, 1, spark_file(add("b.parquet"), add("c.parquet")))
    monkeypatch.setenv("DELTA_MIRROR_MAX_COMMIT_BYTES", "100000")
    monkeypatch.setenv("DELTA_MIRROR_MAX_COMMIT_ACTIONS", "2")
    with pytest.raises(CommitTooLargeError, match="3 actions, more than the limit of 2"):
        store.commit_verbatim(location, 1, spark_file(add("b.parquet"), add("c.parquet")))
    assert state(store) == before


def test_racing_verbatim_writers_of_one_version_get_exactly_one_winner(
    store: SqlStore, store_url: str, location: str
) -> None:
    store.commit_verbatim(location, 0, v0_file(), create_name="t")
    writers = 6

    def writer(w: int, barrier: threading.Barrier) -> str:
        with closing(SqlStore(store_url)) as s:
            barrier.wait()
            return won_or_refused(
                lambda: s.commit_verbatim(location, 1, spark_file(add(f"w{w}.parquet"))), CommitConflictError
            )

    outcomes = race(writers, writer)
    assert sorted(outcomes) == ["refused"] * (writers - 1) + ["won"]
    table = store.table_at(location)
    assert store.commit_bytes(table.id, 1) == spark_file(add(f"w{outcomes.index('won')}.parquet"))


# Commits in the corpus that Delta-Spark did not write through LogStore.write, refused on purpose.
CORPUS_REFUSALS = {
    "delta-rs/delta-live-table": "does not end with a newline",  # Databricks DLT, no LogStore
    "delta-rs/simple_table_features": "readerFeatures is only allowed",  # a deliberately invalid log
    "kernel-rs/table-with-cdf": "not an active file",  # v2 "Manual Update": removes of fake paths
    "kernel-rs/uc-catalog_managed_0": "'catalogManaged' is not allowed",
}


def test_every_commit_delta_spark_wrote_in_the_corpus_commits_verbatim(
    corpus_dir: Path, tmp_path: Path
) -> None:
    """Replay each Spark/Databricks-written table's JSON commits through ``commit_verbatim``."""
    import csv
    import re

    from delta_mirror.errors import MirrorError

    store = SqlStore(f"sqlite:///{tmp_path / 'store.db'}")
    store.init()
    with (corpus_dir / "INDEX.tsv").open(encoding="utf-8") as f:
        rows = [
            r for r in csv.DictReader(f, delimiter="\t") if r["writer"].startswith(("Spark", "Databricks"))
        ]
    replayed, refused = 0, {}
    for row in rows:
        root = corpus_dir / row["path"]
        commits = sorted(
            p for p in (root / "_delta_log").glob("*.json") if re.fullmatch(r"\d{20}\.json", p.name)
        )
        if not commits or commits[0].name != f"{0:020d}.json":
            continue  # early commits cleaned up: such a table is imported, not replayed
        location = root.resolve().as_uri()
        for path in commits:
            try:
                result = store.commit_verbatim(
                    location, int(path.name[:20]), path.read_bytes(), create_name="t"
                )
            except MirrorError as exc:
                refused[row["path"]] = exc.message
                break
            assert store.commit_bytes(store.get_table(result.table).id, result.version) == path.read_bytes()
            replayed += 1
    assert {p: m for p, m in refused.items() if p not in CORPUS_REFUSALS} == {}
    for refused_path, message in refused.items():
        assert CORPUS_REFUSALS[refused_path] in message, (refused_path, message)
    assert replayed >= 300, replayed
    store.close()
