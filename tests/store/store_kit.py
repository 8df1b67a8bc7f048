"""What the store's tests share: (kind, body) actions, a first table, the row counts of the store."""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import Table, func, select
from support.builders import add_body, metadata_body, protocol_body, remove_body

from delta_mirror.store import SqlStore
from delta_mirror.store.schema import dl_actions, dl_commits, dl_files, dl_mirror_status, dl_tables

Action = tuple[str, dict[str, Any]]


# The store takes (kind, body) pairs; the bodies come from support.builders.
def protocol(**extra: Any) -> Action:
    return ("protocol", protocol_body(**extra))


def metadata(**configuration: str) -> Action:
    return ("metaData", metadata_body(configuration=configuration))


def _dv(dv: dict[str, Any] | None) -> dict[str, Any]:
    return {} if dv is None else {"deletionVector": dv}


def add(path: str, size: int = 1, dv: dict[str, Any] | None = None, **extra: Any) -> Action:
    return ("add", add_body(path, size=size, **_dv(dv), **extra))


def remove(path: str, dv: dict[str, Any] | None = None) -> Action:
    return ("remove", remove_body(path, **_dv(dv)))


def inline_dv(n: int) -> dict[str, Any]:
    return {"storageType": "i", "pathOrInlineDv": f"dv{n}", "sizeInBytes": 4, "cardinality": n}


def new_table(store: SqlStore, location: str, name: str = "t", *more: Action) -> int:
    """Create ``name`` and commit version 0 (protocol, metaData, a.parquet, plus ``more``)."""
    table = store.create_table(name, location)
    assert store.commit(name, [protocol(), metadata(), add("a.parquet"), *more]) == 0
    return table.id


def state(store: SqlStore) -> dict[str, Any]:
    """Row counts of every store table and each table's latest version: 'unchanged' means equal."""
    with store.engine.connect() as conn:
        counts = {
            t.name: conn.execute(select(func.count()).select_from(t)).scalar()
            for t in (dl_tables, dl_commits, dl_actions, dl_files, dl_mirror_status)
        }
        latest = dict(
            conn.execute(
                select(dl_commits.c.table_id, func.max(dl_commits.c.version)).group_by(dl_commits.c.table_id)
            ).all()
        )
    return {"counts": counts, "latest": latest}


def versions(store: SqlStore, table_id: int) -> list[int]:
    with store.engine.connect() as conn:
        return list(
            conn.execute(
                select(dl_commits.c.version)
                .where(dl_commits.c.table_id == table_id)
                .order_by(dl_commits.c.version)
            ).scalars()
        )


def spark_file(*actions: Action, commit_info: dict[str, Any] | None = None) -> bytes:
    """A commit file as Delta-Spark writes it: commitInfo first, one action per line, each ending in
    ``\\n`` — here with a non-ASCII escape and keys out of Spark's order, which a re-encoding would
    change: only a verbatim store keeps these bytes."""
    info = commit_info or {
        "timestamp": 1700000000000,
        "operation": "WRITE",
        "engineInfo": "Apache-Spark/4.2.0",
    }
    lines = [json.dumps({"commitInfo": info}, separators=(",", ":"))]
    for kind, body in actions:
        lines.append(json.dumps({kind: dict(reversed(list(body.items())))}, separators=(",", ":")))
    lines[0] = lines[0].replace('"WRITE"', '"WRIT\\u00c9"')
    return "".join(line + "\n" for line in lines).encode()


def v0_file(**configuration: str) -> bytes:
    return spark_file(protocol(), metadata(**configuration), add("a.parquet"))


def store_rows(store: SqlStore, table_id: int) -> dict[str, list[tuple[Any, ...]]]:
    """Every row a table's commits wrote, without ids and clock times: equal rows, equal commits."""

    def rows(table: Table, columns: list[str], order: list[str]) -> list[tuple[Any, ...]]:
        query = select(*(table.c[c] for c in columns)).where(table.c.table_id == table_id)
        return [tuple(r) for r in conn.execute(query.order_by(*(table.c[c] for c in order)))]

    def but(table: Table, *left_out: str) -> list[str]:
        return [c.name for c in table.c if c.name not in left_out]

    with store.engine.connect() as conn:
        return {
            "commits": rows(dl_commits, but(dl_commits, "table_id", "committed_at"), ["version"]),
            "actions": rows(
                dl_actions, ["version", "part", "seq", "action_type", "payload"], ["version", "part", "seq"]
            ),
            "files": sorted(rows(dl_files, but(dl_files, "id", "table_id"), [])),
            "status": rows(dl_mirror_status, ["version", "artifact", "state", "attempts"], ["version"]),
        }


# One commit of every kind a writer makes, each against a table holding a.parquet and b.parquet:
# the cases of the one-statement (PostgreSQL) and short-transaction (SQLite) commit tests.
COMMIT_KINDS: dict[str, list[Action]] = {
    "append": [add("n.parquet")],
    "remove (MERGE)": [remove("a.parquet"), add("m.parquet")],
    "delete": [remove("a.parquet")],
    "optimize": [remove("a.parquet"), remove("b.parquet"), add("opt.parquet", dataChange=False)],
    "deletion vector update": [remove("b.parquet"), add("b.parquet", dv=inline_dv(1))],
    "metadata change": [metadata(**{"delta.logRetentionDuration": "interval 2 days"})],
    "protocol change": [protocol(minWriterVersion=3)],
}
