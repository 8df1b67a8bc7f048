"""The ``spark_worker`` fault of ``make cluster-chaos``: lose the Spark worker during a Spark checkpoint.

A table with many active files (its add actions name files that are never read: the checkpoint
is built from the store's log, so only the log matters) is published to MinIO, then
``delta-mirror checkpoint NAME --engine spark`` runs as a user runs it, its driver on the cluster's
standalone master. Once the engine has started building (its staging folder exists and the
an executor on the worker runs its tasks) the ``spark-worker`` and its executors are SIGKILLed.

While the worker is gone, and after, no partial checkpoint may be visible on MinIO: no
``*.checkpoint*`` object and no ``_last_checkpoint`` until a complete checkpoint is there, and
``_last_checkpoint`` then names a version whose checkpoint object exists with all its parts. The
worker is started again; the run either fails (then it is retried once, as the DAG's retry would)
or Spark reschedules the lost tasks on the new executors; what happened is recorded. Finally
deltalake loads the table from MinIO at the checkpoint's version and sees every active file.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from support.cluster import ROW_SCHEMA, ClusterRun
from support.waiting import load_scaled, wait_until

from delta_mirror.dev.datafiles import create_table_actions

REPO = Path(__file__).resolve().parents[2]
DELTA_MIRROR = REPO / ".venv" / "bin" / "delta-mirror"
CP_TABLE = "chaos_checkpoint"
FILES_PER_COMMIT = 15_000
COMMITS = 6  # versions 0..6: below the default checkpoint interval, so only our run checkpoints


def _fake_adds(start: int, n: int) -> list[tuple[str, dict[str, Any]]]:
    now = int(time.time() * 1000)
    return [
        (
            "add",
            {
                "path": f"part-{i:08d}-chaos.snappy.parquet",
                "partitionValues": {},
                "size": 1000 + i % 997,
                "modificationTime": now,
                "dataChange": True,
                "stats": json.dumps({"numRecords": 1}),
            },
        )
        for i in range(start, start + n)
    ]


def _log_objects(run: ClusterRun) -> dict[str, int]:
    """Every object under the table's ``_delta_log/`` on MinIO: key -> size."""
    prefix = f"tables/{CP_TABLE}/_delta_log/"
    out: dict[str, int] = {}
    for page in run.s3().get_paginator("list_objects_v2").paginate(Bucket=run.bucket, Prefix=prefix):
        for obj in page.get("Contents", []):
            out[obj["Key"][len(prefix) :]] = int(obj["Size"])
    return out


def _checkpoint_state(run: ClusterRun) -> dict[str, Any]:
    """What a reader sees of checkpoints: the checkpoint objects, ``_last_checkpoint`` and whether
    it points at a complete checkpoint (every part of its version present)."""
    objects = _log_objects(run)
    cps = sorted(k for k in objects if ".checkpoint" in k)
    state: dict[str, Any] = {"checkpoint_objects": cps, "last_checkpoint": None, "consistent": not cps}
    if "_last_checkpoint" in objects:
        body = run.s3().get_object(Bucket=run.bucket, Key=f"tables/{CP_TABLE}/_delta_log/_last_checkpoint")
        last = json.loads(body["Body"].read())
        state["last_checkpoint"] = last
        version = int(last["version"])
        mine = [k for k in cps if k.startswith(f"{version:020d}.checkpoint")]
        parts = int(last.get("parts") or 1)
        state["consistent"] = len(mine) >= parts and all(objects[k] > 0 for k in mine)
    return state


def _spark_checkpoint_config(run: ClusterRun) -> Path:
    """A table config putting the fault's table on the Spark checkpoint engine, with nothing else:
    the executors get the PostgreSQL JDBC driver from the driver (``spark.jars``), as a user's would.

    The fault's first run found that they did not (every JDBC task failed with
    ``ClassNotFoundException: org.postgresql.Driver``): ``spark.jars`` set for the LogStore jar
    replaced the resolved packages; ``spark/session.py`` keeps them now."""
    path = run.cluster.root / "checkpoint-tables.yaml"
    path.write_text(f"tables:\n  {CP_TABLE}:\n    checkpoint:\n      engine: spark\n")
    return path


