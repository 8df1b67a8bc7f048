"""``make bench-cluster``: a fleet of event tables on a `make cluster` stack with two triggerers.

N event tables (``publish_in``: the default, the triggerer), their DAGs unpaused in one PATCH, on
the cluster (CeleryExecutor, 2 triggerers, 1 Celery worker, PostgreSQL store with NOTIFY); writers
commit one ``add`` to random tables at each rate; then, at the first rate again, the triggerer that
holds the most triggers is SIGKILLed mid-phase. Per phase: commit → published p50/p95/p99/max (from
the store: ``committed_at`` → the json status's ``finished_at``), never published, published once,
CPU-seconds per commit of the cluster's Airflow processes and of PostgreSQL, store connections
(``pg_stat_activity``), and where the triggers run. The tables live in a local folder (every
process of the cluster is on this machine); the table creation, writers and latency reading are
``fleet_airflow.py``'s.

    PYTHONPATH=tests .venv/bin/python benchmarks/fleet_cluster.py --tables 1000 --rates 1,10 --seconds 120

One JSON object on stdout and in ``bench-results/cluster-fleet.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from fleet_airflow import Writers, _pct, _published, make_tables
from support.cluster import ClusterRun, start_cluster
from support.waiting import wait_until

REPO = Path(__file__).resolve().parent.parent
TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
            total += int(fields[11]) + int(fields[12]) + int(fields[13]) + int(fields[14])
        except (OSError, IndexError, ValueError):
            continue
    return total / TICK


def cluster_cpu(run: ClusterRun) -> dict[str, float]:
    """CPU-seconds so far of each cluster process (its group and marked children)."""
    return {name: cpu_seconds(run.cluster.pids(name)) for name in run.cluster.names()}


def store_connections(run: ClusterRun) -> int:
    db = run.cluster.topology.settings["STORE_DB"]
    rows = run.airflow_query("SELECT count(*) FROM pg_stat_activity WHERE datname = %s", (db,))
    return int(rows[0][0])


def holders_count(run: ClusterRun) -> dict[str, int]:
    out: dict[str, int] = {}
    for host in run.trigger_holders().values():
        out[str(host)] = out.get(str(host), 0) + 1
    return out


def phase(
    run: ClusterRun, names: list[str], root: Path, rate: float, seconds: float, kill_at: float | None
) -> dict[str, Any]:
    """Writers at ``rate`` for ``seconds`` (a triggerer SIGKILLed ``kill_at`` s in), then the drain."""
    port = run.cluster.port("postgres")
    store_db = run.cluster.topology.settings["STORE_DB"]
    cpu0, t0 = cluster_cpu(run), time.monotonic()
    conns: list[int] = []
    writers = Writers(run.store_url, root, names, rate, seconds, threads=2 if rate > 2 else 1)
    writers.start()
    killed: dict[str, Any] = {}
    while any(w.is_alive() for w in writers.workers):
        conns.append(store_connections(run))
        if kill_at is not None and not killed and time.monotonic() - t0 >= kill_at:
            counts = holders_count(run)
            victim = max((h for h in counts if h.startswith("airflow-triggerer")), key=counts.__getitem__)
            moved = [t for t, h in run.trigger_holders().items() if h == victim]
            k0 = time.monotonic()
            run.cluster.kill(victim, signal.SIGKILL)
            killed = {"triggerer": victim, "triggers": len(moved), "at_s": round(k0 - t0, 1)}
            try:
                killed["moved_after_s"] = round(run.wait_triggers(moved, 240, not_on=victim), 1)
            except AssertionError as exc:
                killed["moved_after_s"] = None
                killed["error"] = str(exc)
        time.sleep(1.0)
    writers.join()
    sent = list(writers.sent)
    wanted = set(sent)

    def drained() -> bool:
        rows = _published(port, store_db, sent)
        return sum(1 for r in rows if r[3] == "SUCCESS") == len(wanted)

    drain_s: float | None
    try:
        drain_s = round(wait_until(drained, 300, "the phase's commits published", 1.0), 1)
    except AssertionError:
        drain_s = None
    cpu1, elapsed = cluster_cpu(run), time.monotonic() - t0
    rows = _published(port, store_db, sent)
    lat = sorted((f - c) / 1000 for _n, _v, c, s, f, _a in rows if s == "SUCCESS" and f is not None)
    # a process killed in the phase took its CPU counters with it: its share is not counted
    spent = {k: round(max(0.0, cpu1[k] - cpu0.get(k, 0.0)), 2) for k in cpu1}
    airflow_cpu = sum(v for k, v in spent.items() if k.startswith("airflow-"))
    result: dict[str, Any] = {
        "rate": rate,
        "seconds": seconds,
        "commits": len(sent),
        "writer_errors": len(writers.errors),
        "latency_s": {
            "p50": _pct(lat, 0.5),
            "p95": _pct(lat, 0.95),
            "p99": _pct(lat, 0.99),
            "max": _pct(lat, 1.0),
        },
        "never_published": len(sent) - len(lat),
        "published_exactly_once": bool(sent)
        and sum(1 for r in rows if r[3] == "SUCCESS" and r[5] == 1) == len(sent),
        "publish_attempts_max": max((r[5] or 0 for r in rows), default=0),
        "drain_s": drain_s,
        "cpu_s_per_commit": {
            "airflow": round(airflow_cpu / max(1, len(sent)), 4),
            "postgres": round(spent.get("postgres", 0.0) / max(1, len(sent)), 4),
            "by_process": spent,
        },
        "store_connections": {"max": max(conns, default=0), "min": min(conns, default=0)},
        "wall_s": round(elapsed, 1),
        "load_at_end": round(os.getloadavg()[0], 2),
        "triggers": holders_count(run),
    }
    if killed:
        result["triggerer_kill"] = killed
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description="a fleet of event tables on a two-triggerer cluster")
    parser.add_argument("--tables", type=int, default=1000)
    parser.add_argument("--rates", default="1,10", help="commits/s per phase, comma-separated")
    parser.add_argument("--seconds", type=float, default=120)
    parser.add_argument("--kill-at", type=float, default=30, help="s into the kill phase (rate: the first)")
    parser.add_argument(
        "--warmup", type=float, default=60, help="s of commits at the first rate before the measured phases"
    )
    parser.add_argument("--out", default=str(REPO / "bench-results" / "cluster-fleet.json"))
    opts = parser.parse_args()
    rates = [float(r) for r in opts.rates.split(",") if r.strip()]
    base = Path(tempfile.mkdtemp(prefix="dm-cluster-fleet-"))
    base.chmod(0o755)  # PostgreSQL runs as its own user under root
    names = [f"t{i:04d}" for i in range(opts.tables)]
    report: dict[str, Any] = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.platform()}",
        "load_at_start": round(os.getloadavg()[0], 2),
        "tables": opts.tables,
        "phases": [],
    }
    started = time.monotonic()
    run = start_cluster(base / "cl", names, workers=1)
    try:
        report["up_s"] = round(time.monotonic() - started, 1)
        tables_root = base / "tables"
        made = time.monotonic()
        make_tables(run.store_url, tables_root, opts.tables)
        report["tables_made_s"] = round(time.monotonic() - made, 1)
        run.unpause_all_tables(opts.tables)
        report["triggers_assigned_s"] = round(run.wait_triggers(names, 900), 1)
        report["triggers_at_start"] = holders_count(run)
        report["store_connections_idle"] = store_connections(run)
        if opts.warmup > 0:  # the triggerers start their triggers after taking them: not measured
            print("warm-up ...", file=sys.stderr, flush=True)
            report["warmup"] = phase(run, names, tables_root, rates[0], opts.warmup, None)
        for rate in rates:
            print(f"phase {rate}/s ...", file=sys.stderr, flush=True)
            report["phases"].append(phase(run, names, tables_root, rate, opts.seconds, None))
        print("phase: triggerer kill ...", file=sys.stderr, flush=True)
        report["phases"].append(phase(run, names, tables_root, rates[0], opts.seconds, opts.kill_at))
    finally:
        run.cluster.down()
        shutil.rmtree(base, ignore_errors=True)
    report["seconds"] = round(time.monotonic() - started, 1)
    report["load_at_end"] = round(os.getloadavg()[0], 2)
    out = Path(opts.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
