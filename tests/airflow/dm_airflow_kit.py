"""Helpers for the Airflow tests: table configs, real tables, DAG runs, an SMTP server.

(Not named like an Airflow module on purpose: this folder is called ``airflow``, and the ``airflow``
package extends its ``__path__`` over every ``airflow`` folder on ``sys.path``.)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import pyarrow as pa
import yaml
from support.builders import metadata_body, protocol_body

# Re-exported for the tests (the `X as X` form marks them as exports for mypy).
from support.mailserver import MailBox as MailBox
from support.mailserver import SmtpServer as SmtpServer
from support.mailserver import body_text as body_text
from support.services import free_port as free_port
from support.waiting import load_scaled

from delta_mirror.delta.actions import Action
from delta_mirror.dev.datafiles import delta_schema_string, write_data_file
from delta_mirror.store import SqlStore

if TYPE_CHECKING:
    from airflow.sdk import DAG

OperatorT = TypeVar("OperatorT")

REPO = Path(__file__).resolve().parents[2]
DAGS_FOLDER = REPO / "dags"
SCHEMA = pa.schema([("id", pa.int64()), ("city", pa.string())])
ROWS = [
    [(1, "Lisbon"), (2, "Oslo")],
    [(3, "Lima")],
    [(4, "Quito"), (5, "Accra")],
    [(6, "Hanoi")],
]


# --------------------------------------------------------------------------------------------------
# the table config


def config_yaml(tables: dict[str, Any], **defaults: Any) -> str:
    """A table config: quick, quiet defaults for tests, overridden by ``defaults`` and per table."""
    base: dict[str, Any] = {
        "schedule": None,
        "owner": "dm-tests",
        "retries": 1,
        "retry_delay": "1s",
        "retry_exponential_backoff": 2.0,
        "max_retry_delay": "10m",
        "deadline": None,
        "notify": {"email": []},
    }
    extra_sections: dict[str, Any] = {k: defaults.pop(k) for k in ("reconcile", "monitor") if k in defaults}
    base.update(defaults)
    doc: dict[str, Any] = {"defaults": base, "tables": tables, **extra_sections}
    return yaml.safe_dump(doc, sort_keys=False)


# --------------------------------------------------------------------------------------------------
# real tables: data files at the location, versions committed in the store (nothing published)


def _batch(rows: list[tuple[int, str]]) -> pa.Table:
    return pa.table({"id": [r[0] for r in rows], "city": [r[1] for r in rows]}, schema=SCHEMA)


class S3Writer:
    """Writes data files to a bucket prefix (through a boto3 client)."""

    def __init__(self, client: Any, bucket: str, prefix: str) -> None:
        self.client, self.bucket, self.prefix = client, bucket, prefix.strip("/")

    def add(self, data: pa.Table) -> dict[str, Any]:
        with tempfile.TemporaryDirectory() as tmp:
            add = write_data_file(Path(tmp), data)
            body = (Path(tmp) / add["path"]).read_bytes()
        self.client.put_object(Bucket=self.bucket, Key=f"{self.prefix}/{add['path']}", Body=body)
        return add


def make_table(
    store: SqlStore,
    name: str,
    location: str,
    *,
    versions: int = 4,
    checkpoint_interval: int = 3,
    s3: S3Writer | None = None,
) -> list[tuple[int, str]]:
    """Create ``name`` at ``location`` and commit ``versions`` versions with real data files.

    Returns the rows the latest version holds.
    """
    root = Path(location.removeprefix("file://")) if location.startswith("file://") else None

    def add(rows: list[tuple[int, str]]) -> dict[str, Any]:
        if s3 is not None:
            return s3.add(_batch(rows))
        assert root is not None
        return write_data_file(root, _batch(rows))

    store.create_table(name, location)
    metadata = metadata_body(
        id=str(uuid.uuid4()),
        schema_string=delta_schema_string(SCHEMA),
        configuration={"delta.checkpointInterval": str(checkpoint_interval)},
        created_time=1_700_000_000_000,
    )
    first: list[Action] = [("protocol", protocol_body()), ("metaData", metadata)]
    expected: list[tuple[int, str]] = []
    for v in range(versions):
        rows = ROWS[v % len(ROWS)]
        rows = [(i + 100 * (v // len(ROWS)), c) for i, c in rows]
        store.commit(name, [*(first if v == 0 else []), ("add", add(rows))])
        expected += rows
    return sorted(expected)


def read_rows(location: str, storage_options: dict[str, str] | None = None) -> tuple[int, list[Any]]:
    """(version, sorted rows) as deltalake reads the published table."""
    from deltalake import DeltaTable, QueryBuilder

    dt = DeltaTable(location, storage_options=storage_options)
    result = QueryBuilder().register("t", dt).execute("select id, city from t order by id").read_all()
    rows = pa.table(result).to_pylist()
    return dt.version(), [(r["id"], r["city"]) for r in rows]


# --------------------------------------------------------------------------------------------------
# DAGs and DAG runs


def task_of(dag: DAG, task_id: str, kind: type[OperatorT]) -> OperatorT:
    """``dag``'s task ``task_id``, checked to be a ``kind`` (Airflow types it as any operator)."""
    task = dag.get_task(task_id)
    assert isinstance(task, kind), (task_id, type(task))
    return task


@dataclass
class TaskResult:
    state: str | None
    try_number: int


@dataclass
class DagRunResult:
    state: str
    tasks: dict[str, TaskResult]
    xcom: Callable[[str], Any]

    def states(self) -> dict[str, str | None]:
        return {k: v.state for k, v in self.tasks.items()}


def run_dag(dag_id: str, conf: dict[str, Any] | None = None) -> DagRunResult:
    """Parse the DAG file afresh (the config is re-read) and run ``dag_id`` once with ``dag.test()``.

    A fresh parse also matters because rendering templates writes into the operator objects.
    """
    from airflow.dag_processing.dagbag import DagBag
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    bag = DagBag(dag_folder=str(DAGS_FOLDER))
    assert not bag.import_errors, bag.import_errors
    dag = bag.dags[dag_id]
    dr = dag.test(run_conf=conf)
    tasks = {
        ti.task_id: TaskResult(str(ti.state) if ti.state else None, ti.try_number)
        for ti in dr.get_task_instances()
    }

    def xcom(task_id: str) -> Any:
        with create_session() as session:
            row = (
                session.query(XComModel)
                .filter_by(dag_id=dag_id, run_id=dr.run_id, task_id=task_id, key="return_value")
                .first()
            )
            return (
                None if row is None else (json.loads(row.value) if isinstance(row.value, str) else row.value)
            )

    return DagRunResult(str(dr.state), tasks, xcom)


def airflow_cli(
    *args: str, env: dict[str, str] | None = None, timeout: float = 180
) -> subprocess.CompletedProcess[str]:
    """Run the venv's ``airflow`` command in this session's AIRFLOW_HOME (set by conftest);
    ``timeout`` is for an idle machine and grows with the load (a DAG test parses every DAG)."""
    bin_dir = Path(sys.executable).parent
    full_env = {**os.environ, **(env or {})}
    full_env["PATH"] = f"{bin_dir}{os.pathsep}{full_env.get('PATH', '')}"
    return subprocess.run(
        [str(bin_dir / "airflow"), *args],
        env=full_env,
        capture_output=True,
        text=True,
        timeout=load_scaled(timeout),
        check=False,
    )


# --------------------------------------------------------------------------------------------------
# SMTP
