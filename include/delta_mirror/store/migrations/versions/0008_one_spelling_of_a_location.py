"""Stored object-store locations in their one spelling (issue 39 finding 8).

Tables are looked up by location (the commit service's ``table_at``: ``dl_tables.location =
<normalised root>``), so a stored location must be in the form ``delta.locations.
normalize_table_root`` gives. Before it was the one normaliser, ``delta-mirror import`` and
``commit --location`` kept ``s3a://``, ``//``, ``%74`` and upper-case schemes as given: a table
imported at ``s3a://lake/w//t`` was not found by a writer committing to ``s3://lake/w/t``.

The upgrade rewrites each object-store location (``s3``, ``s3a``, ``s3n``, ``az``, ``abfs(s)``,
``gs``) to its normalised form. Local ``file:`` locations were always stored resolved
(``Path.resolve().as_uri()``, the form the normaliser gives) and are left alone: resolving them
again here would read the migrating machine's file system. A location the normaliser refuses, or
one whose normalised form another table's location also has (two tables at spellings of one root,
possible before the overlap check compared normalised keys), is left as it was and named in a
warning: an operator decides which table keeps the root. The downgrade keeps the new spellings
(the code before this revision reads them: ``s3://`` is what its commit service stored).

Revision ID: 0008
Revises: 0007
"""

from __future__ import annotations

import logging
from collections import Counter

import sqlalchemy as sa
from alembic import op

from delta_mirror.delta.locations import normalize_table_root
from delta_mirror.errors import PermanentError

revision = "0008"
down_revision = "0007"

log = logging.getLogger("delta_mirror.store.migrations")
_OBJECT_SCHEMES = ("s3", "s3a", "s3n", "az", "abfs", "abfss", "gs")
_tables = sa.table("dl_tables", sa.column("id", sa.Integer), sa.column("location", sa.Text))


def _normalised(location: str) -> str | None:
    if location.partition(":")[0].lower() not in _OBJECT_SCHEMES:
        return location
    try:
        return normalize_table_root(location)
    except PermanentError as exc:
        log.warning("migration 0008: the location %r is left as it is: %s", location[:200], exc.what)
        return None


def upgrade() -> None:
    conn = op.get_bind()
    rows = [(int(i), str(loc)) for i, loc in conn.execute(sa.select(_tables.c.id, _tables.c.location))]
    new = {i: _normalised(loc) for i, loc in rows}
    taken = Counter(n for n in new.values() if n is not None)
    for i, loc in rows:
        target = new[i]
        if target is None or target == loc:
            continue
        if taken[target] > 1:
            log.warning(
                "migration 0008: %r and another table's location are one root; both left as they are", loc
            )
            continue
        conn.execute(sa.update(_tables).where(_tables.c.id == i).values(location=target))


def downgrade() -> None:
    pass  # the normalised spellings are valid locations for the code before this revision
