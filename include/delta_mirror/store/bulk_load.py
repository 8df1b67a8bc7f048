"""An import's rows written in bulk: the same rows ``Commits._import_version`` writes one version at
a time, in a few statements (PostgreSQL ``COPY``, SQLite ``executemany``).

An imported table is new, so its whole file index is a function of the imported log alone: it is
built in memory (``file_index.FileIndex``, the file index rule with tombstones, row for row and in
the same insertion order as ``log_rows.write_actions``, so even ``dl_files.id`` comes out the same) and written
as it grows, the newest rows held back (rows closed after they went out are updated at the end).
Action rows are streamed in batches as the versions go by. Everything runs in the caller's
transaction: a failed import leaves nothing behind.

On SQLite the large runs of rows (a commit's action lines, the open add rows of one version) go
as one JSON array into one ``INSERT ... SELECT ... FROM json_each(?)``: SQLite unpacks and stores
them in C with the GIL released, so the importer's reader thread parses the next commit meanwhile
(``executemany`` takes the GIL back for every row, and the two threads then ran one after the
other). Small runs and unusual rows (a line whose first key is not its action) use
``executemany``; both give the same rows, ``dl_files.id`` included.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Iterable, Iterator, Sequence
from itertools import islice
from typing import TYPE_CHECKING, Any

from sqlalchemy import select

from delta_mirror.delta.actions import render_commit
from delta_mirror.delta.line_facts import FileAction, LineFacts
from delta_mirror.delta.protocol import now_ms
from delta_mirror.delta.replay import FileKey
from delta_mirror.store.backends import backend_of
from delta_mirror.store.file_index import (
    F_AP,
    F_AS,
    F_AV,
    F_DT,
    F_DV,
    F_PATH,
    F_PV,
    F_RP,
    F_RS,
    F_SIZE,
    FILE_COLUMNS,
    RV,
    FileIndex,
)
from delta_mirror.store.schema import ANALYZE_STATEMENTS, PART_COMMIT, dl_tables
from delta_mirror.store.states import Artifact, CommitSource, PublishState
from delta_mirror.store.tables import refuse_if_halted, table_info

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection

_ACTION_COLUMNS = ("table_id", "version", "part", "seq", "action_type", "payload")
_COMMIT_COLUMNS = (
    "table_id",
    "version",
    "committed_at",
    "in_commit_timestamp",
    "action_count",
    "size_bytes",
    "sha256",
    "has_json",
    "source",
)
_STATUS_COLUMNS = (
    "table_id",
    "version",
    "artifact",
    "state",
    "attempts",
    "enqueued_at",
    "finished_at",
    "sha256",
    "size_bytes",
)
ACTION_BATCH = 50_000  # action rows buffered before they are written
# SQLite: runs of at least this many rows go through json_each (below it, executemany is as fast).
SQLITE_JSON_ROWS = 256


class BulkImport:
    """The rows of one import into the new table ``table_id`` (see the module docstring)."""

    def __init__(self, conn: Connection, table_id: int) -> None:
        row = conn.execute(select(dl_tables).where(dl_tables.c.id == table_id)).one()
        refuse_if_halted(table_info(row), None)  # a halted table takes no commits, imported ones neither
        self.conn = conn
        self.table_id = table_id
        self.postgres = backend_of(conn).copies  # rows by COPY
        self.index = FileIndex()
        # version, part, seq of the first line, kinds, lines
        self._actions: list[tuple[int, int, int, list[str], Sequence[str]]] = []
        self._buffered = 0
        self._commits: list[tuple[Any, ...]] = []
        self._statuses: list[tuple[Any, ...]] = []
        self._ts = now_ms()
        # File rows go out as they are made, the newest ACTION_BATCH kept back (the database
        # indexes them while the log is still being read: PostgreSQL's server, SQLite's steps
        # with the GIL released); the ones sent open and closed later are updated at the end.
        self._files_sent = 0
        self._sent_open: list[list[Any]] = []
        # PostgreSQL: the last COPY, left open once its rows are written (its cursor and context):
        # the server stores their tail while the next rows are made (``_copy``).
        self._open_copy: tuple[Any, Any] | None = None

    def version(
        self,
        version: int,
        lines: Sequence[str],
        facts: LineFacts,
        *,
        part: int = PART_COMMIT,
        has_json: bool = True,
        published: tuple[str, int] | None = None,
        index_files: bool = True,
        lines_sent: int = 0,
        rendered: tuple[str, int] | None = None,
    ) -> None:
        """One version's rows, as ``Commits._import_version`` writes them. ``published`` is the
        (sha256, size) of a commit file already at the location (in-place import);
        ``lines_sent``: its first lines already went to ``lines`` (a large commit, while parsed);
        ``rendered``: the (sha256, size) of ``render_commit(lines)``, when already taken."""
        tid, ts = self.table_id, self._ts
        if part == PART_COMMIT:
            if not has_json:
                commit_sha, commit_size = "", 0
            elif rendered is not None:
                commit_sha, commit_size = rendered
            else:
                data = render_commit(lines)
                commit_sha, commit_size = hashlib.sha256(data).hexdigest(), len(data)
            ict = facts.in_commit_timestamp if facts.kinds and facts.kinds[0] == "commitInfo" else None
            self._commits.append(
                (
                    tid,
                    version,
                    ts,
                    ict if isinstance(ict, int) else None,
                    len(lines),
                    commit_size,
                    commit_sha,
                    has_json,
                    CommitSource.IMPORT.value,
                )
            )
            if has_json:
                state = PublishState.SUCCESS if published else PublishState.PENDING
                sha, size = published if published else (None, None)
                finished = ts if published else None
                self._statuses.append(
                    (tid, version, Artifact.JSON.value, state.value, 0, ts, finished, sha, size)
                )
        if len(facts.kinds) != len(lines):
            raise ValueError(f"version {version}: {len(lines)} lines but {len(facts.kinds)} action types")
        if len(lines) > lines_sent:
            self.lines(version, lines_sent, facts.kinds[lines_sent:], lines[lines_sent:], part)
        if not index_files and self.index.has_early(version):
            raise ValueError(f"version {version}: early file rows for a version that is not indexed")
        if index_files:
            self.index.apply(version, part, facts.files)
            # The newest ACTION_BATCH rows stay here: a file removed soon after its add is then
            # sent closed, not sent open and updated at the end (a long history's churn).
            if len(self.index.rows) - self._files_sent >= 2 * ACTION_BATCH:
                self._send_files(len(self.index.rows) - ACTION_BATCH)

    def lines(
        self,
        version: int,
        seq: int,
        kinds: list[str],
        lines: Sequence[str],
        part: int = PART_COMMIT,
        *,
        at_once: bool = False,
        files: Sequence[FileAction] = (),
    ) -> None:
        """Action rows of ``version`` from line ``seq`` on (the rest of the version follows);
        ``at_once``: written now, not when ``ACTION_BATCH`` rows are buffered (a large commit's
        first lines: the database starts on them while the rest is parsed). ``files``: the adds
        among these lines of a version that holds adds only: their file rows are made and sent
        now (``FileIndex.early``)."""
        self._actions.append((version, part, seq, kinds, lines))
        self._buffered += len(lines)
        if at_once or self._buffered >= ACTION_BATCH:
            self._flush_actions()
        if files:
            self.index.early(version, part, files)
            self._send_files()

    def drop_files(self, version: int, keys: Iterable[FileKey]) -> None:
        self.index.drop(version, keys)

    def enqueue_checkpoint(self, version: int) -> None:
        """A mirror checkpoint to write at ``version`` (``PENDING``)."""
        row = (self.table_id, version, Artifact.CHECKPOINT.value, PublishState.PENDING.value, 0, self._ts)
        if not any(s[1] == version and s[2] == row[2] for s in self._statuses):
            self._statuses.append((*row, None, None, None))

    def finish(self) -> None:
        """Write what is still buffered: actions, commits, statuses, the file index."""
        self._flush_actions()
        self._write("dl_commits", _COMMIT_COLUMNS, self._commits)
        self._write("dl_mirror_status", _STATUS_COLUMNS, self._statuses)
        self._commits, self._statuses = [], []
        self._send_files()
        self._close_sent_files([row for row in self._sent_open if row[RV] is not None])
        self.end_copy()

    def abort(self, exc: BaseException) -> None:
        """The import failed: end a COPY left open as failed (the server refuses its rows; the
        transaction then rolls back as for any other error). Nothing else may use the connection
        while a COPY is open."""
        if self._open_copy is not None:
            cur, copy = self._open_copy
            self._open_copy = None
            try:
                copy.__exit__(type(exc), exc, exc.__traceback__)
            except Exception:  # a lost connection: ``exc`` is the error to report
                pass
            finally:
                cur.close()

    def _close_sent_files(self, closed: list[list[Any]]) -> None:
        """Close the file rows sent while open and removed since (``closed``), and let the planner
        see the new rows; each backend's bulk import (MySQL, DuckDB) has its own."""
        tid = self.table_id
        self.end_copy()
        if not self.postgres:
            if closed:
                self.conn.exec_driver_sql(
                    _SQLITE_CLOSE_SENT,
                    [
                        (r[RV], r[F_RP], r[F_RS], r[F_DT], tid, r[F_PATH], r[F_DV], r[F_AV], r[F_AP], r[F_AS])
                        for r in closed
                    ],
                )
            return
        # The planner must not take the new rows for an empty table (here and after the import).
        self.conn.exec_driver_sql(ANALYZE_STATEMENTS[0])
        if closed:
            self._close_sent(closed)
        self.conn.exec_driver_sql(ANALYZE_STATEMENTS[1])

    def _send_files(self, upto: int | None = None) -> None:
        """The file rows not sent yet (up to row ``upto``): COPY, or SQLite's ``executemany``."""
        rows = self.index.rows[self._files_sent : upto]
        if rows:
            if self.postgres:
                self._copy("dl_files", ("table_id", *FILE_COLUMNS), _file_text(self.table_id, rows))
            else:
                self._sqlite_files(rows)
            self._sent_open += [row for row in rows if row[RV] is None]
            self._files_sent += len(rows)

    def _close_sent(self, closed: list[list[Any]]) -> None:
        """Rows sent while open and closed since: one UPDATE by (path, deletion vector, add
        position), which is unique among a table's add rows."""
        columns = list(zip(*closed, strict=True))
        columns[F_PATH] = tuple(
            p if type(p) is str else str(p) for p in columns[F_PATH]
        )  # as COPY wrote them
        self.conn.exec_driver_sql(
            _PG_CLOSE_SENT,
            {
                "tid": self.table_id,
                **{name: list(columns[i]) for name, i in _CLOSE_FIELDS.items()},
            },
        )

    def _flush_actions(self) -> None:
        tid = self.table_id
        if self.postgres:
            self._copy("dl_actions", _ACTION_COLUMNS, _action_text(tid, self._actions))
        else:
            rows: list[Sequence[Any]] = []
            json_each = _has_json_each()
            for version, part, first, kinds, lines in self._actions:
                if json_each and len(lines) >= SQLITE_JSON_ROWS and _kinds_lead(kinds, lines):
                    self.conn.exec_driver_sql(
                        _SQLITE_JSON_ACTIONS, (tid, version, part, first, _JSON.encode(lines))
                    )
                else:
                    rows += [
                        (tid, version, part, seq, kind, line)
                        for seq, (kind, line) in enumerate(zip(kinds, lines, strict=True), start=first)
                    ]
            self._insert("dl_actions", _ACTION_COLUMNS, rows)
        self._actions, self._buffered = [], 0

    def _sqlite_files(self, rows: list[list[Any]]) -> None:
        """File rows in order: runs of open add rows of one (version, part) through json_each,
        the rest with ``executemany``."""
        tid, columns = self.table_id, ("table_id", *FILE_COLUMNS)
        start = 0
        for end, run in _add_runs(rows) if _has_json_each() else ():
            self._insert("dl_files", columns, [(tid, *row) for row in rows[start : end - len(run)]])
            version, part = rows[end - 1][F_AV], rows[end - 1][F_AP]
            self.conn.exec_driver_sql(_SQLITE_JSON_FILES, (tid, version, part, _JSON.encode(run)))
            start = end
        self._insert("dl_files", columns, [(tid, *row) for row in rows[start:]])

    def _write(self, table: str, columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
        if self.postgres:
            self._copy(table, columns, (_row_text(row) for row in rows))
        else:
            self._insert(table, columns, list(rows))

    def _copy(self, table: str, columns: Sequence[str], text: Iterable[str]) -> None:
        """``COPY ... FROM STDIN`` (text format) of already formatted lines, in large writes.

        The COPY is left open once its rows are written and ended by the next statement
        (``end_copy``): the server still stores the last of them (a socket's worth) while this
        thread makes the next rows (a version's file index, the next COPY text), instead of
        waiting for it and then leaving it idle."""
        self.end_copy()
        raw = self.conn.connection.driver_connection
        assert raw is not None
        cur = raw.cursor()
        try:
            copy = cur.copy(f"COPY {table} ({', '.join(columns)}) FROM STDIN")
            writer = copy.__enter__()
        except BaseException:
            cur.close()
            raise
        self._open_copy = (cur, copy)
        lines = iter(text)
        try:
            # join() drains the generator in C: no Python step per row here.
            while chunk := "".join(islice(lines, _COPY_CHUNK)):
                writer.write(chunk.encode())
        except BaseException as exc:
            self.abort(exc)
            raise

    def end_copy(self) -> None:
        """Wait for the COPY left open (its errors are raised here: the rows were refused); called
        before any other statement on the connection."""
        if self._open_copy is not None:
            cur, copy = self._open_copy
            self._open_copy = None
            try:
                copy.__exit__(None, None, None)
            finally:
                cur.close()

    def _insert(self, table: str, columns: Sequence[str], rows: list[Sequence[Any]]) -> None:
        if rows:
            marks = ", ".join("?" for _ in columns)
            self.conn.exec_driver_sql(f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({marks})", rows)


_CLOSE_FIELDS = {
    "path": F_PATH,
    "dv": F_DV,
    "av": F_AV,
    "ap": F_AP,
    "aseq": F_AS,
    "rv": RV,
    "rp": F_RP,
    "rs": F_RS,
    "dt": F_DT,
}
_PG_CLOSE_SENT = """
UPDATE dl_files f
SET remove_version = x.rv, remove_part = x.rp, remove_seq = x.rs, deletion_timestamp = x.dt
FROM unnest(%(path)s::text[], %(dv)s::text[], %(av)s::bigint[], %(ap)s::smallint[], %(aseq)s::int[],
            %(rv)s::bigint[], %(rp)s::smallint[], %(rs)s::int[], %(dt)s::bigint[])
     AS x(path, dv_id, av, ap, aseq, rv, rp, rs, dt)
WHERE f.table_id = %(tid)s AND f.path = x.path AND f.dv_id = x.dv_id
  AND f.add_version = x.av AND f.add_part = x.ap AND f.add_seq = x.aseq
"""

_SQLITE_CLOSE_SENT = """
UPDATE dl_files SET remove_version = ?, remove_part = ?, remove_seq = ?, deletion_timestamp = ?
WHERE table_id = ? AND path = ? AND dv_id = ? AND add_version = ? AND add_part = ? AND add_seq = ?
"""

# One JSON array of lines in, one row per element out, in array order (``key`` is the index). The
# action type is the line's first key, read back from the line (``_kinds_lead`` made sure it is).
_SQLITE_JSON_ACTIONS = """
INSERT INTO dl_actions (table_id, version, part, seq, action_type, payload)
SELECT ?, ?, ?, ? + key, substr(value, 3, instr(value, '":') - 3), value FROM json_each(?)
"""
# Elements [path, dv_id, add_seq, size, partition_values] of open add rows of one (version, part).
_SQLITE_JSON_FILES = """
INSERT INTO dl_files (table_id, path, dv_id, add_version, add_part, add_seq, size, partition_values)
SELECT ?, json_extract(value, '$[0]'), json_extract(value, '$[1]'), ?, ?, json_extract(value, '$[2]'),
       json_extract(value, '$[3]'), json_extract(value, '$[4]')
FROM json_each(?)
"""
# Strings go as UTF-8 (only quotes, backslashes and control characters escaped): SQLite decodes
# those exactly.
_JSON = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))
_INT64 = range(-(2**63), 2**63)


