"""Which engine builds a table's checkpoints, and the publisher that goes with it.

``publisher_for(store, name, engine)`` is the one place the CLI (``mirror``, ``sync``,
``checkpoint``) and the operators (checkpoint, sync) get a publisher for a checkpoint engine. It
chooses the builder and the lease together, so no caller can take one without the other:

* ``local``: no builder (the publisher's in-process engine) and the usual lease (120 s,
  ``DELTA_MIRROR_LEASE_TTL``);
* ``spark`` / ``auto``: a ``ConfiguredBuilder`` (it starts Spark only when a checkpoint is actually
  built, and ``auto`` counts the table's active files first) and ``SPARK_LEASE_TTL`` (3,600 s): the
  lease is not renewed while Spark builds, and a long build must not lose it to a second publisher.

Why here, in the Spark tier: choosing ``spark`` means building a ``SparkCheckpointEngine`` on a
SparkSession, and ``jobs/`` sits below ``spark/`` (``tests/test_architecture.py``). ``jobs.sync``
therefore takes the factory by injection (``make_publisher``). Importing this module is cheap
(no pyspark, no pyarrow): a local-engine run never loads the Spark engine.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from delta_mirror.errors import PermanentError
from delta_mirror.jobs.publish_checkpoint import CheckpointBuilder, local_checkpoint_builder
from delta_mirror.jobs.publish_lease import SPARK_LEASE_TTL
from delta_mirror.jobs.publisher import Publisher
from delta_mirror.table_config import CheckpointEngine, CheckpointSettings

if TYPE_CHECKING:
    from delta_mirror.delta.checkpoint.model import CheckpointResult
    from delta_mirror.jobs.publish_checkpoint import CheckpointPlan
    from delta_mirror.store.sql_store import SqlStore


def engine_named(engine: str) -> CheckpointEngine:
    """The ``CheckpointEngine`` called ``engine``; a ``PermanentError`` naming the choices otherwise."""
    found = CheckpointEngine.named(engine)
    if found is None:
        raise PermanentError(
            f"unknown checkpoint engine {engine!r}", hint=f"use {CheckpointEngine.choices()}"
        )
    return found


def choose_engine(engine: str, active_files: int | None, threshold: int) -> CheckpointEngine:
    """``local`` or ``spark`` for a table: ``auto`` picks Spark from ``threshold`` active files on."""
    wanted = engine_named(engine)
    if wanted != CheckpointEngine.AUTO:
        return wanted
    big = active_files is not None and active_files >= threshold
    return CheckpointEngine.SPARK if big else CheckpointEngine.LOCAL


def builder_for(
    store: SqlStore, name: str, engine: str | None = None, settings: CheckpointSettings | None = None
) -> tuple[CheckpointEngine, CheckpointBuilder | None]:
    """The engine for ``name`` now (``engine`` overrides the table config's) and its builder: ``None``
    for the local engine, else a ``SparkCheckpointEngine`` on this process's SparkSession."""
    settings = settings or CheckpointSettings()
    wanted = engine_named(engine or settings.engine)
    files = None
    if wanted == CheckpointEngine.AUTO:
        table = store.get_table(name)
        last = store.last_published_version(table.id)
        files = store.count_active_files(table.id, last) if last is not None else 0
    chosen = choose_engine(wanted, files, settings.spark_threshold_files)
    if chosen == CheckpointEngine.LOCAL:
        return chosen, None
    from delta_mirror.spark.checkpoint_engine import SparkCheckpointEngine
    from delta_mirror.spark.session import get_spark

    spark = get_spark(settings.spark_master, authority=None, **settings.spark_conf)
    return chosen, SparkCheckpointEngine(spark, num_partitions=settings.spark_partitions)


class ConfiguredBuilder:
    """A ``CheckpointBuilder`` that picks the engine when a checkpoint is actually due.

    ``delta-mirror mirror`` writes checkpoints on the table's cadence: with ``spark`` or ``auto``
    in the table config it must not start a SparkSession for a run that writes none. ``used``
    records the engine of each checkpoint it built.
    """

    def __init__(self, name: str, engine: str | None, settings: CheckpointSettings | None) -> None:
        self.name, self.engine, self.settings = name, engine, settings
        self.used: list[CheckpointEngine] = []

    def __call__(self, store: SqlStore, plan: CheckpointPlan) -> CheckpointResult:
        chosen, builder = builder_for(store, self.name, self.engine, self.settings)
        self.used.append(chosen)
        return (builder or local_checkpoint_builder)(store, plan)


def publisher_for(
    store: SqlStore,
    name: str,
    engine: str | None = None,
    *,
    settings: CheckpointSettings | None = None,
    **publisher_args: Any,
) -> Publisher:
    """A publisher for table ``name`` whose checkpoints the engine builds, with the lease that engine
    needs. ``engine`` overrides ``settings.engine`` (the table config's ``checkpoint``; None: the
    defaults, local); ``publisher_args`` are ``Publisher``'s other keyword arguments."""
    settings = settings or CheckpointSettings()
    wanted = engine_named(engine or settings.engine)
    if wanted == CheckpointEngine.LOCAL:
        return Publisher(store, **publisher_args)
    builder = ConfiguredBuilder(name, wanted, settings)
    return Publisher(store, checkpoint_builder=builder, lease_ttl=SPARK_LEASE_TTL, **publisher_args)


def engines_used(publisher: Publisher) -> list[CheckpointEngine]:
    """The engine of each checkpoint the publisher built, in order; a local-engine publisher (no
    ``ConfiguredBuilder``) reports none."""
    builder = publisher.checkpoint_builder
    return list(builder.used) if isinstance(builder, ConfiguredBuilder) else []


def last_engine(publisher: Publisher) -> CheckpointEngine:
    """The engine of the publisher's last checkpoint (local when no configured engine built one)."""
    used = engines_used(publisher)
    return used[-1] if used else CheckpointEngine.LOCAL


__all__ = [
    "ConfiguredBuilder",
    "builder_for",
    "choose_engine",
    "engine_named",
    "engines_used",
    "last_engine",
    "publisher_for",
]
