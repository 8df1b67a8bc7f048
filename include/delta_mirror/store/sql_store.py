"""The store's API: tables, commits with optimistic concurrency, snapshots and file sets.

Invariants kept here:
- a version is committed exactly once: the ``dl_commits`` primary key decides races, the loser
  gets ``CommitConflictError`` naming the table and version;
- a commit is one transaction: a refused commit leaves the store unchanged;
- the SHA-256 and size of a version's canonical commit bytes are recorded when it is committed.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, and_, delete, func, insert, or_, select, text, update
from sqlalchemy.exc import IntegrityError

from delta_mirror.config import max_commit_actions, max_commit_bytes, redact_url
from delta_mirror.config import store_url as resolve_store_url
from delta_mirror.delta.actions import (
    Action,
    canonical_line,
    dv_id,
    render_commit,
    spark_ordered,
    split_commit,
    validate_action,
)
from delta_mirror.errors import (
    CommitConflictError,
    CommitTooLargeError,
    DataError,
    InvalidActionError,
    MirrorError,
    PermanentError,
    TableExistsError,
    TableHaltedError,
    TableNotFoundError,
)
from delta_mirror.store import db
from delta_mirror.store.schema import (
    PART_COMMIT,
    dl_actions,
    dl_commits,
    dl_files,
    dl_lag_samples,
    dl_mirror_status,
    dl_tables,
)
from delta_mirror.version import ENGINE_INFO

TABLE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,127}")  # fullmatch: '$' would allow a trailing '\n'
# Without an expected version a writer that loses a race retries on the next version this often.
_NEXT_VERSION_ATTEMPTS = 50
REFUSED_FEATURES = ("catalogManaged", "catalogOwned-preview")
_CHUNK = 500


def now_ms() -> int:
    return int(time.time() * 1000)


def _version_taken(table: str, version: int | None) -> CommitConflictError:
    """The loser of a race for a version (the ``dl_commits`` primary key decided it)."""
    return CommitConflictError(
        "another writer committed this version first",
        table=table,
        version=version,
        hint="re-read the table and retry the commit on the new latest version",
    )


def check_table_name(name: str) -> None:
    if not isinstance(name, str) or not TABLE_NAME.fullmatch(name):
        raise PermanentError(
            f"invalid table name {name!r}",
            hint="use 1-128 letters, digits, '_', '.' or '-', starting with a letter, digit or '_'",
        )


@dataclass(frozen=True)
class TableInfo:
    id: int
    name: str
    location: str
    table_uuid: str
    state: str
    halted_reason: str | None
    halted_version: int | None
    first_version: int
    base_checkpoint_version: int | None
    checkpoint_kind: str
    checkpoint_part_size: int | None
    checkpoint_interval: int | None
    checkpoint_max_bytes: int | None
    settings: dict[str, Any]
    lease_owner: str | None
    lease_expires_at: int | None


@dataclass(frozen=True)
class FileEntry:
    path: str
    dv_id: str
    size: int | None
    partition_values: dict[str, str | None] | None


@dataclass(frozen=True)
class StatusRow:
    version: int
    artifact: str
    state: str
    attempts: int
    error_class: str | None
    last_error: str | None
    sha256: str | None
    size_bytes: int | None
    enqueued_at: int
    started_at: int | None
    finished_at: int | None


@dataclass
class Snapshot:
    """The table state at ``version`` as canonical action lines (the input of a checkpoint)."""

    version: int
    protocol: str
    metadata: str
    txns: list[str] = field(default_factory=list)
    domain_metadata: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class CommitRow:
    version: int
    sha256: str
    size_bytes: int
    has_json: bool
    committed_at: int
    source: str = "native"  # "native" (SqlStore.commit), "spark" (SqlStore.commit_verbatim) or "import"


@dataclass(frozen=True)
class CommitResult:
    """A version committed by ``SqlStore.commit_verbatim``; ``existing`` when it already held these bytes."""

    table: str
    version: int
    sha256: str
    size: int
    existing: bool = False


@dataclass(frozen=True)
class _Verbatim:
    """A verbatim commit, parsed and hashed once."""

    location: str
    version: int
    data: bytes
    lines: list[str]
    actions: list[Action]
    sha256: str
    raw_ict: Any

    @property
    def ict(self) -> int | None:
        return self.raw_ict if type(self.raw_ict) is int else None


# Roots remembered by ``SqlStore.commit_verbatim`` (forgotten all at once past this many).
_KNOWN_ROOTS = 4096

# ``SqlStore._commit_verbatim_fast`` on PostgreSQL: every row of a verbatim commit in one statement
# (one round trip, its own transaction). ``t`` yields the table only while it is as the caller last
# saw it and ``v`` is its next version; each write hangs off the claimed ``dl_commits`` row ``c``.
# The sub-statements share one snapshot: the UPDATE of superseded entries never sees the new rows.
_PG_VERBATIM_COMMIT = """
WITH t AS (
    SELECT id FROM dl_tables
    WHERE id = %(tid)s AND location = %(loc)s AND name = %(name)s AND first_version = %(fv)s
      AND base_checkpoint_version IS NOT DISTINCT FROM %(bcv)s::bigint AND state <> 'HALTED'
      AND COALESCE((SELECT max(version) + 1 FROM dl_commits WHERE table_id = %(tid)s), first_version)
          = %(v)s::bigint
), c AS (
    INSERT INTO dl_commits
        (table_id, version, committed_at, in_commit_timestamp, action_count, size_bytes, sha256, has_json,
         source)
    SELECT id, %(v)s::bigint, %(ts)s::bigint, %(ict)s::bigint, %(n)s::int, %(size)s::bigint, %(sha)s::text,
        true, 'spark'
    FROM t
    RETURNING table_id
), a AS (
    INSERT INTO dl_actions (table_id, version, part, seq, action_type, payload)
    SELECT c.table_id, %(v)s::bigint, %(part)s::smallint, x.seq, x.kind, x.payload
    FROM c, unnest(%(a_seq)s::int[], %(a_kind)s::text[], %(a_payload)s::text[]) AS x(seq, kind, payload)
), s AS (
    UPDATE dl_files f SET remove_version = %(v)s::bigint
    FROM c, unnest(%(f_path)s::text[], %(f_dv)s::text[]) AS x(path, dv_id)
    WHERE %(v)s::bigint > 0 AND f.table_id = c.table_id AND f.path = x.path AND f.dv_id = x.dv_id
      AND f.remove_version IS NULL
), f AS (
    INSERT INTO dl_files (table_id, path, dv_id, add_version, add_part, add_seq, size, partition_values)
    SELECT c.table_id, x.path, x.dv_id, %(v)s::bigint, %(part)s::smallint, x.seq, x.size, x.pv
    FROM c, unnest(%(f_path)s::text[], %(f_dv)s::text[], %(f_seq)s::int[], %(f_size)s::bigint[],
                   %(f_pv)s::text[]) AS x(path, dv_id, seq, size, pv)
), m AS (
    INSERT INTO dl_mirror_status (table_id, version, artifact, state, attempts, enqueued_at)
    SELECT table_id, %(v)s::bigint, 'json', 'PENDING', 0, %(ts)s::bigint FROM c
)
SELECT count(*) FROM c
"""

# The same claim on SQLite (the other rows follow in the same transaction).
_SQLITE_VERBATIM_CLAIM = """
INSERT INTO dl_commits
    (table_id, version, committed_at, in_commit_timestamp, action_count, size_bytes, sha256, has_json, source)
SELECT id, :v, :ts, :ict, :n, :size, :sha, 1, 'spark' FROM dl_tables
WHERE id = :tid AND location = :loc AND name = :name AND first_version = :fv
  AND base_checkpoint_version IS :bcv AND state <> 'HALTED'
  AND COALESCE((SELECT max(version) + 1 FROM dl_commits WHERE table_id = :tid), first_version) = :v
"""


def default_table_name(location: str) -> str:
    """The name a table created from its root gets: the root's last path segment, made a valid name."""
    from urllib.parse import unquote, urlparse

    segment = unquote(urlparse(location).path.rstrip("/").rsplit("/", 1)[-1]) or "table"
    name = re.sub(r"[^A-Za-z0-9_.\-]", "_", segment)
    return name if name[0].isalnum() or name[0] == "_" else f"_{name}"


def _table_info(row: Any) -> TableInfo:
    return TableInfo(
        id=row.id,
        name=row.name,
        location=row.location,
        table_uuid=row.table_uuid,
        state=row.state,
        halted_reason=row.halted_reason,
        halted_version=row.halted_version,
        first_version=row.first_version,
        base_checkpoint_version=row.base_checkpoint_version,
        checkpoint_kind=row.checkpoint_kind,
        checkpoint_part_size=row.checkpoint_part_size,
        checkpoint_interval=row.checkpoint_interval,
        checkpoint_max_bytes=row.checkpoint_max_bytes,
        settings=json.loads(row.settings or "{}"),
        lease_owner=row.lease_owner,
        lease_expires_at=row.lease_expires_at,
    )


