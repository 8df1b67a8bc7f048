"""The table config's types: a table's settings (``TableConfig``), the file's (``MirrorConfig``),
and the duration syntax they share (``parse_duration``). ``parse.py`` reads the YAML into them."""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from datetime import timedelta
from enum import StrEnum
from typing import Any

from delta_mirror.errors import PermanentError

DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)\s*$")
_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


class ConfigError(PermanentError):
    """The table config file is invalid (the DAG file shows it as an import error)."""


def parse_duration(value: Any, where: str) -> timedelta:
    """``30s``, ``10m``, ``2h``, ``1d``, ``1w`` or a number of seconds."""
    if isinstance(value, bool):
        raise ConfigError(f"{where}: expected a duration like 30s, 10m, 2h, got {value!r}")
    if isinstance(value, int | float) and value >= 0:
        return timedelta(seconds=float(value))
    if isinstance(value, str) and (m := DURATION_RE.match(value)):
        return timedelta(seconds=float(m[1]) * _UNITS[m[2]])
    raise ConfigError(
        f"{where}: expected a duration like 30s, 10m, 2h, got {value!r}",
        hint="use a number with a unit: ms, s, m, h, d or w",
    )


@dataclass(frozen=True)
class Notify:
    email: tuple[str, ...] = ()
    smtp_conn_id: str = "smtp_default"
    from_email: str = "delta-mirror@localhost"
    notifier: str | None = None
    notifier_kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Maintenance:
    dry_run: bool = True
    log_retention: timedelta | None = None  # None: the table's delta.logRetentionDuration (30 days)
    schedule: str | timedelta | None = "@daily"


class CheckpointEngine(StrEnum):
    """Who builds a table's checkpoints: ``local`` in the publishing process, ``spark`` a Spark job
    reading the store, ``auto`` Spark from ``spark_threshold_files`` active files on, else local.

    The one list of engine names: the config check, the CLI's ``--engine`` choice, the operators and
    ``spark.checkpoint_choice`` (which builds the publisher for an engine) read it. A member equals
    its bare string, so configs and templated operator arguments keep working.
    """

    LOCAL = "local"
    SPARK = "spark"
    AUTO = "auto"

    @classmethod
    def named(cls, value: object) -> CheckpointEngine | None:
        """The engine called ``value`` (None for any other value)."""
        return next((e for e in cls if e.value == value), None)

    @classmethod
    def choices(cls) -> str:
        """``local, spark or auto``, for messages."""
        names = [e.value for e in cls]
        return f"{', '.join(names[:-1])} or {names[-1]}"


@dataclass(frozen=True)
class CheckpointSettings:
    """Which engine builds the table's checkpoints (``CheckpointEngine``) and how Spark runs."""

    engine: CheckpointEngine = CheckpointEngine.LOCAL
    spark_threshold_files: int = 2_000_000
    spark_conn_id: str = "spark_default"  # Airflow's SparkSubmitOperator connection
    spark_master: str | None = None  # in-process runs (CLI, auto): else DELTA_MIRROR_SPARK_MASTER
    spark_partitions: int | None = None  # parallel JDBC reads of the store
    spark_conf: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class TableConfig:
    name: str
    schedule: str | timedelta | None = "*/5 * * * *"
    poll_interval: timedelta = timedelta(seconds=5)
    owner: str = "data-platform"
    tags: tuple[str, ...] = ()
    retries: int = 3
    retry_delay: timedelta = timedelta(seconds=30)
    retry_exponential_backoff: float = 2.0
    max_retry_delay: timedelta = timedelta(minutes=10)
    lag_slo: timedelta = timedelta(minutes=15)
    lag_history_retention: timedelta = timedelta(days=14)
    # `health` fails once the table's publish attempts have failed for this long or this many times
    # in a row (whichever comes first), not only once its lag breaches the lag SLO
    failure_grace: timedelta = timedelta(minutes=5)
    failure_grace_attempts: int = 2
    deadline: timedelta | None = timedelta(minutes=30)
    validate: bool = True
    reader: str = "deltalake"
    store_conn_id: str | None = None
    aws_conn_id: str | None = None
    notify: Notify = field(default_factory=Notify)
    maintenance: Maintenance = field(default_factory=Maintenance)
    checkpoint: CheckpointSettings = field(default_factory=CheckpointSettings)
    # fleet knobs: Airflow's own DAG / task arguments, per table
    max_active_runs: int = 1
    max_active_tasks: int | None = None
    pool: str | None = None
    priority_weight: int = 1
    # the per-run work: one `sync` task or the four steps (None: by schedule, see ``task_layout``)
    tasks: str | None = None
    validate_every: timedelta = timedelta(minutes=10)
    # who publishes an event-driven table's commits: its watcher (triggerer) or its DAG run (task);
    # None: by schedule, see ``publisher``
    publish_in: str | None = None
    # the URI of the table's Airflow asset (None: x-delta-mirror://<store>/<table>, airflow/assets.py)
    asset_uri: str | None = None

    @property
    def event_driven(self) -> bool:
        return self.schedule == "event"

    @property
    def task_layout(self) -> str:
        """``single`` (one ``sync`` task) or ``steps``; unset: single for an event-driven table,
        whose runs follow each commit, steps for a scheduled one."""
        if self.tasks is not None:
            return self.tasks
        return "single" if self.event_driven else "steps"

    @property
    def publisher(self) -> str:
        """``triggerer`` or ``task``; unset: the triggerer for an event-driven table (a task process
        per commit costs ~1 CPU-s and seconds of latency, docs/scaling.md), the task otherwise."""
        if self.publish_in is not None:
            return self.publish_in
        return "triggerer" if self.event_driven else "task"

    @property
    def dag_id(self) -> str:
        return f"delta_mirror__{self.name}"


@dataclass(frozen=True)
class MirrorConfig:
    tables: dict[str, TableConfig]
    defaults: TableConfig
    reconcile_schedule: str | timedelta | None = "*/10 * * * *"
    monitor_schedule: str | timedelta | None = "*/5 * * * *"
    escalate_after_attempts: int = 3
    reconcile_strategy: str = "smart"
    source: str = ""

    def settings_for(self, name: str) -> TableConfig:
        """The settings a table runs with: its own when it is listed, else the defaults (named
        ``name``). The one lookup the CLI, the operators and the DAGs use; ``table()`` instead
        refuses an unlisted name."""
        listed = self.tables.get(name)
        return listed if listed is not None else replace(self.defaults, name=name)

    def table(self, name: str) -> TableConfig:
        if name not in self.tables:
            raise ConfigError(
                f"table '{name}' is not in the config {self.source}",
                hint=f"configured tables: {', '.join(sorted(self.tables)) or 'none'}",
            )
        return self.tables[name]


__all__ = [
    "DURATION_RE",
    "CheckpointEngine",
    "CheckpointSettings",
    "ConfigError",
    "Maintenance",
    "MirrorConfig",
    "Notify",
    "TableConfig",
    "parse_duration",
]
