"""Read an existing Delta table's ``_delta_log`` so that it can be imported under SQL authority.

Import must be lossless: every JSON commit is kept as its ordered lines (key order, unknown
fields, unknown action types and unknown keys beside an action preserved: readers ignore them)
*and* as its original bytes, so that a later republish can be compared byte for byte. When the
early commits were cleaned up, the imported segment starts at the oldest complete checkpoint from
which every later commit still exists, and that checkpoint's actions are turned back into the JSON
lines a commit would carry. What readers cannot reconstruct is refused, and where a checkpoint
disagrees with the JSON commits its state wins (``delta.source_state``).

Only ``ObjectStore.list`` and ``ObjectStore.get`` are used, so the same code reads local folders
and object storage. ``read_source_log`` reads the whole segment; an importer that writes as it
reads uses its steps (``open_source``, ``iter_commits``, ``source_summary``) instead. A
checkpoint's Parquet rows are turned into actions by ``delta.source_parquet``.
"""

from __future__ import annotations

import functools
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

from delta_mirror.delta import parse_process
from delta_mirror.delta.actions import canonical_json, line_action
from delta_mirror.delta.commit_lines import OBJECT_ACTIONS, parse_commit_bytes, read_commit
from delta_mirror.delta.last_checkpoint import LastCheckpoint
from delta_mirror.delta.line_facts import FileAction, LineFacts
from delta_mirror.delta.log_listing import CheckpointFiles, LogListing, list_log, sidecar_refs
from delta_mirror.delta.log_path import LOG_DIR, SIDECAR_DIR, LogFileKind
from delta_mirror.delta.object_store import ObjectStore
from delta_mirror.delta.parse_process import ParseProcess, digest
from delta_mirror.delta.protocol import CheckpointKind
from delta_mirror.delta.source_parquet import IGNORED_CHECKPOINT_COLUMNS as _IGNORED_CHECKPOINT_COLUMNS
from delta_mirror.delta.source_parquet import parquet_actions
from delta_mirror.delta.source_state import (
    CheckpointState,
    ReplayState,
    check_checkpoint,
    check_segment,
    check_supported,
    checkpoint_state,
    compare_to_checkpoint,
)
from delta_mirror.errors import (
    DataError,
    NotADeltaTableError,
    TransientError,
)

_OBJECT_ACTIONS = OBJECT_ACTIONS


@dataclass
class SourceCheckpoint:
    """A complete checkpoint the imported segment starts from."""

    version: int
    kind: str  # "classic" | "multipart" | "v2"
    files: list[str]  # log-relative names ("_delta_log/..."), top-level file(s) then sidecars
    actions: list[str]  # canonical JSON lines, without checkpointMetadata / sidecar actions


@dataclass
class SourceLog:
    """Everything the importer needs from a source table's log."""

    location: str
    start_version: int
    end_version: int
    base_checkpoint: SourceCheckpoint | None
    commits: list[tuple[int, list[str], bytes]] = field(default_factory=list)
    checkpoint_versions: list[int] = field(default_factory=list)
    checkpoint_kind: str = "classic"
    multipart_parts: int | None = None
    last_checkpoint: dict[str, Any] | None = None
    # Checkpoints (after the base) whose state differs from the JSON replay; the import keeps theirs.
    checkpoint_states: list[CheckpointState] = field(default_factory=list)
    # What the store indexes of each commit's lines, by version (taken while parsing them).
    commit_facts: dict[int, LineFacts] = field(default_factory=dict)
    # SHA-256 (hex) and size of each commit file, by version.
    commit_files: dict[int, tuple[str, int]] = field(default_factory=dict)


# --------------------------------------------------------------------------------------------
# Checkpoints
# --------------------------------------------------------------------------------------------


class _MissingCheckpointFile(DataError):
    """A checkpoint part or sidecar is absent: the checkpoint is incomplete."""


def _file_actions(store: ObjectStore, path: str, *, table: str, version: int) -> Iterator[tuple[str, Any]]:
    data = store.get(path)
    if data is None:
        raise _MissingCheckpointFile(
            f"checkpoint file {path} is missing",
            table=table,
            version=version,
            hint="the checkpoint is incomplete (a part or sidecar was deleted)",
        )
    if path.endswith(".json"):
        for obj in parse_commit_bytes(data, table=table, version=version):
            yield line_action(obj)
    else:
        yield from parquet_actions(data, name=path, table=table, version=version)


