"""Driving a `make cluster` stack (``delta_mirror.dev.cluster.Cluster``) from tests, chaos and bench.

The launcher starts the processes; this kit is what a user of the running cluster does: write a
table config, unpause the table DAGs through the REST API, see which triggerer holds which trigger
(Airflow's metadata database), create event tables on MinIO and commit to them, and check every
table with the independent invariant checker (``chaos_invariants.check_table``: store vs the bytes
on MinIO, read with boto3). Every wait has a load-scaled deadline (``support.waiting``).

The launcher gives no way to set the triggerer's ``capacity`` or to pass Airflow options beyond
docker/stack.env; nothing here needs one (see ``ClusterRun.trigger_holders``).
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from delta_mirror.dev.cluster import Cluster, ClusterError
from delta_mirror.dev.cluster.processes import port_taken
from delta_mirror.dev.datafiles import create_table_actions, write_data_file
from support.services import skip_or_fail
from support.waiting import load_scaled, wait_until

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = REPO / ".venv" / "bin"
ROW_SCHEMA = pa.schema([("id", pa.int64()), ("writer", pa.string())])
STORE_TRIGGER = "delta_mirror.airflow.triggers.StoreCommitTrigger"


def _ephemeral_low() -> int:
    """The first port the kernel hands out to outgoing connections (and to ``bind(0)``)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port_base(span: int) -> int:
    """A base from which ``span`` consecutive ports on 127.0.0.1 are free now, below the ephemeral
    range: a port there can be taken by any client connection between this check and the bind."""
    high = max(_ephemeral_low(), 12000) - span
    for _ in range(200):
        base = random.randrange(10000, high)
        if not any(port_taken(p) for p in range(base, base + span)):
            return base
    raise ClusterError(f"no {span} consecutive free ports found between 10000 and {high + span}")


def table_config(tables: Iterable[str], *, lag_slo: str = "60s", extra_defaults: str = "") -> str:
    """Event tables (``publish_in`` left to its default: the triggerer) on the cluster's store and
    MinIO connections; no scheduled reconcile/monitor/maintenance runs to compete for the worker."""
    lines = [
        "defaults:",
        "  schedule: event",
        "  poll_interval: 1s",
        "  store_conn_id: delta_mirror_store",
        "  aws_conn_id: minio",
        f"  lag_slo: {lag_slo}",
        "  deadline: null",
        "  retries: 3",
        "  retry_delay: 5s",
        "  maintenance: {schedule: null}",
        *([extra_defaults.rstrip("\n")] if extra_defaults else []),
        "reconcile: {schedule: null}",
        "monitor: {schedule: null}",
        "tables:",
    ]
    lines += [f"  {name}: {{}}" for name in tables]
    return "\n".join(lines) + "\n"


