"""The values of the store's state columns (``store/schema.py``), as ``StrEnum``s.

Each member's value is the text stored in the column (and shown by ``status`` and the UI), so a
member compares equal to the bare string and rows written before these types existed read the same.
"""

from __future__ import annotations

from enum import StrEnum


class TableState(StrEnum):
    """``dl_tables.state``: a halted table refuses commits and publishing until resumed."""

    ACTIVE = "ACTIVE"
    HALTED = "HALTED"


class Artifact(StrEnum):
    """``dl_mirror_status.artifact``: what is published for a version."""

    JSON = "json"  # the commit file <v>.json
    CHECKPOINT = "checkpoint"  # the checkpoint of v (and _last_checkpoint)


class PublishState(StrEnum):
    """``dl_mirror_status.state``: PENDING → IN_PROGRESS → SUCCESS, or FAILED (retried) or
    CONFLICT (a different file is at the location: the table halts)."""

    PENDING = "PENDING"
    IN_PROGRESS = "IN_PROGRESS"
    SUCCESS = "SUCCESS"
    FAILED = "FAILED"
    CONFLICT = "CONFLICT"


class CommitSource(StrEnum):
    """``dl_commits.source``: who wrote the version."""

    NATIVE = "native"  # SqlStore.commit
    SPARK = "spark"  # SqlStore.commit_verbatim (a writer's exact file)
    IMPORT = "import"  # imported from an existing _delta_log/


class CircuitState(StrEnum):
    """``dl_breakers.state`` (see ``health/breaker.py``)."""

    CLOSED = "CLOSED"
    OPEN = "OPEN"
    HALF_OPEN = "HALF_OPEN"


__all__ = ["Artifact", "CircuitState", "CommitSource", "PublishState", "TableState"]
