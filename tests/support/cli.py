"""Running the real ``delta-mirror`` executable in tests."""

from __future__ import annotations

import os
import sys
from pathlib import Path


def executable() -> list[str]:
    """The installed ``delta-mirror`` script, else ``python -m delta_mirror.cli``."""
    script = Path(sys.executable).parent / "delta-mirror"
    return [str(script)] if script.exists() else [sys.executable, "-m", "delta_mirror.cli"]


def clean_env(**extra: str) -> dict[str, str]:
    """The environment without ``DELTA_MIRROR_*`` and ``AWS_*`` settings, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DELTA_MIRROR_", "AWS_"))}
    env.update(extra)
    return env


def assert_one_error_line(stderr: str, *needles: str) -> str:
    """Exactly one line, starting with 'error:', saying what to do (' — '), no traceback."""
    assert "Traceback" not in stderr
    assert stderr.endswith("\n") and stderr.count("\n") == 1, repr(stderr)
    line = stderr.rstrip("\n")
    assert line.startswith("error: "), line
    assert " — " in line, f"no 'what to do' in: {line}"
    assert "unexpected" not in line, line
    for needle in needles:
        assert needle in line, f"{needle!r} not in: {line}"
    return line


__all__ = ["assert_one_error_line", "clean_env", "executable"]
