"""Bad input at scale: a generated set of invalid commits and hostile inputs, on SQLite and PostgreSQL.

Every case goes through the public API (``parse_actions`` + ``SqlStore.commit``) and the CLI
(``delta-mirror commit``) against a store holding two published tables, and must be refused with
one clear message (the table, the version when known, what to do; CLI: one ``error:`` line, a
non-zero exit code, no traceback). After each case every row of every store table and every file
under the table roots is exactly as before: nothing partial is committed or published.

Table names are refused by one documented rule (``[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}``) before any
SQL runs; that the rule is not what keeps SQL safe is shown in ``test_security.py``.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from sqlalchemy import MetaData, select, text
from support.bad_input import HOSTILE_NAMES, METADATA, PROTOCOL, Case, generate, jl
from support.builders import add_body
from support.cli import assert_one_error_line, clean_env, executable

from delta_mirror.cli import cli
from delta_mirror.delta.actions import parse_actions
from delta_mirror.delta.log_path import LOG_DIR, commit_name
from delta_mirror.errors import ErrorClass, MirrorError
from delta_mirror.jobs.publisher import Publisher
from delta_mirror.store import SqlStore

EXIT = {ErrorClass.DATA: 4, ErrorClass.CONFLICT: 3, ErrorClass.PERMANENT: 1}


# -- the world: two published tables, both stores ----------------------------------------------------


def dump(store: SqlStore) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every table of the store, sorted: equal before and after means unchanged."""
    meta = MetaData()
    meta.reflect(store.engine)
    out: dict[str, list[tuple[Any, ...]]] = {}
    with store.engine.connect() as conn:
        for name, table in sorted(meta.tables.items()):
            out[name] = sorted((tuple(r) for r in conn.execute(select(table))), key=repr)
    return out


def files(root: Path) -> dict[str, str]:
    """Every file under the table roots with its SHA-256 (symlinks by target)."""
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
        for p in sorted(root.rglob("*"))
    }


