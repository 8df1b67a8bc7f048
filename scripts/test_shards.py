"""``make test`` as two pytest processes at once, on a 2-core machine (``PYTEST_SHARDS=2``).

The suite waits a lot (servers starting, subprocesses, JVMs, Airflow runs), so two processes
overlap well on two cores. What one run must start once stays in one process: the tests
tests/conftest.py marks ``one_process`` (Spark's one shared session, the kernel-java and Spark-writer
JVMs, the cluster, the Airflow servers, end to end, packaging, chaos) run in the ``jvm`` shard; every
other test runs in the ``rest`` shard, which starts its own PostgreSQL, MariaDB, S3 server and
Airflow home (free ports, temporary folders, fresh database names, as for any pytest run) and
resolves Spark's jars into an Ivy cache of its own. Plain pytest processes, no plugin in between.

Each shard's lines are printed as they come, prefixed with its name; its exit status is kept, and
the run fails when either fails (no tests in a shard is fine). Arguments after ``--`` go to both.
With ``-k``, ``-m`` or test paths among them the run is one process (a selection is not split).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SHARDS = (("jvm", "one_process"), ("rest", "not one_process"))
NO_TESTS = 5  # pytest's exit status when a selection is empty


def _selects(args: list[str]) -> bool:
    return any(a in ("-k", "-m") or a.startswith(("-k", "-m", "tests")) for a in args)


def _pump(name: str, proc: subprocess.Popen[bytes]) -> None:
    assert proc.stdout is not None
    prefix = f"[{name}] ".encode()
    for line in proc.stdout:
        sys.stdout.buffer.write(prefix + line)
        sys.stdout.buffer.flush()


def main(argv: list[str]) -> int:
    shards = int(argv[0]) if argv else 2
    args = argv[argv.index("--") + 1 :] if "--" in argv else []
    pytest = [sys.executable, "-m", "pytest"]
    if shards < 2 or _selects(args):
        return subprocess.call([*pytest, *args], cwd=REPO)
    work = Path(tempfile.mkdtemp(prefix="dm-shards-"))
    procs: list[tuple[str, subprocess.Popen[bytes]]] = []
    for name, markexpr in SHARDS:
        env = dict(os.environ)
        if name == "rest" and "DELTA_MIRROR_SPARK_IVY" not in env:
            env["DELTA_MIRROR_SPARK_IVY"] = str(REPO / ".cache" / "ivy-rest")
        cmd = [*pytest, "-m", markexpr, f"--basetemp={work / name}", "-p", "no:cacheprovider", *args]
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        procs.append((name, proc))
    pumps = [threading.Thread(target=_pump, args=p, daemon=True) for p in procs]
    for t in pumps:
        t.start()
    status = 0
    try:
        for (name, proc), t in zip(procs, pumps, strict=True):
            code = proc.wait()
            t.join()
            sys.stdout.write(f"[{name}] pytest exited {code}\n")
            sys.stdout.flush()
            if code not in (0, NO_TESTS):
                status = status or code
    except KeyboardInterrupt:
        for _name, proc in procs:
            proc.send_signal(2)
        for _name, proc in procs:
            proc.wait()
        return 130
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
