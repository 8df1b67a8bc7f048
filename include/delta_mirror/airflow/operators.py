"""Custom operators: each ``execute()`` calls one core service; errors are translated in one place.

All take ``store_conn_id`` (a Postgres connection; default: ``DELTA_MIRROR_STORE`` or the embedded
SQLite store) and ``aws_conn_id`` (S3 credentials and endpoint; default: the AWS environment).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from functools import cached_property
from typing import Any

from airflow.sdk import BaseOperator

from delta_mirror.airflow.errors import translated
from delta_mirror.airflow.hooks import DeltaMirrorHook


def _optional_int(value: Any, name: str) -> int | None:
    """Template-rendered versions arrive as strings ('None' or '' for unset)."""
    if value is None or value == "" or value == "None":
        return None
    try:
        number = int(value)
    except (TypeError, ValueError):
        from delta_mirror.errors import DataError

        raise DataError(
            f"{name} must be a version number, got {value!r}", hint="pass a non-negative integer"
        ) from None
    if number < 0:
        from delta_mirror.errors import DataError

        raise DataError(f"{name} must not be negative (got {number})", hint="versions start at 0")
    return number


class _DeltaMirrorOperator(BaseOperator):
    """Shared shell: connections, the ``enabled`` switch (templated, for the backfill form), errors.

    The connection ids are templated too: the backfill form picks the table, and with it the
    table's connections, at run time.
    """

    template_fields: Sequence[str] = ("table", "enabled", "store_conn_id", "aws_conn_id")
    ui_color = "#00add4"
    metric_step = "step"  # names the metrics: delta_mirror.<step>_seconds, delta_mirror.failures

    def __init__(
        self,
        *,
        table: str,
        store_conn_id: str | None = None,
        aws_conn_id: str | None = None,
        enabled: bool | str = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.table = table
        self.store_conn_id = store_conn_id
        self.aws_conn_id = aws_conn_id
        self.enabled = enabled

    def execute(self, context: Any) -> Any:
        if str(self.enabled).strip().lower() in ("false", "0", "no"):
            from airflow.sdk.exceptions import AirflowSkipException

            raise AirflowSkipException(f"step {self.task_id} not requested")
        from delta_mirror.airflow.errors import DeltaMirrorFailure, DeltaMirrorTransientError
        from delta_mirror.airflow.metrics import emit_step_duration, emit_step_failure

        started = time.monotonic()
        try:
            result = self.run(context)
        except (DeltaMirrorFailure, DeltaMirrorTransientError) as exc:
            emit_step_failure(self.metric_step, str(self.table), exc.error.error_class.value)
            raise
        emit_step_duration(self.metric_step, str(self.table), time.monotonic() - started)
        return result

    def run(self, context: Any) -> Any:
        raise NotImplementedError

    @cached_property
    def hook(self) -> DeltaMirrorHook:
        return DeltaMirrorHook(store_conn_id=self.store_conn_id, aws_conn_id=self.aws_conn_id)

    def publisher(self, **kwargs: Any) -> Any:
        from delta_mirror.jobs.publisher import Publisher

        return Publisher(self.hook.store, storage_options=self.hook.storage_options, **kwargs)


class DeltaMirrorPublishOperator(_DeltaMirrorOperator):
    """Publish the table's pending versions (up to ``to_version``) as ``_delta_log`` commits."""

    metric_step = "publish"
    template_fields: Sequence[str] = (*_DeltaMirrorOperator.template_fields, "to_version")

    def __init__(
        self, *, to_version: int | str | None = None, cadence_checkpoints: bool = True, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.to_version = to_version
        self.cadence_checkpoints = cadence_checkpoints  # False: a separate (Spark) step checkpoints

    @translated
    def run(self, context: Any) -> dict[str, object]:
        publisher = self.publisher(cadence_checkpoints=self.cadence_checkpoints)
        result = publisher.publish(self.table, _optional_int(self.to_version, "to_version"))
        self.log.info(
            "published %d version(s) of %s through %s",
            len(result.published),
            self.table,
            result.last_published,
        )
        return dict(result.to_json())


class DeltaMirrorCheckpointOperator(_DeltaMirrorOperator):
    """Write a checkpoint when the cadence policy says one is due (or at ``version``)."""

    metric_step = "checkpoint"
    template_fields: Sequence[str] = (*_DeltaMirrorOperator.template_fields, "version")

    def __init__(
        self,
        *,
        version: int | str | None = None,
        only_if_due: bool = True,
        engine: str = "local",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.version = version
        self.only_if_due = only_if_due
        self.engine = engine  # local, or auto: Spark in this worker above the table's file threshold

    @translated
    def run(self, context: Any) -> int | None:
        version = _optional_int(self.version, "version")
        builder = None
        if self.engine != "local":
            from delta_mirror.spark.checkpoint_engine import builder_for
            from delta_mirror.table_config import load_config

            config = load_config()
            settings = config.tables.get(self.table, config.defaults).checkpoint
            chosen, builder = builder_for(self.hook.store, self.table, self.engine, settings)
            self.log.info("checkpoint engine for %s: %s", self.table, chosen)
        publisher = self.publisher(checkpoint_builder=builder)
        if version is None and self.only_if_due:
            written = publisher.checkpoint_if_due(self.table)
        else:
            written = publisher.checkpoint(self.table, version)
        self.log.info("checkpoint for %s: %s", self.table, written if written is not None else "not due")
        return written  # type: ignore[no-any-return]


class DeltaMirrorValidateOperator(_DeltaMirrorOperator):
    """Compare a reader's view of the published versions with the store; fail on any problem."""

    metric_step = "validate"
    template_fields: Sequence[str] = (
        *_DeltaMirrorOperator.template_fields,
        "from_version",
        "to_version",
        "reader",
    )

    def __init__(
        self,
        *,
        from_version: int | str | None = None,
        to_version: int | str | None = None,
        reader: str = "deltalake",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.from_version = from_version
        self.to_version = to_version
        self.reader = reader

    @translated
    def run(self, context: Any) -> dict[str, Any]:
        from delta_mirror.errors import DataError
        from delta_mirror.jobs.validate import validate_table

        report = validate_table(
            self.hook.store,
            self.table,
            from_version=_optional_int(self.from_version, "from_version"),
            to_version=_optional_int(self.to_version, "to_version"),
            reader=self.reader,
            storage_options=self.hook.storage_options,
        )
        from delta_mirror.health.monitoring import record_validation

        record_validation(self.hook.store, self.table, {**report.to_json(), "reader": self.reader})
        for p in report.problems:
            self.log.error("[%s] version %s: %s — %s", p.kind, p.version, p.message, p.hint)
        if not report.ok:
            raise DataError(
                f"validation found {len(report.problems)} problem(s): "
                + "; ".join(f"[{p.kind}] v{p.version}: {p.message}" for p in report.problems[:5]),
                table=self.table,
                hint="see the task log for every problem and what to do",
            )
        self.log.info("validated %s versions %s..%s: OK", self.table, report.from_version, report.to_version)
        return report.to_json()


class DeltaMirrorReconcileOperator(BaseOperator):
    """Re-drive FAILED, stuck and lagging versions across tables; returns the report."""

    template_fields: Sequence[str] = ("tables", "strategy")

    def __init__(
        self,
        *,
        tables: Sequence[str] | None = None,
        strategy: str = "incremental",
        escalate_after_attempts: int = 3,
        store_conn_id: str | None = None,
        aws_conn_id: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.tables = list(tables) if tables else None
        self.strategy = strategy
        self.escalate_after_attempts = escalate_after_attempts
        self.store_conn_id = store_conn_id
        self.aws_conn_id = aws_conn_id

    @cached_property
    def hook(self) -> DeltaMirrorHook:
        return DeltaMirrorHook(store_conn_id=self.store_conn_id, aws_conn_id=self.aws_conn_id)

    @translated
    def execute(self, context: Any) -> dict[str, object]:
        from delta_mirror.jobs.publisher import Publisher
        from delta_mirror.jobs.reconcile import reconcile

        tables = self.tables
        if tables:
            # A table that is configured but not created yet must not stop the others' reconcile.
            known = {t.name for t in self.hook.store.list_tables()}
            for name in tables:
                if name not in known:
                    self.log.warning("%s is configured but not in the store yet: skipped", name)
            tables = [n for n in tables if n in known]
            if not tables:
                return {"strategy": self.strategy, "tables": []}
        report = reconcile(
            self.hook.store,
            tables,
            strategy=self.strategy,
            escalate_after_attempts=self.escalate_after_attempts,
            publisher=Publisher(self.hook.store, storage_options=self.hook.storage_options),
        )
        for t in report.tables:
            self.log.info(
                "%s: %s (%d re-driven)%s", t.table, t.action, t.published, f" — {t.error}" if t.error else ""
            )
        return report.to_json()


class DeltaMirrorLagOperator(BaseOperator):
    """Measure lag per table and emit it through Airflow's stats (StatsD / OpenTelemetry)."""

    template_fields: Sequence[str] = ("tables",)

    def __init__(
        self,
        *,
        tables: Sequence[str] | None = None,
        store_conn_id: str | None = None,
        lag_history_retention: dict[str, float] | float | None = None,
        record_samples: bool = True,
        **kwargs: Any,
    ) -> None:
        """``lag_history_retention``: seconds (or seconds per table) of lag samples to keep (default 14 d)."""
        super().__init__(**kwargs)
        self.tables = list(tables) if tables else None
        self.store_conn_id = store_conn_id
        self.lag_history_retention = lag_history_retention
        self.record_samples = record_samples

    def _retention(self, name: str) -> Any:
        from datetime import timedelta

        from delta_mirror.health.monitoring import DEFAULT_LAG_RETENTION

        value = self.lag_history_retention
        if isinstance(value, dict):
            value = value.get(name)
        return DEFAULT_LAG_RETENTION if value is None else timedelta(seconds=float(value))

    @translated
    def execute(self, context: Any) -> list[dict[str, object]]:
        from delta_mirror.airflow.metrics import emit_table_metrics
        from delta_mirror.health.status import table_status

        store = DeltaMirrorHook(store_conn_id=self.store_conn_id).store
        if self.tables:
            # A table that is configured but not created yet must not hide the others' lag.
            known = {t.name: t for t in store.list_tables()}
            for name in self.tables:
                if name not in known:
                    self.log.warning("%s is configured but not in the store yet: no lag to measure", name)
            tables = [known[n] for n in self.tables if n in known]
        else:
            tables = store.list_tables()
        out = []
        for table in tables:
            status = table_status(store, table)
            emit_table_metrics(status)
            if self.record_samples:
                from delta_mirror.health.monitoring import record_lag_sample

                record_lag_sample(store, table, retention=self._retention(table.name), status=status)
            self.log.info(
                "%s: %d version(s) behind, lag %.1f s",
                status.table,
                status.versions_behind,
                status.lag_seconds,
            )
            out.append(status.to_json())
        return out


class DeltaMirrorMaintenanceOperator(_DeltaMirrorOperator):
    """Clean up log files by the table's retention (dry-run unless ``cleanup_dry_run=False``)."""

    metric_step = "maintenance"
    template_fields: Sequence[str] = (*_DeltaMirrorOperator.template_fields, "cleanup_dry_run")

    def __init__(
        self, *, cleanup_dry_run: bool | str = True, log_retention_seconds: float | None = None, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.cleanup_dry_run = cleanup_dry_run
        self.log_retention_seconds = log_retention_seconds

    @translated
    def run(self, context: Any) -> dict[str, object]:
        from delta_mirror.jobs.maintenance import cleanup_log

        dry_run = str(self.cleanup_dry_run).strip().lower() not in ("false", "0", "no")
        retention = int(self.log_retention_seconds * 1000) if self.log_retention_seconds is not None else None
        report = cleanup_log(
            self.hook.store,
            self.table,
            dry_run=dry_run,
            retention_ms=retention,
            storage_options=self.hook.storage_options,
        )
        verb = "would delete" if dry_run else "deleted"
        self.log.info(
            "%s: %s %d log file(s) older than checkpoint %s",
            self.table,
            verb,
            len(report.deleted),
            report.kept_checkpoint,
        )
        return report.to_json()


def _as_list(value: Any) -> list[str] | None:
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


def _optional_text(value: Any) -> str | None:
    """A templated optional string ('' and 'None' mean unset)."""
    return None if value is None or str(value).strip() in ("", "None") else str(value)


def _as_dict(value: Any) -> dict[str, str]:
    """A templated mapping: a dict, or its JSON / Python text."""
    if isinstance(value, dict):
        return {str(k): str(v) for k, v in value.items()}
    text = str(value or "").strip()
    if text in ("", "None", "{}"):
        return {}
    import ast

    return {str(k): str(v) for k, v in ast.literal_eval(text).items()}


class DeltaMirrorSparkIngestOperator(_DeltaMirrorOperator):
    """Ingest source files into the table with Spark as one commit (``delta_mirror.spark.ingest``).

    Runs Spark in the task's process (``local[2]`` unless ``spark_master``); the same job runs under
    ``spark-submit`` as ``python -m delta_mirror.spark.ingest``. With ``idempotent`` the commit
    carries a ``txn`` (app id ``airflow:<dag>.<task>``, version = the run's ``run_after`` in ms): a
    retry after a successful commit is skipped instead of ingesting twice.
    """

    metric_step = "ingest"
    template_fields: Sequence[str] = (
        *_DeltaMirrorOperator.template_fields,
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

        app_id = app_version = None
        run_after = getattr(context.get("dag_run"), "run_after", None) or context.get("logical_date")
        if self.idempotent and run_after is not None:
            app_id = f"airflow:{self.dag_id}.{self.task_id}"
            app_version = int(run_after.timestamp() * 1000)
        conf = self.spark_conf or {}
        spark = get_spark(self.spark_master, app_name=f"delta-mirror-ingest-{self.table}", **conf)
        result = ingest(
            spark,
            self.hook.store,
            self.table,
            self.source,
            format=self.source_format,
            location=_optional_text(self.location),
            partition_by=_as_list(self.partition_by),
            mode=self.mode,
            schema=_optional_text(self.schema),
            options=_as_dict(self.options),
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


class DeltaMirrorSparkPipelineOperator(_DeltaMirrorOperator):
    """Run an ordinary Delta-Spark job whose commits go through the SQL authority.

    The job is the example pipeline (``delta_mirror.spark.pipeline``: create, append, MERGE,
    DELETE, OPTIMIZE) at ``location``; every Delta commit it makes is committed by the commit
    service (``commit_conn_id``, else ``DELTA_MIRROR_COMMIT_URL``) into the store as a version of
    ``table`` (registered at ``location`` first when new). Spark runs in the task's process with
    the delta-mirror LogStore. With ``idempotent`` the append carries Delta's ``txnAppId`` /
    ``txnVersion`` (the run's ``run_after`` in ms): a retried task does not append twice.
    """

    metric_step = "spark_job"
    template_fields: Sequence[str] = (
        *_DeltaMirrorOperator.template_fields,
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
        app_id = run_version = None
        run_after = getattr(context.get("dag_run"), "run_after", None) or context.get("logical_date")
        if self.idempotent and run_after is not None:
            app_id = f"airflow:{self.dag_id}.{self.task_id}"
            run_version = int(run_after.timestamp() * 1000)
        with governed(spark, authority, token):
            result = run_pipeline(
                spark,
                spark_location,
                str(self.source),
                source_format=self.source_format,
                schema=_optional_text(self.schema),
                partition_by=_as_list(self.partition_by) or [],
                delete_where=_optional_text(self.delete_where) or DEFAULT_DELETE_WHERE,
                app_id=app_id,
                run_version=run_version,
                steps=_as_list(self.steps) or list(STEPS),
            )
        self.log.info(
            "Spark job on %s committed versions %s (%d rows)", self.table, result.versions, result.rows
        )
        return result.as_dict()


__all__ = [
    "DeltaMirrorCheckpointOperator",
    "DeltaMirrorLagOperator",
    "DeltaMirrorMaintenanceOperator",
    "DeltaMirrorPublishOperator",
    "DeltaMirrorReconcileOperator",
    "DeltaMirrorSparkIngestOperator",
    "DeltaMirrorSparkPipelineOperator",
    "DeltaMirrorValidateOperator",
]
