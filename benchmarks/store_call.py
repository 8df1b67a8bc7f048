"""Client CPU of the store call a commit makes: ``SqlStore.commit_verbatim`` (what the commit service
runs per request) and ``SqlStore.commit`` (native), appends and MERGE-like commits (a remove + an
add), in one process against a real PostgreSQL; ``time.process_time`` of the committing process,
so the server's CPU is not in it.

Each tree (this one, and with ``--base`` another checkout's ``include/``) runs in its own worker
process on a fresh database of one PostgreSQL server (fsync off: the CPU is what is measured), in
alternating order per round; medians over the rounds. Commits go round-robin over ``--tables``
tables, one thread, one commit at a time.

    PYTHONPATH=tests .venv/bin/python benchmarks/store_call.py [--appends 5000] [--merges 2000]
        [--rounds 3] [--base PATH | --base a=PATH1,b=PATH2] [--store postgresql+psycopg://...]

JSON on stdout, progress on stderr. ``--worker --store URL`` runs one worker in this process (e.g.
under ``py-spy record``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
BASE_TS = 1_760_000_000_000
SCHEMA = json.dumps(
    {"type": "struct", "fields": [{"name": "id", "type": "long", "nullable": True, "metadata": {}}]}
)
KINDS = ("append", "merge")
PATHS = ("verbatim", "native")


def _line(kind: str, body: dict[str, Any]) -> str:
    return json.dumps({kind: body}, separators=(",", ":"))


def _file(table: int, version: int) -> str:
    return f"part-00000-{uuid.UUID(int=(table << 64) | version)}-c000.snappy.parquet"


def _add(table: int, version: int) -> dict[str, Any]:
    return {
        "path": _file(table, version),
        "partitionValues": {},
        "size": 1234,
        "modificationTime": BASE_TS + version,
        "dataChange": True,
        "stats": '{"numRecords":10,"minValues":{"id":1},"maxValues":{"id":10},"nullCount":{"id":0}}',
    }


def _remove(table: int, version: int) -> dict[str, Any]:
    """The remove of the file version ``version - 1`` added."""
    return {
        "path": _file(table, version - 1),
        "deletionTimestamp": BASE_TS + version,
        "dataChange": True,
        "extendedFileMetadata": True,
        "partitionValues": {},
        "size": 1234,
    }


def native_actions(table: int, version: int, kind: str) -> list[tuple[str, dict[str, Any]]]:
    """Version ``version`` (>= 1): one add; a ``merge`` also removes the file of ``version - 1``."""
    actions = [("remove", _remove(table, version))] if kind == "merge" else []
    return [*actions, ("add", _add(table, version))]


def verbatim_body(table: int, version: int, kind: str) -> bytes:
    """The Spark-shaped commit file of ``native_actions`` (a ``commitInfo`` first)."""
    merge = kind == "merge"
    info = {
        "timestamp": BASE_TS + version,
        "operation": "MERGE" if merge else "WRITE",
        "operationParameters": {"predicate": '["(id = id)"]'} if merge else {"mode": "Append"},
        "readVersion": version - 1,
        "isolationLevel": "Serializable",
        "isBlindAppend": not merge,
        "engineInfo": "Apache-Spark/4.2.0 Delta-Lake/4.4.0",
        "txnId": str(uuid.UUID(int=(version << 64) | table)),
    }
    lines = [_line("commitInfo", info), *(_line(k, b) for k, b in native_actions(table, version, kind))]
    return "".join(f"{x}\n" for x in lines).encode()


def v0_actions(table: int) -> list[tuple[str, dict[str, Any]]]:
    return [
        ("protocol", {"minReaderVersion": 1, "minWriterVersion": 2}),
        (
            "metaData",
            {
                "id": str(uuid.UUID(int=table)),
                "format": {"provider": "parquet", "options": {}},
                "schemaString": SCHEMA,
                "partitionColumns": [],
                "configuration": {},
                "createdTime": BASE_TS,
            },
        ),
    ]


def v0_body(table: int) -> bytes:
    lines = [_line("commitInfo", {"timestamp": BASE_TS, "operation": "CREATE TABLE"})]
    lines += [_line(k, b) for k, b in v0_actions(table)]
    return "".join(f"{x}\n" for x in lines).encode()


# -- the worker (one tree, one process) ---------------------------------------------------------------


def worker(url: str, appends: int, merges: int, tables: int) -> dict[str, Any]:
    """Per path and kind: client CPU and wall time per commit over the whole loop."""
    from delta_mirror.store import SqlStore

    store = SqlStore(url)
    store.init()
    out: dict[str, Any] = {}
    for path in PATHS:
        names = [f"{path}{t}" for t in range(tables)]
        roots = [f"file:///tmp/bench-store-call/{n}" for n in names]
        for t in range(tables):
            if path == "verbatim":
                store.commit_verbatim(roots[t], 0, v0_body(t), create_name=names[t])
            else:
                store.create_table(names[t], roots[t])
                store.commit(names[t], v0_actions(t), expected_version=0)
        version = [1] * tables

        def batch(
            kind: str, n: int, path: str = path, version: list[int] = version
        ) -> list[tuple[int, int, Any]]:
            """``n`` commits round-robin over the tables, built before the clock starts."""
            built = []
            for i in range(n):
                t = i % tables
                v, version[t] = version[t], version[t] + 1
                built.append(
                    (t, v, verbatim_body(t, v, kind) if path == "verbatim" else native_actions(t, v, kind))
                )
            return built

        figures: dict[str, Any] = {}
        for kind, n in (("warm", tables), ("append", appends), ("merge", merges)):
            commits = batch("append" if kind == "warm" else kind, n)
            w, c = time.perf_counter(), time.process_time()
            if path == "verbatim":
                for t, v, body in commits:
                    store.commit_verbatim(roots[t], v, body)
            else:
                for t, v, actions in commits:
                    if store.commit(names[t], actions, expected_version=v) != v:
                        raise AssertionError(f"{names[t]}: not version {v}")
            cpu, wall = time.process_time() - c, time.perf_counter() - w
            if kind != "warm" and n > 0:  # warm: every table remembered, every file of a merge added
                figures[kind] = {
                    "commits": n,
                    "cpu_ms_per_commit": round(cpu * 1000 / n, 4),
                    "wall_ms_per_commit": round(wall * 1000 / n, 4),
                }
        out[path] = figures
    store.close()
    import delta_mirror

    out["code"] = str(Path(delta_mirror.__file__).parent)  # the tree this worker ran
    return out


# -- the driver ---------------------------------------------------------------------------------------


def _labelled(raw: str) -> list[tuple[str, Path]]:
    """``PATH`` or ``label=PATH``, comma-separated; unlabelled ones are ``base``, ``base2``, ..."""
    out = []
    for n, item in enumerate(x for x in raw.split(",") if x):
        label, _, path = item.rpartition("=")
        out.append((label or ("base" if n == 0 else f"base{n + 1}"), Path(path).resolve()))
    return out


def _run_worker(tree: Path, url: str, opts: argparse.Namespace) -> dict[str, Any]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(tree / "include"), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    argv = [sys.executable, str(Path(__file__).resolve()), "--worker", "--store", url]
    argv += ["--appends", str(opts.appends), "--merges", str(opts.merges), "--tables", str(opts.tables)]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        sys.exit(f"the worker for {tree} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def _median(xs: list[float]) -> float:
    return round(statistics.median(xs), 4)


def drive(opts: argparse.Namespace) -> dict[str, Any]:
    sys.path.insert(0, str(ROOT / "tests"))
    from support.services import PgServer

    server = PgServer(url=opts.store, owned=False) if opts.store else PgServer.start_new()
    trees = [("new", ROOT), *(_labelled(opts.base) if opts.base else [])]
    runs: dict[str, list[dict[str, Any]]] = {label: [] for label, _ in trees}
    loads = []
    try:
        for r in range(opts.rounds):
            order = trees if r % 2 == 0 else list(reversed(trees))
            for label, tree in order:
                url = server.create_database("dm_store_call_")
                loads.append(os.getloadavg()[0])
                runs[label].append(_run_worker(tree, url, opts))
                print(f"round {r + 1} {label}: {json.dumps(runs[label][-1])}", file=sys.stderr)
                server.drop_database(url)
    finally:
        if server.owned:
            server.stop_and_remove()
    figures: dict[str, Any] = {}
    for label, results in runs.items():
        figures[label] = {"code": results[0]["code"]}
        figures[label] |= {
            path: {
                kind: {
                    "cpu_ms_per_commit": _median([x[path][kind]["cpu_ms_per_commit"] for x in results]),
                    "cpu_ms_range": [
                        min(x[path][kind]["cpu_ms_per_commit"] for x in results),
                        max(x[path][kind]["cpu_ms_per_commit"] for x in results),
                    ],
                    "wall_ms_per_commit": _median([x[path][kind]["wall_ms_per_commit"] for x in results]),
                }
                for kind in KINDS
                if kind in results[0][path]
            }
            for path in PATHS
        }
    return {
        "method": (__doc__ or "").split("\n\n")[0].replace("\n", " "),
        "trees": {label: str(tree) for label, tree in trees},
        "appends": opts.appends,
        "merges": opts.merges,
        "tables": opts.tables,
        "rounds": opts.rounds,
        "load_1m": [round(x, 2) for x in (min(loads), max(loads))],
        "cpus": os.cpu_count(),
        "figures": figures,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--appends", type=int, default=5000)
    parser.add_argument("--merges", type=int, default=2000)
    parser.add_argument("--tables", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--base", help="another checkout (PATH or label=PATH, comma-separated)")
    parser.add_argument("--store", help="a PostgreSQL server's URL (default: start one)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.worker:
        if not opts.store:
            sys.exit("--worker needs --store (an empty PostgreSQL database)")
        print(json.dumps(worker(opts.store, opts.appends, opts.merges, opts.tables)))
        return
    print(json.dumps(drive(opts), indent=1))


if __name__ == "__main__":
    main()
