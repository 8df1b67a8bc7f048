"""MinIO (a real S3 server, the one the cluster and Compose run) for the tests that want more than moto.

One server per session on 127.0.0.1 and a free port, its data in a temporary folder; buckets are
made fresh per test. The same interface as ``services.S3Server`` (``endpoint``, keys, ``region``,
``client()``, ``make_bucket()``, ``env()``, ``stop()``), so a test written for moto runs on MinIO
unchanged. Built by ``scripts/install-emulators.sh`` into ``.cache/go/bin`` (``make test`` runs
it); ``DELTA_MIRROR_MINIO`` names another ``minio`` executable.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

from support.emulator import REPO, EmulatorProcesses, require_binary
from support.services import S3ProtocolServer, free_port, session_service
from support.waiting import load_scaled

MINIO_ENV = "DELTA_MIRROR_MINIO"
#: The project's own build (``DELTA_MIRROR_MINIO`` first, ``minio`` on PATH last).
LOCAL_MINIO = REPO / ".cache" / "go" / "bin" / "minio"


class MinioServer(S3ProtocolServer):
    """``minio server`` on one folder (a single-drive deployment) in its own process group."""

    access_key = "dm-test-user"
    secret_key = "dm-test-secret-key"  # MinIO wants at least 8 characters
    region = "us-east-1"

    def __init__(self) -> None:
        binary = require_binary(MINIO_ENV, LOCAL_MINIO, "minio", "MinIO (minio)")
        self.port = free_port()
        self.processes = EmulatorProcesses("minio")
        data = self.processes.workdir / "data"
        data.mkdir()
        env = {
            "MINIO_ROOT_USER": self.access_key,
            "MINIO_ROOT_PASSWORD": self.secret_key,
            "MINIO_REGION": self.region,
            "MINIO_BROWSER": "off",  # no console: the tests speak S3 only
            "MINIO_UPDATE": "off",  # no update check over the network
        }
        certs = str(self.processes.workdir / "certs")  # not ~/.minio
        address = f"127.0.0.1:{self.port}"
        self.processes.start(
            binary, "server", "--quiet", "--address", address, "--certs-dir", certs, str(data), env=env
        )
        self.endpoint = f"http://{address}"
        self._client: Any = None
        # ready (not only listening): the drive is formatted and S3 requests are served
        self.processes.wait(self._ready, 60, "MinIO to be ready", interval=0.2)

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.endpoint}/minio/health/ready", timeout=2) as response:
                return int(response.status) == 200
        except (urllib.error.URLError, OSError):
            return False

    def stop(self) -> None:
        """SIGTERM to the server's process group (MinIO shuts down in well under a second), SIGKILL
        if it is still there after a load-scaled wait; then the data folder goes."""
        self.processes.stop(grace=load_scaled(15))


def minio_session() -> Iterator[MinioServer]:
    """The body of a session fixture: skipped without MinIO, failed under CI (``.ci/run`` builds it)."""
    return session_service(MinioServer, MinioServer.stop, "MinIO")


__all__ = ["MINIO_ENV", "MinioServer", "minio_session"]
