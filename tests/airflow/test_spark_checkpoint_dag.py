"""A table with ``checkpoint: {engine: spark}``: its DAG's checkpoint task is a real
``SparkSubmitOperator`` (apache-spark provider) that runs pyspark's own ``spark-submit`` on a local
master (connection ``spark_default`` from ``AIRFLOW_CONN_SPARK_DEFAULT``) with the checkpoint job.

The publish task leaves the checkpoint to that task; afterwards the checkpoint and
``_last_checkpoint`` are in the log, deltalake reads the table, and ``validate_table`` is clean.
Once with PostgreSQL through a Postgres connection (the job reads it over JDBC, the driver from
``--packages``), once on the embedded SQLite default.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from dm_airflow_kit import DagRunResult, make_table, read_rows, run_dag
from support.services import skip_or_fail

from delta_mirror.jobs.validate import validate_table
from delta_mirror.spark.session import spark_missing
from delta_mirror.store import SqlStore

pytestmark = pytest.mark.usefixtures("airflow_db")


@pytest.fixture(autouse=True)
def _needs_spark() -> None:
    why = spark_missing()
    if why is not None:
        skip_or_fail(f"needs Spark: {why}")


TASKS = ["publish", "checkpoint", "validate", "metrics"]


@pytest.fixture
def spark_conn(monkeypatch: pytest.MonkeyPatch, airflow_env: dict[str, str]) -> None:
    pytest.importorskip("airflow.providers.apache.spark", reason="the apache-spark provider is not installed")
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps({"conn_type": "spark", "host": "local[2]"}))
    bin_dir = str(Path(sys.executable).parent)  # pyspark's spark-submit
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")


def _check(
    run: DagRunResult, location: Path, store: SqlStore, name: str, expected: list[tuple[int, str]]
) -> None:
    assert run.states() == {t: "success" for t in TASKS}, run.states()
    assert run.xcom("publish")["checkpoints"] == []  # left to the Spark task
    log = location / "_delta_log"
    assert (log / "00000000000000000003.checkpoint.parquet").is_file()
    assert json.loads((log / "_last_checkpoint").read_text())["version"] == 3
    assert store.last_checkpoint_version(store.get_table(name).id) == 3
    assert read_rows(location.as_uri()) == (3, expected)
    assert validate_table(store, name).ok


@pytest.mark.postgres
def test_spark_submit_checkpoint_task_on_postgres(
    dm_config: Callable[..., Path],
    spark_conn: None,
    pg_store_url: str,
    local_location: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from sqlalchemy.engine import make_url

    store = SqlStore(pg_store_url)
    store.init()
    expected = make_table(store, "big", local_location.as_uri(), versions=4, checkpoint_interval=3)
    pg = make_url(pg_store_url)
    monkeypatch.setenv(
        "AIRFLOW_CONN_DM_STORE",
        f"postgres://{pg.username}:ignored-by-trust-auth@{pg.host}:{pg.port}/{pg.database}",
    )
    dm_config(
        {"big": {"store_conn_id": "dm_store", "checkpoint": {"engine": "spark", "spark": {"partitions": 2}}}}
    )

    run = run_dag("delta_mirror__big")

    _check(run, local_location, store, "big", expected)
    store.close()


def test_spark_submit_checkpoint_task_on_the_embedded_default(
    dm_config: Callable[..., Path], spark_conn: None, sqlite_store: str, local_location: Path
) -> None:
    store = SqlStore(sqlite_store)
    expected = make_table(store, "t1", local_location.as_uri(), versions=4, checkpoint_interval=3)
    dm_config({"t1": {"checkpoint": {"engine": "spark"}}})

    run = run_dag("delta_mirror__t1")

    _check(run, local_location, store, "t1", expected)
    store.close()


def test_the_provider_is_installed_beside_the_full_pyspark() -> None:
    """The provider went in with --no-deps: the full pyspark (with its jars) is the only `pyspark`,
    and pip's one complaint is the deliberately missing pyspark-client."""
    import importlib.metadata as md
    import subprocess

    pytest.importorskip("airflow.providers.apache.spark", reason="the apache-spark provider is not installed")
    import pyspark
    from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator  # noqa: F401

    assert md.version("pyspark") == "4.2.0"
    with pytest.raises(md.PackageNotFoundError):
        md.version("pyspark-client")
    assert any((Path(pyspark.__file__).parent / "jars").glob("spark-core_*.jar"))
    check = subprocess.run(
        [sys.executable, "-m", "pip", "check"], capture_output=True, text=True, timeout=120, check=False
    )
    spark_lines = [ln for ln in check.stdout.splitlines() if "spark" in ln.lower()]
    assert spark_lines == [
        "apache-airflow-providers-apache-spark 6.3.4 requires pyspark-client, which is not installed."
    ], check.stdout
