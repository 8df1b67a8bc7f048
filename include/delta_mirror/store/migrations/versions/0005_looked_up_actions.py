"""``ix_dl_actions_type`` indexes only the action types the store looks up by type.

The store reads a table's ``protocol``, ``metaData``, ``txn`` and ``domainMetadata`` lines by type
(a snapshot, a commit's checks); nothing looks up ``add``, ``remove``, ``cdc`` or ``commitInfo``
rows by type, and they are almost every row. Indexing them cost every write an index entry per
line: a third of the database's work when a 300k-file log is imported. The index is now partial
(both backends support partial indexes); the reads carry the same literal predicate
(``schema.LOOKED_UP_PREDICATE``), which SQLite needs to pick it; the index now ends with part and
seq, the reads' order.

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"

# A copy, not an import of schema.LOOKED_UP_PREDICATE: a migration stays what it was when written.
_PREDICATE = "action_type IN ('protocol', 'metaData', 'txn', 'domainMetadata')"
_OLD_COLUMNS = ["table_id", "action_type", "version"]
# With part and seq the index is in the reads' ORDER BY order: "the newest" is the first entry of a
# backward walk, and the planner prefers it even before ANALYZE (SQLite chose the primary key and a
# filter over every action of the table without statistics).
_COLUMNS = ["table_id", "action_type", "version", "part", "seq"]


def upgrade() -> None:
    op.drop_index("ix_dl_actions_type", table_name="dl_actions")
    if op.get_bind().dialect.name == "duckdb":
        return  # no partial indexes on DuckDB: no index (a scan by table answers), none to keep up on imports
    op.create_index(
        "ix_dl_actions_type",
        "dl_actions",
        _COLUMNS,
        postgresql_where=sa.text(_PREDICATE),
        sqlite_where=sa.text(_PREDICATE),
    )


def downgrade() -> None:
    if op.get_bind().dialect.name != "duckdb":
        op.drop_index("ix_dl_actions_type", table_name="dl_actions")
    op.create_index("ix_dl_actions_type", "dl_actions", _OLD_COLUMNS)
