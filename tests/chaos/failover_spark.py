"""The Spark writer of the failover run (``failover.py``, issue 40 item 1).

A Delta-Spark job in a process of its own (its own SparkSession and JVM, ``local[1]``, the
project's SQL-authority LogStore jar) appends to ``tables`` tables under the run's lake, one append
per table in turn, until a stop file exists. It is configured as a user's job is, from the
environment only: ``DELTA_MIRROR_COMMIT_URL`` lists both commit-service replicas (the LogStore
fails over across them and retries 502/503/504 and dropped connections), ``DELTA_MIRROR_COMMIT_ROOTS``
the lake, ``DELTA_MIRROR_COMMIT_TOKEN`` the token (never a Spark setting).

After each append returns, the job records the version it committed (the newest ``<v>.json`` of a
table only it writes) with that file's sha256 and the monotonic time (one clock for every process
of the machine); an append that raises is recorded with its exception and the job goes on (Delta
re-reads the log at the next one). Each record is one JSON line in a progress file, so the run sees
the first commit before it starts its own load and a ``store_behind`` refusal while it runs.

``check`` then asks of the Spark tables what the run asks of the others: every version the job
committed is in the store with the bytes of its ``<v>.json`` (``lost``), the store's versions are
contiguous and no Delta transaction id is in two versions (``duplicated``), every ``<v>.json`` on
storage is the store's with its bytes (``other_bytes``, ``missing_from_store``: nothing half-written
by a failed commit), every stored version is on storage (``unpublished``).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from support.commit_service import CommitService
from support.spark import TEST_CONF
from support.waiting import load_scaled, wait_until

# A lean JVM beside the run's other processes on 2 cores (as tests/spark/writer_process.py's).
LEAN_CONF = {
    **TEST_CONF,
    "spark.driver.memory": "512m",
    "spark.driver.extraJavaOptions": "-Duser.timezone=UTC -XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
}
COMMIT_JSON = re.compile(r"^\d{20}\.json$")


def commit_files(location: Path) -> dict[int, bytes]:
    log = location / "_delta_log"
    files = sorted(p for p in log.iterdir() if COMMIT_JSON.match(p.name)) if log.exists() else []
    return {int(p.name[:20]): p.read_bytes() for p in files}


class SparkJob:
    """The job's process: started before the run's load, stopped with its writers, then checked."""

    def __init__(self, workdir: Path, lake: Path, replicas: list[CommitService], tables: int) -> None:
        self.workdir, self.lake, self.replicas = workdir, lake, replicas
        self.locations = [lake / f"spark{i}" for i in range(tables)]
        self.progress = workdir / "spark-progress.jsonl"
        self.stop_file = workdir / "stop-spark"
        self.log = workdir / "spark-job.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.started = 0.0
        self._seen_lines = 0
        self.result: dict[str, Any] = {}

    def start(self) -> SparkJob:
        env = {k: v for k, v in os.environ.items() if k != "DELTA_MIRROR_COMMIT_URLS"}
        env |= {
            "DELTA_MIRROR_COMMIT_URL": ",".join(r.url for r in self.replicas),
            "DELTA_MIRROR_COMMIT_ROOTS": f"file:{self.lake}/",
            "DELTA_MIRROR_COMMIT_TOKEN": self.replicas[0].token,
            "PYTHONPATH": os.pathsep.join(sys.path),
        }
        spec = {"locations": [str(p) for p in self.locations], "progress": str(self.progress)}
        argv = [sys.executable, __file__, json.dumps(spec), str(self.stop_file)]
        self.started = time.monotonic()
        with self.log.open("ab") as out:  # its own process group: the JVM goes with it at the end
            self.proc = subprocess.Popen(
                argv, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        return self

    def records(self) -> list[dict[str, Any]]:
        if not self.progress.exists():
            return []
        return [json.loads(line) for line in self.progress.read_text().splitlines() if line.strip()]

    def wait_committing(self) -> float:
        """Until every table has a commit (the JVM started, the packages resolved); its seconds."""

        def committed() -> bool:
            return {r["table"] for r in self.records() if "version" in r} == set(range(len(self.locations)))

        wait_until(
            committed, load_scaled(300), "the Spark job's first commits", interval=0.5, alive=self._exited
        )
        self._seen_lines = len(self.records())
        return round(time.monotonic() - self.started, 1)

    def behind_refused(self) -> bool:
        """Whether an append failed on ``store_behind`` since the last call (the run then recovers)."""
        new = self.records()[self._seen_lines :]
        self._seen_lines += len(new)
        return any("store_behind" in r.get("error", "") or "behind" in r.get("error", "") for r in new)

    def stop(self) -> None:
        """The job finishes the append under way and exits (its result: the last line it printed)."""
        self.stop_file.touch()
        if self.proc is None:
            return
        try:
            self.proc.wait(load_scaled(180))
        except subprocess.TimeoutExpired:
            self.kill()
        lines = [x for x in self.log.read_text(errors="replace").splitlines() if x.startswith("{")]
        self.result = json.loads(lines[-1]) if lines else {}

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)

    def _exited(self) -> str | None:
        assert self.proc is not None
        if self.proc.poll() is None:
            return None
        return f"exit {self.proc.returncode}: {self.log.read_text(errors='replace')[-2000:]}"

    def check(self, stored_of: Any, killed_at: float) -> dict[str, Any]:
        """The Spark tables' figures; ``stored_of(root)``: the store's versions of a table with their
        sha256 (``Run._stored``)."""
        records = self.records()
        commits = [r for r in records if "version" in r]
        failures = [r for r in records if "error" in r]
        after = [r for r in commits if r["at"] > killed_at]
        out: dict[str, Any] = {
            "tables": len(self.locations),
            "exit": None if self.proc is None else self.proc.returncode,
            "finished": bool(self.result) and self.proc is not None and self.proc.returncode == 0,
            "committed": len(commits),
            "commits_after_kill": len(after),
            "kill_to_first_commit_s": round(min(r["at"] for r in after) - killed_at, 2) if after else None,
            "longest_append_s": max((r["seconds"] for r in commits), default=None),
            "append_spanning_kill_s": max(
                (r["seconds"] for r in commits if r["at"] - r["seconds"] < killed_at < r["at"]), default=None
            ),
            "failed_appends": len(failures),
            "failures": [f"spark{r['table']}: {r['error']}"[:300] for r in failures[:3]],
            "lost": 0,
            "lost_versions": [],
            "duplicated": 0,
            "duplicated_txns": 0,
            "other_bytes": 0,
            "missing_from_store": 0,
            "unpublished": 0,
        }
        for i, location in enumerate(self.locations):
            stored = stored_of(f"file:{location}")
            files = commit_files(location)
            if sorted(stored) != list(range(len(stored))):
                out["duplicated"] += 1
            for r in (r for r in commits if r["table"] == i):
                if stored.get(r["version"]) != r["sha256"]:
                    out["lost"] += 1
                    out["lost_versions"].append(f"spark{i}@{r['version']}")
            for v, body in files.items():
                if v not in stored:
                    out["missing_from_store"] += 1
                elif stored[v] != hashlib.sha256(body).hexdigest():
                    out["other_bytes"] += 1
            out["unpublished"] += sum(1 for v in stored if v not in files)
            txns = [
                json.loads(b.split(b"\n", 1)[0]).get("commitInfo", {}).get("txnId") for b in files.values()
            ]
            out["duplicated_txns"] += len(txns) - len(set(txns))
        return out


def clean(spark: dict[str, Any]) -> bool:
    """0 lost, duplicated, other bytes, missing from the store, unpublished in either mode (the
    job writes ``<v>.json`` after each 201, as the LogStore does: asynchronous mode loses none of
    them once ``recover`` has run, as for the run's LogStore tables); the job finished and committed
    after the kill."""
    return bool(
        spark["lost"] == 0
        and spark["duplicated"] == spark["duplicated_txns"] == spark["other_bytes"] == 0
        and spark["missing_from_store"] == spark["unpublished"] == 0
        and spark["finished"]
        and spark["commits_after_kill"] > 0
    )


# -- the job (its own process) --------------------------------------------------------------------


def job(spec: dict[str, Any], stop_file: Path) -> dict[str, Any]:
    from delta_mirror.spark.session import get_spark

    # the authority from the environment (AuthorityConfig.from_env), as a user's job gets it
    conf: dict[str, Any] = {
        **LEAN_CONF,
        "spark.hadoop.delta.mirror.commit.timeoutMs": str(int(load_scaled(10) * 1000)),
    }
    spark = get_spark("local[1]", app_name="failover-spark", **conf)
    locations = [Path(p) for p in spec["locations"]]
    committed, failed, batch = 0, 0, 0
    with open(spec["progress"], "a") as progress:
        while not stop_file.exists():
            for i, location in enumerate(locations):
                ids = range(batch * 10, batch * 10 + 10)
                df = spark.createDataFrame([(n, f"u{n}") for n in ids], "event_id BIGINT, user STRING")
                began = time.monotonic()
                try:
                    df.coalesce(1).write.format("delta").mode("append").save(str(location))
                except Exception as exc:  # the commit refused or the services unreachable: go on
                    failed += 1
                    text = " ".join(str(exc).split())
                    error = next((line for line in text.split(" at ") if "Exception" in line), text)
                    record: dict[str, Any] = {"table": i, "error": f"{type(exc).__name__}: {error[:400]}"}
                else:
                    committed += 1
                    version, body = max(commit_files(location).items())
                    record = {"table": i, "version": version, "sha256": hashlib.sha256(body).hexdigest()}
                record |= {"at": time.monotonic(), "seconds": round(time.monotonic() - began, 3)}
                progress.write(json.dumps(record) + "\n")
                progress.flush()
            batch += 1
    rows = [spark.read.format("delta").load(str(p)).count() for p in locations]
    spark.stop()
    return {"committed": committed, "failed": failed, "rows": rows}


if __name__ == "__main__":
    print(json.dumps(job(json.loads(sys.argv[1]), Path(sys.argv[2]))), flush=True)
