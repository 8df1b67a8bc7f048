"""End to end with a real Airflow 3.3 (``airflow standalone``: scheduler, dag-processor, triggerer,
api-server, LocalExecutor) running the project's DAG file against a SQLite store:

1. a table DAG that overruns its ``deadline`` sends a "deadline missed" email (DeadlineAlert →
   AsyncCallback in the triggerer → SmtpNotifier) to a real SMTP server;
2. an event-driven table (AssetWatcher + StoreCommitTrigger) publishes a new commit on its own, in
   one ``sync`` task that also records the lag sample and the validation on its cadence;
3. the backfill DAG runs from the REST API and from ``airflow dags trigger``; bad input is refused;
4. a fleet of 50 event-driven tables, all published, shares one watcher: a commit to one of them
   starts exactly one run of that table's DAG and none of the 49 others;
5. a ``publish_in: triggerer`` table is published by its watcher in the triggerer: its commits
   become readable with no DAG run at all;
6. asset events: a table's commits, published by its ``sync`` task or in the triggerer, start the
   example consumer DAG (scheduled on the tables' assets) and a user's consumer DAG in a file of
   its own, whose runs read the published version ranges from their triggering events.

The dags folder holds the repository's DAG file (a link) and that user's file.

One Airflow instance serves the whole module; it is stopped (process group and stragglers) at the end.
"""

from __future__ import annotations

import itertools
import json
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from airflow_e2e_stack import REPO, AirflowStack, SmtpServer, body_text, metadata_url, save_artifacts
from support.builders import metadata_body, protocol_body
from support.waiting import load_scaled, wait_until

from delta_mirror.delta.actions import Action
from delta_mirror.delta.log_path import LOG_DIR, checkpoint_name, commit_name
from delta_mirror.dev.datafiles import delta_schema_string, write_data_file
from delta_mirror.jobs.publisher import Publisher
from delta_mirror.jobs.validate import validate_table
from delta_mirror.store.sql_store import SqlStore

pytestmark = [pytest.mark.airflow_e2e, pytest.mark.timeout(420)]

LATE, EVENTS, BACKFILL, IN_TRIGGERER = "late", "events", "bf", "trig"
CONSUMED, CONSUMED_TRIG = "consumed", "consumed_trig"  # followed by the example consumer only
CONSUMER_DAG = "delta_mirror_example_table_consumer"
# a downstream DAG in a file of its own, as a user writes it (docs/assets.md)
USER_CONSUMER_DAG = "user_consumer"
USER_CONSUMER_FILE = f"""\
from datetime import datetime

from airflow.sdk import DAG, task

from delta_mirror.airflow.assets import published_range, table_asset

with DAG(
    dag_id="{USER_CONSUMER_DAG}",
    schedule=[table_asset("{CONSUMED_TRIG}")],
    start_date=datetime(2026, 1, 1),
    catchup=False,
):

    @task
    def read_published_versions(triggering_asset_events=None):
        versions = published_range(triggering_asset_events, "{CONSUMED_TRIG}")
        return {{"{CONSUMED_TRIG}": versions.to_json()}} if versions else {{}}

    read_published_versions()
"""
FLEET = [f"fleet{i:02d}" for i in range(50)]
BACKFILL_DAG = "delta_mirror_backfill"
SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string())])
CONFIG = f"""\
defaults:
  schedule: null
  retries: 0
  deadline: null
  notify:
    email: [oncall@example.com]
    smtp_conn_id: smtp_default
    from_email: delta-mirror@example.com
  maintenance:
    schedule: null
reconcile:
  schedule: null
monitor:
  schedule: null
tables:
  {LATE}:
    deadline: 2s
  {EVENTS}:
    schedule: event
    poll_interval: 1s
    publish_in: task
  {BACKFILL}: {{}}
  {IN_TRIGGERER}:
    schedule: event
    poll_interval: 1s
    publish_in: triggerer
  {CONSUMED}: {{schedule: event, poll_interval: 1s, publish_in: task, validate: false}}
  {CONSUMED_TRIG}: {{schedule: event, poll_interval: 1s, publish_in: triggerer, validate: false}}
""" + "".join(f"  {t}: {{schedule: event, poll_interval: 1s, publish_in: task}}\n" for t in FLEET)
DAG_IDS = {
    f"delta_mirror__{t}" for t in (LATE, EVENTS, BACKFILL, IN_TRIGGERER, CONSUMED, CONSUMED_TRIG, *FLEET)
} | {
    BACKFILL_DAG,
    CONSUMER_DAG,
    USER_CONSUMER_DAG,
    "delta_mirror_reconcile",
    "delta_mirror_monitor",
    "delta_mirror_maintenance",
}


