"""``delta-mirror recover``: the store caught up from the published log (issue 40 items 2 and 3).

**Store behind the published log** (an asynchronous failover lost acknowledged commits, or the
store was restored from a backup): the versions published on storage beyond the store's latest are
adopted back, each ``<v>.json`` read and committed *verbatim* (``SqlStore.commit_verbatim``, the
commit service's path: the same rules, the bytes kept as they are), then read back from the store
and compared byte for byte, then confirmed by a publish run (which finds every adopted file
already there, identical, and records it published). A second run finds nothing to recover.
Refused, with one line and nothing changed: a table whose latest stored version differs from its
published ``<v>.json`` (a real split brain: recovery cannot adopt on top of it), a halted table.

**Disaster recovery** (the store lost entirely): each table is imported again in place from its
published log (``jobs/importer.py``, the ``import`` command's path: its commit files adopted as
published). The recovery point is the published log: what was committed after the last published
version and never published is lost, and :class:`Rebuilt` says so per table.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from delta_mirror.errors import DataError, PermanentError, TableNotFoundError
from delta_mirror.jobs.published_frontier import commit_path, published_frontier, store_behind
from delta_mirror.storage import ObjectStore, open_store
from delta_mirror.store.sql_store import SqlStore, TableInfo
from delta_mirror.store.tables import refuse_if_halted


@dataclass
class Recovery:
    """What ``recover_table`` did to one table."""

    table: str
    store_latest: int | None  # before
    published: int | None  # the published frontier found (None: nothing published)
    adopted: list[int] = field(default_factory=list)

    def line(self) -> str:
        if not self.adopted:
            at = "-" if self.store_latest is None else self.store_latest
            return f"{self.table}: nothing to recover (the store's latest {at} is the published log's latest)"
        first, last = self.adopted[0], self.adopted[-1]
        return (
            f"{self.table}: adopted versions {first}..{last} from the published log "
            f"({len(self.adopted)} version{'s' if len(self.adopted) != 1 else ''}, byte-identical, verified); "
            f"writers continue at version {last + 1}"
        )

    def to_json(self) -> dict[str, object]:
        return {
            "table": self.table,
            "store_latest_before": self.store_latest,
            "published": self.published,
            "adopted": len(self.adopted),
            "first": self.adopted[0] if self.adopted else None,
            "last": self.adopted[-1] if self.adopted else None,
            "next_version": (self.adopted[-1] + 1) if self.adopted else None,
        }


def behind_by(store: SqlStore, table: TableInfo, objects: ObjectStore) -> tuple[int | None, int]:
    """The store's latest version and the published frontier from the version after it."""
    latest = store.latest_version(table.id)
    start = table.first_version if latest is None else latest + 1
    return latest, published_frontier(objects, start)


def check_not_behind(store: SqlStore, table: TableInfo, objects: ObjectStore) -> None:
    """``StoreBehindError`` when versions beyond the store's latest are published (the publisher's
    check: status and alert say so instead of a split-brain halt)."""
    latest, frontier = behind_by(store, table, objects)
    if latest is not None and frontier > latest:
        # A writer may have committed (and its LogStore published) between the two reads: a
        # ``<v>.json`` is only ever written after ``v`` is in the store, so the store read again
        # after the HEADs decides.
        latest = store.latest_version(table.id)
        if latest is not None and frontier > latest:
            raise store_behind(table.name, latest, frontier)


def recover_table(
    store: SqlStore,
    name: str,
    *,
    open_location: Callable[[str], ObjectStore] | None = None,
    publish: Callable[[str], object] | None = None,
) -> Recovery:
    """Adopt the published versions beyond the store's latest back into the store (see the module).
    ``publish``: confirm them published (``Publisher.publish``); None leaves that to the next run."""
    table = store.get_table(name)
    objects = (open_location or open_store)(table.location)
    latest, frontier = behind_by(store, table, objects)
    recovery = Recovery(name, latest, None if frontier < table.first_version else frontier)
    start = table.first_version if latest is None else latest + 1
    if frontier < start:
        return recovery
    refuse_if_halted(table, start)
    if latest is not None:
        _check_latest_matches(store, table, objects, latest)
    for version in range(start, frontier + 1):
        data = objects.get(commit_path(version))
        if data is None:  # removed between the frontier's HEAD and this read: stop where it ends
            break
        store.commit_verbatim(table.location, version, data)
        back = store.commit_bytes(table.id, version)
        if back != data:
            raise DataError(
                f"the adopted version reads back from the store with other bytes ({len(back)} bytes, "
                f"published {len(data)})",
                table=name,
                version=version,
                hint="report this as a bug; the versions adopted before it are verified",
            )
        recovery.adopted.append(version)
    if publish is not None and recovery.adopted:
        publish(name)
    return recovery