@functools.cache
def _has_json_each() -> bool:
    """Whether the process's SQLite has the JSON functions (built in since 3.38, an option before;
    every SQLite connection of the process uses the same library)."""
    import sqlite3

    con = sqlite3.connect(":memory:")
    try:
        return bool(con.execute("SELECT count(*) FROM json_each('[1]')").fetchone() == (1,))
    except sqlite3.Error:  # an old SQLite without JSON1: executemany it is
        return False
    finally:
        con.close()


def _kinds_lead(kinds: Sequence[str], lines: Sequence[str]) -> bool:
    """Whether every line starts with ``{"<its action type>":`` (an action type with no quote or
    backslash): then the type is the text up to the first ``":``, as ``_SQLITE_JSON_ACTIONS`` reads it."""
    heads: dict[str, str | None] = {}
    for kind, line in zip(kinds, lines, strict=True):
        head = heads.get(kind, "")
        if head == "":
            head = heads[kind] = None if '"' in kind or "\\" in kind else f'{{"{kind}":'
        if head is None or not line.startswith(head):
            return False
    return True


def _json_element(row: list[Any]) -> list[Any] | None:
    """The row as a ``_SQLITE_JSON_FILES`` element: an open add whose fields JSON carries exactly
    (a text path, no size or an int64); None for any other row."""
    size = row[F_SIZE]
    if row[RV] is not None or row[F_AV] is None or type(row[F_PATH]) is not str:
        return None
    if size is not None and (type(size) is not int or size not in _INT64):
        return None
    return [row[F_PATH], row[F_DV], row[F_AS], size, row[F_PV]]


