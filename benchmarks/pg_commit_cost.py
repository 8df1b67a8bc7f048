"""PostgreSQL's own CPU per commit: the commit statement beside a bare one-row INSERT (issue 31).

The commit service's figure counts PostgreSQL's CPU per commit (postmaster and backends) beside
the service's. This asks what part of it the statement itself costs: on one durable server (fsync,
full_page_writes and synchronous_commit on, as in ``commit_service``), ``CONNS`` autocommit
connections (``CLIENT_PROCS`` processes of threads, psycopg, statements prepared after five runs as
the store's are; each connection runs ``WARM_UP`` statements before the window) run one statement
per 1-add append for a fixed window, and the server's process tree's CPU (``/proc``; the clients'
backends also alone, without autovacuum and the other background processes) and WAL
(``pg_stat_wal``) are divided by the commits. Modes, each on its own database of ``TABLES`` tables:

- ``floor``: ``INSERT INTO floor_rows VALUES (table, version)``, a two-column primary key: what any
  durable one-row commit costs (parse/bind/execute, the transaction, the WAL flush, the protocol);
  ``floor_notify``: the same with the ``pg_notify`` migration 0004's trigger sends per commit;
  ``floor_notify_after``: the same insert, then that ``pg_notify`` in a transaction of its own;
- ``commit``: ``pg_commit.statement`` (what the store runs: ``APPEND`` for an append);
  ``commit_full``: ``pg_commit.COMMIT``, the statement for every commit kind, for the same append;
  ``append_joined``: ``APPEND`` as first written (supersedes joined to ``unnest``: re-planned on
  every run); ``commit_generic``: ``commit`` on connections with ``plan_cache_mode =
  force_generic_plan``; ``commit_quiet``: ``commit`` with the NOTIFY trigger disabled;
  ``commit_old``: ``commit`` without the ``notify_after_commit`` flag, so the trigger notifies in
  the commit (what the store ran before migration 0007);
- every mode whose statement sets that flag (the ``pg_commit`` statements) sends the version's
  ``pg_notify`` after its commit, in its own transaction, as ``pg_exec.scalar`` does;
- ``rows``: ``pg_commit.COMMIT`` with its checks cut (``t`` is the table id): the rows alone.

Windows alternate modes and servers round-robin; figures are medians. Two servers run side by side:
``plain`` (nothing preloaded) and ``pgss`` (pg_stat_statements with track_utility=on, as
``commit_service`` loads it): their difference is what statement tracking costs. Then on ``pgss``
with track_planning on, one window per mode gives pg_stat_statements' plan and execution time per
call, and ``EXPLAIN (ANALYZE, BUFFERS)`` of each statement is printed.

``PYTHONPATH=tests .venv/bin/python benchmarks/pg_commit_cost.py [--window S] [--repeats N]
[--modes a,b]`` (JSON on stdout, progress on stderr). Not part of ``make bench``: a diagnosis.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing
import os
import queue
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

from commit_service import _admin, _fsync_pg, _procs, _tree_ticks, commit_body, v0_body

from delta_mirror.delta.actions import split_commit
from delta_mirror.store import pg_commit
from delta_mirror.store.sql_store import SqlStore
from delta_mirror.store.states import CommitSource
from delta_mirror.store.tables import TableInfo

TABLES = 64
CONNS = 16
CLIENT_PROCS = 2
# Statements each connection runs before the window, not measured: psycopg prepares a statement
# after five runs and PostgreSQL plans its generic plan after five more, as on the store's
# long-lived pooled connections.
WARM_UP = 12
MODES = (
    "floor",
    "floor_notify",
    "rows",
    "commit_full",
    "append_joined",
    "commit",
    "commit_generic",
    "commit_quiet",
    "commit_old",
    "floor_notify_after",
)
_T_CHECKS = pg_commit.COMMIT.split("), c AS (", 1)[0] + "), c AS ("
ROWS = pg_commit.COMMIT.replace(_T_CHECKS, "WITH t AS (SELECT %(tid)s::int AS id), c AS (", 1)
# APPEND as first written: its supersedes joined to ``unnest`` (a custom plan on every run).
APPEND_JOINED = pg_commit.APPEND.replace(
    """    FROM c
    WHERE f.table_id = c.table_id AND f.path = ANY(%(e_path)s::text[]) AND f.remove_version IS NULL
      AND (f.path, f.dv_id) IN (SELECT * FROM unnest(%(e_path)s::text[], %(e_dv)s::text[]))""",
    """    FROM c, unnest(%(e_path)s::text[], %(e_dv)s::text[]) AS x(path, dv_id)
    WHERE f.table_id = c.table_id AND f.path = x.path AND f.dv_id = x.dv_id AND f.remove_version IS NULL""",
)
FLOOR = "INSERT INTO floor_rows (table_id, version) VALUES (%(tid)s, %(v)s)"
# The floor with the NOTIFY migration 0004's trigger sends in every committing transaction.
FLOOR_NOTIFY = (
    "WITH n AS (SELECT pg_notify('delta_mirror_commits', %(tid)s::text))"
    " INSERT INTO floor_rows (table_id, version) SELECT %(tid)s, %(v)s FROM n"
)


# The flag the pg_commit statements set so that the trigger leaves the NOTIFY to pg_exec (0007).
_FLAG = "    WHERE set_config('delta_mirror.notify_after_commit', 'on', true) = 'on'\n"
NOTIFY = "SELECT pg_notify('delta_mirror_commits', %s)"


def notifies_after(mode: str) -> bool:
    """Whether ``mode`` sends its NOTIFY after the commit, as the store does since migration 0007."""
    return mode == "floor_notify_after" or not (
        mode.startswith("floor") or mode in ("commit_quiet", "commit_old")
    )


def statement_of(mode: str, params: dict[str, Any]) -> str:
    if mode in ("floor", "floor_notify_after"):
        return FLOOR
    if mode == "commit_old":
        return pg_commit.statement(params).replace(_FLAG, "")
    if mode == "floor_notify":
        return FLOOR_NOTIFY
    if mode == "rows":
        return ROWS
    if mode == "append_joined":
        return APPEND_JOINED
    if mode == "commit_full":
        return pg_commit.COMMIT
    return pg_commit.statement(params)


def commit_params(table: TableInfo, index: int, version: int) -> dict[str, Any]:
    data = commit_body(index, version, "append")
    lines, actions = split_commit(data, table=table.name, version=version)
    return pg_commit.params(
        table,
        version,
        actions,
        lines,
        ts=int(time.time() * 1000),
        ict=None,
        size=len(data),
        sha256=hashlib.sha256(data).hexdigest(),
        source=CommitSource.SPARK,
        protocol_version=None,
    )


def _conninfo(url: str, mode: str = "") -> str:
    from sqlalchemy.engine import make_url

    u = make_url(url)
    info = f"host={u.host} port={u.port} user={u.username or 'postgres'} dbname={u.database}"
    if mode == "commit_generic":  # the statement's generic plan from its sixth run on, never re-planned
        info += " options='-c plan_cache_mode=force_generic_plan'"
    return info


def _client(
    conninfo: str, mode: str, start: float, seconds: float, tables: list[list[Any]], out: Any
) -> None:
    """One client process: a thread per connection, each cycling over its tables."""
    import psycopg

    per_conn = CONNS // CLIENT_PROCS
    groups = [tables[i::per_conn] for i in range(per_conn)]
    done = [0] * per_conn
    errors: list[str] = []

    def run(i: int) -> None:
        with psycopg.connect(conninfo, autocommit=True) as conn:
            turn = 0
            while time.monotonic() < start:
                if turn >= WARM_UP:
                    time.sleep(0.005)
                    continue
                entry = groups[i][turn % len(groups[i])]
                turn += 1
                params = commit_params(entry[0], entry[1], entry[2])
                conn.execute(statement_of(mode, params), params)
                if notifies_after(mode):
                    conn.execute(NOTIFY, (str(entry[0].id),), prepare=False)
                entry[2] += 1
            while time.monotonic() < start + seconds:
                entry = groups[i][turn % len(groups[i])]
                turn += 1
                table, index, version = entry
                params = commit_params(table, index, version)
                try:
                    cur = conn.execute(statement_of(mode, params), params)
                    row = cur.fetchone() if not mode.startswith("floor") else (1,)
                    if row is None or row[0] != 1:
                        errors.append(f"{mode}: version {version} of {table.name} not claimed")
                        return
                    if notifies_after(mode):
                        conn.execute(NOTIFY, (str(table.id),), prepare=False)
                except Exception as exc:
                    errors.append(f"{mode}: {exc!r}"[:300])
                    return
                entry[2] = version + 1
                done[i] += 1
            # the backend lives on past the window: its CPU is still in the tree when the parent reads it
            time.sleep(max(0.0, start + seconds + 1.0 - time.monotonic()))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(per_conn)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    out.put({"done": sum(done), "next": [(e[1], e[2]) for e in tables], "errors": errors})


def _backend_ticks(postmaster: int, db: str) -> int:
    """CPU ticks of the postmaster's children serving ``db`` (the clients' backends), without the
    background processes (autovacuum, checkpointer, WAL writer), whose work comes in bursts."""
    total = 0
    for pid, (ppid, ticks) in _procs().items():
        if ppid != postmaster:
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                title = f.read().decode(errors="replace")
        except OSError:
            continue
        if f" {db} " in title:
            total += ticks
    return total


class Server:
    """One durable server, a database per mode with ``TABLES`` tables at version 0."""

    def __init__(self, label: str, statements: bool) -> None:
        self.label = label
        self.statements = statements
        self.pg = _fsync_pg(statements=statements)
        self.pid = int((self.pg.datadir / "postmaster.pid").read_text().split()[0])
        self.urls: dict[str, str] = {}
        self.tables: dict[str, list[list[Any]]] = {}
        for mode in MODES:
            url = self.pg.create_database()
            store = SqlStore(url)
            store.init()
            entries: list[list[Any]] = []
            for i in range(TABLES):
                loc = f"file:///lake/{mode}/t{i:02d}"
                store.commit_verbatim(loc, 0, v0_body(i), create_name=f"t{i:02d}")
                entries.append([store.table_at(loc), i, 1])
            store.close()
            import psycopg

            with psycopg.connect(_conninfo(url), autocommit=True) as conn:
                conn.execute(
                    "CREATE TABLE floor_rows (table_id int, version bigint, PRIMARY KEY (table_id, version))"
                )
                if mode == "commit_quiet":  # the statement without the trigger's NOTIFY
                    conn.execute("ALTER TABLE dl_commits DISABLE TRIGGER dl_commits_notify")
            self.urls[mode] = url
            self.tables[mode] = entries

    def admin(self, sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        import psycopg

        with psycopg.connect(_admin(self.pg.url), autocommit=True) as conn:
            cur = conn.execute(sql, args)
            return cur.fetchall() if cur.description is not None else []

    def wal(self) -> tuple[int, int]:
        row = self.admin("SELECT wal_bytes, wal_records FROM pg_stat_wal")[0]
        return int(row[0]), int(row[1])

    def window(self, mode: str, seconds: float) -> dict[str, Any]:
        tables = self.tables[mode]
        ctx = multiprocessing.get_context("fork")
        out = ctx.Queue()
        start = time.monotonic() + 2.0 + 0.2 * CONNS
        procs = [
            ctx.Process(
                target=_client,
                args=(_conninfo(self.urls[mode], mode), mode, start, seconds, tables[p::CLIENT_PROCS], out),
            )
            for p in range(CLIENT_PROCS)
        ]
        for p in procs:
            p.start()
        time.sleep(max(0.0, start - time.monotonic() - 0.05))
        if self.statements:
            self.admin("SELECT pg_stat_statements_reset()")
        wal0 = self.wal()
        db = self.urls[mode].rsplit("/", 1)[1]
        ticks0, backends0 = _tree_ticks(_procs(), [self.pid]), _backend_ticks(self.pid, db)
        time.sleep(max(0.0, start + seconds - time.monotonic()))
        ticks1, backends1 = _tree_ticks(_procs(), [self.pid]), _backend_ticks(self.pid, db)
        wal1 = self.wal()
        load = os.getloadavg()[0]
        answers = []
        for _ in procs:
            try:
                answers.append(out.get(timeout=120))
            except queue.Empty:
                break
        for p in procs:
            p.join(30)
        done = sum(a["done"] for a in answers)
        nxt = dict(n for a in answers for n in a["next"])
        for entry in tables:
            entry[2] = nxt.get(entry[1], entry[2])
        tick = os.sysconf("SC_CLK_TCK")
        result: dict[str, Any] = {
            "commits_per_s": round(done / seconds, 1),
            "cpu_ms_per_commit": round((ticks1 - ticks0) / tick / max(done, 1) * 1000, 3),
            "backends_cpu_ms_per_commit": round((backends1 - backends0) / tick / max(done, 1) * 1000, 3),
            "wal_bytes_per_commit": round((wal1[0] - wal0[0]) / max(done, 1)),
            "wal_records_per_commit": round((wal1[1] - wal0[1]) / max(done, 1), 2),
            "loadavg_1m": round(load, 2),
            "errors": [e for a in answers for e in a["errors"]][:3],
        }
        if self.statements:
            rows = self.admin(
                "SELECT s.calls, s.total_exec_time, s.total_plan_time, s.plans, s.wal_bytes, s.query"
                " FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid"
                " WHERE d.datname = %s ORDER BY s.calls DESC LIMIT 1",
                (self.urls[mode].rsplit("/", 1)[1],),
            )
            if rows:
                calls, exec_ms, plan_ms, plans, wal_bytes, _ = rows[0]
                result["statement"] = {
                    "calls": int(calls),
                    "exec_ms_per_call": round(float(exec_ms) / max(int(calls), 1), 4),
                    "plan_ms_per_call": round(float(plan_ms) / max(int(calls), 1), 4),
                    "plans_per_call": round(int(plans) / max(int(calls), 1), 3),
                    "wal_bytes_per_call": round(int(wal_bytes) / max(int(calls), 1)),
                }
        return result

    def explain(self, mode: str) -> str:
        import psycopg

        entry = self.tables[mode][0]
        table, index, version = entry
        params = commit_params(table, index, version)
        with psycopg.connect(_conninfo(self.urls[mode])) as conn:  # rolled back: nothing kept
            rows = conn.execute(
                "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF, TIMING ON) " + statement_of(mode, params), params
            ).fetchall()
            conn.rollback()
        return "\n".join(str(r[0]) for r in rows)

    def stop(self) -> None:
        self.pg.stop_and_remove()


def _median(xs: list[float]) -> float:
    return round(statistics.median(xs), 3)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--window", type=float, default=4.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--modes", default=",".join(MODES))
    opts = ap.parse_args(argv)
    modes = [m for m in opts.modes.split(",") if m]

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    servers = [Server("plain", statements=False), Server("pgss", statements=True)]
    out: dict[str, Any] = {"window_s": opts.window, "repeats": opts.repeats, "connections": CONNS}
    try:
        for s in servers:  # warm-up: plans cached, tables touched
            for mode in modes:
                s.window(mode, 1.0)
        results: dict[str, list[dict[str, Any]]] = {}
        for rep in range(opts.repeats):
            for mode in modes:
                for s in servers:
                    w = s.window(mode, opts.window)
                    results.setdefault(f"{s.label}/{mode}", []).append(w)
                    log(f"[{rep + 1}/{opts.repeats}] {s.label} {mode}: {json.dumps(w)}")
        out["medians"] = {
            k: {
                "commits_per_s": _median([w["commits_per_s"] for w in ws]),
                "cpu_ms_per_commit": _median([w["cpu_ms_per_commit"] for w in ws]),
                "backends_cpu_ms_per_commit": _median([w["backends_cpu_ms_per_commit"] for w in ws]),
                "cpu_ms_range": [
                    min(w["cpu_ms_per_commit"] for w in ws),
                    max(w["cpu_ms_per_commit"] for w in ws),
                ],
                "wal_bytes_per_commit": _median([w["wal_bytes_per_commit"] for w in ws]),
                "wal_records_per_commit": _median([w["wal_records_per_commit"] for w in ws]),
                "loadavg_1m": _median([w["loadavg_1m"] for w in ws]),
            }
            for k, ws in results.items()
        }
        pgss = servers[1]
        pgss.admin("ALTER SYSTEM SET pg_stat_statements.track_planning = on")
        pgss.admin("SELECT pg_reload_conf()")
        out["track_planning"] = {}
        for mode in modes:
            w = pgss.window(mode, opts.window)
            out["track_planning"][mode] = w
            log(f"track_planning {mode}: {json.dumps(w)}")
        out["explain"] = {mode: pgss.explain(mode) for mode in modes if not mode.startswith("floor")}
        for mode, text in out["explain"].items():
            log(f"-- EXPLAIN {mode}\n{text}")
    finally:
        for s in servers:
            s.stop()
    for k, m in out["medians"].items():
        log(f"{k:22s} {m}")
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    raise SystemExit(main(sys.argv[1:]))
