"""Parsed names of the files that live in ``_delta_log/``.

Only the names the protocol defines are recognised; anything else (Hadoop ``.crc`` files,
``.tmp`` files, ``_commits/``, ``_staged_commits/``, ``_autostats/``...) is a stray file that the
importer ignores and the validator reports only when it sits where a log file belongs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum

LOG_DIR = "_delta_log"
LAST_CHECKPOINT = "_last_checkpoint"
SIDECAR_DIR = "_sidecars"


class LogFileKind(StrEnum):
    COMMIT = "commit"
    CHECKPOINT = "checkpoint"  # classic single-file: v.checkpoint.parquet
    MULTIPART_CHECKPOINT = "multipart_checkpoint"  # v.checkpoint.o.p.parquet
    UUID_CHECKPOINT = "uuid_checkpoint"  # v.checkpoint.<uuid>.(json|parquet)  (V2)
    CRC = "crc"
    COMPACTED = "compacted"  # x.y.compacted.json
    LAST_CHECKPOINT = "last_checkpoint"


_COMMIT = re.compile(r"^(\d{20})\.json$")
_CHECKPOINT = re.compile(r"^(\d{20})\.checkpoint\.parquet$")
_MULTIPART = re.compile(r"^(\d{20})\.checkpoint\.(\d{10})\.(\d{10})\.parquet$")
_UUID_CP = re.compile(
    r"^(\d{20})\.checkpoint\.([0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12})\.(json|parquet)$"
)
_CRC = re.compile(r"^(\d{20})\.crc$")
_COMPACTED = re.compile(r"^(\d{20})\.(\d{20})\.compacted\.json$")


@dataclass(frozen=True)
class LogFile:
    """One protocol-defined file in ``_delta_log/`` (``name`` is relative to that folder)."""

    name: str
    kind: LogFileKind
    version: int
    part: int = 1
    num_parts: int = 1
    uuid: str | None = None
    end_version: int | None = None

    @property
    def is_checkpoint(self) -> bool:
        return self.kind in (
            LogFileKind.CHECKPOINT,
            LogFileKind.MULTIPART_CHECKPOINT,
            LogFileKind.UUID_CHECKPOINT,
        )


def parse_log_file(name: str) -> LogFile | None:
    """Parse a file name (no folder); ``None`` for anything the protocol does not define."""
    if name == LAST_CHECKPOINT:
        return LogFile(name, LogFileKind.LAST_CHECKPOINT, -1)
    if m := _COMMIT.match(name):
        return LogFile(name, LogFileKind.COMMIT, int(m[1]))
    if m := _CHECKPOINT.match(name):
        return LogFile(name, LogFileKind.CHECKPOINT, int(m[1]))
    if m := _MULTIPART.match(name):
        part, parts = int(m[2]), int(m[3])
        if part < 1 or part > parts:
            return None
        return LogFile(name, LogFileKind.MULTIPART_CHECKPOINT, int(m[1]), part, parts)
    if m := _UUID_CP.match(name):
        return LogFile(name, LogFileKind.UUID_CHECKPOINT, int(m[1]), uuid=m[2].lower())
    if m := _CRC.match(name):
        return LogFile(name, LogFileKind.CRC, int(m[1]))
    if m := _COMPACTED.match(name):
        return LogFile(name, LogFileKind.COMPACTED, int(m[1]), end_version=int(m[2]))
    return None


def commit_name(version: int) -> str:
    return f"{version:020d}.json"


def checkpoint_name(version: int) -> str:
    return f"{version:020d}.checkpoint.parquet"


def multipart_checkpoint_name(version: int, part: int, num_parts: int) -> str:
    return f"{version:020d}.checkpoint.{part:010d}.{num_parts:010d}.parquet"


def uuid_checkpoint_name(version: int, uuid: str, ext: str = "parquet") -> str:
    return f"{version:020d}.checkpoint.{uuid}.{ext}"


__all__ = [
    "LAST_CHECKPOINT",
    "LOG_DIR",
    "SIDECAR_DIR",
    "LogFile",
    "LogFileKind",
    "checkpoint_name",
    "commit_name",
    "multipart_checkpoint_name",
    "parse_log_file",
    "uuid_checkpoint_name",
]
