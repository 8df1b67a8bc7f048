"""The publisher's commit writer: a thread that puts prepared commit files strictly in version
order while the caller reads, checks and renders the next ones (store round trips and CPU overlap
the writes instead of adding to them).

Only preparation runs ahead. ``put_if_absent`` makes ``v.json`` visible at once, so the writer puts
v only after v-1 was put *and read back*: a write the storage acknowledged but lost must stop the
run before v becomes visible, or readers would see a gap (invariant 1). So one table has exactly
one commit file in flight; what overlaps it is the work for the versions after it.

The storage calls release the GIL, but the writer needs it back for a few microseconds between
them (put, read-back, bookkeeping). With the interpreter's default 5 ms switch interval it waited
behind the preparing thread for most of each put (profile: put 876 µs on the writer against about
250 µs in the bare loop), so a running writer shortens the interval (``_FastSwitching``), and the
preparing thread fills the queue in bursts (it waits for the queue to drain to half, not for one
free slot) so the two threads hand the GIL and the lock over far less often.
"""

from __future__ import annotations

import hashlib
import sys
import threading
from collections import deque
from collections.abc import Callable
from typing import NamedTuple

from delta_mirror.delta.log_path import LOG_DIR, commit_name
from delta_mirror.errors import PermanentError, PublishConflictError, TransientError
from delta_mirror.storage import ObjectExistsError, ObjectStore

#: Prepared commits waiting for the writer, at most (a backlog batch fits, so the next batch is
#: fetched from the store while this one is written) ...
DEFAULT_DEPTH = 1024
#: ... and at most this many bytes of them (a few huge commits do not pile up in memory).
DEFAULT_MAX_BYTES = 64 * 1024 * 1024
#: The thread switch interval while a writer runs (seconds; the interpreter's default is 0.005).
WRITER_SWITCH_INTERVAL = 0.0002


class _FastSwitching:
    """Shortens ``sys.setswitchinterval`` while at least one writer runs, and puts the previous
    value back when the last one stops (unless someone else changed it meanwhile)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._users = 0
        self._saved = 0.0

    def __enter__(self) -> None:
        with self._lock:
            if self._users == 0:
                self._saved = sys.getswitchinterval()
                if self._saved > WRITER_SWITCH_INTERVAL:
                    sys.setswitchinterval(WRITER_SWITCH_INTERVAL)
            self._users += 1

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            self._users -= 1
            if self._users == 0 and sys.getswitchinterval() == WRITER_SWITCH_INTERVAL:
                sys.setswitchinterval(self._saved)


_fast_switching = _FastSwitching()


class PreparedCommit(NamedTuple):
    """A commit file rendered from the store and checked against its recorded SHA-256 (a named
    tuple: one is made per version published, cheaper than a frozen dataclass)."""

    version: int
    data: bytes
    digest: str


class Written(NamedTuple):
    commit: PreparedCommit
    already_present: bool


class CommitWriter:
    """Runs ``put`` for each submitted commit on one thread, in submission order, and stops at the
    first failure (nothing after it is written). ``put`` returns True when an identical file was
    already there."""

    def __init__(
        self,
        put: Callable[[PreparedCommit], bool],
        *,
        depth: int = DEFAULT_DEPTH,
        max_bytes: int = DEFAULT_MAX_BYTES,
    ) -> None:
        self._put = put
        self._depth = max(1, depth)
        self._low = self._depth // 2  # a full queue takes commits again once drained to this
        self._max_bytes = max_bytes
        self._pending: deque[PreparedCommit] = deque()
        self._pending_bytes = 0
        self._busy = False
        self._closed = False
        self._room_waiters = 0  # submitters waiting for the queue to drain (the writer notifies only then)
        self._written: list[Written] = []
        self._cond = threading.Condition()
        #: the first failure of a put (raised to the caller by ``submit`` / ``drain``)
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="delta-mirror-commit-writer", daemon=True)
        _fast_switching.__enter__()
        self._switching = True
        self._thread.start()

    def submit(self, commit: PreparedCommit) -> None:
        """Queue ``commit`` behind the others; once the queue is full, waits until it drained to
        half. Raises the writer's failure instead once there is one (the caller stops preparing)."""
        size = len(commit.data)
        with self._cond:
            if self._pending and self._full(size):
                self._room_waiters += 1
                try:
                    while self.error is None and self._pending and not self._room(size):
                        self._cond.wait()
                finally:
                    self._room_waiters -= 1
            if self.error is not None:
                raise self.error
            self._pending.append(commit)
            self._pending_bytes += size
            if len(self._pending) == 1:  # the writer may be waiting for work
                self._cond.notify_all()

    def _full(self, size: int) -> bool:
        return len(self._pending) >= self._depth or self._pending_bytes + size > self._max_bytes

    def _room(self, size: int) -> bool:
        return len(self._pending) <= self._low and self._pending_bytes + size <= self._max_bytes

    def drain(self) -> None:
        """Wait until every queued commit is written or the writer stopped at a failure; then raise
        that failure, if any."""
        with self._cond:
            while self.error is None and (self._pending or self._busy):
                self._cond.wait()
            if self.error is not None:
                raise self.error

    def settle(self) -> BaseException | None:
        """Like ``drain`` but returns the failure instead of raising it (for error handling)."""
        try:
            self.drain()
        except BaseException as exc:
            return exc
        return None

    def take_written(self) -> list[Written]:
        """The commits written since the last call, in version order."""
        with self._cond:
            out, self._written = self._written, []
        return out

    def close(self) -> None:
        """Stop the thread; commits still queued are dropped (call ``drain`` first to keep them)."""
        with self._cond:
            self._closed = True
            self._pending.clear()
            self._pending_bytes = 0
            self._cond.notify_all()
        self._thread.join()
        if self._switching:
            self._switching = False
            _fast_switching.__exit__()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._pending and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                commit = self._pending.popleft()
                self._pending_bytes -= len(commit.data)
                self._busy = True
                if self._room_waiters and len(self._pending) <= self._low:  # they may go on now
                    self._cond.notify_all()
            try:
                present = self._put(commit)
            except BaseException as exc:
                with self._cond:
                    self.error = exc
                    self._busy = False
                    self._pending.clear()
                    self._pending_bytes = 0
                    self._cond.notify_all()
                return
            with self._cond:
                self._written.append(Written(commit, present))
                self._busy = False
                if not self._pending:  # drain() waits for an empty queue and an idle writer
                    self._cond.notify_all()


