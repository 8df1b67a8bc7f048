"""Metrics through Airflow's StatsD client, received by a real UDP socket.

Airflow is configured the way a user does it (``AIRFLOW__METRICS__STATSD_*`` variables read when
the process starts), so the monitor DAG runs in its own process: ``airflow dags test``.
"""

from __future__ import annotations

import re
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from dm_airflow_kit import airflow_cli, make_table

from delta_mirror.jobs.publisher import Publisher
from delta_mirror.store import SqlStore


class UdpListener:
    """Collects every datagram sent to 127.0.0.1:<port> while it runs."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 * 1024 * 1024)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.lines: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                data = self.sock.recv(65535)
            except TimeoutError:
                continue
            self.lines += data.decode(errors="replace").splitlines()

    def stop(self) -> None:
        time.sleep(0.3)  # the last datagrams are in flight
        self._stop.set()
        self._thread.join()
        self.sock.close()


def statsd_env(listener: UdpListener) -> dict[str, str]:
    """Airflow's StatsD settings as a user sets them, pointed at the listener."""
    return {
        "AIRFLOW__METRICS__STATSD_ON": "True",
        "AIRFLOW__METRICS__STATSD_HOST": "127.0.0.1",
        "AIRFLOW__METRICS__STATSD_PORT": str(listener.port),
        "AIRFLOW__METRICS__STATSD_PREFIX": "airflow",
    }


def dags_test_with_statsd(dag_id: str) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """``airflow dags test DAG_ID`` with StatsD pointed at a listener: the run and every datagram."""
    listener = UdpListener()
    try:
        proc = airflow_cli("dags", "test", dag_id, env=statsd_env(listener))
    finally:
        listener.stop()
    return proc, listener.lines


def stat_values(lines: list[str], name: str, kind: str = "g") -> dict[str, float]:
    """{table: value} for ``<prefix>.delta_mirror.<name>.<table>:<value>|<kind>`` datagrams (g, ms, c)."""
    out = {}
    for line in lines:
        m = re.fullmatch(rf"airflow\.delta_mirror\.{name}\.([\w.-]+):(-?[\d.]+)\|{kind}", line)
        if m:
            out[m[1]] = float(m[2])
    return out


@pytest.mark.usefixtures("airflow_db")
def test_the_monitor_dag_sends_lag_gauges_to_statsd(
    dm_config: Callable[..., Path], sqlite_store: str, tmp_path: Path
) -> None:
    store = SqlStore(sqlite_store)
    for name in ("behind", "current"):
        (tmp_path / name).mkdir()
        make_table(store, name, (tmp_path / name).as_uri(), versions=3)
        # "behind" has waited 3 s longer than "current" will: more than the monitor takes between
        # the two tables' lag readings, even on a busy machine (each is taken at its own "now")
        time.sleep(3.0 if name == "behind" else 0.0)
    Publisher(store).publish("current")
    store.commit("current", [("txn", {"appId": "loader", "version": 1})])  # one version behind, just now
    store.record_table_failure(store.get_table("behind").id, "PERMANENT", "cannot open storage")
    dm_config({"behind": {}, "current": {}})
    time.sleep(1.0)
    proc, lines = dags_test_with_statsd("delta_mirror_monitor")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "new_state=success" in proc.stdout + proc.stderr

    lag = stat_values(lines, "lag_seconds")
    behind = stat_values(lines, "versions_behind")
    assert set(lag) == {"behind", "current"}, [x for x in lines if "delta_mirror" in x]
    assert lag["behind"] >= 1.0 and lag["current"] < lag["behind"]
    assert behind == {"behind": 3.0, "current": 1.0}
    assert stat_values(lines, "halted") == {"behind": 0.0, "current": 0.0}
    assert stat_values(lines, "failed_versions") == {"behind": 0.0, "current": 0.0}
    # a failed publish attempt is a table failure at once (issue 28)
    assert stat_values(lines, "failing") == {"behind": 1.0, "current": 0.0}
    assert stat_values(lines, "publish_failed_attempts") == {"behind": 1.0, "current": 0.0}
    # per-version latency from the store: "current" has 3 published versions, "behind" none
    for q in ("p50", "p95", "p99"):
        for window in ("1h", "24h", "7d"):
            got = stat_values(lines, rf"version_latency_{q}_seconds\.{window}")
            assert set(got) == {"current"} and 0 <= got["current"] < 60, (q, window, got)
    # plain StatsD has no tags: the tagged form arrives under the bare name as well
    assert any(re.fullmatch(r"airflow\.delta_mirror\.lag_seconds:[\d.]+\|g", x) for x in lines)
    # ... and each measurement is kept as lag history (dl_lag_samples) for the UI and `health`.
    for name, versions in (("behind", 3), ("current", 1)):
        samples = store.lag_samples(store.get_table(name).id)
        assert [s[2] for s in samples] == [versions], (name, samples)
        assert samples[0][1] == lag[name]


@pytest.mark.usefixtures("airflow_db")
def test_a_table_dag_sends_step_durations_and_failures_by_error_class(
    dm_config: Callable[..., Path], sqlite_store: str, tmp_path: Path
) -> None:
    store = SqlStore(sqlite_store)
    (tmp_path / "sales").mkdir()
    make_table(store, "sales", (tmp_path / "sales").as_uri(), versions=3)
    # An external writer already put a different file at version 2: publish must fail as CONFLICT.
    (tmp_path / "sales" / "_delta_log").mkdir(exist_ok=True)
    (tmp_path / "sales" / "_delta_log" / "00000000000000000002.json").write_bytes(b'{"commitInfo":{}}\n')
    dm_config({"sales": {"retries": 0, "deadline": None}})
    _, lines = dags_test_with_statsd("delta_mirror__sales")
    assert "airflow.delta_mirror.failures.sales.CONFLICT:1|c" in lines, [
        x for x in lines if "delta_mirror" in x
    ]
    # the published part (versions 0 and 1) ran before the conflict: a successful rerun times it
    (tmp_path / "sales" / "_delta_log" / "00000000000000000002.json").unlink()
    store.resume_table(store.get_table("sales").id)
    for row in store.status_rows(store.get_table("sales").id, states=("CONFLICT",)):
        store.mark_failed(store.get_table("sales").id, row.version, row.artifact, "PENDING", "", "")
    proc, lines = dags_test_with_statsd("delta_mirror__sales")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for step in ("publish", "checkpoint", "validate"):
        assert "sales" in stat_values(lines, f"{step}_seconds", "ms"), (step, lines)
    # one timing per version this run published (version 2): commit to readable, from the store
    latencies = [x for x in lines if x.startswith("airflow.delta_mirror.version_latency_seconds.sales:")]
    assert len(latencies) == 1, latencies
