"""When the publisher writes a checkpoint on its own (the cadence policy).

A checkpoint is due when the replay cost since the last one reaches either limit: the number of
versions (``checkpoint_interval``, else the table's ``delta.checkpointInterval``, else 10) or the
JSON bytes a reader replays (``checkpoint_max_bytes``, else 32 MiB). A publish run asks once per
batch; ``ReplayBytes`` keeps the byte sum of the run so each question reads only the sizes of the
versions added since the previous one (the sum since the last checkpoint was re-read from its
start every batch: quadratic in a long backlog).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from delta_mirror.store.sql_store import SqlStore, TableInfo

DEFAULT_CHECKPOINT_INTERVAL = 10
DEFAULT_CHECKPOINT_MAX_BYTES = 32 * 1024 * 1024


@dataclass
class ReplayBytes:
    """The JSON bytes of the versions in ``(since, upto]`` of one table (committed sizes never
    change, so the sum only grows with ``upto``); start again when ``since`` moves."""

    since: int = -1
    upto: int = -1
    total: int = 0

    def between(self, store: SqlStore, table_id: int, since: int, version: int) -> int:
        if since == self.since and self.upto <= version:
            if version > self.upto:
                self.total += store.json_bytes_between(table_id, self.upto, version)
        else:
            self.total = store.json_bytes_between(table_id, since, version)
        self.since, self.upto = since, version
        return self.total


def checkpoint_interval(store: SqlStore, table: TableInfo, version: int) -> int:
    """The table's interval, else ``delta.checkpointInterval`` in the metadata at ``version``."""
    interval = table.checkpoint_interval
    if interval is None:
        metadata = json.loads(store.snapshot(table.id, version).metadata)["metaData"]
        config = metadata.get("configuration") or {}
        try:
            interval = int(config.get("delta.checkpointInterval", DEFAULT_CHECKPOINT_INTERVAL))
        except ValueError:
            interval = DEFAULT_CHECKPOINT_INTERVAL
    return max(1, interval)


def checkpoint_due(
    store: SqlStore, table: TableInfo, version: int, replay: ReplayBytes | None = None
) -> bool:
    """Replay cost at ``version`` since the last checkpoint: versions and JSON bytes, whichever
    fills first (``replay``: the run's running byte sum, else one query over the whole span)."""
    last_cp = store.last_checkpoint_version(table.id)
    if last_cp is not None and last_cp >= version:
        return False
    since = last_cp if last_cp is not None else 0
    if version - since >= checkpoint_interval(store, table, version):
        return True
    max_bytes = table.checkpoint_max_bytes or DEFAULT_CHECKPOINT_MAX_BYTES
    replay = replay or ReplayBytes()
    return replay.between(store, table.id, since, version) >= max_bytes


__all__ = [
    "DEFAULT_CHECKPOINT_INTERVAL",
    "DEFAULT_CHECKPOINT_MAX_BYTES",
    "ReplayBytes",
    "checkpoint_due",
    "checkpoint_interval",
]