#: hashlib lets go of the GIL for a chunk of this size or more (CPython's HASHLIB_GIL_MINSIZE).
_GIL_FREE_HASH = 2048


def commit_digest(data: bytes) -> str:
    """SHA-256 of a commit file in chunks too small for hashlib to release the GIL: a release costs
    the preparing thread a wait of up to the switch interval to get it back from the commit writer
    (about 110 µs per version measured, for 5 µs of hashing)."""
    if len(data) < _GIL_FREE_HASH:
        return hashlib.sha256(data).hexdigest()
    h, view = hashlib.sha256(), memoryview(data)
    for i in range(0, len(data), _GIL_FREE_HASH - 1):
        h.update(view[i : i + _GIL_FREE_HASH - 1])
    return h.hexdigest()


def _existing_commit(table: str, objects: ObjectStore, version: int, path: str, data: bytes) -> bytes | None:
    """The bytes at ``path`` after a put found it taken; ``None`` when it had vanished and a second
    put wrote it. Taken yet unreadable twice is no file (a folder where the commit file belongs):
    no retry fixes that, an operator does."""
    existing = objects.get(path)
    if existing is not None:
        return existing
    try:
        objects.put_if_absent(path, data)
        return None
    except ObjectExistsError:
        existing = objects.get(path)
    if existing is None:
        raise PermanentError(
            f"{path} exists but is not a file that can be read (a folder where the commit file belongs?)",
            table=table,
            version=version,
            hint=f"remove or rename what is at {path} in the table's location (only delta-mirror writes "
            f"there), then run `delta-mirror mirror {table}`",
        )
    return existing


def put_commit(table: str, objects: ObjectStore, version: int, data: bytes, digest: str) -> bool:
    """Put-if-absent one commit and read it back; True when an identical file was already there."""
    path = f"{LOG_DIR}/{commit_name(version)}"
    try:
        objects.put_if_absent(path, data)
        present = False
    except ObjectExistsError:
        existing = _existing_commit(table, objects, version, path, data)
        if existing is not None and existing != data:
            found = hashlib.sha256(existing).hexdigest()
            raise PublishConflictError(
                f"a different file already exists at {path} (expected sha256 {digest}, found {found})",
                table=table,
                version=version,
                expected_sha256=digest,
                found_sha256=found,
                hint="an external writer or a split brain wrote to this log; the table is halted. Import the "
                "foreign commit or restore the log, then `delta-mirror resume`",
            ) from None
        present = existing is not None  # None: it had vanished, and the second put wrote it
    meta = objects.head(path)
    if meta is None or meta.size != len(data):
        raise TransientError(
            f"{path} is not durable after the write (size {meta.size if meta else None})",
            table=table,
            version=version,
            hint="retried automatically",
        )
    return present


__all__ = ["CommitWriter", "PreparedCommit", "Written", "commit_digest", "put_commit"]
