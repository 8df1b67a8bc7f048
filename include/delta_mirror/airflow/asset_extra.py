"""The ``extra`` of a table's asset event: what its emitters write (the publishing tasks, the
triggerer's ``PublishedVersionsTrigger``) and ``assets.published_range`` reads. Its own module so
that the trigger and ``assets`` (which builds the trigger) need not import each other."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

#: The keys of every event's extra (a triggerer's event has them under ``payload``).
EXTRA_KEYS = ("table", "first_version", "last_version", "checkpoint_version")


def event_extra(
    table: str, versions: Iterable[int], checkpoints: Iterable[int] = ()
) -> dict[str, Any] | None:
    """The ``extra`` of the event for ``versions`` published (None: nothing was, no event);
    ``checkpoint_version`` is the newest of ``checkpoints`` (written with them), or None."""
    published = sorted(versions)
    if not published:
        return None
    written = list(checkpoints)
    return {
        "table": table,
        "first_version": published[0],
        "last_version": published[-1],
        "checkpoint_version": max(written) if written else None,
    }


__all__ = ["EXTRA_KEYS", "event_extra"]