def _sidecar_path(ref: Any, *, table: str, version: int) -> str:
    """Where a ``sidecar`` action's file lives: always ``_delta_log/_sidecars/<name>``."""
    path = ref.get("path") if isinstance(ref, dict) else None
    if not isinstance(path, str) or not path:
        raise DataError("checkpoint has a sidecar action without a path", table=table, version=version)
    # The protocol allows a full URI but requires the file to sit in _delta_log/_sidecars/.
    name = unquote(path.rstrip("/").rsplit("/", 1)[-1])
    if name in ("", ".", ".."):
        raise DataError(f"checkpoint names an invalid sidecar path '{path}'", table=table, version=version)
    return f"{LOG_DIR}/{SIDECAR_DIR}/{name}"


@dataclass
class _ReadCheckpoint:
    actions: list[str]
    sidecars: list[str]
    is_v2: bool


def _read_checkpoint(store: ObjectStore, files: list[str], *, table: str, version: int) -> _ReadCheckpoint:
    sidecar_prefix = f"{LOG_DIR}/{SIDECAR_DIR}/"
    top_level = [f for f in files if not f.startswith(sidecar_prefix)]
    actions: list[str] = []
    sidecars: list[str] = []
    is_v2 = False
    for path in top_level:
        for kind, payload in _file_actions(store, path, table=table, version=version):
            if kind == "checkpointMetadata":
                is_v2 = True
            elif kind == "sidecar":
                is_v2 = True
                sidecars.append(_sidecar_path(payload, table=table, version=version))
            elif kind not in _IGNORED_CHECKPOINT_COLUMNS:
                actions.append(canonical_json({kind: payload}))
    for path in sidecars:
        for kind, payload in _file_actions(store, path, table=table, version=version):
            if kind in ("checkpointMetadata", "sidecar") or kind in _IGNORED_CHECKPOINT_COLUMNS:
                continue
            actions.append(canonical_json({kind: payload}))
    return _ReadCheckpoint(actions, sidecars, is_v2)


def checkpoint_actions(store: ObjectStore, files: list[str], *, table: str, version: int) -> list[str]:
    """The checkpoint's actions as canonical JSON lines (all parts, sidecars followed).

    Order: the rows of the top-level file(s) in file order, then each sidecar's rows in the order
    the sidecars are referenced (order carries no meaning in a checkpoint; this keeps it stable).

    ``files`` are log-relative names of the top-level checkpoint file(s) (multi-part: in part
    order). Sidecar files listed among them are ignored: the ``sidecar`` actions of the
    top-level file are authoritative. ``checkpointMetadata``/``sidecar`` actions are omitted.
    """
    return _read_checkpoint(store, files, table=table, version=version).actions


# --------------------------------------------------------------------------------------------
# Listing and segment selection
# --------------------------------------------------------------------------------------------


def _ranges(versions: list[int]) -> str:
    """``[0, 1, 2, 5]`` → ``"0..2, 5"`` (for error messages)."""
    out: list[str] = []
    i = 0
    while i < len(versions):
        j = i
        while j + 1 < len(versions) and versions[j + 1] == versions[j] + 1:
            j += 1
        out.append(str(versions[i]) if i == j else f"{versions[i]}..{versions[j]}")
        i = j + 1
    if len(out) > 10:
        out = [*out[:5], f"... ({len(out) - 10} more ranges) ...", *out[-5:]]
    return ", ".join(out)


def _missing_versions(commits: Mapping[int, str], latest: int) -> list[int]:
    return [v for v in range(latest + 1) if v not in commits]


def _load_candidate(store: ObjectStore, cand: CheckpointFiles, *, table: str) -> SourceCheckpoint:
    if not cand.parts_complete:
        raise _MissingCheckpointFile(
            f"multi-part checkpoint has only {len(cand.paths)} of its parts",
            table=table,
            version=cand.version,
        )
    read = _read_checkpoint(store, list(cand.paths), table=table, version=cand.version)
    kind = cand.kind.value
    if kind == "classic" and read.is_v2:
        kind = "v2"
    return SourceCheckpoint(cand.version, kind, [*cand.paths, *read.sidecars], read.actions)


