"""The steps of a table's DAG: publish, checkpoint, validate, and log maintenance."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from delta_mirror.airflow.errors import translated
from delta_mirror.airflow.operators.base import DeltaMirrorTableOperator, optional_int
from delta_mirror.table_config import CheckpointEngine


def judge_report(log: Any, table: str, report: Any, *, strict: bool = False) -> None:
    """Log a validation report's problems and limitations; raise ``DataError`` (the task fails) on a
    problem, and with ``strict`` on a limitation. Shared by the validate and sync steps."""
    from delta_mirror.errors import DataError

    for p in report.problems:
        log.error("[%s] version %s: %s — %s", p.kind, p.version, p.message, p.hint)
    for lim in report.limitations:
        log.warning(
            "reader limitation [%s] version %s: %s — read it with: %s",
            lim.reader,
            lim.version,
            lim.message,
            lim.use_instead,
        )
    if not report.ok:
        raise DataError(
            f"validation found {len(report.problems)} problem(s): "
            + "; ".join(f"[{p.kind}] v{p.version}: {p.message}" for p in report.problems[:5]),
            table=table,
            hint="see the task log for every problem and what to do",
        )
    if not report.passed(strict=strict):
        raise DataError(
            f"validation (strict) found {len(report.limitations)} reader limitation(s) and no "
            "mirror problem: "
            + "; ".join(f"[{lim.reader}] v{lim.version}" for lim in report.limitations[:5]),
            table=table,
            hint="read those versions with the reader named in the task log, or set strict=False",
        )
    log.info("validated %s versions %s..%s: OK", table, report.from_version, report.to_version)


class DeltaMirrorPublishOperator(DeltaMirrorTableOperator):
    """Publish the table's pending versions (up to ``to_version``) as ``_delta_log`` commits; its
    ``Asset`` outlets (the table's, ``airflow.assets``) get an event only when it published some.

    :param to_version: the last version to publish; None: every committed one. Templated.
    :param cadence_checkpoints: write the checkpoints the table's cadence asks for while
        publishing; False when a separate step (Spark, or the checkpoint operator) writes them.
    """

    metric_step = "publish"
    template_fields: Sequence[str] = (*DeltaMirrorTableOperator.template_fields, "to_version")

    def __init__(
        self, *, to_version: int | str | None = None, cadence_checkpoints: bool = True, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.to_version = to_version
        self.cadence_checkpoints = cadence_checkpoints  # False: a separate (Spark) step checkpoints

    @translated
    def run(self, context: Any) -> dict[str, object]:
        publisher = self.publisher(cadence_checkpoints=self.cadence_checkpoints)
        result = publisher.publish(self.table, optional_int(self.to_version, "to_version"))
        from delta_mirror.airflow.metrics import emit_version_latencies

        store = self.hook.store
        emit_version_latencies(
            self.table, store.latencies_of(store.get_table(self.table).id, result.published)
        )
        self.log.info(
            "published %d version(s) of %s through %s",
            len(result.published),
            self.table,
            result.last_published,
        )
        from delta_mirror.airflow.asset_extra import event_extra

        # versions another writer had already put there became readable by this publish too
        versions = [*result.published, *result.already_present]
        self.emit_asset_event(context, event_extra(str(self.table), versions, result.checkpoints))
        return dict(result.to_json())


class DeltaMirrorCheckpointOperator(DeltaMirrorTableOperator):
    """Write a checkpoint when the cadence policy says one is due (or at ``version``).

    :param version: the version to checkpoint; None: the last published one. Templated.
    :param only_if_due: with no ``version``, write only when the cadence policy says one is due.
    :param engine: who builds it (``CheckpointEngine``): ``local`` in this worker, ``auto`` Spark in
        this worker from the table's file threshold on, ``spark`` Spark in this worker; a
        Spark-capable engine holds the table's lease for a long build
        (``spark.checkpoint_choice.publisher_for``).
    """

    metric_step = "checkpoint"
    template_fields: Sequence[str] = (*DeltaMirrorTableOperator.template_fields, "version")

    def __init__(
        self,
        *,
        version: int | str | None = None,
        only_if_due: bool = True,
        engine: str = CheckpointEngine.LOCAL,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.version = version
        self.only_if_due = only_if_due
        self.engine = engine  # local, or auto: Spark in this worker above the table's file threshold

    @translated
    def run(self, context: Any) -> int | None:
        from delta_mirror.spark.checkpoint_choice import last_engine

        version = optional_int(self.version, "version")
        # a Spark-capable engine holds the table's lease for a long build (the factory's rule)
        publisher = self.publisher_factory(self.engine)(storage_options=self.hook.storage_options)
        if version is None and self.only_if_due:
            written = publisher.checkpoint_if_due(self.table)
        else:
            written = publisher.checkpoint(self.table, version)
        if written is None:
            self.log.info("checkpoint for %s: not due", self.table)
        else:
            self.log.info("checkpoint for %s: %s (%s engine)", self.table, written, last_engine(publisher))
        return written  # type: ignore[no-any-return]


class DeltaMirrorValidateOperator(DeltaMirrorTableOperator):
    """Compare a reader's view of the published versions with the store; fail on any problem.

    A reader's limitation (it cannot read a version although the table is right) is logged as a
    warning with the reader to use instead, and fails the task only with ``strict`` (the CLI's
    ``validate --strict``).

    :param from_version: the first version to check; None: the first published one. Templated.
    :param to_version: the last version to check; None: the last published one. Templated.
    :param reader: the reader whose view is compared with the store (``deltalake``, ``spark``,
        ``duckdb``, ``kernel-java`` or ``auto``). Templated.
    :param strict: also fail on a reader's limitation. Templated.
    """

    metric_step = "validate"
    template_fields: Sequence[str] = (
        *DeltaMirrorTableOperator.template_fields,
        "from_version",
        "to_version",
        "reader",
        "strict",
    )

    def __init__(
        self,
        *,
        from_version: int | str | None = None,
        to_version: int | str | None = None,
        reader: str = "deltalake",
        strict: bool | str = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.from_version = from_version
        self.to_version = to_version
        self.reader = reader
        self.strict = strict

    @translated
    def run(self, context: Any) -> dict[str, Any]:
        from delta_mirror.jobs.validate import validate_table

        report = validate_table(
            self.hook.store,
            self.table,
            from_version=optional_int(self.from_version, "from_version"),
            to_version=optional_int(self.to_version, "to_version"),
            reader=self.reader,
            storage_options=self.hook.storage_options,
        )
        from delta_mirror.health.monitoring import record_validation

        record_validation(self.hook.store, self.table, {**report.to_json(), "reader": self.reader})
        judge_report(
            self.log, self.table, report, strict=str(self.strict).strip().lower() in ("true", "1", "yes")
        )
        return report.to_json()


class DeltaMirrorMaintenanceOperator(DeltaMirrorTableOperator):
    """Clean up log files by the table's retention (dry-run unless ``cleanup_dry_run=False``).

    :param cleanup_dry_run: only report what would be deleted. Templated.
    :param log_retention_seconds: how long log files are kept; None: the table's
        ``delta.logRetentionDuration`` (30 days by default).
    """

    metric_step = "maintenance"
    template_fields: Sequence[str] = (*DeltaMirrorTableOperator.template_fields, "cleanup_dry_run")

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


__all__ = [
    "DeltaMirrorCheckpointOperator",
    "DeltaMirrorMaintenanceOperator",
    "DeltaMirrorPublishOperator",
    "DeltaMirrorValidateOperator",
    "judge_report",
]