@pytest.fixture(scope="module")
def world(module_store_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    tmp, url = tmp_path_factory.mktemp("bad-input"), module_store_url
    roots = tmp / "tables"
    store = SqlStore(url)
    store.init()
    for name in ("t", "other"):
        store.commit(
            name,
            [("protocol", PROTOCOL), ("metaData", METADATA), ("add", add_body("a.parquet"))],
            location=(roots / name).as_uri(),
        )
    store.commit("t", [("add", add_body("b.parquet"))])
    for name in ("t", "other"):
        Publisher(store).publish(name)
    yield {"url": url, "store": store, "roots": roots, "tmp": tmp}
    store.close()


def _cases() -> list[Case]:
    return generate("file:///ROOT/tables/t", "file:///ROOT/tables/other")


CASES = _cases()


def _materialise(case_body: bytes, roots: Path) -> bytes:
    return case_body.replace(b"file:///ROOT/tables", roots.as_uri().encode())


def test_the_generator_covers_every_rule_with_a_few_hundred_cases() -> None:
    ids = [c[0] for c in CASES]
    assert len(ids) == len(set(ids))
    assert len(CASES) >= 200, len(CASES)
    assert len(HOSTILE_NAMES) >= 30


def test_every_invalid_commit_is_refused_by_the_api_and_the_cli_leaving_store_and_storage_unchanged(
    world: dict[str, Any],
) -> None:
    store: SqlStore = world["store"]
    roots: Path = world["roots"]
    url = world["url"]
    before, before_files = dump(store), files(roots)
    assert before_files[f"t/{LOG_DIR}/{commit_name(1)}"]  # the world is published
    runner = CliRunner()
    failures: list[str] = []
    for cid, raw, extra, error_class, needles in CASES:
        body = _materialise(raw, roots)
        expected = int(extra[1]) if extra else None
        # the public API
        try:
            store.commit("t", parse_actions(body, table="t"), expected_version=expected)
            failures.append(f"{cid}: API accepted it")
        except MirrorError as exc:
            if exc.error_class != error_class:
                failures.append(f"{cid}: API {exc.error_class} {exc.message}")
            text_ = exc.message
            missing = [n for n in ("table 't'", " — ", *needles) if n not in text_]
            if missing:
                failures.append(f"{cid}: API message lacks {missing}: {text_}")
        # the CLI
        result = runner.invoke(
            cli,
            ["--store", url, "commit", "t", "--actions", "-", *extra],
            input=body,
            env={"DELTA_MIRROR_STORE": None, "DELTA_MIRROR_HOME": None},
        )
        if result.exit_code != EXIT[error_class] or result.stdout:
            failures.append(
                f"{cid}: CLI exit {result.exit_code}, stdout {result.stdout!r}, {result.stderr!r}"
            )
        else:
            try:
                assert_one_error_line(result.stderr, "table 't'", *needles)
            except AssertionError as exc:
                failures.append(f"{cid}: CLI {exc}")
    assert failures == []
    assert dump(store) == before
    assert files(roots) == before_files
    # nothing was left pending by a refused commit
    assert Publisher(store).publish("t").published == []


@pytest.mark.parametrize("name", HOSTILE_NAMES, ids=[f"name{i}" for i in range(len(HOSTILE_NAMES))])
def test_hostile_table_names_are_refused_everywhere_and_nothing_is_injected(
    world: dict[str, Any], name: str
) -> None:
    store: SqlStore = world["store"]
    roots: Path = world["roots"]
    before, before_files = dump(store), files(roots)
    create = jl(("protocol", PROTOCOL), ("metaData", METADATA), ("add", add_body()))
    with pytest.raises(MirrorError, match="invalid table name") as info:
        store.commit(name, parse_actions(create, table="x"), location=(roots / "new").as_uri())
    assert "use 1-128 letters" in info.value.message
    for call in (
        lambda: store.get_table(name),
        lambda: store.create_table(name, (roots / "new").as_uri()),
        lambda: Publisher(store).publish(name),
    ):
        with pytest.raises(MirrorError, match="invalid table name"):
            call()
    if "\x00" not in name:  # argv cannot carry NUL; the API above covers it
        for args in (
            ["commit", "--actions", "-", "--location", str(roots / "new"), "--", name],
            ["mirror", "--", name],
            ["status", "--", name],
            ["resume", "--", name],
            ["validate", "--", name],
            ["import", str(roots / "t"), f"--table={name}"],
        ):
            if not name and args[0] == "status":
                continue  # `status ""` is `status`: every table
            result = CliRunner().invoke(
                cli, ["--store", world["url"], *args], input=create, env={"DELTA_MIRROR_STORE": None}
            )
            assert result.exit_code == 2, (args, result.stderr, result.exception)  # usage
            assert_one_error_line(result.stderr, "invalid table name")
    after = dump(store)
    assert after == before
    assert sorted(row[1] for row in after["dl_tables"]) == ["other", "t"]  # nothing dropped or added
    assert files(roots) == before_files


def test_a_few_refusals_through_the_real_executable_print_one_line_and_no_traceback(
    world: dict[str, Any],
) -> None:
    roots: Path = world["roots"]
    before = dump(world["store"])
    picked = {
        c[0]: c for c in CASES if c[0] in ("path0-add", "deep-nesting", "non-utf8-latin1", "lone-surrogate")
    }
    assert len(picked) == 4
    for cid, raw, extra, error_class, needles in picked.values():
        proc = subprocess.run(
            [*executable(), "--store", world["url"], "commit", "t", "--actions", "-", *extra],
            input=_materialise(raw, roots),
            capture_output=True,
            env=clean_env(),
            timeout=60,
        )
        assert proc.returncode == EXIT[error_class], (cid, proc.stderr)
        assert_one_error_line(proc.stderr.decode(), "table 't'", *needles)
    assert dump(world["store"]) == before


# -- hostile table locations -------------------------------------------------------------------------


def test_hostile_table_locations_are_refused_and_nothing_is_created(world: dict[str, Any]) -> None:
    store: SqlStore = world["store"]
    roots: Path = world["roots"]
    before, before_files = dump(store), files(roots)
    create = [("protocol", PROTOCOL), ("metaData", METADATA), ("add", add_body())]
    # (location, what the API says, what the CLI says: one normaliser, delta.locations, refuses for both)
    hostile = [
        ((roots / "other").as_uri(), "overlaps table 'other'", "already holds a Delta log"),
        ((roots / "t" / "..").as_uri(), "'..'", "'..'"),  # a URI with '..' is refused everywhere
        # a plain path may say '..' (resolved, as a shell does)
        (str(roots / "t" / ".." / "other"), "overlaps table 'other'", "already holds a Delta log"),
        ((roots / "other" / LOG_DIR).as_uri(), "inside a _delta_log/ folder", "inside a _delta_log/ folder"),
        ((roots / "other" / LOG_DIR / "x").as_uri(), "inside a _delta_log/", "inside a _delta_log/"),
        ((roots / "t" / "nested").as_uri(), "overlaps table 't'", "overlaps table 't'"),
        (roots.as_uri(), "overlaps table", "overlaps table"),  # a root holding other tables
        ("s3://bucket/a/../b", "'..'", "'..'"),
        ("s3://bucket/a/%2e%2e/b", "'..'", "'..'"),
        ("s3://bucket/t?versionId=1", "'?' or '#'", "'?' or '#'"),
        ("ftp://host/t", "unsupported location scheme", "unsupported location scheme"),
        ("s3:///no-bucket", "no bucket", "no bucket"),
    ]
    for location, api_says, cli_says in hostile:
        with pytest.raises(MirrorError) as info:
            store.commit("newt", create, location=location)
        assert api_says in info.value.message and "table 'newt'" in info.value.message, info.value.message
        result = CliRunner().invoke(
            cli,
            ["--store", world["url"], "commit", "newt", "--actions", "-", "--location", location],
            input=jl(*create),
            env={"DELTA_MIRROR_STORE": None},
        )
        assert result.exit_code == 1, (location, result.stderr, result.exception)
        assert_one_error_line(result.stderr, "table 'newt'", cli_says)
    assert dump(store) == before
    assert files(roots) == before_files


# -- a bad writer that bypassed commit(): halted at publish, nothing partial -------------------------


def _insert_raw_version(store: SqlStore, table: str, version: int, payloads: list[str]) -> None:
    """What a buggy writer might do: rows written straight into SQL, with a consistent hash."""
    data = "".join(p + "\n" for p in payloads).encode()
    t = store.get_table(table)
    with store.engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO dl_commits (table_id, version, committed_at, action_count, size_bytes, sha256, "
                "has_json, source) VALUES (:t, :v, 1, :n, :s, :h, :j, 'native')"
            ),
            {
                "t": t.id,
                "v": version,
                "n": len(payloads),
                "s": len(data),
                "h": hashlib.sha256(data).hexdigest(),
                "j": True,
            },
        )
        for seq, p in enumerate(payloads):
            conn.execute(
                text(
                    "INSERT INTO dl_actions (table_id, version, part, seq, action_type, payload) "
                    "VALUES (:t, :v, 0, :q, 'add', :p)"
                ),
                {"t": t.id, "v": version, "q": seq, "p": p},
            )
        conn.execute(
            text(
                "INSERT INTO dl_mirror_status (table_id, version, artifact, state, attempts, enqueued_at) "
                "VALUES (:t, :v, 'json', 'PENDING', 0, 1)"
            ),
            {"t": t.id, "v": version},
        )


