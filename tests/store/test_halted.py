"""A halted table takes no commits until ``delta-mirror resume``: native, verbatim and import alike
refuse with ``TableHaltedError`` (the one type the commit service maps to 423), and change nothing;
the publisher refuses it with the same error (``tables.refuse_if_halted``)."""

from __future__ import annotations

import json

import pytest
from store.store_kit import add, new_table, spark_file, state

from delta_mirror.delta.line_facts import facts_of_lines
from delta_mirror.errors import TableHaltedError
from delta_mirror.store import SqlStore
from delta_mirror.store.bulk_load import BulkImport

REASON = "a foreign commit at version 1"


def _halted(store: SqlStore, location: str) -> int:
    table_id = new_table(store, location)
    store.halt_table(table_id, REASON, 1)
    return table_id


def _refused(info: pytest.ExceptionInfo[TableHaltedError]) -> None:
    assert f"halted at version 1: {REASON}" in info.value.message
    assert "delta-mirror resume t" in info.value.message


def test_a_native_commit_to_a_halted_table_is_refused_and_changes_nothing(
    store: SqlStore, location: str
) -> None:
    _halted(store, location)
    before = state(store)
    for expected in (None, 1):
        with pytest.raises(TableHaltedError) as info:
            store.commit("t", [add("b.parquet")], expected_version=expected)
        _refused(info)
        assert info.value.version == 1
    assert state(store) == before


def test_a_resumed_table_takes_native_commits_again(store: SqlStore, location: str) -> None:
    table_id = _halted(store, location)
    store.resume_table(table_id)
    assert store.commit("t", [add("b.parquet")]) == 1


def test_a_verbatim_commit_to_a_halted_table_is_refused_with_the_same_error(
    store: SqlStore, location: str
) -> None:
    _halted(store, location)
    before = state(store)
    with pytest.raises(TableHaltedError) as info:
        store.commit_verbatim(location, 1, spark_file(add("b.parquet")))
    _refused(info)
    assert state(store) == before


def test_an_imported_version_into_a_halted_table_is_refused_with_the_same_error(
    store: SqlStore, location: str
) -> None:
    table_id = _halted(store, location)
    table = store.get_table("t")
    line = json.dumps({"add": add("b.parquet")[1]})
    before = state(store)
    with pytest.raises(TableHaltedError) as info, store.engine.begin() as conn:
        store._import_version(conn, table, 1, [add("b.parquet")], [line])
    _refused(info)
    with pytest.raises(TableHaltedError) as bulk, store.engine.begin() as conn:
        BulkImport(conn, table_id).version(1, [line], facts_of_lines([line], version=1))
    _refused(bulk)
    assert state(store) == before


def test_publishing_a_halted_table_is_refused_with_the_same_error(store: SqlStore, location: str) -> None:
    from delta_mirror.jobs.publisher import Publisher

    _halted(store, location)
    before = state(store)
    with pytest.raises(TableHaltedError) as info:
        Publisher(store).publish("t")
    _refused(info)
    assert info.value.version == 1
    assert state(store) == before
