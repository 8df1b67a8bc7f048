"""The published frontier: the highest ``<v>.json`` on a table's storage, and the one rule every
commit path keeps with it (issue 40): **no version N is accepted into the store while ``N.json``
already exists on storage with other bytes**.

In normal operation a version is in the store before its ``N.json`` is anywhere (the publisher
writes it, or the LogStore after the service answered). Storage ahead of the store means the store
lost versions readers may have seen: an asynchronous failover that dropped acknowledged commits, or
a store restored from a backup. Accepting N then would acknowledge a commit that can never be
published (the publisher halts the table at the foreign ``N.json``); it is refused with
``StoreBehindError`` until ``delta-mirror recover NAME`` (``jobs/recover.py``) adopts the published
versions back.

Finding the frontier costs HEAD requests, not a listing: published versions are contiguous
(``v.json`` only after ``v-1.json``), so from the store's next version the frontier is found by
galloping then bisecting (one HEAD when the store is not behind, about ``2·log2(K)`` when K behind).

:class:`PublishedFrontiers` keeps it off the commit service's hot path: a table's frontier is
learned the first time it is seen, again after the store's pool found a dead connection (a
failover), whenever a version at or below one this process acknowledged is posted (the store went
back), and at most every ``FRONTIER_TTL`` seconds (another replica's store may have gone back);
otherwise a commit costs a dictionary lookup.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from delta_mirror.delta.log_path import LOG_DIR, commit_name
from delta_mirror.errors import StoreBehindError
from delta_mirror.storage import ObjectStore, local_path, open_store, storage_options_for

log = logging.getLogger(__name__)

#: Seconds a learned frontier is trusted without an event that says the store may have gone back.
FRONTIER_TTL = 10.0


def commit_path(version: int) -> str:
    return f"{LOG_DIR}/{commit_name(version)}"


def nothing_published_at(location: str) -> bool:
    """A local root without ``_delta_log``: nothing can be published there yet, and opening it for
    a check would create its folder."""
    folder = local_path(location)
    return folder is not None and not (folder / LOG_DIR).is_dir()


def published_frontier(objects: ObjectStore, start: int) -> int:
    """The highest version ``v >= start - 1`` such that ``start..v`` all have a ``<v>.json`` on
    storage (``start - 1`` when ``start.json`` is absent). HEAD requests only: one when nothing
    is there, about ``2·log2(K)`` when ``K`` versions are."""
    if objects.head(commit_path(start)) is None:
        return start - 1
    low, step = start, 1  # low: known present
    while objects.head(commit_path(low + step)) is not None:
        low, step = low + step, step * 2
    high = low + step  # known absent
    while high - low > 1:
        mid = (low + high) // 2
        if objects.head(commit_path(mid)) is None:
            high = mid
        else:
            low = mid
    return low


def _versions_behind(store_latest: int | None, frontier: int) -> int:
    return frontier - (-1 if store_latest is None else store_latest)


def behind_message(store_latest: int | None, frontier: int) -> str:
    """The one line every path prints (the status, the refusal, the alert)."""
    behind = _versions_behind(store_latest, frontier)
    shown = "-" if store_latest is None else str(store_latest)
    return (
        f"store behind published log by {behind} version{'s' if behind != 1 else ''} "
        f"(failover or restore?): the store's latest is {shown}, {commit_name(frontier)} is published"
    )


def recover_hint(name: str | None) -> str:
    return f"run `delta-mirror recover {name or 'NAME'}` to adopt the published versions back into the store"


def store_behind(
    name: str | None, store_latest: int | None, frontier: int, version: int | None = None
) -> StoreBehindError:
    return StoreBehindError(
        behind_message(store_latest, frontier),
        table=name,
        version=version,
        behind=_versions_behind(store_latest, frontier),
        hint=recover_hint(name),
    )


def refuse_if_published(
    objects: ObjectStore,
    name: str | None,
    version: int,
    data: bytes | None = None,
    store_latest: int | None = None,
) -> None:
    """Refuse committing ``version`` when its ``<version>.json`` is on storage with other bytes than
    ``data`` (any bytes when ``data`` is None: a native commit's bytes are rendered by the store).
    ``store_latest`` defaults to ``version - 1`` (the version a commit of ``version`` follows)."""
    if objects.head(commit_path(version)) is None:
        return
    if data is not None and objects.get(commit_path(version)) == data:
        return  # these very bytes: a retry, or a commit adopting what is published
    latest = version - 1 if store_latest is None else store_latest
    raise store_behind(name, None if latest < 0 else latest, published_frontier(objects, version), version)


@dataclass
class _Known:
    frontier: int  # the highest version known published (contiguous from where it was learned)
    learned_at: float
    acknowledged: int = -1  # the highest version this process acknowledged since


class PublishedFrontiers:
    """Per-table published frontiers for a long-running committer (the commit service).

    ``check(location, version, data)`` before a commit (on a store thread),
    ``acknowledged(location, version)`` after it, ``forget()`` when the store's pool dropped a dead
    connection (the database may be another one now). Thread-safe; storage is opened once per
    location with ``storage_options`` (else the environment's credentials, as the publisher's)."""

    def __init__(
        self,
        storage_options: Mapping[str, str] | None = None,
        *,
        ttl: float = FRONTIER_TTL,
        open_location: Callable[[str], ObjectStore | None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._options = dict(storage_options or {})
        self._open = open_location or self._open_readable
        self._ttl = ttl
        self._clock = clock
        self._lock = threading.Lock()
        self._known: dict[str, _Known] = {}
        self._objects: dict[str, ObjectStore] = {}
        self._unchecked: set[str] = set()  # roots warned about (no credentials for their storage)
        #: how many times a frontier was learned from storage (tests, metrics)
        self.lookups = 0

    def _open_readable(self, location: str) -> ObjectStore | None:
        """The root's storage, or None when nothing can be published there yet (a local root
        without ``_delta_log``: opening it would create its folder) or this process has no
        credentials for it (a cloud root whose scheme has none in the environment or the options:
        not checked, said once in the log)."""
        if local_path(location) is not None:
            return None if nothing_published_at(location) else open_store(location)
        if not self._options and not (set(storage_options_for(location)) - {"AWS_REGION"}):
            if location not in self._unchecked:
                self._unchecked.add(location)
                log.warning(
                    "cannot check the published log of %s (no storage credentials for it in the "
                    "environment): a store behind that log is not detected by this process",
                    location,
                )
            return None
        return open_store(location, self._options or None)

    def forget(self) -> None:
        """Learn every frontier again (the store reconnected: perhaps to a promoted standby)."""
        with self._lock:
            self._known.clear()

    def refuse_if_tail_lost(self, location: str, name: str | None, next_version: int) -> None:
        """A LogStore writer asked for a version beyond the store's next one, having listed the log:
        when ``<next_version>.json`` is published the store lost that tail (a failover, a restore)
        and the answer is ``StoreBehindError`` naming ``recover``, not a bare version gap. Only on
        that refusal, so it costs nothing on the hot path."""
        objects = self.objects(location)
        if objects is not None:
            refuse_if_published(objects, name, next_version)

    def objects(self, location: str) -> ObjectStore | None:
        with self._lock:
            found = self._objects.get(location)
        if found is None:
            found = self._open(location)
            if found is not None:
                with self._lock:
                    self._objects[location] = found
        return found

    def check(self, location: str, version: int, data: bytes | None = None, name: str | None = None) -> None:
        """Raise ``StoreBehindError`` when ``version`` is at or below the published frontier and its
        ``<version>.json`` holds other bytes than ``data``; else nothing (a dictionary lookup when
        the frontier is fresh and ``version`` beyond it). ``name``: the table's, for the message
        (the caller may set ``table`` on the error instead)."""
        now = self._clock()
        with self._lock:
            known = self._known.get(location)
        stale = (
            known is None
            or version <= known.acknowledged  # the store went back below what this process acknowledged
            or now - known.learned_at > self._ttl
        )
        if stale:
            objects = self.objects(location)
            frontier = -1 if objects is None else published_frontier(objects, version)
            self.lookups += 1
            known = _Known(frontier, now, -1 if known is None else known.acknowledged)
            with self._lock:
                self._known[location] = known
        assert known is not None
        if version <= known.frontier:
            objects = self.objects(location)
            if objects is not None:
                refuse_if_published(objects, name, version, data)

    def acknowledged(self, location: str, version: int) -> None:
        """This process acknowledged ``version`` (a later post at or below it means the store went back)."""
        with self._lock:
            known = self._known.get(location)
            if known is not None and version > known.acknowledged:
                known.acknowledged = version


__all__ = [
    "FRONTIER_TTL",
    "PublishedFrontiers",
    "behind_message",
    "commit_path",
    "nothing_published_at",
    "published_frontier",
    "recover_hint",
    "refuse_if_published",
    "store_behind",
]