RAW_BAD = {
    "escaping-path": ['{"add":{"path":"../../escape.parquet","partitionValues":{},"size":1,"modificationTime":1,"dataChange":true}}'],
    "into-delta-log": ['{"add":{"path":"_delta_log/00000000000000000099.json","partitionValues":{},"size":1,"modificationTime":1,"dataChange":true}}'],
    "not-json": ['{"add":{"path":"x.parquet"'],
    "two-keys": ['{"add":{},"remove":{}}'],
    "missing-size": ['{"add":{"path":"x.parquet","partitionValues":{},"modificationTime":1,"dataChange":true}}'],
    "unknown-reader-feature": ['{"protocol":{"minReaderVersion":3,"minWriterVersion":7,"readerFeatures":["blahabl"],"writerFeatures":["blahabl"]}}'],
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(RAW_BAD))
def test_an_invalid_commit_found_in_the_store_halts_the_table_at_that_version(
    store: SqlStore, store_url: str, tmp_path: Path, case: str
) -> None:
    root = tmp_path / "t"
    store.commit(
        "t",
        [("protocol", PROTOCOL), ("metaData", METADATA), ("add", add_body("a.parquet"))],
        location=root.as_uri(),
    )
    store.commit("t", [("add", add_body("b.parquet"))])
    Publisher(store).publish("t")
    published = {p.name: p.read_bytes() for p in (root / LOG_DIR).iterdir()}
    store.commit("t", [("add", add_body("c.parquet"))])  # version 2: valid, still pending
    _insert_raw_version(store, "t", 3, RAW_BAD[case])
    store.commit("t", [("add", add_body("d.parquet"))])  # version 4: valid, behind the bad one

    result = CliRunner().invoke(cli, ["--store", store_url, "mirror", "t"], env={"DELTA_MIRROR_STORE": None})
    assert result.exit_code == 4, (result.stderr, result.exception)
    line = assert_one_error_line(result.stderr, "table 't'", "version 3", "stored ")
    assert "restore" in line
    table = store.get_table("t")
    assert (table.state, table.halted_version) == ("HALTED", 3)
    log = root / LOG_DIR
    assert (log / commit_name(2)).is_file()  # the valid version before it went out
    assert not (log / commit_name(3)).exists() and not (log / commit_name(4)).exists()
    assert {p: (log / p).read_bytes() for p in published} == published  # earlier versions intact
    assert not (tmp_path / "escape.parquet").exists()
    status = {(r.version, r.artifact): (r.state, r.error_class) for r in store.status_rows(table.id)}
    assert status[(3, "json")] == ("FAILED", "DATA")
    assert status[(4, "json")][0] != "SUCCESS"
    again = CliRunner().invoke(cli, ["--store", store_url, "mirror", "t"], env={"DELTA_MIRROR_STORE": None})
    assert again.exit_code == 1
    assert_one_error_line(again.stderr, "halted", "delta-mirror resume t")
    store.close()


