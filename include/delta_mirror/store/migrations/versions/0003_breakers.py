"""Circuit breakers: one row per table and per storage endpoint that has failed.

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from delta_mirror.store.backends import mysql as mysql_backend

revision = "0003"
down_revision = "0002"


def upgrade() -> None:
    op.create_table(
        "dl_breakers",
        sa.Column("key", sa.String(512), primary_key=True),
        sa.Column("state", sa.String(16), nullable=False, server_default="CLOSED"),
        sa.Column("failures", sa.Integer, nullable=False, server_default="0"),
        sa.Column("opened_at", sa.BigInteger),
        sa.Column("updated_at", sa.BigInteger, nullable=False),
        sa.Column("last_error", sa.Text),
        **mysql_backend.table_options(op.get_bind()),
    )


def downgrade() -> None:
    op.drop_table("dl_breakers")
