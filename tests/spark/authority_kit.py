"""Test kit for Spark writers through the SQL authority: the real commit service as a process, and
the shared SparkSession switched to the authority for a set of table roots.

The service is ``delta-mirror serve`` on 127.0.0.1 (a free port); readiness is polled on
``/health`` with a deadline that grows with the machine's load. The LogStore reads its settings
from the Hadoop configuration at every call, so one session moves between "governed" and
"passthrough" (a plain Delta-Spark writer) without a restart.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from support.services import free_port

from delta_mirror.spark.session import AuthorityConfig
from delta_mirror.spark.session import governed as session_governed

TOKEN_ENV = "DELTA_MIRROR_COMMIT_TOKEN"


def load_scaled(seconds: float) -> float:
    """``seconds`` stretched by how busy the machine is (load per core, at least 1x, at most 6x)."""
    try:
        per_core = os.getloadavg()[0] / (os.cpu_count() or 1)
    except OSError:
        per_core = 1.0
    return seconds * min(6.0, max(1.0, per_core))


def cli_path() -> str:
    return str(Path(sys.executable).parent / "delta-mirror")


class CommitService:
    """``delta-mirror serve`` as a child process (kill and restart on the same port)."""

    def __init__(
        self,
        store_url: str,
        allow_roots: Sequence[str] = (),
        *,
        extra_args: Sequence[str] = (),
        log_dir: Path | None = None,
    ) -> None:
        self.store_url = store_url
        self.allow_roots = list(allow_roots)
        self.extra_args = list(extra_args)
        self.token = f"tok-{uuid.uuid4().hex}"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = (log_dir or Path(os.environ.get("TMPDIR", "/tmp"))) / f"serve-{self.port}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> CommitService:
        args = [
            cli_path(),
            "--store",
            self.store_url,
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
        ]
        for root in self.allow_roots:
            args += ["--allow-root", root]
        args += self.extra_args
        env = {**os.environ, TOKEN_ENV: self.token}
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT)
        self.wait_ready()
        return self

    def wait_ready(self) -> None:
        deadline = time.monotonic() + load_scaled(60)
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"commit service exited {self.proc.returncode}: {self.log()}")
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.2)
        raise RuntimeError(f"commit service not ready at {self.url}: {self.log()}")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=load_scaled(15))
            except subprocess.TimeoutExpired:
                self.kill()

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-4000:]
        except OSError:
            return ""

    def latest(self, root: str) -> dict[str, Any]:
        req = urllib.request.Request(
            f"{self.url}/v1/latest?root={urllib.request.quote(root, safe='')}",
            headers={"Authorization": f"Bearer {self.token}"},
        )
        with urllib.request.urlopen(req, timeout=10) as r:
            return dict(json.loads(r.read()))


@contextmanager
def commit_service(store_url: str, allow_roots: Sequence[str] = (), **kwargs: Any) -> Iterator[CommitService]:
    service = CommitService(store_url, allow_roots, **kwargs).start()
    try:
        yield service
    finally:
        service.stop()


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
