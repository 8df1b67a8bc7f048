"""The operator bases: connections and the hook (``DeltaMirrorBaseOperator``), and for one-table
steps the ``enabled`` switch, step metrics and error translation (``DeltaMirrorTableOperator``)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from airflow.sdk import BaseOperator

from delta_mirror.airflow.mixins import CONNECTION_FIELDS, DeltaMirrorHookMixin, template_fields_with


def optional_int(value: Any, name: str) -> int | None:
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


class DeltaMirrorBaseOperator(DeltaMirrorHookMixin, BaseOperator):
    """Every delta-mirror operator on ``BaseOperator``: keyword-only, the constructor only assigns.

    :param store_conn_id: Airflow connection of the SQL store (a Postgres connection, or one whose
        extra holds ``sqlalchemy_url``); None: ``DELTA_MIRROR_STORE`` or the embedded SQLite store.
        Templated.
    :param aws_conn_id: Airflow connection with the object store's credentials and endpoint; None:
        the usual AWS environment variables. Templated.
    """

    template_fields: Sequence[str] = CONNECTION_FIELDS
    ui_color = "#00add4"

    def __init__(
        self, *, store_conn_id: str | None = None, aws_conn_id: str | None = None, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.store_conn_id = store_conn_id
        self.aws_conn_id = aws_conn_id

    def publisher(self, **kwargs: Any) -> Any:
        """A local-engine publisher over the hook's store and object-store options (a step whose
        checkpoints another engine may build takes ``publisher_factory``'s)."""
        from delta_mirror.jobs.publisher import Publisher

        return Publisher(self.hook.store, storage_options=self.hook.storage_options, **kwargs)


class DeltaMirrorTableOperator(DeltaMirrorBaseOperator):
    """A step on one table: ``table`` and the ``enabled`` switch are templated (the backfill form
    switches steps off at run time); ``run()`` is the step, timed and counted in the metrics.

    :param table: the table's name in the store. Templated.
    :param enabled: False (or the text ``false``, ``0``, ``no``) skips the step. Templated.
    """

    template_fields: Sequence[str] = template_fields_with("table", "enabled")
    metric_step = "step"  # names the metrics: delta_mirror.<step>_seconds, delta_mirror.failures

    def __init__(self, *, table: str, enabled: bool | str = True, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.table = table
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

    def emit_asset_event(self, context: Any, extra: dict[str, Any] | None) -> None:
        """Give this try's event of each ``Asset`` outlet (the table's, ``airflow.assets``) the
        ``extra``; None: this try published nothing, so it emits no event at all.

        Airflow registers an event for every ``Asset`` in a successful task's ``outlets`` as they
        are when the task ends (``task_runner._handle_current_task_success``), so a try that
        published nothing drops them from its own copy of the task: the DAG still declares them
        (lineage, the asset graph), a consumer is not started for nothing.
        """
        from airflow.sdk import Asset

        if extra is None:
            self.outlets = [o for o in self.outlets if not isinstance(o, Asset)]
            return
        for outlet in self.outlets:
            if isinstance(outlet, Asset):
                context["outlet_events"][outlet].extra = extra

    def publisher_factory(self, engine: str) -> Callable[..., Any]:
        """``publisher_for`` bound to this table and checkpoint ``engine``: the one place that chooses
        the checkpoint builder and the lease it needs (``spark.checkpoint_choice``); call it with
        ``Publisher``'s other keyword arguments. A non-local engine reads the table's
        ``checkpoint`` settings (threshold, Spark master and conf) from the table config."""
        from functools import partial

        from delta_mirror.spark.checkpoint_choice import publisher_for
        from delta_mirror.table_config import CheckpointEngine, load_config

        settings = None
        if engine != CheckpointEngine.LOCAL:
            settings = load_config().settings_for(str(self.table)).checkpoint
        return partial(publisher_for, self.hook.store, str(self.table), engine, settings=settings)


__all__ = ["DeltaMirrorBaseOperator", "DeltaMirrorTableOperator", "optional_int"]