def _other_files(listing: LogListing) -> list[str]:
    """Names in ``_delta_log/`` that are neither commits nor checkpoints (for error messages)."""
    extra = [f.name for _, f in listing.entries if f.kind in (LogFileKind.CRC, LogFileKind.COMPACTED)]
    return [*listing.strays, *extra]


# --------------------------------------------------------------------------------------------
# The entry point
# --------------------------------------------------------------------------------------------


@dataclass
class SourceHead:
    """What is known of a source log before its commits are read: its listing, latest version
    and the base checkpoint the imported segment starts from."""

    listing: LogListing
    latest: int
    base: SourceCheckpoint | None

    @property
    def start(self) -> int:
        return self.base.version if self.base is not None else 0

    @property
    def commit_count(self) -> int:
        return sum(1 for v in self.listing.commits if self.start <= v <= self.latest)

    @property
    def later_checkpoints(self) -> bool:
        """Checkpoints besides the base (their state is compared with a replay of the commits)."""
        base = self.base.version if self.base is not None else None
        return any(v != base for v in self.listing.checkpoints)


def open_source(store: ObjectStore, *, table: str) -> SourceHead:
    """List the log and choose the base checkpoint (``read_source_log``'s first step)."""
    listing = list_log(store)
    if not listing.commits and not listing.checkpoints:
        raise _not_a_table(store.uri, listing, table=table)
    latest = max([*listing.commits, *listing.checkpoints])
    return SourceHead(listing, latest, _choose_base(store, listing, latest, table=table))


def read_source_log(
    store: ObjectStore,
    *,
    table: str,
    progress: Callable[[int, int], None] | None = None,
    keep_bytes: bool = True,
) -> SourceLog:
    """Read the importable segment of the table at ``store`` (see the module docstring).
    ``progress(commits read, commits to read)`` follows the commits as they are read. Without
    ``keep_bytes`` a commit's original bytes are not kept (``b""`` in ``commits``; their SHA-256
    and size are in ``commit_files``): an importer needs no more, and a long log's bytes are a
    large part of its memory.

    Refuses, before anything is imported, a log Delta readers cannot reconstruct (the rule in
    ``delta.source_state``: protocol and metaData present and well-formed at every version, every
    complete checkpoint readable and holding both) and tables whose protocol cannot be carried.
    """
    head = open_source(store, table=table)
    facts: dict[int, LineFacts] = {}
    files: dict[int, tuple[str, int]] = {}
    commits = _read_commits(
        store,
        head.listing,
        head.start,
        head.latest,
        table=table,
        facts=facts,
        progress=progress,
        files=files,
        keep_bytes=keep_bytes,
    )
    base = head.base
    replay = check_segment(base.actions if base is not None else None, commits, head.start, table=table)
    src, complete = _summary(store, head, replay, table=table)
    src.commits = commits
    src.commit_facts = facts
    src.commit_files = files
    later = {v: c for v, c in complete.items() if v >= head.start and (base is None or v != base.version)}
    src.checkpoint_states = _checkpoint_states(store, base, commits, later, table=table)
    return src


def _v2_table(replay: ReplayState) -> bool:
    assert replay.protocol is not None
    reader_features = replay.protocol.get("readerFeatures")
    return isinstance(reader_features, list) and "v2Checkpoint" in reader_features


def source_summary(store: ObjectStore, head: SourceHead, replay: ReplayState, *, table: str) -> SourceLog:
    """The log's description once its segment is checked (``replay``: ``check_segment``'s result):
    refuses a protocol we cannot carry; commits and checkpoint states are left empty."""
    return _summary(store, head, replay, table=table)[0]


