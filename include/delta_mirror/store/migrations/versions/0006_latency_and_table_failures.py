"""Per-version latency and table-level failures (issue 28).

- ``ix_dl_commits_committed`` on ``dl_commits (table_id, committed_at)``: the versions committed in a
  window (the last hour, day or week) are an index range per table, so the latency percentiles and
  the lag chart read only the window's versions, never a table's whole history. A version's latency
  is the time from its commit (``dl_commits.committed_at``) to its publish (``dl_mirror_status.
  finished_at`` of its JSON row in ``SUCCESS``): both were recorded before; only the index is new.
- ``dl_table_failures``: one row per table whose last publish attempt failed before (or outside)
  any version's put — the location could not be opened or listed, credentials were refused, the
  store failed — with the error class, the message's first line, when it first and last failed and
  how many attempts in a row. The next successful attempt deletes the row.

Revision ID: 0006
Revises: 0005
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from delta_mirror.store.backends import mysql as mysql_backend

revision = "0006"
down_revision = "0005"


def upgrade() -> None:
    op.create_index("ix_dl_commits_committed", "dl_commits", ["table_id", "committed_at"])
    op.create_table(
        "dl_table_failures",
        sa.Column("table_id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("error_class", sa.String(16), nullable=False),
        sa.Column("message", sa.Text, nullable=False),
        sa.Column("first_failed_at", sa.BigInteger, nullable=False),
        sa.Column("last_failed_at", sa.BigInteger, nullable=False),
        sa.Column("attempts", sa.Integer, nullable=False, server_default="1"),
        **mysql_backend.table_options(op.get_bind()),
    )


def downgrade() -> None:
    op.drop_table("dl_table_failures")
    op.drop_index("ix_dl_commits_committed", table_name="dl_commits")
