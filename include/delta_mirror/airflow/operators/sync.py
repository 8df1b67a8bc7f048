"""The one task of a ``tasks: single`` table's run: publish, checkpoint when due, validate on the
table's cadence and record the lag, in one process (``jobs.sync``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from delta_mirror.airflow.errors import translated
from delta_mirror.airflow.operators.base import DeltaMirrorTableOperator
from delta_mirror.airflow.operators.table_steps import judge_report
from delta_mirror.table_config import CheckpointEngine


class DeltaMirrorSyncOperator(DeltaMirrorTableOperator):
    """Publish every pending version of ``table`` and do the run's follow-up work in the same task
    (``jobs.sync.sync_table``): checkpoint when due, validate on the table's cadence, lag sample.
    Its ``Asset`` outlets get an event only when it published some (never with ``publish_in:
    triggerer``: the asset's watcher reports those).

    :param checkpoint_engine: ``local`` / ``auto`` checkpoint here when due (``auto`` with Spark in
        this worker from the table's file threshold on, under the long lease); ``spark`` leaves it
        to the spark-submit task after this one.
    :param validate_every: seconds between validations of the newly published versions (None:
        never; 0: every run); a problem fails the task, as the validate step does. Templated.
    :param reader: the reader validation compares with the store. Templated.
    :param lag_history_retention: seconds of lag samples kept (None: 14 days).
    :param publish_in: the table config's; ``triggerer``: the table's trigger publishes too, and a
        lease it holds is waited for, not a failed try.
    """

    metric_step = "sync"
    template_fields: Sequence[str] = (*DeltaMirrorTableOperator.template_fields, "reader", "validate_every")

    def __init__(
        self,
        *,
        checkpoint_engine: str = CheckpointEngine.LOCAL,
        validate_every: float | str | None = 600.0,
        reader: str = "deltalake",
        lag_history_retention: float | None = None,
        publish_in: str = "task",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.checkpoint_engine = checkpoint_engine
        self.validate_every = validate_every
        self.reader = reader
        self.lag_history_retention = lag_history_retention
        self.publish_in = publish_in

    @translated
    def run(self, context: Any) -> dict[str, Any]:
        from datetime import timedelta

        from delta_mirror.airflow.metrics import emit_table_metrics, emit_version_latencies
        from delta_mirror.health.monitoring import DEFAULT_LAG_RETENTION
        from delta_mirror.jobs.sync import sync_table

        # spark: the spark-submit task after this one checkpoints; local / auto: this task, auto
        # starting Spark in this worker when a due checkpoint's table is above the threshold
        here = self.checkpoint_engine != CheckpointEngine.SPARK
        every = None if self.validate_every in (None, "", "None") else float(self.validate_every)
        retention = self.lag_history_retention
        result = sync_table(
            self.hook.store,
            self.table,
            storage_options=self.hook.storage_options,
            make_publisher=self.publisher_factory(self.checkpoint_engine) if here else None,
            checkpoint_here=here,
            validate_every=None if every is None else timedelta(seconds=every),
            reader=self.reader,
            lag_retention=DEFAULT_LAG_RETENTION if retention is None else timedelta(seconds=retention),
            publish_in=self.publish_in,
        )
        emit_table_metrics(result.status)
        table_id = self.hook.store.get_table(self.table).id
        emit_version_latencies(self.table, self.hook.store.latencies_of(table_id, result.publish.published))
        summary = result.to_json()
        self.log.info(
            "%s: published %d version(s) through %s%s; checkpoint %s; validation %s; lag %.1f s",
            self.table,
            summary["published"],
            summary["last_published"],
            " (left to the publisher holding the table's lease)" if result.published_elsewhere else "",
            result.checkpoint_text(),
            summary["validation"]["state"],
            result.status.lag_seconds,
        )
        if result.checkpoint_not_written is not None:
            self.log.warning("%s: checkpoint %s", self.table, result.checkpoint_text())
        if result.report is not None:
            judge_report(self.log, self.table, result.report)
        from delta_mirror.airflow.asset_extra import event_extra

        # publish_in: triggerer: the table's asset has a watcher that reports every publish (this
        # one's too), so an event from here would be the same versions twice
        versions = (
            []
            if self.publish_in == "triggerer"
            else [*result.publish.published, *result.publish.already_present]
        )
        self.emit_asset_event(context, event_extra(str(self.table), versions, result.checkpoints))
        return summary


__all__ = ["DeltaMirrorSyncOperator"]
