"""Lag history: one row per lag measurement of a table (the monitor / metrics path records them).

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

from delta_mirror.store.backends import mysql as mysql_backend

revision = "0002"
down_revision = "0001"


def _id() -> sa.Column[int]:
    """The id column: BIGSERIAL / AUTOINCREMENT, or on DuckDB (which has neither) a sequence's nextval."""
    id_type = sa.BigInteger().with_variant(sa.Integer, "sqlite")
    if op.get_bind().dialect.name == "duckdb":
        op.execute("CREATE SEQUENCE IF NOT EXISTS dl_lag_samples_id_seq")
        return sa.Column(
            "id",
            id_type,
            primary_key=True,
            autoincrement=False,
            server_default=sa.text("nextval('dl_lag_samples_id_seq')"),
        )
    return sa.Column("id", id_type, primary_key=True, autoincrement=True)


def upgrade() -> None:
    op.create_table(
        "dl_lag_samples",
        _id(),
        sa.Column("table_id", sa.Integer, nullable=False),
        sa.Column("sampled_at", sa.BigInteger, nullable=False),
        sa.Column(
            "lag_seconds", sa.Float().with_variant(mysql.DOUBLE(), "mysql"), nullable=False
        ),  # not single
        sa.Column("versions_behind", sa.BigInteger, nullable=False),
        **mysql_backend.table_options(op.get_bind()),
    )
    op.create_index("ix_dl_lag_samples_table_time", "dl_lag_samples", ["table_id", "sampled_at"])


def downgrade() -> None:
    op.drop_index("ix_dl_lag_samples_table_time", table_name="dl_lag_samples")
    op.drop_table("dl_lag_samples")
