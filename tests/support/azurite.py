"""Azurite (Microsoft's Azure Storage emulator, the npm package) for the Azure Blob tests.

One blob service per session on 127.0.0.1 and a free port, in memory; containers are made fresh
per test. Installed by ``scripts/install-emulators.sh`` into ``.cache/npm`` (``make test`` runs
it); ``DELTA_MIRROR_AZURITE`` names another ``azurite-blob`` executable.
"""

from __future__ import annotations

import base64
import email.utils
import hashlib
import hmac
import http.client
import uuid
from collections.abc import Iterator

from support.emulator import REPO, EmulatorProcesses, require_binary
from support.services import free_port, listening, session_service

AZURITE_ENV = "DELTA_MIRROR_AZURITE"
# Azurite's well-known development account (public, the same in every Azurite).
ACCOUNT = "devstoreaccount1"
ACCOUNT_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
API_VERSION = "2021-08-06"
#: The project's own install (``DELTA_MIRROR_AZURITE`` first, ``azurite-blob`` on PATH last).
LOCAL_AZURITE = REPO / ".cache" / "npm" / "node_modules" / ".bin" / "azurite-blob"


class AzuriteServer:
    """``azurite-blob`` in its own process group; ``options()`` are a table's storage options."""

    def __init__(self) -> None:
        binary = require_binary(AZURITE_ENV, LOCAL_AZURITE, "azurite-blob", "Azurite (azurite-blob)")
        self.port = free_port()
        self.processes = EmulatorProcesses("azurite")
        self.processes.start(
            binary, "--blobHost", "127.0.0.1", "--blobPort", str(self.port),
            "--inMemoryPersistence", "--skipApiVersionCheck", "--silent",
        )  # fmt: skip
        # node starts in ~1 s idle; the wait grows with the machine's load
        self.processes.wait(lambda: listening(self.port), 30, "Azurite to listen")
        self.endpoint = f"http://127.0.0.1:{self.port}/{ACCOUNT}"

    def options(self) -> dict[str, str]:
        """Account, key and endpoint, as ``AZURE_*`` environment variables / storage options."""
        return {
            "AZURE_STORAGE_ACCOUNT_NAME": ACCOUNT,
            "AZURE_STORAGE_ACCOUNT_KEY": ACCOUNT_KEY,
            "AZURE_STORAGE_ENDPOINT": self.endpoint,
            "AZURE_ALLOW_HTTP": "true",
        }

    def make_container(self, prefix: str = "dm-") -> str:
        """A fresh container (Create Container, signed with the account's Shared Key)."""
        name = f"{prefix}{uuid.uuid4().hex[:16]}"
        headers = {"x-ms-date": email.utils.formatdate(usegmt=True), "x-ms-version": API_VERSION}
        canonical_headers = "".join(f"{k}:{v}\n" for k, v in sorted(headers.items()))
        resource = f"/{ACCOUNT}/{ACCOUNT}/{name}\nrestype:container"  # path-style: the account twice
        to_sign = "PUT\n" + "\n" * 11 + canonical_headers + resource
        digest = hmac.new(base64.b64decode(ACCOUNT_KEY), to_sign.encode(), hashlib.sha256).digest()
        headers["Authorization"] = f"SharedKey {ACCOUNT}:{base64.b64encode(digest).decode()}"
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            conn.request("PUT", f"/{ACCOUNT}/{name}?restype=container", body=b"", headers=headers)
            response = conn.getresponse()
            body = response.read()
        finally:
            conn.close()
        if response.status != 201:
            raise RuntimeError(
                f"Azurite refused to create container {name}: {response.status} {body[:300]!r}"
            )
        return name

    def stop(self) -> None:
        """Killed at once: everything is in memory, and a graceful stop waits ~10 s on idle clients."""
        self.processes.stop()


def azurite_session() -> Iterator[AzuriteServer]:
    """The body of a session fixture: skipped without Azurite, failed under CI (``.ci/run`` installs it)."""
    return session_service(AzuriteServer, AzuriteServer.stop, "Azurite")


__all__ = ["ACCOUNT", "ACCOUNT_KEY", "AzuriteServer", "azurite_session"]
