"""The commit NOTIFY leaves the one-statement commit's transaction (issue 31; PostgreSQL only).

Migration 0004's trigger notifies in every transaction that inserts into ``dl_commits``. PostgreSQL
holds the notify queue's cluster-wide lock from the commit's ``PreCommit_Notify`` until its commit
record is flushed, so notifying commits never share a WAL flush (no group commit): on an fsync-on
server that capped appends at ~300/s against ~1,000/s without the trigger.

The trigger function now skips the NOTIFY when the transaction says it notifies after its commit
itself (``delta_mirror.notify_after_commit`` set ``on``, transaction-locally): the one-statement
commits (``store/pg_commit.py``) set it and ``store/pg_exec.py`` sends the same NOTIFY in its own
transaction once the commit has returned (a transaction that only notifies writes no WAL, so it
holds the lock briefly). Every other writer (the transaction path, imports, a process still on the
code before this migration) never sets it and still notifies in its transaction, as before, so
mixed versions keep waking watchers. Other backends have no trigger: nothing to do.

Revision ID: 0007
Revises: 0006
"""

from __future__ import annotations

from alembic import op

revision = "0007"
down_revision = "0006"

_NOTIFY_UNLESS_SAID = """
CREATE OR REPLACE FUNCTION delta_mirror_notify_commit() RETURNS trigger AS $$
BEGIN
    IF current_setting('delta_mirror.notify_after_commit', true) IS DISTINCT FROM 'on' THEN
        PERFORM pg_notify('delta_mirror_commits', NEW.table_id::text);
    END IF;
    RETURN NULL;
END;
$$ LANGUAGE plpgsql
"""

# 0004's function, as it was.
_NOTIFY_ALWAYS = """
CREATE OR REPLACE FUNCTION delta_mirror_notify_commit() RETURNS trigger AS $$
BEGIN
    PERFORM pg_notify('delta_mirror_commits', NEW.table_id::text);
    RETURN NULL;
END;
$$ LANGUAGE plpgsql
"""


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(_NOTIFY_UNLESS_SAID)


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(_NOTIFY_ALWAYS)
