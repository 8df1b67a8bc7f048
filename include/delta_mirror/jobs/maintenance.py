"""Log cleanup by the table's retention (``delta.logRetentionDuration``), as Delta-Spark does it.

Keeps the newest complete checkpoint older than the cutoff and its JSON commit: a reader must
always find a checkpoint to start from. Deletes only commit, checkpoint and checksum files below
that checkpoint whose modification time is before the cutoff. Dry-run by default. The store
keeps every version: cleanup affects only what readers can time-travel to.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime

from delta_mirror.delta.log_listing import list_log
from delta_mirror.delta.log_path import LogFileKind
from delta_mirror.delta.protocol import DEFAULT_LOG_RETENTION_MS, LOG_RETENTION, now_ms, property_duration_ms
from delta_mirror.storage import ObjectMeta, open_store
from delta_mirror.store.sql_store import SqlStore
from delta_mirror.store.states import Artifact, PublishState

_CLEANABLE = (
    LogFileKind.COMMIT,
    LogFileKind.CHECKPOINT,
    LogFileKind.MULTIPART_CHECKPOINT,
    LogFileKind.UUID_CHECKPOINT,
    LogFileKind.CRC,
    LogFileKind.COMPACTED,
)


@dataclass
class CleanupReport:
    table: str
    dry_run: bool
    cutoff_ms: int
    kept_checkpoint: int | None
    deleted: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, object]:
        out = asdict(self)
        deleted = out.pop("deleted")
        return {**out, "files": len(deleted), "deleted": deleted}


def _mtime_ms(meta: ObjectMeta) -> int:
    if meta.last_modified is None:
        return now_ms()
    ts = meta.last_modified if meta.last_modified.tzinfo else meta.last_modified.replace(tzinfo=UTC)
    return int(ts.timestamp() * 1000)


def cleanup_log(
    store: SqlStore,
    name: str,
    *,
    dry_run: bool = True,
    retention_ms: int | None = None,
    now: datetime | None = None,
    storage_options: Mapping[str, str] | None = None,
) -> CleanupReport:
    """Delete (or list, in dry-run) log files that fell out of the retention window."""
    table = store.get_table(name)
    published = store.last_published_version(table.id)
    if retention_ms is None:
        snapshot_version = published if published is not None else table.first_version
        meta = json.loads(store.snapshot(table.id, snapshot_version).metadata)["metaData"]
        retention_ms = property_duration_ms(
            meta.get("configuration"), LOG_RETENTION, DEFAULT_LOG_RETENTION_MS
        )
    current = int((now.timestamp() if now else now_ms() / 1000) * 1000)
    cutoff = current - retention_ms
    objects = open_store(table.location, storage_options)
    listing = list_log(objects).entries
    succeeded = {
        r.version
        for r in store.status_rows(table.id, artifact=Artifact.CHECKPOINT, states=(PublishState.SUCCESS,))
    }
    candidates = [
        f.version for m, f in listing if f.is_checkpoint and f.version in succeeded and _mtime_ms(m) <= cutoff
    ]
    report = CleanupReport(name, dry_run, cutoff, max(candidates) if candidates else None)
    if report.kept_checkpoint is None:
        return report
    keep = report.kept_checkpoint
    for meta_, parsed in listing:
        if parsed.kind not in _CLEANABLE or parsed.version >= keep:
            continue
        if _mtime_ms(meta_) > cutoff:
            continue
        report.deleted.append(meta_.path)
        if not dry_run:
            objects.delete(meta_.path)
    if not dry_run and report.deleted:
        settings = dict(table.settings)
        settings["log_floor"] = keep
        store.update_table(table.id, settings=settings)
    return report


__all__ = ["CleanupReport", "cleanup_log"]
