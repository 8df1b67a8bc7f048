"""``make cluster-chaos``: lose one of each service of a `make cluster` stack while commits flow.

Starts a cluster (2 triggerers, 2 Celery workers, 2 commit-service replicas, Spark standalone,
MinIO, Redis, PostgreSQL) with event tables (``publish_in``: the default, the triggerer), keeps
committing to them, and injects one fault at a time:

- ``triggerer``: SIGKILL the triggerer that holds the triggers (they move to the other);
- ``celery_worker``: SIGKILL the Celery worker running a table's ``sync`` task (the try is retried
  on the other worker);
- ``redis``: restart the broker (SIGTERM, start again);
- ``commit_service``: SIGKILL one commit-service replica while a Spark job (spark-submit to the
  master) commits through the LogStore given both replicas' URLs (it fails over);
- ``postgres``: restart the database that holds Airflow's metadata and the store;
- ``spark_worker``: SIGKILL the Spark worker (and its executors) while ``delta-mirror checkpoint
  --engine spark`` builds a 90,000-file table's checkpoint on the cluster: no partial checkpoint is
  visible on MinIO, the worker comes back, the (retried) checkpoint is published and deltalake
  reads the table at it (``cluster_chaos_spark``).

Then two checks on the same cluster (``cluster_chaos_checks``): ``validate_readers`` (``delta-mirror
validate --reader spark`` on the standalone master, and ``--reader kernel-java``) and
``failure_mail`` (a table that cannot be published: its DAG's failure e-mail lands as an ``.eml``
in the cluster's SMTP catcher).

After each: every committed version is on MinIO exactly once with the store's bytes
(``chaos_invariants.check_table``), deltalake reads the version the store has, the lag is back
under the SLO; the recovery time (fault → all of that true) is printed per fault. One JSON object
on stdout and in ``bench-results/cluster-chaos.json``; exit 1 when any fault lost, duplicated or
corrupted anything or did not recover within its deadline.

    PYTHONPATH=tests:tests/chaos .venv/bin/python tests/chaos/cluster_chaos.py [--faults triggerer,redis]

With a selection, the other faults' results already in the JSON file are kept (each with its date).
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
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from cluster_chaos_checks import MAIL_DEFAULTS, MAIL_TABLE, check_failure_mail, check_validate_readers
from cluster_chaos_spark import fault_spark_worker
from support.cluster import ClusterRun, CommitFlow, start_cluster
from support.reports import write_report
from support.waiting import load_scaled, wait_until

REPO = Path(__file__).resolve().parents[2]
TABLES = [f"ch_{i}" for i in range(6)]
SPARK_TABLE = "chaos_spark"
LAG_SLO_S = 60.0
RATE = 2.0  # commits/s while a fault happens


def _settle(run: ClusterRun, started: float, deadline_s: float) -> dict[str, Any]:
    """Everything published, byte-identical, readers agree, lag under the SLO: the recovery time."""
    names = [*TABLES, *([SPARK_TABLE] if _has_spark_table(run) else [])]
    run.wait_published(names, deadline_s)
    verdicts = run.verdicts(names)
    store = run.store()
    try:
        disagree = {}
        for name in names:
            latest = store.latest_version(store.get_table(name).id)
            version, _rows = run.delta_rows(name)
            if version != latest:
                disagree[name] = (latest, version)
    finally:
        store.close()
    wait_until(
        lambda: all(r["lag_seconds"] <= LAG_SLO_S for r in run.status(names).values()),
        deadline_s,
        "lag under the SLO",
        1.0,
    )
    return {
        "recovery_s": round(time.monotonic() - started, 1),
        "committed": sum(v.committed for v in verdicts.values()),
        "lost": sum(len(v.lost) for v in verdicts.values()),
        "duplicated": sum(len(v.duplicated) for v in verdicts.values()),
        "corrupted": sum(len(v.corrupted) for v in verdicts.values()),
        "violations": [x for v in verdicts.values() for x in v.violations],
        "readers_disagree": disagree,
    }


def _has_spark_table(run: ClusterRun) -> bool:
    """Whether the Spark job's version 0 has created its table in the store."""
    from delta_mirror.errors import TableNotFoundError

    store = run.store()
    try:
        store.get_table(SPARK_TABLE)
        return True
    except TableNotFoundError:
        return False
    finally:
        store.close()


