"""The ``_last_checkpoint`` pointer: parse, render, the checkpoint it names, and the one rule that
judges it against a listing.

Readers treat it as a hint (a bad one is ignored and the log listed). The publisher keeps two
invariants on it: it names only a complete checkpoint, and it never moves backwards (it is
replaced only by a pointer at a newer version, or when it is malformed).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, TypeGuard
from urllib.parse import unquote

from delta_mirror.delta.log_listing import LogListing, SidecarRefs
from delta_mirror.delta.log_path import LAST_CHECKPOINT, LOG_DIR
from delta_mirror.delta.protocol import CheckpointKind

LAST_CHECKPOINT_PATH = f"{LOG_DIR}/{LAST_CHECKPOINT}"


class LastCheckpointError(ValueError):
    """The pointer cannot be read at all (``cause`` says why, for the hint)."""

    def __init__(self, message: str, cause: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.cause = cause


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


@dataclass(frozen=True)
class LastCheckpoint:
    """One ``_last_checkpoint``: ``version`` is always a valid version; the other fields are as
    found (``fields`` keeps the whole object, unknown keys included)."""

    version: int
    size: Any = None
    parts: Any = None
    size_in_bytes: Any = None
    num_of_add_files: Any = None
    v2_checkpoint: dict[str, Any] | None = None
    fields: dict[str, Any] = field(default_factory=dict, compare=False)

    @classmethod
    def parse(cls, data: bytes) -> LastCheckpoint:
        """Parse strictly; raises :class:`LastCheckpointError` when there is no usable version."""
        try:
            info = json.loads(data.decode("utf-8"), parse_constant=_reject_constant)
        except (UnicodeDecodeError, ValueError) as exc:
            raise LastCheckpointError(
                f"is not valid JSON ({exc})", "it was truncated or written by hand; "
            ) from exc
        if not isinstance(info, dict):
            raise LastCheckpointError(f"must be a JSON object, found {type(info).__name__}")
        version = info.get("version")
        if not _is_int(version) or version < 0:
            raise LastCheckpointError(f"has no valid 'version' (found {version!r})")
        v2 = info.get("v2Checkpoint")
        return cls(
            version=version,
            size=info.get("size"),
            parts=info.get("parts"),
            size_in_bytes=info.get("sizeInBytes"),
            num_of_add_files=info.get("numOfAddFiles"),
            v2_checkpoint=v2 if isinstance(v2, dict) else None,
            fields=info,
        )

    @classmethod
    def read(cls, data: bytes | None) -> LastCheckpoint | None:
        """The pointer as a hint: ``None`` when it is absent or unreadable, as readers do."""
        if data is None:
            return None
        try:
            return cls.parse(data)
        except LastCheckpointError:
            return None

    @property
    def v2_name(self) -> str | None:
        """The file name of the V2 checkpoint it names, if any."""
        path = (self.v2_checkpoint or {}).get("path")
        return unquote(str(path).rsplit("/", 1)[-1]) if path else None

    @property
    def num_parts(self) -> int | None:
        """``parts`` when it names a multi-part checkpoint (``None`` for 1 or an invalid value)."""
        return self.parts if _is_int(self.parts) and self.parts > 1 else None

    @property
    def kind(self) -> CheckpointKind:
        """The checkpoint it names: V2 with ``v2Checkpoint``, else multi-part with ``parts``."""
        if self.v2_name is not None:
            return CheckpointKind.V2
        return CheckpointKind.MULTIPART if self.num_parts else CheckpointKind.CLASSIC

    def render(self) -> bytes:
        """Spark's key order; ``parts`` only when > 1 (Trino rejects ``"parts":1``), ``v2Checkpoint``
        for UUID-named checkpoints (Trino only finds them through its ``path``)."""
        info: dict[str, Any] = {"version": self.version, "size": self.size}
        if self.num_parts:
            info["parts"] = self.parts
        info["sizeInBytes"] = self.size_in_bytes
        info["numOfAddFiles"] = self.num_of_add_files
        if self.v2_checkpoint is not None:
            info["v2Checkpoint"] = self.v2_checkpoint
        return (json.dumps(info, separators=(",", ":"), ensure_ascii=False) + "\n").encode()

    def defects(self) -> list[tuple[str, str]]:
        """What is wrong with the fields themselves: (message, cause) pairs."""
        out: list[tuple[str, str]] = []
        if not _is_int(self.size):
            out.append((f"has no valid 'size' (found {self.size!r})", ""))
        nulls = sorted(k for k, v in self.fields.items() if v is None)
        if nulls:
            out.append((f"has null fields {nulls}", "some readers reject nulls there; "))
        if self.parts == 1:
            out.append(
                (
                    'contains "parts":1 for a single-file checkpoint',
                    'Trino rejects "parts":1; write "parts" only for multi-part checkpoints. ',
                )
            )
        elif self.parts is not None and (not _is_int(self.parts) or self.parts < 1):
            out.append((f"has an invalid 'parts' value {self.parts!r}", ""))
        return out

    def target(self, listing: LogListing, refs: SidecarRefs) -> bool:
        """Whether the checkpoint it names is complete in ``listing`` (one rule: see
        :meth:`LogListing.complete_checkpoint`)."""
        found = listing.complete_checkpoint(self.version, refs, parts=self.num_parts, v2_name=self.v2_name)
        return found is not None


def checkpoint_file_counts(data: bytes) -> tuple[int, int]:
    """(actions, add actions) of one checkpoint Parquet file: its rows, and its rows with an ``add``
    (``_last_checkpoint``'s ``size`` and ``numOfAddFiles`` for that file)."""
    import io

    import pyarrow.parquet as pq

    parquet = pq.ParquetFile(io.BytesIO(data))
    rows = parquet.metadata.num_rows
    if "add" not in parquet.schema_arrow.names:
        return rows, 0
    paths = parquet.read(columns=["add.path"]).column(0)
    return rows, rows - paths.null_count


def pointer_for_files(pointer: bytes, files: list[tuple[str, bytes, bytes]]) -> bytes:
    """The pointer ``pointer`` (``_last_checkpoint`` of the checkpoint the mirror built) made true of
    the files that are in the log: ``files`` is (path, the bytes built, the bytes found there) per
    checkpoint file. Where another writer's file was kept (Spark checkpoints itself too),
    ``size``, ``numOfAddFiles`` and ``sizeInBytes`` describe that file, not the mirror's bytes."""
    built = LastCheckpoint.parse(pointer)
    if all(ours == found for _, ours, found in files) or built.kind == CheckpointKind.V2:
        return pointer  # V2 files are named by the mirror's own checkpoint id: never another's
    actions = adds = 0
    for _, _ours, found in files:
        n, a = checkpoint_file_counts(found)
        actions, adds = actions + n, adds + a
    return LastCheckpoint(
        version=built.version,
        size=actions,
        parts=built.parts,
        size_in_bytes=sum(len(found) for _, _, found in files),
        num_of_add_files=adds,
    ).render()


@dataclass(frozen=True)
class PointerProblem:
    """One thing wrong with ``_last_checkpoint``; ``message`` follows the file's path, ``cause``
    (possibly empty) goes before the caller's hint."""

    version: int | None
    message: str
    cause: str = ""


def judge_last_checkpoint(
    data: bytes | None,
    listing: LogListing,
    refs: SidecarRefs,
    *,
    last_published: int | None = None,
    newest_checkpoint: int | None = None,
) -> list[PointerProblem]:
    """Everything wrong with the pointer ``data``; none when it is absent (it is optional).

    A good pointer is well formed, names a complete checkpoint, is not ahead of ``last_published``
    and not behind ``newest_checkpoint`` (the newest the mirror recorded as written).
    """
    if data is None:
        return []
    try:
        pointer = LastCheckpoint.parse(data)
    except LastCheckpointError as exc:
        return [PointerProblem(None, exc.message, exc.cause)]
    version = pointer.version
    problems = [PointerProblem(version, m, c) for m, c in pointer.defects()]
    if not pointer.target(listing, refs):
        parts, v2_name = pointer.num_parts, pointer.v2_name
        what = (
            f"a {parts}-part checkpoint" if parts else f"checkpoint {v2_name}" if v2_name else "a checkpoint"
        )
        found = (
            ", ".join(sorted(n for cp in listing.checkpoints.get(version, []) for n in cp.names)) or "nothing"
        )
        problems.append(
            PointerProblem(
                version,
                f"points at {what} at version {version}, but the log holds {found} there",
                "the checkpoint was deleted or never completed; readers fail or fall back to listing. ",
            )
        )
    if last_published is not None and version > last_published:
        problems.append(
            PointerProblem(
                version,
                f"points at version {version}, after the last published version {last_published}",
                "a checkpoint must follow its commit; another writer may have written it. ",
            )
        )
    if newest_checkpoint is not None and version < newest_checkpoint:
        problems.append(
            PointerProblem(
                version,
                f"points at version {version}, older than the store's newest checkpoint {newest_checkpoint}",
                "_last_checkpoint moved backwards (an old copy was restored or another writer replaced it); ",
            )
        )
    return problems


__all__ = [
    "LAST_CHECKPOINT_PATH",
    "LastCheckpoint",
    "LastCheckpointError",
    "PointerProblem",
    "checkpoint_file_counts",
    "judge_last_checkpoint",
    "pointer_for_files",
]
