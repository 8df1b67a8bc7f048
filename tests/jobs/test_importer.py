"""Import compatibility (issue 11): logs as other writers leave them, read back as readers see them.

Every fixture is generated here (deltalake writes the tables, the tests then edit the log as
Spark's forward-compatible writers or hand-spliced checkpoints leave it); no corpus needed.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from deltalake import DeltaTable, QueryBuilder, write_deltalake
from sqlalchemy import text
from support import builders

from delta_mirror.cli import cli
from delta_mirror.delta import commit_lines, parse_process
from delta_mirror.errors import DataError
from delta_mirror.jobs.importer import import_table
from delta_mirror.jobs.publisher import Publisher
from delta_mirror.jobs.validate import validate_table
from delta_mirror.store import SqlStore
from delta_mirror.store.source_import import CHECKPOINT_STATE_SETTING

LOG = "_delta_log"


@pytest.fixture
def store(tmp_path: Path) -> SqlStore:
    s = SqlStore(f"sqlite:///{tmp_path}/store.db")
    s.init()
    return s


def _write_source(path: Path) -> None:
    """Two appends with deltalake: versions 0 and 1, three rows."""
    write_deltalake(str(path), pa.table({"id": pa.array([1, 2], pa.int64())}))
    write_deltalake(str(path), pa.table({"id": pa.array([3], pa.int64())}), mode="append")


def _copy_data(src: Path, dst: Path) -> None:
    for item in src.rglob("*.parquet"):
        rel = item.relative_to(src)
        if rel.parts[0] != LOG:
            (dst / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(item, dst / rel)


def _rows(path: Path) -> int:
    result = (
        QueryBuilder().register("t", DeltaTable(str(path))).execute("select count(*) as n from t").read_all()
    )
    return int(pa.table(result).column("n")[0].as_py())


def _commit(path: Path, version: int) -> Path:
    return path / LOG / f"{version:020d}.json"


# --------------------------------------------------------------------------------------------
# 1. Forward-compatible lines: unknown keys beside the action, unknown fields inside add
# --------------------------------------------------------------------------------------------


def _spark_forward_compatible(path: Path, version: int) -> bytes:
    """Rewrite a commit as a forward-compatible Spark writer would: an unknown key beside
    ``commitInfo`` on its line and unknown fields inside ``add`` (compact, as Jackson writes)."""
    out = []
    for raw in _commit(path, version).read_text(encoding="utf-8").splitlines():
        obj = json.loads(raw)
        if "commitInfo" in obj:
            obj["some_future_action"] = [1, {"nested": None}, "ü"]
        elif "add" in obj:
            obj["add"]["futureField"] = {"x": [1, 2]}
            obj["add"]["anotherFutureField"] = "y"
        out.append(json.dumps(obj, separators=(",", ":"), ensure_ascii=False))
    data = ("\n".join(out) + "\n").encode("utf-8")
    _commit(path, version).write_bytes(data)
    return data


def test_forward_compatible_lines_import_and_publish_byte_identical(tmp_path: Path, store: SqlStore) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    _write_source(src)
    originals = {v: _spark_forward_compatible(src, v) for v in (0, 1)}
    assert DeltaTable(str(src)).version() == 1  # readers accept the log as it is

    result = import_table(store, str(src), name="fc", location=str(dst))
    assert (result.start_version, result.end_version, result.commits) == (0, 1, 2)
    assert result.checkpoint_disagreements == []
    _copy_data(src, dst)
    publisher = Publisher(store)
    assert publisher.publish("fc").last_published == 1
    for version, data in originals.items():
        assert _commit(dst, version).read_bytes() == data  # the unknown keys are kept, byte for byte
    assert DeltaTable(str(dst)).version() == 1 and _rows(dst) == 3
    # The mirror's own checkpoint carries the adds (their unknown fields do not trouble it).
    publisher.checkpoint("fc", 1)
    assert (dst / LOG / f"{1:020d}.checkpoint.parquet").exists()
    assert DeltaTable(str(dst)).version() == 1 and _rows(dst) == 3
    assert validate_table(store, "fc").problems == []


def test_forward_compatible_lines_in_place(tmp_path: Path, store: SqlStore) -> None:
    src = tmp_path / "src"
    _write_source(src)
    _spark_forward_compatible(src, 1)
    result = import_table(store, str(src), name="fc")
    assert result.in_place and result.end_version == 1
    assert Publisher(store).publish("fc").already_present == []  # adopted as already published
    table = store.get_table("fc")
    assert store.commit_bytes(table.id, 1) == _commit(src, 1).read_bytes()


def test_a_line_with_two_known_actions_is_refused(tmp_path: Path, store: SqlStore) -> None:
    src = tmp_path / "src"
    _write_source(src)
    lines = _commit(src, 1).read_text().splitlines()
    add = next(json.loads(line) for line in lines if '"add"' in line)
    lines.append(json.dumps({"txn": {"appId": "a", "version": 1}, **add}, separators=(",", ":")))
    _commit(src, 1).write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError, match=r"holds 2 actions \('txn', 'add'\)") as info:
        import_table(store, str(src), name="two", location=str(tmp_path / "dst"))
    assert info.value.version == 1
    assert store.list_tables() == []


# --------------------------------------------------------------------------------------------
# 2. A checkpoint whose state differs from the JSON replay
# --------------------------------------------------------------------------------------------

EXTRA = {"name": "extra", "type": "long", "nullable": True, "metadata": {}}


def _checkpoint_with_extra_column(src: Path) -> Path:
    """deltalake's checkpoint at version 1, its metaData schemaString given one more column."""
    DeltaTable(str(src)).create_checkpoint()
    path = src / LOG / f"{1:020d}.checkpoint.parquet"
    table = pq.read_table(path)
    rows = table.to_pylist()
    for row in rows:
        if row.get("metaData"):
            schema = json.loads(row["metaData"]["schemaString"])
            schema["fields"].append(EXTRA)
            row["metaData"]["schemaString"] = json.dumps(schema, separators=(",", ":"))
    pq.write_table(pa.Table.from_pylist(rows, schema=table.schema), path)
    return path


