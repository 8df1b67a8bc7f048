"""Publishing where a commit is noticed (``publish_in: triggerer``), and whether a DAG run is needed.

A task process per commit costs seconds of start-up for a publish that takes milliseconds; with
hundreds of tables every commit hits another table, so coalescing cannot amortise it. A table with
``publish_in: triggerer`` is published by its watcher (the Airflow trigger, in a thread) with the
same ``Publisher`` (lease, order, read-back), without checkpoints: a checkpoint may be large and is
the DAG run's. The outcome says whether the table's DAG must still run:

- ``published`` / ``nothing``: no run (the commit is readable now);
- ``checkpoint due``: the cadence policy wants a checkpoint at the published version (a check, no
  write): the run writes it;
- ``failed``: publishing failed (storage down, a bad stored commit, a halted table, the store
  itself): the run publishes with the task's retries, backoff, breaker and alerts;
- ``lease held``: another publisher is at work; it publishes, the next poll sees the result.

No Airflow import here: the core never imports Airflow.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from delta_mirror.errors import LeaseHeldError, first_line
from delta_mirror.jobs.publish_cadence import checkpoint_due
from delta_mirror.jobs.publisher import Publisher, RetryPolicy
from delta_mirror.storage import ObjectStore
from delta_mirror.store.sql_store import SqlStore

#: Outcomes after which the table's DAG must run.
FIRES = frozenset({"checkpoint due", "failed"})

#: In the triggerer a failed put is retried briefly (a thread of a shared pool waits meanwhile);
#: the DAG run it then starts retries with the task's backoff.
TRIGGER_RETRY = RetryPolicy(attempts=2, base_delay=0.2, max_delay=1.0)


@dataclass(frozen=True)
class WatchPublish:
    """What publishing from the watcher did: ``action`` (see the module docstring), the versions
    it published, the last published version and, when it failed, one line saying why."""

    table: str
    action: str
    published: list[int] = field(default_factory=list)
    last_published: int | None = None
    error: str | None = None
    last_checkpoint: int | None = None  # with ``checkpoint due``: the newest checkpoint there is

    @property
    def fires(self) -> bool:
        """Whether the table's DAG must run (a checkpoint is due, or publishing failed)."""
        return self.action in FIRES


def publish_from_watcher(
    store: SqlStore,
    name: str,
    *,
    storage_options: Mapping[str, str] | None = None,
    open_location: Callable[[str], ObjectStore] | None = None,
    retry: RetryPolicy | None = None,
) -> WatchPublish:
    """Publish every pending version of ``name`` without checkpoints; never raises (a failure is
    the outcome ``failed``: the DAG run publishes then, with its retries and alerts)."""
    kwargs: dict[str, Any] = {}
    if open_location is not None:
        kwargs["open_location"] = open_location
    try:
        publisher = Publisher(
            store,
            storage_options=storage_options,
            cadence_checkpoints=False,
            retry=retry or TRIGGER_RETRY,
            **kwargs,
        )
        result = publisher.publish(name)
    except LeaseHeldError:
        return WatchPublish(name, "lease held")
    except Exception as exc:  # storage, store, a bad commit: the run retries and alerts
        return WatchPublish(name, "failed", error=first_line(exc))
    last = result.last_published
    action = "published" if result.published else "nothing"
    checkpoint = None
    try:
        table = store.get_table(name)
        if last is not None and checkpoint_due(store, table, last):
            action, checkpoint = "checkpoint due", store.last_checkpoint_version(table.id)
    except Exception as exc:  # the question failed: let the run decide (it asks again)
        return WatchPublish(name, "failed", list(result.published), last, first_line(exc))
    return WatchPublish(name, action, list(result.published), last, last_checkpoint=checkpoint)


__all__ = ["FIRES", "TRIGGER_RETRY", "WatchPublish", "publish_from_watcher"]
