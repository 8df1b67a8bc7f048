"""The rows one version writes, shared by every write path (native, verbatim, import).

- the ``dl_commits`` row is claimed first: its primary key decides a race for the version;
- ``dl_actions`` keeps each action line as it will be published;
- ``dl_files`` indexes adds and removes (a re-added (path, deletion vector) supersedes the
  active entry), so the active file set at any version is one indexed query;
- a committed version waits for the publisher as a ``PENDING`` ``json`` status row.

All functions run in the caller's transaction.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import ColumnElement, Connection, and_, bindparam, insert, select, update
from sqlalchemy.exc import IntegrityError

from delta_mirror.config import max_commit_actions, max_commit_bytes
from delta_mirror.delta.actions import Action, canonical_line
from delta_mirror.delta.protocol import now_ms
from delta_mirror.delta.replay import FileKey, file_key
from delta_mirror.errors import CommitTooLargeError
from delta_mirror.store import db
from delta_mirror.store.base import CHUNK, version_taken
from delta_mirror.store.schema import dl_actions, dl_commits, dl_files, dl_mirror_status
from delta_mirror.store.states import Artifact, CommitSource, PublishState
from delta_mirror.store.tables import TableInfo

#: The store's commit limits: what each measures, and the setting that raises it.
_LIMITS = (
    ("the commit holds {:,} actions", max_commit_actions, "DELTA_MIRROR_MAX_COMMIT_ACTIONS"),
    ("the commit file would be {:,} bytes", max_commit_bytes, "DELTA_MIRROR_MAX_COMMIT_BYTES"),
)


def check_commit_size(name: str, version: int | None, action_count: int, size: int) -> None:
    """The store's commit limits (``DELTA_MIRROR_MAX_COMMIT_ACTIONS`` / ``_BYTES``), for every writer."""
    for found, (what, limit_of, setting) in zip((action_count, size), _LIMITS, strict=True):
        if found > (limit := limit_of()):
            raise CommitTooLargeError(
                f"{what.format(found)}, more than the limit of {limit:,}",
                table=name,
                version=version,
                hint=f"split it into several commits, or raise {setting}",
            )


def claim_version(
    conn: Connection,
    table: TableInfo,
    version: int,
    source: CommitSource,
    *,
    action_count: int = 0,
    size: int = 0,
    sha256: str = "",
    in_commit_timestamp: int | None = None,
    has_json: bool = True,
    committed_at: int | None = None,
) -> int:
    """Insert the version's ``dl_commits`` row first: a racing writer fails here, before any other
    work (its primary key decides). A native commit fills in hash and size once its actions are
    rendered; a verbatim one knows them up front; an imported one keeps the source's commit time
    (``committed_at``). Returns the commit time (epoch ms)."""
    ts = now_ms() if committed_at is None else committed_at
    try:
        conn.execute(
            insert(dl_commits).values(
                table_id=table.id,
                version=version,
                committed_at=ts,
                in_commit_timestamp=in_commit_timestamp,
                action_count=action_count,
                size_bytes=size,
                sha256=sha256,
                has_json=has_json,
                source=source,
            )
        )
    except IntegrityError as exc:
        if not db.is_unique_violation(exc):
            raise
        raise version_taken(table.name, version) from None
    return ts


def enqueue_json(
    conn: Connection,
    table_id: int,
    version: int,
    ts: int,
    *,
    published_sha256: str | None = None,
    published_size: int | None = None,
) -> None:
    """A committed version waits for the publisher (``PENDING``); an imported one already at its
    location (``published_sha256``, an in-place import) is ``SUCCESS`` from the start."""
    done = published_sha256 is not None
    conn.execute(
        insert(dl_mirror_status).values(
            table_id=table_id,
            version=version,
            artifact=Artifact.JSON,
            state=PublishState.SUCCESS if done else PublishState.PENDING,
            attempts=0,
            enqueued_at=ts,
            finished_at=ts if done else None,
            sha256=published_sha256,
            size_bytes=published_size,
        )
    )


