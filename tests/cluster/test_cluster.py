"""A reduced `make cluster` on this machine, driven as a team would use it (issue 27, "Done when").

One cluster for the module, started by the process launcher (``delta_mirror.dev.cluster``) on a
free port base: PostgreSQL, Redis, MinIO, a Spark standalone master + worker, Airflow with
CeleryExecutor (api-server, scheduler, dag-processor, **2 triggerers**, **1 Celery worker**) and
**2 commit-service replicas**. Then, in order:

1. a PySpark job ``spark-submit``-ted to the standalone master (executors on the worker) appends,
   MERGEs and DELETEs into a table on MinIO through the LogStore, given both replicas' URLs;
2. event tables (``publish_in`` left to its default: the triggerer) are published by the
   triggerers as commits arrive;
3. the triggerer that holds the triggers is SIGKILLed while commits keep coming: its triggers move
   to the other one (Airflow's heartbeat threshold, 30 s in docker/stack.env) and publishing
   resumes.

After each: every committed version is on MinIO exactly once with the store's bytes
(``chaos_invariants.check_table``, boto3 against MinIO), deltalake reads the table, and the lag is
back under the table's SLO. Every wait has a load-scaled deadline; the cluster is stopped by PID
even when a test fails. Missing binaries (Java, redis-server, MinIO, PostgreSQL, the LogStore jar)
skip the module, or fail it under ``CI=true``.
"""

from __future__ import annotations

import inspect
import re
import shlex
import shutil
import signal
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.cluster import ClusterRun, CommitFlow, start_cluster, table_config
from support.services import skip_or_fail
from support.waiting import load_scaled, wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(1800)]

EVENT_TABLES = [f"ev_{i}" for i in range(4)]
SPARK_TABLE = "sales"  # the commit service names a new table after the root's last segment
LAG_SLO_S = 60.0  # table_config(lag_slo="60s")
# docker/stack.env: a triggerer silent for 30 s loses its triggers; then the next assignment loop
HEARTBEAT_THRESHOLD_S = 30.0
#: docs/cluster.md, "A walk-through": the same steps as commands; its blocks are read here
CLUSTER_PAGE = Path(__file__).resolve().parents[2] / "docs" / "cluster.md"


def page_block(name: str) -> str:
    """The cluster page's block marked ``<!-- docs-test: name -->``."""
    text = CLUSTER_PAGE.read_text(encoding="utf-8")
    m = re.search(rf"<!-- docs-test: {re.escape(name)} -->\n```[^\n]*\n(.*?)\n```", text, re.S)
    assert m, f"{CLUSTER_PAGE.name} has no block marked docs-test: {name}"
    return m.group(1)


def page_command(prefix: str) -> list[str]:
    """The words of the walk-through's one command line starting with ``prefix``."""
    lines = [line for line in page_block("cluster").splitlines() if line.startswith(prefix)]
    assert len(lines) == 1, f"one '{prefix}' line in the cluster page's walk-through"
    return shlex.split(lines[0])


def page_options(words: list[str]) -> dict[str, str]:
    return {w: words[i + 1] for i, w in enumerate(words) if w.startswith("--") and i + 1 < len(words)}


#: the page's Spark job options (``--rounds``, ``--rows``): the job the first test submits
SPARK_JOB = page_options(page_command("python -m delta_mirror.dev.spark_writer submit"))


@pytest.fixture(scope="module")
def run() -> Iterator[ClusterRun]:
    from delta_mirror.spark.session import LogStoreJarMissing, logstore_jar

    try:
        logstore_jar()
    except LogStoreJarMissing as exc:
        skip_or_fail(f"the Spark job needs the LogStore jar: {exc} ({exc.hint})")
    # not under pytest's tmp_path (mode 700 under /tmp/pytest-of-root): PostgreSQL runs as its own
    # user when the tests run as root and must reach its data folder
    base = Path(tempfile.mkdtemp(prefix="dm-cluster-"))
    base.chmod(0o755)
    root = base / "cl"
    started = time.monotonic()
    try:
        cluster_run = start_cluster(root, [*EVENT_TABLES, SPARK_TABLE])
    except BaseException:  # up() stopped what it started; its folder goes too
        shutil.rmtree(base, ignore_errors=True)
        raise
    cluster_run.figures["up_s"] = round(time.monotonic() - started, 1)
    try:
        cluster_run.create_event_tables(EVENT_TABLES)
        cluster_run.unpause_tables([*EVENT_TABLES, SPARK_TABLE])
        yield cluster_run
    finally:
        left = cluster_run.cluster.down()
        assert not cluster_run.cluster.running(), f"still running after down: {cluster_run.cluster.running()}"
        print(f"\ncluster figures: {cluster_run.figures}; stopped {len(left)} processes")
        shutil.rmtree(base, ignore_errors=True)


