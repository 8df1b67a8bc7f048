"""Import: put an existing Delta table's log under the store's authority.

Import is lossless: every source commit is stored with its lines in their order, key order,
unknown fields and unknown keys beside an action kept, so republishing reproduces it (byte for
byte where the source writer wrote canonical JSON, as Delta-Spark does). A log whose early commits
were cleaned up starts at its oldest complete checkpoint, whose actions become the table's base
snapshot. Import reproduces what readers see: where a later source checkpoint disagrees with the
JSON commits, its state is recorded at its version and the disagreement reported
(``delta.source_state``); a log readers cannot reconstruct is refused and nothing is kept (the
import is one transaction, rolled back).

Speed: a log without checkpoints after its base is stored as it is read, by a writer thread (the
database ingests one group of commits while the next is parsed), with the garbage collector
paused; PostgreSQL gets ``COPY``, SQLite ``executemany`` and ``json_each`` in large batches
(``store.bulk_load``). Large commits are parsed by a child process on the other core
(``delta.parse_process``), their lines stored in chunks while the rest is parsed.
"""

from __future__ import annotations

import gc
import math
import queue
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from delta_mirror.delta import parse_process
from delta_mirror.delta.line_facts import FileAction, LineFacts, facts_of_lines
from delta_mirror.delta.log_listing import list_log
from delta_mirror.delta.parse_process import ParseProcess
from delta_mirror.delta.protocol import now_ms
from delta_mirror.delta.source_log import (
    SourceHead,
    SourceLog,
    iter_commits,
    open_source,
    read_source_log,
    source_summary,
)
from delta_mirror.delta.source_state import Disagreement, SegmentCheck
from delta_mirror.errors import PermanentError
from delta_mirror.storage import normalize_location, open_store
from delta_mirror.store.importing import Importing
from delta_mirror.store.schema import PART_SNAPSHOT
from delta_mirror.store.source_import import CHECKPOINT_STATE_SETTING
from delta_mirror.store.sql_store import SqlStore, TableInfo, check_table_name
from delta_mirror.store.states import Artifact

DEFAULT_PART_SIZE = 1_000_000
PROGRESS_EVERY = 0.5  # seconds between progress reports


@dataclass
class ImportResult:
    table: str
    source: str
    location: str
    in_place: bool
    start_version: int
    end_version: int
    commits: int
    base_checkpoint_version: int | None
    checkpoint_kind: str
    # Where a source checkpoint disagreed with the JSON commits (its state was kept).
    checkpoint_disagreements: list[Disagreement] = field(default_factory=list)

    def to_json(self) -> dict[str, object]:
        out = dict(self.__dict__)
        out["checkpoint_disagreements"] = [d.to_json() for d in self.checkpoint_disagreements]
        return out

    def warnings(self) -> list[str]:
        """One line per disagreement, for the CLI and logs."""
        return [d.describe() for d in self.checkpoint_disagreements]


