"""Fixtures for the Airflow tests: a throwaway Airflow home, the table config, stores, an SMTP server.

Airflow reads ``AIRFLOW_HOME`` and its ``AIRFLOW__*`` variables once, when it is first imported, so
they are set here, at import time, before any test module of this folder imports Airflow. Nothing
touches the user's ``~/airflow`` or the project's ``.airflow``.

DAG runs use ``dag.test()`` in this process (``run_dag`` in ``dm_airflow_kit``): after the first run
(about 5 s: the in-process execution API starts), each run takes about one second, where
``airflow dags test`` as a subprocess pays 8-15 s per run for the interpreter, Airflow's imports and
that API. Only the StatsD test uses the subprocess, because it configures metrics the way a user
does (``AIRFLOW__METRICS__*`` read at start-up).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
DAGS_FOLDER = HERE.parents[1] / "dags"

if "airflow" in sys.modules:
    raise RuntimeError(
        "Airflow was imported before tests/airflow/conftest.py could point AIRFLOW_HOME at a temporary "
        "folder; other test folders must import it lazily"
    )

# DELTA_MIRROR_TEST_AIRFLOW_HOME keeps the Airflow home (metadata DB, logs) for a look afterwards.
_KEEP_HOME = os.environ.get("DELTA_MIRROR_TEST_AIRFLOW_HOME")
AIRFLOW_HOME = Path(_KEEP_HOME or tempfile.mkdtemp(prefix="dm-airflow-home-")).resolve()
AIRFLOW_HOME.mkdir(parents=True, exist_ok=True)
AIRFLOW_ENV = {
    "AIRFLOW_HOME": str(AIRFLOW_HOME),
    "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
    "AIRFLOW__CORE__DAGS_FOLDER": str(DAGS_FOLDER),
}
for _var in [v for v in os.environ if v.startswith("AIRFLOW__")]:
    del os.environ[_var]  # e.g. a developer's metadata DB URL: these tests must never touch it
os.environ.update(AIRFLOW_ENV)

from dm_airflow_kit import MailBox, SmtpServer, config_yaml  # noqa: E402
from support.services import session_service  # noqa: E402


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if not _KEEP_HOME:
        shutil.rmtree(AIRFLOW_HOME, ignore_errors=True)


@pytest.fixture(scope="session")
def airflow_db() -> Path:
    """What ``airflow db migrate`` does, once per session, in this process (about 2 s, not 6 s).

    Airflow's metadata DB is SQLite under the temporary AIRFLOW_HOME.
    """
    if not (AIRFLOW_HOME / ".migrated").exists():
        from airflow.utils import db

        db.upgradedb()
        (AIRFLOW_HOME / ".migrated").touch()
    return AIRFLOW_HOME


@pytest.fixture
def airflow_env(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Variables that must not leak from the outer environment into a test's Airflow."""
    for var in list(os.environ):
        if var.startswith("AIRFLOW_CONN_") or var.startswith("AIRFLOW_VAR_"):
            monkeypatch.delenv(var)
    for var in (
        "AWS_ENDPOINT_URL",
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "AWS_REGION",
        "AWS_DEFAULT_REGION",
        "AWS_PROFILE",
        "DELTA_MIRROR_STORE",
        "DELTA_MIRROR_CONFIG",
    ):
        monkeypatch.delenv(var, raising=False)
    no_proxy = ",".join(x for x in (os.environ.get("NO_PROXY"), "127.0.0.1", "localhost") if x)
    monkeypatch.setenv("NO_PROXY", no_proxy)
    monkeypatch.setenv("no_proxy", no_proxy)
    return dict(AIRFLOW_ENV)


@pytest.fixture
def dm_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, airflow_env: dict[str, str]
) -> Callable[..., Path]:
    """``dm_config(tables, **defaults)`` writes the table config and points DELTA_MIRROR_CONFIG at it.

    Test configs default to no deadline (``airflow dags test`` / ``dag.test()`` in 3.3.2 crash at
    the end of a run whose DAG has a DeadlineAlert), no email, one quick retry.
    """
    path = tmp_path / "delta_mirror.yaml"

    def write(tables: dict[str, object], **kwargs: object) -> Path:
        path.write_text(config_yaml(tables, **kwargs), encoding="utf-8")
        monkeypatch.setenv("DELTA_MIRROR_CONFIG", str(path))
        return path

    return write


@pytest.fixture
def sqlite_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, airflow_env: dict[str, str]) -> str:
    """A fresh, initialised SQLite store, also the operators' default (``DELTA_MIRROR_STORE``)."""
    from delta_mirror.store import SqlStore

    url = f"sqlite:///{tmp_path / 'store.db'}"
    store = SqlStore(url)
    store.init()
    store.close()
    monkeypatch.setenv("DELTA_MIRROR_STORE", url)
    return url


@pytest.fixture
def local_location(tmp_path: Path) -> Path:
    folder = tmp_path / "tables" / "t1"
    folder.mkdir(parents=True)
    return folder


@pytest.fixture(scope="session")
def smtp_server() -> Iterator[SmtpServer]:
    yield from session_service(SmtpServer, SmtpServer.stop)


@pytest.fixture
def mailbox(smtp_server: SmtpServer, monkeypatch: pytest.MonkeyPatch, airflow_env: dict[str, str]) -> MailBox:
    """An empty mailbox behind ``smtp_default`` (plain SMTP on 127.0.0.1: TLS and SSL disabled)."""
    smtp_server.mailbox.clear()
    monkeypatch.setenv("AIRFLOW_CONN_SMTP_DEFAULT", smtp_server.connection_json())
    return smtp_server.mailbox


def pytest_configure(config: pytest.Config) -> None:
    # Airflow's in-process execution API (dag.test) uses Starlette's TestClient, which warns about httpx.
    config.addinivalue_line("filterwarnings", "ignore:Using `httpx` with `starlette.testclient`")


@pytest.fixture(scope="session")
def spark() -> object:
    """The run's one SparkSession (``support.spark``) for DAGs whose tasks run Spark in-process."""
    from support.services import skip_or_fail

    from delta_mirror.spark.session import spark_missing

    why = spark_missing()
    if why is not None:
        skip_or_fail(f"this DAG runs Spark: {why}")
    from support.spark import shared_spark

    return shared_spark()