def fault_triggerer(run: ClusterRun) -> dict[str, Any]:
    holders = run.trigger_holders()
    victim = max({h for h in holders.values() if h}, key=lambda h: sum(1 for x in holders.values() if x == h))
    moved = [t for t, h in holders.items() if h == victim]
    with CommitFlow(run, TABLES, RATE) as flow:
        wait_until(lambda: len(flow.commits) >= 4, 60, "commits flowing", 0.2)
        t0 = time.monotonic()
        run.cluster.kill(victim, signal.SIGKILL)
        run.wait_triggers(moved, 180, not_on=victim)
        moved_s = time.monotonic() - t0
        n = len(flow.commits)
        wait_until(lambda: len(flow.commits) >= n + 4, 60, "commits after the move", 0.2)
    result = _settle(run, t0, 180)
    run.cluster.start(victim)  # back to two triggerers for the next fault
    return {"killed": victim, "triggers_moved": len(moved), "triggers_moved_s": round(moved_s, 1), **result}


def fault_celery_worker(run: ClusterRun) -> dict[str, Any]:
    """A manual run of one table's DAG; its ``sync`` task's worker is SIGKILLed while it runs."""
    dag_id = f"delta_mirror__{TABLES[0]}"
    with CommitFlow(run, TABLES, RATE) as flow:
        wait_until(lambda: len(flow.commits) >= 2, 60, "commits flowing", 0.2)
        dag_run = run.api("POST", f"/api/v2/dags/{dag_id}/dagRuns", json={"logical_date": None})
        run_id = dag_run["dag_run_id"]

        def running_on() -> str | None:
            rows = run.airflow_query(
                "SELECT state, hostname FROM task_instance WHERE dag_id = %s AND run_id = %s AND task_id = 'sync'",
                (dag_id, run_id),
            )
            return str(rows[0][1]) if rows and rows[0][0] == "running" and rows[0][1] else None

        wait_until(lambda: running_on() is not None, 240, "the sync task running on a worker", 0.2)
        victim = running_on()
        assert victim is not None
        t0 = time.monotonic()
        run.cluster.kill(victim, signal.SIGKILL)

        def finished() -> bool:
            state = run.api("GET", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}")["state"]
            return state in ("success", "failed")

        wait_until(finished, 600, f"{dag_id} run {run_id} to finish after its worker was killed", 2.0)
    rows = run.airflow_query(
        "SELECT state, try_number, hostname FROM task_instance WHERE dag_id = %s AND run_id = %s AND task_id = 'sync'",
        (dag_id, run_id),
    )
    result = _settle(run, t0, 180)
    run.cluster.start(victim)
    state, tries, host = rows[0]
    return {"killed": victim, "task_state": state, "try_number": tries, "ran_on": host, **result}


def _restart_with_commits_flowing(
    run: ClusterRun, name: str, resume_s: float, poll_s: float, settle_s: float
) -> dict[str, Any]:
    """Restart ``name`` while event tables take commits; writers must commit again afterwards."""
    with CommitFlow(run, TABLES, RATE) as flow:
        wait_until(lambda: len(flow.commits) >= 4, 60, "commits flowing", 0.2)
        t0 = time.monotonic()
        run.cluster.restart(name)
        restarted_s = time.monotonic() - t0
        n = len(flow.commits)
        wait_until(lambda: len(flow.commits) >= n + 4, resume_s, "commits after the restart", poll_s)
    return {
        "restart_s": round(restarted_s, 1),
        "writer_errors": len(flow.errors),
        **_settle(run, t0, settle_s),
    }


def fault_redis(run: ClusterRun) -> dict[str, Any]:
    return _restart_with_commits_flowing(run, "redis", resume_s=60, poll_s=0.2, settle_s=180)


def fault_commit_service(run: ClusterRun) -> dict[str, Any]:
    """A Spark job commits 3 rounds through both replicas; replica 1 is SIGKILLed once the job
    has committed its first version: the LogStore fails over to replica 2."""
    from delta_mirror.dev import spark_writer

    out: dict[str, Any] = {}

    def job() -> None:
        try:
            out["result"] = spark_writer.submit(
                run.cluster.url("spark-master"),
                run.location(SPARK_TABLE),
                run.commit_urls,
                env=run.env,
                rounds=3,
                rows=40,
                timeout=load_scaled(900),
                log=run.cluster.root / "logs" / "chaos-spark-writer.log",
            )
        except Exception as exc:
            out["error"] = str(exc)

    thread = threading.Thread(target=job, daemon=True)
    thread.start()
    wait_until(lambda: _has_spark_table(run) or not thread.is_alive(), load_scaled(600), "version 0", 1.0)
    t0 = time.monotonic()
    run.cluster.kill("commit-service-1", signal.SIGKILL)
    thread.join(load_scaled(900))
    if "error" in out or "result" not in out:
        return {"killed": "commit-service-1", "spark_job": out.get("error", "did not finish"), "ok": False}
    result = _settle(run, t0, 180)
    run.cluster.start("commit-service-1")
    return {"killed": "commit-service-1", "spark_versions": out["result"]["versions"], **result}


