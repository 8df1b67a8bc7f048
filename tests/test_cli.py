"""Specification of the ``delta-mirror`` command line, on real SQLite and real PostgreSQL.

The contract (init, commit, status, where the store is) is tested on the real executable in a
subprocess; the many refusals of bad input run in-process with click's CliRunner. Every refusal is
one ``error:`` line on stderr naming the table (and version when known) and what to do, a non-zero
exit code (1 failure, 3 conflict, 4 invalid data, 5 transient) and a store left exactly as it was.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from sqlalchemy import select
from store.store_kit import state as store_state
from support.builders import METADATA, PROTOCOL, add, lines, remove
from support.cli import assert_one_error_line, clean_env, executable

from delta_mirror.cli import cli
from delta_mirror.errors import PermanentError
from delta_mirror.store import SqlStore
from delta_mirror.store.schema import dl_tables

CREATE = lines(PROTOCOL, METADATA, add("a.parquet"))


def run(
    *args: str,
    env: dict[str, str] | None = None,
    stdin: bytes | None = None,
    cwd: Path | None = None,
    timeout: float = 60,
) -> subprocess.CompletedProcess[str]:
    """The real ``delta-mirror`` executable in a subprocess."""
    proc = subprocess.run(
        [*executable(), *args],
        input=stdin,
        capture_output=True,
        timeout=timeout,
        env=env if env is not None else clean_env(),
        cwd=cwd,
    )
    return subprocess.CompletedProcess(proc.args, proc.returncode, proc.stdout.decode(), proc.stderr.decode())


def state(url: str) -> dict[str, Any]:
    """Row counts and each table's latest version: equal before and after means 'unchanged'."""
    store = SqlStore(url)
    try:
        with store.engine.connect() as conn:
            names = conn.execute(select(dl_tables.c.name).order_by(dl_tables.c.name)).scalars().all()
        return {**store_state(store), "tables": names}
    finally:
        store.close()


def init_store(url: str) -> None:
    """Initialise in-process where `init` itself is not what the test is about (saves a process)."""
    store = SqlStore(url)
    store.init()
    store.close()


def committed_versions(url: str, name: str) -> list[int]:
    store = SqlStore(url)
    try:
        table = store.get_table(name)
        return [r.version for r in store.commit_rows(table.id, 0, 10**9)]
    finally:
        store.close()


# -- the contract, on the real executable ------------------------------------------------------------


@pytest.mark.all_backends
def test_init_is_idempotent_and_says_where_the_store_is(store_url: str) -> None:
    for _ in range(2):
        result = run("--store", store_url, "init")
        assert result.returncode == 0, result.stderr
        assert result.stdout.startswith("store ready: ")
        assert result.stderr == ""
    assert state(store_url)["counts"]["dl_tables"] == 0


