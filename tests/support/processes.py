"""Code run in a fresh interpreter: what a module imports is only seen where nothing is loaded yet."""

from __future__ import annotations

import subprocess
import sys


def fresh_python(code: str) -> str:
    """Run ``code`` with ``python -c`` in a new interpreter of this venv; its stdout (it must exit 0)."""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return out.stdout
