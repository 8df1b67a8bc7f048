"""The Delta protocol model: names, rules and files of ``_delta_log/`` (no SQL; I/O only through
an ``ObjectStore``)."""

from delta_mirror.delta.last_checkpoint import LastCheckpoint, judge_last_checkpoint
from delta_mirror.delta.log_listing import CheckpointFiles, LogListing, list_log
from delta_mirror.delta.protocol import CheckpointKind

__all__ = [
    "CheckpointFiles",
    "CheckpointKind",
    "LastCheckpoint",
    "LogListing",
    "judge_last_checkpoint",
    "list_log",
]
