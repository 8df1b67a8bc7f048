"""The publisher's checkpoints: what a build needs (``CheckpointPlan``), the local engine, and the
two writes that keep invariant 4 (a checkpoint follows its commit; ``_last_checkpoint`` never moves
backwards): its files put-if-absent, then the pointer moved forward only.

``Publisher`` (``publisher.py``) decides when, under its lease, and records the status; a Spark
engine (``spark/checkpoint_engine.py``) builds from the same plan.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from delta_mirror.delta.protocol import (
    DEFAULT_TOMBSTONE_RETENTION_MS,
    DELETED_FILE_RETENTION,
    CheckpointKind,
    now_ms,
    property_duration_ms,
)
from delta_mirror.errors import PermanentError, TransientError
from delta_mirror.storage import ObjectExistsError, ObjectStore
from delta_mirror.store.sql_store import Snapshot, SqlStore, TableInfo

# The checkpoint and log-listing modules load pyarrow (0.2-0.3 s of a process start): they are
# imported where a checkpoint is written; publishing commits alone never needs them.
if TYPE_CHECKING:
    from delta_mirror.delta.checkpoint.model import CheckpointInput, CheckpointResult


def checkpoint_kind(table: TableInfo, protocol_line: str) -> CheckpointKind:
    """The kind of the table's next checkpoint (the v2 rule: :meth:`CheckpointKind.for_table`)."""
    return CheckpointKind.for_table(protocol_line, table.checkpoint_kind)


@dataclass(frozen=True)
class CheckpointPlan:
    """Everything an engine needs to build the checkpoint of ``version`` (files come from the store)."""

    table: TableInfo
    version: int
    snapshot: Snapshot
    kind: str
    part_size: int | None
    checkpoint_id: str
    modification_time_ms: int
    min_deletion_timestamp: int  # tombstones older than this are past the retention

    def header_input(self) -> CheckpointInput:
        """The non-file state as a ``CheckpointInput`` (its ``adds``/``removes`` left empty)."""
        from delta_mirror.delta.checkpoint.model import CheckpointInput

        snap = self.snapshot
        return CheckpointInput(
            self.version, snap.protocol, snap.metadata, snap.txns, snap.domain_metadata, [], []
        )


#: Builds a checkpoint's files for a plan (the local engine when the publisher has none); the
#: publisher then writes them with put-if-absent and moves ``_last_checkpoint``.
CheckpointBuilder = Callable[[SqlStore, CheckpointPlan], "CheckpointResult"]


def plan_checkpoint(store: SqlStore, table: TableInfo, version: int) -> CheckpointPlan:
    """The plan of ``version``'s checkpoint: the store's snapshot, the table's layout, the
    tombstone retention of its metadata."""
    snap = store.snapshot(table.id, version)
    config = json.loads(snap.metadata)["metaData"].get("configuration") or {}
    retention = property_duration_ms(config, DELETED_FILE_RETENTION, DEFAULT_TOMBSTONE_RETENTION_MS)
    rows = store.commit_rows(table.id, version, version)
    return CheckpointPlan(
        table=table,
        version=version,
        snapshot=snap,
        kind=checkpoint_kind(table, snap.protocol),
        part_size=table.checkpoint_part_size,
        checkpoint_id=f"{table.table_uuid}/{version}",
        modification_time_ms=rows[0].committed_at if rows else 0,
        min_deletion_timestamp=now_ms() - retention,
    )


def local_checkpoint_builder(store: SqlStore, plan: CheckpointPlan) -> CheckpointResult:
    """The in-process engine: the active file set streamed from the store (O(active files))."""
    from delta_mirror.delta.checkpoint.model import CheckpointInput
    from delta_mirror.jobs.read_ahead import read_ahead

    snap, table_id, version = plan.snapshot, plan.table.id, plan.version
    removes = store.tombstone_lines(table_id, version, plan.min_deletion_timestamp)
    # Blocks of lines, read a block ahead in a thread while the previous one is parsed; every
    # layout reads them once, so at most three blocks are alive (not the whole active set). The
    # read starts now: the server joins the file rows while pyarrow and the layouts are imported.
    add_blocks = read_ahead(store.iter_active_add_blocks(table_id, version), depth=1, eager=True)
    try:
        from delta_mirror.delta.checkpoint.layouts import build_checkpoint

        return build_checkpoint(
            CheckpointInput(
                version=version,
                protocol=snap.protocol,
                metadata=snap.metadata,
                txns=snap.txns,
                domain_metadata=snap.domain_metadata,
                adds=[],
                removes=removes,
                add_blocks=add_blocks,
            ),
            kind=plan.kind,
            part_size=plan.part_size,
            checkpoint_id=plan.checkpoint_id,
            modification_time_ms=plan.modification_time_ms,
        )
    finally:
        add_blocks.close()  # the read stops (and its connection is returned) however the build ends


def put_checkpoint_file(objects: ObjectStore, path: str, data: bytes) -> bytes | None:
    """Write one checkpoint file; ``None`` when written, else the bytes already there (written by
    an earlier run, the source in place, or Spark itself: kept; validate checks its content)."""
    try:
        objects.put_if_absent(path, data)
    except ObjectExistsError:
        existing = objects.get(path)
        if existing is not None:
            return existing
        try:  # it vanished: write it now; taken and unreadable twice is no file, no retry helps
            objects.put_if_absent(path, data)
        except ObjectExistsError:
            raise PermanentError(
                f"{path} exists but is not a file that can be read (a folder where the checkpoint belongs?)",
                hint=f"remove or rename what is at {path} in the table's location, then mirror again",
            ) from None
    meta = objects.head(path)
    if meta is None or meta.size != len(data):
        raise TransientError(f"{path} is not durable after the write", hint="retried automatically")
    return None


def move_last_checkpoint_forward(objects: ObjectStore, version: int, data: bytes) -> None:
    """Replace ``_last_checkpoint`` with ``data`` (the pointer at ``version``) unless the current
    one names a newer checkpoint: it never moves backwards; an unreadable one is replaced."""
    from delta_mirror.delta.last_checkpoint import LAST_CHECKPOINT_PATH, LastCheckpoint

    current = LastCheckpoint.read(objects.get(LAST_CHECKPOINT_PATH))
    if current is None or current.version <= version:
        objects.put(LAST_CHECKPOINT_PATH, data)


__all__ = [
    "CheckpointBuilder",
    "CheckpointPlan",
    "checkpoint_kind",
    "local_checkpoint_builder",
    "move_last_checkpoint_forward",
    "plan_checkpoint",
    "put_checkpoint_file",
]