class Env:
    """What the tests share: the running stack, the SMTP server, the store and the table folders."""

    def __init__(self, stack: AirflowStack, smtp: SmtpServer, store_url: str, tables: Path) -> None:
        self.stack = stack
        self.smtp = smtp
        self.store_url = store_url
        self.tables = tables
        self.figures: dict[str, float] = {}

    def store(self) -> SqlStore:
        return SqlStore(self.store_url)

    def commit(self, table: str, n_rows: int = 2, create: bool = False) -> int:
        root = self.tables / table
        root.mkdir(exist_ok=True)
        data = pa.table(
            {"id": list(range(n_rows)), "name": [f"row-{uuid.uuid4().hex[:6]}" for _ in range(n_rows)]},
            schema=SCHEMA,
        )
        actions: list[Action] = []
        if create:
            actions += [
                ("protocol", protocol_body()),
                (
                    "metaData",
                    metadata_body(
                        id=str(uuid.uuid4()),
                        schema_string=delta_schema_string(SCHEMA),
                        created_time=int(time.time() * 1000),
                    ),
                ),
            ]
        actions.append(("add", write_data_file(root, data)))
        store = self.store()
        try:
            return store.commit(table, actions, location=root.as_uri() if create else None)
        finally:
            store.close()

    def log_file(self, table: str, version: int) -> Path:
        return self.tables / table / LOG_DIR / commit_name(version)

    def validate(self, table: str, **kwargs: Any) -> None:
        store = self.store()
        try:
            report = validate_table(store, table, **kwargs)
        finally:
            store.close()
        assert report.ok, [f"[{p.kind}] v{p.version}: {p.message}" for p in report.problems]


