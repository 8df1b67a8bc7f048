"""Import: put an existing Delta table's log under the store's authority.

Import is lossless: every source commit is stored with its actions in their order, key order and
unknown fields kept, so republishing reproduces it (byte for byte where the source writer wrote
canonical JSON, as Delta-Spark does). A log whose early commits were cleaned up starts at its oldest
complete checkpoint, whose actions become the table's base snapshot.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable
from dataclasses import dataclass

from delta_mirror.delta.actions import Action
from delta_mirror.delta.log_listing import list_log
from delta_mirror.delta.source_log import SourceLog, read_source_log
from delta_mirror.errors import PermanentError
from delta_mirror.storage import normalize_location, open_store
from delta_mirror.store import db
from delta_mirror.store.schema import PART_SNAPSHOT
from delta_mirror.store.sql_store import SqlStore, check_table_name, now_ms

DEFAULT_PART_SIZE = 1_000_000
ANALYZE_EVERY_ROWS = 20_000  # refresh planner statistics this often during a large import


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

    def to_json(self) -> dict[str, object]:
        return dict(self.__dict__)


def _parse(lines: list[str]) -> list[Action]:
    out: list[Action] = []
    for line in lines:
        ((kind, body),) = json.loads(line).items()
        out.append((kind, body))
    return out


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
    as already published. A different location must not hold a ``_delta_log`` yet.
    """
    check_table_name(name)
    source_uri = normalize_location(source)
    target = normalize_location(location) if location else source_uri
    in_place = target == source_uri
    src = read_source_log(open_store(source_uri), table=name)
    if not in_place:
        existing = list_log(open_store(target)).entries
        if existing:
            raise PermanentError(
                f"the location {target} already holds a Delta log ({existing[0][0].path})",
                table=name,
                hint="choose an empty location, or omit --location to import in place",
            )
    base = src.base_checkpoint
    kind = src.checkpoint_kind
    table_info = None
    total = len(src.commits)
    with db.translated(store.url, f"importing table '{name}'"), store.begin() as conn:
        table_info = store.create_table(
            name,
            target,
            first_version=src.start_version,
            base_checkpoint_version=base.version if base else None,
            checkpoint_kind=kind,
            checkpoint_part_size=_part_size(src),
            conn=conn,
            settings={"imported_from": source_uri, "imported_at": now_ms()},
        )
        if base is not None:
            store.import_version(
                conn, table_info, base.version, _parse(base.actions), base.actions, part=PART_SNAPSHOT
            )
            if not src.commits or src.commits[0][0] != base.version:
                store.import_version(
                    conn, table_info, base.version, [], [], has_json=False, index_files=False
                )
        unanalysed = len(base.actions) if base is not None else 0
        for done, (version, lines, original) in enumerate(src.commits, start=1):
            if unanalysed > ANALYZE_EVERY_ROWS:
                store.refresh_statistics(conn)
                unanalysed = 0
            actions = _parse(lines)
            published = hashlib.sha256(original).hexdigest() if in_place else None
            store.import_version(
                conn,
                table_info,
                version,
                actions,
                lines,
                published_sha256=published,
                published_size=len(original) if in_place else None,
                index_files=not (base is not None and version == base.version),
            )
            unanalysed += len(lines)
            if progress:
                progress(done, total)
    if in_place:
        # The source's checkpoints are already there: record them so cadence and validation know.
        for version in src.checkpoint_versions:
            if version >= src.start_version:
                store.ensure_status(table_info.id, version, "checkpoint")
                store.mark_succeeded(table_info.id, "checkpoint", [(version, "", 0)])
    return ImportResult(
        name,
        source_uri,
        target,
        in_place,
        src.start_version,
        src.end_version,
        len(src.commits),
        base.version if base else None,
        kind,
    )


__all__ = ["ImportResult", "import_table"]
