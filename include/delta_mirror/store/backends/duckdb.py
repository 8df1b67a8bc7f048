"""The store on a DuckDB file: its engine, its errors and its one-process rule; every commit by the
transaction path, an import's rows as Arrow tables (``duckdb_bulk``), bulk reads as Arrow blocks.

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
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
from alembic.ddl.impl import DefaultImpl
from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import SQLAlchemyError

from delta_mirror.config import redact_url
from delta_mirror.errors import MirrorError, PermanentError, TransientError
from delta_mirror.extras import require
from delta_mirror.store.backends import Backend, not_initialised
from delta_mirror.store.commit_writer import TransactionOnly
from delta_mirror.store.db import READ_ONLY
from delta_mirror.store.duckdb_bulk import DuckDBBulkImport

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


# PostgreSQL's per-version join (chr(10): DuckDB has no E'' strings).
_JOINED_LINES = (
    "SELECT version, string_agg(payload, chr(10) ORDER BY seq) FROM dl_actions "
    "WHERE table_id = ? AND part = ? AND version BETWEEN ? AND ? GROUP BY version"
)


class DuckDB(Backend):
    name = NAME
    joined_lines = _JOINED_LINES
    arrow_blocks = True
    writer = TransactionOnly  # every commit by the transaction path
    bulk_import = DuckDBBulkImport

    def engine(self, url: URL, text: str) -> Engine:
        require("duckdb", "duckdb", "the DuckDB store")
        require("duckdb_engine", "duckdb", "the DuckDB store")
        return make_duckdb_engine(url, READ_ONLY)

    def classify_error(self, exc: SQLAlchemyError, url: str, action: str) -> MirrorError | None:
        """By exception class (DuckDB has no SQLSTATE)."""
        if not type(getattr(exc, "orig", None)).__module__.startswith(("duckdb", "_duckdb")):
            return None
        where = redact_url(url)
        kind = classify(exc)
        if kind == "locked":
            return lock_error(exc, str(make_url(url).database))
        if kind == "missing":
            return not_initialised(where)
        if kind == "conflict":
            return TransientError(
                f"DuckDB write conflict while {action} ({where})", hint="retried automatically"
            )
        detail = str(getattr(exc, "orig", exc))[:300]
        return PermanentError(f"database error while {action} ({where}): {detail}")

    def is_unique_violation(self, exc: SQLAlchemyError) -> bool:
        return classify(exc) == "unique"


class _WriteQueue:
    """The write lock of one DuckDB file in this process. The thread holding it may take it again
    (a nested write transaction); it is released when the transaction has ended, which may happen
    on another thread (a pooled connection reset or closed by the pool)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._owner: int | None = None
        self._depth = 0

    def acquire(self, timeout: float) -> bool:
        me = threading.get_ident()
        with self._cond:
            if not self._cond.wait_for(lambda: self._owner in (None, me), timeout):
                return False
            self._owner = me
            self._depth += 1
            return True

    def release(self) -> None:
        with self._cond:
            self._depth -= 1
            if self._depth <= 0:
                self._owner, self._depth = None, 0
                self._cond.notify_all()


# One queue per database file in this process: every engine on the file shares it.
_QUEUES: dict[str, _WriteQueue] = {}
_QUEUES_GUARD = threading.Lock()
WRITE_WAIT_SECONDS = 300.0


def _write_queue(key: str) -> _WriteQueue:
    with _QUEUES_GUARD:
        queue = _QUEUES.get(key)
        if queue is None:
            queue = _QUEUES[key] = _WriteQueue()
        return queue


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
    _queue_writes(
        engine, str(path.resolve()) if path is not None else f"memory:{id(engine)}", read_only_option
    )
    return engine


def _queue_writes(engine: Engine, key: str, read_only_option: str) -> None:
    """Write transactions on the file wait for each other: taken before DuckDB's BEGIN, released
    after its COMMIT or ROLLBACK has returned (SQLAlchemy's commit and rollback events come before
    them, too early: the next writer's snapshot would miss the rows and conflict)."""
    queue = _write_queue(key)
    held: dict[int, int] = {}  # id() of a DBAPI connection -> the times it took the queue
    guard = threading.Lock()

    @event.listens_for(engine, "begin")
    def _duckdb_begin(conn: Connection) -> None:
        if conn.get_execution_options().get(read_only_option):
            return
        if not queue.acquire(WRITE_WAIT_SECONDS):
            raise TransientError(
                f"another write to the DuckDB store has run for over {WRITE_WAIT_SECONDS:.0f} s",
                hint="retried automatically",
            )
        with guard:
            key = id(_driver_connection(conn.connection))
            held[key] = held.get(key, 0) + 1

    def _ended(dbapi_connection: Any, *_args: Any) -> None:
        with guard:
            times = held.pop(id(_driver_connection(dbapi_connection)), 0)
        for _n in range(times):
            queue.release()

    dialect = engine.dialect
    commit, rollback = dialect.do_commit, dialect.do_rollback

    def do_commit(dbapi_connection: Any) -> None:
        try:
            commit(dbapi_connection)
        finally:
            _ended(dbapi_connection)

    def do_rollback(dbapi_connection: Any) -> None:
        try:
            rollback(dbapi_connection)
        finally:
            _ended(dbapi_connection)

    setattr(dialect, "do_commit", do_commit)  # noqa: B010 (an instance's method, replaced)
    setattr(dialect, "do_rollback", do_rollback)  # noqa: B010
    for name in ("invalidate", "soft_invalidate", "close", "close_detached"):
        event.listen(engine.pool, name, _ended)


