"""Publishing: committed versions → ``_delta_log/<v>.json``, in order, then checkpoints.

Invariants kept here (docs/how-it-works.md):
1. ``v.json`` is written only after ``v-1.json`` is SUCCESS: versions go out one table at a time,
   ascending, under the table's lease.
2. Never overwrite: commits use put-if-absent. An existing identical file is an idempotent
   success; a different one is a ``PublishConflictError`` that halts the table.
3. The bytes are re-rendered from the store and must match the SHA-256 recorded at commit.
4. A checkpoint for v is written only after ``v.json``; ``_last_checkpoint`` never moves back.
5. SUCCESS is recorded only after the object is read back with the expected size.

The lease is ``publish_lease.py``; a checkpoint's plan, local build and writes are
``publish_checkpoint.py``; the commit writer thread is ``publish_pipeline.py``.
"""

from __future__ import annotations

import hashlib
import logging
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

from delta_mirror.delta.actions import render_commit
from delta_mirror.delta.stored_commit import check_stored_commit
from delta_mirror.errors import (
    DataError,
    ErrorClass,
    LeaseHeldError,
    MirrorError,
    PermanentError,
    PublishConflictError,
    StoreBehindError,
    TableNotFoundError,
    TransientError,
    first_line,
)
from delta_mirror.failpoints import failpoint
from delta_mirror.health.breaker import BreakerPolicy, CircuitBreakers, endpoint_key, table_key
from delta_mirror.jobs.publish_cadence import (
    ReplayBytes,
    checkpoint_due,
)
from delta_mirror.jobs.publish_checkpoint import (
    CheckpointBuilder,
    CheckpointPlan,
    local_checkpoint_builder,
    move_last_checkpoint_forward,
    plan_checkpoint,
    put_checkpoint_file,
)
from delta_mirror.jobs.publish_lease import PublishLease, default_lease_ttl, default_owner
from delta_mirror.jobs.publish_pipeline import CommitWriter, PreparedCommit, commit_digest, put_commit
from delta_mirror.storage import ObjectStore, open_store
from delta_mirror.store.sql_store import CommitRow, SqlStore, TableInfo
from delta_mirror.store.states import Artifact, CommitSource, PublishState
from delta_mirror.store.tables import refuse_if_halted

# The checkpoint and log-listing modules load pyarrow (0.2-0.3 s of a process start): they are
# imported where a checkpoint is written; publishing commits alone never needs them.
if TYPE_CHECKING:
    from delta_mirror.delta.checkpoint.model import CheckpointResult

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass
class RetryPolicy:
    """Exponential backoff with full jitter for transient errors inside one run."""

    attempts: int = 4
    base_delay: float = 0.2
    max_delay: float = 5.0

    def run(self, fn: Callable[[], T]) -> T:
        for attempt in range(1, self.attempts + 1):
            try:
                return fn()
            except TransientError:
                if attempt == self.attempts:
                    raise
                time.sleep(random.uniform(0, min(self.max_delay, self.base_delay * 2 ** (attempt - 1))))
        raise AssertionError("unreachable")


@dataclass
class _Run:
    """One table's publish run: where it writes, what it recorded, its commit writer."""

    table: TableInfo
    objects: ObjectStore
    result: PublishResult
    writer: CommitWriter
    last_written: int  # the highest version written and recorded in this run (start - 1 before any)
    checkpointing: bool = False  # a cadence checkpoint is being written (its failure is not a commit's)
    replay: ReplayBytes = field(default_factory=ReplayBytes)  # JSON bytes since the last checkpoint


@dataclass
class PublishResult:
    table: str
    published: list[int] = field(default_factory=list)
    already_present: list[int] = field(default_factory=list)
    checkpoints: list[int] = field(default_factory=list)
    last_published: int | None = None
    latest_committed: int | None = None

    def to_json(self) -> dict[str, object]:
        return {
            "table": self.table,
            "published": len(self.published),
            "already_present": len(self.already_present),
            "first": self.published[0] if self.published else None,
            "last_published": self.last_published,
            "latest_committed": self.latest_committed,
            "checkpoints": self.checkpoints,
        }