@pytest.fixture(scope="module")
def airflow(request: pytest.FixtureRequest, smtp: SmtpServer, e2e_dir: Path) -> Iterator[Env]:
    config = e2e_dir / "delta_mirror.yaml"
    config.write_text(CONFIG)
    store_url = f"sqlite:///{e2e_dir / 'store.db'}"
    store = SqlStore(store_url)
    store.init()
    store.close()
    tables = e2e_dir / "tables"
    tables.mkdir()
    dags = e2e_dir / "dags"  # the repository's DAG file and a user's consumer DAG file beside it
    dags.mkdir()
    for path in (REPO / "dags").glob("*.py"):
        (dags / path.name).symlink_to(path)
    (dags / "user_consumer.py").write_text(USER_CONSUMER_FILE)
    stack = AirflowStack(
        e2e_dir / "airflow-home",
        {
            "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
            "DELTA_MIRROR_CONFIG": str(config),
            "DELTA_MIRROR_STORE": store_url,
            "AIRFLOW_CONN_SMTP_DEFAULT": smtp.connection_json(),
        },
        metadata_url=metadata_url(request),
    )
    env = Env(stack, smtp, store_url, tables)
    # committed before Airflow starts: the event-driven table has a pending version (its watcher
    # fires at once), the backfill table has versions 0..2, nothing is published.
    env.commit(LATE, create=True)
    env.commit(EVENTS, create=True)
    env.commit(BACKFILL, create=True)
    env.commit(BACKFILL)
    env.commit(BACKFILL)
    env.commit(IN_TRIGGERER, create=True)  # pending at start: the triggerer publishes it, no run
    store = env.store()
    try:  # the fleet starts with nothing pending: its watchers must fire nothing until a commit
        for name in FLEET:
            env.commit(name, create=True)
            Publisher(store).publish(name)
    finally:
        store.close()
    started = time.monotonic()
    stack.start()
    try:
        try:
            env.figures["startup_s"] = stack.wait_ready(DAG_IDS)
        except BaseException:
            print(f"\nAirflow logs saved to {save_artifacts(stack, 'startup')}")
            raise
        yield env
    finally:
        if os.environ.get("DELTA_MIRROR_E2E_KEEP_LOGS"):
            print(f"\nAirflow logs saved to {save_artifacts(stack, 'module')}")
        t_stop = time.monotonic()
        killed = stack.stop()
        leftovers = stack.leftover_pids()
        env.figures["stop_s"] = time.monotonic() - t_stop
        env.figures["module_s"] = time.monotonic() - started
        print(f"\nairflow e2e figures: {json.dumps({k: round(v, 2) for k, v in env.figures.items()})}")
        if killed:
            print(f"processes that ignored SIGTERM and were killed: {killed}")
        assert not leftovers, f"Airflow processes left behind: {leftovers}"


def _run_id(prefix: str) -> str:
    return f"{prefix}__{uuid.uuid4().hex[:8]}"


# --------------------------------------------------------------------------------------------------
# 1. deadline miss → email


def test_deadline_miss_sends_email(airflow: Env) -> None:
    stack, dag_id = airflow.stack, f"delta_mirror__{LATE}"
    run_id = _run_id("deadline")
    t0 = time.monotonic()
    r = stack.trigger(dag_id, run_id=run_id)
    assert r.status_code == 200, r.text

    def is_deadline_mail(m: Any) -> bool:
        subject = str(m["subject"])
        return f"{LATE}:" in subject and "deadline missed" in subject.lower()

    msg = airflow.smtp.mailbox.wait_for(is_deadline_mail, timeout=load_scaled(90))
    assert msg is not None, f"no deadline email; got {airflow.smtp.mailbox.subjects()}"
    airflow.figures["deadline_email_s"] = time.monotonic() - t0
    assert dag_id in str(msg["subject"]), msg["subject"]  # "[delta-mirror] late: deadline missed (<dag>)"
    assert "oncall@example.com" in str(msg["to"])
    body = body_text(msg)
    assert run_id in body, body  # the callback read dag_run.dag_run_id from the REST-shaped context
    assert "0:00:02" in body, body  # the configured deadline

    # the slow run itself still completes and publishes
    run = stack.wait_run(dag_id, run_id)
    assert run["state"] == "success", stack.task_instances(dag_id, run_id)
    assert airflow.log_file(LATE, 0).exists()
    airflow.figures["deadline_run_s"] = time.monotonic() - t0


# --------------------------------------------------------------------------------------------------
# 2. event-driven publishing


def _wait(predicate: Any, timeout: float, what: str, interval: float = 0.1) -> float:
    """``timeout`` is for an idle machine: the wait stretches with the load (support.waiting)."""
    return wait_until(predicate, timeout, what, interval)


def _idle(stack: AirflowStack, dag_id: str) -> bool:
    runs = stack.dag_runs(dag_id)
    return bool(runs) and all(r["state"] in ("success", "failed") for r in runs)


