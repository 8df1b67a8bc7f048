"""The rows one version writes, shared by every write path (native, verbatim, import).

- the ``dl_commits`` row is claimed first: its primary key decides a race for the version;
- ``dl_actions`` keeps each action line as it will be published;
- ``dl_files`` indexes adds and removes by the rule of ``file_index`` (a re-added (path, deletion
  vector) supersedes the active entry), so the active file set at any version is one indexed query;
- a committed version waits for the publisher as a ``PENDING`` ``json`` status row.

All functions run in the caller's transaction.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import ColumnElement, Connection, bindparam, insert, select, update
from sqlalchemy.exc import IntegrityError

from delta_mirror.config import max_commit_actions, max_commit_bytes
from delta_mirror.delta.actions import Action, canonical_line
from delta_mirror.delta.protocol import now_ms
from delta_mirror.delta.replay import FileKey, file_key
from delta_mirror.errors import CommitTooLargeError
from delta_mirror.store.backends import backend_of
from delta_mirror.store.base import CHUNK, version_taken
from delta_mirror.store.file_index import file_rows, index_changes, whole
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
        if not backend_of(conn).is_unique_violation(exc):
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
    """Insert action rows and run the version's file-index changes (``file_index.index_changes``:
    the one decider of the rule) in the caller's transaction.

    ``strict=False`` (imported logs) keeps a remove of a file this log never added as a tombstone.
    """
    if lines is None:
        lines = [canonical_line(k, b) for k, b in actions]
    insert_action_rows(conn, table_id, version, part, actions, lines)
    adds, ends = index_changes(table_id, version, part, actions)
    if ends:
        stmt = (
            update(dl_files)
            .where(
                dl_files.c.table_id == table_id,
                dl_files.c.path == bindparam("p"),
                dl_files.c.dv_id == bindparam("d"),
                dl_files.c.remove_version.is_(None),
            )
            .values(
                remove_version=version,
                remove_part=bindparam("rp"),
                remove_seq=bindparam("rs"),
                deletion_timestamp=bindparam("dt"),
            )
        )
        conn.execute(stmt, [{"p": p, "d": d, "rp": rp, "rs": rs, "dt": dt} for p, d, rp, rs, dt in ends])
        if not strict:
            _keep_tombstones(conn, table_id, version, part, actions)
    if adds:
        conn.execute(insert(dl_files), adds)


def _keep_tombstones(
    conn: Connection, table_id: int, version: int, part: int, actions: Sequence[Action]
) -> None:
    """An imported log may remove a file its segment never saw added (the remove is a tombstone
    only): keep it as a row ended at this version, so checkpoints still carry it (each such remove,
    as ``file_index.FileIndex`` keeps it)."""
    removes = [(seq, file_key(body), body) for seq, (kind, body) in enumerate(actions) if kind == "remove"]
    if not removes:
        return
    known = _tombstone_keys(conn, table_id, version, [key.path for _, key, _ in removes])
    orphans = [
        {
            "table_id": table_id,
            "path": key.path,
            "dv_id": key.dv_id,
            "remove_version": version,
            "remove_part": part,
            "remove_seq": seq,
            "deletion_timestamp": whole(body, "deletionTimestamp"),
        }
        for seq, key, body in removes
        if key not in known
    ]
    if orphans:
        conn.execute(insert(dl_files), orphans)


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