def _whole(body: Mapping[str, Any], field: str) -> int | None:
    """An integer field of an action body as ``dl_files`` stores it (anything else: NULL)."""
    value = body.get(field)
    return value if isinstance(value, int) else None


def file_rows(
    table_id: int, version: int, part: int, actions: Sequence[Action]
) -> tuple[list[dict[str, Any]], list[tuple[int, dict[str, Any]]]]:
    """The ``dl_files`` rows to insert for adds, and (seq, body) of the removes."""
    adds: list[dict[str, Any]] = []
    removes: list[tuple[int, dict[str, Any]]] = []
    for seq, (kind, body) in enumerate(actions):
        if kind == "add":
            pv = body.get("partitionValues")
            key = file_key(body)
            adds.append(
                {
                    "table_id": table_id,
                    "path": key.path,
                    "dv_id": key.dv_id,
                    "add_version": version,
                    "add_part": part,
                    "add_seq": seq,
                    "size": _whole(body, "size"),
                    "partition_values": json.dumps(pv, separators=(",", ":"), ensure_ascii=False)
                    if pv is not None
                    else None,
                }
            )
        elif kind == "remove":
            removes.append((seq, body))
    return adds, removes


def index_changes(
    table_id: int, version: int, part: int, actions: Sequence[Action]
) -> tuple[list[dict[str, Any]], list[tuple[str, str, int | None, int | None, int | None]]]:
    """``write_actions``' file-index effect as rows, for a writer that cannot run its steps one by
    one (one statement on PostgreSQL): the ``dl_files`` rows to insert, and the active entries the
    version ends as (path, dv_id, remove_part, remove_seq, deletion_timestamp), each key once.

    As ``write_actions`` does it: a re-add (version > 0) supersedes its entry with no remove
    position (``_supersede``), a remove ends its entry with its own (``_remove``); a key both
    re-added and removed ends as superseded (``_supersede`` runs first, ``_remove`` then finds no
    active entry).
    """
    adds, removes = file_rows(table_id, version, part, actions)
    ends: list[tuple[str, str, int | None, int | None, int | None]] = []
    superseded: set[tuple[str, str]] = set()
    if version > 0:
        for a in adds:
            if (a["path"], a["dv_id"]) not in superseded:
                superseded.add((a["path"], a["dv_id"]))
                ends.append((a["path"], a["dv_id"], None, None, None))
    ended = set(superseded)
    for seq, body in removes:
        key = file_key(body)
        if (key.path, key.dv_id) not in ended:
            ended.add((key.path, key.dv_id))
            ends.append((key.path, key.dv_id, part, seq, _whole(body, "deletionTimestamp")))
    return adds, ends


def insert_action_rows(
    conn: Connection, table_id: int, version: int, part: int, actions: Sequence[Action], lines: Sequence[str]
) -> None:
    rows = [
        {
            "table_id": table_id,
            "version": version,
            "part": part,
            "seq": seq,
            "action_type": kind,
            "payload": line,
        }
        for seq, ((kind, _), line) in enumerate(zip(actions, lines, strict=True))
    ]
    if rows:
        conn.execute(insert(dl_actions), rows)


def _keys(conn: Connection, table_id: int, paths: Sequence[str], entry: ColumnElement[bool]) -> set[FileKey]:
    """The keys of the table's ``dl_files`` entries among ``paths`` that match ``entry``."""
    out: set[FileKey] = set()
    unique = sorted(set(paths))
    for i in range(0, len(unique), CHUNK):
        rows = conn.execute(
            select(dl_files.c.path, dl_files.c.dv_id).where(
                dl_files.c.table_id == table_id, entry, dl_files.c.path.in_(unique[i : i + CHUNK])
            )
        )
        out.update(FileKey(r.path, r.dv_id) for r in rows)
    return out


