"""The Spark checkpoint step: ``SparkSubmitOperator`` (apache-spark provider) running
``delta_mirror/spark/checkpoint_job.py`` against the table's store.

Imported only by tables whose ``checkpoint.engine`` is ``spark`` (the provider is optional).
The store URL and the object-store credentials reach the job through the environment of
spark-submit — resolved from ``store_conn_id`` / ``aws_conn_id`` (the shared ``DeltaMirrorHookMixin``) at execute
time, never templated, so they are neither on the command line nor in the rendered task fields.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

from delta_mirror.airflow.errors import translated
from delta_mirror.airflow.mixins import DeltaMirrorHookMixin, template_fields_with
from delta_mirror.spark import checkpoint_job
from delta_mirror.spark.session import EXTRA_PACKAGES, ivy_dir

JOB_FILE = str(Path(checkpoint_job.__file__).resolve())
JDBC_PACKAGES = ",".join(p for p in EXTRA_PACKAGES if p.startswith("org.postgresql:"))


class DeltaMirrorSparkCheckpointOperator(DeltaMirrorHookMixin, SparkSubmitOperator):
    """spark-submit the checkpoint job for ``table`` (``--if-due``, or ``--version``).

    The job holds the table's lease for a long build (``--lease-ttl``, 3,600 s by default).

    :param table: the table's name in the store. Templated.
    :param store_conn_id: Airflow connection of the SQL store; passed to the job in its
        environment, never on the command line. Templated.
    :param aws_conn_id: Airflow connection with the object store's credentials. Templated.
    :param version: the version to checkpoint; None: the last published one. Templated.
    :param only_if_due: with no ``version``, write only when the cadence policy says one is due.
    :param partitions: parallel JDBC reads of the store (None: the job's default).
    :param conn_id: the Spark connection (``checkpoint.spark.conn_id`` in the table config).
    :param conf: more Spark settings for the job.
    """

    template_fields: Sequence[str] = (
        *SparkSubmitOperator.template_fields,
        *template_fields_with("table", "version"),
    )
    ui_color = "#e5844a"

    def __init__(
        self,
        *,
        table: str,
        store_conn_id: str | None = None,
        aws_conn_id: str | None = None,
        version: int | str | None = None,
        only_if_due: bool = True,
        partitions: int | None = None,
        conn_id: str = "spark_default",
        conf: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            application=JOB_FILE,
            conn_id=conn_id,
            packages=JDBC_PACKAGES,
            conf={"spark.jars.ivy": str(ivy_dir()), "spark.ui.enabled": "false", **(conf or {})},
            name=f"delta-mirror-checkpoint-{table}",
            **kwargs,
        )
        self.table = table
        self.store_conn_id = store_conn_id
        self.aws_conn_id = aws_conn_id
        self.version = version
        self.only_if_due = only_if_due
        self.partitions = partitions

    def _job_args(self) -> list[str]:
        args = ["--table", str(self.table)]
        if self.version not in (None, "", "None"):
            args += ["--version", str(int(str(self.version)))]
        elif self.only_if_due:
            args.append("--if-due")
        if self.partitions:
            args += ["--partitions", str(self.partitions)]
        return args

    @translated
    def _environment(self) -> dict[str, str]:
        env = dict(self.hook.storage_options)
        if self.hook.store_url:
            env["DELTA_MIRROR_STORE"] = self.hook.store_url
        env.setdefault("PYSPARK_PYTHON", sys.executable)
        env.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
        return env

    def execute(self, context: Any) -> None:
        self.application_args = [*(self.application_args or []), *self._job_args()]
        self.env_vars = {**(self.env_vars or {}), **self._environment()}
        super().execute(context)


__all__ = ["DeltaMirrorSparkCheckpointOperator"]