def _summary(
    store: ObjectStore, head: SourceHead, replay: ReplayState, *, table: str
) -> tuple[SourceLog, dict[int, CheckpointFiles]]:
    assert replay.protocol is not None
    check_supported(replay.protocol, replay.metadata, table=table)
    v2_table = _v2_table(replay)
    base = head.base
    complete = _complete_checkpoints(store, head.listing, base, v2_table=v2_table)
    multiparts = [c for c in complete.values() if c.kind is CheckpointKind.MULTIPART]
    if v2_table:
        kind = "v2"
    elif complete and complete[max(complete)].kind is CheckpointKind.MULTIPART:
        kind = "multipart"
    else:
        kind = "classic"
    last_cp = None  # only a hint: a bad one is ignored, as readers do
    if head.listing.last_checkpoint is not None and (
        pointer := LastCheckpoint.read(store.get(head.listing.last_checkpoint))
    ):
        last_cp = pointer.fields
    src = SourceLog(
        location=store.uri,
        start_version=head.start,
        end_version=head.latest,
        base_checkpoint=base,
        checkpoint_versions=sorted(complete),
        checkpoint_kind=kind,
        multipart_parts=len(max(multiparts, key=lambda c: c.version).paths) if multiparts else None,
        last_checkpoint=last_cp,
    )
    return src, complete


def _not_a_table(location: str, listing: LogListing, *, table: str) -> NotADeltaTableError:
    other = _other_files(listing)
    found = f" (found only: {', '.join(sorted(other)[:5])})" if other else ""
    return NotADeltaTableError(
        f"{location} is not a Delta table: no _delta_log/ with commits or checkpoints{found}",
        table=table,
        hint="point the location at the table root (the folder that holds _delta_log/), "
        "or create a new table instead of importing one",
    )


def _choose_base(
    store: ObjectStore, listing: LogListing, latest: int, *, table: str
) -> SourceCheckpoint | None:
    """The oldest complete checkpoint after the last missing commit (None when no commit is missing)."""
    missing = _missing_versions(listing.commits, latest)
    if not missing:
        return None
    floor = missing[-1]  # every commit after the base checkpoint must exist
    reasons: list[str] = []
    for version in sorted(v for v in listing.checkpoints if v >= floor):
        for cand in listing.checkpoints[version]:
            try:
                return _load_candidate(store, cand, table=table)
            except DataError as exc:
                reasons.append(f"checkpoint {version} ({cand.kind}) unusable: {exc.what}")
    older = sorted(v for v in listing.checkpoints if v < floor)
    detail = f"; checkpoints at {_ranges(older)} are older than the gap" if older else ""
    if reasons:
        detail += "; " + "; ".join(reasons)
    raise DataError(
        f"cannot import {store.uri}: commits {_ranges(missing)} are missing and no complete "
        f"checkpoint at version {floor} or later covers them{detail}",
        table=table,
        hint="restore the missing commit files, or write a checkpoint at the latest version "
        "with a Delta writer, then import again",
    )


def _read_commits(
    store: ObjectStore,
    listing: LogListing,
    start: int,
    latest: int,
    *,
    table: str,
    facts: dict[int, LineFacts] | None = None,
    progress: Callable[[int, int], None] | None = None,
    files: dict[int, tuple[str, int]] | None = None,
    keep_bytes: bool = True,
) -> list[tuple[int, list[str], bytes]]:
    commits: list[tuple[int, list[str], bytes]] = []
    total = sum(1 for v in listing.commits if start <= v <= latest)
    for commit in iter_commits(store, listing, start, latest, table=table, keep_bytes=keep_bytes):
        if facts is not None:
            facts[commit.version] = commit.facts
        if files is not None:
            files[commit.version] = commit.file
        commits.append((commit.version, commit.lines, commit.data))
        if progress is not None:
            progress(len(commits), total)
    return commits


@dataclass
class SourceCommit:
    """One JSON commit as read: canonical lines, their facts, the file's (SHA-256, size)."""

    version: int
    lines: list[str]
    facts: LineFacts
    file: tuple[str, int]
    data: bytes  # b"" unless the bytes were asked for
    # (SHA-256, size) of ``render_commit(lines)`` when the parse process took it, else None
    rendered: tuple[str, int] | None = None