def _file_rows(
    table_id: int, version: int, part: int, actions: Sequence[Action]
) -> tuple[list[dict[str, Any]], list[tuple[int, dict[str, Any]]]]:
    """The ``dl_files`` rows to insert for adds, and (seq, body) of the removes."""
    adds: list[dict[str, Any]] = []
    removes: list[tuple[int, dict[str, Any]]] = []
    for seq, (kind, body) in enumerate(actions):
        if kind == "add":
            pv = body.get("partitionValues")
            adds.append(
                {
                    "table_id": table_id,
                    "path": body.get("path", ""),
                    "dv_id": dv_id(body.get("deletionVector")),
                    "add_version": version,
                    "add_part": part,
                    "add_seq": seq,
                    "size": body.get("size") if isinstance(body.get("size"), int) else None,
                    "partition_values": json.dumps(pv, separators=(",", ":"), ensure_ascii=False)
                    if pv is not None
                    else None,
                }
            )
        elif kind == "remove":
            removes.append((seq, body))
    return adds, removes


class SqlStore:
    """The authority for every table's Delta log, on SQLite or PostgreSQL."""

    def __init__(self, url: str | None = None) -> None:
        self.url = resolve_store_url(url)
        self.engine = db.make_engine(self.url)
        self.reader = db.reader(self.engine)  # read-only transactions (never block writers on SQLite)
        # Verbatim commits (see ``_commit_verbatim_fast``): the tables last seen at each root, a hint
        # that the commit statement itself re-checks, and on SQLite one writer at a time per process
        # (queued on a lock here rather than polling SQLite's busy timeout).
        self._verbatim_tables: dict[str, TableInfo] = {}
        self._sqlite_writes = threading.Lock() if self.engine.dialect.name == "sqlite" else None
        self._autocommit = self.engine.execution_options(isolation_level="AUTOCOMMIT")

    @property
    def display_url(self) -> str:
        return redact_url(self.url)

    # -- schema -----------------------------------------------------------------------------
    def init(self) -> None:
        """Create or upgrade the schema (idempotent)."""
        with db.translated(self.url, "initialising the store"):
            db.migrate(self.engine)

    def ensure_initialised(self) -> None:
        with db.translated(self.url, "opening the store"):
            if not db.is_initialised(self.engine):
                raise PermanentError(
                    f"the store at {self.display_url} is not initialised",
                    hint="run `delta-mirror init` first",
                )

    def close(self) -> None:
        self.engine.dispose()

    # -- tables -----------------------------------------------------------------------------
    def create_table(
        self,
        name: str,
        location: str,
        *,
        table_uuid: str | None = None,
        first_version: int = 0,
        base_checkpoint_version: int | None = None,
        checkpoint_kind: str = "classic",
        checkpoint_part_size: int | None = None,
        settings: dict[str, Any] | None = None,
        conn: Connection | None = None,
    ) -> TableInfo:
        check_table_name(name)
        with db.translated(self.url, f"creating table '{name}'"):
            if conn is not None:
                self._check_location(conn, name, location)
            else:
                with self.reader.connect() as c:
                    self._check_location(c, name, location)
        values = {
            "name": name,
            "location": location,
            "table_uuid": table_uuid or str(uuid.uuid4()),
            "state": "ACTIVE",
            "first_version": first_version,
            "base_checkpoint_version": base_checkpoint_version,
            "checkpoint_kind": checkpoint_kind,
            "checkpoint_part_size": checkpoint_part_size,
            "settings": json.dumps(settings or {}),
            "created_at": now_ms(),
        }
        with db.translated(self.url, f"creating table '{name}'"):
            try:
                if conn is not None:
                    conn.execute(insert(dl_tables).values(**values))
                    return self._get_table(conn, name)
                with self.engine.begin() as c:
                    c.execute(insert(dl_tables).values(**values))
                    return self._get_table(c, name)
            except IntegrityError:
                raise TableExistsError(
                    f"a table named '{name}' already exists",
                    table=name,
                    hint="choose another --table name, or drop the existing one",
                ) from None

    @staticmethod
    def _check_location(conn: Connection, name: str, location: str) -> None:
        """A table root is no ``_delta_log/`` folder, and neither holds nor sits inside another table."""
        from urllib.parse import unquote, urlparse

        parsed = urlparse(location)
        segments = [unquote(p) for p in parsed.path.split("/") if p]
        if "_delta_log" in segments or ".." in segments:
            raise PermanentError(
                f"location {location} is inside a _delta_log/ folder or has '..' in it",
                table=name,
                hint="use the table's root folder (the one that holds _delta_log/)",
            )
        mine = location.rstrip("/") + "/"
        rows = conn.execute(select(dl_tables.c.name, dl_tables.c.location).where(dl_tables.c.name != name))
        for other, where in rows:
            theirs = str(where).rstrip("/") + "/"
            if mine.startswith(theirs) or theirs.startswith(mine):
                raise PermanentError(
                    f"location {location} overlaps table '{other}' at {where}",
                    table=name,
                    hint="every table needs its own root folder, outside every other table's",
                )

    def _get_table(self, conn: Connection, name: str) -> TableInfo:
        row = conn.execute(select(dl_tables).where(dl_tables.c.name == name)).first()
        if row is None:
            raise TableNotFoundError(
                f"no table named '{name}' in the store",
                table=name,
                hint="list tables with `delta-mirror status`, or create it with import/commit",
            )
        return _table_info(row)

    def get_table(self, name: str) -> TableInfo:
        check_table_name(name)
        with db.translated(self.url, f"reading table '{name}'"), self.reader.connect() as conn:
            return self._get_table(conn, name)

    def list_tables(self) -> list[TableInfo]:
        with db.translated(self.url, "listing tables"), self.reader.connect() as conn:
            return [_table_info(r) for r in conn.execute(select(dl_tables).order_by(dl_tables.c.name))]

    def update_table(self, table_id: int, **values: Any) -> None:
        if "settings" in values and not isinstance(values["settings"], str):
            values["settings"] = json.dumps(values["settings"])
        with db.translated(self.url, "updating a table"), self.engine.begin() as conn:
            conn.execute(update(dl_tables).where(dl_tables.c.id == table_id).values(**values))

    def halt_table(self, table_id: int, reason: str, version: int | None) -> None:
        self.update_table(table_id, state="HALTED", halted_reason=reason, halted_version=version)

    def resume_table(self, table_id: int) -> None:
        self.update_table(table_id, state="ACTIVE", halted_reason=None, halted_version=None)

    def delete_table(self, table_id: int) -> None:
        """Forget a table (its published files stay where they are)."""
        with db.translated(self.url, "dropping a table"), self.engine.begin() as conn:
            for t in (dl_lag_samples, dl_mirror_status, dl_files, dl_actions, dl_commits):
                conn.execute(delete(t).where(t.c.table_id == table_id))
            conn.execute(delete(dl_tables).where(dl_tables.c.id == table_id))

    # -- leases -----------------------------------------------------------------------------
    def acquire_lease(self, table_id: int, owner: str, ttl_seconds: float) -> bool:
        """Take (or renew) the table's publisher lease; False when another live owner holds it."""
        now = now_ms()
        with db.translated(self.url, "taking the publisher lease"), self.engine.begin() as conn:
            result = conn.execute(
                update(dl_tables)
                .where(dl_tables.c.id == table_id)
                .where(
                    or_(
                        dl_tables.c.lease_owner.is_(None),
                        dl_tables.c.lease_expires_at < now,
                        dl_tables.c.lease_owner == owner,
                    )
                )
                .values(lease_owner=owner, lease_expires_at=now + int(ttl_seconds * 1000))
            )
            return bool(result.rowcount == 1)

    def release_lease(self, table_id: int, owner: str) -> None:
        with db.translated(self.url, "releasing the publisher lease"), self.engine.begin() as conn:
            conn.execute(
                update(dl_tables)
                .where(dl_tables.c.id == table_id, dl_tables.c.lease_owner == owner)
                .values(lease_owner=None, lease_expires_at=None)
            )

    # -- commits ----------------------------------------------------------------------------
    def latest_version(self, table_id: int, conn: Connection | None = None) -> int | None:
        q = select(func.max(dl_commits.c.version)).where(dl_commits.c.table_id == table_id)
        if conn is not None:
            value = conn.execute(q).scalar()
        else:
            with db.translated(self.url, "reading the latest version"), self.reader.connect() as c:
                value = c.execute(q).scalar()
        return None if value is None else int(value)

    def commit(
        self,
        name: str,
        actions: Sequence[Action],
        *,
        expected_version: int | None = None,
        operation: str | None = None,
        location: str | None = None,
    ) -> int:
        """Commit native actions as the next version; returns it.

        Raises ``CommitConflictError`` when another writer took ``expected_version``, ``DataError``
        for invalid actions or a version gap. Nothing is written unless everything is valid.
        Without ``expected_version`` a writer that loses a race re-validates its actions and takes
        the next free version (SQLite queues writers, PostgreSQL lets them race: both behave alike).
        ``location`` creates the table there when it does not exist, in the same transaction.
        """
        check_table_name(name)
        _check_commit_size(name, expected_version, len(actions), 0)
        attempts = 1 if expected_version is not None else _NEXT_VERSION_ATTEMPTS
        for attempt in range(1, attempts + 1):
            try:
                return self._commit_once(name, actions, expected_version, operation, location)
            except CommitConflictError:
                if attempt >= attempts:
                    raise
        raise AssertionError("unreachable")

    def _commit_once(
        self,
        name: str,
        actions: Sequence[Action],
        expected_version: int | None,
        operation: str | None,
        location: str | None,
    ) -> int:
        with db.translated(self.url, f"committing to table '{name}'"):
            try:
                with self.engine.begin() as conn:
                    try:
                        table = self._get_table(conn, name)
                    except TableNotFoundError:
                        if location is None:
                            raise
                        table = self._create_in(conn, name, location, expected_version)
                    else:
                        if location is not None and location.rstrip("/") != table.location.rstrip("/"):
                            raise PermanentError(
                                f"the table is at {table.location}, not {location}",
                                table=name,
                                hint="drop --location, or commit to a new table name",
                            )
                    return self._commit(conn, table, actions, expected_version, operation)
            except IntegrityError as exc:
                if db.is_unique_violation(exc):
                    raise _version_taken(name, expected_version) from None
                raise

    def _create_in(
        self, conn: Connection, name: str, location: str, expected_version: int | None
    ) -> TableInfo:
        try:
            return self.create_table(name, location, conn=conn)
        except TableExistsError:
            raise CommitConflictError(
                "another writer created the table first",
                table=name,
                version=expected_version or 0,
                hint="commit again: the table exists now",
            ) from None

    # -- verbatim commits (a writer's exact commit file, e.g. Delta-Spark through the commit service) --
    def table_at(self, location: str) -> TableInfo:
        """The table whose root is ``location`` (normalised, see ``storage.normalize_commit_root``)."""
        with db.translated(self.url, f"looking up the table at {location}"), self.reader.connect() as conn:
            return self._table_at(conn, location)

    @staticmethod
    def _table_at(conn: Connection, location: str) -> TableInfo:
        return SqlStore._table_and_latest_at(conn, location)[0]

    @staticmethod
    def _table_and_latest_at(conn: Connection, location: str) -> tuple[TableInfo, int | None]:
        """The table at ``location`` and its latest version, in one round trip."""
        latest = (
            select(func.max(dl_commits.c.version))
            .where(dl_commits.c.table_id == dl_tables.c.id)
            .scalar_subquery()
            .label("latest_version")
        )
        row = conn.execute(select(dl_tables, latest).where(dl_tables.c.location == location)).first()
        if row is None:
            raise TableNotFoundError(
                f"no table at {location} in the store",
                hint="create it with version 0 under an allowed root, or import it with `delta-mirror import`",
            )
        return _table_info(row), None if row.latest_version is None else int(row.latest_version)

    def commit_verbatim(
        self, location: str, version: int, data: bytes, *, create_name: str | None = None
    ) -> CommitResult:
        """Commit a writer's exact commit file as ``version`` of the table at ``location``.

        The bytes are kept as they are (lines stored verbatim, no key reordering, no commitInfo
        added): the published ``<version>.json`` is ``data`` byte for byte. The native commit rules
        apply (``_check_commit_rules``, the size limits). ``version`` already holding ``data`` is
        returned with ``existing=True`` (a retry after a lost answer); holding other bytes it is a
        ``CommitConflictError``; beyond the next version a ``DataError`` (a gap). A halted table
        refuses (``TableHaltedError``). With ``create_name``, version 0 of an unknown location
        creates the table in the same transaction, named ``create_name``, or ``create_name-<first 8
        hex digits of SHA-256(location)>`` when that name is taken.

        The common commit (a table seen before at this root, the next version, no remove and no
        protocol change) takes ``_commit_verbatim_fast``: one statement on PostgreSQL. Anything
        else, or anything that statement finds changed, takes the transaction path below, which
        decides every refusal in its usual order.
        """
        label = create_name or location
        lines, actions = split_commit(data, table=label, version=version)
        _check_commit_size(label, version, len(actions), len(data))
        commit = _Verbatim(
            location,
            version,
            data,
            lines,
            actions,
            hashlib.sha256(data).hexdigest(),
            next((body for kind, body in actions if kind == "commitInfo"), {}).get("inCommitTimestamp"),
        )
        try:
            with self._sqlite_writes or contextlib.nullcontext():
                known = self._verbatim_tables.get(location)
                if known is not None and self._fast_path_applies(known, commit):
                    done = self._commit_verbatim_fast(known, commit)
                    if done is not None:
                        return done
                return self._commit_verbatim_in_transaction(commit, create_name)
        except CommitConflictError:
            # A racing retry of the same bytes may have won: that is this commit, already done.
            existing = self._existing_commit(location, version)
            if existing is not None and existing.sha256 == commit.sha256 and existing.size == len(data):
                return existing
            raise

    def _commit_verbatim_in_transaction(self, commit: _Verbatim, create_name: str | None) -> CommitResult:
        location, version, data, actions = commit.location, commit.version, commit.data, commit.actions
        try:
            with (
                db.translated(self.url, f"committing to the table at {location}"),
                self.engine.begin() as conn,
            ):
                table, latest = self._verbatim_table(conn, location, version, create_name)
                self._check_verbatim_version(table, latest, version)
                ts = self._claim_version(
                    conn,
                    table,
                    version,
                    "spark",
                    action_count=len(actions),
                    size=len(data),
                    sha256=commit.sha256,
                    in_commit_timestamp=commit.ict,
                )
                self._check_commit_rules(conn, table, version, actions)
                self._write_actions(
                    conn,
                    table.id,
                    version,
                    PART_COMMIT,
                    actions,
                    strict=True,
                    table_name=table.name,
                    location=table.location,
                    lines=commit.lines,
                )
                _enqueue_json(conn, table.id, version, ts)
        except TableNotFoundError:
            self._verbatim_tables.pop(location, None)
            raise
        if len(self._verbatim_tables) >= _KNOWN_ROOTS:
            self._verbatim_tables.clear()
        self._verbatim_tables[location] = table
        return CommitResult(table.name, version, commit.sha256, len(data))

    def _fast_path_applies(self, table: TableInfo, commit: _Verbatim) -> bool:
        """No rule that reads the store (removes, a protocol after the first version), and every
        other rule passes for the table as last seen (the statement checks it still is)."""
        version = commit.version
        if any(
            k == "remove" or (k == "protocol" and version > table.first_version) for k, _ in commit.actions
        ):
            return False
        try:
            self._check_commit_rules(None, table, version, commit.actions)
        except MirrorError:
            return False  # refused by the transaction path, in the order it decides refusals
        return True

    def _commit_verbatim_fast(self, table: TableInfo, commit: _Verbatim) -> CommitResult | None:
        """Claim the version and write the commit in one statement (PostgreSQL; on SQLite one short
        transaction), valid only while the table is still ``table`` (same id, name, root, first
        version and base checkpoint, not halted) and ``commit.version`` is its next version; else
        nothing is written and None tells the caller to take the transaction path.

        The same rows as the transaction path: the ``dl_commits`` row (whose primary key decides a
        race: ``CommitConflictError``), the actions, the file index (a re-added (path, deletion
        vector) supersedes the active entry), the ``PENDING`` status row.
        """
        version = commit.version
        adds, _ = _file_rows(table.id, version, PART_COMMIT, commit.actions)
        params: dict[str, Any] = {
            "tid": table.id,
            "loc": table.location,
            "name": table.name,
            "fv": table.first_version,
            "bcv": table.base_checkpoint_version,
            "v": version,
            "ts": now_ms(),
            "ict": commit.ict,
            "n": len(commit.actions),
            "size": len(commit.data),
            "sha": commit.sha256,
            "part": PART_COMMIT,
        }
        with db.translated(self.url, f"committing to the table at {table.location}"):
            try:
                if self._sqlite_writes is None:
                    params.update(
                        a_seq=list(range(len(commit.actions))),
                        a_kind=[k for k, _ in commit.actions],
                        a_payload=list(commit.lines),
                        f_path=[a["path"] for a in adds],
                        f_dv=[a["dv_id"] for a in adds],
                        f_seq=[a["add_seq"] for a in adds],
                        f_size=[a["size"] for a in adds],
                        f_pv=[a["partition_values"] for a in adds],
                    )
                    with self._autocommit.connect() as conn:
                        claimed = conn.exec_driver_sql(_PG_VERBATIM_COMMIT, params).scalar()
                else:
                    claimed = self._commit_verbatim_sqlite(params, commit, adds)
            except IntegrityError as exc:  # here, not in ``translated``: a lost race is no database error
                if not db.is_unique_violation(exc):
                    raise
                raise _version_taken(table.name, version) from None
        if not claimed:
            return None
        return CommitResult(table.name, version, commit.sha256, len(commit.data))

    def _commit_verbatim_sqlite(
        self, params: dict[str, Any], commit: _Verbatim, adds: list[dict[str, Any]]
    ) -> bool:
        with self.engine.begin() as conn:
            if conn.exec_driver_sql(_SQLITE_VERBATIM_CLAIM, params).rowcount != 1:
                return False
            tid, version = params["tid"], params["v"]
            conn.exec_driver_sql(
                "INSERT INTO dl_actions (table_id, version, part, seq, action_type, payload)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                [
                    (tid, version, PART_COMMIT, seq, kind, line)
                    for seq, ((kind, _), line) in enumerate(zip(commit.actions, commit.lines, strict=True))
                ],
            )
            if adds and version > 0:
                conn.exec_driver_sql(
                    "UPDATE dl_files SET remove_version = ? WHERE table_id = ? AND path = ? AND dv_id = ?"
                    " AND remove_version IS NULL",
                    [(version, tid, a["path"], a["dv_id"]) for a in adds],
                )
            if adds:
                conn.exec_driver_sql(
                    "INSERT INTO dl_files (table_id, path, dv_id, add_version, add_part, add_seq, size,"
                    " partition_values) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    [
                        (
                            tid,
                            a["path"],
                            a["dv_id"],
                            version,
                            PART_COMMIT,
                            a["add_seq"],
                            a["size"],
                            a["partition_values"],
                        )
                        for a in adds
                    ],
                )
            conn.exec_driver_sql(
                "INSERT INTO dl_mirror_status (table_id, version, artifact, state, attempts, enqueued_at)"
                " VALUES (?, ?, 'json', 'PENDING', 0, ?)",
                (tid, version, params["ts"]),
            )
            return True

    def _verbatim_table(
        self, conn: Connection, location: str, version: int, create_name: str | None
    ) -> tuple[TableInfo, int | None]:
        """The table at ``location`` (created at version 0 with ``create_name``) and its latest version."""
        try:
            table, latest = self._table_and_latest_at(conn, location)
        except TableNotFoundError as exc:
            if create_name is None or version != 0:
                exc.version = version
                raise
            return self._create_verbatim(conn, location, create_name), None
        if table.state == "HALTED":
            raise TableHaltedError(
                f"the table is halted{f' at version {table.halted_version}' if table.halted_version is not None else ''}:"
                f" {table.halted_reason or 'no reason recorded'}",
                table=table.name,
                version=version,
                hint=f"fix the cause, then `delta-mirror resume {table.name}`",
            )
        return table, latest

    def _create_verbatim(self, conn: Connection, location: str, create_name: str) -> TableInfo:
        name = create_name
        taken = conn.execute(select(dl_tables.c.id).where(dl_tables.c.name == name)).first()
        if taken is not None:
            name = f"{create_name[:119]}-{hashlib.sha256(location.encode()).hexdigest()[:8]}"
        check_table_name(name)
        try:
            self._check_location(conn, name, location)
        except PermanentError as exc:  # the writer's root is the input here: refuse it as data
            raise InvalidActionError(exc.what, table=name, version=0, hint=exc.hint) from None
        return self._create_in(conn, name, location, 0)

    @staticmethod
    def _check_verbatim_version(table: TableInfo, latest: int | None, version: int) -> None:
        """Before claiming: an earlier version is a conflict (or this very commit), a later one a gap."""
        next_version = table.first_version if latest is None else latest + 1
        if version < next_version:
            raise CommitConflictError(
                f"version {version} is already committed (latest is {latest})",
                table=table.name,
                version=version,
                hint=f"re-read the log and commit as version {next_version}",
            )
        if version > next_version:
            raise DataError(
                f"version gap: the store's next version is {next_version}, not {version}; a writer may have"
                f" written _delta_log/{version - 1:020d}.json outside the authority",
                table=table.name,
                version=version,
                hint=f"run `delta-mirror reconcile {table.name} --strategy full`",
            )

    def _existing_commit(self, location: str, version: int) -> CommitResult | None:
        with db.translated(self.url, "reading a commit"), self.reader.connect() as conn:
            row = conn.execute(
                select(dl_tables.c.name, dl_commits.c.sha256, dl_commits.c.size_bytes)
                .select_from(dl_commits.join(dl_tables, dl_tables.c.id == dl_commits.c.table_id))
                .where(
                    dl_tables.c.location == location, dl_commits.c.version == version, dl_commits.c.has_json
                )
            ).first()
        return (
            None
            if row is None
            else CommitResult(row.name, version, row.sha256, row.size_bytes, existing=True)
        )

    def _commit(
        self,
        conn: Connection,
        table: TableInfo,
        actions: Sequence[Action],
        expected_version: int | None,
        operation: str | None,
    ) -> int:
        latest = self.latest_version(table.id, conn)
        next_version = table.first_version if latest is None else latest + 1
        version = next_version if expected_version is None else expected_version
        name = table.name
        if version < next_version:
            raise CommitConflictError(
                f"version {version} is already committed (latest is {latest})",
                table=name,
                version=version,
                hint=f"commit as version {next_version}",
            )
        if version > next_version:
            raise DataError(
                f"version gap: the next version is {next_version}, not {version}",
                table=name,
                version=version,
                hint="versions must be contiguous; omit the expected version",
            )
        ts = self._claim_version(conn, table, version, "native")
        ordered = self._validate_native(conn, table, version, actions)
        ordered = self._with_commit_info(conn, table, version, ordered, ts, operation)
        self._write_actions(
            conn,
            table.id,
            version,
            PART_COMMIT,
            ordered,
            strict=True,
            table_name=name,
            location=table.location,
        )
        lines = [canonical_line(k, b) for k, b in ordered]
        data = render_commit(lines)
        _check_commit_size(name, version, len(ordered), len(data))
        ict = ordered[0][1].get("inCommitTimestamp") if ordered[0][0] == "commitInfo" else None
        conn.execute(
            update(dl_commits)
            .where(dl_commits.c.table_id == table.id, dl_commits.c.version == version)
            .values(
                action_count=len(ordered),
                size_bytes=len(data),
                sha256=hashlib.sha256(data).hexdigest(),
                in_commit_timestamp=ict,
            )
        )
        _enqueue_json(conn, table.id, version, ts)
        return version

    def _claim_version(
        self,
        conn: Connection,
        table: TableInfo,
        version: int,
        source: str,
        *,
        action_count: int = 0,
        size: int = 0,
        sha256: str = "",
        in_commit_timestamp: int | None = None,
    ) -> int:
        """Insert the version's ``dl_commits`` row first: a racing writer fails here, before any other
        work (its primary key decides). A native commit fills in hash and size once its actions are
        rendered; a verbatim one knows them up front."""
        ts = now_ms()
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
                    has_json=True,
                    source=source,
                )
            )
        except IntegrityError as exc:
            if not db.is_unique_violation(exc):
                raise
            raise _version_taken(table.name, version) from None
        return ts

    def _validate_native(
        self, conn: Connection, table: TableInfo, version: int, actions: Sequence[Action]
    ) -> list[Action]:
        """The commit rules, then Delta-Spark key order for the actions we store."""
        self._check_commit_rules(conn, table, version, actions)
        return [(kind, spark_ordered(kind, body)) for kind, body in actions]

    def _check_commit_rules(
        self, conn: Connection | None, table: TableInfo, version: int, actions: Sequence[Action]
    ) -> None:
        """Every writer's commit obeys these (native and verbatim alike); nothing is changed here.

        Each action passes ``validate_action`` (paths inside the root); at most one metaData,
        protocol and commitInfo, each file added or removed once; a table's first commit has
        protocol and metaData; no refused feature or ``delta.coordinatedCommits.*`` property; no
        protocol downgrade; removes name active (path, deletion vector) files. Only the last two read
        the store (``conn``): without one, a commit that needs them is a caller's bug.
        """
        name = table.name
        counts: dict[str, int] = {}
        seen: dict[str, set[tuple[str, str]]] = {"add": set(), "remove": set()}
        for number, (kind, body) in enumerate(actions, start=1):
            validate_action(kind, body, number=number, table=name, version=version, location=table.location)
            counts[kind] = counts.get(kind, 0) + 1
            if kind in seen:
                key = (body["path"], dv_id(body.get("deletionVector")))
                if key in seen[kind]:
                    raise InvalidActionError(
                        f"action {number}: duplicate {kind} of '{key[0]}' in one commit",
                        table=name,
                        version=version,
                        hint=f"{kind} each file once per commit",
                    )
                seen[kind].add(key)
        for kind in ("metaData", "protocol", "commitInfo"):
            if counts.get(kind, 0) > 1:
                raise InvalidActionError(
                    f"{counts[kind]} '{kind}' actions in one commit (at most one allowed)",
                    table=name,
                    version=version,
                    hint=f"merge them into a single {kind}",
                )
        if version == table.first_version and table.base_checkpoint_version is None:
            for kind in ("protocol", "metaData"):
                if kind not in counts:
                    raise InvalidActionError(
                        f"the first commit of a table needs a '{kind}' action",
                        table=name,
                        version=version,
                        hint="add protocol and metaData to version 0",
                    )
        for kind, body in actions:
            if kind == "protocol" and version > table.first_version:
                assert conn is not None
                self._check_no_downgrade(conn, table, version, body, actions)
            if kind == "protocol":
                features = set(body.get("readerFeatures") or []) | set(body.get("writerFeatures") or [])
                for refused in REFUSED_FEATURES:
                    if refused in features:
                        raise InvalidActionError(
                            f"protocol feature '{refused}' is not allowed",
                            table=name,
                            version=version,
                            hint="it would make the table unreadable to plain filesystem readers",
                        )
            if kind == "metaData":
                for key in body.get("configuration") or {}:
                    if key.startswith("delta.coordinatedCommits."):
                        raise InvalidActionError(
                            f"table property '{key}' is not allowed",
                            table=name,
                            version=version,
                            hint="the store already coordinates commits",
                        )
        removes = [(b["path"], dv_id(b.get("deletionVector"))) for k, b in actions if k == "remove"]
        if removes:
            assert conn is not None
            active = self._active_keys(conn, table.id, [p for p, _ in removes])
            for path, dv in removes:
                if (path, dv) not in active:
                    raise InvalidActionError(
                        f"remove of '{path}'"
                        + (f" (deletion vector {dv})" if dv else "")
                        + " which is not an active file",
                        table=name,
                        version=version,
                        hint="remove only files that are in the table (same path text and deletion vector)",
                    )

    def _check_no_downgrade(
        self,
        conn: Connection,
        table: TableInfo,
        version: int,
        protocol: dict[str, Any],
        actions: Sequence[Action],
    ) -> None:
        """Protocol versions only go down through DROP FEATURE (as Delta-Spark allows), never by accident."""
        info = next((b for k, b in actions if k == "commitInfo"), {})
        if info.get("operation") == "DROP FEATURE":
            return
        prev = self._latest_action(conn, table.id, "protocol", version - 1)
        if prev is None:
            return
        old = json.loads(prev)["protocol"]
        for key in ("minReaderVersion", "minWriterVersion"):
            if isinstance(old.get(key), int) and protocol[key] < old[key]:
                raise InvalidActionError(
                    f"protocol downgrade: {key} {old[key]} -> {protocol[key]}",
                    table=table.name,
                    version=version,
                    hint="protocols only go up; a feature is removed with a commitInfo operation 'DROP FEATURE'",
                )

    def _active_keys(self, conn: Connection, table_id: int, paths: Sequence[str]) -> set[tuple[str, str]]:
        out: set[tuple[str, str]] = set()
        unique = sorted(set(paths))
        for i in range(0, len(unique), _CHUNK):
            chunk = unique[i : i + _CHUNK]
            rows = conn.execute(
                select(dl_files.c.path, dl_files.c.dv_id).where(
                    dl_files.c.table_id == table_id,
                    dl_files.c.remove_version.is_(None),
                    dl_files.c.path.in_(chunk),
                )
            )
            out.update((r.path, r.dv_id) for r in rows)
        return out

    def _latest_action(self, conn: Connection, table_id: int, kind: str, version: int) -> str | None:
        row = conn.execute(
            select(dl_actions.c.payload)
            .where(
                dl_actions.c.table_id == table_id,
                dl_actions.c.action_type == kind,
                dl_actions.c.version <= version,
            )
            .order_by(dl_actions.c.version.desc(), dl_actions.c.part.desc(), dl_actions.c.seq.desc())
            .limit(1)
        ).first()
        return None if row is None else str(row.payload)

    def _with_commit_info(
        self,
        conn: Connection,
        table: TableInfo,
        version: int,
        actions: list[Action],
        ts: int,
        operation: str | None,
    ) -> list[Action]:
        """Put ``commitInfo`` first (Delta-Spark does), creating it when the writer gave none."""
        info = next((b for k, b in actions if k == "commitInfo"), None)
        rest = [(k, b) for k, b in actions if k != "commitInfo"]
        if info is None:
            kinds = {k for k, _ in rest}
            op = operation or (
                "CREATE TABLE"
                if "metaData" in kinds and version == table.first_version
                else "DELETE"
                if kinds == {"remove"}
                else "WRITE"
            )
            info = {"timestamp": ts, "operation": op, "operationParameters": {}}
            if version > 0:
                info["readVersion"] = version - 1
            info["isolationLevel"] = "Serializable"
            info["isBlindAppend"] = "remove" not in kinds
            info["engineInfo"] = ENGINE_INFO
            info["txnId"] = str(uuid.uuid4())
        metadata = next((b for k, b in rest if k == "metaData"), None)
        if metadata is None:
            prev = self._latest_action(conn, table.id, "metaData", version - 1)
            metadata = json.loads(prev)["metaData"] if prev else {}
        if (metadata.get("configuration") or {}).get("delta.enableInCommitTimestamps") == "true":
            prev_ict = conn.execute(
                select(func.max(dl_commits.c.in_commit_timestamp)).where(dl_commits.c.table_id == table.id)
            ).scalar()
            ict = max(int(info.get("timestamp", ts)), int(prev_ict or 0) + 1)
            info = {"inCommitTimestamp": ict, **{k: v for k, v in info.items() if k != "inCommitTimestamp"}}
        return [("commitInfo", spark_ordered("commitInfo", info)), *rest]

    def _write_actions(
        self,
        conn: Connection,
        table_id: int,
        version: int,
        part: int,
        actions: Sequence[Action],
        *,
        strict: bool,
        table_name: str,
        location: str | None,
        lines: Sequence[str] | None = None,
    ) -> None:
        """Insert action rows and maintain the file index (adds, removes, superseded re-adds)."""
        if lines is None:
            lines = [canonical_line(k, b) for k, b in actions]
        _insert_action_rows(conn, table_id, version, part, actions, lines)
        adds, removes = _file_rows(table_id, version, part, actions)
        # A re-added (path, dv) supersedes the active entry (e.g. recomputed stats); no tombstone.
        if adds and version > 0:
            active = self._active_keys(conn, table_id, [a["path"] for a in adds])
            superseded = [
                {"p": a["path"], "d": a["dv_id"]} for a in adds if (a["path"], a["dv_id"]) in active
            ]
            if superseded:
                conn.execute(
                    update(dl_files)
                    .where(
                        dl_files.c.table_id == table_id,
                        dl_files.c.path == _bind("p"),
                        dl_files.c.dv_id == _bind("d"),
                        dl_files.c.remove_version.is_(None),
                    )
                    .values(remove_version=version),
                    superseded,
                )
        if removes:
            params = []
            for seq, body in removes:
                params.append(
                    {
                        "p": body.get("path", ""),
                        "d": dv_id(body.get("deletionVector")),
                        "rv": version,
                        "rp": part,
                        "rs": seq,
                        "dt": body.get("deletionTimestamp")
                        if isinstance(body.get("deletionTimestamp"), int)
                        else None,
                    }
                )
            result_counts = 0
            stmt = (
                update(dl_files)
                .where(
                    dl_files.c.table_id == table_id,
                    dl_files.c.path == _bind("p"),
                    dl_files.c.dv_id == _bind("d"),
                    dl_files.c.remove_version.is_(None),
                )
                .values(
                    remove_version=_bind("rv"),
                    remove_part=_bind("rp"),
                    remove_seq=_bind("rs"),
                    deletion_timestamp=_bind("dt"),
                )
            )
            result = conn.execute(stmt, params)
            result_counts = result.rowcount if result.rowcount is not None else -1
            if result_counts != len(params) and not strict:
                # Imported logs may remove files this segment never saw added (the remove is a
                # tombstone only): keep it as a tombstone row so checkpoints still carry it.
                known = self._tombstone_keys(conn, table_id, version, [p["p"] for p in params])
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
        if adds:
            conn.execute(insert(dl_files), adds)

    def _tombstone_keys(
        self, conn: Connection, table_id: int, version: int, paths: Sequence[str]
    ) -> set[tuple[str, str]]:
        out: set[tuple[str, str]] = set()
        unique = sorted(set(paths))
        for i in range(0, len(unique), _CHUNK):
            rows = conn.execute(
                select(dl_files.c.path, dl_files.c.dv_id).where(
                    dl_files.c.table_id == table_id,
                    dl_files.c.remove_version == version,
                    dl_files.c.path.in_(unique[i : i + _CHUNK]),
                )
            )
            out.update((r.path, r.dv_id) for r in rows)
        return out

    def refresh_statistics(self, conn: Connection) -> None:
        """Let PostgreSQL's planner see rows inserted earlier in this transaction.

        A large import fills ``dl_files`` inside one transaction; with the planner's empty-table
        estimates every later lookup (re-adds, removes) becomes a sequential scan: quadratic.
        """
        if self.engine.dialect.name == "postgresql":
            conn.exec_driver_sql("ANALYZE dl_files")
            conn.exec_driver_sql("ANALYZE dl_actions")

    def import_version(
        self,
        conn: Connection,
        table: TableInfo,
        version: int,
        actions: Sequence[Action],
        lines: Sequence[str],
        *,
        part: int = PART_COMMIT,
        has_json: bool = True,
        committed_at: int | None = None,
        published_sha256: str | None = None,
        published_size: int | None = None,
        index_files: bool = True,
    ) -> None:
        """Record one imported version (in the caller's transaction); actions are kept as they were.

        ``index_files=False`` stores a commit whose effect is already in the base snapshot.
        ``published_sha256`` marks the version as already present at the location (in-place import).
        """
        ts = committed_at or now_ms()
        if part == PART_COMMIT:
            data = render_commit(lines)
            ict = None
            if actions and actions[0][0] == "commitInfo":
                raw = actions[0][1].get("inCommitTimestamp")
                ict = raw if isinstance(raw, int) else None
            conn.execute(
                insert(dl_commits).values(
                    table_id=table.id,
                    version=version,
                    committed_at=ts,
                    in_commit_timestamp=ict,
                    action_count=len(actions),
                    size_bytes=len(data) if has_json else 0,
                    sha256=hashlib.sha256(data).hexdigest() if has_json else "",
                    has_json=has_json,
                    source="import",
                )
            )
            if has_json:
                done = published_sha256 is not None
                conn.execute(
                    insert(dl_mirror_status).values(
                        table_id=table.id,
                        version=version,
                        artifact="json",
                        state="SUCCESS" if done else "PENDING",
                        attempts=0,
                        enqueued_at=ts,
                        finished_at=ts if done else None,
                        sha256=published_sha256,
                        size_bytes=published_size,
                    )
                )
        if index_files:
            self._write_actions(
                conn,
                table.id,
                version,
                part,
                actions,
                strict=False,
                table_name=table.name,
                location=table.location,
                lines=lines,
            )
        else:
            _insert_action_rows(conn, table.id, version, part, actions, lines)

    # -- reading ------------------------------------------------------------------------------
    def commit_rows(self, table_id: int, from_version: int, to_version: int) -> list[CommitRow]:
        with db.translated(self.url, "reading commits"), self.reader.connect() as conn:
            rows = conn.execute(
                select(
                    dl_commits.c.version,
                    dl_commits.c.sha256,
                    dl_commits.c.size_bytes,
                    dl_commits.c.has_json,
                    dl_commits.c.committed_at,
                    dl_commits.c.source,
                )
                .where(
                    dl_commits.c.table_id == table_id,
                    dl_commits.c.version >= from_version,
                    dl_commits.c.version <= to_version,
                )
                .order_by(dl_commits.c.version)
            )
            return [
                CommitRow(r.version, r.sha256, r.size_bytes, bool(r.has_json), r.committed_at, r.source)
                for r in rows
            ]

    def commit_lines(self, table_id: int, from_version: int, to_version: int) -> dict[int, list[str]]:
        """Canonical lines of the commits in [from, to], by version (one query for a batch)."""
        out: dict[int, list[str]] = {}
        if self.engine.dialect.name == "postgresql":
            # One row per version: the server joins the lines (payloads hold no raw newline).
            q = text(
                "SELECT version, string_agg(payload, E'\\n' ORDER BY seq) FROM dl_actions "
                "WHERE table_id = :t AND part = :p AND version BETWEEN :lo AND :hi GROUP BY version"
            )
            with db.translated(self.url, "reading actions"), self.reader.connect() as conn:
                params = {"t": table_id, "p": PART_COMMIT, "lo": from_version, "hi": to_version}
                return {int(v): str(joined).split("\n") for v, joined in conn.execute(q, params)}
        with db.translated(self.url, "reading actions"), self.reader.connect() as conn:
            rows = conn.execute(
                select(dl_actions.c.version, dl_actions.c.payload)
                .where(
                    dl_actions.c.table_id == table_id,
                    dl_actions.c.part == PART_COMMIT,
                    dl_actions.c.version >= from_version,
                    dl_actions.c.version <= to_version,
                )
                .order_by(dl_actions.c.version, dl_actions.c.seq)
            )
            for r in rows:
                out.setdefault(int(r.version), []).append(str(r.payload))
        return out

    def commit_bytes(self, table_id: int, version: int) -> bytes:
        return render_commit(self.commit_lines(table_id, version, version).get(version, []))

    def snapshot(self, table_id: int, version: int) -> Snapshot:
        """Protocol, metadata, txn and domain metadata at ``version`` (files are streamed apart)."""
        with db.translated(self.url, "reading a snapshot"), self.reader.connect() as conn:
            protocol = self._latest_action(conn, table_id, "protocol", version)
            metadata = self._latest_action(conn, table_id, "metaData", version)
            if protocol is None or metadata is None:
                raise DataError(
                    "no protocol or metaData at or before this version",
                    version=version,
                    hint="the table's log is incomplete; re-import it",
                )
            txns: dict[str, str] = {}
            domains: dict[str, tuple[str, bool]] = {}
            rows = conn.execute(
                select(dl_actions.c.action_type, dl_actions.c.payload)
                .where(
                    dl_actions.c.table_id == table_id,
                    dl_actions.c.action_type.in_(("txn", "domainMetadata")),
                    dl_actions.c.version <= version,
                )
                .order_by(dl_actions.c.version, dl_actions.c.part, dl_actions.c.seq)
            )
            for r in rows:
                body = json.loads(r.payload)
                if r.action_type == "txn":
                    txns[str(body["txn"].get("appId"))] = str(r.payload)
                else:
                    dm = body["domainMetadata"]
                    domains[str(dm.get("domain"))] = (str(r.payload), bool(dm.get("removed")))
            return Snapshot(
                version,
                protocol,
                metadata,
                list(txns.values()),
                [p for p, removed in domains.values() if not removed],
            )

    def _active_where(self, table_id: int, version: int) -> Any:
        return and_(
            dl_files.c.table_id == table_id,
            dl_files.c.add_version.is_not(None),
            dl_files.c.add_version <= version,
            or_(dl_files.c.remove_version.is_(None), dl_files.c.remove_version > version),
        )

    def _file_payload_query(self, side: str, where: str) -> Any:
        """Payloads of ``dl_files`` rows joined to their action by primary key.

        ``dl_files`` must drive the join (O(active files), not O(history)): SQLite's planner would
        otherwise scan every action of the table; CROSS JOIN fixes the order there (PostgreSQL's
        planner still chooses freely).
        """
        return text(
            "SELECT a.payload FROM dl_files f CROSS JOIN dl_actions a "
            f"WHERE a.table_id = f.table_id AND a.version = f.{side}_version AND a.part = f.{side}_part "
            f"AND a.seq = f.{side}_seq AND f.table_id = :table_id AND {where}"
        )

    def iter_active_add_lines(self, table_id: int, version: int, batch: int = 20_000) -> Iterator[list[str]]:
        """The add actions of the active files at ``version``, in batches (O(active files))."""
        q = self._file_payload_query(
            "add",
            "f.add_version IS NOT NULL AND f.add_version <= :v "
            "AND (f.remove_version IS NULL OR f.remove_version > :v)",
        )
        params = {"table_id": table_id, "v": version}
        with db.translated(self.url, "reading active files"), self.reader.connect() as conn:
            if self.engine.dialect.name == "postgresql":
                yield from _copy_lines(conn, q, params, batch)
                return
            result = conn.execution_options(stream_results=True, yield_per=batch).execute(q, params)
            for part in result.partitions(batch):
                yield [str(r[0]) for r in part]

    def tombstone_lines(self, table_id: int, version: int, min_deletion_timestamp: int) -> list[str]:
        """``remove`` actions at or before ``version`` still inside the retention window."""
        q = self._file_payload_query(
            "remove",
            "f.remove_version <= :v AND f.remove_seq IS NOT NULL "
            "AND (f.deletion_timestamp IS NULL OR f.deletion_timestamp >= :min_ts)",
        )
        with db.translated(self.url, "reading tombstones"), self.reader.connect() as conn:
            params = {"table_id": table_id, "v": version, "min_ts": min_deletion_timestamp}
            return [str(r[0]) for r in conn.execute(q, params)]

    def active_files(self, table_id: int, version: int) -> list[FileEntry]:
        q = select(dl_files.c.path, dl_files.c.dv_id, dl_files.c.size, dl_files.c.partition_values).where(
            self._active_where(table_id, version)
        )
        with db.translated(self.url, "reading active files"), self.reader.connect() as conn:
            return [
                FileEntry(
                    r.path, r.dv_id, r.size, json.loads(r.partition_values) if r.partition_values else None
                )
                for r in conn.execute(q)
            ]

    def count_active_files(self, table_id: int, version: int) -> int:
        with db.translated(self.url, "counting active files"), self.reader.connect() as conn:
            return int(
                conn.execute(
                    select(func.count()).select_from(dl_files).where(self._active_where(table_id, version))
                ).scalar()
                or 0
            )

    # -- mirror status ---------------------------------------------------------------------------
    def status_rows(
        self,
        table_id: int,
        artifact: str | None = None,
        states: Sequence[str] | None = None,
        from_version: int | None = None,
        to_version: int | None = None,
    ) -> list[StatusRow]:
        q = select(dl_mirror_status).where(dl_mirror_status.c.table_id == table_id)
        if artifact:
            q = q.where(dl_mirror_status.c.artifact == artifact)
        if states:
            q = q.where(dl_mirror_status.c.state.in_(list(states)))
        if from_version is not None:
            q = q.where(dl_mirror_status.c.version >= from_version)
        if to_version is not None:
            q = q.where(dl_mirror_status.c.version <= to_version)
        q = q.order_by(dl_mirror_status.c.version, dl_mirror_status.c.artifact)
        with db.translated(self.url, "reading mirror status"), self.reader.connect() as conn:
            return [
                StatusRow(
                    r.version,
                    r.artifact,
                    r.state,
                    r.attempts,
                    r.error_class,
                    r.last_error,
                    r.sha256,
                    r.size_bytes,
                    r.enqueued_at,
                    r.started_at,
                    r.finished_at,
                )
                for r in conn.execute(q)
            ]

    def last_published_version(self, table_id: int) -> int | None:
        """Highest version V such that every JSON commit up to V is published (SUCCESS)."""
        with db.translated(self.url, "reading mirror status"), self.reader.connect() as conn:
            first_open = conn.execute(
                select(func.min(dl_mirror_status.c.version)).where(
                    dl_mirror_status.c.table_id == table_id,
                    dl_mirror_status.c.artifact == "json",
                    dl_mirror_status.c.state != "SUCCESS",
                )
            ).scalar()
            if first_open is not None:
                first = conn.execute(
                    select(dl_tables.c.first_version).where(dl_tables.c.id == table_id)
                ).scalar()
                # Nothing published yet is None, not first_version - 1 (-1 for a new table).
                return None if first is None or first_open <= first else int(first_open) - 1
            top = conn.execute(
                select(func.max(dl_mirror_status.c.version)).where(
                    dl_mirror_status.c.table_id == table_id, dl_mirror_status.c.artifact == "json"
                )
            ).scalar()
            return None if top is None else int(top)

    def last_checkpoint_version(self, table_id: int) -> int | None:
        with db.translated(self.url, "reading mirror status"), self.reader.connect() as conn:
            v = conn.execute(
                select(func.max(dl_mirror_status.c.version)).where(
                    dl_mirror_status.c.table_id == table_id,
                    dl_mirror_status.c.artifact == "checkpoint",
                    dl_mirror_status.c.state == "SUCCESS",
                )
            ).scalar()
            return None if v is None else int(v)

    def json_bytes_between(self, table_id: int, after_version: int, to_version: int) -> int:
        with db.translated(self.url, "reading commit sizes"), self.reader.connect() as conn:
            return int(
                conn.execute(
                    select(func.coalesce(func.sum(dl_commits.c.size_bytes), 0)).where(
                        dl_commits.c.table_id == table_id,
                        dl_commits.c.version > after_version,
                        dl_commits.c.version <= to_version,
                    )
                ).scalar()
                or 0
            )

    def mark_started(self, table_id: int, versions: Sequence[int], artifact: str, owner: str) -> None:
        if not versions:
            return
        now = now_ms()
        lo, hi = min(versions), max(versions)
        contiguous = len(set(versions)) == hi - lo + 1
        with db.translated(self.url, "updating mirror status"), self.engine.begin() as conn:
            conn.execute(
                update(dl_mirror_status)
                .where(
                    dl_mirror_status.c.table_id == table_id,
                    dl_mirror_status.c.artifact == artifact,
                    dl_mirror_status.c.version.between(lo, hi)
                    if contiguous
                    else dl_mirror_status.c.version.in_(list(versions)),
                )
                .values(
                    state="IN_PROGRESS",
                    attempts=dl_mirror_status.c.attempts + 1,
                    started_at=now,
                    lease_owner=owner,
                )
            )

    def ensure_status(self, table_id: int, version: int, artifact: str) -> None:
        """Create a PENDING status row if missing (checkpoints are enqueued when due)."""
        with db.translated(self.url, "updating mirror status"), self.engine.begin() as conn:
            exists = conn.execute(
                select(dl_mirror_status.c.state).where(
                    dl_mirror_status.c.table_id == table_id,
                    dl_mirror_status.c.version == version,
                    dl_mirror_status.c.artifact == artifact,
                )
            ).first()
            if exists is None:
                conn.execute(
                    insert(dl_mirror_status).values(
                        table_id=table_id,
                        version=version,
                        artifact=artifact,
                        state="PENDING",
                        attempts=0,
                        enqueued_at=now_ms(),
                    )
                )

    def mark_succeeded(self, table_id: int, artifact: str, results: Sequence[tuple[int, str, int]]) -> None:
        """Record SUCCESS for (version, sha256, size) after the files were verified durable."""
        if not results:
            return
        now = now_ms()
        if self.engine.dialect.name == "postgresql":
            if artifact == "json" and self._mark_commits_succeeded_pg(table_id, results, now):
                return
            self._mark_succeeded_pg(table_id, artifact, results, now)
            return
        with db.translated(self.url, "updating mirror status"), self.engine.begin() as conn:
            conn.execute(
                update(dl_mirror_status)
                .where(
                    dl_mirror_status.c.table_id == table_id,
                    dl_mirror_status.c.artifact == artifact,
                    dl_mirror_status.c.version == _bind("v"),
                )
                .values(
                    state="SUCCESS",
                    sha256=_bind("s"),
                    size_bytes=_bind("n"),
                    finished_at=now,
                    error_class=None,
                    last_error=None,
                    lease_owner=None,
                ),
                [{"v": v, "s": s, "n": n} for v, s, n in results],
            )

    def _mark_commits_succeeded_pg(
        self, table_id: int, results: Sequence[tuple[int, str, int]], now: int
    ) -> bool:
        """A contiguous run of published commits whose bytes were checked against ``dl_commits``:
        one range UPDATE taking hash and size from there. False when the fast path does not apply."""
        versions = [v for v, _, _ in results]
        lo, hi = min(versions), max(versions)
        if len(set(versions)) != hi - lo + 1:
            return False
        stmt = text(
            "UPDATE dl_mirror_status AS m SET state = 'SUCCESS', sha256 = c.sha256, size_bytes = c.size_bytes, "
            "finished_at = :now, error_class = NULL, last_error = NULL, lease_owner = NULL "
            "FROM dl_commits AS c WHERE c.table_id = m.table_id AND c.version = m.version AND c.has_json "
            "AND m.table_id = :t AND m.artifact = 'json' AND m.version BETWEEN :lo AND :hi"
        )
        # The publisher renders each commit and refuses bytes whose SHA-256 differs from
        # dl_commits, so the recorded hash and size are exactly those it verified at the location.
        with db.translated(self.url, "updating mirror status"), self.engine.begin() as conn:
            conn.execute(stmt, {"now": now, "t": table_id, "lo": lo, "hi": hi})
        return True

    def _mark_succeeded_pg(
        self, table_id: int, artifact: str, results: Sequence[tuple[int, str, int]], now: int
    ) -> None:
        """One UPDATE ... FROM (VALUES ...) per batch: a publish backlog is not 1 round trip per version."""
        params: dict[str, Any] = {"t": table_id, "a": artifact, "now": now}
        values = []
        for i, (v, sha, n) in enumerate(results):
            values.append(f"(CAST(:v{i} AS BIGINT), CAST(:s{i} AS VARCHAR), CAST(:n{i} AS BIGINT))")
            params.update({f"v{i}": v, f"s{i}": sha, f"n{i}": n})
        stmt = text(
            "UPDATE dl_mirror_status AS m SET state = 'SUCCESS', sha256 = r.sha, size_bytes = r.n, "
            "finished_at = :now, error_class = NULL, last_error = NULL, lease_owner = NULL "
            f"FROM (VALUES {', '.join(values)}) AS r(v, sha, n) "
            "WHERE m.table_id = :t AND m.artifact = :a AND m.version = r.v"
        )
        with db.translated(self.url, "updating mirror status"), self.engine.begin() as conn:
            conn.execute(stmt, params)

    def mark_failed(
        self, table_id: int, version: int, artifact: str, state: str, error_class: str, message: str
    ) -> None:
        with db.translated(self.url, "updating mirror status"), self.engine.begin() as conn:
            conn.execute(
                update(dl_mirror_status)
                .where(
                    dl_mirror_status.c.table_id == table_id,
                    dl_mirror_status.c.artifact == artifact,
                    dl_mirror_status.c.version == version,
                )
                .values(
                    state=state,
                    error_class=error_class,
                    last_error=message[:4000],
                    finished_at=now_ms(),
                    lease_owner=None,
                )
            )

    def mark_pending(self, table_id: int, artifact: str, versions: Sequence[int]) -> None:
        """Queue versions again (the reconciler found their files missing at the location)."""
        if not versions:
            return
        with db.translated(self.url, "updating mirror status"), self.engine.begin() as conn:
            conn.execute(
                update(dl_mirror_status)
                .where(
                    dl_mirror_status.c.table_id == table_id,
                    dl_mirror_status.c.artifact == artifact,
                    dl_mirror_status.c.version.in_(list(versions)),
                )
                .values(state="PENDING", finished_at=None)
            )

    def reset_in_progress(self, table_id: int) -> None:
        """A new lease holder re-drives what a crashed one left IN_PROGRESS (put-if-absent makes it safe)."""
        with db.translated(self.url, "updating mirror status"), self.engine.begin() as conn:
            conn.execute(
                update(dl_mirror_status)
                .where(dl_mirror_status.c.table_id == table_id, dl_mirror_status.c.state == "IN_PROGRESS")
                .values(state="PENDING")
            )

    # -- lag history -----------------------------------------------------------------------------
    def add_lag_sample(
        self, table_id: int, lag_seconds: float, versions_behind: int, sampled_at: int | None = None
    ) -> int:
        """Record one lag measurement; returns its ``sampled_at`` (epoch ms)."""
        at = now_ms() if sampled_at is None else int(sampled_at)
        with db.translated(self.url, "recording a lag sample"), self.engine.begin() as conn:
            conn.execute(
                insert(dl_lag_samples).values(
                    table_id=table_id,
                    sampled_at=at,
                    lag_seconds=float(lag_seconds),
                    versions_behind=int(versions_behind),
                )
            )
        return at

    def lag_samples(
        self, table_id: int, since: int | None = None, limit: int | None = None
    ) -> list[tuple[int, float, int]]:
        """(sampled_at ms, lag_seconds, versions_behind), oldest first; ``limit`` keeps the newest."""
        q = select(
            dl_lag_samples.c.sampled_at, dl_lag_samples.c.lag_seconds, dl_lag_samples.c.versions_behind
        ).where(dl_lag_samples.c.table_id == table_id)
        if since is not None:
            q = q.where(dl_lag_samples.c.sampled_at >= since)
        q = q.order_by(dl_lag_samples.c.sampled_at.desc(), dl_lag_samples.c.id.desc())
        if limit is not None:
            q = q.limit(limit)
        with db.translated(self.url, "reading lag samples"), self.reader.connect() as conn:
            rows = [(int(r[0]), float(r[1]), int(r[2])) for r in conn.execute(q)]
        rows.reverse()
        return rows

    def prune_lag_samples(self, table_id: int, older_than: int) -> int:
        """Delete the table's samples taken before ``older_than`` (epoch ms); returns how many."""
        with db.translated(self.url, "pruning lag samples"), self.engine.begin() as conn:
            result = conn.execute(
                delete(dl_lag_samples).where(
                    dl_lag_samples.c.table_id == table_id, dl_lag_samples.c.sampled_at < older_than
                )
            )
            return int(result.rowcount or 0)

    def begin(self) -> Any:
        """A transaction for multi-step writers (the importer)."""
        return self.engine.begin()