def test_a_protocol_goes_down_only_through_drop_feature(store: SqlStore, tmp_path: Path) -> None:
    dv = {"minReaderVersion": 3, "minWriterVersion": 7, "readerFeatures": ["deletionVectors"],
          "writerFeatures": ["deletionVectors"]}  # fmt: skip
    store.commit("t", [("protocol", dv), ("metaData", METADATA)], location=(tmp_path / "t").as_uri())
    with pytest.raises(MirrorError, match="protocol downgrade: minReaderVersion 3 -> 1"):
        store.commit(
            "t", [("protocol", {"minReaderVersion": 1, "minWriterVersion": 7, "writerFeatures": []})]
        )
    assert (
        store.commit(
            "t",
            [
                ("commitInfo", {"operation": "DROP FEATURE"}),
                ("protocol", {"minReaderVersion": 1, "minWriterVersion": 2}),
            ],
        )
        == 1
    )
    assert (
        store.commit("t", [("protocol", {"minReaderVersion": 1, "minWriterVersion": 4})]) == 2
    )  # up is fine
    store.close()


# -- oversized commits ---------------------------------------------------------------------------------


def _big_commit(path: Path, n: int) -> None:
    with path.open("w") as f:
        f.write(json.dumps({"protocol": PROTOCOL}) + "\n" + json.dumps({"metaData": METADATA}) + "\n")
        for i in range(n - 2):
            stats = '"stats":"{\\"numRecords\\":1}"'
            f.write(
                f'{{"add":{{"path":"part-{i:07d}.parquet","partitionValues":{{}},"size":{100 + i},'
                f'"modificationTime":1,"dataChange":true,{stats}}}}}\n'
            )


