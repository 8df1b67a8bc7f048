"""One listing of a table's ``_delta_log/``: commits, checkpoints by version, sidecars, strays and
the ``_last_checkpoint`` pointer, and the one rule for when a checkpoint is complete.

Every reader of the log (publisher, import, validation, the reconciler's audit, retention
cleanup) lists through :func:`list_log`, so they all agree on what the log holds.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import unquote

import pyarrow.parquet as pq

from delta_mirror.delta.log_path import LOG_DIR, SIDECAR_DIR, LogFile, LogFileKind, parse_log_file
from delta_mirror.delta.object_store import ObjectMeta, ObjectStore
from delta_mirror.delta.protocol import CheckpointKind

#: ``path of a top-level checkpoint file -> names of the sidecar files it references`` (``None``
#: when it cannot be read: such a checkpoint is not complete).
SidecarRefs = Callable[[str], "list[str] | None"]

_KIND_PREFERENCE = {CheckpointKind.CLASSIC: 0, CheckpointKind.V2: 1, CheckpointKind.MULTIPART: 2}
_LOG_PREFIX = f"{LOG_DIR}/"
_SIDECAR_PREFIX = f"{LOG_DIR}/{SIDECAR_DIR}/"


@dataclass(frozen=True)
class CheckpointFiles:
    """The top-level files of one checkpoint at one version, as listed (before they are read).

    Multi-part checkpoints of the same version but a different part count are different
    checkpoints; ``paths`` holds the parts found, in part order.
    """

    version: int
    kind: CheckpointKind
    paths: tuple[str, ...]  # "_delta_log/<name>"
    num_parts: int = 1

    @property
    def names(self) -> list[str]:
        return [p[len(_LOG_PREFIX) :] for p in self.paths]

    @property
    def parts_complete(self) -> bool:
        return len(self.paths) == self.num_parts


@dataclass
class LogListing:
    """What ``_delta_log/`` holds. Files in other sub-folders (``_commits/``, ``_staged_commits/``,
    ``_autostats/``...) are not part of the log and are left out."""

    entries: list[tuple[ObjectMeta, LogFile]] = field(default_factory=list)  # top-level protocol files
    commits: dict[int, str] = field(default_factory=dict)  # version -> "_delta_log/<v>.json"
    checkpoints: dict[int, list[CheckpointFiles]] = field(default_factory=dict)  # preferred first
    sidecars: set[str] = field(default_factory=set)  # file names in _delta_log/_sidecars/
    last_checkpoint: str | None = None  # its path, when present
    strays: list[str] = field(default_factory=list)  # top-level names the protocol does not define

    @property
    def files(self) -> dict[str, LogFile]:
        """Every top-level protocol file, by name."""
        return {f.name: f for _, f in self.entries}

    def is_complete(self, cp: CheckpointFiles, sidecar_refs: SidecarRefs, *, v2_table: bool = False) -> bool:
        """The completeness rule: every part is listed; a V2 checkpoint (UUID-named, or classic-named
        in a ``v2Checkpoint`` table) also has every sidecar it references listed."""
        if not cp.parts_complete:
            return False
        if cp.kind is CheckpointKind.MULTIPART or (cp.kind is CheckpointKind.CLASSIC and not v2_table):
            return True
        refs = sidecar_refs(cp.paths[0])
        return refs is not None and all(r in self.sidecars for r in refs)

    def complete_checkpoint(
        self,
        version: int,
        sidecar_refs: SidecarRefs,
        *,
        v2_table: bool = False,
        parts: int | None = None,
        v2_name: str | None = None,
    ) -> CheckpointFiles | None:
        """The first complete checkpoint at ``version`` (only a ``parts``-part one, or only the V2
        file ``v2_name``, when given), else ``None``."""
        for cp in self.checkpoints.get(version, []):
            if v2_name is not None:
                if cp.kind is not CheckpointKind.V2 or cp.names[0] != v2_name:
                    continue
            elif parts is not None and (cp.kind is not CheckpointKind.MULTIPART or cp.num_parts != parts):
                continue
            if self.is_complete(cp, sidecar_refs, v2_table=v2_table):
                return cp
        return None


def list_log(objects: ObjectStore) -> LogListing:
    """List ``_delta_log/`` once (``ObjectStore.list`` is sorted by path, so is everything here)."""
    listing = LogListing()
    multipart: dict[tuple[int, int], dict[int, str]] = {}
    for meta in objects.list(LOG_DIR):
        path = meta.path
        if not path.startswith(_LOG_PREFIX):
            continue
        if path.startswith(_SIDECAR_PREFIX):
            if "/" not in path[len(_SIDECAR_PREFIX) :]:
                listing.sidecars.add(path[len(_SIDECAR_PREFIX) :])
            continue
        name = path[len(_LOG_PREFIX) :]
        if "/" in name:
            continue
        lf = parse_log_file(name)
        if lf is None:
            listing.strays.append(name)
            continue
        listing.entries.append((meta, lf))
        _file_listed(listing, multipart, lf, path)
    for (version, num_parts), parts in multipart.items():
        files = tuple(parts[p] for p in sorted(parts))
        listing.checkpoints.setdefault(version, []).append(
            CheckpointFiles(version, CheckpointKind.MULTIPART, files, num_parts)
        )
    for candidates in listing.checkpoints.values():
        candidates.sort(key=lambda c: (not c.parts_complete, _KIND_PREFERENCE[c.kind], c.paths))
    return listing


_SINGLE_FILE_CHECKPOINTS = {
    LogFileKind.CHECKPOINT: CheckpointKind.CLASSIC,
    LogFileKind.UUID_CHECKPOINT: CheckpointKind.V2,
}


def _file_listed(
    listing: LogListing, multipart: dict[tuple[int, int], dict[int, str]], lf: LogFile, path: str
) -> None:
    """Record one protocol file of ``_delta_log/`` (multi-part checkpoint parts are gathered apart)."""
    if lf.kind is LogFileKind.COMMIT:
        listing.commits[lf.version] = path
    elif (kind := _SINGLE_FILE_CHECKPOINTS.get(lf.kind)) is not None:
        listing.checkpoints.setdefault(lf.version, []).append(CheckpointFiles(lf.version, kind, (path,)))
    elif lf.kind is LogFileKind.MULTIPART_CHECKPOINT:
        multipart.setdefault((lf.version, lf.num_parts), {})[lf.part] = path
    elif lf.kind is LogFileKind.LAST_CHECKPOINT:
        listing.last_checkpoint = path


def sidecar_refs(objects: ObjectStore) -> SidecarRefs:
    """The sidecar file names a top-level checkpoint references, read from ``objects``."""

    def refs(path: str) -> list[str] | None:
        data = objects.get(path)
        if data is None:
            return None
        paths: list[str] = []
        try:
            if path.endswith(".json"):
                for line in data.decode("utf-8").splitlines():
                    if line.strip():
                        sidecar = json.loads(line).get("sidecar")
                        if isinstance(sidecar, dict):
                            paths.append(str(sidecar.get("path")))
            else:
                pf = pq.ParquetFile(io.BytesIO(data))
                if "sidecar" in pf.schema_arrow.names:
                    for row in pf.read(columns=["sidecar"]).column("sidecar").to_pylist():
                        if row is not None:
                            paths.append(str(row.get("path")))
        except Exception:
            return None
        return [unquote(p.rstrip("/").rsplit("/", 1)[-1]) for p in paths]

    return refs


__all__ = ["CheckpointFiles", "LogListing", "SidecarRefs", "list_log", "sidecar_refs"]
