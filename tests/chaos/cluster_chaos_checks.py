"""Checks of ``make cluster-chaos`` that are not faults: readers on the cluster, mail to its catcher.

- ``validate_readers``: ``delta-mirror validate NAME --reader spark`` (its SparkSession on the
  cluster's standalone master) and ``--reader kernel-java`` on an event table the chaos run
  committed to, as a user runs them; both must exit 0.
- ``failure_mail``: a table whose location is on a bucket that does not exist cannot be published;
  a run of its DAG fails after its retries and the DAG's failure callback e-mails the table's
  ``notify.email`` through Airflow's ``smtp_default``, the cluster's SMTP catcher: the ``.eml``
  must land in the cluster's mail folder naming the table.
"""

from __future__ import annotations

import contextlib
import email
import json
import os
import subprocess
import time
from email import policy
from pathlib import Path
from typing import Any

from support.cluster import ROW_SCHEMA, ClusterRun
from support.waiting import load_scaled, wait_until

from delta_mirror.dev.datafiles import create_table_actions

REPO = Path(__file__).resolve().parents[2]
DELTA_MIRROR = REPO / ".venv" / "bin" / "delta-mirror"
MAIL_TABLE = "ch_mail"
MAIL_TO = "oncall@example.com"
MAIL_DEFAULTS = f"  notify: {{email: [{MAIL_TO}], from_email: delta-mirror@example.com}}"


def check_validate_readers(run: ClusterRun, table: str = "ch_0", last: int = 5) -> dict[str, Any]:
    """The last ``last`` published versions of ``table`` validated with Spark and kernel-java."""
    run.wait_published([table], load_scaled(300))  # run first, the faults' commits may be pending
    store = run.store()
    try:
        latest = store.last_published_version(store.get_table(table).id)
    finally:
        store.close()
    assert latest is not None, f"{table} has nothing published"
    env = {**os.environ, **run.env, "DELTA_MIRROR_SPARK_MASTER": run.cluster.url("spark-master")}
    out: dict[str, Any] = {"table": table, "from_version": max(0, latest - last + 1), "to_version": latest}
    ok = True
    for reader in ("spark", "kernel-java"):
        t0 = time.monotonic()
        argv = [str(DELTA_MIRROR), "validate", table, "--reader", reader, "--json"]
        argv += ["--from-version", str(out["from_version"]), "--to-version", str(latest)]
        proc = subprocess.run(
            argv, env=env, capture_output=True, text=True, timeout=load_scaled(900), check=False
        )
        entry: dict[str, Any] = {"exit": proc.returncode, "seconds": round(time.monotonic() - t0, 1)}
        try:
            report = json.loads(proc.stdout)
            entry.update(
                versions_checked=report.get("versions_checked"),
                problems=[
                    f"[{p.get('kind')}] v{p.get('version')}: {str(p.get('message'))[:300]}"
                    for p in report.get("problems", [])
                ][:3],
                limitations=[str(x.get("message"))[:300] for x in report.get("limitations", [])][:3],
            )
        except json.JSONDecodeError:
            entry["stderr"] = proc.stderr[-600:]
        ok = ok and proc.returncode == 0
        out[reader] = entry
    return {**out, "ok": ok}


def _mails(folder: Path) -> list[dict[str, str]]:
    found = []
    for path in sorted(folder.glob("*.eml")):
        msg = email.message_from_bytes(path.read_bytes(), policy=policy.default)
        found.append({"file": path.name, "subject": str(msg["subject"]), "to": str(msg["to"])})
    return found


def check_failure_mail(run: ClusterRun) -> dict[str, Any]:
    """A manual run of ``ch_mail``'s DAG fails (no such bucket); its failure e-mail is caught."""
    folder = run.cluster.mail_dir
    assert "mailpit" in run.cluster.running(), "the SMTP catcher is not running (started with it skipped)"
    before = {m["file"] for m in _mails(folder)}
    store = run.store()
    try:
        missing = f"s3://{run.bucket}-does-not-exist/tables/{MAIL_TABLE}"
        store.commit(MAIL_TABLE, [*create_table_actions(ROW_SCHEMA)], location=missing)
    finally:
        store.close()
    dag_id = f"delta_mirror__{MAIL_TABLE}"
    run.unpause_tables([MAIL_TABLE])
    t0 = time.monotonic()
    dag_run = run.api("POST", f"/api/v2/dags/{dag_id}/dagRuns", json={"logical_date": None})
    run_id = dag_run["dag_run_id"]

    def finished() -> bool:
        return run.api("GET", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}")["state"] in ("success", "failed")

    wait_until(finished, load_scaled(900), f"{dag_id} run {run_id} to finish", 2.0)
    state = run.api("GET", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}")["state"]
    run_s = time.monotonic() - t0

    def caught() -> list[dict[str, str]]:
        return [m for m in _mails(folder) if m["file"] not in before and MAIL_TABLE in m["subject"]]

    with contextlib.suppress(AssertionError):  # none came: reported below, not raised
        wait_until(lambda: bool(caught()), load_scaled(120), f"a failure e-mail for {MAIL_TABLE}", 1.0)
    mails = caught()
    return {
        "dag_run_state": state,
        "run_s": round(run_s, 1),
        "mail_s": round(time.monotonic() - t0, 1) if mails else None,
        "mails": mails,
        "all_mails": len(_mails(folder)),
        "ok": state == "failed" and bool(mails) and all(MAIL_TO in m["to"] for m in mails),
    }
