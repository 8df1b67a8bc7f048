"""The user's DAG file (``dags_from_config``) and the provider metadata of the entry points.

The DAG file is parsed by Airflow's own ``DagBag`` from a dags folder outside the repository, as a
user's or a DAG bundle's would be. The installed-wheel test (tests/packaging) does the same in a fresh
virtualenv; these run in the development one, in seconds.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest
from dm_airflow_kit import config_yaml

from delta_mirror.airflow.dag_file import CONFIG_ENV

USER_DAG_FILE = """\
from delta_mirror.airflow import dags_from_config

globals().update(dags_from_config({path!r}))
"""


@pytest.fixture
def no_config_env(monkeypatch: pytest.MonkeyPatch, airflow_env: dict[str, str]) -> None:
    """No DELTA_MIRROR_CONFIG, and the one ``dags_from_config`` sets is undone after the test."""
    monkeypatch.setenv(CONFIG_ENV, "recorded")  # so that monkeypatch restores the outer value
    monkeypatch.delenv(CONFIG_ENV)


def parse(folder: Path) -> object:
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(folder))


def test_the_three_line_dag_file_builds_the_tables_dags_from_any_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_config_env: None
) -> None:
    config = tmp_path / "etc" / "tables.yaml"
    config.parent.mkdir()
    config.write_text(config_yaml({"orders": {}, "clicks": {"schedule": "@hourly"}}), encoding="utf-8")
    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "delta_mirror.py").write_text(USER_DAG_FILE.format(path=str(config)), encoding="utf-8")
    assert len(USER_DAG_FILE.splitlines()) == 3

    bag = parse(dags)
    assert bag.import_errors == {}  # type: ignore[attr-defined]
    ids = set(bag.dag_ids)  # type: ignore[attr-defined]
    assert {"delta_mirror__orders", "delta_mirror__clicks", "delta_mirror_reconcile"} <= ids
    # the tasks parsed from this file read their table's settings from the same config at run time
    assert os.environ[CONFIG_ENV] == str(config)


def test_a_relative_path_is_beside_the_dag_file_as_in_a_dag_bundle(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_config_env: None
) -> None:
    bundle = tmp_path / "bundle" / "v42"
    bundle.mkdir(parents=True)
    (bundle / "tables.yaml").write_text(config_yaml({"orders": {}}), encoding="utf-8")
    (bundle / "delta_mirror.py").write_text(USER_DAG_FILE.format(path="tables.yaml"), encoding="utf-8")
    monkeypatch.chdir(tmp_path)  # not the bundle's folder

    bag = parse(bundle)
    assert bag.import_errors == {}  # type: ignore[attr-defined]
    assert "delta_mirror__orders" in bag.dag_ids  # type: ignore[attr-defined]


def test_without_an_argument_the_config_is_delta_mirror_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, airflow_env: dict[str, str]
) -> None:
    config = tmp_path / "tables.yaml"
    config.write_text(config_yaml({"events": {}}), encoding="utf-8")
    monkeypatch.setenv(CONFIG_ENV, str(config))
    (tmp_path / "dm.py").write_text(
        "from delta_mirror.airflow import dags_from_config\n\nglobals().update(dags_from_config())\n",
        encoding="utf-8",
    )
    bag = parse(tmp_path)
    assert bag.import_errors == {}  # type: ignore[attr-defined]
    assert "delta_mirror__events" in bag.dag_ids  # type: ignore[attr-defined]


def test_a_missing_config_is_one_import_error_naming_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_config_env: None
) -> None:
    (tmp_path / "dm.py").write_text(USER_DAG_FILE.format(path="/nowhere/tables.yaml"), encoding="utf-8")
    bag = parse(tmp_path)
    (error,) = bag.import_errors.values()  # type: ignore[attr-defined]
    assert "cannot read the table config /nowhere/tables.yaml" in str(error)
    assert "DELTA_MIRROR_CONFIG" in str(error)


def test_the_provider_info_follows_airflows_schema_and_names_this_distribution() -> None:
    from airflow.providers_manager import _create_provider_info_schema_validator

    (ep,) = [
        e for e in entry_points(group="apache_airflow_provider") if e.dist and e.dist.name == "delta-mirror"
    ]
    info = ep.load()()
    _create_provider_info_schema_validator().validate(info)  # type: ignore[no-untyped-call]
    assert info["package-name"] == ep.dist.name  # type: ignore[union-attr]  # Airflow refuses another name
    from delta_mirror.version import __version__

    assert info["versions"] == [__version__]
    (conn,) = info["connection-types"]
    module, _, name = conn["hook-class-name"].rpartition(".")
    hook = getattr(importlib.import_module(module), name)
    assert hook.conn_type == conn["connection-type"] == "delta_mirror"  # else Airflow warns and drops it
    assert "plugins" not in info  # the page registers once: by the airflow.plugins entry point
    json.dumps(info)  # plain data


def test_the_plugin_entry_point_is_the_ui_plugin() -> None:
    from delta_mirror.airflow.ui_plugin import DeltaMirrorPlugin

    (ep,) = [e for e in entry_points(group="airflow.plugins") if e.name == "delta_mirror"]
    assert ep.load() is DeltaMirrorPlugin


def test_the_plugin_file_defines_nothing_when_the_entry_point_registers_the_page() -> None:
    """``plugins/delta_mirror_plugin.py`` beside the installed package would be a second plugin of the
    same name: Airflow skips it and reports a plugin import error."""
    import runpy

    module = runpy.run_path(str(Path(__file__).resolve().parents[2] / "plugins" / "delta_mirror_plugin.py"))
    assert "DeltaMirrorPlugin" not in module


@pytest.mark.slow
def test_the_development_layout_registers_the_page_once_without_import_errors(tmp_path: Path) -> None:
    """``make airflow``'s plugins folder (the repository's ``plugins/``) beside the editable install's
    entry point: one ``delta_mirror`` plugin and no plugin import error (a second copy, or a second
    ``delta_mirror.egg-info`` on the path, is reported as "Plugin 'delta_mirror' already registered")."""
    code = (
        "import json\nfrom airflow import plugins_manager\n"
        "plugins, errors = plugins_manager._get_plugins()\n"  # what the API server's /plugins shows
        "print(json.dumps([[str(p.source) for p in plugins if p.name == 'delta_mirror'], errors]))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW__")}
    env.update(
        AIRFLOW_HOME=str(tmp_path),
        AIRFLOW__CORE__LOAD_EXAMPLES="False",
        AIRFLOW__CORE__PLUGINS_FOLDER=str(Path(__file__).resolve().parents[2] / "plugins"),
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    sources, errors = json.loads(out.stdout.splitlines()[-1])
    assert errors == {}
    (source,) = sources
    assert "EntryPoint(name='delta_mirror'" in source