@dataclass
class ClusterRun:
    """A started cluster and the handles a test needs (store, S3, Airflow's database and API)."""

    cluster: Cluster
    env: dict[str, str]
    bucket: str
    figures: dict[str, Any] = field(default_factory=dict)  # what a test measured, printed at the end
    _s3: Any = None
    _jwt: str | None = None

    # -- addresses -------------------------------------------------------------------------------

    @property
    def store_url(self) -> str:
        return self.env["DELTA_MIRROR_STORE"]

    @property
    def commit_urls(self) -> list[str]:
        return self.env["DELTA_MIRROR_COMMIT_URL"].split(",")

    def location(self, name: str) -> str:
        return f"s3://{self.bucket}/tables/{name}"

    def storage_options(self) -> dict[str, str]:
        keys = ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION")
        return {**{k: self.env[k] for k in keys}, "AWS_ALLOW_HTTP": "true"}

    def s3(self) -> Any:
        if self._s3 is None:
            import boto3
            from botocore.config import Config

            self._s3 = boto3.client(
                "s3",
                endpoint_url=self.env["AWS_ENDPOINT_URL"],
                aws_access_key_id=self.env["AWS_ACCESS_KEY_ID"],
                aws_secret_access_key=self.env["AWS_SECRET_ACCESS_KEY"],
                region_name=self.env["AWS_REGION"],
                config=Config(retries={"max_attempts": 10, "mode": "standard"}, proxies={}),
            )
        return self._s3

    def spark_master_json(self) -> dict[str, Any]:
        """The standalone master's ``/json``: workers, running and completed applications."""
        import urllib.request

        url = f"{self.cluster.url('spark-master', 'ui')}/json"
        with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(url, timeout=10) as r:
            return dict(json.loads(r.read()))

    # -- Airflow ---------------------------------------------------------------------------------

    def airflow_query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Rows from Airflow's metadata database (a connection of its own, closed after)."""
        import psycopg

        with psycopg.connect(**self.cluster.stack().airflow_db(), connect_timeout=10) as conn:
            return [tuple(r) for r in conn.execute(sql, params).fetchall()]

    def api(self, method: str, path: str, **kwargs: Any) -> Any:
        import httpx

        base = self.cluster.url("airflow-api-server")
        with httpx.Client(base_url=base, timeout=60, trust_env=False) as client:
            if self._jwt is None:
                s = self.cluster.topology.settings
                r = client.post(
                    "/auth/token",
                    json={"username": s["AIRFLOW_ADMIN_USER"], "password": s["AIRFLOW_ADMIN_PASSWORD"]},
                )
                if r.status_code != 201:
                    raise AssertionError(f"POST /auth/token: {r.status_code} {r.text[:300]}")
                self._jwt = str(r.json()["access_token"])
            r = client.request(method, path, headers={"Authorization": f"Bearer {self._jwt}"}, **kwargs)
            if r.status_code >= 400:
                raise AssertionError(f"{method} {path}: {r.status_code} {r.text[:300]}")
            return r.json()

    def table_dags(self) -> list[str]:
        rows = self.airflow_query("SELECT dag_id FROM dag WHERE dag_id LIKE 'delta\\_mirror\\_\\_%%'")
        return sorted(str(r[0]) for r in rows)

    def unpause_tables(self, names: Iterable[str], seconds: float = 240) -> None:
        """Wait until the dag-processor has parsed the table DAGs, then unpause them (the cluster
        creates DAGs paused; an asset watcher's trigger exists only for an unpaused DAG)."""
        wanted = {f"delta_mirror__{n}" for n in names}
        wait_until(lambda: wanted <= set(self.table_dags()), seconds, f"the DAGs {sorted(wanted)}", 1.0)
        for dag_id in sorted(wanted):
            self.api(
                "PATCH",
                f"/api/v2/dags/{dag_id}",
                params={"update_mask": "is_paused"},
                json={"is_paused": False},
            )

    def unpause_all_tables(self, expected: int, seconds: float = 600) -> None:
        """The fleet's way: wait for ``expected`` table DAGs, then one PATCH unpauses them all."""
        wait_until(lambda: len(self.table_dags()) >= expected, seconds, f"{expected} table DAGs parsed", 2.0)
        self.api(
            "PATCH",
            "/api/v2/dags",
            params={"dag_id_pattern": "delta_mirror__", "limit": expected + 10, "update_mask": "is_paused"},
            json={"is_paused": False},
        )

    def trigger_holders(self) -> dict[str, str | None]:
        """Each table's ``StoreCommitTrigger`` → the name of the triggerer that runs it (None:
        unassigned). Airflow assigns up to ``[triggerer] capacity`` (1000) unassigned triggers to
        whichever triggerer asks first, so a batch of new triggers usually lands on one of them."""
        rows = self.airflow_query(
            "SELECT a.uri, j.hostname FROM trigger t"
            " JOIN asset_watcher w ON w.trigger_id = t.id JOIN asset a ON a.id = w.asset_id"
            " LEFT JOIN job j ON j.id = t.triggerer_id WHERE t.classpath = %s",
            (STORE_TRIGGER,),
        )
        # the table's commits asset is x-delta-mirror://commits/<table> (dag_factory)
        return {str(uri).rsplit("/", 1)[-1]: host for uri, host in rows}

    def wait_triggers(
        self, names: Iterable[str], seconds: float = 240, *, not_on: str | None = None
    ) -> float:
        """Until every table in ``names`` has its trigger assigned to a live triggerer (not ``not_on``)."""
        wanted = set(names)

        def held() -> bool:
            holders = self.trigger_holders()
            return all(holders.get(n) not in (None, not_on) for n in wanted)

        return wait_until(held, seconds, f"triggers of {sorted(wanted)} assigned (not to {not_on})", 0.5)

    # -- tables ----------------------------------------------------------------------------------

    def store(self) -> Any:
        from delta_mirror.store import SqlStore

        return SqlStore(self.store_url)

    def _upload_rows(self, name: str, ids: Sequence[int]) -> dict[str, Any]:
        """A real Parquet data file of ``ids`` on MinIO under the table; its ``add`` body."""
        local = self.cluster.root.parent / "data-files" / name  # staged here, then uploaded
        add = write_data_file(local, pa.table({"id": list(ids), "writer": ["test"] * len(ids)}, ROW_SCHEMA))
        path = local / add["path"]
        self.s3().upload_file(str(path), self.bucket, f"tables/{name}/{add['path']}")
        path.unlink()
        return add

    def create_event_table(self, store: Any, name: str) -> int:
        """Version 0 of ``name`` on MinIO: protocol, metadata and one data file."""
        actions: list[Any] = [*create_table_actions(ROW_SCHEMA), ("add", self._upload_rows(name, [0]))]
        return int(store.commit(name, actions, location=self.location(name)))

    def create_event_tables(self, names: Iterable[str]) -> None:
        """``create_event_table`` for each name, through one store connection."""
        store = self.store()
        try:
            for name in names:
                self.create_event_table(store, name)
        finally:
            store.close()

    def append(self, store: Any, name: str, ids: Sequence[int]) -> int:
        return int(store.commit(name, [("add", self._upload_rows(name, ids))]))

    # -- checks ----------------------------------------------------------------------------------

    def verdicts(self, names: Iterable[str]) -> dict[str, Any]:
        """``chaos_invariants.check_table`` for each table: the store against the bytes on MinIO."""
        from chaos_invariants import S3Log, StoreReader, check_table

        reader = StoreReader(self.store_url)
        try:
            return {n: check_table(reader, n, S3Log(self.s3(), self.bucket, f"tables/{n}")) for n in names}
        finally:
            reader.close()

    def wait_published(self, names: Iterable[str], seconds: float) -> float:
        """Until every committed version of every table is on MinIO with its recorded bytes and
        nothing broke meanwhile (a broken invariant fails at once, not at the deadline)."""
        names = list(names)

        def done() -> bool:
            verdicts = self.verdicts(names)
            broken = {n: (v.violations, v.duplicated, v.corrupted) for n, v in verdicts.items() if not v.safe}
            assert not broken, f"invariants broken: {broken}"
            return all(v.recovered for v in verdicts.values())

        return wait_until(done, seconds, f"every committed version of {names} published", 1.0)

    def status(self, names: Iterable[str]) -> dict[str, dict[str, Any]]:
        """``delta-mirror status --json`` as a user runs it against the cluster's store."""
        proc = subprocess.run(
            [str(VENV_BIN / "delta-mirror"), "status", "--json"],
            env={**os.environ, **self.env},
            capture_output=True,
            text=True,
            timeout=load_scaled(120),
            check=False,
        )
        assert proc.returncode == 0, f"delta-mirror status failed: {proc.stderr[-500:]}"
        rows = json.loads(proc.stdout)
        rows = rows.get("tables", rows) if isinstance(rows, dict) else rows
        wanted = set(names)
        return {r["table"]: r for r in rows if r["table"] in wanted}

    def delta_rows(self, name: str) -> tuple[int, int]:
        """(version, rows) of the table as deltalake reads it from MinIO."""
        from deltalake import DeltaTable

        table = DeltaTable(self.location(name), storage_options=self.storage_options())
        return int(table.version()), int(table.to_pyarrow_table().num_rows)


