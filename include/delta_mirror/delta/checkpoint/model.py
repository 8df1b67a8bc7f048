"""What a checkpoint engine takes (one version's reconciled state) and gives back (files and
``_last_checkpoint``)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass
class CheckpointInput:
    """The reconciled state of one table version, as canonical JSON action lines."""

    version: int
    protocol: str  # '{"protocol":{...}}'
    metadata: str  # '{"metaData":{...}}'
    txns: list[str]  # latest '{"txn":{...}}' per appId
    domain_metadata: list[str]  # latest '{"domainMetadata":{...}}' per domain, not removed
    adds: Iterable[str] | list[str]  # '{"add":{...}}' lines of the active files
    removes: list[str]  # '{"remove":{...}}' tombstones still within the retention
    # more active adds as UTF-8 blocks of whole '\n'-terminated lines (the store's bulk read):
    # parsed in bulk, without a Python string per file
    add_blocks: Iterable[bytes] = ()


@dataclass
class CheckpointFile:
    path: str  # relative to the table root, e.g. "_delta_log/<v>.checkpoint.parquet"
    data: bytes


@dataclass
class CheckpointResult:
    files: list[CheckpointFile]  # sidecars first, top-level checkpoint (or parts in order) last
    last_checkpoint: bytes  # the _last_checkpoint JSON bytes
    num_add_files: int
    num_actions: int


__all__: list[str] = [
    "CheckpointFile",
    "CheckpointInput",
    "CheckpointResult",
]
