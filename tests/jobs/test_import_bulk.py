"""The bulk import (``store.bulk_load``) stores exactly the rows the version-by-version import did.

``_reference_import`` is the importer as it was before the bulk path: ``SqlStore._import_version``
for every version and the row-by-row recording of a source checkpoint's state. Both import the
same generated logs (orphan tombstones, re-adds, duplicate adds and removes, deletion vectors,
escapes, unknown actions, a source checkpoint that disagrees with the JSON, a log that starts at
a checkpoint, in place and not) into fresh stores (SQLite and PostgreSQL); every row of every
table must be equal, ``dl_files.id`` included, timestamps aside.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable
from sqlalchemy import bindparam, insert, select, text, update
from support import builders

from delta_mirror.delta import commit_lines, parse_process
from delta_mirror.delta.actions import line_action
from delta_mirror.delta.source_log import read_source_log
from delta_mirror.delta.source_state import CheckpointState
from delta_mirror.errors import DataError
from delta_mirror.jobs import importer
from delta_mirror.jobs.importer import import_table
from delta_mirror.storage import normalize_location, open_store
from delta_mirror.store import SqlStore, bulk_load
from delta_mirror.store.bulk_load import FileIndex
from delta_mirror.store.schema import PART_SNAPSHOT, dl_files, dl_mirror_status
from delta_mirror.store.source_import import CHECKPOINT_STATE_SETTING
from delta_mirror.store.sql_store import TableInfo

LOG = "_delta_log"
_TIMES = {"committed_at", "enqueued_at", "finished_at", "created_at", "imported_at"}


# ------------------------------------------------------------------------------------------------
# The reference: the importer's store writes before the bulk path (row by row)


def _parse(lines: list[str]) -> list[Any]:
    return [line_action(json.loads(line)) for line in lines]


def _record_state(
    store: SqlStore, conn: Any, table: TableInfo, state: CheckpointState, enqueue: bool
) -> None:
    lines = list(state.lines)
    if lines:
        store._import_version(conn, table, state.version, _parse(lines), lines, part=PART_SNAPSHOT)
    if state.dropped_files:
        conn.execute(
            update(dl_files)
            .where(
                dl_files.c.table_id == table.id,
                dl_files.c.path == bindparam("p"),
                dl_files.c.dv_id == bindparam("d"),
                dl_files.c.remove_version.is_(None),
            )
            .values(remove_version=state.version),
            [{"p": p, "d": d} for p, d in state.dropped_files],
        )
    if enqueue:
        exists = conn.execute(
            select(dl_mirror_status.c.state).where(
                dl_mirror_status.c.table_id == table.id,
                dl_mirror_status.c.version == state.version,
                dl_mirror_status.c.artifact == "checkpoint",
            )
        ).first()
        if exists is None:
            conn.execute(
                insert(dl_mirror_status).values(
                    table_id=table.id,
                    version=state.version,
                    artifact="checkpoint",
                    state="PENDING",
                    attempts=0,
                    enqueued_at=1,
                )
            )


def _reference_import(store: SqlStore, source: str, name: str, location: str | None) -> None:
    source_uri = normalize_location(source)
    target = normalize_location(location) if location else source_uri
    in_place = target == source_uri
    src = read_source_log(open_store(source_uri), table=name)
    base = src.base_checkpoint
    disagreements = [d for s in src.checkpoint_states for d in s.disagreements]
    settings: dict[str, object] = {"imported_from": source_uri, "imported_at": 0}
    if disagreements:
        settings[CHECKPOINT_STATE_SETTING] = [d.to_json() for d in disagreements]
    # the store's private row-by-row path, in a transaction of the test's own (the reference)
    with store.engine.begin() as conn:
        table = store._create_table(
            conn,
            name,
            target,
            first_version=src.start_version,
            base_checkpoint_version=base.version if base else None,
            checkpoint_kind=src.checkpoint_kind,
            checkpoint_part_size=importer._part_size(src),
            settings=settings,
        )
        if base is not None:
            store._import_version(
                conn, table, base.version, _parse(base.actions), base.actions, part=PART_SNAPSHOT
            )
            if not src.commits or src.commits[0][0] != base.version:
                store._import_version(conn, table, base.version, [], [], has_json=False, index_files=False)
        states = {s.version: s for s in src.checkpoint_states}
        for version, lines, original in src.commits:
            store._import_version(
                conn,
                table,
                version,
                _parse(lines),
                lines,
                published_sha256=hashlib.sha256(original).hexdigest() if in_place else None,
                published_size=len(original) if in_place else None,
                index_files=not (base is not None and version == base.version),
            )
            if version in states:
                _record_state(store, conn, table, states[version], not in_place)
    if in_place:
        for version in src.checkpoint_versions:
            if version >= src.start_version:
                store.ensure_status(table.id, version, "checkpoint")
                store.mark_succeeded(table.id, "checkpoint", [(version, "", 0)])


# ------------------------------------------------------------------------------------------------
# Generated sources


_SCHEMA = json.dumps(
    {
        "type": "struct",
        "fields": [
            {"name": "id", "type": "long", "nullable": True, "metadata": {}},
            {"name": "p", "type": "string", "nullable": True, "metadata": {}},
        ],
    }
)


def _dv(path: str) -> dict[str, Any]:
    return {
        "storageType": "u",
        "pathOrInlineDv": f"ab{path[:3]}",
        "offset": 1,
        "sizeInBytes": 3,
        "cardinality": 1,
    }


def _write_log(root: Path) -> None:
    """Commits 0..6 with the index's corner cases; a checkpoint at 3; commit 2 edited afterwards so
    that the checkpoint disagrees with the JSON (it lacks a file the JSON adds)."""
    pv = {"p": "a"}
    odd = "dir\\with\ttab\nand\u00e9\u2028/x.parquet"
    commits: list[list[dict[str, Any]]] = [
        [
            {"commitInfo": {"inCommitTimestamp": 1700000000000, "operation": "WRITE"}},
            builders.PROTOCOL,
            builders.action(
                "metaData", builders.metadata_body(schema_string=_SCHEMA, partition_columns=["p"])
            ),
            builders.add("a.parquet", partitionValues=pv),
            builders.add("b.parquet", partitionValues={"p": None}),
            builders.add(odd, partitionValues={"p": 'x\\y"z'}),
            builders.add("dup.parquet", partitionValues=pv),
            builders.add("dup.parquet", partitionValues=pv),  # twice in one commit: two rows
        ],
        [
            builders.remove("never-added.parquet", deletionTimestamp=5),  # tombstone row
            builders.remove("never-added.parquet", deletionTimestamp=6),  # ... twice
            builders.remove("a.parquet", deletionTimestamp=7),
            builders.add("a.parquet", partitionValues=pv, size=9),  # re-added in the same commit
            builders.add("b.parquet", partitionValues={"p": None}, size=3),  # supersedes
            builders.add("dv.parquet", partitionValues=pv, deletionVector=_dv("dv")),
            {"someFutureAction": {"x": 1}},
            {"add": builders.add_body("u.parquet", partitionValues=pv), "unknownBeside": [1, 2.5]},
            {"zFirst": 0, "add": builders.add_body("z.parquet", partitionValues=pv)},  # not led by its type
        ],
        [
            builders.remove("dup.parquet"),  # closes both rows (two rows for one remove) ...
            builders.remove("gone.parquet"),  # ... so this never-added key gets no tombstone
            builders.remove("dv.parquet"),  # no such key without the deletion vector: a tombstone
            builders.add("c.parquet", partitionValues=pv, stats='{"numRecords":1}'),
        ],
        [builders.add("d.parquet", partitionValues=pv, size="12")],
        [
            builders.remove("dv.parquet", deletionVector=_dv("dv")),
            builders.add("e.parquet", partitionValues={"p": "b"}, tags={"k": "v"}),
            builders.add("f.parquet", partitionValues=pv),  # three lines: two early, one after
        ],
        [builders.add("c.parquet", partitionValues=pv, size=10)],
        [{"txn": {"appId": "app", "version": 3}}, builders.remove("e.parquet")],
        [  # adds only: in chunks of two lines, the file rows of the first four are made early
            {"commitInfo": {"operation": "WRITE"}},
            builders.add("g.parquet", partitionValues=pv),
            builders.add("h.parquet", partitionValues=pv),
            builders.add("c.parquet", partitionValues=pv, size=11),  # supersedes version 5's
            builders.add("g.parquet", partitionValues=pv),  # twice in one commit: two rows
        ],
        [builders.remove("g.parquet")],  # closes both rows, sent open early: updated at the end
        [  # adds only, but a \u escape: no early rows (a remove could hide behind one)
            builders.add("j\u00e9.parquet", partitionValues=pv),
            builders.add("k.parquet", partitionValues=pv),
            builders.add("l.parquet", partitionValues=pv),
        ],
    ]
    # The checkpoint at 3 is written by deltalake over plain commits, which are then replaced:
    # it lists a file the JSON never adds and lacks most of the JSON's.
    plain = [[builders.add(f"plain-{v}.parquet", partitionValues=pv)] for v in range(4)]
    builders.write_commit(root, 0, [*commits[0][1:3], *plain[0]])
    for version in range(1, 4):
        builders.write_commit(root, version, plain[version])
    DeltaTable(str(root)).create_checkpoint()
    for version, actions in enumerate(commits):
        builders.write_commit(root, version, actions)
    # Spaces and escapes that only the canonical form drops.
    path = root / LOG / f"{2:020d}.json"
    extra = '{"add": {"path": "only-json.parquet", "partitionValues": {"p": "a"}, "size": 1, "modificationTime": 1, "dataChange": true, "x": "\\u00e9\\/"}}\n'
    path.write_text(path.read_text() + extra)


def _sources(tmp_path: Path) -> dict[str, Path]:
    full = tmp_path / "full"
    _write_log(full)
    from_checkpoint = tmp_path / "from-checkpoint"  # commits 0..2 cleaned up: starts at checkpoint 3
    shutil.copytree(full, from_checkpoint)
    for v in range(3):
        (from_checkpoint / LOG / f"{v:020d}.json").unlink()
    without_json = tmp_path / "without-json"  # ... and 3.json too
    shutil.copytree(from_checkpoint, without_json)
    (without_json / LOG / f"{3:020d}.json").unlink()
    return {"full": full, "from-checkpoint": from_checkpoint, "without-json": without_json}


# ------------------------------------------------------------------------------------------------
# Comparison


def _dump(store: SqlStore) -> dict[str, list[tuple[Any, ...]]]:
    out: dict[str, list[tuple[Any, ...]]] = {}
    order = {
        "dl_tables": "id",
        "dl_commits": "table_id, version",
        "dl_actions": "table_id, version, part, seq",
        "dl_files": "id",
        "dl_mirror_status": "table_id, version, artifact",
    }
    with store.engine.connect() as conn:
        for table, by in order.items():
            result = conn.execute(text(f"SELECT * FROM {table} ORDER BY {by}"))
            keys = list(result.keys())
            rows = []
            for row in result:
                values = dict(zip(keys, row, strict=True))
                for key in _TIMES & values.keys():
                    values[key] = None
                if table == "dl_tables":
                    values["table_uuid"] = None
                    settings = json.loads(values["settings"])
                    settings.pop("imported_at", None)
                    values["settings"] = settings
                rows.append(tuple(values.items()))
            out[table] = rows
    return out


def _fresh(url_factory: Any) -> SqlStore:
    store = SqlStore(url_factory())
    store.init()
    return store


@pytest.mark.parametrize("batch", [bulk_load.ACTION_BATCH, 3], ids=["one-batch", "batches-of-3"])
@pytest.mark.parametrize("in_place", [False, True], ids=["copy", "in-place"])
@pytest.mark.parametrize("variant", ["full", "from-checkpoint", "without-json"])
@pytest.mark.all_backends(but="mysql")  # MySQL: its reference store is a server database (H1)
def test_bulk_import_stores_the_same_rows(
    tmp_path: Path,
    store_url: str,
    request: pytest.FixtureRequest,
    monkeypatch: pytest.MonkeyPatch,
    variant: str,
    in_place: bool,
    batch: int,
) -> None:
    """In batches of 3 rows, both stores send file rows while they are open and close them later
    (``BulkImport._close_sent``, SQLite's ``_SQLITE_CLOSE_SENT``), SQLite sends every run of rows
    it can through json_each (one batch: the runs are too short, all go by executemany) and the
    importer hands each commit's lines over two at a time, as it does 20,000 at a time for a
    large commit, every commit parsed by the parse process (as a large one is)."""
    monkeypatch.setattr(bulk_load, "ACTION_BATCH", batch)
    if batch == 3:  # and a commit's lines stored two at a time while the parse process parses it
        monkeypatch.setattr(bulk_load, "SQLITE_JSON_ROWS", 1)
        monkeypatch.setattr(commit_lines, "LINES_CHUNK", 2)
        monkeypatch.setattr(parse_process, "CHILD_MIN_BYTES", 0)
    source = _sources(tmp_path)[variant]
    if store_url.startswith("sqlite"):
        second = SqlStore(f"sqlite:///{tmp_path}/reference.db")
    elif store_url.startswith("duckdb"):
        second = SqlStore(f"duckdb:///{tmp_path}/reference.duckdb")
    else:
        second = SqlStore(request.getfixturevalue("pg_server").create_database("dm_ref_"))
    second.init()
    first = SqlStore(store_url)
    first.init()
    location = None if in_place else str(tmp_path / "published")
    result = import_table(first, str(source), name="t", location=location)
    _reference_import(second, str(source), "t", location)
    ours, reference = _dump(first), _dump(second)
    for table in reference:
        assert ours[table] == reference[table], table
    if variant == "full":  # the corner cases are there
        assert [d.field for d in result.checkpoint_disagreements] == ["files"]
        files = reference["dl_files"]
        assert any(dict(r)["add_version"] is None for r in files)  # tombstone rows
        assert sum(dict(r)["path"] == "dup.parquet" for r in files) == 2


def test_file_index_counts_a_remove_that_closes_two_rows_as_two() -> None:
    """The store's UPDATE counts rows, not removes: one remove closing two duplicate adds makes up
    for a remove of a key never added, which then gets no tombstone (as ``write_actions`` does)."""
    index = FileIndex()
    index.apply(0, 0, [(0, "add", "x", "", 1, "{}", None), (1, "add", "x", "", 1, "{}", None)])
    index.apply(1, 0, [(0, "remove", "x", "", None, None, 5), (1, "remove", "y", "", None, None, 6)])
    assert [row[:8] for row in index.rows] == [["x", "", 0, 0, 0, 1, 0, 0], ["x", "", 0, 0, 1, 1, 0, 0]]
    index.apply(2, 0, [(0, "remove", "z", "", None, None, 7)])
    assert index.rows[-1][:8] == ["z", "", None, None, None, 2, 0, 0]


@pytest.mark.parametrize(
    ("action", "field", "with_checkpoint"),
    [
        (builders.add("a.parquet", size=True), "size", False),
        (builders.add("a.parquet", size=True), "size", True),
        (builders.remove("a.parquet", deletionTimestamp=False), "deletionTimestamp", False),
    ],
    ids=["add-size-true-streamed", "add-size-true-read-first", "remove-timestamp-false"],
)
@pytest.mark.all_backends
def test_a_boolean_where_an_integer_belongs_is_refused_with_one_clear_message(
    tmp_path: Path, store_url: str, action: dict[str, Any], field: str, with_checkpoint: bool
) -> None:
    """JSON ``true`` is an int to Python: it was stored as 1 on SQLite and failed inside
    PostgreSQL's COPY. Both import paths (streamed, and read first when a later checkpoint is
    compared) refuse it naming the table, the version and the line; nothing is stored."""
    src = tmp_path / "src"
    builders.write_commit(src, 0, [builders.PROTOCOL, builders.METADATA, builders.add("a.parquet")])
    builders.write_commit(src, 1, [builders.add("b.parquet")])
    if with_checkpoint:  # written while the log is valid (deltalake would refuse the bad line)
        builders.write_commit(src, 2, [builders.add("c.parquet")])
        DeltaTable(str(src)).create_checkpoint()
    builders.write_commit(src, 1, [builders.add("b.parquet"), action])
    store = _fresh(lambda: store_url)
    with pytest.raises(DataError) as info:
        import_table(store, str(src), name="bad", location=str(tmp_path / "dst"))
    err = info.value
    assert (err.table, err.version) == ("bad", 1)
    kind = next(iter(action))
    assert (
        err.what
        == f"line 2: the {kind} action's '{field}' is {str(action[kind][field]).lower()}, not an integer"
    )
    assert err.hint and "repair" in err.hint
    assert store.list_tables() == [] and not (tmp_path / "dst").exists()