def test_the_cluster_page_shows_the_config_options_and_job_this_module_runs() -> None:
    """docs/cluster.md's walk-through is this module's run (no cluster needed to check it)."""
    from delta_mirror.dev.cluster.__main__ import parser

    tables = [*EVENT_TABLES, SPARK_TABLE]
    assert page_block("cluster-config") == table_config(tables).rstrip("\n")
    make = page_command("make cluster ")
    up = parser().parse_args(["up", *shlex.split(make[2].removeprefix("CLUSTER_ARGS="))])
    defaults = {k: p.default for k, p in inspect.signature(start_cluster).parameters.items()}
    assert up.table_config == Path("cluster-tables.yaml")
    assert (up.triggerers, up.workers, up.commit_replicas) == tuple(
        defaults[k] for k in ("triggerers", "workers", "commit_replicas")
    )
    assert tuple(up.skip) == defaults["skip"]
    loop = page_command("for t in ")
    assert " ".join(loop[3 : 3 + len(tables)]) == " ".join(tables) + ";" and "delta_mirror__$t;" in loop
    assert SPARK_JOB["--master"] == "$SPARK_MASTER"
    assert SPARK_JOB["--commit-url"] == "$DELTA_MIRROR_COMMIT_URL"  # ClusterRun.commit_urls
    # ClusterRun.location(name) on the bucket of DELTA_MIRROR_BUCKET
    assert SPARK_JOB["--table"] == f"s3://$DELTA_MIRROR_BUCKET/tables/{SPARK_TABLE}"


def _lag_under_slo(run: ClusterRun, names: list[str]) -> bool:
    return all(row["lag_seconds"] <= LAG_SLO_S for row in run.status(names).values())


def test_a_spark_job_submitted_to_the_master_commits_through_the_replicas_and_is_published(
    run: ClusterRun,
) -> None:
    from delta_mirror.dev import spark_writer

    t0 = time.monotonic()
    result = spark_writer.submit(
        run.cluster.url("spark-master"),
        run.location(SPARK_TABLE),
        run.commit_urls,
        env={**run.env},
        rounds=int(SPARK_JOB["--rounds"]),
        rows=int(SPARK_JOB["--rows"]),
        timeout=load_scaled(600),
        log=run.cluster.root / "logs" / "spark-writer.log",
    )
    run.figures["spark_job_s"] = round(time.monotonic() - t0, 1)
    assert len(run.commit_urls) == 2
    assert result["master"] == run.cluster.url("spark-master") and result["executors"] >= 1
    assert [op["version"] for op in result["operations"]] == [0, 1, 2]
    assert [op["op"] for op in result["operations"]][1:] == ["MERGE", "DELETE"]
    # the master ran it as a cluster application on its worker
    apps = run.spark_master_json()["completedapps"]
    assert any(a["name"] == "delta-mirror-spark-writer" and a["state"] == "FINISHED" for a in apps), apps

    run.wait_published([SPARK_TABLE], 120)
    verdict = run.verdicts([SPARK_TABLE])[SPARK_TABLE]
    assert (verdict.committed, verdict.published) == (3, 3)
    assert run.delta_rows(SPARK_TABLE) == (2, result["rows"])
    wait_until(lambda: _lag_under_slo(run, [SPARK_TABLE]), 60, "the Spark table's lag under its SLO", 1.0)


