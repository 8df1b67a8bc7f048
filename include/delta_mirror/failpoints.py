"""Named crash points for fault-injection tests; a no-op unless ``DELTA_MIRROR_FAILPOINTS`` is set.

``DELTA_MIRROR_FAILPOINTS=publish.after_put:3`` makes the process SIGKILL itself the third time it
reaches ``failpoint("publish.after_put")`` — a crash with no cleanup, exactly like a killed worker.
Several points are separated by commas. The points the publisher (and the store) declares:

- ``publish.after_put``: a commit file is durable, its SUCCESS is not recorded yet;
- ``checkpoint.after_part``: a checkpoint file (one part, or a sidecar) is written, others are not;
- ``checkpoint.before_last_checkpoint``: the checkpoint is complete, ``_last_checkpoint`` is not;
- ``checkpoint.after_last_checkpoint``: ``_last_checkpoint`` is written, the status is not;
- ``sqlite_commit.before_commit``: a SQLite commit's rows are written in its open transaction,
  COMMIT is not sent (``store/sqlite_commit.py``).
"""

from __future__ import annotations

import os
import signal

ENV = "DELTA_MIRROR_FAILPOINTS"

_armed: dict[str, int] | None = None


def _parse(spec: str) -> dict[str, int]:
    armed: dict[str, int] = {}
    for item in spec.split(","):
        name, _, nth = item.strip().partition(":")
        if name:
            armed[name] = int(nth) if nth.strip() else 1
    return armed


def failpoint(name: str) -> None:
    """SIGKILL this process at the configured hit of ``name``; otherwise return at once."""
    global _armed
    if _armed is None:  # read once per process: disabled costs one dict lookup
        _armed = _parse(os.environ.get(ENV, ""))
    if not _armed:
        return
    remaining = _armed.get(name)
    if remaining is None:
        return
    if remaining <= 1:
        os.kill(os.getpid(), signal.SIGKILL)
    _armed[name] = remaining - 1


__all__ = ["ENV", "failpoint"]
