"""The SQL store: the authority for every table's Delta log (SQLAlchemy 2 Core + Alembic).

All of the package's SQL lives in this folder. ``SqlStore`` (``sql_store.py``) is one facade
composed of a mixin per topic:

- ``tables.py``: tables and the publisher lease;
- ``commits.py``: native commits and imported versions (the Delta rules: ``delta/commit_rules.py``);
- ``verbatim.py``: a writer's exact commit file (the commit service), one statement when it can;
- ``log_rows.py``: the rows every write path writes (commit claim, actions, file index, queue);
- ``reads.py``: commits, snapshots and active file sets (also as id ranges for Spark over JDBC);
- ``mirror_status.py``: the per-version publish states (the publisher's queue);
- ``lag.py``: lag samples; ``latency.py``: per-version latency (commit to publish);
- ``table_failures.py``: failed publish attempts per table; ``breakers.py``: circuit-breaker rows.

``schema.py`` names the tables, ``states.py`` the values of their state columns, ``db.py`` makes
engines, runs migrations and turns database errors into the core's error classes.

The names below are loaded on first use: importing ``delta_mirror.store.states`` (the CLI does, for
its option choices) must not import SQLAlchemy, which is a third of a ``delta-mirror status`` (issue 15).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from delta_mirror.lazy import lazy_names

# public name -> the module that defines it
_PUBLIC = {
    "Artifact": "delta_mirror.store.states",
    "FileEntry": "delta_mirror.store.sql_store",
    "PublishState": "delta_mirror.store.states",
    "Snapshot": "delta_mirror.store.sql_store",
    "SqlStore": "delta_mirror.store.sql_store",
    "StatusRow": "delta_mirror.store.sql_store",
    "TableInfo": "delta_mirror.store.sql_store",
    "TableState": "delta_mirror.store.states",
}

if TYPE_CHECKING:
    from delta_mirror.store.sql_store import FileEntry, Snapshot, SqlStore, StatusRow, TableInfo
    from delta_mirror.store.states import Artifact, PublishState, TableState


# a submodule not imported yet (``delta_mirror.store.db``, ...) is found too, as before this was lazy
__getattr__ = lazy_names(__name__, _PUBLIC, submodules=True)


__all__ = [
    "Artifact",
    "FileEntry",
    "PublishState",
    "Snapshot",
    "SqlStore",
    "StatusRow",
    "TableInfo",
    "TableState",
]