def test_event_driven_publish(airflow: Env) -> None:
    stack, dag_id = airflow.stack, f"delta_mirror__{EVENTS}"
    quiet = 3.0  # three poll intervals: long enough for a duplicate event to show up as a run
    # version 0 was pending when Airflow started: the watcher fired and a run published it
    _wait(lambda: airflow.log_file(EVENTS, 0).exists(), 90, "version 0 of the event-driven table")
    _wait(lambda: _idle(stack, dag_id), 90, "the first event-driven run to finish", 0.5)
    time.sleep(quiet)
    runs = stack.dag_runs(dag_id)
    assert [(r["run_type"], r["state"]) for r in runs] == [("asset_triggered", "success")], runs

    t0 = time.monotonic()
    version = airflow.commit(EVENTS)
    assert version == 1
    latency = _wait(lambda: airflow.log_file(EVENTS, version).exists(), 60, "version 1.json", 0.05)
    airflow.figures["event_publish_latency_s"] = latency

    def new_run_done() -> bool:
        runs = stack.dag_runs(dag_id)
        return len(runs) == 2 and all(r["state"] in ("success", "failed") for r in runs)

    _wait(new_run_done, 60, "the event-driven run of version 1", 0.2)
    airflow.figures["event_run_done_s"] = time.monotonic() - t0
    time.sleep(quiet)
    runs = stack.dag_runs(dag_id)
    # one run per commit: no duplicate runs from a watcher that fires twice for the same version
    assert [(r["run_type"], r["state"]) for r in runs] == [("asset_triggered", "success")] * 2, runs
    # an event-driven table runs one `sync` task (tasks: single): publish, checkpoint when due,
    # validation on its cadence (the first one validated version 0; 10 min later it is due again), lag
    sync = stack.api(
        "GET",
        f"/api/v2/dags/{dag_id}/dagRuns/{runs[1]['dag_run_id']}/taskInstances/sync/xcomEntries/return_value",
    )
    assert sync.status_code == 200, sync.text
    value = sync.json()["value"]
    value = json.loads(value) if isinstance(value, str) else value
    assert (value["published"], value["first"]) == (1, 1), value
    assert value["validation"]["state"] == "not due" and value["lag"]["versions_behind"] == 0, value
    store = airflow.store()
    try:
        info = store.get_table(EVENTS)
        assert info.settings["last_validation"]["to_version"] == 0  # by the first run, OK
        assert info.settings["last_validation"]["ok"] is True
        assert len(store.lag_samples(info.id)) == 2  # one per run
    finally:
        store.close()
    airflow.validate(EVENTS)
    log = sorted(p.name for p in (airflow.tables / EVENTS / LOG_DIR).iterdir())
    assert log[:2] == [commit_name(0), commit_name(1)], log


def test_a_commit_to_one_of_50_event_tables_starts_one_run_of_that_table_only(airflow: Env) -> None:
    stack = airflow.stack
    quiet = 3.0  # three poll intervals of the fleet's watcher
    target = FLEET[17]
    assert all(not stack.dag_runs(f"delta_mirror__{t}") for t in FLEET)  # all published: no event
    t0 = time.monotonic()
    assert airflow.commit(target) == 1
    _wait(lambda: airflow.log_file(target, 1).exists(), 60, f"version 1 of {target}", 0.05)
    airflow.figures["fleet_publish_latency_s"] = time.monotonic() - t0
    _wait(lambda: _idle(stack, f"delta_mirror__{target}"), 60, f"the run of {target}", 0.2)
    time.sleep(quiet)
    runs = {t: [(r["run_type"], r["state"]) for r in stack.dag_runs(f"delta_mirror__{t}")] for t in FLEET}
    assert runs.pop(target) == [("asset_triggered", "success")]
    assert {t: r for t, r in runs.items() if r} == {}  # none of the 49 others ran