def _check_commit_size(name: str, version: int | None, action_count: int, size: int) -> None:
    """The store's commit limits (``DELTA_MIRROR_MAX_COMMIT_ACTIONS`` / ``_BYTES``), for every writer."""
    if action_count > (limit := max_commit_actions()):
        raise CommitTooLargeError(
            f"the commit holds {action_count:,} actions, more than the limit of {limit:,}",
            table=name,
            version=version,
            hint="split it into several commits, or raise DELTA_MIRROR_MAX_COMMIT_ACTIONS",
        )
    if size > (max_bytes := max_commit_bytes()):
        raise CommitTooLargeError(
            f"the commit file would be {size:,} bytes, more than the limit of {max_bytes:,}",
            table=name,
            version=version,
            hint="split it into several commits, or raise DELTA_MIRROR_MAX_COMMIT_BYTES",
        )


def _enqueue_json(conn: Connection, table_id: int, version: int, ts: int) -> None:
    """A committed version waits for the publisher (``PENDING``)."""
    conn.execute(
        insert(dl_mirror_status).values(
            table_id=table_id, version=version, artifact="json", state="PENDING", attempts=0, enqueued_at=ts
        )
    )


def _insert_action_rows(
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


def _copy_lines(conn: Connection, query: Any, params: dict[str, Any], batch: int) -> Iterator[list[str]]:
    """Stream one text column with PostgreSQL COPY: about 3x faster than fetching rows.

    CSV with \\x02 as delimiter and \\x01 as quote: canonical JSON never contains either byte
    (control characters are escaped), nor a raw newline, so every output line is one payload as is.
    """
    # COPY takes no bind parameters, so they are rendered into the text: integers only (ids,
    # versions, timestamps), never a name or any other string.
    if not all(type(v) is int for v in params.values()):
        raise TypeError(f"COPY parameters must be integers, got {sorted(params)}")
    sql = str(query.bindparams(**params).compile(conn.engine, compile_kwargs={"literal_binds": True}))
    raw = conn.connection.driver_connection
    assert raw is not None
    pending: list[bytes] = []
    size = 0
    with (
        raw.cursor() as cur,
        cur.copy(f"COPY ({sql}) TO STDOUT WITH (FORMAT csv, DELIMITER E'\\x02', QUOTE E'\\x01')") as copy,
    ):
        for block in copy:  # one CopyData message per row: buffer a few MiB, then split
            pending.append(bytes(block))
            size += len(block)
            if size >= 4 << 20:
                data = b"".join(pending)
                cut = data.rindex(b"\n")
                yield from _slices(data[:cut].decode("utf-8").split("\n"), batch)
                pending, size = [data[cut + 1 :]], len(data) - cut - 1
    data = b"".join(pending)
    if data.strip():
        yield from _slices(data.rstrip(b"\n").decode("utf-8").split("\n"), batch)


def _slices(lines: list[str], size: int) -> Iterator[list[str]]:
    for i in range(0, len(lines), size):
        yield lines[i : i + size]


def _bind(name: str) -> Any:
    from sqlalchemy import bindparam

    return bindparam(name)


__all__ = [
    "CommitResult",
    "CommitRow",
    "FileEntry",
    "Snapshot",
    "SqlStore",
    "StatusRow",
    "TableInfo",
    "check_table_name",
    "default_table_name",
    "now_ms",
]
