"""``python -m delta_mirror.dev.cluster up|down|status``: the process launcher's command line.

``make cluster`` / ``make cluster-down`` call it. Errors are one line on stderr and exit 1.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from delta_mirror.dev.cluster import Cluster, ClusterError, TopologyError


def _out(text: str = "") -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def _table(rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows)


def _state(cluster: Cluster, name: str, alive: bool) -> str:
    if alive:
        return "up"
    return "done" if cluster.instance(name).spec.oneshot else "DOWN"


def _print_status(cluster: Cluster, ready_after: dict[str, float] | None = None) -> None:
    rows = [["process", "pid", "state", "rss MiB", "ports", "ready after", "log"]]
    for st in cluster.status():
        ports = " ".join(f"{role}={port}" for role, port in st.ports.items()) or "-"
        after = f"{ready_after[st.name]:.0f} s" if ready_after and st.name in ready_after else "-"
        rows.append(
            [
                st.name,
                str(st.pid),
                _state(cluster, st.name, st.alive),
                f"{st.rss_mib:.0f}",
                ports,
                after,
                str(st.log),
            ]
        )
    _out(_table(rows))
    total = sum(st.rss_mib for st in cluster.status())
    _out(f"total resident memory: {total:.0f} MiB")


def _up(args: argparse.Namespace) -> None:
    base = args.port_base if args.port_base is not None else os.environ.get("DELTA_MIRROR_CLUSTER_PORT_BASE")
    cluster = Cluster(
        args.root,
        port_base=int(base) if base not in (None, "") else None,
        triggerers=args.triggerers,
        workers=args.workers,
        commit_replicas=args.commit_replicas,
        skip=args.skip,
        table_config=args.table_config,
    )
    _out(f"starting {len(cluster.names())} processes under {cluster.root} (logs in {cluster.root / 'logs'})")
    # Ctrl-C or SIGTERM while starting: up() stops what it started before the error propagates.
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    seconds = cluster.up()
    _print_status(cluster, cluster.ready_after)
    _out(f"\nthe cluster is up after {seconds:.0f} s:")
    for what, where in cluster.describe().items():
        _out(f"  {what + ':':<20}{where}")
    default_root = cluster.root == cluster.repo / ".cluster"
    stop = (
        "make cluster-down"
        if default_root
        else f"python -m delta_mirror.dev.cluster --root {cluster.root} down"
    )
    _out(f"  stop it with:       {stop}")


def _down(args: argparse.Namespace) -> None:
    try:
        cluster = Cluster.attach(args.root)
    except ClusterError as exc:
        _out(f"nothing to stop: {exc}")
        return
    was = cluster.down()
    _out(f"stopped {len(was)} running process(es): {', '.join(was) or 'none were running'}")
    if cluster.forced:
        _out(f"not gone within their grace period, so SIGKILLed: {', '.join(cluster.forced)}")


def _heal(args: argparse.Namespace) -> None:
    cluster = Cluster.attach(args.root)
    started = cluster.heal()
    _out(f"started again: {', '.join(started)}" if started else "every process is alive")


def _status(args: argparse.Namespace) -> None:
    try:
        cluster = Cluster.attach(args.root)
    except ClusterError as exc:
        _out(f"no cluster: {exc}")
        raise SystemExit(3) from None
    _print_status(cluster)
    if any(_state(cluster, st.name, st.alive) == "DOWN" for st in cluster.status()):
        raise SystemExit(3)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m delta_mirror.dev.cluster", description=__doc__.splitlines()[0]
    )
    p.add_argument("--root", default=None, help="the cluster's state folder (default: <repo>/.cluster)")
    sub = p.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="start the topology of docker/stack.yaml and wait until it is ready")
    up.add_argument(
        "--port-base", type=int, default=None, help="pack the ports from here (default: stack.env's)"
    )
    up.add_argument("--triggerers", type=int, default=2)
    up.add_argument("--workers", type=int, default=2, help="Celery workers")
    up.add_argument("--commit-replicas", type=int, default=2)
    up.add_argument("--skip", action="append", default=[], help="a service not to start (repeatable)")
    up.add_argument(
        "--table-config",
        type=Path,
        default=None,
        help="DELTA_MIRROR_CONFIG of the cluster (default: docker/delta_mirror.compose.yaml)",
    )
    sub.add_parser("down", help="stop everything the cluster started")
    sub.add_parser("status", help="which processes are alive (exit 3 if one is not)")
    sub.add_parser("heal", help="start again every process that has died (Compose's restart policy)")
    return p


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    try:
        {"up": _up, "down": _down, "status": _status, "heal": _heal}[args.command](args)
    except (ClusterError, TopologyError) as exc:
        sys.stderr.write(f"cluster: {exc}\n")
        raise SystemExit(1) from None
    except KeyboardInterrupt:
        sys.stderr.write("cluster: interrupted; what had started was stopped\n")
        raise SystemExit(130) from None


if __name__ == "__main__":
    main()
