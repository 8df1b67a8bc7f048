"""Which one-statement commit PostgreSQL runs: ``pg_commit.APPEND`` for a commit that removes nothing
and checks no protocol, ``pg_commit.COMMIT`` otherwise; both write what the transaction path writes."""

from __future__ import annotations

from contextlib import closing
from pathlib import Path

import pytest
from store.store_kit import Action, add, metadata, protocol, remove, spark_file, store_rows

from delta_mirror.errors import TableHaltedError
from delta_mirror.store import SqlStore, pg_commit

pytestmark = pytest.mark.postgres


@pytest.fixture
def statements(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The statements the commits ran, by name (``APPEND`` / ``COMMIT``), in order."""
    picked: list[str] = []
    pick = pg_commit.statement

    def spy(params: dict[str, object]) -> str:
        sql = pick(params)
        picked.append("APPEND" if sql == pg_commit.APPEND else "COMMIT")
        return sql

    monkeypatch.setattr(pg_commit, "statement", spy)
    return picked


def info(n: int) -> Action:
    return ("commitInfo", {"timestamp": 1700000000000 + n, "operation": "WRITE", "operationParameters": {}})


def history() -> list[list[Action]]:
    """Appends that re-add active files (each supersedes the file's entry), between a MERGE and a
    protocol change (which take the full statement)."""
    return [
        [info(0), protocol(), metadata(), add("a.parquet"), add("b.parquet")],
        [info(1), add("c.parquet")],
        [info(2), add("a.parquet", size=7)],  # re-add of an active file: supersedes it
        [info(3), add("b.parquet", size=8), add("d.parquet")],
        [info(4), remove("c.parquet"), add("e.parquet")],
        [info(5), protocol(minWriterVersion=3)],
        [info(6), add("a.parquet", size=10)],
    ]


def test_native_appends_take_the_append_statement_and_write_the_transaction_paths_rows(
    pg_store: SqlStore, pg_store_url: str, tmp_path: Path, statements: list[str]
) -> None:
    pg_store.create_table("known", (tmp_path / "known").as_uri())
    pg_store.create_table("fresh", (tmp_path / "fresh").as_uri())
    for version, actions in enumerate(history()):
        assert pg_store.commit("known", actions) == version
        with closing(SqlStore(pg_store_url)) as other:  # a store that never saw the table
            assert other.commit("fresh", actions) == version
    assert statements[:6] == ["APPEND", "APPEND", "APPEND", "COMMIT", "COMMIT", "APPEND"], statements
    a, b = pg_store.get_table("known"), pg_store.get_table("fresh")
    assert store_rows(pg_store, a.id) == store_rows(pg_store, b.id)
    for version in range(len(history())):
        assert pg_store.commit_bytes(a.id, version) == pg_store.commit_bytes(b.id, version)


def test_verbatim_appends_take_the_append_statement_and_write_the_transaction_paths_rows(
    pg_store: SqlStore, pg_store_url: str, tmp_path: Path, statements: list[str]
) -> None:
    known, fresh = (tmp_path / "known").as_uri(), (tmp_path / "fresh").as_uri()
    files = [spark_file(*actions[1:], commit_info=actions[0][1]) for actions in history()]
    for version, data in enumerate(files):
        pg_store.commit_verbatim(known, version, data, create_name="known")
        with closing(SqlStore(pg_store_url)) as other:  # a store that never saw the table
            other.commit_verbatim(fresh, version, data, create_name="fresh")
    assert statements == ["APPEND", "APPEND", "APPEND", "COMMIT", "COMMIT", "APPEND"], statements
    a, b = pg_store.table_at(known), pg_store.table_at(fresh)
    assert store_rows(pg_store, a.id) == store_rows(pg_store, b.id)
    for version, data in enumerate(files):
        assert pg_store.commit_bytes(a.id, version) == data


def test_an_append_to_a_table_halted_meanwhile_claims_nothing_in_the_append_statement(
    pg_store: SqlStore, tmp_path: Path, statements: list[str]
) -> None:
    root = (tmp_path / "t").as_uri()
    pg_store.commit_verbatim(root, 0, spark_file(protocol(), metadata(), add("a.parquet")), create_name="t")
    pg_store.commit_verbatim(root, 1, spark_file(add("b.parquet")))
    with closing(SqlStore(pg_store.url)) as other:
        other.halt_table(other.table_at(root).id, "halted by the test", None)
    with pytest.raises(TableHaltedError):
        pg_store.commit_verbatim(root, 2, spark_file(add("c.parquet")))
    assert statements == ["APPEND", "APPEND"]  # the second claimed nothing; the transaction path refused
