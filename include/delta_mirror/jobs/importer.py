"""Import: put an existing Delta table's log under the store's authority.

Import is lossless: every source commit is stored with its lines in their order, key order,
unknown fields and unknown keys beside an action kept, so republishing reproduces it (byte for
byte where the source writer wrote canonical JSON, as Delta-Spark does). A log whose early commits
were cleaned up starts at its oldest complete checkpoint, whose actions become the table's base
snapshot. Import reproduces what readers see: where a later source checkpoint disagrees with the
JSON commits, its state is recorded at its version and the disagreement reported
(``delta.source_state``); a log readers cannot reconstruct is refused before anything is written.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from delta_mirror.delta.line_facts import LineFacts, facts_of_lines
from delta_mirror.delta.log_listing import list_log
from delta_mirror.delta.protocol import now_ms
from delta_mirror.delta.source_log import SourceLog, read_source_log
from delta_mirror.delta.source_state import Disagreement
from delta_mirror.errors import PermanentError
from delta_mirror.storage import normalize_location, open_store
from delta_mirror.store import db
from delta_mirror.store.bulk_load import BulkImport
from delta_mirror.store.schema import PART_SNAPSHOT
from delta_mirror.store.source_import import CHECKPOINT_STATE_SETTING, record_checkpoint_state
from delta_mirror.store.sql_store import SqlStore, TableInfo, check_table_name
from delta_mirror.store.states import Artifact

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection

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
    as already published. A different location must not hold a ``_delta_log`` yet. The source is
    read and checked in full first; the store is written in one transaction, so a refused or
    failed import leaves nothing behind.
    """
    check_table_name(name)
    source_uri = normalize_location(source)
    target = normalize_location(location) if location else source_uri
    in_place = target == source_uri
    report = _Throttled(progress)
    # Progress counts each commit twice: once read, once stored.
    src = read_source_log(
        open_store(source_uri), table=name, progress=lambda done, n: report(done, 2 * n), keep_bytes=False
    )
    if not in_place:
        existing = list_log(open_store(target)).entries
        if existing:
            raise PermanentError(
                f"the location {target} already holds a Delta log ({existing[0][0].path})",
                table=name,
                hint="choose an empty location, or omit --location to import in place",
            )
    base = src.base_checkpoint
    disagreements = [d for state in src.checkpoint_states for d in state.disagreements]
    settings: dict[str, object] = {"imported_from": source_uri, "imported_at": now_ms()}
    if disagreements:
        settings[CHECKPOINT_STATE_SETTING] = [d.to_json() for d in disagreements]
    with db.translated(store.url, f"importing table '{name}'"), store.begin() as conn:
        table_info = store.create_table(
            name,
            target,
            first_version=src.start_version,
            base_checkpoint_version=base.version if base else None,
            checkpoint_kind=src.checkpoint_kind,
            checkpoint_part_size=_part_size(src),
            conn=conn,
            settings=settings,
        )
        _store_versions(store, conn, table_info, src, in_place=in_place, progress=report)
    if in_place:
        # The source's checkpoints are already there: record them so cadence and validation know.
        for version in src.checkpoint_versions:
            if version >= src.start_version:
                store.ensure_status(table_info.id, version, Artifact.CHECKPOINT)
                store.mark_succeeded(table_info.id, Artifact.CHECKPOINT, [(version, "", 0)])
    return ImportResult(
        name,
        source_uri,
        target,
        in_place,
        src.start_version,
        src.end_version,
        len(src.commits),
        base.version if base else None,
        src.checkpoint_kind,
        disagreements,
    )


def _store_versions(
    store: SqlStore,
    conn: Connection,
    table_info: TableInfo,
    src: SourceLog,
    *,
    in_place: bool,
    progress: _Throttled,
) -> None:
    """The base snapshot, every commit, and the state of later checkpoints where it differs, as
    ``import_version`` would write them one by one, in bulk (``store.bulk_load``)."""
    bulk = BulkImport(conn, table_info.id)
    base = src.base_checkpoint
    if base is not None:
        bulk.version(base.version, base.actions, facts_of_lines(base.actions), part=PART_SNAPSHOT)
        if not src.commits or src.commits[0][0] != base.version:
            bulk.version(base.version, [], LineFacts(), has_json=False, index_files=False)
    states = {state.version: state for state in src.checkpoint_states}
    n = len(src.commits)
    for done, (version, lines, _bytes) in enumerate(src.commits, start=1):
        facts = src.commit_facts.get(version) or facts_of_lines(lines)
        bulk.version(
            version,
            lines,
            facts,
            published=src.commit_files[version] if in_place else None,
            index_files=not (base is not None and version == base.version),
        )
        if version in states:
            record_checkpoint_state(bulk, states[version], enqueue_checkpoint=not in_place)
        progress(n + done, 2 * n)
    bulk.finish()
    progress(2 * n, 2 * n, final=True)


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