def _add_runs(rows: Sequence[list[Any]]) -> Iterator[tuple[int, list[list[Any]]]]:
    """Runs of at least ``SQLITE_JSON_ROWS`` consecutive ``_json_element`` rows of one (version,
    part): ``(end, elements)``, ``end`` the index after the run's last row."""
    run: list[list[Any]] = []
    key: tuple[Any, Any] | None = None
    for i, row in enumerate(rows):
        element = _json_element(row)
        row_key = None if element is None else (row[F_AV], row[F_AP])
        if element is None or row_key != key:
            if len(run) >= SQLITE_JSON_ROWS:
                yield i, run
            run, key = [], row_key
        if element is not None:
            run.append(element)
    if len(run) >= SQLITE_JSON_ROWS:
        yield len(rows), run


# COPY's text format: a tab between fields, \N for NULL, backslash escapes for \, tab, LF and CR.
def _escape(text: str) -> str:
    """(Four ``str.replace`` calls: far faster than ``str.translate`` with a mapping.)"""
    return text.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n").replace("\r", "\\r")


_COPY_CHUNK = 2_000  # rows per write: the server stores each while the next is formatted


def _field_text(value: Any) -> str:
    """One field of a COPY text row (the values an import stores: text, integers, booleans, NULL)."""
    if value is None:
        return "\\N"
    if type(value) is str:
        return _escape(value)
    if type(value) is bool:
        return "t" if value else "f"
    if type(value) is int:
        return str(value)
    raise TypeError(f"cannot store {type(value).__name__} value {value!r:.80} as text")