def _driver_connection(connection: Any) -> Any:
    """The DBAPI connection itself: SQLAlchemy hands ``do_commit`` and ``do_rollback`` the pool's
    proxy of it, the pool's events the connection."""
    return getattr(connection, "dbapi_connection", None) or connection


def _count_updated_rows(engine: Engine) -> None:
    """Give ``result.rowcount`` of an UPDATE or DELETE its number of rows: DuckDB's cursor says -1
    and returns the count as a one-row result instead (the store's leases and claims read it)."""
    base: Any = engine.dialect.execution_ctx_cls

    class _Context(base):  # type: ignore[misc]
        def post_exec(self) -> None:
            super().post_exec()
            # Not after executemany: DuckDB's result is the last statement's count (-1 stays:
            # "unknown", which the store's callers treat as such).
            if (
                (self.isupdate or self.isdelete)
                and not self.executemany
                and not self.compiled.effective_returning
            ):
                description = self.cursor.description
                if description and len(description) == 1 and description[0][0] == "Count":
                    row = self.cursor.fetchone()
                    self._rowcount = int(row[0]) if row else 0

    engine.dialect.execution_ctx_cls = _Context


def arrow_line_blocks(
    conn: Connection, sql: str, block_bytes: int, rows_per_batch: int = 32_768
) -> Iterator[bytes]:
    """The one text column of ``sql`` as blocks of about ``block_bytes`` of whole ``\\n``-terminated
    lines, from DuckDB's Arrow record batches: a batch's lines are a slice of its string buffer (no
    Python string per row), as PostgreSQL's COPY gives the checkpoint its blocks."""
    import duckdb
    from sqlalchemy.exc import OperationalError

    raw: Any = conn.connection.driver_connection
    lines = f"SELECT q.line || chr(10) FROM ({sql}) AS q(line)"
    pending = bytearray()
    try:
        for batch in raw.execute(lines).to_arrow_reader(rows_per_batch):
            pending += _batch_bytes(batch.column(0))
            while len(pending) >= block_bytes:
                cut = pending.find(b"\n", block_bytes - 1)
                if cut < 0:
                    break
                yield bytes(pending[: cut + 1])
                del pending[: cut + 1]
    except duckdb.Error as exc:
        raise OperationalError(lines, None, exc) from exc
    if pending:
        yield bytes(pending)


def _batch_bytes(column: Any) -> bytes:
    """The UTF-8 bytes of a string column's values, one after the other."""
    if len(column) == 0:
        return b""
    if column.null_count or not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):
        return "".join(column.to_pylist()).encode("utf-8")
    width = pa.int64() if pa.types.is_large_string(column.type) else pa.int32()
    offsets = pa.Array.from_buffers(width, len(column) + 1, [None, column.buffers()[1]], offset=column.offset)
    start, end = offsets[0].as_py(), offsets[-1].as_py()
    return bytes(column.buffers()[2].slice(start, end - start).to_pybytes())


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
    holder = re.search(r"Conflicting lock is held in (\S+)(?: \(PID (\d+)\))?", message)
    who = ""
    if holder:
        who = f" ({holder.group(1)}" + (f", PID {holder.group(2)})" if holder.group(2) else ")")
    return PermanentError(f"the DuckDB store {path} is in use by another process{who}", hint=ONE_PROCESS_HINT)


def refuse_several_processes(url: str, what: str, *, hint: str = ONE_PROCESS_HINT) -> None:
    """Refuse in one line when ``url`` is a DuckDB store and ``what`` (a deployment of several
    processes, e.g. "`serve --workers 3` would open it from 3 processes") would open it."""
    try:
        parsed = make_url(url)
    except Exception:
        return  # a bad URL gets its own clear error where it is opened
    if parsed.get_backend_name() == NAME:
        raise PermanentError(f"the DuckDB store {parsed.database}: {what}", hint=hint)


BACKEND = DuckDB()

__all__ = [
    "BACKEND",
    "NAME",
    "ONE_PROCESS_HINT",
    "DuckDB",
    "arrow_line_blocks",
    "classify",
    "database_path",
    "lock_error",
    "make_duckdb_engine",
    "refuse_several_processes",
]
