"""Security basics: secrets never printed, SQL always parameterised, writes only under ``_delta_log/``.

- Credentials come from the environment (or Airflow connections, see ``tests/airflow``): the CLI
  never prints them, not in results and not in errors about an unreachable or refused store.
- Table names and versions reach SQL as bound parameters: values full of SQL metacharacters
  round-trip unchanged on both stores, and a static check lists every place that builds SQL text.
- The storage layer writes only below ``<table root>/_delta_log/``: escaping paths and symlinked
  log folders are refused, and nothing appears outside the table root.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

import pytest
from sqlalchemy.engine import make_url
from support.builders import add_body, metadata_body, protocol_body
from support.cli import assert_one_error_line, clean_env, executable
from support.source_ast import parse_source

from delta_mirror.delta.log_path import LAST_CHECKPOINT, LOG_DIR, commit_name
from delta_mirror.errors import MirrorError, PermanentError, PublishConflictError, TableNotFoundError
from delta_mirror.jobs.publisher import Publisher
from delta_mirror.storage import open_store
from delta_mirror.store import SqlStore

SECRET = "Sup3r-S3cr3t-7f2c91ab"
AWS_SECRET = "aws-S3cr3t-0b8e44d1c7"
PROTOCOL = protocol_body()


def cli(*args: str, env: dict[str, str], stdin: bytes | None = None) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([*executable(), *args], input=stdin, capture_output=True, env=env, timeout=120)
    return subprocess.CompletedProcess(proc.args, proc.returncode, proc.stdout.decode(), proc.stderr.decode())


# -- (b) the CLI never prints a secret ------------------------------------------------------------------


@pytest.mark.postgres
def test_store_passwords_never_appear_in_cli_output_or_errors(pg_url: str, tmp_path: Path) -> None:
    real = make_url(pg_url)
    closed = f"postgresql+psycopg://mirror:{SECRET}@127.0.0.1:9/db"
    in_query = f"postgresql+psycopg://mirror@127.0.0.1:9/db?password={SECRET}"
    # the real server, a database that does not exist: a refusal from PostgreSQL itself
    missing_db = real.set(password=SECRET, database="no_such_db_x").render_as_string(hide_password=False)
    bad_port = f"postgresql+psycopg://mirror:{SECRET}@127.0.0.1:notaport/db"
    outputs: list[str] = []
    for url, says in (
        (closed, "127.0.0.1:9"),
        (in_query, "password=***"),
        (missing_db, "no_such_db_x"),
        (bad_port, "not valid"),
    ):
        for env, args in (
            (clean_env(DELTA_MIRROR_STORE=url), ("status",)),  # from the environment
            (
                clean_env(),
                ("--store", url, "commit", "t", "--actions", "-", "--location", str(tmp_path / "t")),
            ),
        ):
            result = cli(*args, env=env, stdin=b"{}\n")
            assert result.returncode != 0
            line = assert_one_error_line(result.stderr, says)
            assert SECRET not in line, line
            outputs += [result.stdout, result.stderr]
    debug = cli("--debug", "init", env=clean_env(DELTA_MIRROR_STORE=closed))  # a traceback too
    assert debug.returncode != 0 and "Traceback" in debug.stderr
    outputs += [debug.stdout, debug.stderr]
    assert all(SECRET not in text for text in outputs)
    assert sum("***" in text for text in outputs) >= 6  # the URLs were shown, redacted


@pytest.mark.postgres
def test_a_working_store_url_with_a_password_is_shown_redacted(pg_url: str, tmp_path: Path) -> None:
    # the throwaway server trusts local connections: the password is sent and accepted
    url = make_url(pg_url).set(password=SECRET).render_as_string(hide_password=False)
    env = clean_env(DELTA_MIRROR_STORE=url)
    texts = []
    for args, stdin in (
        (("init",), None),
        (("commit", "t", "--actions", "-", "--location", str(tmp_path / "t")), _create()),
        (("mirror", "t"), None),
        (("status", "--json"), None),
        (("health",), None),
        (("validate", "t"), None),
    ):
        result = cli(*args, env=env, stdin=stdin)
        assert result.returncode == 0, result.stderr
        texts += [result.stdout, result.stderr]
    assert "***" in texts[0]  # `init` says where the store is, redacted
    assert all(SECRET not in t for t in texts)


@pytest.mark.s3
def test_aws_secret_keys_never_appear_in_cli_output_or_errors(s3: Any, tmp_path: Path) -> None:
    store_url = f"sqlite:///{tmp_path / 'store.db'}"
    bucket = s3.make_bucket()
    ok_env = clean_env(
        **{**s3.env(), "AWS_SECRET_ACCESS_KEY": AWS_SECRET, "AWS_SESSION_TOKEN": AWS_SECRET + "-tok"},
        NO_PROXY="127.0.0.1,localhost",
    )
    texts = []
    args: tuple[str, ...]
    for args, stdin in (
        (("init",), None),
        (("commit", "t", "--actions", "-", "--location", f"s3://{bucket}/t"), _create()),
        (("mirror", "t"), None),
        (("validate", "t"), None),
        (("status", "t", "--json"), None),
    ):
        result = cli("--store", store_url, *args, env=ok_env, stdin=stdin)
        assert result.returncode == 0, result.stderr
        texts += [result.stdout, result.stderr]
    down_env = {**ok_env, "AWS_ENDPOINT_URL": "http://127.0.0.1:1", "DELTA_MIRROR_STORAGE_TIMEOUT": "2s"}
    for args, stdin in (
        (("commit", "u", "--actions", "-", "--location", f"s3://{bucket}/u"), _create()),
        (("validate", "t"), None),
        (("import", f"s3://{bucket}/t", "--table", "imp"), None),
    ):
        result = cli("--store", store_url, *args, env=down_env, stdin=stdin)
        assert result.returncode != 0
        assert_one_error_line(result.stderr)
        texts += [result.stdout, result.stderr]
    assert all(AWS_SECRET not in t for t in texts), [t for t in texts if AWS_SECRET in t]


def _create() -> bytes:
    return "".join(
        json.dumps(a) + "\n"
        for a in ({"protocol": PROTOCOL}, {"metaData": metadata_body()}, {"add": add_body("a.parquet")})
    ).encode()


# -- (c) names and values are bound parameters ------------------------------------------------------------

SQL_SAFE = "'\";()=$*,!-"
HOSTILE_VALUES = [
    "x'; DROP TABLE dl_tables;--",
    "' OR '1'='1",
    '" OR ""="',
    "Robert'); DELETE FROM dl_commits;--",
    "%",
    "_",
    "a%b",
    "\\",
    "$1",
    ":name",
    "%(name)s",
    "?",
    "');--",
    "表'--",
]


def test_sql_metacharacters_in_every_stored_value_round_trip_and_inject_nothing(
    store: SqlStore, tmp_path: Path
) -> None:
    from deltalake import DeltaTable

    root = tmp_path / "t"
    # paths are URIs: '%', '\\', ':', '?' and '/' percent-encoded, the SQL metacharacters kept as they are
    # (a backslash is refused in paths even when encoded, so it is spelled out there)
    paths = [
        f"p{i}-{quote(v.replace(chr(92), 'bs'), safe=SQL_SAFE)}.parquet" for i, v in enumerate(HOSTILE_VALUES)
    ]
    assert "p0-x';" in paths[0] and "--" in paths[0]
    store.commit(
        "t",
        [
            ("protocol", PROTOCOL),
            ("metaData", metadata_body(name=HOSTILE_VALUES[0], description=HOSTILE_VALUES[1])),
            *[("add", add_body(p, tags={"t": v})) for p, v in zip(paths, HOSTILE_VALUES, strict=True)],
            ("txn", {"appId": HOSTILE_VALUES[2], "version": 1}),
        ],
        location=root.as_uri(),
    )
    store.commit(
        "other", [("protocol", PROTOCOL), ("metaData", metadata_body())], location=(tmp_path / "o").as_uri()
    )
    # removing one file removes exactly that one (no pattern matching, no injection)
    store.commit("t", [("remove", {"path": paths[4], "deletionTimestamp": 1, "dataChange": True})])
    table = store.get_table("t")
    active = sorted(f.path for f in store.active_files(table.id, 1))
    assert active == sorted(p for i, p in enumerate(paths) if i != 4)
    assert store.snapshot(table.id, 1).txns == [
        json.dumps({"txn": {"appId": HOSTILE_VALUES[2], "version": 1}}, separators=(",", ":"))
    ]
    # a name lookup that bypasses the name rule: bound, so "' OR '1'='1" matches no row
    with store.engine.connect() as conn:
        for value in HOSTILE_VALUES:
            with pytest.raises(TableNotFoundError):
                store._get_table(conn, value)
    assert sorted(t.name for t in store.list_tables()) == ["other", "t"]
    Publisher(store).publish("t")
    first = json.loads((root / LOG_DIR / commit_name(0)).read_text().splitlines()[2])["metaData"]
    assert (first["name"], first["description"]) == (HOSTILE_VALUES[0], HOSTILE_VALUES[1])
    dt = DeltaTable(str(root))
    assert sorted(unquote(u.rsplit("/", 1)[-1]) for u in dt.file_uris()) == sorted(
        unquote(p) for i, p in enumerate(paths) if i != 4
    )
    store.close()


def _dynamic_sql_sites() -> set[tuple[str, str]]:
    """(module, function) of every call in the store building SQL text from anything but literals."""
    sql_calls = {"text", "exec_driver_sql", "copy", "execute", "executemany"}
    root = Path(__file__).resolve().parents[1] / "include" / "delta_mirror" / "store"
    sites: set[tuple[str, str]] = set()
    for path in sorted(root.rglob("*.py")):
        tree = parse_source(path)
        for func in ast.walk(tree):
            if not isinstance(func, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for node in ast.walk(func):
                if not (isinstance(node, ast.Call) and node.args):
                    continue
                name = (
                    node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
                )
                if name not in sql_calls:
                    continue
                arg = node.args[0]
                literal = isinstance(arg, ast.Constant) or (
                    isinstance(arg, ast.BinOp)
                    and all(isinstance(n, ast.Constant) for n in (arg.left, arg.right))
                )
                built = isinstance(arg, ast.JoinedStr | ast.BinOp) or (
                    isinstance(arg, ast.Call) and getattr(arg.func, "attr", "") in ("format", "join")
                )
                if built and not literal:
                    sites.add((str(path.relative_to(root)), func.name))
    return sites


def test_sql_text_is_built_from_runtime_values_only_in_these_reviewed_places() -> None:
    # Each one interpolates no value that comes from a user: reviewed, and listed so a new one fails.
    assert _dynamic_sql_sites() == {
        ("backends/postgresql.py", "migration_lock"),  # a module constant (the advisory lock key)
        ("reads.py", "_file_payload_query"),  # 'add' / 'remove' and constant SQL fragments
        ("mirror_status.py", "_mark_succeeded_pg"),  # placeholder names (:v0, :s0...), values bound
        ("mirror_status.py", "_mark_commits_succeeded"),  # _SUCCESS_SET with two column names, values bound
        ("reads.py", "_copy_blocks"),  # COPY cannot bind: integer parameters only, checked
        # the import's bulk load: table and column names from the module's constants, values bound
        # (executemany) or sent as COPY data, never in the statement
        ("bulk_load.py", "_copy"),
        ("bulk_load.py", "_insert"),
        ("mysql_bulk.py", "_insert"),  # the same on MySQL (constant table and column names)
        ("watch.py", "_listen_loop"),  # LISTEN takes no parameter: the module constant CHANNEL
        # fleet status: constant WHERE fragments (an expanding IN :ids or nothing), values bound
        ("mirror_status.py", "fleet_rows"),
        ("mirror_status.py", "q"),
        ("lag.py", "lag_peaks"),
        # DuckDB's id sequences: the table names are the migration's own literals ("dl_tables"...)
        ("migrations/versions/0001_initial.py", "_id"),
    }


@pytest.mark.postgres
def test_copy_refuses_anything_but_integer_parameters(pg_store_url: str) -> None:
    from sqlalchemy import text

    from delta_mirror.store.reads import _copy_blocks, _copy_lines

    store = SqlStore(pg_store_url)
    store.init()
    with store.engine.connect() as conn:
        with pytest.raises(TypeError, match="must be integers"):
            list(_copy_blocks(conn, text("SELECT :v"), {"v": "1'; DROP TABLE dl_tables;--"}, 10))
        with pytest.raises(TypeError, match="must be integers"):
            list(_copy_lines(conn, text("SELECT :v"), {"v": "1'; DROP TABLE dl_tables;--"}, 10))
        assert list(_copy_blocks(conn, text("SELECT CAST(:v AS TEXT)"), {"v": 7}, 10)) == [b"7\n"]
        assert list(_copy_lines(conn, text("SELECT CAST(:v AS TEXT)"), {"v": 7}, 10)) == [["7"]]
    store.close()


# -- (d) nothing written outside <table root>/_delta_log/ ------------------------------------------------


def _tree(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
        for p in sorted(root.rglob("*"))
        if not p.is_symlink()
    }


ESCAPING = [
    "../x.json",
    "../../x.json",
    "_delta_log/../x.json",
    "_delta_log/../../x.json",
    "_delta_log/%2e%2e/x.json",
    "_delta_log/%2E%2E/%2E%2E/x.json",
    "/etc/x.json",
    "_delta_log",
    "_delta_log/",
    "_delta_log//x.json",
    "_delta_log/./x.json",
    "_delta_log\\..\\..\\x.json",
    "_delta_log/x\x00.json",
    "data.parquet",
    "part-0.parquet",
    "_delta_logx/y.json",
    "x/_delta_log/y.json",
    "",
]


@pytest.mark.parametrize("location", ["local", "s3"])
def test_the_storage_layer_refuses_every_path_outside_delta_log(tmp_path: Path, location: str) -> None:
    sandbox = tmp_path / "sandbox"
    root = sandbox / "table"
    root.mkdir(parents=True)
    uri = root.as_uri() if location == "local" else "s3://bucket/table"  # refused before any request
    store = open_store(uri)
    before = _tree(sandbox)
    for path in ESCAPING:
        for write in (store.put_if_absent, store.put):
            with pytest.raises(PermanentError, match="only writes below _delta_log/"):
                write(path, b"x")
        with pytest.raises(PermanentError, match="only writes below _delta_log/"):
            store.delete(path)
    assert _tree(sandbox) == before


def test_a_symlinked_delta_log_is_refused_and_nothing_is_written_through_it(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "keep.txt").write_text("keep")
    for target in (elsewhere, tmp_path / "missing-target"):
        root = tmp_path / f"table-{target.name}"
        root.mkdir()
        (root / LOG_DIR).symlink_to(target, target_is_directory=True)
        store = open_store(root.as_uri())
        for write in (store.put_if_absent, store.put):
            with pytest.raises(PermanentError, match="symlink"):
                write(f"{LOG_DIR}/{commit_name(0)}", b"{}\n")
            with pytest.raises(PermanentError, match="symlink"):
                write(f"{LOG_DIR}/_sidecars/x.parquet", b"x")
        with pytest.raises(PermanentError, match="symlink"):
            store.delete(f"{LOG_DIR}/{commit_name(0)}")
    assert sorted(p.name for p in elsewhere.iterdir()) == ["keep.txt"]
    assert not (tmp_path / "missing-target").exists()
    # a symlinked folder below _delta_log/ leading out of it, too
    root = tmp_path / "table-sidecars"
    (root / LOG_DIR).mkdir(parents=True)
    (root / LOG_DIR / "_sidecars").symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(PermanentError, match="symlink"):
        open_store(root.as_uri()).put_if_absent(f"{LOG_DIR}/_sidecars/x.parquet", b"x")
    assert sorted(p.name for p in elsewhere.iterdir()) == ["keep.txt"]


def test_publishing_into_a_symlinked_delta_log_fails_clearly_and_writes_nothing(
    store: SqlStore, store_url: str, tmp_path: Path
) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    root = tmp_path / "t"
    store.commit(
        "t",
        [("protocol", PROTOCOL), ("metaData", metadata_body()), ("add", add_body("a.parquet"))],
        location=root.as_uri(),
    )
    root.mkdir()
    (root / LOG_DIR).symlink_to(elsewhere, target_is_directory=True)
    result = cli("--store", store_url, "mirror", "t", env=clean_env())
    assert result.returncode == 1, result.stderr
    assert_one_error_line(result.stderr, "table 't'", "symlink", "make _delta_log/ a real folder")
    assert list(elsewhere.iterdir()) == []
    table = store.get_table("t")
    assert store.last_published_version(table.id) is None
    store.close()


def test_symlinked_log_files_are_never_written_through(tmp_path: Path) -> None:
    outside = tmp_path / "outside.json"
    outside.write_bytes(b"precious\n")
    root = tmp_path / "table"
    (root / LOG_DIR).mkdir(parents=True)
    (root / LOG_DIR / commit_name(0)).symlink_to(outside)
    (root / LOG_DIR / LAST_CHECKPOINT).symlink_to(outside)
    store = SqlStore(f"sqlite:///{tmp_path / 'store.db'}")
    store.init()
    store.commit(
        "t",
        [("protocol", PROTOCOL), ("metaData", metadata_body()), ("add", add_body("a.parquet"))],
        location=root.as_uri(),
    )
    with pytest.raises(PublishConflictError):  # a different "file" is there: halt, never overwrite
        Publisher(store).publish("t")
    open_store(root.as_uri()).put(f"{LOG_DIR}/{LAST_CHECKPOINT}", b"{}")  # replaces the link, not its target
    assert outside.read_bytes() == b"precious\n"
    assert not (root / LOG_DIR / LAST_CHECKPOINT).is_symlink()
    assert store.get_table("t").state == "HALTED"
    store.close()


def test_hostile_table_names_never_reach_a_storage_path(tmp_path: Path) -> None:
    """Names are refused before anything happens, and a table's files go only to its location."""
    store = SqlStore(f"sqlite:///{tmp_path / 'store.db'}")
    store.init()
    for name in ("../escape", "a/../../b", "t/../../x", "/abs"):
        with pytest.raises(MirrorError, match="invalid table name"):
            store.commit(
                name,
                [("protocol", PROTOCOL), ("metaData", metadata_body())],
                location=(tmp_path / "t").as_uri(),
            )
    store.commit(
        "_delta_log",
        [("protocol", PROTOCOL), ("metaData", metadata_body())],
        location=(tmp_path / "t").as_uri(),
    )
    Publisher(store).publish("_delta_log")
    assert sorted(str(p.relative_to(tmp_path)) for p in (tmp_path / "t").rglob("*")) == [
        "t/_delta_log",
        f"t/_delta_log/{commit_name(0)}",
    ]
    assert not any(p.name.startswith("escape") for p in tmp_path.rglob("*"))
    store.close()
    assert os.listdir(tmp_path / "t" / LOG_DIR) == [commit_name(0)]
