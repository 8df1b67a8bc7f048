"""``make chaos``: every fault-injection scenario at scale; prints one JSON object.

Starts its own moto S3 server, the fault proxy in front of it and a throwaway PostgreSQL, runs the
scenarios of ``chaos_scenarios.py`` with ``LARGE`` (``--scale small`` for the ``make test`` size),
prints the summary on stdout and writes it to ``bench-results/chaos.json``. Run as ``make chaos``
(or ``PYTHONPATH=tests .venv/bin/python tests/chaos/run.py``: ``tests/`` holds the ``support`` kit).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

from chaos_harness import ProxyProcess
from chaos_results import LARGE, SMALL, Services
from chaos_scenarios import run_all, summary
from support.services import PgServer, S3Server

HERE = Path(__file__).resolve().parent


def main() -> int:
    parser = argparse.ArgumentParser(description="delta-mirror fault-injection suite")
    parser.add_argument("--scale", choices=["small", "large"], default="large")
    parser.add_argument("--only", nargs="*", default=None, help="scenario names to run")
    parser.add_argument("--seed", type=int, default=20261126)
    parser.add_argument("--out", default=str(HERE.parents[1] / "bench-results" / "chaos.json"))
    args = parser.parse_args()
    scale = LARGE if args.scale == "large" else SMALL
    workdir = Path(tempfile.mkdtemp(prefix="dm-chaos-"))
    s3 = S3Server()
    pg = PgServer.start_new()
    proxy = ProxyProcess(s3.endpoint, args.seed)
    started = time.monotonic()
    try:
        results = run_all(Services(workdir, s3, proxy, pg, args.seed), scale, args.only)
        report = summary(results, scale, time.monotonic() - started)
    finally:
        proxy.stop()
        s3.stop()
        pg.stop_and_remove()
        shutil.rmtree(workdir, ignore_errors=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report))
    clean = not (report["lost"] or report["duplicated"] or report["corrupted"] or report["overwritten"])
    return (
        0 if clean and report["invariant_violations"] == 0 and report["all_recovered_within_2_cycles"] else 1
    )


if __name__ == "__main__":
    sys.exit(main())
