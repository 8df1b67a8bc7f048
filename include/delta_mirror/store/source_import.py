"""Import: recording a source checkpoint's state where it disagrees with the JSON commits.

Readers start from the newest checkpoint at or before the version they read, so at a source
checkpoint's version its protocol, metadata, transactions and file set are the table
(``delta.source_state``). The JSON commits are stored byte for byte as always; the checkpoint's
differing actions go beside them as snapshot rows (``PART_SNAPSHOT``) of that version, which the
store's snapshot and file index read like any other action: ``Reads.snapshot`` prefers the later
part of a version, and the mirror's own checkpoints are built from that state. Files the
checkpoint no longer lists leave the file index at that version without a tombstone (readers of
the checkpoint never saw them removed).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from sqlalchemy import bindparam, insert, select, update

from delta_mirror.delta.actions import line_action
from delta_mirror.delta.protocol import now_ms
from delta_mirror.delta.source_state import CheckpointState
from delta_mirror.store.schema import PART_SNAPSHOT, dl_files, dl_mirror_status

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection

    from delta_mirror.store.sql_store import SqlStore, TableInfo

#: Table setting listing the recorded disagreements ({"version", "field", "detail"} each).
CHECKPOINT_STATE_SETTING = "source_checkpoint_state"


def record_checkpoint_state(
    store: SqlStore, conn: Connection, table: TableInfo, state: CheckpointState, *, enqueue_checkpoint: bool
) -> None:
    """Make the store's state at ``state.version`` the source checkpoint's (in the import's
    transaction, right after that version's commit was imported).

    ``enqueue_checkpoint`` queues a mirror checkpoint at that version, so that readers of a copy
    published elsewhere start from the same state as readers of the source did (an in-place import
    keeps the source's own checkpoint instead).
    """
    lines = list(state.lines)
    if lines:
        actions = [line_action(json.loads(line)) for line in lines]
        store.import_version(conn, table, state.version, actions, lines, part=PART_SNAPSHOT)
    if state.dropped_files:
        conn.execute(
            update(dl_files)
            .where(
                dl_files.c.table_id == table.id,
                dl_files.c.path == bindparam("p"),
                dl_files.c.dv_id == bindparam("d"),
                dl_files.c.remove_version.is_(None),
            )
            .values(remove_version=state.version),
            [{"p": path, "d": dv} for path, dv in state.dropped_files],
        )
    if enqueue_checkpoint:
        _enqueue_checkpoint(conn, table.id, state.version)


def _enqueue_checkpoint(conn: Connection, table_id: int, version: int) -> None:
    exists = conn.execute(
        select(dl_mirror_status.c.state).where(
            dl_mirror_status.c.table_id == table_id,
            dl_mirror_status.c.version == version,
            dl_mirror_status.c.artifact == "checkpoint",
        )
    ).first()
    if exists is None:
        conn.execute(
            insert(dl_mirror_status).values(
                table_id=table_id,
                version=version,
                artifact="checkpoint",
                state="PENDING",
                attempts=0,
                enqueued_at=now_ms(),
            )
        )


def checkpoint_state_versions(settings: dict[str, Any]) -> set[int]:
    """Versions whose state an import took from the source's checkpoint (validation restarts its
    store-side replay there: the store's state is not the previous version plus the commit)."""
    recorded = settings.get(CHECKPOINT_STATE_SETTING) or []
    return {int(d["version"]) for d in recorded if isinstance(d, dict) and isinstance(d.get("version"), int)}


__all__ = ["CHECKPOINT_STATE_SETTING", "checkpoint_state_versions", "record_checkpoint_state"]