def test_a_triggerer_publishing_table_is_readable_after_a_commit_with_no_dag_run(airflow: Env) -> None:
    from deltalake import DeltaTable

    stack, dag_id = airflow.stack, f"delta_mirror__{IN_TRIGGERER}"
    _wait(lambda: airflow.log_file(IN_TRIGGERER, 0).exists(), 90, f"version 0 of {IN_TRIGGERER}")
    t0 = time.monotonic()
    assert airflow.commit(IN_TRIGGERER) == 1
    _wait(lambda: airflow.log_file(IN_TRIGGERER, 1).exists(), 60, f"version 1 of {IN_TRIGGERER}", 0.05)
    airflow.figures["triggerer_publish_latency_s"] = time.monotonic() - t0
    table = DeltaTable(str(airflow.tables / IN_TRIGGERER))
    assert table.version() == 1 and table.to_pyarrow_table().num_rows == 4  # a reader reads both
    time.sleep(3.0)  # three poll intervals: an event would have started a run by now
    assert stack.dag_runs(dag_id) == []  # no checkpoint due (interval 10), nothing failed: no run
    airflow.validate(IN_TRIGGERER)


# --------------------------------------------------------------------------------------------------
# 3. backfill: REST API, CLI, bad input


def test_backfill_via_rest_api(airflow: Env) -> None:
    stack = airflow.stack
    conf = {"table": BACKFILL, "from_version": 0, "to_version": 2, "steps": ["publish", "validate"]}
    run_id = _run_id("rest")
    t0 = time.monotonic()
    r = stack.trigger(BACKFILL_DAG, conf, run_id=run_id)
    assert r.status_code == 200, r.text
    assert r.json()["conf"] == conf
    run = stack.wait_run(BACKFILL_DAG, run_id)
    airflow.figures["backfill_rest_s"] = time.monotonic() - t0
    states = stack.task_instances(BACKFILL_DAG, run_id)
    assert run["state"] == "success", states
    assert states == {
        "check_params": "success",
        "publish": "success",
        "checkpoint": "skipped",
        "validate": "success",
    }
    for v in range(3):
        assert airflow.log_file(BACKFILL, v).exists()
    assert "validated bf versions 0..2: OK" in stack.task_log(BACKFILL_DAG, run_id, "validate")
    airflow.validate(BACKFILL, from_version=0, to_version=2)