class Publisher:
    """Publishes a table's pending versions and checkpoints from the store to its location."""

    def __init__(
        self,
        store: SqlStore,
        *,
        owner: str | None = None,
        lease_ttl: float | None = None,
        batch_size: int = 500,
        retry: RetryPolicy | None = None,
        open_location: Callable[[str], ObjectStore] | None = None,
        storage_options: Mapping[str, str] | None = None,
        breaker_policy: BreakerPolicy | None = None,
        checkpoint_builder: CheckpointBuilder | None = None,
        cadence_checkpoints: bool = True,
        lease_wait: float = 0.0,
    ) -> None:
        self.store = store
        self.checkpoint_builder = checkpoint_builder
        # False: publish() leaves the cadence's checkpoints to a separate step (e.g. a Spark job)
        self.cadence_checkpoints = cadence_checkpoints
        self.breaker_policy = breaker_policy
        self.lease = PublishLease(
            store,
            owner or default_owner(),
            default_lease_ttl() if lease_ttl is None else lease_ttl,
            lease_wait,
        )
        self.batch_size = batch_size
        self.retry = retry or RetryPolicy()
        self.storage_options = dict(storage_options or {})
        self.open_location = open_location or (lambda location: open_store(location, self.storage_options))
        # the store's latest version per table when this publisher last checked it was not behind
        # the published log (``_check_not_behind``)
        self._not_behind_at: dict[int, int] = {}

    @property
    def owner(self) -> str:
        return self.lease.owner

    @property
    def lease_ttl(self) -> float:
        return self.lease.ttl

    # -- publishing commits ----------------------------------------------------------------------
    def publish(
        self, name: str, to_version: int | None = None, progress: Callable[[int, int], None] | None = None
    ) -> PublishResult:
        table = self.table_to_publish(name)
        refuse_if_halted(table, table.halted_version)  # the store's one halted check and error type
        breakers = CircuitBreakers(self.store, self.breaker_policy)
        keys = [table_key(name), endpoint_key(table.location, self.storage_options)]
        for key in keys:
            breakers.check(key, table=name)
        with self.lease.held(table):
            try:
                self.store.reset_in_progress(table.id)
                result = self._publish(table, to_version, progress)
            except BaseException as exc:
                if isinstance(exc, TransientError) and not isinstance(exc, LeaseHeldError):
                    for key in keys:
                        breakers.record_failure(key, exc.message)
                if isinstance(exc, Exception):
                    self._record_table_failure(table, exc)
                raise
        for key in keys:
            breakers.record_success(key)
        self.store.clear_table_failure(table.id)
        return result

    def table_to_publish(self, name: str) -> TableInfo:
        """The table; one the store lacks is, before anything is written, the one-line
        ``TableNotFoundError`` that says whether the table config lists it and what to do."""
        try:
            return self.store.get_table(name)
        except TableNotFoundError:
            from delta_mirror.health.coverage import not_in_store_here

            raise not_in_store_here(name) from None

    def _record_table_failure(self, table: TableInfo, exc: Exception) -> None:
        """The attempt failed, whatever failed (location, listing, credentials, store, a put): the
        table's failure row says so at once (``status``, ``health`` after its grace, the UI). The
        store may be what failed: then nothing can be recorded, and the error is raised as it is."""
        if isinstance(exc, LeaseHeldError):
            return  # another publisher is at work: not a failure of the table
        error_class = exc.error_class.value if isinstance(exc, MirrorError) else ErrorClass.PERMANENT.value
        try:
            self.store.record_table_failure(table.id, error_class, first_line(exc, 1000))
        except Exception:  # the original error is the one to raise
            log.warning("table '%s': the failed attempt could not be recorded in the store", table.name)

    def _publish(
        self, table: TableInfo, to_version: int | None, progress: Callable[[int, int], None] | None
    ) -> PublishResult:
        result = PublishResult(table.name)
        latest = self.store.latest_version(table.id)
        result.latest_committed = latest
        last = self.store.last_published_version(table.id)
        result.last_published = last
        if latest is None:
            return result
        target = latest if to_version is None else min(to_version, latest)
        objects = self.open_location(table.location)
        self._check_not_behind(table, objects, latest)
        start = table.first_version if last is None else last + 1
        if (
            table.base_checkpoint_version is not None
            and last is not None
            and last >= table.base_checkpoint_version
            and self.store.last_checkpoint_version(table.id) is None
        ):
            # An imported table that starts at a checkpoint needs that checkpoint before more commits.
            self._checkpoint(table, objects, table.base_checkpoint_version, result)
        self._publish_commits(table, objects, start, target, result, progress)
        self._redrive_checkpoints(table, objects, result)
        return result

    def _check_not_behind(self, table: TableInfo, objects: ObjectStore, latest: int) -> None:
        """Versions published beyond the store's latest: the store lost them (an asynchronous failover,
        a restore from backup). ``StoreBehindError`` (recorded as the table's failure, no halt: the
        store only needs to catch up, ``delta-mirror recover``) instead of publishing on. One HEAD
        the first time this publisher sees the table and whenever its latest went back since."""
        seen = self._not_behind_at.get(table.id)
        if seen is not None and latest >= seen:
            self._not_behind_at[table.id] = latest
            return
        from delta_mirror.jobs.recover import check_not_behind

        try:
            check_not_behind(self.store, table, objects)
        except StoreBehindError:
            raise
        except MirrorError as exc:
            # storage unreachable or refusing: the publish below meets the same error and records
            # it on the version (attempts, error class) as it always has; checked again next run
            log.debug("table '%s': the published-log check could not run: %s", table.name, exc)
            return
        self._not_behind_at[table.id] = latest

    def _redrive_checkpoints(self, table: TableInfo, objects: ObjectStore, result: PublishResult) -> None:
        """Finish checkpoints a crashed or failed run left unfinished (parts or pointer missing).

        Their commits are already SUCCESS, so no new publish would ever reach them again.
        """
        last = self.store.last_published_version(table.id)
        if last is None or not self.cadence_checkpoints:  # else the separate checkpoint step owns them
            return
        for row in self.store.status_rows(
            table.id,
            artifact=Artifact.CHECKPOINT,
            states=(PublishState.PENDING, PublishState.FAILED),
            to_version=last,
        ):
            if row.version not in result.checkpoints:
                self._checkpoint(table, objects, row.version, result)

    def _publish_commits(
        self,
        table: TableInfo,
        objects: ObjectStore,
        start: int,
        target: int,
        result: PublishResult,
        progress: Callable[[int, int], None] | None,
    ) -> None:
        """Versions ``start..target`` in batches: this thread reads, checks and renders each batch
        (and fetches the next one) while a ``CommitWriter`` puts the previous commits in order."""
        if start > target:
            return
        run = _Run(
            table, objects, result, CommitWriter(lambda c: self._write_commit(table, objects, c)), start - 1
        )
        try:
            fetched = self._fetch_batch(table, start, min(target, start + self.batch_size - 1))
            version = start
            while version <= target:
                end = min(target, version + self.batch_size - 1)
                self._prepare_batch(run, version, *fetched)
                if end < target:  # the next batch comes from the store while this one is written
                    fetched = self._fetch_batch(table, end + 1, min(target, end + self.batch_size))
                self._record_written(run)  # one status statement per batch
                self._cadence_checkpoint(run, end)
                if progress:
                    progress(end - start + 1, target - start + 1)
                version = end + 1
            self._settle(run)
        except MirrorError as exc:
            if run.checkpointing:
                raise  # a cadence checkpoint failed: its own status row says so, the commits are fine
            failure = run.writer.settle()  # what was queued before the failure is still written
            self._record_written(run)
            if failure is not None and not isinstance(failure, MirrorError):
                raise failure from exc
            self._record_failure(table, failure or exc, run.last_written + 1)
            raise (failure or exc) from None
        finally:
            run.writer.close()

    def _prepare_batch(
        self, run: _Run, start: int, rows: list[CommitRow], lines: dict[int, list[str]]
    ) -> None:
        """Check, render and queue one batch of commits for the writer."""
        table = run.table
        self._check_no_gap(table, rows, start)
        self.store.mark_started(table.id, [r.version for r in rows if r.has_json], Artifact.JSON, self.owner)
        for row in rows:
            if row.has_json:
                run.writer.submit(self._prepare_commit(table, row, lines.get(row.version, [])))
            if row.version == table.base_checkpoint_version:
                self._settle(run)
                if self.store.last_checkpoint_version(table.id) is None:
                    self._checkpoint(table, run.objects, row.version, run.result)
                run.result.last_published = row.version

    def _cadence_checkpoint(self, run: _Run, end: int) -> None:
        """The cadence is applied at batch boundaries: a long backlog still gets checkpoints along
        the way (readers replay less), without one per `interval` versions. The writer is waited
        for only when one is due (a checkpoint follows its commit)."""
        if not self.cadence_checkpoints or not self._checkpoint_due(run.table, end, run.replay):
            return
        self._settle(run)
        v, result = run.result.last_published, run.result
        if (
            v is not None
            and (result.published or result.already_present)
            and self._checkpoint_due(run.table, v, run.replay)
        ):
            run.checkpointing = True
            self._checkpoint(run.table, run.objects, v, result)
            run.checkpointing = False

    def _fetch_batch(
        self, table: TableInfo, start: int, end: int
    ) -> tuple[list[CommitRow], dict[int, list[str]]]:
        return self.store.commit_rows(table.id, start, end), self.store.commit_lines(table.id, start, end)

    @staticmethod
    def _check_no_gap(table: TableInfo, rows: list[CommitRow], start: int) -> None:
        expected = start
        for row in rows:
            if row.version != expected:
                raise DataError(
                    f"version gap in the store: {expected} is missing",
                    table=table.name,
                    version=expected,
                    hint="the store was edited by hand; restore it from backup",
                )
            expected += 1

    @staticmethod
    def _prepare_commit(table: TableInfo, row: CommitRow, lines: list[str]) -> PreparedCommit:
        """The commit file's bytes, re-checked and matched against the SHA-256 recorded at commit."""
        check_stored_commit(
            lines,
            table=table.name,
            version=row.version,
            location=table.location,
            native=row.source != CommitSource.IMPORT,  # native and spark: writer input
        )
        data = render_commit(lines)
        digest = commit_digest(data)
        if digest != row.sha256:
            raise DataError(
                f"the stored actions no longer match the recorded SHA-256 ({row.sha256[:12]}…)",
                table=table.name,
                version=row.version,
                hint="the store was modified outside delta-mirror; restore it from backup",
            )
        return PreparedCommit(row.version, data, digest)

    def _write_commit(self, table: TableInfo, objects: ObjectStore, commit: PreparedCommit) -> bool:
        """On the writer thread: keep the lease, put and read back (retried), then the failpoint."""
        self.lease.keep(table)
        present = self.retry.run(
            lambda: put_commit(table.name, objects, commit.version, commit.data, commit.digest)
        )
        failpoint("publish.after_put")
        return present

    def _record_written(self, run: _Run) -> None:
        """SUCCESS for the commits the writer has read back so far (one status statement)."""
        written, result = run.writer.take_written(), run.result
        if not written:
            return
        self.store.mark_succeeded(
            run.table.id,
            Artifact.JSON,
            [(w.commit.version, w.commit.digest, len(w.commit.data)) for w in written],
        )
        for w in written:
            (result.already_present if w.already_present else result.published).append(w.commit.version)
        run.last_written = result.last_published = written[-1].commit.version

    def _settle(self, run: _Run) -> None:
        """Wait for every queued commit (raising the writer's failure) and record them."""
        try:
            run.writer.drain()
        finally:
            self._record_written(run)

    def _record_failure(self, table: TableInfo, exc: MirrorError, failed: int) -> None:
        if isinstance(exc, LeaseHeldError):
            return  # the new lease holder owns the status rows now
        state = PublishState.CONFLICT if isinstance(exc, PublishConflictError) else PublishState.FAILED
        self.store.mark_failed(table.id, failed, Artifact.JSON, state, exc.error_class.value, exc.message)
        if isinstance(exc, PublishConflictError | DataError):
            self.store.halt_table(table.id, exc.message, failed)

    # -- checkpoints ------------------------------------------------------------------------------
    def _checkpoint_due(self, table: TableInfo, version: int, replay: ReplayBytes | None = None) -> bool:
        return checkpoint_due(self.store, table, version, replay)

    def checkpoint_if_due(self, name: str) -> int | None:
        """Write a checkpoint at the last published version when the cadence policy says so."""
        table = self.store.get_table(name)
        last = self.store.last_published_version(table.id)
        if last is None or not self._checkpoint_due(table, last):
            return None
        return self.checkpoint(name, last)

    def checkpoint(self, name: str, version: int | None = None) -> int:
        """Write a checkpoint at ``version`` (default: the last published version)."""
        table = self.store.get_table(name)
        last = self.store.last_published_version(table.id)
        if last is None:
            raise PermanentError(
                "nothing is published yet", table=name, hint="run `delta-mirror mirror` first"
            )
        version = last if version is None else version
        if version > last or version < table.first_version:
            raise PermanentError(
                f"cannot checkpoint version {version}: published versions are {table.first_version}..{last}",
                table=name,
                version=version,
                hint="checkpoints follow published commits; mirror first",
            )
        with self.lease.held(table, version):
            self._checkpoint(table, self.open_location(table.location), version, PublishResult(name))
        return version

    def _checkpoint(
        self, table: TableInfo, objects: ObjectStore, version: int, result: PublishResult
    ) -> None:
        built = self._build_checkpoint(table, version)
        self.store.ensure_status(table.id, version, Artifact.CHECKPOINT)
        self.store.mark_started(table.id, [version], Artifact.CHECKPOINT, self.owner)
        try:
            in_log: list[tuple[str, bytes, bytes]] = []  # (path, built, in the log: another's if kept)
            for f in built.files:
                self.lease.keep(table)
                found = self.retry.run(lambda f=f: put_checkpoint_file(objects, f.path, f.data))  # type: ignore[misc]
                in_log.append((f.path, f.data, f.data if found is None else found))
                failpoint("checkpoint.after_part")
            self.lease.keep(table)
            failpoint("checkpoint.before_last_checkpoint")
            from delta_mirror.delta.last_checkpoint import pointer_for_files  # Arrow: only once one is due

            pointer = pointer_for_files(built.last_checkpoint, in_log)
            self.retry.run(lambda: move_last_checkpoint_forward(objects, version, pointer))
            failpoint("checkpoint.after_last_checkpoint")
        except LeaseHeldError:
            raise
        except MirrorError as exc:
            self.store.mark_failed(
                table.id,
                version,
                Artifact.CHECKPOINT,
                PublishState.FAILED,
                exc.error_class.value,
                exc.message,
            )
            raise
        top = built.files[-1]
        self.store.mark_succeeded(
            table.id, Artifact.CHECKPOINT, [(version, hashlib.sha256(top.data).hexdigest(), len(top.data))]
        )
        result.checkpoints.append(version)

    def checkpoint_plan(self, table: TableInfo, version: int) -> CheckpointPlan:
        return plan_checkpoint(self.store, table, version)

    def _build_checkpoint(self, table: TableInfo, version: int) -> CheckpointResult:
        """The checkpoint files of ``version`` from the store (O(active files), not history)."""
        plan = self.checkpoint_plan(table, version)
        return (self.checkpoint_builder or local_checkpoint_builder)(self.store, plan)

    def rewrite_last_checkpoint(self, name: str, version: int) -> None:
        """Write ``_last_checkpoint`` for the checkpoint at ``version`` again (it was lost or wrong).

        Under the lease, and only if the pointer is still bad when read again: the audit that asked
        for this listed the log earlier, and a publisher may since have moved the pointer forward to
        a newer complete checkpoint (replacing it then would move it backwards).
        """
        from delta_mirror.delta.last_checkpoint import (
            LAST_CHECKPOINT_PATH,
            judge_last_checkpoint,
            pointer_for_files,
        )
        from delta_mirror.delta.log_listing import list_log, sidecar_refs

        table = self.store.get_table(name)
        with self.lease.held(table):
            objects = self.open_location(table.location)
            listing = list_log(objects)
            pointer = objects.get(LAST_CHECKPOINT_PATH)
            if pointer is not None and not judge_last_checkpoint(
                pointer, listing, sidecar_refs(objects), newest_checkpoint=version
            ):
                return  # already good by the rule validation and the audit apply
            built = self._build_checkpoint(table, version)
            in_log = [(f.path, f.data, objects.get(f.path) or f.data) for f in built.files]
            objects.put(LAST_CHECKPOINT_PATH, pointer_for_files(built.last_checkpoint, in_log))


__all__ = [
    "PublishResult",
    "Publisher",
    "RetryPolicy",
]
