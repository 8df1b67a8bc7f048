"""Store-side cost of one commit, per commit kind and path: round trips to PostgreSQL (libpq's
protocol trace: one ``Query`` or ``Sync`` message each, so a pre-ping, BEGIN and COMMIT count)
and the wall and CPU time of ``SqlStore.commit`` / ``commit_verbatim`` in this process.

    python benchmarks/commit_round_trips.py --store postgresql+psycopg://... [--commits 200]

Uses only the store's public API, so the same script measures an older tree (``PYTHONPATH=<old
tree>/include``) for a before/after pair. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from typing import IO, Any

import psycopg
from sqlalchemy import event

from delta_mirror.store import SqlStore

Action = tuple[str, dict[str, Any]]
_ROUND_TRIP = re.compile(r"^(?:\S+\t)?F\t\d+\t(Query|Sync)\b", re.MULTILINE)


def add(path: str, dv: int | None = None) -> Action:
    body: dict[str, Any] = {"path": path, "partitionValues": {}, "size": 1, "modificationTime": 1}
    body["dataChange"] = True
    if dv is not None:
        body["deletionVector"] = {
            "storageType": "i",
            "pathOrInlineDv": f"dv{dv}",
            "sizeInBytes": 4,
            "cardinality": dv,
        }
    return ("add", body)


def remove(path: str, dv: int | None = None) -> Action:
    body: dict[str, Any] = {"path": path, "deletionTimestamp": 2, "dataChange": True}
    if dv is not None:
        body["deletionVector"] = {
            "storageType": "i",
            "pathOrInlineDv": f"dv{dv}",
            "sizeInBytes": 4,
            "cardinality": dv,
        }
    return ("remove", body)


def protocol() -> Action:
    return ("protocol", {"minReaderVersion": 1, "minWriterVersion": 2})


def metadata(i: int) -> Action:
    schema = json.dumps(
        {"type": "struct", "fields": [{"name": "id", "type": "long", "nullable": True, "metadata": {}}]}
    )
    return (
        "metaData",
        {
            "id": "00000000-0000-0000-0000-000000000001",
            "format": {"provider": "parquet", "options": {}},
            "schemaString": schema,
            "partitionColumns": [],
            "configuration": {"delta.logRetentionDuration": f"interval {i % 7 + 1} days"},
            "createdTime": 1,
        },
    )


# Each kind's i-th commit (i >= 1) after version 0 added "f0.parquet" and "d.parquet" (no DV).
KINDS: dict[str, Callable[[int], list[Action]]] = {
    "append": lambda i: [add(f"f{i}.parquet")],
    "merge (remove + add)": lambda i: [remove(f"f{i - 1}.parquet"), add(f"f{i}.parquet")],
    "dv update": lambda i: [remove("d.parquet", None if i == 1 else i - 1), add("d.parquet", i)],
    "metadata change": lambda i: [metadata(i)],
    "protocol (same)": lambda i: [protocol()],
}


def v0() -> list[Action]:
    return [protocol(), metadata(0), add("f0.parquet"), add("d.parquet")]


def commit_file(actions: list[Action]) -> bytes:
    lines = [
        {"commitInfo": {"timestamp": 1700000000000, "operation": "WRITE"}},
        *({k: b} for k, b in actions),
    ]
    return "".join(json.dumps(x, separators=(",", ":")) + "\n" for x in lines).encode()


class RoundTrips:
    """libpq protocol trace of every connection the store opens from now on."""

    def __init__(self, store: SqlStore) -> None:
        self.traced: list[tuple[Any, IO[str]]] = []
        event.listen(store.engine, "connect", self._trace)
        store.engine.dispose()

    def _trace(self, dbapi_conn: Any, _record: Any) -> None:
        out = tempfile.TemporaryFile("w+")  # noqa: SIM115 (lives as long as the process)
        self.traced.append((dbapi_conn, out))
        self._start(dbapi_conn, out)

    @staticmethod
    def _start(dbapi_conn: Any, out: IO[str]) -> None:
        dbapi_conn.pgconn.trace(os.dup(out.fileno()))
        dbapi_conn.pgconn.set_trace_flags(psycopg.pq.Trace.SUPPRESS_TIMESTAMPS)

    def count(self) -> int:
        total = 0
        for dbapi_conn, out in self.traced:
            if not dbapi_conn.closed:
                dbapi_conn.pgconn.untrace()
                self._start(dbapi_conn, out)
            out.seek(0)
            total += len(_ROUND_TRIP.findall(out.read()))
        return total


def measure(url: str, path: str, kind: str, commits: int) -> dict[str, Any]:
    store = SqlStore(url)
    name = f"t{uuid.uuid4().hex[:8]}"
    location = f"file:///tmp/bench-round-trips/{name}"
    one: Callable[[int], object]
    if path == "native":
        store.create_table(name, location)
        store.commit(name, v0())

        def one(i: int) -> object:
            return store.commit(name, KINDS[kind](i))
    else:
        store.commit_verbatim(location, 0, commit_file(v0()), create_name=name)

        def one(i: int) -> object:
            return store.commit_verbatim(location, i, commit_file(KINDS[kind](i)))

    one(1)  # warm: the table is remembered (where the store remembers tables)
    trips = RoundTrips(store)
    one(2)
    first = trips.count()
    wall, cpu = [], []
    for i in range(3, commits + 3):
        w, c = time.perf_counter(), time.process_time()
        one(i)
        wall.append(time.perf_counter() - w)
        cpu.append(time.process_time() - c)
    total = trips.count()
    store.close()
    return {
        "round_trips": first,
        "round_trips_mean": round((total - first) / commits, 2),
        "wall_ms_median": round(statistics.median(wall) * 1000, 3),
        "cpu_ms_median": round(statistics.median(cpu) * 1000, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", required=True, help="a PostgreSQL store URL (initialised here)")
    parser.add_argument("--commits", type=int, default=200)
    args = parser.parse_args()
    if not args.store.startswith("postgresql"):
        sys.exit("--store must be a PostgreSQL URL (the round trips are counted by libpq's trace)")
    init = SqlStore(args.store)
    init.init()
    init.close()
    out: dict[str, Any] = {"commits_per_figure": args.commits, "load_1m": os.getloadavg()[0]}
    for path in ("native", "verbatim"):
        out[path] = {kind: measure(args.store, path, kind, args.commits) for kind in KINDS}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