def _columns(path: Path) -> list[str]:
    return [f.name for f in DeltaTable(str(path)).schema().fields]


def test_checkpoint_schema_wins_and_is_reported(tmp_path: Path, store: SqlStore) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    _write_source(src)
    _checkpoint_with_extra_column(src)
    assert _columns(src) == ["id", "extra"]  # what readers of the source see

    result = import_table(store, str(src), name="cp", location=str(dst))
    fields = {(d.version, d.field) for d in result.checkpoint_disagreements}
    assert fields == {(1, "metaData.schemaString")}
    (disagreement,) = result.checkpoint_disagreements
    assert "'extra' only in the checkpoint" in disagreement.detail
    assert "version 1" in result.warnings()[0] and "metaData.schemaString" in result.warnings()[0]
    assert result.to_json()["checkpoint_disagreements"] == [disagreement.to_json()]
    # Recorded: the table's settings and the store's state at version 1 (not at version 0).
    table = store.get_table("cp")
    assert table.settings[CHECKPOINT_STATE_SETTING] == [disagreement.to_json()]
    schema_at = {
        v: json.loads(json.loads(store.snapshot(table.id, v).metadata)["metaData"]["schemaString"])
        for v in (0, 1)
    }
    assert [f["name"] for f in schema_at[0]["fields"]] == ["id"]
    assert [f["name"] for f in schema_at[1]["fields"]] == ["id", "extra"]

    _copy_data(src, dst)
    published = Publisher(store).publish("cp")
    assert 1 in published.checkpoints  # queued at import: the copy's readers start from it too
    for version in (0, 1):  # the same actions (deltalake writes no final newline, the mirror does)
        assert _commit(dst, version).read_text().split() == _commit(src, version).read_text().split()
    checkpoint = pq.read_table(dst / LOG / f"{1:020d}.checkpoint.parquet", columns=["metaData"])
    (meta,) = [m for m in checkpoint.column("metaData").to_pylist() if m]
    assert EXTRA["name"] in [f["name"] for f in json.loads(meta["schemaString"])["fields"]]
    assert _columns(dst) == ["id", "extra"] and _rows(dst) == 3
    assert validate_table(store, "cp").problems == []  # the store agrees with what readers see


def test_checkpoint_state_in_place_keeps_the_source_checkpoint(tmp_path: Path, store: SqlStore) -> None:
    src = tmp_path / "src"
    _write_source(src)
    cp = _checkpoint_with_extra_column(src)
    before = cp.read_bytes()
    result = import_table(store, str(src), name="cp")
    assert [(d.version, d.field) for d in result.checkpoint_disagreements] == [(1, "metaData.schemaString")]
    table = store.get_table("cp")
    meta = json.loads(store.snapshot(table.id, 1).metadata)["metaData"]
    assert "extra" in meta["schemaString"]
    Publisher(store).publish("cp")
    assert cp.read_bytes() == before  # the source's own checkpoint stays what readers read


