"""A cluster's secrets: generated once per cluster into ``secrets.env`` (mode 600), never printed."""

from __future__ import annotations

import base64
import os
import secrets
from pathlib import Path

SECRET_KEYS = (
    "AIRFLOW_JWT_SECRET",
    "AIRFLOW_API_SECRET_KEY",
    "AIRFLOW_FERNET_KEY",
    "DELTA_MIRROR_COMMIT_TOKEN",
    "POSTGRES_SUPERUSER_PASSWORD",
)


def cluster_secrets(root: Path) -> dict[str, str]:
    """The secrets of the cluster under ``root``: those ``root/secrets.env`` holds, the missing ones
    generated and written there (an existing file's wider mode is narrowed on every call)."""
    path = root / "secrets.env"
    found: dict[str, str] = {}
    if path.exists():
        path.chmod(0o600)
        for line in path.read_text().splitlines():
            key, _, value = line.partition("=")
            found[key] = value
    missing = [k for k in SECRET_KEYS if not found.get(k)]
    if missing:
        for key in missing:
            raw = os.urandom(32)
            found[key] = (
                base64.urlsafe_b64encode(raw).decode()
                if key == "AIRFLOW_FERNET_KEY"
                else secrets.token_hex(32)
            )
        root.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write("".join(f"{k}={found[k]}\n" for k in SECRET_KEYS))
    return found


__all__ = ["SECRET_KEYS", "cluster_secrets"]
