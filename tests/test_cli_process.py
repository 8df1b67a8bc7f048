"""The ``delta-mirror`` process itself (issue 15: ``status --json`` at 1,000 tables within 1 s):
what it imports before a command runs, and the collector it turns off while starting."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from support.stores import sqlite_store

# Run as ``delta-mirror``: main() from a fresh interpreter, then what the process is left with.
_PROBE = """
import gc, json, sys
from delta_mirror.cli import main
before = sorted(m for m in ("sqlalchemy", "psycopg", "yaml", "alembic") if m in sys.modules)
try:
    main(sys.argv[1:])
except SystemExit as exc:
    code = exc.code
heavy = ("alembic", "yaml", "pyarrow", "deltalake", "boto3", "sqlalchemy.orm", "airflow")
print(json.dumps({"code": code, "before": before, "gc": gc.isenabled(), "frozen": gc.get_freeze_count(),
                  "heavy": sorted(m for m in heavy if m in sys.modules)}))
"""


def _run(*argv: str) -> dict[str, object]:
    out = subprocess.run(
        [sys.executable, "-c", _PROBE, *argv], capture_output=True, text=True, check=True, timeout=120
    )
    result: dict[str, object] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def _store_with_table_t(tmp_path: Path) -> str:
    url, store = sqlite_store(tmp_path)
    store.create_table("t", (tmp_path / "t").as_uri())
    store.close()
    return url


def test_the_cli_starts_without_sqlalchemy_and_leaves_the_collector_on() -> None:
    probe = _run("--version")
    assert probe["code"] in (0, None)
    assert probe["before"] == []  # the store (and SQLAlchemy) loads when a command opens it
    assert probe["gc"] is True  # back on when the command ends, though it opened no store


def test_status_freezes_its_start_up_turns_the_collector_back_on_and_imports_no_writer_modules(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the table config's parser loads only when a config file exists (it says which tables a DAG
    # publishes: health/coverage.py)
    url = _store_with_table_t(tmp_path)
    monkeypatch.setenv("DELTA_MIRROR_CONFIG", str(tmp_path / "absent.yaml"))
    probe = _run("status", "--json", "--store", url)
    assert probe["code"] in (0, None)
    assert probe["gc"] is True
    assert isinstance(probe["frozen"], int) and probe["frozen"] > 10_000  # SQLAlchemy and the driver
    assert probe["heavy"] == []


def test_mirror_without_a_table_config_loads_no_yaml_and_no_pyarrow(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # every published version pays the process start: the table config's parser and the
    # checkpoint builder's Arrow load only when a config file exists or a checkpoint is due
    url = _store_with_table_t(tmp_path)
    monkeypatch.setenv("DELTA_MIRROR_CONFIG", str(tmp_path / "absent.yaml"))
    probe = _run("mirror", "t", "--json", "--store", url)
    assert probe["code"] in (0, None)
    assert probe["heavy"] == []


# What the ``checkpoint`` command has loaded when the store's read of the active files begins: the
# local engine sends that read first and loads Arrow while the server joins the file rows (issue 31).
_READ_PROBE = """
import json, sys
from delta_mirror.store.sql_store import SqlStore
from delta_mirror.cli import main
seen = []
read = SqlStore.iter_active_add_blocks
def probe(self, *args, **kwargs):
    seen.append(sorted(m for m in ("pyarrow", "delta_mirror.delta.checkpoint.layouts") if m in sys.modules))
    return read(self, *args, **kwargs)
SqlStore.iter_active_add_blocks = probe
try:
    main(sys.argv[1:])
except SystemExit as exc:
    code = exc.code
# never loaded by a local checkpoint, with why: alembic (only `init` migrates), sqlalchemy.orm (the
# store is SQLAlchemy Core), the other databases' dialects (a SQLite store here: no PostgreSQL nor
# MySQL driver), deltalake (validate's reader), yaml (no table config file), boto3/fsspec (storage
# is obstore), pandas (Arrow tables only), dateutil (Arrow infers a Python value's type with it:
# the builder's scalars are typed), airflow (never in the core)
never = ("alembic", "sqlalchemy.orm", "psycopg", "pymysql", "deltalake", "yaml", "boto3", "fsspec",
         "pandas", "dateutil", "airflow", "pyspark", "click.testing")