def test_checkpoint_file_set_wins(tmp_path: Path, store: SqlStore) -> None:
    """A file the JSON replay has but the checkpoint lacks leaves the store's state at that version."""
    src, dst = tmp_path / "src", tmp_path / "dst"
    _write_source(src)
    DeltaTable(str(src)).create_checkpoint()
    path = src / LOG / f"{1:020d}.checkpoint.parquet"
    table = pq.read_table(path)
    rows = table.to_pylist()
    adds = [i for i, r in enumerate(rows) if r.get("add")]
    dropped = rows[adds[0]]["add"]["path"]
    del rows[adds[0]]
    pq.write_table(pa.Table.from_pylist(rows, schema=table.schema), path)
    expected = {str(p) for p in DeltaTable(str(src)).file_uris()}
    assert len(expected) == 1  # readers of the source see one file

    result = import_table(store, str(src), name="fs", location=str(dst))
    (disagreement,) = result.checkpoint_disagreements
    assert (disagreement.version, disagreement.field) == (1, "files")
    assert "1 only in the JSON replay" in disagreement.detail and dropped in disagreement.detail
    info = store.get_table("fs")
    assert [f.path for f in store.active_files(info.id, 1)] == [str(p).rsplit("/", 1)[-1] for p in expected]
    _copy_data(src, dst)
    Publisher(store).publish("fs")
    assert len(DeltaTable(str(dst)).file_uris()) == 1 and _rows(dst) == _rows(src)
    assert validate_table(store, "fs").problems == []


def test_cli_import_reports_the_disagreement(tmp_path: Path) -> None:
    src = tmp_path / "src"
    _write_source(src)
    _checkpoint_with_extra_column(src)
    url = f"sqlite:///{tmp_path}/cli.db"
    runner = CliRunner()
    assert runner.invoke(cli, ["--store", url, "init"]).exit_code == 0
    result = runner.invoke(
        cli,
        ["--store", url, "import", str(src), "--table", "cp", "--location", str(tmp_path / "dst"), "--json"],
    )
    assert result.exit_code == 0, (result.output, result.exception)
    data = json.loads(result.stdout)
    assert [(d["version"], d["field"]) for d in data["checkpoint_disagreements"]] == [
        (1, "metaData.schemaString")
    ]
    text = runner.invoke(
        cli, ["--store", url, "import", str(src), "--table", "cp2", "--location", str(tmp_path / "dst2")]
    )
    assert text.exit_code == 0, (text.output, text.exception)
    assert "imported 'cp2'" in text.stdout
    (warning,) = text.stderr.splitlines()
    assert warning.startswith("warning: version 1: ") and "metaData.schemaString" in warning


# --------------------------------------------------------------------------------------------
# 3. Logs readers cannot reconstruct: one rule, refused before anything is written
# --------------------------------------------------------------------------------------------

PROTOCOL = builders.PROTOCOL
METADATA = builders.METADATA


def _meta(**changes: Any) -> dict[str, Any]:
    body = dict(builders.metadata_body())
    for key, value in changes.items():
        if value is None:
            body.pop(key, None)
        else:
            body[key] = value
    return {"metaData": body}


INVALID_LOGS = [
    pytest.param([[METADATA, builders.add("a")]], 0, "no protocol action", id="no-protocol"),
    pytest.param([[PROTOCOL, builders.add("a")]], 0, "no metaData action", id="no-metadata"),
    pytest.param([[PROTOCOL, _meta(schemaString=None)]], 0, "'schemaString'", id="no-schemaString"),
    pytest.param([[PROTOCOL, _meta(id=None)]], 0, "'id'", id="no-id"),
    pytest.param([[PROTOCOL, _meta(format=None)]], 0, "'format'", id="no-format"),
    pytest.param([[PROTOCOL, _meta(schemaString="{not json")]], 0, "not valid JSON", id="schema-not-json"),
    pytest.param([[PROTOCOL, _meta(schemaString='{"type":"long"}')]], 0, "struct", id="schema-not-struct"),
    pytest.param(
        [[PROTOCOL, METADATA], [builders.add("a")], [_meta(schemaString=None)]],
        2,
        "'schemaString'",
        id="later-meta",
    ),
    pytest.param(
        [[{"protocol": {"minWriterVersion": 2}}, METADATA]],
        0,
        "integer 'minReaderVersion'",
        id="protocol-no-reader",
    ),
]


