"""An import's writes, in one transaction the store opens and owns: ``SqlStore.importing``.

The import job (``jobs/importer.py``) reads and checks a source log; what it stores goes through
the :class:`Importing` handle: the new table's row, every version's rows in bulk
(``store.bulk_load``), a source checkpoint's state (``store.source_import``) and, once the log is
read, its checkpoint layout. Leaving the ``with`` block commits all of it; an error rolls all of
it back, so a refused or failed import leaves nothing behind.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Unpack

from sqlalchemy import Connection, update

from delta_mirror.delta.source_state import CheckpointState
from delta_mirror.store import db
from delta_mirror.store.backends import backend_of
from delta_mirror.store.bulk_load import BulkImport
from delta_mirror.store.schema import dl_tables
from delta_mirror.store.source_import import record_checkpoint_state
from delta_mirror.store.tables import NewTable, TableInfo, Tables


class Importing:
    """One import into a new table (``table``); the methods write in the import's transaction.

    ``put``: one version's rows (``BulkImport.version``); ``lines``: a large commit's first lines
    while the rest is parsed (``BulkImport.lines``); ``finish``: write what is still buffered.
    Calls may come from another thread than the one that opened the import, one at a time.
    """

    def __init__(self, conn: Connection, table: TableInfo) -> None:
        self._conn = conn
        self.table = table
        # COPY, json_each, multi-row INSERTs or Arrow tables: the database's own loader
        bulk: BulkImport = backend_of(conn).bulk_import(conn, table.id)
        self._bulk = bulk
        self.abort = bulk.abort
        self.put = bulk.version
        self.lines = bulk.lines
        self.finish = bulk.finish

    def checkpoint_state(self, state: CheckpointState, *, enqueue_checkpoint: bool) -> None:
        """The state of a source checkpoint that disagrees with the JSON commits, at its version
        (``store.source_import.record_checkpoint_state``)."""
        record_checkpoint_state(self._bulk, state, enqueue_checkpoint=enqueue_checkpoint)

    def checkpoint_layout(self, kind: str, part_size: int | None) -> None:
        """The checkpoint kind (and multi-part size) of the table, when known only once the whole
        log was read (it follows the latest protocol)."""
        self._bulk.end_copy()  # the connection takes no other statement while a COPY is open
        self._conn.execute(
            update(dl_tables)
            .where(dl_tables.c.id == self.table.id)
            .values(checkpoint_kind=kind, checkpoint_part_size=part_size)
        )


class Imports(Tables):
    """Importing an existing table's log (the transaction is the store's)."""

    @contextmanager
    def importing(self, name: str, location: str, **options: Unpack[NewTable]) -> Iterator[Importing]:
        """Create the table ``name`` (``create_table``'s options) and yield the handle that stores
        its log, all in one transaction: committed when the block ends, rolled back on an error
        (database errors become the core's error classes)."""
        with db.translated(self.url, f"importing table '{name}'"), self.engine.begin() as conn:
            handle = Importing(conn, self._create_table(conn, name, location, **options))
            try:
                yield handle
            except BaseException as exc:
                handle.abort(exc)  # a COPY left open ends first: the rollback needs the connection
                raise


__all__ = ["Importing", "Imports"]
