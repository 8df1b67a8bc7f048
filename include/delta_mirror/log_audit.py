"""Audit a table's ``_delta_log/`` against the store (the reconciler's ``full`` strategy).

Finds what is missing, different or foreign; the reconciler repairs only what is safe: republishing
missing commits and checkpoints (put-if-absent). A different or foreign commit is never touched: the
table is halted with guidance instead.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field

from delta_mirror.log_path import LAST_CHECKPOINT, LOG_DIR, LogFileKind, parse_log_file
from delta_mirror.storage import ObjectStore
from delta_mirror.store.sql_store import SqlStore, TableInfo


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
    """List ``_delta_log/`` once and compare it with every SUCCESS version of the store."""
    audit = LogAudit()
    commits: dict[int, str] = {}
    checkpoints: set[int] = set()
    for meta in objects.list(LOG_DIR):
        name = meta.path.rsplit("/", 1)[-1]
        parsed = parse_log_file(name) if meta.path.count("/") == 1 else None
        if parsed is None:
            continue
        if parsed.kind is LogFileKind.COMMIT:
            commits[parsed.version] = meta.path
        elif parsed.is_checkpoint:
            checkpoints.add(parsed.version)
    floor = table.settings.get("log_floor")
    floor = floor if isinstance(floor, int) else table.first_version
    latest = store.latest_version(table.id)
    audit.foreign_commits = sorted(v for v in commits if latest is None or v > latest)
    for row in store.status_rows(table.id, artifact="json", states=("SUCCESS",), from_version=floor):
        path = commits.get(row.version)
        if path is None:
            audit.missing_commits.append(row.version)
        elif hashes and row.sha256:
            data = objects.get(path)
            if data is None or hashlib.sha256(data).hexdigest() != row.sha256:
                audit.different_commits.append(row.version)
    published_cps = store.status_rows(
        table.id, artifact="checkpoint", states=("SUCCESS",), from_version=floor
    )
    audit.missing_checkpoints = [r.version for r in published_cps if r.version not in checkpoints]
    newest = max((r.version for r in published_cps), default=None)
    raw = objects.get(f"{LOG_DIR}/{LAST_CHECKPOINT}")
    if newest is not None:
        try:
            pointer = json.loads(raw) if raw else None
            version = pointer.get("version") if isinstance(pointer, dict) else None
            if pointer is None:
                audit.bad_last_checkpoint = "missing"
            elif pointer.get("parts") == 1 or not isinstance(version, int):
                audit.bad_last_checkpoint = "malformed"
            elif version not in checkpoints:
                audit.bad_last_checkpoint = f"points at a missing checkpoint {version}"
            elif version < newest:
                audit.bad_last_checkpoint = f"behind the newest checkpoint ({version} < {newest})"
        except (ValueError, AttributeError):
            audit.bad_last_checkpoint = "not JSON"
    return audit


__all__ = ["LogAudit", "audit_log"]
