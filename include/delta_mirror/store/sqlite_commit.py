"""Every commit kind in one short write transaction on SQLite: ``pg_commit.COMMIT``'s work, from the
same parameters (``pg_commit.params``), for the native and the verbatim path alike.

SQLite has no data-modifying CTE, but its writers take the database's one write lock up front
(``BEGIN IMMEDIATE``, ``db.make_engine``): everything between that and COMMIT sees no other writer,
and a process killed in between leaves nothing (the journal rolls the transaction back). The first
statement claims the version only under ``commit_writer``'s claim rule; otherwise
nothing is written and the caller takes the transaction path, which decides any refusal in its
usual order and message. The rows then written are ``log_rows.write_actions``' (``index_changes``:
the entries this version ends, each key once, before its adds are inserted).

The statements run on the pooled connection's ``sqlite3`` connection directly: through
SQLAlchemy's ``Connection`` (its begin, execution contexts and commit) they cost about as much
CPU as SQLite's own work. The pool (checkout, reset on return) and the errors stay SQLAlchemy's:
a driver error is raised as ``exec_driver_sql`` raises it, so ``db.translated`` and
the backend's ``is_unique_violation`` read it unchanged.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping
from typing import Any

from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError

from delta_mirror.failpoints import failpoint
from delta_mirror.store.schema import LOOKED_UP_PREDICATE

# The claim, which also checks every precondition (``:r``: the removed keys as a JSON array of
# [path, dv_id] pairs, ``:nr`` how many). The active-file check walks ``ix_dl_files_key`` per key.
_CLAIM = f"""
INSERT INTO dl_commits
    (table_id, version, committed_at, in_commit_timestamp, action_count, size_bytes, sha256, has_json, source)
SELECT id, :v, :ts, :ict, :n, :size, :sha, 1, :source FROM dl_tables
WHERE id = :tid AND table_uuid = :uuid AND location = :loc AND name = :name AND first_version = :fv
  AND base_checkpoint_version IS :bcv AND state <> 'HALTED'
  AND COALESCE((SELECT max(version) + 1 FROM dl_commits WHERE table_id = :tid), first_version) = :v
  AND (:pv IS NULL OR NOT EXISTS (
      SELECT 1 FROM dl_actions
      WHERE table_id = :tid AND action_type = 'protocol' AND {LOOKED_UP_PREDICATE} AND version > :pv))
  AND (:nr = 0 OR :nr = (
      SELECT count(*) FROM json_each(:r) AS r
      WHERE EXISTS (
          SELECT 1 FROM dl_files f
          WHERE f.table_id = :tid AND f.path = json_extract(r.value, '$[0]')
            AND f.dv_id = json_extract(r.value, '$[1]') AND f.remove_version IS NULL)))
"""
_ACTIONS = (
    "INSERT INTO dl_actions (table_id, version, part, seq, action_type, payload) VALUES (?, ?, ?, ?, ?, ?)"
)
_ENDS = (
    "UPDATE dl_files SET remove_version = ?, remove_part = ?, remove_seq = ?, deletion_timestamp = ?"
    " WHERE table_id = ? AND path = ? AND dv_id = ? AND remove_version IS NULL"
)
_ADDS = (
    "INSERT INTO dl_files (table_id, path, dv_id, add_version, add_part, add_seq, size, partition_values)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
)
_STATUS = (
    "INSERT INTO dl_mirror_status (table_id, version, artifact, state, attempts, enqueued_at)"
    " VALUES (?, ?, 'json', 'PENDING', 0, ?)"
)

# The parameters of ``pg_commit.params`` the claim reads.
_CLAIMED = ("v", "ts", "ict", "n", "size", "sha", "source", "tid", "uuid", "loc", "name", "fv", "bcv", "pv")

#: Reached with every row of the commit written in its open transaction, before COMMIT.
BEFORE_COMMIT = "sqlite_commit.before_commit"


def run(engine: Engine, p: Mapping[str, Any]) -> bool:
    """Commit ``p`` (``pg_commit.params``) in one ``BEGIN IMMEDIATE`` transaction on a connection of
    ``engine``'s pool; whether the version was claimed (False: nothing written). Errors are raised
    as SQLAlchemy raises them, for the caller to translate (a unique violation: the version was
    taken after all). The claim is ``commit_writer``'s claim rule.
    """
    removed = list(zip(p["r_path"], p["r_dv"], strict=True))
    claim = {key: p[key] for key in _CLAIMED}
    claim["nr"] = len(removed)
    claim["r"] = json.dumps(removed) if removed else "[]"
    tid, v, part = p["tid"], p["v"], p["part"]
    dialect = engine.dialect
    dbapi_error: Any = dialect.loaded_dbapi.Error
    sql = "BEGIN IMMEDIATE"
    fairy = engine.raw_connection()
    conn: Any = fairy.driver_connection  # sqlite3, autocommit (``db.make_engine``): BEGIN is ours
    try:
        conn.execute(sql)
        try:
            sql = _CLAIM
            if conn.execute(sql, claim).rowcount != 1:
                return False  # rolled back below
            sql = _ACTIONS
            conn.executemany(
                sql,
                [(tid, v, part, *row) for row in zip(p["a_seq"], p["a_kind"], p["a_payload"], strict=True)],
            )
            sql = _ENDS
            conn.executemany(
                sql,
                [
                    (v, e_part, seq, dt, tid, path, dv)
                    for path, dv, e_part, seq, dt in zip(
                        p["e_path"], p["e_dv"], p["e_part"], p["e_seq"], p["e_dt"], strict=True
                    )
                ],
            )
            sql = _ADDS
            conn.executemany(
                sql,
                [
                    (tid, path, dv, v, part, seq, size, pv)
                    for path, dv, seq, size, pv in zip(
                        p["f_path"], p["f_dv"], p["f_seq"], p["f_size"], p["f_pv"], strict=True
                    )
                ],
            )
            sql = _STATUS
            conn.execute(sql, (tid, v, p["ts"]))
            failpoint(BEFORE_COMMIT)
            sql = "COMMIT"
            conn.execute(sql)
        finally:
            if conn.in_transaction:
                with contextlib.suppress(dbapi_error):  # the pool's reset rolls back what is left
                    conn.execute("ROLLBACK")
    except dbapi_error as exc:  # as ``exec_driver_sql`` would raise it
        raise DBAPIError.instance(sql, None, exc, dbapi_error, dialect=dialect) from exc
    finally:
        fairy.close()
    return True


__all__ = ["BEFORE_COMMIT", "run"]