def _check_latest_matches(store: SqlStore, table: TableInfo, objects: ObjectStore, latest: int) -> None:
    """The store's latest version must be the published one: adopting on top of other bytes would
    build on a log readers never saw."""
    published = objects.get(commit_path(latest))
    if published is not None and store.commit_bytes(table.id, latest) != published:
        raise PermanentError(
            f"the store's version {latest} differs from the published {commit_path(latest)}: a split brain, "
            "not a store behind its log",
            table=table.name,
            version=latest,
            hint="nothing was changed; compare both (`delta-mirror validate`), keep the published one by "
            "restoring the store from a backup taken before it, then run `delta-mirror recover` again",
        )


@dataclass
class Rebuilt:
    """One table rebuilt from its published log after the store was lost."""

    table: str
    location: str
    first: int | None = None
    last: int | None = None
    existed: Recovery | None = None  # the table was still in the store: recovered instead

    def line(self) -> str:
        if self.existed is not None:
            return self.existed.line()
        return (
            f"{self.table}: rebuilt versions {self.first}..{self.last} from {self.location}; "
            f"the recovery point is version {self.last}: anything committed after it and never "
            "published is lost"
        )

    def to_json(self) -> dict[str, object]:
        if self.existed is not None:
            return {**self.existed.to_json(), "rebuilt": False, "location": self.location}
        return {
            "table": self.table,
            "location": self.location,
            "rebuilt": True,
            "first": self.first,
            "recovery_point": self.last,
            "next_version": None if self.last is None else self.last + 1,
        }


def parse_table_list(text: str, source: str) -> dict[str, str]:
    """The tables to rebuild: ``NAME ROOT`` lines (``#`` comments, blank lines), or the JSON that
    ``delta-mirror status --json`` prints (objects with ``table`` and ``location``)."""
    import json

    stripped = text.strip()
    if stripped.startswith(("[", "{")):
        try:
            rows = json.loads(stripped)
        except ValueError as exc:
            raise PermanentError(f"{source} is not valid JSON: {exc}", hint="give NAME ROOT lines") from None
        rows = rows.get("tables", []) if isinstance(rows, dict) else rows
        found = {
            str(r["table"]): str(r["location"])
            for r in rows
            if isinstance(r, dict) and r.get("table") and r.get("location")
        }
    else:
        found = {}
        for number, raw in enumerate(text.splitlines(), 1):
            line = raw.split("#", 1)[0].strip()
            if not line:
                continue
            parts = line.split()
            if len(parts) != 2:
                raise PermanentError(
                    f"{source} line {number}: expected 'NAME ROOT', found {line[:80]!r}",
                    hint="one table a line: its name and its root, separated by a space",
                )
            found[parts[0]] = parts[1]
    if not found:
        raise PermanentError(f"{source} names no table", hint="one table a line: NAME ROOT")
    return found


def rebuild_from_storage(
    store: SqlStore,
    tables: Mapping[str, str],
    *,
    open_location: Callable[[str], ObjectStore] | None = None,
    publish: Callable[[str], object] | None = None,
    progress: Callable[[Rebuilt], None] | None = None,
) -> list[Rebuilt]:
    """Every table of ``tables`` (name → root) imported again in place from its published log; a
    table still in the store is recovered instead (so a rebuild that stopped can run again)."""
    from delta_mirror.jobs.importer import import_table

    done: list[Rebuilt] = []
    for name, location in tables.items():
        try:
            store.get_table(name)
        except TableNotFoundError:
            result = import_table(store, location, name=name)
            rebuilt = Rebuilt(name, result.location, result.start_version, result.end_version)
        else:
            recovered = recover_table(store, name, open_location=open_location, publish=publish)
            rebuilt = Rebuilt(name, location, existed=recovered)
        done.append(rebuilt)
        if progress:
            progress(rebuilt)
    return done


__all__ = [
    "Rebuilt",
    "Recovery",
    "behind_by",
    "check_not_behind",
    "parse_table_list",
    "rebuild_from_storage",
    "recover_table",
]
