"""The commit service's metrics, in the Prometheus text exposition format 0.0.4 (``GET /metrics``).

Each process keeps its values in a small array of float64 slots: in memory for one process, or in a
file ``worker-<pid>.slots`` that it maps (``mmap``) in the service's metrics folder when
``delta-mirror serve --workers N`` runs several. A scrape of any process (or of the
``--metrics-bind`` listener in the parent) reads every file of that folder and answers totals over
the whole service, as one process would: counters and histograms are summed over every worker that
ever ran in this service (a worker uvicorn restarted keeps counting, so no total goes down), gauges
over the workers alive. Only the event loop's thread writes a process's commit slots (the loop is
single-threaded), store threads write the reconnect slot under a lock, and a reader sees each
float64 whole; a scrape during a commit may see its counter before its histogram bucket.
"""

from __future__ import annotations

import mmap
import os
import re
import threading
import time
from bisect import bisect_left
from collections.abc import Sequence
from pathlib import Path

from delta_mirror.service.errors import ERROR_STATUS

PREFIX = "delta_mirror_service_"
#: The ``Content-Type`` of the text exposition format 0.0.4.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
#: Upper bounds (seconds) of the latency histogram's buckets: a commit takes ~1-5 ms on an idle
#: service, tens of ms under load, seconds when the store is slow.
BUCKETS: tuple[float, ...] = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip


def outcome_of(status: int) -> str:
    """The ``outcome`` label of a commit answered with ``status``."""
    return {201: "created", 200: "existing", 409: "conflict", 503: "store_error", 500: "internal"}.get(
        status, "refused"
    )


#: Every (outcome, code) a commit can be answered with, in exposition order.
OUTCOMES: tuple[tuple[str, int], ...] = tuple(
    (outcome_of(status), status)
    for status in dict.fromkeys([201, 200, 409, *sorted(s for _, s, _ in ERROR_STATUS if s != 409)])
)
_SLOT_OF_STATUS = {status: i for i, (_, status) in enumerate(OUTCOMES)}
# The slots' layout: one counter per outcome, one count per bucket (+Inf last, not cumulative), the
# latencies' sum, commits in flight, store reconnects.
_BUCKET0 = len(OUTCOMES)
_SUM = _BUCKET0 + len(BUCKETS) + 1
_IN_FLIGHT = _SUM + 1
_RECONNECTS = _IN_FLIGHT + 1
SLOTS = _RECONNECTS + 1
_FILE = re.compile(r"worker-(\d+)\.slots")


