"""Fleet watching: PostgreSQL NOTIFYs each committed version; unfinished publish states are indexed.

- An ``AFTER INSERT`` trigger on ``dl_commits`` sends ``NOTIFY delta_mirror_commits, '<table_id>'``
  (``store/watch.py``'s channel). It runs in the writer's transaction, so a listener hears of a
  version only once it is committed, and every write path (native commits, verbatim commits of the
  commit service, imports) notifies without knowing about it. Listeners still poll as a fallback.
- ``ix_dl_mirror_status_open``: a partial index of the states that are not ``SUCCESS``, so "which
  versions are still to publish" reads the open rows, not every version's row (both backends
  support partial indexes).

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"

_FUNCTION = """
CREATE OR REPLACE FUNCTION delta_mirror_notify_commit() RETURNS trigger AS $$
BEGIN
    PERFORM pg_notify('delta_mirror_commits', NEW.table_id::text);
    RETURN NULL;
END;
$$ LANGUAGE plpgsql
"""


def upgrade() -> None:
    if op.get_bind().dialect.name == "duckdb":
        return  # no partial indexes on DuckDB; its scans of the status rows answer the same queries
    op.create_index(
        "ix_dl_mirror_status_open",
        "dl_mirror_status",
        ["table_id", "artifact", "version"],
        postgresql_where=sa.text("state <> 'SUCCESS'"),
        sqlite_where=sa.text("state <> 'SUCCESS'"),
    )
    if op.get_bind().dialect.name == "postgresql":
        op.execute(_FUNCTION)
        op.execute(
            "CREATE TRIGGER dl_commits_notify AFTER INSERT ON dl_commits "
            "FOR EACH ROW EXECUTE FUNCTION delta_mirror_notify_commit()"
        )


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP TRIGGER IF EXISTS dl_commits_notify ON dl_commits")
        op.execute("DROP FUNCTION IF EXISTS delta_mirror_notify_commit()")
    if op.get_bind().dialect.name == "duckdb":
        return
    op.drop_index("ix_dl_mirror_status_open", table_name="dl_mirror_status")