def _row_text(row: Sequence[Any]) -> str:
    return "\t".join([_field_text(v) for v in row]) + "\n"


def _file_text(tid: int, rows: Iterable[list[Any]]) -> Iterator[str]:
    """``dl_files`` rows as COPY text: ``_row_text`` unrolled for the common row (text path and
    partition values, integers or NULL elsewhere), which is most of the rows of a large import."""
    n = "\\N"
    for row in rows:
        path, dv, av, ap, aseq, rv, rp, rs, size, pv, dt = row
        if (
            type(path) is not str
            or type(dv) is not str
            or not (size is None or type(size) is int)
            or not (dt is None or type(dt) is int)
            or "\t" in path
            or "\n" in path
            or "\r" in path
            or "\\" in path
        ):
            yield _row_text((tid, *row))
            continue
        if dv:
            dv = _escape(dv)
        if pv is None:
            pv = n
        elif "\\" in pv:  # compact JSON: no raw tab, newline or carriage return
            pv = pv.replace("\\", "\\\\")
        if rv is None:  # an open add (most rows): no remove fields, no deletion timestamp
            yield f"{tid}\t{path}\t{dv}\t{av}\t{ap}\t{aseq}\t{n}\t{n}\t{n}\t{n if size is None else size}\t{pv}\t{n}\n"
            continue
        yield (
            f"{tid}\t{path}\t{dv}\t{n if av is None else av}\t{n if ap is None else ap}\t"
            f"{n if aseq is None else aseq}\t{n if rv is None else rv}\t{n if rp is None else rp}\t"
            f"{n if rs is None else rs}\t{n if size is None else size}\t{pv}\t{n if dt is None else dt}\n"
        )


def _action_text(tid: int, batch: Iterable[tuple[int, int, int, list[str], Sequence[str]]]) -> Iterator[str]:
    """``dl_actions`` rows as COPY text. A canonical line (``canonical_json``) holds no raw tab,
    newline or carriage return (JSON escapes control characters), so only backslashes need doubling."""
    kind_text: dict[str, str] = {}
    for version, part, first, kinds, lines in batch:
        head = f"{tid}\t{version}\t{part}\t"
        for seq, (kind, line) in enumerate(zip(kinds, lines, strict=True), start=first):
            k = kind_text.get(kind)
            if k is None:
                k = kind_text[kind] = _field_text(kind)
            if "\\" in line:
                line = line.replace("\\", "\\\\")
            yield f"{head}{seq}\t{k}\t{line}\n"


__all__ = ["ACTION_BATCH", "BulkImport", "FileIndex"]
