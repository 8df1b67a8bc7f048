"""A publisher's lease on a table: one publisher per table at a time (invariant 1's "under the
table's lease"), taken with a bounded wait, renewed during long runs, given back at the end.

The store keeps the lease row (``acquire_lease`` / ``release_lease``); this is the holder's side:
who it is (``default_owner``), how long a crashed holder blocks the table (``default_lease_ttl``)
and when to renew.

A release can fail while the work it ended succeeded: the store's primary is lost between the last
write and the release (a failover). The lease row then names an owner that is done, and until its
TTL every publisher gets "lease held", even the next one in the same process (a watcher's trigger
makes a new ``Publisher``, with a new owner, per report). So the process remembers the owners whose
release failed (``_Unreleased``) and the next ``take`` of that table in the process gives them back
first, once the store answers again.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

from delta_mirror.errors import LeaseHeldError, first_line
from delta_mirror.store.sql_store import SqlStore, TableInfo

log = logging.getLogger(__name__)

DEFAULT_LEASE_TTL = 120.0
LEASE_TTL_ENV = "DELTA_MIRROR_LEASE_TTL"
#: The lease of a publisher whose checkpoints Spark may build: a big build takes minutes to an hour
#: and the lease is not renewed during it (``spark.checkpoint_choice.publisher_for`` applies it).
SPARK_LEASE_TTL = 3600.0


def default_owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def default_lease_ttl() -> float:
    """``DELTA_MIRROR_LEASE_TTL`` seconds, else 120: how long a crashed publisher blocks its tables."""
    try:
        return max(1.0, float(os.environ.get(LEASE_TTL_ENV, DEFAULT_LEASE_TTL)))
    except ValueError:
        return DEFAULT_LEASE_TTL


class _Unreleased:
    """The owners, per store and table, whose release failed in this process (their work ended).

    One lock orders a giving-back against a ``take`` by one of those owners again (a reused
    ``Publisher``): the owner leaves the set before it takes, so a lease it holds once more is never
    given back under it.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._owners: dict[tuple[str, int], set[str]] = {}

    def remember(self, store: SqlStore, table_id: int, owner: str) -> None:
        with self._lock:
            self._owners.setdefault((str(store.url), table_id), set()).add(owner)

    def give_back(self, store: SqlStore, table_id: int, taker: str) -> None:
        """Before ``taker`` takes the lease: forget it, release every other remembered owner (one
        whose release fails again stays remembered; the take then fails or waits as before)."""
        key = (str(store.url), table_id)
        with self._lock:
            owners = self._owners.get(key)
            if not owners:
                return
            owners.discard(taker)
            for owner in sorted(owners):
                try:
                    store.release_lease(table_id, owner)
                except Exception:  # the store is still away: try again at the next take
                    continue
                owners.discard(owner)
            if not owners:
                del self._owners[key]


_UNRELEASED = _Unreleased()


class PublishLease:
    """The lease of one owner on the table it publishes (one table at a time)."""

    def __init__(self, store: SqlStore, owner: str, ttl: float, wait: float = 0.0) -> None:
        self.store = store
        self.owner = owner
        self.ttl = ttl
        self.wait = wait  # seconds a held lease is waited for before LeaseHeldError
        self._taken_at = 0.0

    def take(self, table: TableInfo, version: int | None = None) -> None:
        """Take the lease, polling a held one for up to ``wait`` seconds (50 ms doubling to 0.5 s:
        another publisher's run of one commit holds it for milliseconds)."""
        deadline, pause = time.monotonic() + self.wait, 0.05
        _UNRELEASED.give_back(self.store, table.id, self.owner)
        while not self.store.acquire_lease(table.id, self.owner, self.ttl):
            left = deadline - time.monotonic()
            if left <= 0:
                raise LeaseHeldError(
                    "another publisher holds this table's lease",
                    table=table.name,
                    version=version,
                    hint="it will be retried; a crashed publisher's lease expires by itself",
                )
            time.sleep(min(pause, left))
            pause = min(2 * pause, 0.5)
        self._taken_at = time.monotonic()

    def keep(self, table: TableInfo) -> None:
        """Renew the lease once a third of its TTL has passed; stop at once if another owner took it.

        Without renewal a run longer than the TTL (a backlog on slow storage) would be joined by a
        second publisher, and ``_last_checkpoint`` (read, compare, replace) could move backwards.
        """
        if time.monotonic() - self._taken_at < self.ttl / 3:
            return
        if not self.store.acquire_lease(table.id, self.owner, self.ttl):
            raise LeaseHeldError(
                "the publisher lease expired and another publisher took it",
                table=table.name,
                hint="the other publisher carries on; raise DELTA_MIRROR_LEASE_TTL if runs are slow",
            )
        self._taken_at = time.monotonic()

    @contextmanager
    def held(self, table: TableInfo, version: int | None = None) -> Iterator[None]:
        """The lease around a block of work: taken, then given back however the block ends. When
        the block failed, a give-back that fails too is logged, not raised: the block's error is
        what the caller must see (the lease is remembered for the next take, see ``release``)."""
        self.take(table, version)
        try:
            yield
        except BaseException:
            try:
                self.release(table)
            except Exception as exc:
                log.warning(
                    "could not give back the publisher lease of '%s': %s", table.name, first_line(exc)
                )
            raise
        self.release(table)

    def release(self, table: TableInfo) -> None:
        """Give the lease back; when the store cannot be reached, the next ``take`` of the table in
        this process gives it back (the error still reaches the caller: its run did not end clean)."""
        try:
            self.store.release_lease(table.id, self.owner)
        except Exception:
            _UNRELEASED.remember(self.store, table.id, self.owner)
            raise


__all__ = [
    "DEFAULT_LEASE_TTL",
    "LEASE_TTL_ENV",
    "SPARK_LEASE_TTL",
    "PublishLease",
    "default_lease_ttl",
    "default_owner",
]