def _part_size(src: SourceLog) -> int | None:
    if src.checkpoint_kind != "multipart" or not src.multipart_parts:
        return None
    if src.base_checkpoint is not None and src.base_checkpoint.kind == "multipart":
        return max(1, math.ceil(len(src.base_checkpoint.actions) / src.multipart_parts))
    return max(1, DEFAULT_PART_SIZE // src.multipart_parts)


def import_table(
    store: SqlStore,
    source: str,
    *,
    name: str,
    location: str | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> ImportResult:
    """Import the Delta table at ``source`` as ``name``, to be published at ``location``.

    ``location`` defaults to the source (in-place migration): the existing commit files are adopted
    as already published. A different location must not hold a ``_delta_log`` yet. The store is
    written in one transaction, so a refused or failed import leaves nothing behind: a log without
    checkpoints after its base is stored as it is read and checked (``_stream``); one with later
    checkpoints is read and checked in full first (their state is compared with the commits').
    """
    with _gc_paused():
        return _import(store, source, name=name, location=location, progress=progress)


def _import(
    store: SqlStore,
    source: str,
    *,
    name: str,
    location: str | None,
    progress: Callable[[int, int], None] | None,
) -> ImportResult:
    check_table_name(name)
    source_uri = normalize_location(source)
    target = normalize_location(location) if location else source_uri
    in_place = target == source_uri
    report = _Throttled(progress)
    objects = open_store(source_uri)
    head = open_source(objects, table=name)
    if not head.later_checkpoints:
        src = _stream(store, objects, head, name=name, target=target, in_place=in_place, progress=report)
        return _result(name, source_uri, target, in_place, src, head.commit_count, [])
    # Checkpoints after the base are compared with a replay of every commit before them: the
    # whole log is read and checked first, then stored.
    src = read_source_log(objects, table=name, progress=lambda done, n: report(done, 2 * n), keep_bytes=False)
    base = src.base_checkpoint
    disagreements = [d for state in src.checkpoint_states for d in state.disagreements]
    settings: dict[str, object] = {"imported_from": source_uri, "imported_at": now_ms()}
    if disagreements:
        settings[CHECKPOINT_STATE_SETTING] = [d.to_json() for d in disagreements]
    with store.importing(
        name,
        target,
        first_version=src.start_version,
        base_checkpoint_version=base.version if base else None,
        checkpoint_kind=src.checkpoint_kind,
        checkpoint_part_size=_part_size(src),
        settings=settings,
    ) as imp:
        _store_versions(imp, src, in_place=in_place, progress=report)
    if in_place:
        _record_source_checkpoints(store, imp.table, src)
    return _result(name, source_uri, target, in_place, src, len(src.commits), disagreements)


def _check_target(target: str, name: str) -> None:
    """A different location must not hold a log yet (checked once the source is: opening a local
    location creates its folder, which a refused import must not leave behind)."""
    existing = list_log(open_store(target)).entries
    if existing:
        raise PermanentError(
            f"the location {target} already holds a Delta log ({existing[0][0].path})",
            table=name,
            hint="choose an empty location, or omit --location to import in place",
        )


def _record_source_checkpoints(store: SqlStore, table_info: TableInfo, src: SourceLog) -> None:
    """In place, the source's checkpoints are already there: recorded so cadence and validation know."""
    for version in src.checkpoint_versions:
        if version >= src.start_version:
            store.ensure_status(table_info.id, version, Artifact.CHECKPOINT)
            store.mark_succeeded(table_info.id, Artifact.CHECKPOINT, [(version, "", 0)])


def _result(
    name: str,
    source_uri: str,
    target: str,
    in_place: bool,
    src: SourceLog,
    commits: int,
    disagreements: list[Disagreement],
) -> ImportResult:
    base = src.base_checkpoint
    return ImportResult(
        name,
        source_uri,
        target,
        in_place,
        src.start_version,
        src.end_version,
        commits,
        base.version if base else None,
        src.checkpoint_kind,
        disagreements,
    )


def _stream(
    store: SqlStore,
    objects: Any,
    head: SourceHead,
    *,
    name: str,
    target: str,
    in_place: bool,
    progress: _Throttled,
) -> SourceLog:
    """A log without checkpoints after its base, imported as it is read: each commit is parsed,
    checked (the rule for invalid logs) and handed to a writer thread, so the database stores one
    commit while the next is parsed and memory holds a few commits, not the log. A refusal found
    late rolls the one transaction back: nothing is left behind, as when the log is checked first.
    The table's checkpoint kind depends on the latest protocol, so it is set once all is read."""
    base = head.base
    settings: dict[str, object] = {"imported_from": objects.uri, "imported_at": now_ms()}
    total = head.commit_count
    with (
        _parse_process(head) as parser,
        store.importing(
            name,
            target,
            first_version=head.start,
            base_checkpoint_version=base.version if base else None,
            settings=settings,
        ) as imp,
    ):
        check = SegmentCheck(base.actions if base is not None else None, head.start, table=name)
        writer = _Writer(imp)
        try:
            if base is not None:
                facts = facts_of_lines(base.actions, table=name, version=base.version)
                writer.put(base.version, base.actions, facts, part=PART_SNAPSHOT)
                if head.start not in head.listing.commits:
                    writer.put(base.version, [], LineFacts(), has_json=False, index_files=False)
            sent: dict[int, int] = {}  # lines of a large commit stored while it was parsed

            def early(
                version: int, seq: int, kinds: list[str], lines: list[str], files: list[FileAction]
            ) -> None:
                indexed = not (base is not None and version == base.version)
                writer.put_lines(version, seq, kinds, lines, files if indexed else [])
                sent[version] = seq + len(lines)

            commits = iter_commits(
                objects, head.listing, head.start, head.latest, table=name, on_lines=early, parser=parser
            )
            for done, commit in enumerate(commits, start=1):
                check.commit(commit.version, commit.lines)
                writer.put(
                    commit.version,
                    commit.lines,
                    commit.facts,
                    published=commit.file if in_place else None,
                    index_files=not (base is not None and commit.version == base.version),
                    lines_sent=sent.pop(commit.version, 0),
                    rendered=commit.rendered,
                )
                progress(done, total)
            if parser is not None:
                parser.close()  # its exit overlaps the writer's last work
            src = source_summary(objects, head, check.finish(), table=name)
            if not in_place:
                _check_target(target, name)
        except BaseException:
            writer.close(finish=False)
            raise
        writer.close()
        imp.checkpoint_layout(src.checkpoint_kind, _part_size(src))
    progress(total, total, final=True)
    if in_place:
        _record_source_checkpoints(store, imp.table, src)
    return src


@contextmanager
def _parse_process(head: SourceHead) -> Iterator[ParseProcess | None]:
    """A parse process when the segment holds a commit large enough for it (started first, so it
    is ready when the commits are read), stopped when the import ends."""
    sizes = {meta.path: meta.size for meta, _ in head.listing.entries}
    large = any(
        sizes.get(path, 0) >= parse_process.CHILD_MIN_BYTES
        for version, path in head.listing.commits.items()
        if head.start <= version <= head.latest
    )
    parser = ParseProcess.start() if large else None
    try:
        yield parser
    finally:
        if parser is not None:
            parser.close()


_Call = tuple[Callable[..., None], tuple[Any, ...], dict[str, Any]]


class _Writer:
    """``Importing.put`` calls run in a thread, in order; ``close`` writes the rest
    (``Importing.finish``) and re-raises the thread's error, if any. Calls are handed over in
    groups of at least ``group_lines`` lines (a long history of small commits is a few hand-overs,
    not one per commit); the queue holds ``depth`` groups: the reader waits when the database
    falls behind, so memory holds a few groups of commits, not the log."""

    def __init__(self, imp: Importing, depth: int = 2, group_lines: int = 20_000) -> None:
        self.imp = imp
        self.error: BaseException | None = None
        self._queue: queue.Queue[list[_Call] | None] = queue.Queue(depth)
        self._group: list[_Call] = []
        self._group_lines = 0
        self._max_lines = group_lines
        self._thread = threading.Thread(target=self._run, name="import-writer", daemon=True)
        self._thread.start()
        self._closed = False

    def _run(self) -> None:
        while (group := self._queue.get()) is not None:
            for method, args, kwargs in group:
                if self.error is not None:
                    break
                try:
                    method(*args, **kwargs)
                except BaseException as exc:  # handed to the reader thread
                    self.error = exc
        if self.error is None:
            try:
                self.imp.finish()
            except BaseException as exc:
                self.error = exc

    def put(self, version: int, lines: list[str], facts: LineFacts, **kwargs: Any) -> None:
        """``Importing.put(version, lines, facts, **kwargs)``, in the thread."""
        self._add((self.imp.put, (version, lines, facts), kwargs), len(lines) + 1)

    def put_lines(
        self, version: int, seq: int, kinds: list[str], lines: list[str], files: list[FileAction]
    ) -> None:
        """``Importing.lines``: a large commit's lines (and, when it holds adds only, their file
        rows) while the rest is parsed, handed over at once: the database starts on them now."""
        call = (self.imp.lines, (version, seq, kinds, lines), {"at_once": True, "files": files})
        self._add(call, self._max_lines)

    def _add(self, call: _Call, lines: int) -> None:
        if self.error is not None:
            self.close()
        self._group.append(call)
        self._group_lines += lines
        if self._group_lines >= self._max_lines:
            self._hand_over()

    def _hand_over(self) -> None:
        if self._group:
            self._queue.put(self._group)
            self._group, self._group_lines = [], 0

    def close(self, *, finish: bool = True) -> None:
        """Wait for the thread and raise its error. ``finish=False`` (the reader failed): skip the
        final writes (the transaction rolls back anyway) and raise nothing: the reader's error is
        the one to report."""
        if not self._closed:
            self._closed = True
            if finish:
                self._hand_over()
            elif self.error is None:
                self.error = _Abandoned()
            self._queue.put(None)
            self._thread.join()
        if finish and self.error is not None:
            raise self.error


class _Abandoned(Exception):
    """The reader failed: the writer thread stops without its final writes."""


def _store_versions(imp: Importing, src: SourceLog, *, in_place: bool, progress: _Throttled) -> None:
    """The base snapshot, every commit, and the state of later checkpoints where it differs, in
    bulk (``SqlStore.importing``)."""
    base = src.base_checkpoint
    if base is not None:
        imp.put(base.version, base.actions, facts_of_lines(base.actions), part=PART_SNAPSHOT)
        if not src.commits or src.commits[0][0] != base.version:
            imp.put(base.version, [], LineFacts(), has_json=False, index_files=False)
    states = {state.version: state for state in src.checkpoint_states}
    n = len(src.commits)
    for done, (version, lines, _bytes) in enumerate(src.commits, start=1):
        facts = src.commit_facts.get(version) or facts_of_lines(lines)
        imp.put(
            version,
            lines,
            facts,
            published=src.commit_files[version] if in_place else None,
            index_files=not (base is not None and version == base.version),
        )
        if version in states:
            imp.checkpoint_state(states[version], enqueue_checkpoint=not in_place)
        progress(n + done, 2 * n)
    imp.finish()
    progress(2 * n, 2 * n, final=True)


@contextmanager
def _gc_paused() -> Iterator[None]:
    """The cyclic garbage collector off for the import: a log is millions of small containers
    (parsed lines, file rows) that live until the end, and every full collection walked all of
    them (a third of the CPU of storing a 300k-file log). Parsed JSON holds no cycles; the
    collector is back on, as it was, when the import ends (it is process-wide meanwhile)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


class _Throttled:
    """The caller's progress callback, at most every ``PROGRESS_EVERY`` seconds (and at the end)."""

    def __init__(self, progress: Callable[[int, int], None] | None) -> None:
        self.progress, self.last = progress, 0.0

    def __call__(self, done: int, total: int, *, final: bool = False) -> None:
        if self.progress is None:
            return
        now = time.monotonic()
        if final or now - self.last >= PROGRESS_EVERY:
            self.last = now
            self.progress(done, total)


__all__ = ["ImportResult", "import_table"]
