"""Test kit for Spark writers through the SQL authority: the shared SparkSession switched to the
commit service for a set of table roots, and writers in processes of their own.

The LogStore reads its settings from the Hadoop configuration at every call, so one session moves
between "governed" and "passthrough" (a plain Delta-Spark writer) without a restart.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from support.commit_service import TOKEN_ENV, CommitService
from support.waiting import load_scaled

from delta_mirror.spark.session import AuthorityConfig
from delta_mirror.spark.session import governed as session_governed


@contextmanager
def governed(spark: Any, service: CommitService, *roots: str, token: str | None = None) -> Iterator[None]:
    """Commits to tables under ``roots`` go through ``service`` while the block runs."""
    with session_governed(spark, AuthorityConfig(url=service.url, roots=roots), token or service.token):
        yield


def spark_root(path: Path) -> str:
    """A local folder as Hadoop names it (``file:/...``), with a trailing slash: a root prefix."""
    return "file:" + str(path).rstrip("/") + "/"


WRITER = Path(__file__).resolve().parent / "writer_process.py"


class WriterProcess:
    """``writer_process.py`` as a child: its own SparkSession and JVM, phases started by ``go``."""

    def __init__(
        self,
        name: str,
        service: CommitService,
        location: str,
        roots: Sequence[str],
        sync_dir: Path,
        phases: list[dict[str, Any]],
        failpoint: str | None = None,
    ) -> None:
        self.name = name
        self.sync_dir = sync_dir
        spec = {
            "name": name,
            "url": service.url,
            "roots": list(roots),
            "location": location,
            "sync_dir": str(sync_dir),
            "phases": phases,
            "failpoint": failpoint,
        }
        self.out_path = sync_dir / f"{name}.out"
        env = {**os.environ, TOKEN_ENV: service.token}
        with self.out_path.open("wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, str(WRITER), json.dumps(spec)], env=env, stdout=out, stderr=subprocess.STDOUT
            )

    def wait_ready(self, phase: str) -> None:
        # a Spark session starts in ~10 s on an idle 2-core machine, minutes on a loaded one
        deadline = time.monotonic() + load_scaled(300)
        marker = self.sync_dir / f"{self.name}.{phase}.ready"
        while not marker.exists():
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"writer {self.name} exited {self.proc.returncode}: {self.output()[-3000:]}"
                )
            if time.monotonic() > deadline:
                raise RuntimeError(f"writer {self.name} not ready for {phase}: {self.output()[-3000:]}")
            time.sleep(0.1)

    def output(self) -> str:
        return self.out_path.read_text(errors="replace")

    def result(self, phase: str, timeout: float = 600) -> list[str]:
        deadline = time.monotonic() + load_scaled(timeout)
        while True:
            for line in self.output().splitlines():
                if line.startswith("RESULT "):
                    found = json.loads(line[len("RESULT ") :])
                    if found["phase"] == phase:
                        return list(found["outcomes"])
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"writer {self.name}: no result for {phase}: {self.output()[-3000:]}")
            time.sleep(0.2)

    def wait(self, timeout: float = 300) -> int:
        return self.proc.wait(timeout=load_scaled(timeout))

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)


def go(sync_dir: Path, phase: str) -> None:
    (sync_dir / f"{phase}.go").touch()
