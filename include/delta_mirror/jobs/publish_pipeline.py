"""The publisher's commit writer: a thread that puts prepared commit files strictly in version
order while the caller reads, checks and renders the next ones (store round trips and CPU overlap
the writes instead of adding to them).

Only preparation runs ahead. ``put_if_absent`` makes ``v.json`` visible at once, so the writer puts
v only after v-1 was put *and read back*: a write the storage acknowledged but lost must stop the
run before v becomes visible, or readers would see a gap (invariant 1). So one table has exactly
one commit file in flight; what overlaps it is the work for the versions after it.
"""

from __future__ import annotations

import hashlib
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from delta_mirror.delta.log_path import LOG_DIR, commit_name
from delta_mirror.errors import PublishConflictError, TransientError
from delta_mirror.storage import ObjectExistsError, ObjectStore

#: Prepared commits waiting for the writer, at most (a backlog batch fits, so the next batch is
#: fetched from the store while this one is written) ...
DEFAULT_DEPTH = 1024
#: ... and at most this many bytes of them (a few huge commits do not pile up in memory).
DEFAULT_MAX_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class PreparedCommit:
    """A commit file rendered from the store and checked against its recorded SHA-256."""

    version: int
    data: bytes
    digest: str


@dataclass(frozen=True)
class Written:
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
        self._max_bytes = max_bytes
        self._pending: deque[PreparedCommit] = deque()
        self._pending_bytes = 0
        self._busy = False
        self._closed = False
        self._written: list[Written] = []
        self._cond = threading.Condition()
        #: the first failure of a put (raised to the caller by ``submit`` / ``drain``)
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="delta-mirror-commit-writer", daemon=True)
        self._thread.start()

    def submit(self, commit: PreparedCommit) -> None:
        """Queue ``commit`` behind the others; waits while the queue is full. Raises the writer's
        failure instead once there is one (the caller stops preparing)."""
        with self._cond:
            while self.error is None and self._pending and self._full(len(commit.data)):
                self._cond.wait()
            if self.error is not None:
                raise self.error
            self._pending.append(commit)
            self._pending_bytes += len(commit.data)
            self._cond.notify_all()

    def _full(self, size: int) -> bool:
        return len(self._pending) >= self._depth or self._pending_bytes + size > self._max_bytes

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
                self._cond.notify_all()


def put_commit(table: str, objects: ObjectStore, version: int, data: bytes, digest: str) -> bool:
    """Put-if-absent one commit and read it back; True when an identical file was already there."""
    path = f"{LOG_DIR}/{commit_name(version)}"
    try:
        objects.put_if_absent(path, data)
        present = False
    except ObjectExistsError:
        existing = objects.get(path)
        if existing is None:
            raise TransientError(
                "commit file vanished between write and read",
                table=table,
                version=version,
                hint="retried automatically",
            ) from None
        if existing != data:
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
        present = True
    meta = objects.head(path)
    if meta is None or meta.size != len(data):
        raise TransientError(
            f"{path} is not durable after the write (size {meta.size if meta else None})",
            table=table,
            version=version,
            hint="retried automatically",
        )
    return present


__all__ = ["CommitWriter", "PreparedCommit", "Written", "put_commit"]
