"""Waits that survive a busy machine: every limit grows with the load per core, never a fixed cap.

The suite runs on 2 cores shared with Spark, PostgreSQL, Airflow and other test processes; a wait
that is right on an idle machine times out on a loaded one. The limit is re-scaled at every poll,
so a machine that gets busier during the wait extends it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

MAX_STRETCH = 6.0


def load_scaled(seconds: float) -> float:
    """``seconds`` stretched by how busy the machine is now (load per core, 1x to 6x)."""
    try:
        per_core = os.getloadavg()[0] / (os.cpu_count() or 1)
    except OSError:
        per_core = 1.0
    return seconds * min(MAX_STRETCH, max(1.0, per_core))


def wait_until(
    check: Callable[[], bool],
    seconds: float,
    what: str,
    interval: float = 0.1,
    alive: Callable[[], str | None] | None = None,
) -> float:
    """Poll ``check`` until it holds; returns the seconds waited.

    Fails after ``seconds`` stretched by the load (re-evaluated at every poll), naming ``what`` and
    the load, or at once when ``alive()`` returns why the process being waited on died.
    """
    started = time.monotonic()
    while not check():
        dead = alive() if alive is not None else None
        if dead:
            raise AssertionError(f"{what}: the process exited: {dead}")
        waited = time.monotonic() - started
        if waited > load_scaled(seconds):
            raise AssertionError(
                f"timed out after {waited:.0f} s waiting for {what} (load {os.getloadavg()[0]:.1f})"
            )
        time.sleep(interval)
    return time.monotonic() - started


__all__ = ["load_scaled", "wait_until"]
