"""Tables in the store: unknown and duplicate tables, valid names, creation with a first commit."""

from __future__ import annotations

import pytest
from store.store_kit import add, metadata, new_table, protocol, state

from delta_mirror.errors import InvalidActionError, PermanentError, TableExistsError, TableNotFoundError
from delta_mirror.store import SqlStore


def test_committing_to_an_unknown_table_is_refused(store: SqlStore) -> None:
    with pytest.raises(TableNotFoundError, match="no table named 'nope'"):
        store.commit("nope", [add("a")])


def test_creating_a_table_twice_is_refused(store: SqlStore, location: str) -> None:
    new_table(store, location)
    before = state(store)
    with pytest.raises(TableExistsError):
        store.create_table("t", location)
    assert state(store) == before


def test_commit_with_a_location_creates_the_table_in_the_same_transaction(
    store: SqlStore, location: str
) -> None:
    before = state(store)
    with pytest.raises(InvalidActionError):
        store.commit("t", [protocol(), metadata(), add("../escape")], location=location)
    assert state(store) == before, "a refused first commit must not leave an empty table behind"
    assert store.commit("t", [protocol(), metadata(), add("a")], location=location) == 0
    assert store.get_table("t").location == location
    assert store.commit("t", [add("b")], location=location) == 1


def test_a_commit_names_its_tables_location_in_any_spelling_of_it(store: SqlStore, location: str) -> None:
    """``location`` is compared as the store keeps it (one normaliser): Hadoop's ``file:/x``, a
    trailing ``/`` are the same root; another root is refused in one line and writes nothing."""
    assert store.commit("t", [protocol(), metadata(), add("a")], location=location + "/") == 0
    assert store.get_table("t").location == location
    hadoop = location.replace("file:///", "file:/")
    assert store.commit("t", [add("b")], location=hadoop) == 1
    assert store.commit("t", [add("c")], location=location + "/") == 2
    before = state(store)
    with pytest.raises(PermanentError, match=r"the table is at .*, not .*elsewhere"):
        store.commit("t", [add("d")], location=location + "-elsewhere")
    assert state(store) == before


@pytest.mark.parametrize(
    "name",
    ["x'; drop table dl_tables;--", 'a"b', "", "a b", "../x", "t\n", "x" * 200, "-lead", "tab\tle", "é"],
)
def test_invalid_table_names_are_refused_and_the_store_stays_intact(
    store: SqlStore, location: str, name: str
) -> None:
    new_table(store, location)
    before = state(store)
    for call in (
        lambda: store.create_table(name, location),
        lambda: store.get_table(name),
        lambda: store.commit(name, [protocol(), metadata()], location=location),
    ):
        with pytest.raises(PermanentError, match="invalid table name"):
            call()
    assert state(store) == before
    assert [t.name for t in store.list_tables()] == ["t"]
