"""``SqlStore.importing``: an import's writes in one transaction the store opens and owns.

The import job hands the store what it read; the store commits the table, its versions and its
checkpoint layout together when the block ends, and keeps nothing when the block fails.
"""

from __future__ import annotations

import json

import pytest
from store.store_kit import add, metadata, protocol, versions

from delta_mirror.delta.line_facts import facts_of_lines
from delta_mirror.errors import TableExistsError
from delta_mirror.store import SqlStore


def _lines(*actions: tuple[str, dict[str, object]]) -> list[str]:
    return [json.dumps({kind: body}) for kind, body in actions]


def test_an_import_commits_the_table_its_versions_and_its_checkpoint_layout_together(
    store: SqlStore, location: str
) -> None:
    v0 = _lines(protocol(), metadata(), add("a.parquet"))
    v1 = _lines(add("b.parquet"))
    with store.importing("t", location, settings={"imported_from": location}) as imp:
        imp.put(0, v0, facts_of_lines(v0, version=0))
        imp.put(1, v1, facts_of_lines(v1, version=1))
        imp.finish()
        imp.checkpoint_layout("multipart", 7)
    table = store.get_table("t")
    assert table.id == imp.table.id and table.settings == {"imported_from": location}
    assert (table.checkpoint_kind, table.checkpoint_part_size) == ("multipart", 7)
    assert versions(store, table.id) == [0, 1]
    assert sorted(f.path for f in store.active_files(table.id, 1)) == ["a.parquet", "b.parquet"]


def test_an_import_that_fails_midway_leaves_no_table_behind(store: SqlStore, location: str) -> None:
    v0 = _lines(protocol(), metadata(), add("a.parquet"))
    with pytest.raises(RuntimeError, match="the source went away"), store.importing("t", location) as imp:
        imp.put(0, v0, facts_of_lines(v0, version=0))
        imp.finish()
        raise RuntimeError("the source went away")
    assert store.list_tables() == []


@pytest.mark.timeout(120)  # a rollback on a connection still in COPY would wait for ever
def test_an_import_failing_while_its_last_rows_are_still_being_stored_keeps_nothing(
    store: SqlStore, location: str
) -> None:
    """On PostgreSQL a COPY stays open after its rows are written (the server stores them while
    the next rows are made); a failure then ends it as failed: the caller's error is the one
    raised, nothing is kept, and the store's connections stay usable (a second import succeeds)."""
    v0 = _lines(protocol(), metadata(), *(add(f"{i}.parquet") for i in range(50)))
    facts = facts_of_lines(v0, version=0)
    with pytest.raises(RuntimeError, match="the source went away"), store.importing("t", location) as imp:
        imp.lines(0, 0, facts.kinds, v0, at_once=True, files=[f for f in facts.files if f[1] == "add"])
        raise RuntimeError("the source went away")
    assert store.list_tables() == []
    with store.importing("t", location) as imp:
        imp.lines(0, 0, facts.kinds, v0, at_once=True, files=[f for f in facts.files if f[1] == "add"])
        imp.put(0, v0, facts, lines_sent=len(v0))
        imp.finish()
    assert len(store.active_files(store.get_table("t").id, 0)) == 50


def test_an_import_under_a_taken_name_is_refused_before_anything_is_written(
    store: SqlStore, location: str
) -> None:
    store.create_table("t", location)
    with pytest.raises(TableExistsError), store.importing("t", location + "-other"):
        pytest.fail("the block must not run")
    assert [t.location for t in store.list_tables()] == [location]
