"""The ``delta-mirror`` process itself (issue 15: ``status --json`` at 1,000 tables within 1 s):
what it imports before a command runs, and the collector it turns off while starting."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from delta_mirror.store import SqlStore

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
    url = f"sqlite:///{tmp_path / 'store.db'}"
    store = SqlStore(url)
    store.init()
    store.create_table("t", (tmp_path / "t").as_uri())
    store.close()
    return url


def test_the_cli_starts_without_sqlalchemy_and_leaves_the_collector_on() -> None:
    probe = _run("--version")
    assert probe["code"] in (0, None)
    assert probe["before"] == []  # the store (and SQLAlchemy) loads when a command opens it
    assert probe["gc"] is True  # back on when the command ends, though it opened no store


def test_status_freezes_its_start_up_turns_the_collector_back_on_and_imports_no_writer_modules(
    tmp_path: Path,
) -> None:
    url = _store_with_table_t(tmp_path)
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