def test_backfill_via_cli(airflow: Env) -> None:
    stack = airflow.stack
    assert airflow.commit(BACKFILL) == 3
    conf = {
        "table": BACKFILL,
        "from_version": 1,
        "to_version": 3,
        "steps": ["publish", "checkpoint", "validate"],
    }
    run_id = _run_id("cli")
    t0 = time.monotonic()
    proc = stack.cli("dags", "trigger", BACKFILL_DAG, "-c", json.dumps(conf), "-r", run_id, "-o", "json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    airflow.figures["cli_trigger_s"] = time.monotonic() - t0
    run = stack.wait_run(BACKFILL_DAG, run_id)
    airflow.figures["backfill_cli_s"] = time.monotonic() - t0
    states = stack.task_instances(BACKFILL_DAG, run_id)
    assert run["state"] == "success", states
    assert run["conf"] == conf
    assert set(states.values()) == {"success"}, states
    assert airflow.log_file(BACKFILL, 3).exists()
    assert (airflow.tables / BACKFILL / LOG_DIR / checkpoint_name(3)).exists()
    airflow.validate(BACKFILL)


def test_backfill_rejects_bad_input(airflow: Env) -> None:
    stack = airflow.stack
    good = {"table": BACKFILL, "from_version": 0, "to_version": 2, "steps": ["validate"]}
    # what the Param JSON schema can say is refused by the API before a run exists
    for bad in ({"table": "nope"}, {"from_version": -1}, {"steps": ["publish", "frobnicate"]}):
        r = stack.trigger(BACKFILL_DAG, {**good, **bad})
        assert r.status_code == 400, (bad, r.status_code, r.text)
    r = stack.trigger(BACKFILL_DAG, {**good, "table": "nope"})
    assert "nope" in r.text, r.text

    # from > to passes the schema; the check_params task fails the run with one clear message
    run_id = _run_id("bad-range")
    r = stack.trigger(BACKFILL_DAG, {**good, "from_version": 2, "to_version": 0}, run_id=run_id)
    assert r.status_code == 200, r.text
    run = stack.wait_run(BACKFILL_DAG, run_id)
    states = stack.task_instances(BACKFILL_DAG, run_id)
    assert run["state"] == "failed", states
    assert states["check_params"] == "failed", states
    assert states["publish"] == "upstream_failed", states
    log = stack.task_log(BACKFILL_DAG, run_id, "check_params")
    assert "from_version 2 is after to_version 0" in log, log[-3000:]
    # the failure callback of the backfill DAG emails the contacts too
    msg = airflow.smtp.mailbox.wait_for(
        lambda m: "task check_params failed" in str(m["subject"]), timeout=load_scaled(30)
    )
    assert msg is not None, airflow.smtp.mailbox.subjects()


# --------------------------------------------------------------------------------------------------
# 6. asset events → the example consumer DAG


def consumed_ranges(stack: AirflowStack, table: str, dag_id: str = CONSUMER_DAG) -> list[dict[str, Any]]:
    """What the consumer's successful runs read for ``table`` (its XCom), in run order."""
    out = []
    for run in stack.dag_runs(dag_id):
        if run["state"] != "success":
            continue
        r = stack.api(
            "GET",
            f"/api/v2/dags/{dag_id}/dagRuns/{run['dag_run_id']}/taskInstances/"
            "read_published_versions/xcomEntries/return_value",
        )
        if r.status_code != 200:
            continue
        value = r.json()["value"]
        value = json.loads(value) if isinstance(value, str) else value
        if table in value:
            out.append({**value[table], "run_type": run["run_type"]})
    return out


def reported_through(stack: AirflowStack, table: str, version: int, dag_id: str = CONSUMER_DAG) -> bool:
    ranges = consumed_ranges(stack, table, dag_id)
    return bool(ranges) and ranges[-1]["last_version"] >= version


def assert_each_version_reported_once_in_order(ranges: list[dict[str, Any]], first: int, last: int) -> None:
    """The consumer's runs cover ``first..last``: contiguous ranges, none twice (events coalesce:
    one run may cover several publishes)."""
    assert ranges, "no consumer run"
    assert all(r["run_type"] == "asset_triggered" for r in ranges), ranges
    assert ranges[0]["first_version"] <= first, ranges
    for before, after in itertools.pairwise(ranges):
        assert after["first_version"] == before["last_version"] + 1, ranges
    assert ranges[-1]["last_version"] == last, ranges


def test_a_commit_published_by_its_sync_task_runs_the_consumer_with_its_versions(airflow: Env) -> None:
    stack = airflow.stack
    # created now, not before Airflow starts: its runs would add to the busy start-up (one SQLite
    # metadata DB, two cores); its watcher fires for the new table, its sync publishes version 0
    assert airflow.commit(CONSUMED, create=True) == 0
    _wait(lambda: reported_through(stack, CONSUMED, 0), 120, f"the consumer run for {CONSUMED} v0", 0.5)
    t0 = time.monotonic()
    assert airflow.commit(CONSUMED) == 1
    assert airflow.commit(CONSUMED) == 2  # back to back: one publish of 1..2 or two, coalesced or not
    _wait(lambda: reported_through(stack, CONSUMED, 2), 120, f"the consumer run for {CONSUMED} v2", 0.5)
    airflow.figures["consumer_after_commit_s"] = time.monotonic() - t0
    ranges = consumed_ranges(stack, CONSUMED)
    assert_each_version_reported_once_in_order(ranges, 0, 2)
    assert ranges[0]["first_version"] == 0
    assert ranges[-1]["rows"] == 6  # the consumer read the table at version 2: three commits of 2 rows
    assert all(r["checkpoint_version"] is None for r in ranges)  # interval 10: none written
    # the sync runs' events carried those versions (Airflow's own record of them)
    r = stack.api("GET", "/api/v2/assets/events", params={"limit": 100, "order_by": "timestamp"})
    r.raise_for_status()
    extras = [e["extra"] for e in r.json()["asset_events"] if (e.get("extra") or {}).get("table") == CONSUMED]
    assert sorted(v for e in extras for v in range(e["first_version"], e["last_version"] + 1)) == [0, 1, 2]
    assert {e["source_task_id"] for e in r.json()["asset_events"] if e["extra"] in extras} == {"sync"}


def _watcher_started(stack: AirflowStack, table: str) -> bool:
    """Whether the triggerer started the watcher of ``table``'s asset (its trigger id from the
    REST API, its start line from the triggerer's log)."""
    r = stack.api("GET", "/api/v2/assets", params={"name_pattern": table, "limit": 100})
    r.raise_for_status()
    ids = [w["trigger_id"] for a in r.json()["assets"] if a["name"] == table for w in a.get("watchers", [])]
    text = stack.log_path.read_text(errors="replace")
    return any(f"trigger ID {i} starting" in text for i in ids)


def test_a_commit_published_in_the_triggerer_runs_the_consumer_with_its_versions(airflow: Env) -> None:
    stack, dag_id = airflow.stack, f"delta_mirror__{CONSUMED_TRIG}"
    assert airflow.commit(CONSUMED_TRIG, create=True) == 0  # created now: see the test above
    _wait(lambda: airflow.log_file(CONSUMED_TRIG, 0).exists(), 90, f"version 0 of {CONSUMED_TRIG}")
    # the asset's watcher reports publishes from when it runs (its first report sets its watermark)
    _wait(lambda: _watcher_started(stack, CONSUMED_TRIG), 90, f"the watcher of {CONSUMED_TRIG}'s asset", 0.5)
    time.sleep(load_scaled(2.0))  # two poll intervals (more under load): its first report
    t0 = time.monotonic()
    assert airflow.commit(CONSUMED_TRIG) == 1
    _wait(
        lambda: reported_through(stack, CONSUMED_TRIG, 1), 120, f"the consumer run for {CONSUMED_TRIG}", 0.5
    )
    airflow.figures["consumer_after_triggerer_commit_s"] = time.monotonic() - t0
    ranges = consumed_ranges(stack, CONSUMED_TRIG)
    # version 0 is reported too when the watcher ran before the triggerer published it
    assert_each_version_reported_once_in_order(ranges, 1, 1)
    assert ranges[-1]["rows"] == 4
    assert stack.dag_runs(dag_id) == []  # published in the triggerer: still no run of the table's DAG
    # the user's consumer, in its own file, scheduled on table_asset(): the same events (its file's
    # copy of the asset carries the same watcher, so the DAG processor's parses of the two files,
    # every 30 s since the start, kept it)
    _wait(
        lambda: reported_through(stack, CONSUMED_TRIG, 1, USER_CONSUMER_DAG),
        120,
        f"the user consumer's run for {CONSUMED_TRIG}",
        0.5,
    )
    user = consumed_ranges(stack, CONSUMED_TRIG, USER_CONSUMER_DAG)
    assert_each_version_reported_once_in_order(user, 1, 1)
    assert "rows" not in user[-1]
    r = stack.api("GET", "/api/v2/assets/events", params={"limit": 100, "order_by": "timestamp"})
    r.raise_for_status()
    mine = [
        e
        for e in r.json()["asset_events"]
        if (e.get("extra") or {}).get("payload", {}).get("table") == CONSUMED_TRIG
    ]
    assert mine and all(e["extra"]["from_trigger"] is True for e in mine), mine
    assert mine[-1]["extra"]["payload"] == {
        "table": CONSUMED_TRIG,
        "first_version": 1,
        "last_version": 1,
        "checkpoint_version": None,
    }
