"""Lag history: one row per lag measurement of a table (the monitor / metrics path records them).

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"


def upgrade() -> None:
    op.create_table(
        "dl_lag_samples",
        sa.Column(
            "id", sa.BigInteger().with_variant(sa.Integer, "sqlite"), primary_key=True, autoincrement=True
        ),
        sa.Column("table_id", sa.Integer, nullable=False),
        sa.Column("sampled_at", sa.BigInteger, nullable=False),
        sa.Column("lag_seconds", sa.Float, nullable=False),
        sa.Column("versions_behind", sa.BigInteger, nullable=False),
    )
    op.create_index("ix_dl_lag_samples_table_time", "dl_lag_samples", ["table_id", "sampled_at"])


def downgrade() -> None:
    op.drop_index("ix_dl_lag_samples_table_time", table_name="dl_lag_samples")
    op.drop_table("dl_lag_samples")