def fault_postgres(run: ClusterRun) -> dict[str, Any]:
    return _restart_with_commits_flowing(run, "postgres", resume_s=120, poll_s=0.5, settle_s=240)


FAULTS: dict[str, Callable[[ClusterRun], dict[str, Any]]] = {
    "triggerer": fault_triggerer,
    "celery_worker": fault_celery_worker,
    "redis": fault_redis,
    "commit_service": fault_commit_service,
    "postgres": fault_postgres,
    "spark_worker": fault_spark_worker,
    # not faults: checks on the same cluster after them (cluster_chaos_checks)
    "validate_readers": check_validate_readers,
    "failure_mail": check_failure_mail,
}


def _clean(r: dict[str, Any]) -> bool:
    keys = ("lost", "duplicated", "corrupted")
    return r.get("ok", True) and not any(r.get(k) for k in keys) and not r.get("violations")


def main() -> int:
    parser = argparse.ArgumentParser(description="lose one of each cluster service while commits flow")
    parser.add_argument("--only", nargs="*", choices=sorted(FAULTS), default=None)
    parser.add_argument("--faults", default=None, help="comma-separated, e.g. spark_worker,redis")
    parser.add_argument("--out", default=str(REPO / "bench-results" / "cluster-chaos.json"))
    args = parser.parse_args()
    if args.faults:
        unknown = sorted(set(args.faults.split(",")) - set(FAULTS))
        if unknown:
            parser.error(f"unknown fault(s) {unknown}; choose from {sorted(FAULTS)}")
        args.only = args.faults.split(",")
    base = Path(tempfile.mkdtemp(prefix="dm-cluster-chaos-"))
    base.chmod(0o755)  # PostgreSQL runs as its own user under root
    started = time.monotonic()
    report: dict[str, Any] = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()} {os.cpu_count()} cores, {platform.platform()}",
        "load_at_start": os.getloadavg()[0],
        "faults": {},
    }
    selected = args.only or list(FAULTS)
    mail = "failure_mail" in selected  # the SMTP catcher and the notify settings only when checked
    run = start_cluster(
        base / "cl",
        [*TABLES, SPARK_TABLE, *([MAIL_TABLE] if mail else [])],
        workers=2,
        skip=() if mail else ("mailpit",),
        extra_defaults=MAIL_DEFAULTS if mail else "",
    )
    try:
        report["up_s"] = round(time.monotonic() - started, 1)
        run.create_event_tables(TABLES)
        run.unpause_tables([*TABLES, SPARK_TABLE])
        run.wait_triggers([*TABLES, SPARK_TABLE], 300)
        for name in selected:
            print(f"fault {name} ...", file=sys.stderr, flush=True)
            try:
                result = FAULTS[name](run)
            except AssertionError as exc:  # a deadline passed: the fault did not recover
                result = {"ok": False, "error": str(exc)}
            result["ok"] = _clean(result)
            result["date"] = datetime.now(UTC).isoformat(timespec="seconds")
            report["faults"][name] = result
            print(f"fault {name}: {json.dumps(result)}", file=sys.stderr, flush=True)
    finally:
        run.cluster.down()
        shutil.rmtree(base, ignore_errors=True)
    report["seconds"] = round(time.monotonic() - started, 1)
    report["load_at_end"] = os.getloadavg()[0]
    out = Path(args.out)
    ran = list(report["faults"])
    if args.only and out.exists():  # a selection: keep the figures of the faults not run now
        earlier = json.loads(out.read_text())
        kept = {
            n: {"date": earlier.get("date"), **r}
            for n, r in earlier.get("faults", {}).items()
            if n not in ran
        }
        report["faults"] = {**kept, **report["faults"]}
        report["this_run"] = ran
    report["recovery_s"] = {n: r.get("recovery_s") for n, r in report["faults"].items()}
    report["all_ok"] = all(r["ok"] for r in report["faults"].values())
    return write_report(out, report, report["all_ok"])


if __name__ == "__main__":
    sys.exit(main())