def test_event_tables_are_published_by_the_triggerers_as_commits_arrive(run: ClusterRun) -> None:
    run.wait_triggers([*EVENT_TABLES, SPARK_TABLE], 300)
    with CommitFlow(run, EVENT_TABLES, rate=2.0) as flow:
        wait_until(lambda: len(flow.commits) >= 8, 60, "8 commits to the event tables", 0.2)
    assert not flow.errors, flow.errors
    t0 = time.monotonic()
    run.wait_published(EVENT_TABLES, 120)
    run.figures["event_drain_s"] = round(time.monotonic() - t0, 1)
    run.figures["triggers"] = run.trigger_holders()
    for name in EVENT_TABLES:
        version, rows = run.delta_rows(name)
        assert rows == version + 1  # one row per version: version 0 and each append
    # no DAG run was needed: the watchers published (a run starts only for a due checkpoint / failure)
    runs = run.airflow_query("SELECT count(*) FROM dag_run WHERE dag_id LIKE 'delta\\_mirror\\_\\_ev\\_%%'")
    assert runs == [(0,)]


def test_a_sigkilled_triggerer_loses_its_triggers_to_the_other_and_nothing_is_lost(run: ClusterRun) -> None:
    names = [*EVENT_TABLES, SPARK_TABLE]
    holders = run.trigger_holders()
    victim = max(set(holders.values()) - {None}, key=lambda h: list(holders.values()).count(h))
    assert victim is not None and victim.startswith("airflow-triggerer-")
    survivor = next(n for n in run.cluster.names() if n.startswith("airflow-triggerer-") and n != victim)
    moved = sorted(t for t, h in holders.items() if h == victim)

    with CommitFlow(run, EVENT_TABLES, rate=2.0) as flow:
        wait_until(lambda: len(flow.commits) >= 4, 60, "commits flowing before the kill", 0.2)
        killed_at = time.monotonic()
        run.cluster.kill(victim, signal.SIGKILL)
        assert not run.cluster.pids(victim)
        # the survivor takes them once the victim's heartbeat is older than the threshold
        run.wait_triggers(moved, HEARTBEAT_THRESHOLD_S + 120, not_on=victim)
        # (from the victim's last heartbeat, which may be seconds older than the kill)
        moved_after = time.monotonic() - killed_at
        assert all(h == survivor for t, h in run.trigger_holders().items() if t in names)
        committed_before_stop = len(flow.commits)
        wait_until(lambda: len(flow.commits) >= committed_before_stop + 4, 60, "commits after the move", 0.2)
    assert not flow.errors, flow.errors
    run.wait_published(names, 180)
    recovered_after = time.monotonic() - killed_at
    run.figures.update(
        {
            "triggerer_killed": victim,
            "triggers_moved_s": round(moved_after, 1),
            "all_published_after_kill_s": round(recovered_after, 1),
            "commits_during_fault": len(flow.commits),
        }
    )
    verdicts = run.verdicts(names)
    assert all(v.recovered for v in verdicts.values()), {n: v.unfinished for n, v in verdicts.items()}
    # each committed version published exactly once: one SUCCESS row per version, no extra file
    _assert_published_once(run, names)
    for name in EVENT_TABLES:
        version, rows = run.delta_rows(name)
        assert rows == version + 1
    wait_until(lambda: _lag_under_slo(run, names), 60, "every table's lag under its SLO", 1.0)


def _assert_published_once(run: ClusterRun, names: list[str]) -> None:
    from chaos_invariants import StoreReader

    reader = StoreReader(run.store_url)
    try:
        for name in names:
            t = reader.table(name)
            unfinished = reader.query(
                "SELECT version, state FROM dl_mirror_status WHERE table_id = :t AND artifact = 'json'"
                " AND state <> 'SUCCESS'",
                t=t.id,
            )
            assert unfinished == [], f"{name}: versions not published: {unfinished}"
            committed = reader.query("SELECT count(*) AS n FROM dl_commits WHERE table_id = :t", t=t.id)[0].n
            done = reader.query(
                "SELECT count(*) AS n, max(attempts) AS most FROM dl_mirror_status"
                " WHERE table_id = :t AND artifact = 'json'",
                t=t.id,
            )[0]
            assert committed == done.n, f"{name}: {committed} committed, {done.n} published"
            run.figures[f"max_publish_attempts_{name}"] = done.most
    finally:
        reader.close()