class CommitFlow:
    """A thread committing to random tables at ``rate`` commits/s until stopped: commits keep
    flowing while a fault happens. Records (table, version, monotonic time) of each commit;
    transient store errors (a restarting database) are counted and retried, as a writer would."""

    def __init__(self, run: ClusterRun, tables: Sequence[str], rate: float, seed: int = 27) -> None:
        self.run, self.tables, self.rate = run, list(tables), rate
        self.commits: list[tuple[str, int, float]] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._rng = random.Random(seed)
        self._thread = threading.Thread(target=self._loop, name="commit-flow", daemon=True)
        self._next_id = 1_000_000

    def __enter__(self) -> CommitFlow:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=load_scaled(120))

    def _loop(self) -> None:
        store = self.run.store()
        try:
            period = 1.0 / self.rate
            next_at = time.monotonic()
            while not self._stop.is_set():
                name = self._rng.choice(self.tables)
                self._next_id += 1
                try:
                    version = self.run.append(store, name, [self._next_id])
                    self.commits.append((name, version, time.monotonic()))
                except Exception as exc:  # a fault in progress: count it, try again
                    self.errors.append(f"{type(exc).__name__}: {str(exc)[:200]}")
                next_at += period
                self._stop.wait(max(0.0, next_at - time.monotonic()))
        finally:
            store.close()


def start_cluster(
    root: Path,
    tables: Iterable[str],
    *,
    triggerers: int = 2,
    workers: int = 1,
    commit_replicas: int = 2,
    skip: Sequence[str] = ("mailpit",),
    extra_defaults: str = "",
) -> ClusterRun:
    """A cluster under ``root`` on a free port base, its table config listing ``tables``; skipped
    (failed under CI) when a binary the launcher needs is missing, failed when a service does not
    start. The caller stops it with ``run.cluster.down()``."""
    from delta_mirror.dev.cluster.topology import load_topology
    from delta_mirror.spark.session import java_missing

    why = java_missing()
    if why:
        skip_or_fail(f"the cluster needs Java (Spark): {why}")
    root.mkdir(parents=True, exist_ok=True)
    config = root.parent / f"{root.name}-tables.yaml"
    config.write_text(table_config(tables, extra_defaults=extra_defaults))
    span = sum(load_topology(REPO / "docker").port_slots.values())
    cluster = Cluster(
        root,
        repo=REPO,
        port_base=free_port_base(span),
        triggerers=triggerers,
        workers=workers,
        commit_replicas=commit_replicas,
        skip=skip,
        table_config=config,
        timeout_scale=max(1.0, load_scaled(1.0)),
    )
    try:
        cluster.preflight()  # a binary that is missing: one line naming it, before anything starts
    except ClusterError as exc:
        skip_or_fail(f"the cluster cannot start here: {exc}")
    cluster.up()
    env = cluster.env()
    return ClusterRun(cluster=cluster, env=env, bucket=env["DELTA_MIRROR_BUCKET"])


__all__ = ["ROW_SCHEMA", "ClusterRun", "CommitFlow", "free_port_base", "start_cluster", "table_config"]
