"""Operators that run Spark in the task's process: ingest files, and a Delta-Spark job whose
commits go through the SQL authority (the spark-submit checkpoint step is ``spark_submit``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from delta_mirror.airflow.errors import translated
from delta_mirror.airflow.operators.base import DeltaMirrorTableOperator


def as_list(value: Any) -> list[str] | None:
    """A templated list: a list, JSON / Python list text, or comma-separated text ('' → None)."""
    if value is None or isinstance(value, list | tuple):
        return None if value is None else [str(v) for v in value]
    text = str(value).strip()
    if text in ("", "None", "[]"):
        return None
    if text.startswith("["):
        import ast

        return [str(v) for v in ast.literal_eval(text)]
    return [part.strip() for part in text.split(",") if part.strip()]


def optional_text(value: Any) -> str | None:
    """A templated optional string ('' and 'None' mean unset)."""
    return None if value is None or str(value).strip() in ("", "None") else str(value)


def run_txn(op: Any, context: Any) -> tuple[str | None, int | None]:
    """The ``(app id, version)`` an idempotent Spark step's commit carries: ``airflow:<dag>.<task>``
    and the run's ``run_after`` in ms, so a retry of a committed run is skipped, not done twice;
    ``(None, None)`` when the operator is not ``idempotent`` or the run has no time."""
    run_after = getattr(context.get("dag_run"), "run_after", None) or context.get("logical_date")
    if not op.idempotent or run_after is None:
        return None, None
    return f"airflow:{op.dag_id}.{op.task_id}", int(run_after.timestamp() * 1000)


def as_dict(value: Any) -> dict[str, str]:
    """A templated mapping: a dict, or its JSON / Python text."""
    if isinstance(value, dict):
        return {str(k): str(v) for k, v in value.items()}
    text = str(value or "").strip()
    if text in ("", "None", "{}"):
        return {}
    import ast

    return {str(k): str(v) for k, v in ast.literal_eval(text).items()}


class DeltaMirrorSparkIngestOperator(DeltaMirrorTableOperator):
    """Ingest source files into the table with Spark as one commit (``delta_mirror.spark.ingest``).

    Runs Spark in the task's process (``local[2]`` unless ``spark_master``); the same job runs under
    ``spark-submit`` as ``python -m delta_mirror.spark.ingest``. With ``idempotent`` the commit
    carries a ``txn`` (app id ``airflow:<dag>.<task>``, version = the run's ``run_after`` in ms): a
    retry after a successful commit is skipped instead of ingesting twice.

    :param source: the files to ingest: a path, a glob or a list of them. Templated.
    :param source_format: ``csv``, ``parquet`` or ``json``. Templated.
    :param location: the table root, used when the ingest creates the table. Templated.
    :param partition_by: partition columns for a new table (a list or comma-separated text). Templated.
    :param mode: ``append`` or ``overwrite``. Templated.
    :param schema: a DDL schema for the source (None: inferred). Templated.
    :param options: the Spark reader's options for the source format. Templated.
    :param spark_master: the Spark master; None: ``local[2]`` (or ``DELTA_MIRROR_SPARK_MASTER``).
    :param spark_conf: more Spark settings for the session.
    :param idempotent: commit with a ``txn`` of the run, so a retried task does not ingest twice.
    """

    metric_step = "ingest"
    template_fields: Sequence[str] = (
        *DeltaMirrorTableOperator.template_fields,
        "source",
        "source_format",
        "location",
        "partition_by",
        "mode",
        "schema",
        "options",
    )

    def __init__(
        self,
        *,
        source: str | list[str],
        source_format: str = "csv",
        location: str | None = None,
        partition_by: str | list[str] | None = None,
        mode: str = "append",
        schema: str | None = None,
        options: dict[str, str] | str | None = None,
        spark_master: str | None = None,
        spark_conf: dict[str, str] | None = None,
        idempotent: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.source = source
        self.source_format = source_format
        self.location = location
        self.partition_by = partition_by
        self.mode = mode
        self.schema = schema
        self.options = options
        self.spark_master = spark_master
        self.spark_conf = spark_conf
        self.idempotent = idempotent

    @translated
    def run(self, context: Any) -> dict[str, Any]:
        from delta_mirror.spark.ingest import ingest
        from delta_mirror.spark.session import get_spark

        app_id, app_version = run_txn(self, context)
        conf: dict[str, Any] = self.spark_conf or {}
        spark = get_spark(self.spark_master, app_name=f"delta-mirror-ingest-{self.table}", **conf)
        result = ingest(
            spark,
            self.hook.store,
            self.table,
            self.source,
            format=self.source_format,
            location=optional_text(self.location),
            partition_by=as_list(self.partition_by),
            mode=self.mode,
            schema=optional_text(self.schema),
            options=as_dict(self.options),
            app_id=app_id,
            app_version=app_version,
        )
        self.log.info(
            "ingested %d row(s) in %d file(s) into %s: version %s%s",
            result.rows,
            result.files,
            self.table,
            result.version,
            " (skipped: this run already committed)" if result.skipped else "",
        )
        return result.to_json()


class DeltaMirrorSparkPipelineOperator(DeltaMirrorTableOperator):
    """Run an ordinary Delta-Spark job whose commits go through the SQL authority.

    The job is the example pipeline (``delta_mirror.spark.pipeline``: create, append, MERGE,
    DELETE, OPTIMIZE) at ``location``; every Delta commit it makes is committed by the commit
    service (``commit_conn_id``, else ``DELTA_MIRROR_COMMIT_URL``) into the store as a version of
    ``table`` (registered at ``location`` first when new). Spark runs in the task's process with
    the delta-mirror LogStore. With ``idempotent`` the append carries Delta's ``txnAppId`` /
    ``txnVersion`` (the run's ``run_after`` in ms): a retried task does not append twice.

    :param location: the table root the job writes. Templated.
    :param source: the source files the job appends and merges. Templated.
    :param source_format: ``csv``, ``parquet`` or ``json``. Templated.
    :param schema: a DDL schema for the source (None: inferred). Templated.
    :param partition_by: partition columns of the table. Templated.
    :param delete_where: the DELETE step's predicate (None: the pipeline's default). Templated.
    :param steps: which pipeline steps run (None: all, in order). Templated.
    :param commit_conn_id: HTTP connection to ``delta-mirror serve`` (the token as password);
        None: ``DELTA_MIRROR_COMMIT_URL`` / ``DELTA_MIRROR_COMMIT_TOKEN``. Templated.
    :param spark_master: the Spark master; None: ``local[2]`` (or ``DELTA_MIRROR_SPARK_MASTER``).
    :param spark_conf: more Spark settings for the session.
    :param idempotent: append with Delta's ``txnAppId`` / ``txnVersion`` of the run.
    """

    metric_step = "spark_job"
    template_fields: Sequence[str] = (
        *DeltaMirrorTableOperator.template_fields,
        "location",
        "source",
        "source_format",
        "schema",
        "partition_by",
        "delete_where",
        "steps",
        "commit_conn_id",
    )

    def __init__(
        self,
        *,
        location: str,
        source: str,
        source_format: str = "csv",
        schema: str | None = None,
        partition_by: str | list[str] | None = None,
        delete_where: str | None = None,
        steps: str | list[str] | None = None,
        commit_conn_id: str | None = None,
        spark_master: str | None = None,
        spark_conf: dict[str, str] | None = None,
        idempotent: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.location = location
        self.source = source
        self.source_format = source_format
        self.schema = schema
        self.partition_by = partition_by
        self.delete_where = delete_where
        self.steps = steps
        self.commit_conn_id = commit_conn_id
        self.spark_master = spark_master
        self.spark_conf = spark_conf
        self.idempotent = idempotent

    @translated
    def run(self, context: Any) -> dict[str, Any]:
        from delta_mirror.errors import TableNotFoundError
        from delta_mirror.spark.pipeline import DEFAULT_DELETE_WHERE, STEPS, run_pipeline
        from delta_mirror.spark.session import AuthorityConfig, get_spark, governed
        from delta_mirror.storage import local_path, normalize_location

        url, token = self.hook.commit_service(self.commit_conn_id)
        location = normalize_location(str(self.location))
        store = self.hook.store
        store.ensure_initialised()
        try:
            store.get_table(self.table)
        except TableNotFoundError:
            store.create_table(self.table, location)
        authority = AuthorityConfig(url=url, roots=(location.rstrip("/") + "/",))
        spark = get_spark(
            self.spark_master,
            app_name=f"delta-mirror-job-{self.table}",
            authority=authority,
            **(self.spark_conf or {}),
        )
        folder = local_path(location)
        if folder is not None:
            spark_location = str(folder)  # Spark's own spelling (file:/...), not file:///
        else:
            from delta_mirror.spark.s3a import configure_s3a

            spark_location = configure_s3a(spark, location, self.hook.storage_options)
        app_id, run_version = run_txn(self, context)
        with governed(spark, authority, token):
            result = run_pipeline(
                spark,
                spark_location,
                str(self.source),
                source_format=self.source_format,
                schema=optional_text(self.schema),
                partition_by=as_list(self.partition_by) or [],
                delete_where=optional_text(self.delete_where) or DEFAULT_DELETE_WHERE,
                app_id=app_id,
                run_version=run_version,
                steps=as_list(self.steps) or list(STEPS),
            )
        self.log.info(
            "Spark job on %s committed versions %s (%d rows)", self.table, result.versions, result.rows
        )
        return result.as_dict()


__all__ = [
    "DeltaMirrorSparkIngestOperator",
    "DeltaMirrorSparkPipelineOperator",
    "as_dict",
    "as_list",
    "run_txn",
]