def _concurrent_inits(store_url: str, n: int = 3) -> list[subprocess.Popen[bytes]]:
    """``n`` ``delta-mirror init`` processes on one store, started at once."""
    return [
        subprocess.Popen(
            [*executable(), "--store", store_url, "init"],
            env=clean_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for _ in range(n)
    ]


@pytest.mark.all_backends(but="duckdb")  # DuckDB: test_concurrent_init_on_one_duckdb_file_...
def test_concurrent_init_processes_all_succeed(store_url: str) -> None:
    procs = _concurrent_inits(store_url)
    for p in procs:
        _out, err = p.communicate(timeout=60)
        assert p.returncode == 0, err.decode()
    assert state(store_url)["counts"]["dl_tables"] == 0


@pytest.mark.duckdb
def test_concurrent_init_on_one_duckdb_file_succeeds_or_says_in_one_line_that_it_is_in_use(
    tmp_path: Path,
) -> None:
    """A DuckDB file takes one read-write process at a time: an ``init`` that finds it held by
    another fails with one line naming the reason, never a lock error's traceback, and the store
    ends initialised."""
    url = f"duckdb:///{tmp_path / 'store.duckdb'}"
    procs = _concurrent_inits(url)
    codes = []
    for p in procs:
        _out, err = p.communicate(timeout=60)
        codes.append(p.returncode)
        if p.returncode != 0:
            assert_one_error_line(err.decode(), "DuckDB", "another process")
    assert 0 in codes, codes
    assert state(url)["counts"]["dl_tables"] == 0


def test_commit_creates_the_table_and_prints_each_new_version(store_url: str, tmp_path: Path) -> None:
    init_store(store_url)
    actions = tmp_path / "v0.json"
    actions.write_bytes(CREATE)
    first = run(
        "commit", "t", "--actions", str(actions), "--location", str(tmp_path / "t"), "--store", store_url
    )
    assert (first.returncode, first.stdout, first.stderr) == (0, "0\n", "")
    from_stdin = run("--store", store_url, "commit", "t", "--actions", "-", stdin=lines(add("b.parquet")))
    assert (from_stdin.returncode, from_stdin.stdout) == (0, "1\n"), from_stdin.stderr
    (tmp_path / "v2.json").write_bytes(lines(remove("a.parquet")))
    expected = run(
        "--store", store_url, "commit", "t", "--actions", str(tmp_path / "v2.json"), "--expected-version", "2"
    )
    assert (expected.returncode, expected.stdout) == (0, "2\n"), expected.stderr
    assert committed_versions(store_url, "t") == [0, 1, 2]
    store = SqlStore(store_url)
    assert store.get_table("t").location == (tmp_path / "t").as_uri()
    store.close()


def test_status_lists_tables_and_reports_one_as_json(store_url: str, tmp_path: Path) -> None:
    init_store(store_url)
    # without a table config (tests/test_cli_coverage.py: with one, which tables a DAG publishes)
    no_config = clean_env(DELTA_MIRROR_CONFIG=str(tmp_path / "absent.yaml"))
    empty = CliRunner().invoke(cli, ["--store", store_url, "status"], env=no_config)
    assert (empty.exit_code, empty.stdout) == (0, "no tables\n")
    for name in ("alpha", "beta"):
        r = run(
            "--store",
            store_url,
            "commit",
            name,
            "--actions",
            "-",
            "--location",
            str(tmp_path / name),
            stdin=CREATE,
        )
        assert r.returncode == 0, r.stderr
    assert (
        invoke(["--store", store_url, "commit", "beta", "--actions", "-"], lines(add("b.parquet"))).stdout
        == "1\n"
    )
    text = run("--store", store_url, "status", env=no_config)
    assert text.returncode == 0, text.stderr
    assert text.stdout.splitlines()[0].split()[:3] == ["TABLE", "STATE", "COMMITTED"]
    assert [line.split()[0] for line in text.stdout.splitlines()[1:]] == ["alpha", "beta"]
    one = run("--store", store_url, "status", "beta", "--json", env=no_config)
    assert one.returncode == 0, one.stderr
    report = json.loads(one.stdout)
    assert report["table"] == "beta" and report["state"] == "ACTIVE"
    assert report["latest_committed"] == 1
    assert report["last_published"] is None
    assert report["pending"] == 2 and report["versions_behind"] == 2
    every = json.loads(run("status", "--json", "--store", store_url, env=no_config).stdout)
    assert [r["table"] for r in every] == ["alpha", "beta"]


@pytest.mark.slow
def test_the_store_url_is_taken_before_or_after_the_subcommand_or_from_the_environment(
    store_url: str, tmp_path: Path
) -> None:
    elsewhere = f"sqlite:///{tmp_path / 'other' / 'store.db'}"  # an uninitialised decoy
    assert run("init", "--store", store_url).returncode == 0
    assert (
        run(
            "--store",
            store_url,
            "commit",
            "t",
            "--actions",
            "-",
            "--location",
            str(tmp_path / "t"),
            stdin=CREATE,
        ).stdout
        == "0\n"
    )
    from_env = run("status", "t", "--json", env=clean_env(DELTA_MIRROR_STORE=store_url))
    assert from_env.returncode == 0, from_env.stderr
    assert json.loads(from_env.stdout)["latest_committed"] == 0
    decoy = clean_env(DELTA_MIRROR_STORE=elsewhere)
    for args in (("--store", store_url, "status", "t"), ("status", "t", "--store", store_url)):
        result = run(*args, env=decoy)
        assert result.returncode == 0, (args, result.stderr)
        assert result.stdout.splitlines()[1].split()[0] == "t"
    assert_one_error_line(run("status", env=decoy).stderr, "not initialised", "delta-mirror init")


@pytest.mark.slow
def test_the_default_store_is_sqlite_under_delta_mirror_home(tmp_path: Path) -> None:
    home = tmp_path / "home"
    env = clean_env(DELTA_MIRROR_HOME=str(home))
    init = run("init", env=env)
    assert init.returncode == 0, init.stderr
    assert init.stdout == f"store ready: sqlite:///{home / 'store.db'}\n"
    assert (
        run("commit", "t", "--actions", "-", "--location", str(tmp_path / "t"), env=env, stdin=CREATE).stdout
        == "0\n"
    )
    assert json.loads(run("status", "t", "--json", env=env).stdout)["latest_committed"] == 0
    assert committed_versions(f"sqlite:///{home / 'store.db'}", "t") == [0]
    # Without DELTA_MIRROR_HOME the store is ./.delta-mirror/store.db.
    cwd = tmp_path / "work"
    cwd.mkdir()
    assert run("init", env=clean_env(), cwd=cwd).returncode == 0
    assert (cwd / ".delta-mirror" / "store.db").is_file()


def test_status_before_init_says_run_init(store_url: str) -> None:
    result = run("--store", store_url, "status")
    assert result.returncode == 1
    assert_one_error_line(result.stderr, "not initialised", "run `delta-mirror init`")
    assert result.stdout == ""
    store = SqlStore(store_url)
    try:
        with pytest.raises(PermanentError, match="not initialised"):
            store.ensure_initialised()  # `status` created nothing
    finally:
        store.close()


def test_read_only_commands_where_there_is_no_store_create_none(tmp_path: Path) -> None:
    for args in (("status",), ("health", "t")):
        result = run(*args, env=clean_env(), cwd=tmp_path)
        assert result.returncode == 1, result.stderr
        assert_one_error_line(result.stderr, "no store here yet", "delta-mirror init")
    assert list(tmp_path.iterdir()) == []  # no .delta-mirror/store.db left behind


def test_a_transient_database_error_does_not_claim_the_cli_retried() -> None:
    result = invoke(["--store", "postgresql+psycopg://u@127.0.0.1:1/db", "status"])  # nothing listens
    assert result.exit_code == 5, result.stderr
    line = assert_one_error_line(result.stderr, "not retried by this command: safe to run it again")
    assert "retried automatically" not in line


@pytest.mark.parametrize(
    ("url", "needle"),
    [
        ("mssql://u@localhost/db", "unsupported store backend 'mssql'"),
        ("redis://localhost", "unsupported store"),
        ("no-scheme-at-all", "store URL is not valid"),
    ],
)
def test_an_unsupported_store_url_is_refused_in_one_line(url: str, needle: str) -> None:
    for args in (("--store", url, "status"), ("init", "--store", url)):
        result = invoke(list(args))
        assert result.exit_code == 1
        assert_one_error_line(result.stderr, needle)
    result = run("--store", url, "status")
    assert result.returncode == 1
    assert_one_error_line(result.stderr, needle)


@pytest.mark.all_backends(but="duckdb")  # several processes on one store
def test_racing_cli_processes_get_exactly_one_winner_per_version(store_url: str, tmp_path: Path) -> None:
    init_store(store_url)
    created = invoke(
        ["--store", store_url, "commit", "t", "--actions", "-", "--location", str(tmp_path / "t")], CREATE
    )
    assert created.stdout == "0\n", created.stderr
    writers, rounds = 2, 4
    for w in range(writers):
        for r in range(rounds):
            (tmp_path / f"w{w}r{r}.json").write_bytes(lines(add(f"w{w}-r{r}.parquet")))
    for r in range(rounds):
        version = r + 1
        procs = [
            subprocess.Popen(
                [
                    *executable(),
                    "--store",
                    store_url,
                    "commit",
                    "t",
                    "--actions",
                    str(tmp_path / f"w{w}r{r}.json"),
                    "--expected-version",
                    str(version),
                ],
                env=clean_env(),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
            for w in range(writers)
        ]
        outcomes = []
        for p in procs:
            out, err = p.communicate(timeout=60)
            outcomes.append((p.returncode, out.decode(), err.decode()))
        winners = [o for o in outcomes if o[0] == 0]
        losers = [o for o in outcomes if o[0] != 0]
        assert len(winners) == 1, outcomes
        assert winners[0][1] == f"{version}\n"
        for code, lost_out, lost_err in losers:
            assert code == 3, lost_err
            assert lost_out == ""
            assert_one_error_line(lost_err, "table 't'", f"version {version}")
    assert committed_versions(store_url, "t") == list(range(rounds + 1))


# -- bad input: one line, non-zero, the store unchanged (CliRunner, both backends) ----------------------


@pytest.fixture(scope="module")
def populated(module_store_url: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A store holding table 't' at versions 0..1 (a.parquet, b.parquet), shared by the refusal cases."""
    tmp, url = tmp_path_factory.mktemp("populated"), module_store_url
    store = SqlStore(url)
    store.init()
    store.create_table("t", (tmp / "t").as_uri())
    store.commit("t", [(k, b) for a in (PROTOCOL, METADATA, add("a.parquet")) for k, b in a.items()])
    store.commit("t", [("add", add("b.parquet")["add"])])
    store.close()
    (tmp / "delta-table" / "_delta_log").mkdir(parents=True)
    (tmp / "delta-table" / "_delta_log" / "00000000000000000000.json").write_bytes(CREATE)
    (tmp / "not-delta").mkdir()
    (tmp / "not-delta" / "data.parquet").write_bytes(b"PAR1")
    return {"url": url, "tmp": tmp}


def invoke(args: list[str], stdin: bytes | None = None) -> Any:
    runner = CliRunner()
    return runner.invoke(cli, args, input=stdin, env={"DELTA_MIRROR_STORE": None, "DELTA_MIRROR_HOME": None})


# (case id, commit args after the store, stdin, exit code, what the line must name)
BAD_COMMITS: list[tuple[str, list[str], bytes, int, tuple[str, ...]]] = [
    ("malformed-json", [], b'{"add": {"path": "x.parquet", \n', 4, ("table 't'", "line 1: malformed JSON")),
    ("malformed-second-line", [], lines(add("x")) + b"{nope}\n", 4, ("line 2: malformed JSON",)),
    ("nan", [], b'{"add": {"path": "x", "size": NaN}}\n', 4, ("malformed JSON",)),
    ("not-an-object", [], b"[1, 2]\n", 4, ("exactly one key",)),
    ("empty", [], b"\n", 4, ("no actions",)),
    ("non-utf8", [], b'{"add": {"path": "caf\xe9.parquet"}}\n', 4, ("not valid UTF-8",)),
    (
        "add-without-path",
        [],
        lines({"add": {"size": 1, "partitionValues": {}, "modificationTime": 1, "dataChange": True}}),
        4,
        ("version 2", "missing required field 'path'"),
    ),
    (
        "add-without-size",
        [],
        lines({"add": {"path": "x", "partitionValues": {}, "modificationTime": 1, "dataChange": True}}),
        4,
        ("version 2", "missing required field 'size'"),
    ),
    (
        "metadata-without-schema",
        [],
        lines({"metaData": {k: v for k, v in METADATA["metaData"].items() if k != "schemaString"}}),
        4,
        ("version 2", "'schemaString'"),
    ),
    (
        "protocol-without-reader-version",
        [],
        lines({"protocol": {"minWriterVersion": 2}}),
        4,
        ("'minReaderVersion'",),
    ),
    (
        "reader-features-below-3",
        [],
        lines(
            {
                "protocol": {
                    "minReaderVersion": 2,
                    "minWriterVersion": 7,
                    "readerFeatures": [],
                    "writerFeatures": [],
                }
            }
        ),
        4,
        ("readerFeatures is only allowed with minReaderVersion 3",),
    ),
    (
        "writer-features-below-7",
        [],
        lines({"protocol": {"minReaderVersion": 1, "minWriterVersion": 5, "writerFeatures": ["appendOnly"]}}),
        4,
        ("writerFeatures is only allowed with minWriterVersion 7",),
    ),
    ("negative-size", [], lines(add("x.parquet", size=-1)), 4, ("version 2", "must not be negative")),
    ("dot-dot", [], lines(add("../x")), 4, ("version 2", "escapes the table root")),
    ("nested-dot-dot", [], lines(add("a/../../x")), 4, ("escapes the table root",)),
    ("percent-encoded-dot-dot", [], lines(add("%2E%2E/x")), 4, ("escapes the table root",)),
    ("other-bucket", [], lines(add("s3://other-bucket/x")), 4, ("outside the table root",)),
    ("absolute-path", [], lines(add("/abs/path")), 4, ("relative to the table root",)),
    ("remove-unknown-file", [], lines(remove("ghost.parquet")), 4, ("version 2", "not an active file")),
    ("two-metadata", [], lines(METADATA, METADATA), 4, ("version 2", "2 'metaData' actions")),
    ("duplicate-add", [], lines(add("n.parquet"), add("n.parquet")), 4, ("version 2", "duplicate add")),
    ("unknown-action", [], lines({"fooBar": {"a": 1}}), 4, ("version 2", "unknown action type 'fooBar'")),
    ("version-gap", ["--expected-version", "9"], lines(add("n.parquet")), 4, ("version 9", "version gap")),
    (
        "version-taken",
        ["--expected-version", "1"],
        lines(add("n.parquet")),
        3,
        ("version 1", "already committed"),
    ),
    (
        "valid-then-invalid",
        [],
        lines(add("ok.parquet"), remove("a.parquet"), remove("ghost")),
        4,
        ("not an active file",),
    ),
]


@pytest.mark.parametrize(
    ("case", "extra", "stdin", "code", "needles"), BAD_COMMITS, ids=[c[0] for c in BAD_COMMITS]
)
def test_bad_commits_are_refused_in_one_line_and_change_nothing(
    populated: dict[str, Any], case: str, extra: list[str], stdin: bytes, code: int, needles: tuple[str, ...]
) -> None:
    url = populated["url"]
    before = state(url)
    result = invoke(["--store", url, "commit", "t", "--actions", "-", *extra], stdin)
    assert result.exit_code == code, (result.stdout, result.stderr, result.exception)
    assert isinstance(result.exception, SystemExit)
    assert result.stdout == ""
    assert_one_error_line(result.stderr, "table 't'", *needles)
    assert state(url) == before


@pytest.mark.parametrize(
    "name", ["x'; drop table dl_tables;--", "t; DELETE FROM dl_commits", 'a"b', "a b", "../t", "t%_"]
)
def test_table_names_with_sql_metacharacters_are_refused_and_the_store_is_intact(
    populated: dict[str, Any], name: str
) -> None:
    url, tmp = populated["url"], populated["tmp"]
    before = state(url)
    for args in (
        ["commit", name, "--actions", "-", "--location", str(tmp / "new")],
        ["status", name],
        ["import", str(tmp / "delta-table"), "--table", name],
    ):
        result = invoke(["--store", url, *args], CREATE)
        assert result.exit_code == 2, (args, result.stderr, result.exception)  # usage, as docs/cli.md says
        assert_one_error_line(result.stderr, "invalid table name")
    assert state(url) == before
    assert state(url)["tables"] == ["t"]


def test_resume_says_whether_the_table_was_halted(populated: dict[str, Any]) -> None:
    url = populated["url"]
    never = invoke(["--store", url, "resume", "t"])
    assert never.exit_code == 0, never.stderr
    assert never.stdout == "'t' was not halted and has no failed versions: nothing to resume\n"
    store = SqlStore(url)
    try:
        store.halt_table(store.get_table("t").id, "test", None)
    finally:
        store.close()
    halted = invoke(["--store", url, "resume", "t"])
    assert halted.exit_code == 0 and halted.stdout.startswith("'t' is active again"), halted.stdout
    assert state(url)["tables"] == ["t"]


@pytest.mark.parametrize(
    ("args", "stdin", "exit_code", "needles"),
    [
        pytest.param(
            ["commit", "nope", "--actions", "-"],
            CREATE,
            1,
            ("table 'nope'", "no table named 'nope'"),
            id="an-unknown-table-without-a-location",
        ),
        pytest.param(
            ["commit", "fresh", "--actions", "-", "--location", "{tmp}/fresh"],
            lines(PROTOCOL, METADATA, add("../escape.parquet")),
            4,
            ("table 'fresh'", "version 0", "escapes the table root"),
            id="a-refused-first-commit-leaves-no-empty-table-behind",
        ),
        pytest.param(
            ["commit", "fresh", "--actions", "-", "--location", "{tmp}/delta-table"],
            CREATE,
            1,
            ("table 'fresh'", "already holds a Delta log", "delta-mirror import"),
            id="a-new-table-over-an-existing-delta-log",
        ),
        pytest.param(
            ["commit", "t", "--actions", "-", "--location", "{tmp}/elsewhere"],
            lines(add("n.parquet")),
            1,
            ("table 't'", "not"),
            id="a-location-other-than-the-tables",
        ),
    ],
)
def test_a_refused_commit_says_why_in_one_line_and_changes_nothing(
    populated: dict[str, Any], args: list[str], stdin: bytes, exit_code: int, needles: tuple[str, ...]
) -> None:
    url, tmp = populated["url"], populated["tmp"]
    before = state(url)
    result = invoke(["--store", url, *(a.format(tmp=tmp) for a in args)], stdin)
    assert result.exit_code == exit_code, (result.stderr, result.exception)
    assert_one_error_line(result.stderr, *needles)
    assert state(url) == before


@pytest.mark.parametrize("folder", ["not-delta", "missing-folder"])
def test_importing_a_folder_that_is_not_a_delta_table_says_so(populated: dict[str, Any], folder: str) -> None:
    url, tmp = populated["url"], populated["tmp"]
    before = state(url)
    result = invoke(["--store", url, "import", str(tmp / folder), "--table", "imp"])
    assert result.exit_code == 1, (result.stderr, result.exception)
    assert_one_error_line(result.stderr, "table 'imp'", "not a Delta table")
    assert state(url) == before


def test_a_store_in_an_unusable_folder_is_one_line(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    result = invoke(["--store", f"sqlite:///{blocker}/sub/store.db", "init"])
    assert result.exit_code == 1
    assert_one_error_line(result.stderr, "cannot create the folder")


# -- a location the store cannot reach: a clear message, quickly -------------------------------------


def test_commit_and_import_to_an_unreachable_location_fail_fast_and_clearly(
    store_url: str, tmp_path: Path
) -> None:
    init_store(store_url)
    before = state(store_url)
    env = clean_env(
        AWS_ENDPOINT_URL="http://127.0.0.1:1",
        AWS_ACCESS_KEY_ID="test",
        AWS_SECRET_ACCESS_KEY="test",
        AWS_REGION="us-east-1",
        AWS_ALLOW_HTTP="true",
        NO_PROXY="127.0.0.1,localhost",
    )
    for args, stdin in (
        (["commit", "far", "--actions", "-", "--location", "s3://no-such-bucket/far"], CREATE),
        (["import", "s3://no-such-bucket/src", "--table", "far"], None),
    ):
        started = time.monotonic()
        result = run("--store", store_url, *args, env=env, stdin=stdin, timeout=90)
        elapsed = time.monotonic() - started
        assert elapsed < 60, f"{args[0]} took {elapsed:.0f}s against an unreachable endpoint"
        assert result.returncode != 0
        assert_one_error_line(result.stderr, "table 'far'", "s3://no-such-bucket/")
    assert state(store_url) == before


def test_help_and_version_work_without_a_store() -> None:
    assert run("--version").stdout.startswith("delta-mirror, version ")
    assert "commit" in run("--help").stdout


def test_the_cli_runs_as_a_module_with_every_command() -> None:
    import sys

    proc = subprocess.run(
        [sys.executable, "-m", "delta_mirror.cli", "--help"], capture_output=True, text=True, env=clean_env()
    )
    assert proc.returncode == 0, proc.stderr
    listed = set(proc.stdout.split("Commands:")[1].split())
    commands = {"checkpoint", "commit", "health", "import", "init", "mirror", "reconcile", "resume"}
    assert commands | {"serve", "status", "validate"} <= listed


def test_every_option_of_every_command_says_what_it_does() -> None:
    """``--help`` is the CLI's reference: no option is listed without a line of help."""
    import click

    def commands(group: click.Group, prefix: str = "") -> list[tuple[str, click.Command]]:
        found: list[tuple[str, click.Command]] = []
        for name, command in sorted(group.commands.items()):
            if isinstance(command, click.Group):
                found += commands(command, f"{prefix}{name} ")
            else:
                found.append((f"{prefix}{name}", command))
        return found

    every = commands(cli)
    assert {"commit", "mirror", "recover", "serve", "status", "validate"} <= {name for name, _ in every}
    silent = [
        f"{name} {'/'.join(p.opts)}"
        for name, command in every
        for p in command.params
        if isinstance(p, click.Option) and not p.hidden and not p.help
    ]
    assert silent == []
