"""How a chaos or fault run (``make chaos-failover``, ``make cluster-chaos``) ends: its JSON report
written to its file and to stdout, and the exit status saying whether it held."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def write_report(out: Path, report: dict[str, Any], ok: bool) -> int:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report))
    return 0 if ok else 1