def iter_commits(
    store: ObjectStore,
    listing: LogListing,
    start: int,
    latest: int,
    *,
    table: str,
    keep_bytes: bool = False,
    on_lines: Callable[[int, int, list[str], list[str], list[FileAction]], None] | None = None,
    parser: ParseProcess | None = None,
) -> Iterator[SourceCommit]:
    """The segment's JSON commits in version order, one at a time (only the base checkpoint's own
    version may lack its JSON). ``on_lines(version, first_seq, kinds, lines, files)``: a large
    commit's lines as they are parsed (``read_commit``), before the commit itself is yielded. ``parser``:
    commits of ``CHILD_MIN_BYTES`` and more are parsed by that child process, up to ``AHEAD`` of
    them sent before the one being yielded (same results, same refusals)."""
    versions = deque(v for v in range(start, latest + 1) if v in listing.commits)
    ahead: deque[tuple[int, bytes | None, bool]] = deque()  # (version, bytes, sent to the parser)
    in_child = 0
    while versions or ahead:
        # Fetch ahead until AHEAD large commits are with the parser; a commit that disappeared
        # ends the look-ahead and is reported when its turn comes.
        while (
            parser is not None
            and parser.alive
            and versions
            and in_child < parse_process.AHEAD
            and len(ahead) < AHEAD_SMALL
            and (not ahead or ahead[-1][1] is not None)
        ):
            version = versions.popleft()
            data = store.get(listing.commits[version])
            to_child = data is not None and len(data) >= parse_process.CHILD_MIN_BYTES
            if to_child and data is not None:
                parser.submit(version, data, table=table)
                in_child += 1
            ahead.append((version, data, to_child))
        if ahead:
            version, data, to_child = ahead.popleft()
        else:
            version, to_child = versions.popleft(), False
            data = store.get(listing.commits[version])
        if data is None:
            raise TransientError(
                f"commit {listing.commits[version]} disappeared while it was being read",
                table=table,
                version=version,
                hint="another process is cleaning up the log; retry the import",
            )
        chunks = None if on_lines is None else functools.partial(on_lines, version)
        rendered = None
        if to_child and parser is not None:
            in_child -= 1
            lines, line_facts, file, rendered = parser.result(version, data, table=table, on_lines=chunks)
        else:
            lines, line_facts = read_commit(data, table=table, version=version, on_lines=chunks)
            file = digest(data)
        yield SourceCommit(version, lines, line_facts, file, data if keep_bytes else b"", rendered)


AHEAD_SMALL = 64  # small commits held while fetching ahead for the parse process


def _complete_checkpoints(
    store: ObjectStore, listing: LogListing, base: SourceCheckpoint | None, *, v2_table: bool
) -> dict[int, CheckpointFiles]:
    """The first complete checkpoint of each version (the base one as it was loaded)."""
    refs = sidecar_refs(store)
    complete: dict[int, CheckpointFiles] = {}
    for version in sorted(listing.checkpoints):
        for cand in listing.checkpoints[version]:
            is_base = (
                base is not None
                and version == base.version
                and list(cand.paths) == base.files[: len(cand.paths)]
            )
            if is_base or listing.is_complete(cand, refs, v2_table=v2_table):
                complete[version] = cand
                break
    return complete


def _checkpoint_states(
    store: ObjectStore,
    base: SourceCheckpoint | None,
    commits: list[tuple[int, list[str], bytes]],
    checkpoints: Mapping[int, CheckpointFiles],
    *,
    table: str,
) -> list[CheckpointState]:
    """Replay the JSON commits; at each later complete checkpoint, check it (the rule for invalid
    logs) and compare; from there on the checkpoint's state is the table's, as readers see it."""
    if not checkpoints:
        return []
    out: list[CheckpointState] = []
    replay = ReplayState()
    if base is not None:
        replay.apply(base.actions)
    last = max(checkpoints)
    for version, lines, _data in commits:
        if version > last:
            break
        if base is None or version != base.version:
            replay.apply(lines)
        cand = checkpoints.get(version)
        if cand is None:
            continue
        actions = _read_checkpoint(store, list(cand.paths), table=table, version=version).actions
        check_checkpoint(actions, version, table=table)
        cp_state, by_role = checkpoint_state(actions)
        found = compare_to_checkpoint(replay, cp_state, by_role, version)
        if found is not None:
            out.append(found)
        replay = cp_state
        replay.keep_lines = False
    return out


__all__ = [
    "SourceCheckpoint",
    "SourceCommit",
    "SourceHead",
    "SourceLog",
    "check_supported",
    "checkpoint_actions",
    "iter_commits",
    "open_source",
    "parse_commit_bytes",
    "read_source_log",
    "source_summary",
]