def active_keys(conn: Connection, table_id: int, paths: Sequence[str]) -> set[FileKey]:
    """The active (path, deletion vector) entries among ``paths``."""
    return _keys(conn, table_id, paths, dl_files.c.remove_version.is_(None))


def _tombstone_keys(conn: Connection, table_id: int, version: int, paths: Sequence[str]) -> set[FileKey]:
    """The entries among ``paths`` that ``version`` removed."""
    return _keys(conn, table_id, paths, dl_files.c.remove_version == version)


def write_actions(
    conn: Connection,
    table_id: int,
    version: int,
    part: int,
    actions: Sequence[Action],
    *,
    strict: bool,
    lines: Sequence[str] | None = None,
) -> None:
    """Insert action rows and maintain the file index (adds, removes, superseded re-adds).

    ``strict=False`` (imported logs) keeps a remove of a file this log never added as a tombstone.
    """
    if lines is None:
        lines = [canonical_line(k, b) for k, b in actions]
    insert_action_rows(conn, table_id, version, part, actions, lines)
    adds, removes = file_rows(table_id, version, part, actions)
    # A re-added (path, dv) supersedes the active entry (e.g. recomputed stats); no tombstone.
    if adds and version > 0:
        _supersede(conn, table_id, version, adds)
    if removes:
        _remove(conn, table_id, version, part, removes, strict=strict)
    if adds:
        conn.execute(insert(dl_files), adds)


def _active_entry(table_id: int) -> ColumnElement[bool]:
    """The WHERE of the active ``dl_files`` entry of the key bound as ``p`` (path), ``d`` (dv id)."""
    return and_(
        dl_files.c.table_id == table_id,
        dl_files.c.path == bindparam("p"),
        dl_files.c.dv_id == bindparam("d"),
        dl_files.c.remove_version.is_(None),
    )


def _supersede(conn: Connection, table_id: int, version: int, adds: Sequence[dict[str, Any]]) -> None:
    active = active_keys(conn, table_id, [a["path"] for a in adds])
    superseded = [{"p": a["path"], "d": a["dv_id"]} for a in adds if (a["path"], a["dv_id"]) in active]
    if superseded:
        conn.execute(
            update(dl_files).where(_active_entry(table_id)).values(remove_version=version), superseded
        )


def _remove(
    conn: Connection,
    table_id: int,
    version: int,
    part: int,
    removes: Sequence[tuple[int, dict[str, Any]]],
    *,
    strict: bool,
) -> None:
    params: list[dict[str, Any]] = [
        {
            "p": key.path,
            "d": key.dv_id,
            "rv": version,
            "rp": part,
            "rs": seq,
            "dt": _whole(body, "deletionTimestamp"),
        }
        for seq, body in removes
        for key in [file_key(body)]
    ]
    stmt = (
        update(dl_files)
        .where(_active_entry(table_id))
        .values(
            remove_version=bindparam("rv"),
            remove_part=bindparam("rp"),
            remove_seq=bindparam("rs"),
            deletion_timestamp=bindparam("dt"),
        )
    )
    result = conn.execute(stmt, params)
    removed = result.rowcount if result.rowcount is not None else -1
    if removed == len(params) or strict:
        return
    # Imported logs may remove files this segment never saw added (the remove is a tombstone
    # only): keep it as a tombstone row so checkpoints still carry it.
    known = _tombstone_keys(conn, table_id, version, [p["p"] for p in params])
    orphans = [p for p in params if (p["p"], p["d"]) not in known]
    if orphans:
        conn.execute(
            insert(dl_files),
            [
                {
                    "table_id": table_id,
                    "path": p["p"],
                    "dv_id": p["d"],
                    "remove_version": version,
                    "remove_part": part,
                    "remove_seq": p["rs"],
                    "deletion_timestamp": p["dt"],
                }
                for p in orphans
            ],
        )


__all__ = [
    "active_keys",
    "check_commit_size",
    "claim_version",
    "enqueue_json",
    "file_rows",
    "index_changes",
    "insert_action_rows",
    "write_actions",
]
