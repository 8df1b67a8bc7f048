"""A part used without its extra: one line naming the extra to install (``delta_mirror.extras``).

Absence is real in each case: a subprocess whose import system refuses the module (a meta-path
finder that raises ``ModuleNotFoundError``, as an uninstalled package does) or holds ``None`` for it
in ``sys.modules``; nothing is mocked inside the package. The wheel test
(``tests/packaging/test_installed_wheel.py``) also runs the CLI in a base install that lacks them.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from support.cli import assert_one_error_line, clean_env
from support.processes import fresh_python

from delta_mirror.errors import ErrorClass, PermanentError
from delta_mirror.extras import MissingExtraError, installed, require

#: Run first in each subprocess: modules named in BLOCKED cannot be imported (nor found).
BLOCKER = textwrap.dedent(
    """
    import sys

    class _Uninstalled:
        def find_spec(self, name, path=None, target=None):
            if name.partition(".")[0] in BLOCKED:
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    sys.meta_path.insert(0, _Uninstalled())
    """
)


def run_without(
    modules: list[str], code: str, *argv: str, tmp_path: Path
) -> subprocess.CompletedProcess[str]:
    """``code`` in a fresh interpreter where ``modules`` are not installed."""
    script = tmp_path / "without.py"
    script.write_text(f"BLOCKED = {modules!r}\n{BLOCKER}\n{textwrap.dedent(code)}", encoding="utf-8")
    return subprocess.run(
        [sys.executable, str(script), *argv],
        capture_output=True,
        text=True,
        env=clean_env(DELTA_MIRROR_HOME=str(tmp_path / "home")),
        timeout=120,
    )


def test_require_names_the_extra_and_the_install_command() -> None:
    with pytest.raises(MissingExtraError) as caught:
        require("delta_mirror_no_such_module", "mysql", "the MySQL/MariaDB store")
    err = caught.value
    assert str(err) == (
        "the MySQL/MariaDB store needs the mysql extra (delta_mirror_no_such_module is not installed)"
        " — pip install 'delta-mirror[mysql]'"
    )
    assert isinstance(err, PermanentError) and err.error_class == ErrorClass.PERMANENT
    assert (err.extra, err.module) == ("mysql", "delta_mirror_no_such_module")


def test_require_passes_an_installed_module_without_importing_it() -> None:
    code = (
        "import sys\nfrom delta_mirror.extras import require\n"
        "require('duckdb', 'duckdb', 'the DuckDB store')\nprint('duckdb' in sys.modules)\n"
    )
    assert fresh_python(code).strip() == "False"


def test_a_module_set_to_none_in_sys_modules_counts_as_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pymysql", None)
    assert not installed("pymysql")
    with pytest.raises(MissingExtraError, match=r"needs the mysql extra \(pymysql is not installed\)"):
        require("pymysql", "mysql", "the MySQL/MariaDB store")


@pytest.mark.parametrize(
    ("blocked", "url", "extra", "what"),
    [
        (["pymysql"], "mysql+pymysql://u:p@127.0.0.1:1/db", "mysql", "the MySQL/MariaDB store"),
        (["pymysql"], "mysql://u:p@127.0.0.1:1/db", "mysql", "the MySQL/MariaDB store"),
        (["duckdb"], "duckdb:///{tmp}/store.duckdb", "duckdb", "the DuckDB store"),
        (["duckdb_engine"], "duckdb:///{tmp}/store.duckdb", "duckdb", "the DuckDB store"),
    ],
)
def test_a_store_whose_extra_is_missing_is_refused_before_any_connection(
    blocked: list[str], url: str, extra: str, what: str, tmp_path: Path
) -> None:
    code = """
    from delta_mirror.extras import MissingExtraError
    from delta_mirror.store import SqlStore
    try:
        SqlStore(sys.argv[1])
    except MissingExtraError as exc:
        print(exc)
    """
    out = run_without(blocked, code, url.format(tmp=tmp_path), tmp_path=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == (
        f"{what} needs the {extra} extra ({blocked[0]} is not installed) — pip install 'delta-mirror[{extra}]'"
    )
    assert not (tmp_path / "store.duckdb").exists()  # nothing created


CLI = """
from delta_mirror.cli import main
sys.argv[0] = "delta-mirror"
main()
"""


def test_the_cli_says_one_line_and_exits_1_for_a_store_whose_extra_is_missing(tmp_path: Path) -> None:
    out = run_without(
        ["pymysql"], CLI, "status", "--store", "mysql+pymysql://u:p@127.0.0.1:1/db", tmp_path=tmp_path
    )
    assert out.returncode == 1, out
    line = assert_one_error_line(out.stderr, "the mysql extra", "pip install 'delta-mirror[mysql]'")
    assert line == (
        "error: the MySQL/MariaDB store needs the mysql extra (pymysql is not installed)"
        " — pip install 'delta-mirror[mysql]'"
    )
    assert out.stdout == ""


def test_serve_without_the_service_extra_says_which_extra(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path / 'store.db'}"
    out = run_without(
        ["uvicorn"], CLI, "serve", "--no-auth", "--port", "0", "--store", store, tmp_path=tmp_path
    )
    assert out.returncode == 1, out
    assert_one_error_line(
        out.stderr,
        "`delta-mirror serve` (the commit service) needs the service extra",
        "delta-mirror[service]",
    )


def test_the_duckdb_reader_and_spark_name_their_extras(tmp_path: Path) -> None:
    code = """
    from delta_mirror.extras import MissingExtraError
    from delta_mirror.jobs.validate.duckdb_reader import connect
    from delta_mirror.spark.session import get_spark
    for use in (connect, get_spark):
        try:
            use()
        except MissingExtraError as exc:
            print(exc)
    """
    out = run_without(["duckdb_extension_delta", "pyspark"], code, tmp_path=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        "the duckdb reader needs the duckdb extra (duckdb_extension_delta is not installed)"
        " — pip install 'delta-mirror[duckdb]'",
        "Spark needs the spark extra (pyspark is not installed) — pip install 'delta-mirror[spark]'",
    ]


def test_the_airflow_glue_without_airflow_names_the_airflow_extra(tmp_path: Path) -> None:
    code = """
    try:
        from delta_mirror.airflow import dags_from_config
    except Exception as exc:
        print(type(exc).__name__, exc)
    """
    out = run_without(["airflow"], code, tmp_path=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == (
        "MissingExtraError the Airflow glue (delta_mirror.airflow) needs the airflow extra"
        " (airflow is not installed) — pip install 'delta-mirror[airflow]'"
    )
