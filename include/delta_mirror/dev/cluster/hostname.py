"""Airflow's ``[core] hostname_callable`` in the cluster: each process reports its cluster name.

Every Airflow process of the cluster runs on 127.0.0.1, so the real host name tells them apart in
nothing. With this callable the job table, ``GET /api/v2/triggers`` (via its triggerer's job) and a
task instance's ``hostname`` say ``airflow-triggerer-2`` or ``airflow-worker-1``: the launcher waits
on it, and tests see which triggerer holds a trigger and which worker ran a task.
"""

from __future__ import annotations

import os
import socket

__all__ = ["ENV", "hostname"]

ENV = "DELTA_MIRROR_CLUSTER_PROCESS"


def hostname() -> str:
    """The cluster process name the launcher gave this process (inherited by its tasks), else the
    machine's name (an ``airflow`` command in a shell that sourced .cluster/env)."""
    return os.environ.get(ENV) or socket.getfqdn()
