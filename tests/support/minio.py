"""MinIO (a real S3 server, the one the cluster and Compose run) for the tests that want more than moto.

One server per session on 127.0.0.1 and a free port, its data in a temporary folder; buckets are
made fresh per test. The same interface as ``services.S3Server`` (``endpoint``, keys, ``region``,
``client()``, ``make_bucket()``, ``env()``, ``stop()``), so a test written for moto runs on MinIO
unchanged. Built by ``scripts/install-emulators.sh`` into ``.cache/go/bin`` (``make test`` runs
it); ``DELTA_MIRROR_MINIO`` names another ``minio`` executable.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from support.services import (
    S3ProtocolServer,
    ServiceUnavailable,
    exit_report,
    file_tail,
    find_tool,
    free_port,
    session_service,
    stop_group,
)
from support.waiting import load_scaled, wait_until

MINIO_ENV = "DELTA_MIRROR_MINIO"
REPO = Path(__file__).resolve().parents[2]


def find_minio() -> str | None:
    """``DELTA_MIRROR_MINIO``, else the project's ``.cache/go/bin`` build, else ``minio`` on PATH."""
    return find_tool(MINIO_ENV, REPO / ".cache" / "go" / "bin" / "minio", "minio")


class MinioServer(S3ProtocolServer):
    """``minio server`` on one folder (a single-drive deployment) in its own process group."""

    access_key = "dm-test-user"
    secret_key = "dm-test-secret-key"  # MinIO wants at least 8 characters
    region = "us-east-1"

    def __init__(self) -> None:
        binary = find_minio()
        if binary is None:
            raise ServiceUnavailable(
                "MinIO (minio) not found: run scripts/install-emulators.sh (make test does) "
                f"or set {MINIO_ENV}"
            )
        self.port = free_port()
        self._workdir = Path(tempfile.mkdtemp(prefix="dm-minio-"))
        (self._workdir / "data").mkdir()
        self._log = open(self._workdir / "minio.log", "wb")  # noqa: SIM115 - closed in stop()
        env = {
            **os.environ,
            "MINIO_ROOT_USER": self.access_key,
            "MINIO_ROOT_PASSWORD": self.secret_key,
            "MINIO_REGION": self.region,
            "MINIO_BROWSER": "off",  # no console: the tests speak S3 only
            "MINIO_UPDATE": "off",  # no update check over the network
        }
        self._proc = subprocess.Popen(
            [
                binary,
                "server",
                "--quiet",
                "--address",
                f"127.0.0.1:{self.port}",
                "--certs-dir",
                str(self._workdir / "certs"),  # not ~/.minio
                str(self._workdir / "data"),
            ],
            cwd=self._workdir,
            env=env,
            stdout=self._log,
            stderr=self._log,
            start_new_session=True,
        )
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._client: Any = None
        try:
            # ready (not only listening): the drive is formatted and S3 requests are served
            wait_until(self._ready, 60, "MinIO to be ready", interval=0.2, alive=self._exited)
        except BaseException:
            self.stop()
            raise

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.endpoint}/minio/health/ready", timeout=2) as response:
                return int(response.status) == 200
        except (urllib.error.URLError, OSError):
            return False

    def _exited(self) -> str | None:
        return exit_report([self._proc], self._workdir / "minio.log")

    def log_tail(self) -> str:
        return file_tail(self._workdir / "minio.log")

    def stop(self) -> None:
        """SIGTERM to the server's process group (MinIO shuts down in well under a second), SIGKILL
        if it is still there after a load-scaled wait; then the data folder goes."""
        stop_group(self._proc, grace=load_scaled(15))
        self._log.close()
        shutil.rmtree(self._workdir, ignore_errors=True)


def minio_session() -> Iterator[MinioServer]:
    """The body of a session fixture: skipped without MinIO, failed under CI (``.ci/run`` builds it)."""
    return session_service(MinioServer, MinioServer.stop)


__all__ = ["MINIO_ENV", "MinioServer", "find_minio", "minio_session"]
