"""Processes of a cluster: start one in its own process group, wait for it, stop it and its children.

Every process gets the cluster's marker variable (``DELTA_MIRROR_CLUSTER=<token>``): Airflow and
Spark start children in process groups of their own, and those are found by the marker in
/proc/<pid>/environ. Waits poll with a deadline and give up early when the process has exited.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "INSTANCE_MARKER",
    "MARKER",
    "ClusterError",
    "Proc",
    "alive",
    "descendants",
    "group_pids",
    "log_tail",
    "marked_pids",
    "port_taken",
    "rss_kib",
    "signal_group",
    "spawn",
    "wait_gone",
]

MARKER = "DELTA_MIRROR_CLUSTER"
INSTANCE_MARKER = "DELTA_MIRROR_CLUSTER_PROCESS"  # which of the cluster's processes started it


class ClusterError(RuntimeError):
    """A cluster service could not start or stop; the message is one line naming it and why."""


def port_taken(port: int) -> bool:
    """Whether 127.0.0.1:``port`` cannot be bound now (someone listens on or holds it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def log_tail(path: Path, lines: int = 5) -> str:
    """The last non-empty lines of a log, joined with ' | ' (for a one-line error)."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    kept = [line.strip() for line in text.splitlines() if line.strip()][-lines:]
    return " | ".join(kept) or "(empty log)"


def alive(pid: int) -> bool:
    """Whether ``pid`` runs and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != b"Z"


@dataclass
class Proc:
    """One started process (its pid is also its process group id)."""

    name: str
    pid: int
    log: Path
    popen: subprocess.Popen[bytes] | None = None  # only in the process that started it

    def running(self) -> bool:
        if self.popen is not None:
            return self.popen.poll() is None
        return alive(self.pid)


def spawn(
    name: str,
    argv: Sequence[str],
    *,
    env: Mapping[str, str],
    log: Path,
    cwd: Path,
    user: str | None = None,
) -> Proc:
    """Start ``argv`` in a new session (own process group), stdout+stderr appended to ``log``."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        out.write(f"\n==== {time.strftime('%Y-%m-%d %H:%M:%S')} starting {name}: {argv[0]}\n".encode())
        out.flush()
        try:
            popen = subprocess.Popen(
                list(argv),
                env=dict(env),
                cwd=cwd,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                user=user,
                group=user,
                extra_groups=[] if user else None,
            )
        except OSError as exc:
            raise ClusterError(f"{name}: cannot run {argv[0]}: {exc.strerror or exc}") from None
    return Proc(name=name, pid=popen.pid, log=log, popen=popen)


def marked_pids(token: str, instance: str | None = None) -> list[int]:
    """Live processes carrying this cluster's marker (and ``instance``'s, if given); zombies excluded."""
    needles = {f"{MARKER}={token}".encode()}
    if instance is not None:
        needles.add(f"{INSTANCE_MARKER}={instance}".encode())
    me = os.getpid()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if not needles <= set(f.read().split(b"\0")):
                    continue
        except OSError:
            continue
        if alive(int(entry)):
            found.append(int(entry))
    return found


def _live_stats() -> Iterator[tuple[int, list[bytes]]]:
    """(pid, the /proc/<pid>/stat fields after the command name) of every live, non-zombie process."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != b"Z":
            yield int(entry), fields


def group_pids(pgid: int) -> list[int]:
    """Live processes in process group ``pgid``."""
    return [pid for pid, fields in _live_stats() if int(fields[3]) == pgid]


def descendants(pid: int) -> list[int]:
    """Live children, grandchildren, ... of ``pid`` (from /proc/*/stat parent ids)."""
    children: dict[int, list[int]] = {}
    for child, fields in _live_stats():
        children.setdefault(int(fields[1]), []).append(child)
    found: list[int] = []
    todo = list(children.get(pid, []))
    while todo:
        child = todo.pop()
        found.append(child)
        todo.extend(children.get(child, []))
    return found


def signal_group(pgid: int, sig: int) -> None:
    """``sig`` to the whole process group (gone already is fine)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def wait_gone(pids: Callable[[], list[int]], timeout: float, reap: Sequence[Proc] = ()) -> bool:
    """Whether ``pids()`` becomes empty within ``timeout`` s (reaping our own children meanwhile)."""
    deadline = time.monotonic() + timeout
    while True:
        for proc in reap:
            if proc.popen is not None:
                proc.popen.poll()
        if not pids():
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)


def rss_kib(pids: Sequence[int]) -> int:
    """Resident memory of ``pids`` together (KiB; vanished ones count 0)."""
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError, ValueError, IndexError), open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
                    break
    return total