def test_a_commit_over_the_configured_limits_is_refused_and_changes_nothing(
    store: SqlStore, store_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    big = tmp_path / "big.jsonl"
    _big_commit(big, 100_000)
    before = dump(store)
    location = (tmp_path / "big").as_uri()
    monkeypatch.setenv("DELTA_MIRROR_MAX_COMMIT_ACTIONS", "50000")
    actions = parse_actions(big.read_bytes(), table="big")
    with pytest.raises(MirrorError, match=r"holds 100,000 actions, more than the limit of 50,000") as info:
        store.commit("big", actions, location=location)
    assert (
        info.value.error_class == ErrorClass.DATA and "DELTA_MIRROR_MAX_COMMIT_ACTIONS" in info.value.message
    )
    env = {"DELTA_MIRROR_STORE": None, "DELTA_MIRROR_MAX_COMMIT_ACTIONS": "50000"}
    result = CliRunner().invoke(
        cli, ["--store", store_url, "commit", "big", "--actions", str(big), "--location", location], env=env
    )
    assert result.exit_code == 4, result.stderr
    assert_one_error_line(result.stderr, "table 'big'", "more than the limit of 50,000")
    # the byte limit: refused before the input is even parsed
    env = {"DELTA_MIRROR_STORE": None, "DELTA_MIRROR_MAX_COMMIT_BYTES": "1000000"}
    result = CliRunner().invoke(
        cli, ["--store", store_url, "commit", "big", "--actions", str(big), "--location", location], env=env
    )
    assert result.exit_code == 4, result.stderr
    assert_one_error_line(result.stderr, "table 'big'", "larger than the limit of 1,000,000 bytes")
    # the canonical commit file is measured too (a small limit and a small commit: the same rule)
    monkeypatch.delenv("DELTA_MIRROR_MAX_COMMIT_ACTIONS")
    monkeypatch.setenv("DELTA_MIRROR_MAX_COMMIT_BYTES", "1000")
    small = actions[:2] + actions[2:12]
    with pytest.raises(
        MirrorError, match=r"the commit file would be [\d,]+ bytes, more than the limit of 1,000"
    ):
        store.commit("big", small, location=location)
    actions = small
    monkeypatch.setenv("DELTA_MIRROR_MAX_COMMIT_BYTES", "lots")
    with pytest.raises(MirrorError, match="DELTA_MIRROR_MAX_COMMIT_BYTES='lots' is not a positive integer"):
        store.commit("big", actions, location=location)
    assert dump(store) == before
    assert not (tmp_path / "big").exists()
    store.close()


# The CLI in a child that reports its own peak RSS at exit. VmHWM belongs to the process's own
# memory map; ru_maxrss would carry over the peak of the (large) pytest process it was forked from.
_REPORT_PEAK_RSS = """
import atexit, runpy, sys
def report():
    with open("/proc/self/status") as status:
        sys.stderr.write(next(line for line in status if line.startswith("VmHWM")))
atexit.register(report)
sys.argv[0] = "delta-mirror"
runpy.run_module("delta_mirror.cli", run_name="__main__")
"""


def test_a_100k_action_commit_within_the_default_limit_is_committed_published_and_read_back(
    store_url: str, tmp_path: Path
) -> None:
    from deltalake import DeltaTable

    SqlStore(store_url).init()
    big = tmp_path / "big.jsonl"
    _big_commit(big, 100_000)
    root = tmp_path / "big"
    env = clean_env()
    peak = 0
    for args in (
        ["commit", "big", "--actions", str(big), "--location", str(root)],
        ["mirror", "big"],
    ):
        proc = subprocess.run(
            [sys.executable, "-c", _REPORT_PEAK_RSS, "--store", store_url, *args],
            capture_output=True,
            env=env,
            timeout=300,
        )
        assert proc.returncode == 0, proc.stderr.decode()
        peak = max(peak, int(proc.stderr.decode().rsplit("VmHWM:", 1)[1].split()[0]))  # KiB
    print(f"100,000-action commit + publish: peak RSS {peak / 1024:.0f} MiB")
    assert peak < 800_000, f"peak RSS {peak / 1024:.0f} MiB for a 100,000-action commit"
    log = root / LOG_DIR
    assert sum(1 for _ in (log / commit_name(0)).open()) == 100_000 + 1  # + commitInfo
    dt = DeltaTable(str(root))
    assert dt.version() == 0
    uris = dt.file_uris()
    assert len(uris) == 99_998
    assert uris[0].endswith(".parquet") and any(u.endswith("part-0099997.parquet") for u in uris)
