"""Initial schema: tables, commits, actions, file index, mirror status.

Revision ID: 0001
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

from delta_mirror.store.backends import mysql as mysql_backend

revision = "0001"
down_revision = None


def _big_id() -> sa.types.TypeEngine[int]:
    return sa.BigInteger().with_variant(sa.Integer, "sqlite")


def _id(table: str, type_: sa.types.TypeEngine[int]) -> sa.Column[int]:
    """The id column: SERIAL / AUTOINCREMENT, or on DuckDB (which has neither) a sequence's nextval."""
    if op.get_bind().dialect.name == "duckdb":
        op.execute(f"CREATE SEQUENCE IF NOT EXISTS {table}_id_seq")
        return sa.Column(
            "id",
            type_,
            primary_key=True,
            autoincrement=False,
            server_default=sa.text(f"nextval('{table}_id_seq')"),
        )
    return sa.Column("id", type_, primary_key=True, autoincrement=True)


def upgrade() -> None:
    op.create_table(
        "dl_tables",
        _id("dl_tables", sa.Integer()),
        sa.Column("name", sa.String(255), nullable=False),
        sa.Column("location", sa.Text, nullable=False),
        sa.Column("table_uuid", sa.String(36), nullable=False),
        sa.Column("state", sa.String(16), nullable=False, server_default="ACTIVE"),
        sa.Column("halted_reason", sa.Text),
        sa.Column("halted_version", sa.BigInteger),
        sa.Column("first_version", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("base_checkpoint_version", sa.BigInteger),
        sa.Column("checkpoint_kind", sa.String(16), nullable=False, server_default="classic"),
        sa.Column("checkpoint_part_size", sa.BigInteger),
        sa.Column("checkpoint_interval", sa.Integer),
        sa.Column("checkpoint_max_bytes", sa.BigInteger),
        sa.Column(
            "settings",
            sa.Text,
            nullable=False,
            server_default=mysql_backend.text_default(op.get_bind(), "{}"),
        ),
        sa.Column("created_at", sa.BigInteger, nullable=False),
        sa.Column("lease_owner", sa.String(255)),
        sa.Column("lease_expires_at", sa.BigInteger),
        sa.UniqueConstraint("name", name="uq_dl_tables_name"),
        **mysql_backend.table_options(op.get_bind()),
    )
    op.create_table(
        "dl_commits",
        sa.Column("table_id", sa.Integer, primary_key=True),
        sa.Column("version", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("committed_at", sa.BigInteger, nullable=False),
        sa.Column("in_commit_timestamp", sa.BigInteger),
        sa.Column("action_count", sa.Integer, nullable=False),
        sa.Column("size_bytes", sa.BigInteger, nullable=False),
        sa.Column("sha256", sa.String(64), nullable=False),
        sa.Column("has_json", sa.Boolean, nullable=False, server_default=sa.true()),
        sa.Column("source", sa.String(16), nullable=False, server_default="native"),
        **mysql_backend.table_options(op.get_bind()),
    )
    op.create_table(
        "dl_actions",
        sa.Column("table_id", sa.Integer, primary_key=True),
        sa.Column("version", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("part", sa.SmallInteger, primary_key=True, autoincrement=False),
        sa.Column("seq", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("action_type", sa.String(32), nullable=False),
        # MySQL TEXT holds 64 KiB: a wide table's metaData line is longer.
        sa.Column("payload", sa.Text().with_variant(mysql.LONGTEXT(), "mysql"), nullable=False),
        **mysql_backend.table_options(op.get_bind()),
    )
    op.create_index("ix_dl_actions_type", "dl_actions", ["table_id", "action_type", "version"])
    op.create_table(
        "dl_files",
        _id("dl_files", _big_id()),
        sa.Column("table_id", sa.Integer, nullable=False),
        sa.Column("path", sa.Text, nullable=False),
        sa.Column(
            "dv_id", sa.Text, nullable=False, server_default=mysql_backend.text_default(op.get_bind(), "")
        ),
        sa.Column("add_version", sa.BigInteger),
        sa.Column("add_part", sa.SmallInteger),
        sa.Column("add_seq", sa.Integer),
        sa.Column("remove_version", sa.BigInteger),
        sa.Column("remove_part", sa.SmallInteger),
        sa.Column("remove_seq", sa.Integer),
        sa.Column("size", sa.BigInteger),
        sa.Column("partition_values", sa.Text),
        sa.Column("deletion_timestamp", sa.BigInteger),
        **mysql_backend.table_options(op.get_bind()),
    )
    op.create_index("ix_dl_files_active", "dl_files", ["table_id", "remove_version"])
    # MySQL indexes a TEXT column by a prefix: equal prefixes are told apart by the rows themselves.
    op.create_index(
        "ix_dl_files_key", "dl_files", ["table_id", "path", "dv_id"], mysql_length={"path": 512, "dv_id": 128}
    )
    op.create_table(
        "dl_mirror_status",
        sa.Column("table_id", sa.Integer, primary_key=True),
        sa.Column("version", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("artifact", sa.String(16), primary_key=True),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("attempts", sa.Integer, nullable=False, server_default="0"),
        sa.Column("error_class", sa.String(16)),
        sa.Column("last_error", sa.Text),
        sa.Column("sha256", sa.String(64)),
        sa.Column("size_bytes", sa.BigInteger),
        sa.Column("enqueued_at", sa.BigInteger, nullable=False),
        sa.Column("started_at", sa.BigInteger),
        sa.Column("finished_at", sa.BigInteger),
        sa.Column("lease_owner", sa.String(255)),
        sa.Column("lease_expires_at", sa.BigInteger),
        **mysql_backend.table_options(op.get_bind()),
    )
    op.create_index("ix_dl_mirror_status_state", "dl_mirror_status", ["state", "table_id"])


def downgrade() -> None:
    for name in ("dl_mirror_status", "dl_files", "dl_actions", "dl_commits", "dl_tables"):
        op.drop_table(name)
