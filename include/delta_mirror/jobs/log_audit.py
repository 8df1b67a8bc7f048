"""Audit a table's ``_delta_log/`` against the store (the reconciler's ``full`` strategy).

Finds what is missing, different or foreign; the reconciler repairs only what is safe: republishing
missing commits and checkpoints (put-if-absent). A different or foreign commit is never touched: the
table is halted with guidance instead.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from delta_mirror.delta.last_checkpoint import LAST_CHECKPOINT_PATH, judge_last_checkpoint
from delta_mirror.delta.log_listing import list_log, sidecar_refs
from delta_mirror.storage import ObjectStore
from delta_mirror.store.sql_store import SqlStore, TableInfo
from delta_mirror.store.states import Artifact, PublishState


@dataclass
class LogAudit:
    missing_commits: list[int] = field(default_factory=list)
    different_commits: list[int] = field(default_factory=list)
    foreign_commits: list[int] = field(default_factory=list)  # beyond the store's latest version
    missing_checkpoints: list[int] = field(default_factory=list)
    bad_last_checkpoint: str | None = None

    @property
    def clean(self) -> bool:
        return not (
            self.missing_commits
            or self.different_commits
            or self.foreign_commits
            or self.missing_checkpoints
            or self.bad_last_checkpoint
        )


def audit_log(store: SqlStore, table: TableInfo, objects: ObjectStore, *, hashes: bool = True) -> LogAudit:
    """List ``_delta_log/`` once and compare it with every SUCCESS version of the store.

    Checkpoints and ``_last_checkpoint`` are judged by the same rules as validation (a checkpoint
    counts only when complete). A missing pointer is reported too: the publisher wrote one, so it
    was lost, and the reconciler writes it again.
    """
    audit = LogAudit()
    listing = list_log(objects)
    refs = sidecar_refs(objects)
    commits = listing.commits
    floor = table.settings.get("log_floor")
    floor = floor if isinstance(floor, int) else table.first_version
    latest = store.latest_version(table.id)
    audit.foreign_commits = sorted(v for v in commits if latest is None or v > latest)
    for row in store.status_rows(
        table.id, artifact=Artifact.JSON, states=(PublishState.SUCCESS,), from_version=floor
    ):
        path = commits.get(row.version)
        if path is None:
            audit.missing_commits.append(row.version)
        elif hashes and row.sha256:
            data = objects.get(path)
            if data is None or hashlib.sha256(data).hexdigest() != row.sha256:
                audit.different_commits.append(row.version)
    published_cps = store.status_rows(
        table.id, artifact=Artifact.CHECKPOINT, states=(PublishState.SUCCESS,), from_version=floor
    )
    audit.missing_checkpoints = [
        r.version for r in published_cps if listing.complete_checkpoint(r.version, refs) is None
    ]
    newest = max((r.version for r in published_cps), default=None)
    if newest is not None:
        data = objects.get(LAST_CHECKPOINT_PATH)
        problems = judge_last_checkpoint(data, listing, refs, newest_checkpoint=newest)
        if data is None:
            audit.bad_last_checkpoint = "missing"
        elif problems:
            audit.bad_last_checkpoint = "; ".join(p.message for p in problems)
    return audit


__all__ = ["LogAudit", "audit_log"]