@pytest.mark.parametrize(("commits", "version", "field"), INVALID_LOGS)
def test_invalid_logs_are_refused(
    tmp_path: Path, store: SqlStore, commits: list[list[dict[str, Any]]], version: int, field: str
) -> None:
    src = tmp_path / "src"
    for v, actions in enumerate(commits):
        builders.write_commit(src, v, actions)
    with pytest.raises(DataError) as info:
        import_table(store, str(src), name="bad", location=str(tmp_path / "dst"))
    err = info.value
    assert err.table == "bad" and err.version == version
    assert field in err.what and f"version {version}" in err.what
    assert err.hint and "repair the source log" in err.hint
    assert store.list_tables() == [] and not (tmp_path / "dst").exists()


@pytest.mark.parametrize("parsed", ["here", "in-the-parse-process"])
def test_a_commit_refused_after_its_first_lines_were_stored_leaves_nothing(
    tmp_path: Path, store: SqlStore, monkeypatch: pytest.MonkeyPatch, parsed: str
) -> None:
    """A large commit's lines go to the store while the rest is parsed (here or by the parse
    process); a bad line further on still refuses the import, with the same message and nothing
    kept (the one transaction rolls back)."""
    monkeypatch.setattr(commit_lines, "LINES_CHUNK", 2)
    if parsed == "in-the-parse-process":
        monkeypatch.setattr(parse_process, "CHILD_MIN_BYTES", 0)
    src = tmp_path / "src"
    builders.write_commit(src, 0, [PROTOCOL, METADATA])
    builders.write_commit(src, 1, [builders.add(f"f{i}.parquet") for i in range(5)])
    commit = src / "_delta_log" / f"{1:020d}.json"
    commit.write_text(commit.read_text() + '{"add": {"path": \n')
    with pytest.raises(DataError) as info:
        import_table(store, str(src), name="bad", location=str(tmp_path / "dst"))
    assert info.value.version == 1 and "line 6" in info.value.what
    assert store.list_tables() == []
    with store.engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM dl_actions")).scalar() == 0


def _parquet_checkpoint(path: Path, rows: list[dict[str, Any]]) -> None:
    schema = pa.schema(
        [
            ("protocol", pa.struct([("minReaderVersion", pa.int32()), ("minWriterVersion", pa.int32())])),
            (
                "add",
                pa.struct(
                    [
                        ("path", pa.string()),
                        ("partitionValues", pa.map_(pa.string(), pa.string())),
                        ("size", pa.int64()),
                        ("modificationTime", pa.int64()),
                        ("dataChange", pa.bool_()),
                    ]
                ),
            ),
        ]
    )
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)


@pytest.mark.parametrize("early_commits", ["kept", "cleaned-up"])
def test_a_checkpoint_without_metadata_is_refused(
    tmp_path: Path, store: SqlStore, early_commits: str
) -> None:
    src = tmp_path / "src"
    builders.write_commit(src, 0, [PROTOCOL, METADATA, builders.add("a")])
    builders.write_commit(src, 1, [builders.add("b")])
    builders.write_commit(src, 2, [builders.add("c")])
    adds = [builders.add(p, partitionValues=[], dataChange=False) for p in ("a", "b")]
    _parquet_checkpoint(src / LOG / f"{1:020d}.checkpoint.parquet", [PROTOCOL, *adds])
    if early_commits == "cleaned-up":
        _commit(src, 0).unlink()
    with pytest.raises(DataError, match="checkpoint 1 has no metaData action") as info:
        import_table(store, str(src), name="cpbad", location=str(tmp_path / "dst"))
    assert info.value.version == 1
    assert store.list_tables() == []


def test_cli_refuses_an_invalid_log_with_one_line(tmp_path: Path) -> None:
    src = tmp_path / "src"
    builders.write_commit(src, 0, [PROTOCOL, _meta(schemaString=None)])
    url = f"sqlite:///{tmp_path}/cli.db"
    runner = CliRunner()
    assert runner.invoke(cli, ["--store", url, "init"]).exit_code == 0
    result = runner.invoke(cli, ["--store", url, "import", str(src), "--table", "bad"])
    assert result.exit_code != 0
    assert "Traceback" not in result.stderr and result.stderr.count("\n") == 1, result.stderr
    assert "table 'bad'" in result.stderr and "version 0" in result.stderr and "schemaString" in result.stderr
    assert SqlStore(url).list_tables() == []
