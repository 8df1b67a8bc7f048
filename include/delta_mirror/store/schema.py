"""Table definitions of the store. Alembic migrations create them; this module names them.

Action payloads are JSON *text* (never PostgreSQL ``jsonb``, which reorders keys) so that the bytes
of a commit file are a pure function of the stored rows. ``dl_files`` indexes every ``add`` and
``remove`` so that the active file set at any version is one indexed query: the cost follows the
number of active files, not the length of the history.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Float,
    Index,
    Integer,
    MetaData,
    SmallInteger,
    String,
    Table,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.dialects import mysql

metadata = MetaData()

#: The one channel every new version is announced on (payload: the table id): by the ``dl_commits``
#: trigger (migrations 0004 and 0007 spell it as a literal: a migration is history), or after a
#: one-statement commit by ``pg_exec.scalar``; ``watch.CommitWatcher`` listens on it.
COMMIT_CHANNEL = "delta_mirror_commits"

# Parts of a version's actions: the JSON commit itself, or the base snapshot an imported table
# starts from (the actions of the source's checkpoint at that version).
PART_COMMIT = 0
PART_SNAPSHOT = 1

dl_tables = Table(
    "dl_tables",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("name", String(255), nullable=False),
    Column("location", Text, nullable=False),
    Column("table_uuid", String(36), nullable=False),
    Column("state", String(16), nullable=False, server_default="ACTIVE"),
    Column("halted_reason", Text),
    Column("halted_version", BigInteger),
    Column("first_version", BigInteger, nullable=False, server_default="0"),
    Column("base_checkpoint_version", BigInteger),
    Column("checkpoint_kind", String(16), nullable=False, server_default="classic"),
    Column("checkpoint_part_size", BigInteger),
    Column("checkpoint_interval", Integer),
    Column("checkpoint_max_bytes", BigInteger),
    Column("settings", Text, nullable=False, server_default="{}"),
    Column("created_at", BigInteger, nullable=False),
    Column("lease_owner", String(255)),
    Column("lease_expires_at", BigInteger),
    UniqueConstraint("name", name="uq_dl_tables_name"),
)

dl_commits = Table(
    "dl_commits",
    metadata,
    Column("table_id", Integer, primary_key=True),
    Column("version", BigInteger, primary_key=True, autoincrement=False),
    Column("committed_at", BigInteger, nullable=False),
    Column("in_commit_timestamp", BigInteger),
    Column("action_count", Integer, nullable=False),
    Column("size_bytes", BigInteger, nullable=False),
    Column("sha256", String(64), nullable=False),
    Column("has_json", Boolean, nullable=False, server_default="1"),
    Column("source", String(16), nullable=False, server_default="native"),
)
# The versions committed in a window, per table (migration 0006): latency percentiles and the lag chart.
Index("ix_dl_commits_committed", dl_commits.c.table_id, dl_commits.c.committed_at)

dl_actions = Table(
    "dl_actions",
    metadata,
    Column("table_id", Integer, primary_key=True),
    Column("version", BigInteger, primary_key=True, autoincrement=False),
    Column("part", SmallInteger, primary_key=True, autoincrement=False),
    Column("seq", Integer, primary_key=True, autoincrement=False),
    Column("action_type", String(32), nullable=False),
    Column("payload", Text().with_variant(mysql.LONGTEXT(), "mysql"), nullable=False),
)
# The action types the store reads by type (a snapshot's protocol, metaData, txn, domainMetadata):
# ix_dl_actions_type holds only their rows (migration 0005), not the adds and removes that are
# almost every row. A read by type carries this literal predicate too: SQLite uses a partial index
# only when the query repeats its condition.
LOOKED_UP_ACTIONS = ("protocol", "metaData", "txn", "domainMetadata")
LOOKED_UP_PREDICATE = f"action_type IN ({', '.join(repr(kind) for kind in LOOKED_UP_ACTIONS)})"
Index(
    "ix_dl_actions_type",
    dl_actions.c.table_id,
    dl_actions.c.action_type,
    dl_actions.c.version,
    dl_actions.c.part,
    dl_actions.c.seq,
    postgresql_where=text(LOOKED_UP_PREDICATE),
    sqlite_where=text(LOOKED_UP_PREDICATE),
)

dl_files = Table(
    "dl_files",
    metadata,
    Column("id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True),
    Column("table_id", Integer, nullable=False),
    Column("path", Text, nullable=False),
    Column("dv_id", Text, nullable=False, server_default=""),
    Column("add_version", BigInteger),
    Column("add_part", SmallInteger),
    Column("add_seq", Integer),
    Column("remove_version", BigInteger),
    Column("remove_part", SmallInteger),
    Column("remove_seq", Integer),
    Column("size", BigInteger),
    Column("partition_values", Text),
    Column("deletion_timestamp", BigInteger),
)
Index("ix_dl_files_active", dl_files.c.table_id, dl_files.c.remove_version)
Index(
    "ix_dl_files_key",
    dl_files.c.table_id,
    dl_files.c.path,
    dl_files.c.dv_id,
    mysql_length={"path": 512, "dv_id": 128},  # MySQL indexes TEXT by a prefix
)

dl_mirror_status = Table(
    "dl_mirror_status",
    metadata,
    Column("table_id", Integer, primary_key=True),
    Column("version", BigInteger, primary_key=True, autoincrement=False),
    Column("artifact", String(16), primary_key=True),
    Column("state", String(16), nullable=False),
    Column("attempts", Integer, nullable=False, server_default="0"),
    Column("error_class", String(16)),
    Column("last_error", Text),
    Column("sha256", String(64)),
    Column("size_bytes", BigInteger),
    Column("enqueued_at", BigInteger, nullable=False),
    Column("started_at", BigInteger),
    Column("finished_at", BigInteger),
    Column("lease_owner", String(255)),
    Column("lease_expires_at", BigInteger),
)
Index("ix_dl_mirror_status_state", dl_mirror_status.c.state, dl_mirror_status.c.table_id)

# Lag history (migration 0002): one row per measurement; pruned by the table's lag_history_retention.
dl_lag_samples = Table(
    "dl_lag_samples",
    metadata,
    Column("id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True),
    Column("table_id", Integer, nullable=False),
    Column("sampled_at", BigInteger, nullable=False),
    Column("lag_seconds", Float().with_variant(mysql.DOUBLE(), "mysql"), nullable=False),
    Column("versions_behind", BigInteger, nullable=False),
)
Index("ix_dl_lag_samples_table_time", dl_lag_samples.c.table_id, dl_lag_samples.c.sampled_at)

# A table's failed publish attempts (migration 0006): what failed outside any version's put (the
# location, its listing, credentials, the store), cleared by the next successful attempt.
dl_table_failures = Table(
    "dl_table_failures",
    metadata,
    Column("table_id", Integer, primary_key=True, autoincrement=False),
    Column("error_class", String(16), nullable=False),
    Column("message", Text, nullable=False),
    Column("first_failed_at", BigInteger, nullable=False),
    Column("last_failed_at", BigInteger, nullable=False),
    Column("attempts", Integer, nullable=False, server_default="1"),
)

dl_breakers = Table(
    "dl_breakers",
    metadata,
    Column("key", String(512), primary_key=True),
    Column("state", String(16), nullable=False, server_default="CLOSED"),
    Column("failures", Integer, nullable=False, server_default="0"),
    Column("opened_at", BigInteger),
    Column("updated_at", BigInteger, nullable=False),
    Column("last_error", Text),
)

# After a bulk load, PostgreSQL's planner learns the new rows from ``ANALYZE`` of the columns the
# store's queries filter on (a whole-table ANALYZE also sorts the sampled payloads and partition
# values: about three times the time, for no change of plan).
ANALYZE_STATEMENTS = (
    "ANALYZE dl_files (table_id, path, dv_id, add_version, remove_version)",
    "ANALYZE dl_actions (table_id, version, action_type)",
)

__all__ = [
    "ANALYZE_STATEMENTS",
    "LOOKED_UP_ACTIONS",
    "LOOKED_UP_PREDICATE",
    "PART_COMMIT",
    "PART_SNAPSHOT",
    "dl_actions",
    "dl_breakers",
    "dl_commits",
    "dl_files",
    "dl_lag_samples",
    "dl_mirror_status",
    "dl_table_failures",
    "dl_tables",
    "metadata",
]