def _checkpoint_cmd(run: ClusterRun, tmp: Path, log: Path, config: Path) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        **run.env,
        "DELTA_MIRROR_SPARK_MASTER": run.cluster.url("spark-master"),
        "TMPDIR": str(tmp),  # the engine's staging folder: watched to know the build has begun
    }
    with log.open("ab") as out:
        return subprocess.Popen(
            [str(DELTA_MIRROR), "checkpoint", CP_TABLE, "--engine", "spark", "--config", str(config)],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def _spark_apps(run: ClusterRun) -> set[Path]:
    return set((run.cluster.root / "data" / "spark-work").glob("app-*"))


def _executor_running_tasks(run: ClusterRun, earlier: set[Path]) -> bool:
    """Whether an executor of an application not in ``earlier`` has started a task (its log in the
    worker's work folder): the job is under way on the worker, not merely granted executors still
    fetching jars."""
    for log in (log for app in _spark_apps(run) - earlier for log in app.glob("*/stderr")):
        try:
            if "Running task" in log.read_text(errors="replace"):
                return True
        except OSError:
            continue
    return False


def fault_spark_worker(run: ClusterRun) -> dict[str, Any]:
    """SIGKILL ``spark-worker`` mid-checkpoint; no partial checkpoint published; the retry succeeds."""
    started = time.monotonic()
    store = run.store()
    try:
        store.commit(CP_TABLE, [*create_table_actions(ROW_SCHEMA)], location=run.location(CP_TABLE))
        for c in range(COMMITS):
            store.commit(CP_TABLE, _fake_adds(c * FILES_PER_COMMIT, FILES_PER_COMMIT))
    finally:
        store.close()
    active = COMMITS * FILES_PER_COMMIT
    made_s = time.monotonic() - started
    env = {**os.environ, **run.env}
    mirror = subprocess.run(
        [str(DELTA_MIRROR), "mirror", CP_TABLE],
        env=env,
        capture_output=True,
        text=True,
        timeout=load_scaled(600),
    )
    assert mirror.returncode == 0, f"delta-mirror mirror failed: {mirror.stderr[-800:]}"
    before = _checkpoint_state(run)
    assert not before["checkpoint_objects"], f"a checkpoint before the Spark run: {before}"

    tmp = Path(tempfile.mkdtemp(prefix="dm-cp-chaos-", dir=run.cluster.root))
    log = run.cluster.root / "logs" / "chaos-spark-checkpoint.log"
    config = _spark_checkpoint_config(run)
    earlier_apps = _spark_apps(run)
    t_run = time.monotonic()
    first = _checkpoint_cmd(run, tmp, log, config)

    def building() -> bool:
        assert first.poll() is None, (
            f"the checkpoint run ended before the fault (exit {first.returncode}): see {log}"
        )
        return any(tmp.glob("dm-spark-cp-*")) and _executor_running_tasks(run, earlier_apps)

    wait_until(building, load_scaled(600), "an executor running the Spark checkpoint's tasks", 0.2)
    to_kill_s = time.monotonic() - t_run
    t0 = time.monotonic()
    run.cluster.kill("spark-worker", signal.SIGKILL)

    # The worker is gone: watch what a reader sees, and whether the run fails or waits for executors.
    seen: list[dict[str, Any]] = []
    down_deadline = t0 + load_scaled(45)
    while time.monotonic() < down_deadline and first.poll() is None:
        seen.append(_checkpoint_state(run))
        time.sleep(2.0)
    seen.append(_checkpoint_state(run))
    first_exit_while_down = first.poll()
    partial_while_down = [s for s in seen if s["checkpoint_objects"] or s["last_checkpoint"]]

    run.cluster.start("spark-worker")
    restarted_s = time.monotonic() - t0
    try:
        first_exit = first.wait(timeout=load_scaled(900))
    except subprocess.TimeoutExpired:
        first.kill()
        first.wait()
        first_exit = None
    after_first = _checkpoint_state(run)
    retried = False
    retry_exit = None
    if first_exit != 0:
        assert not after_first["checkpoint_objects"] and not after_first["last_checkpoint"], (
            f"a failed run left checkpoint objects: {after_first}"
        )
        retried = True
        retry = _checkpoint_cmd(run, tmp, log, config)
        retry_exit = retry.wait(timeout=load_scaled(900))
    final = _checkpoint_state(run)
    recovery_s = time.monotonic() - t0

    from deltalake import DeltaTable

    last = final["last_checkpoint"] or {}
    version = last.get("version")
    read: dict[str, Any] = {}
    if version is not None:
        table = DeltaTable(
            run.location(CP_TABLE), version=int(version), storage_options=run.storage_options()
        )
        read = {"version": int(table.version()), "files": len(table.file_uris())}
    ok = (
        not partial_while_down
        and final["consistent"]
        and version is not None
        and read.get("files") == active
        and (first_exit == 0 or retry_exit == 0)
    )
    if not ok:  # the cluster's folder is removed at the end of the run: keep the job's log
        shutil.copy(log, Path(tempfile.gettempdir()) / "dm-cluster-chaos-spark-checkpoint.log")
    return {
        "killed": "spark-worker",
        "active_files": active,
        "table_made_s": round(made_s, 1),
        "run_to_kill_s": round(to_kill_s, 1),
        "first_run_exit_while_worker_down": first_exit_while_down,
        "first_run_exit": first_exit,
        "retried": retried,
        "retry_exit": retry_exit,
        "worker_restarted_s": round(restarted_s, 1),
        "partial_checkpoint_seen": partial_while_down[:3],
        "checks_while_down": len(seen),
        "last_checkpoint": last,
        "checkpoint_objects": final["checkpoint_objects"],
        "deltalake_read": read,
        "recovery_s": round(recovery_s, 1),
        "ok": ok,
    }
