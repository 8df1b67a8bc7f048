"""Tables and the publisher lease: the ``dl_tables`` rows.

A table's name is unique and its root holds no other table (nor sits inside one); the lease
lets one publisher at a time write a table's ``_delta_log/``.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any, TypedDict, Unpack
from urllib.parse import unquote, urlparse

from sqlalchemy import Connection, delete, func, insert, or_, select, update
from sqlalchemy.exc import IntegrityError

from delta_mirror.delta.locations import normalize_table_root, same_or_nested
from delta_mirror.delta.protocol import now_ms
from delta_mirror.errors import (
    CommitConflictError,
    PermanentError,
    TableExistsError,
    TableHaltedError,
    TableNotFoundError,
)
from delta_mirror.store import db
from delta_mirror.store.base import StoreBase, from_row
from delta_mirror.store.schema import (
    dl_actions,
    dl_commits,
    dl_files,
    dl_lag_samples,
    dl_mirror_status,
    dl_table_failures,
    dl_tables,
)
from delta_mirror.store.states import TableState

TABLE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,127}")  # fullmatch: '$' would allow a trailing '\n'


@dataclass(frozen=True)
class TableInfo:
    id: int
    name: str
    location: str
    table_uuid: str
    state: str
    halted_reason: str | None
    halted_version: int | None
    first_version: int
    base_checkpoint_version: int | None
    checkpoint_kind: str
    checkpoint_part_size: int | None
    checkpoint_interval: int | None
    checkpoint_max_bytes: int | None
    settings: dict[str, Any]
    lease_owner: str | None
    lease_expires_at: int | None


class NewTable(TypedDict, total=False):
    """``create_table``'s options: the ``dl_tables`` columns a new table may set (the rest have
    defaults: a new UUID, version 0, no base checkpoint, classic checkpoints, no settings)."""

    table_uuid: str | None
    first_version: int
    base_checkpoint_version: int | None
    checkpoint_kind: str
    checkpoint_part_size: int | None
    settings: dict[str, Any] | None


def check_table_name(name: str) -> None:
    if not isinstance(name, str) or not TABLE_NAME.fullmatch(name):
        raise PermanentError(
            f"invalid table name {name!r}",
            hint="use 1-128 letters, digits, '_', '.' or '-', starting with a letter, digit or '_'",
        )


def default_table_name(location: str) -> str:
    """The name a table created from its root gets: the root's last path segment, made a valid name."""
    segment = unquote(urlparse(location).path.rstrip("/").rsplit("/", 1)[-1]) or "table"
    name = re.sub(r"[^A-Za-z0-9_.\-]", "_", segment)
    return name if name[0].isalnum() or name[0] == "_" else f"_{name}"


def table_info(row: Any) -> TableInfo:
    return from_row(TableInfo, row, settings=json.loads(row.settings or "{}"))


def refuse_if_halted(table: TableInfo, version: int | None) -> None:
    """Every commit path (native, verbatim, import) refuses a halted table with the one error type:
    ``halt_table`` promises no commits until ``delta-mirror resume``."""
    if table.state != TableState.HALTED:
        return
    at = f" at version {table.halted_version}" if table.halted_version is not None else ""
    raise TableHaltedError(
        f"the table is halted{at}: {table.halted_reason or 'no reason recorded'}",
        table=table.name,
        version=version,
        hint=f"fix the cause, then `delta-mirror resume {table.name}`",
    )


def get_table(conn: Connection, name: str) -> TableInfo:
    """The table named ``name``; ``TableNotFoundError`` when there is none."""
    row = conn.execute(select(dl_tables).where(dl_tables.c.name == name)).first()
    if row is None:
        raise TableNotFoundError(
            f"no table named '{name}' in the store",
            table=name,
            hint="list tables with `delta-mirror status`, or create it with import/commit",
        )
    return table_info(row)


def table_and_latest_at(conn: Connection, location: str) -> tuple[TableInfo, int | None]:
    """The table at ``location`` and its latest version, in one round trip."""
    latest = (
        select(func.max(dl_commits.c.version))
        .where(dl_commits.c.table_id == dl_tables.c.id)
        .scalar_subquery()
        .label("latest_version")
    )
    row = conn.execute(select(dl_tables, latest).where(dl_tables.c.location == location)).first()
    if row is None:
        raise TableNotFoundError(
            f"no table at {location} in the store",
            hint="create it with version 0 under an allowed root, or import it with `delta-mirror import`",
        )
    return table_info(row), None if row.latest_version is None else int(row.latest_version)


def stored_location(name: str, location: str) -> str:
    """``location`` as the store keeps it (``delta.locations.normalize_table_root``: every caller,
    the commit service, ``delta-mirror commit --location``, ``import`` and the API, stores one
    spelling of a root), or the normaliser's one-line refusal naming the table."""
    try:
        return normalize_table_root(location)
    except PermanentError as exc:
        exc.table = name
        raise


def check_location(conn: Connection, name: str, location: str) -> None:
    """A table root is no ``_delta_log/`` folder, and neither holds nor sits inside another table."""
    parsed = urlparse(location)
    segments = [unquote(p) for p in parsed.path.split("/") if p]
    if "_delta_log" in segments or ".." in segments:
        raise PermanentError(
            f"location {location} is inside a _delta_log/ folder or has '..' in it",
            table=name,
            hint="use the table's root folder (the one that holds _delta_log/)",
        )
    rows = conn.execute(select(dl_tables.c.name, dl_tables.c.location).where(dl_tables.c.name != name))
    for other, where in rows:
        if same_or_nested(location, str(where)):  # compared normalised (delta.locations.location_key)
            raise PermanentError(
                f"location {location} overlaps table '{other}' at {where}",
                table=name,
                hint="every table needs its own root folder, outside every other table's",
            )


