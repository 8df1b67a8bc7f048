"""Every commit kind in one round trip to PostgreSQL: one data-modifying statement per commit.

What the Python rules read from the store before a commit (the table, its next version, the
active files a commit removes, the protocol in force) is either checked by the statement itself or
cached per table and *verified* by it: the statement claims the version only while every
precondition still holds, and otherwise writes nothing and answers 0, so the caller takes the
transaction path, which decides any refusal in its usual order and message.

Why one CTE rather than a plpgsql function (a migration 0007): the CTE needs no schema object to
keep in step with ``log_rows`` across migrations and no server-side code path the SQLite store
lacks; psycopg prepares it server-side after a few executions (``prepare_threshold``), so its
parse and plan are paid once per connection, as a function's would be; and its sub-statements
share one snapshot, which is exactly the precondition check's view (a plpgsql function would read
its checks and write its rows under one transaction too, but as several statements to plan).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine

from delta_mirror.delta import commit_rules
from delta_mirror.delta.actions import Action
from delta_mirror.store import pg_exec
from delta_mirror.store.file_index import index_changes
from delta_mirror.store.schema import LOOKED_UP_PREDICATE, PART_COMMIT
from delta_mirror.store.tables import TableInfo

# Every row of a commit in one statement (one round trip, its own transaction on an autocommit
# connection). ``t`` yields the table only under the claim rule (``commit_writer``'s docstring);
# each write hangs off the claimed ``dl_commits`` row ``c`` (its
# primary key decides a race). The sub-statements share one snapshot: ``e`` (the entries this
# version ends: superseded re-adds and removes, each key once) never sees the rows ``f`` inserts.
# ``c`` sets ``delta_mirror.notify_after_commit`` for this transaction only, before its row goes in:
# the ``dl_commits`` trigger (AFTER ROW, fired at the end of the statement) then skips its NOTIFY
# and ``run`` sends it after the commit (migration 0007 says why).
_TABLE_AS_SEEN = """
    SELECT id FROM dl_tables
    WHERE id = %(tid)s AND table_uuid = %(uuid)s AND location = %(loc)s AND name = %(name)s
      AND first_version = %(fv)s
      AND base_checkpoint_version IS NOT DISTINCT FROM %(bcv)s::bigint AND state <> 'HALTED'
      AND COALESCE((SELECT max(version) + 1 FROM dl_commits WHERE table_id = %(tid)s), first_version)
          = %(v)s::bigint"""
_PRECONDITIONS = f"""
      AND (%(pv)s::bigint IS NULL OR NOT EXISTS (
          SELECT 1 FROM dl_actions
          WHERE table_id = %(tid)s AND action_type = 'protocol' AND {LOOKED_UP_PREDICATE}
            AND version > %(pv)s::bigint))
      AND cardinality(%(r_path)s::text[]) = (
          SELECT count(*) FROM unnest(%(r_path)s::text[], %(r_dv)s::text[]) AS r(path, dv_id)
          WHERE EXISTS (
              SELECT 1 FROM dl_files f
              WHERE f.table_id = %(tid)s AND f.path = r.path AND f.dv_id = r.dv_id
                AND f.remove_version IS NULL))"""
_CLAIM = """
), c AS (
    INSERT INTO dl_commits
        (table_id, version, committed_at, in_commit_timestamp, action_count, size_bytes, sha256, has_json,
         source)
    SELECT id, %(v)s::bigint, %(ts)s::bigint, %(ict)s::bigint, %(n)s::int, %(size)s::bigint, %(sha)s::text,
        true, %(source)s::text
    FROM t
    WHERE set_config('delta_mirror.notify_after_commit', 'on', true) = 'on'
    RETURNING table_id
), a AS (
    INSERT INTO dl_actions (table_id, version, part, seq, action_type, payload)
    SELECT c.table_id, %(v)s::bigint, %(part)s::smallint, x.seq, x.kind, x.payload
    FROM c, unnest(%(a_seq)s::int[], %(a_kind)s::text[], %(a_payload)s::text[]) AS x(seq, kind, payload)"""
_ENDS = """
), e AS (
    UPDATE dl_files f
    SET remove_version = %(v)s::bigint, remove_part = x.part, remove_seq = x.seq, deletion_timestamp = x.dt
    FROM c, unnest(%(e_path)s::text[], %(e_dv)s::text[], %(e_part)s::smallint[], %(e_seq)s::int[],
                   %(e_dt)s::bigint[]) AS x(path, dv_id, part, seq, dt)
    WHERE f.table_id = c.table_id AND f.path = x.path AND f.dv_id = x.dv_id AND f.remove_version IS NULL"""
# An append's ends are only its re-adds' supersedes: no remove position, no deletion timestamp.
# The keys are looked up by ``path = ANY(...)`` on ix_dl_files_key and matched whole by a semi-join,
# not by a join driving one probe per unnest row: a generic plan cannot know the array's length
# and costs ``unnest`` of a parameter at many rows, so with the join PostgreSQL re-planned the
# statement on every run (a custom plan each time, ~60 % of the statement's time); this form's
# generic plan is as cheap as a custom one, so a prepared APPEND is planned once per connection.
_SUPERSEDES = """
), e AS (
    UPDATE dl_files f
    SET remove_version = %(v)s::bigint, remove_part = NULL, remove_seq = NULL, deletion_timestamp = NULL
    FROM c
    WHERE f.table_id = c.table_id AND f.path = ANY(%(e_path)s::text[]) AND f.remove_version IS NULL
      AND (f.path, f.dv_id) IN (SELECT * FROM unnest(%(e_path)s::text[], %(e_dv)s::text[]))"""
_ROWS = """
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
COMMIT = f"\nWITH t AS ({_TABLE_AS_SEEN}{_PRECONDITIONS}{_CLAIM}{_ENDS}{_ROWS}"
# The same commit when it removes nothing and no protocol needs checking (appends, metadata
# changes, a table's first commits): ``t`` checks the table and the version only, with no
# sub-select for removed files or a newer protocol (there is neither to check); the same rows.
APPEND = f"\nWITH t AS ({_TABLE_AS_SEEN}{_CLAIM}{_SUPERSEDES}{_ROWS}"


def statement(params: Mapping[str, Any]) -> str:
    """The statement for :func:`params`' commit: :data:`APPEND` when it removes no file and checks
    no protocol, else :data:`COMMIT`; both claim the version under the same table checks."""
    return APPEND if params["pv"] is None and not params["r_path"] else COMMIT


def run(engine: Engine, params: Mapping[str, Any]) -> bool:
    """Run :func:`params`' commit (:func:`statement`) as its own transaction; whether it claimed
    the version. The statement tells the ``dl_commits`` trigger that it notifies after its commit
    (migration 0007), so the ``NOTIFY`` for the table is sent here, after it, never left out."""
    return bool(pg_exec.scalar(engine, statement(params), params, notify=str(params["tid"])))


@dataclass(frozen=True)
class Protocol:
    """The protocol in force: its action body and the version that wrote it (-1: none yet)."""

    version: int
    body: Mapping[str, Any] | None


def protocol_of(actions: Sequence[Action], version: int) -> Protocol | None:
    """The protocol a commit writes (None: it writes none)."""
    body = next((b for k, b in actions if k == "protocol"), None)
    return None if body is None else Protocol(version, body)


def needs_previous_protocol(table: TableInfo, version: int, actions: Sequence[Action]) -> bool:
    """Whether ``check_commit_rules`` reads the protocol in force (a change after the first version
    that is not a DROP FEATURE)."""
    return (
        version > table.first_version
        and any(k == "protocol" for k, _ in actions)
        and not commit_rules.drops_a_feature(actions)
    )


def params(
    table: TableInfo,
    version: int,
    actions: Sequence[Action],
    lines: Sequence[str],
    *,
    ts: int,
    ict: int | None,
    size: int,
    sha256: str,
    source: str,
    protocol_version: int | None,
) -> dict[str, Any]:
    """:data:`COMMIT`'s parameters: the rows ``write_actions`` would write, as arrays.

    ``protocol_version``: the version of the protocol the rules were checked against (verified to
    be still the newest), or None when the rules read none.
    """
    adds, ends = index_changes(table.id, version, PART_COMMIT, actions)
    removed = commit_rules.removed_files(actions)
    return {
        "tid": table.id,
        "uuid": table.table_uuid,
        "loc": table.location,
        "name": table.name,
        "fv": table.first_version,
        "bcv": table.base_checkpoint_version,
        "v": version,
        "pv": protocol_version,
        "ts": ts,
        "ict": ict,
        "n": len(actions),
        "size": size,
        "sha": sha256,
        "source": source,
        "part": PART_COMMIT,
        "r_path": [k.path for k in removed],
        "r_dv": [k.dv_id for k in removed],
        "a_seq": list(range(len(actions))),
        "a_kind": [k for k, _ in actions],
        "a_payload": list(lines),
        "e_path": [e[0] for e in ends],
        "e_dv": [e[1] for e in ends],
        "e_part": [e[2] for e in ends],
        "e_seq": [e[3] for e in ends],
        "e_dt": [e[4] for e in ends],
        "f_path": [a["path"] for a in adds],
        "f_dv": [a["dv_id"] for a in adds],
        "f_seq": [a["add_seq"] for a in adds],
        "f_size": [a["size"] for a in adds],
        "f_pv": [a["partition_values"] for a in adds],
    }


__all__ = [
    "APPEND",
    "COMMIT",
    "Protocol",
    "needs_previous_protocol",
    "params",
    "protocol_of",
    "run",
    "statement",
]