class Metrics:
    """This process's metrics; ``directory`` (shared by a service's worker processes) or none.

    ``record=False``: only read the folder (the parent of the workers, serving ``--metrics-bind``).
    """

    def __init__(self, directory: Path | None = None, *, record: bool = True) -> None:
        self.directory = directory
        self._lock = threading.Lock()
        self._mmap: mmap.mmap | None = None
        if directory is None or not record:
            self._values = memoryview(bytearray(SLOTS * 8)).cast("d")
        else:
            path = directory / f"worker-{os.getpid()}.slots"
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                os.ftruncate(fd, SLOTS * 8)
                self._mmap = mmap.mmap(fd, SLOTS * 8)
            finally:
                os.close(fd)
            self._values = memoryview(self._mmap).cast("d")

    # -- recording (on the event loop, per commit: a few float additions) -------------------------
    def commit_started(self) -> float:
        """A commit request began; returns its start for ``commit_answered``."""
        self._values[_IN_FLIGHT] += 1
        return time.perf_counter()

    def commit_answered(self, status: int, started: float) -> None:
        seconds = time.perf_counter() - started
        values = self._values
        values[_IN_FLIGHT] -= 1
        values[_SLOT_OF_STATUS.get(status, _SLOT_OF_STATUS[500])] += 1
        values[_BUCKET0 + bisect_left(BUCKETS, seconds)] += 1
        values[_SUM] += seconds

    def commit_abandoned(self) -> None:
        """The writer hung up before its body was in: nothing committed, nothing answered."""
        self._values[_IN_FLIGHT] -= 1

    def store_reconnected(self) -> None:
        """The store's pool dropped a dead connection (its next use opens a new one); any thread."""
        with self._lock:
            self._values[_RECONNECTS] += 1

    # -- reading ------------------------------------------------------------------------------------
    def totals(self) -> tuple[list[float], int]:
        """The slots summed over the service's processes (gauges over live ones), and how many live."""
        if self.directory is None:
            return list(self._values), 1
        total = [0.0] * SLOTS
        live = 0
        for path in sorted(self.directory.glob("worker-*.slots")):
            match = _FILE.fullmatch(path.name)
            try:
                data = path.read_bytes()
            except OSError:
                continue
            if match is None or len(data) != SLOTS * 8:
                continue
            values = memoryview(data).cast("d")
            alive = _alive(int(match.group(1)))
            live += alive
            for i in range(SLOTS):
                if i != _IN_FLIGHT or alive:
                    total[i] += values[i]
        return total, live

    def exposition(self) -> str:
        """Every metric in the text format 0.0.4 (``CONTENT_TYPE``), totals over the service."""
        v, live = self.totals()
        out: list[str] = []
        name = f"{PREFIX}commits_total"
        out += _family(
            name, "counter", "Commits (POST /v1/commits) answered, by outcome and HTTP status code."
        )
        out += [f'{name}{{outcome="{o}",code="{c}"}} {_num(v[i])}' for i, (o, c) in enumerate(OUTCOMES)]
        name = f"{PREFIX}commit_duration_seconds"
        out += _family(name, "histogram", "Time from a commit request's headers to its answer, in seconds.")
        cumulative = 0.0
        for i, bound in enumerate((*BUCKETS, float("inf"))):
            cumulative += v[_BUCKET0 + i]
            out.append(f'{name}_bucket{{le="{_le(bound)}"}} {_num(cumulative)}')
        out += [f"{name}_sum {_num(v[_SUM])}", f"{name}_count {_num(cumulative)}"]
        name = f"{PREFIX}commits_in_flight"
        out += _family(name, "gauge", "Commit requests begun and not yet answered.")
        out.append(f"{name} {_num(max(0.0, v[_IN_FLIGHT]))}")
        name = f"{PREFIX}store_reconnects_total"
        out += _family(
            name, "counter", "Store connections found dead and replaced (a restart, a dropped link)."
        )
        out.append(f"{name} {_num(v[_RECONNECTS])}")
        name = f"{PREFIX}worker_processes"
        out += _family(name, "gauge", "Service processes alive whose metrics this scrape sums.")
        out.append(f"{name} {live}")
        return "\n".join(out) + "\n"

    def close(self) -> None:
        """Unmap this process's file (kept: a dead worker's counters stay in the totals)."""
        if self._mmap is not None:
            self._values.release()
            self._mmap.close()
            self._mmap = None


def _family(name: str, kind: str, help_text: str) -> Sequence[str]:
    return (f"# HELP {name} {help_text}", f"# TYPE {name} {kind}")


def _num(value: float) -> str:
    return str(int(value)) if value.is_integer() else repr(value)


def _le(bound: float) -> str:
    return "+Inf" if bound == float("inf") else repr(bound)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def metric_names() -> list[str]:
    """The names of every series the service exports (histograms with their suffixes)."""
    hist = f"{PREFIX}commit_duration_seconds"
    return [
        f"{PREFIX}commits_total",
        f"{hist}_bucket",
        f"{hist}_sum",
        f"{hist}_count",
        f"{PREFIX}commits_in_flight",
        f"{PREFIX}store_reconnects_total",
        f"{PREFIX}worker_processes",
    ]


__all__ = ["BUCKETS", "CONTENT_TYPE", "OUTCOMES", "PREFIX", "Metrics", "metric_names", "outcome_of"]
