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

from typing import Any

from delta_mirror.delta.line_facts import facts_of_lines
from delta_mirror.delta.source_state import CheckpointState
from delta_mirror.store.bulk_load import BulkImport
from delta_mirror.store.schema import PART_SNAPSHOT

#: Table setting listing the recorded disagreements ({"version", "field", "detail"} each).
CHECKPOINT_STATE_SETTING = "source_checkpoint_state"


def record_checkpoint_state(bulk: BulkImport, state: CheckpointState, *, enqueue_checkpoint: bool) -> None:
    """Make the store's state at ``state.version`` the source checkpoint's (in the import's rows,
    right after that version's commit).

    ``enqueue_checkpoint`` queues a mirror checkpoint at that version, so that readers of a copy
    published elsewhere start from the same state as readers of the source did (an in-place import
    keeps the source's own checkpoint instead).
    """
    lines = list(state.lines)
    if lines:
        bulk.version(state.version, lines, facts_of_lines(lines, version=state.version), part=PART_SNAPSHOT)
    if state.dropped_files:
        bulk.drop_files(state.version, state.dropped_files)
    if enqueue_checkpoint:
        bulk.enqueue_checkpoint(state.version)


def checkpoint_state_versions(settings: dict[str, Any]) -> set[int]:
    """Versions whose state an import took from the source's checkpoint (validation restarts its
    store-side replay there: the store's state is not the previous version plus the commit)."""
    recorded = settings.get(CHECKPOINT_STATE_SETTING) or []
    return {int(d["version"]) for d in recorded if isinstance(d, dict) and isinstance(d.get("version"), int)}


__all__ = ["CHECKPOINT_STATE_SETTING", "checkpoint_state_versions", "record_checkpoint_state"]
