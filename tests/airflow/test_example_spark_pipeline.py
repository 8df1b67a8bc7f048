"""The example Delta-Spark job DAG run end to end by Airflow (``dag.test()``): job → publish → validate.

The job (CREATE TABLE, append, MERGE, DELETE, OPTIMIZE) runs in this process on the shared
SparkSession with the delta-mirror LogStore; its commits go through a real ``delta-mirror serve``
into the SQLite store. Afterwards the store holds Spark's commits byte for byte, the publisher had
nothing to write, and deltalake and Delta-Spark both validate the job's versions.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from dm_airflow_kit import run_dag
from support.commit_service import commit_service
from support.services import skip_or_fail

from delta_mirror.store import SqlStore

pytestmark = pytest.mark.usefixtures("airflow_db")
DAG_ID = "delta_mirror_example_spark_pipeline"


@pytest.fixture(autouse=True)
def _needs_the_logstore(spark: Any) -> None:
    from support.spark import runs_logstore

    if not runs_logstore(spark):
        skip_or_fail("the authority LogStore jar is not built (`make jar` needs Maven and a JDK 17)")


def test_the_example_job_dag_commits_through_the_service_then_publishes_and_validates(
    spark: Any,
    dm_config: Callable[..., Path],
    sqlite_store: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    dm_config({})
    location = tmp_path / "lake" / "events_pipeline"
    with commit_service(sqlite_store) as svc:
        monkeypatch.setenv("DELTA_MIRROR_COMMIT_URL", svc.url)
        monkeypatch.setenv("DELTA_MIRROR_COMMIT_TOKEN", svc.token)
        run = run_dag(DAG_ID, {"table": "events_pipeline", "location": str(location)})

    assert run.states() == {
        "job": "success",
        "publish": "success",
        "validate_deltalake": "success",
        "validate_spark": "success",
    }
    job = run.xcom("job")
    assert job["versions"] == {"create": 0, "append": 1, "merge": 2, "delete": 3, "optimize": 4}
    assert (job["first_version"], job["last_version"]) == (0, 4)
    publish = run.xcom("publish")
    assert (publish["published"], publish["already_present"], publish["last_published"]) == (0, 5, 4)
    assert run.xcom("validate_deltalake")["ok"] is True
    assert run.xcom("validate_spark")["ok"] is True

    store = SqlStore(sqlite_store)
    table = store.get_table("events_pipeline")
    for row in store.commit_rows(table.id, 0, 4):
        data = (location / "_delta_log" / f"{row.version:020d}.json").read_bytes()
        assert (row.source, row.sha256) == ("spark", hashlib.sha256(data).hexdigest())
    assert spark.read.format("delta").load(str(location)).count() == job["rows"]
    # the shared session is back to passthrough: no commit service governs anything after the task
    assert spark.sparkContext._jsc.hadoopConfiguration().get("delta.mirror.commit.url") is None