print(json.dumps({"code": code, "at_read": seen, "after": "pyarrow" in sys.modules,
                  "never": sorted(m for m in never if m in sys.modules)}))
"""


def test_a_local_checkpoint_starts_the_store_read_before_it_loads_arrow(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the server's join of the file rows is the longest wait of a big checkpoint: the ~0.1 s of
    # Arrow imports belong under it, not before the read is sent (importing the checkpoint
    # package's model once loaded the layouts, and pyarrow with them, before the read)
    from support.builders import METADATA, PROTOCOL, add

    from delta_mirror.jobs.publisher import Publisher

    url, store = sqlite_store(tmp_path)
    store.create_table("t", (tmp_path / "t").as_uri())
    store.commit("t", [(k, b) for a in (PROTOCOL, METADATA, add("a.parquet")) for k, b in a.items()])
    store.update_table(store.get_table("t").id, checkpoint_interval=1000)
    Publisher(store).publish("t")
    store.close()
    monkeypatch.setenv("DELTA_MIRROR_CONFIG", str(tmp_path / "absent.yaml"))
    out = subprocess.run(
        [sys.executable, "-c", _READ_PROBE, "--store", url, "checkpoint", "t"],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    probe = json.loads(out.stdout.strip().splitlines()[-1])
    assert probe["code"] in (0, None), out.stderr
    assert (tmp_path / "t" / "_delta_log" / "00000000000000000000.checkpoint.parquet").is_file()
    assert probe["at_read"] == [[]]  # one read, sent before Arrow and the layouts were imported
    assert probe["after"] is True  # the probe sees the build: Arrow is loaded once the read is out
    assert probe["never"] == []


# ``delta-mirror`` as the console script runs it (main() without argv), with what would show
# whether the interpreter's teardown ran: an object whose finalizer prints, kept by a module.
_EXIT_PROBE = """
import atexit, os, sys, threading, time, types
class Teardown:
    def __del__(self, write=os.write):  # os.write: print may be gone by then
        write(1, b"torn down\\n")
keep = sys.modules["keep"] = types.ModuleType("keep")
keep.obj = Teardown()  # freed when the teardown clears the modules
atexit.register(lambda: print("atexit ran", flush=True))
def work():  # runs on until the main thread has ended
    while threading.main_thread().is_alive():
        time.sleep(0.01)
    print("thread done", flush=True)
if sys.argv[1] == "thread":
    threading.Thread(target=work).start()
sys.argv = ["delta-mirror", *sys.argv[2:]]
from delta_mirror.cli import main
main()
"""


@pytest.mark.parametrize(
    ("args", "code"),
    [(("none", "--version"), 0), (("none", "no-such-command"), 2), (("thread", "--version"), 0)],
)
def test_the_process_ends_after_its_command_and_atexit_handlers_without_the_teardown(
    args: tuple[str, ...], code: int
) -> None:
    # the teardown frees SQLAlchemy, the driver and Arrow object by object (0.05-0.1 s of a
    # checkpoint) for nothing anyone sees; what can be seen still happens: exit code, output,
    # atexit handlers. A thread still running gets the interpreter's own exit, which waits for it.
    proc = subprocess.run(
        [sys.executable, "-c", _EXIT_PROBE, *args], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == code, proc.stderr
    lines = proc.stdout.splitlines()
    assert "atexit ran" in lines
    if code == 0:
        assert lines[0].startswith("delta-mirror, version ")
    else:
        assert "No such command" in proc.stderr
    if args[0] == "thread":
        assert lines[1:] == ["thread done", "atexit ran", "torn down"]
    else:
        assert "torn down" not in lines and lines[-1] == "atexit ran"