class Tables(StoreBase):
    """Create, read, change and drop tables; take and release the publisher lease."""

    def create_table(self, name: str, location: str, **options: Unpack[NewTable]) -> TableInfo:
        """Create the table ``name`` at ``location``, in a transaction of its own."""
        return self._create_table(None, name, location, **options)

    def _create_table(
        self, conn: Connection | None, name: str, location: str, **options: Unpack[NewTable]
    ) -> TableInfo:
        """``create_table`` in the store's own transaction ``conn`` (an import, a commit that
        creates its table), or in a new one when ``conn`` is None."""
        check_table_name(name)
        location = stored_location(name, location)
        with db.translated(self.url, f"creating table '{name}'"):
            if conn is not None:
                check_location(conn, name, location)
            else:
                with self.reader.connect() as c:
                    check_location(c, name, location)
        values = {
            "name": name,
            "location": location,
            "table_uuid": options.get("table_uuid") or str(uuid.uuid4()),
            "state": TableState.ACTIVE,
            "first_version": options.get("first_version", 0),
            "base_checkpoint_version": options.get("base_checkpoint_version"),
            "checkpoint_kind": options.get("checkpoint_kind", "classic"),
            "checkpoint_part_size": options.get("checkpoint_part_size"),
            "settings": json.dumps(options.get("settings") or {}),
            "created_at": now_ms(),
        }
        with db.translated(self.url, f"creating table '{name}'"):
            try:
                if conn is not None:
                    conn.execute(insert(dl_tables).values(**values))
                    return get_table(conn, name)
                with self.engine.begin() as c:
                    c.execute(insert(dl_tables).values(**values))
                    return get_table(c, name)
            except IntegrityError:
                raise TableExistsError(
                    f"a table named '{name}' already exists",
                    table=name,
                    hint="choose another --table name, or drop the existing one",
                ) from None

    def _create_in(
        self, conn: Connection, name: str, location: str, expected_version: int | None
    ) -> TableInfo:
        """Create the table a commit names, in the commit's transaction (a racing creator wins)."""
        try:
            return self._create_table(conn, name, location)
        except TableExistsError:
            raise CommitConflictError(
                "another writer created the table first",
                table=name,
                version=expected_version or 0,
                hint="commit again: the table exists now",
            ) from None

    def _get_table(self, conn: Connection, name: str) -> TableInfo:
        return get_table(conn, name)

    def get_table(self, name: str) -> TableInfo:
        check_table_name(name)
        with db.translated(self.url, f"reading table '{name}'"), self.reader.connect() as conn:
            return get_table(conn, name)

    def table_at(self, location: str) -> TableInfo:
        """The table whose root is ``location`` (normalised: ``delta.locations.normalize_table_root``)."""
        with db.translated(self.url, f"looking up the table at {location}"), self.reader.connect() as conn:
            return table_and_latest_at(conn, location)[0]

    def list_tables(self) -> list[TableInfo]:
        with db.translated(self.url, "listing tables"), self.reader.connect() as conn:
            return [table_info(r) for r in conn.execute(select(dl_tables).order_by(dl_tables.c.name))]

    def update_table(self, table_id: int, **values: Any) -> None:
        if "settings" in values and not isinstance(values["settings"], str):
            values["settings"] = json.dumps(values["settings"])
        with db.translated(self.url, "updating a table"), self.engine.begin() as conn:
            conn.execute(update(dl_tables).where(dl_tables.c.id == table_id).values(**values))

    def halt_table(self, table_id: int, reason: str, version: int | None) -> None:
        self.update_table(table_id, state=TableState.HALTED, halted_reason=reason, halted_version=version)

    def resume_table(self, table_id: int) -> None:
        self.update_table(table_id, state=TableState.ACTIVE, halted_reason=None, halted_version=None)

    def delete_table(self, table_id: int) -> None:
        """Forget a table (its published files stay where they are)."""
        with db.translated(self.url, "dropping a table"), self.engine.begin() as conn:
            for t in (dl_lag_samples, dl_table_failures, dl_mirror_status, dl_files, dl_actions, dl_commits):
                conn.execute(delete(t).where(t.c.table_id == table_id))
            conn.execute(delete(dl_tables).where(dl_tables.c.id == table_id))

    # -- the publisher lease ------------------------------------------------------------------
    def acquire_lease(self, table_id: int, owner: str, ttl_seconds: float) -> bool:
        """Take (or renew) the table's publisher lease; False when another live owner holds it."""
        now = now_ms()
        with db.translated(self.url, "taking the publisher lease"), self.engine.begin() as conn:
            result = conn.execute(
                update(dl_tables)
                .where(dl_tables.c.id == table_id)
                .where(
                    or_(
                        dl_tables.c.lease_owner.is_(None),
                        dl_tables.c.lease_expires_at < now,
                        dl_tables.c.lease_owner == owner,
                    )
                )
                .values(lease_owner=owner, lease_expires_at=now + int(ttl_seconds * 1000))
            )
            return bool(result.rowcount == 1)

    def release_lease(self, table_id: int, owner: str) -> None:
        with db.translated(self.url, "releasing the publisher lease"), self.engine.begin() as conn:
            conn.execute(
                update(dl_tables)
                .where(dl_tables.c.id == table_id, dl_tables.c.lease_owner == owner)
                .values(lease_owner=None, lease_expires_at=None)
            )


__all__ = [
    "TABLE_NAME",
    "NewTable",
    "TableInfo",
    "Tables",
    "check_location",
    "check_table_name",
    "default_table_name",
    "get_table",
    "stored_location",
    "table_and_latest_at",
    "table_info",
]
