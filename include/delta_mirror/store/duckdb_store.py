"""The store on a DuckDB file: its engine, its errors and its one-process rule.

DuckDB runs inside the process that opens the file and takes an OS lock on it: any number of
connections and threads of that ONE process may use the store, a second process cannot open the file
while the first holds it. So a DuckDB store serves the CLI, a ``make demo``-style single process and a
commit service with one worker owning the file; deployments in which several processes open the store
at once (``serve --workers 2``, Airflow's scheduler, triggerer and workers) are refused in one line.

Inside the process, DuckDB's optimistic concurrency would fail one of two transactions writing the
same rows ("Conflict on tuple deletion", a duplicate key at commit); the engine therefore serializes
write transactions per file (the role SQLite's ``BEGIN IMMEDIATE`` plays), while reads (``reader``)
run beside them on their own snapshots.
"""

from __future__ import annotations

import re
import threading
from pathlib import Path
from typing import Any

from alembic.ddl.impl import DefaultImpl
from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.engine import URL

from delta_mirror.errors import PermanentError

NAME = "duckdb"

ONE_PROCESS_HINT = (
    "a DuckDB store is opened by one process at a time (the CLI, one `delta-mirror serve` worker); "
    "use PostgreSQL or MySQL for several processes"
)


class _DuckDBImpl(DefaultImpl):
    """Alembic's operations on DuckDB: the generic ones (its SQL is PostgreSQL's for what the
    migrations use). Defining the class registers it for the ``duckdb`` dialect."""

    __dialect__ = "duckdb"
    transactional_ddl = True


# One write lock per database file in this process: every engine on the file shares it.
_WRITE_LOCKS: dict[str, threading.RLock] = {}
_WRITE_LOCKS_GUARD = threading.Lock()
_HELD = "delta_mirror_duckdb_write_lock"


def _write_lock(key: str) -> threading.RLock:
    with _WRITE_LOCKS_GUARD:
        lock = _WRITE_LOCKS.get(key)
        if lock is None:
            lock = _WRITE_LOCKS[key] = threading.RLock()
        return lock


def database_path(url: URL) -> Path | None:
    """The file of a DuckDB URL, or None for an in-memory database."""
    if url.database in (None, "", ":memory:"):
        return None
    return Path(url.database).expanduser()


def make_duckdb_engine(url: URL, read_only_option: str) -> Engine:
    """An engine on the DuckDB file of ``url`` (its folder created), writes serialized in-process."""
    path = database_path(url)
    if path is not None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise PermanentError(
                f"cannot create the folder {path.parent} of the DuckDB store: {exc.strerror or exc}",
                hint="point --store at a writable folder",
            ) from None
    engine = create_engine(url)
    _count_updated_rows(engine)
    lock = _write_lock(str(path.resolve()) if path is not None else f"memory:{id(engine)}")

    @event.listens_for(engine, "begin")
    def _duckdb_begin(conn: Connection) -> None:
        if conn.get_execution_options().get(read_only_option):
            return
        lock.acquire()
        conn.info[_HELD] = conn.info.get(_HELD, 0) + 1

    def _release(conn: Connection) -> None:
        held = conn.info.pop(_HELD, 0)
        for _ in range(held):
            lock.release()

    event.listen(engine, "commit", _release)
    event.listen(engine, "rollback", _release)
    return engine


def _count_updated_rows(engine: Engine) -> None:
    """Give ``result.rowcount`` of an UPDATE or DELETE its number of rows: DuckDB's cursor says -1
    and returns the count as a one-row result instead (the store's leases and claims read it)."""
    base: Any = engine.dialect.execution_ctx_cls

    class _Context(base):  # type: ignore[misc]
        def post_exec(self) -> None:
            super().post_exec()
            if (self.isupdate or self.isdelete) and not self.compiled.effective_returning:
                description = self.cursor.description
                if description and len(description) == 1 and description[0][0] == "Count":
                    row = self.cursor.fetchone()
                    self._rowcount = int(row[0]) if row else 0

    engine.dialect.execution_ctx_cls = _Context


def classify(exc: BaseException) -> str | None:
    """What a DuckDB exception means: ``"unique"`` (a duplicate key: at the statement, or at commit
    when another connection of the process committed the same key first), ``"conflict"`` (a
    write-write conflict; retrying the transaction is safe), ``"locked"`` (another process holds the
    file), ``"missing"`` (a table does not exist: the store is not initialised), or None."""
    import duckdb

    orig = getattr(exc, "orig", exc)
    if isinstance(orig, duckdb.ConstraintException):
        return "unique" if re.search(r"primary key|unique", str(orig), re.IGNORECASE) else None
    if isinstance(orig, duckdb.TransactionException):
        # The one exception class DuckDB raises for both; its message tells a duplicate key apart.
        if re.search(r"PRIMARY KEY or UNIQUE constraint", str(orig)):
            return "unique"
        return "conflict"
    if isinstance(orig, duckdb.IOException) and "Could not set lock on file" in str(orig):
        return "locked"
    if isinstance(orig, duckdb.CatalogException) and re.search(
        r"Table with name \S+ does not exist", str(orig)
    ):
        return "missing"
    return None


def lock_error(exc: BaseException, path: str) -> PermanentError:
    """The one line for a DuckDB file held by another process, naming the holder DuckDB reports."""
    message = str(getattr(exc, "orig", exc))
    holder = re.search(r"Conflicting lock is held in (.+?)(?: \(PID (\d+)\))?(?: by user|\.|$)", message)
    who = ""
    if holder:
        who = f" by {holder.group(1).strip()}" + (f" (PID {holder.group(2)})" if holder.group(2) else "")
    return PermanentError(f"the DuckDB store {path} is in use by another process{who}", hint=ONE_PROCESS_HINT)


def refuse_several_processes(url: str, what: str) -> None:
    """Refuse in one line when ``url`` is a DuckDB store and ``what`` (a deployment of several
    processes, e.g. "`serve --workers 3` would open it from 3 processes") would open it."""
    from sqlalchemy.engine import make_url

    try:
        parsed = make_url(url)
    except Exception:
        return  # a bad URL gets its own clear error where it is opened
    if parsed.get_backend_name() == NAME:
        raise PermanentError(f"the DuckDB store {parsed.database}: {what}", hint=ONE_PROCESS_HINT)


__all__ = [
    "NAME",
    "ONE_PROCESS_HINT",
    "classify",
    "database_path",
    "lock_error",
    "make_duckdb_engine",
    "refuse_several_processes",
]
