"""Readiness probes of the cluster's services: each answers "ready now?" once, quickly, never raising."""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request
from typing import Any

__all__ = [
    "airflow_job_alive",
    "http_json",
    "http_ok",
    "postgres_ok",
    "redis_ping",
    "smtp_banner",
    "spark_worker_alive",
    "spark_workers",
]

_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # 127.0.0.1 never via a proxy


def http_json(url: str, timeout: float = 5.0) -> Any:
    """The JSON body of a 200 answer to GET ``url``; None on any error or other status."""
    try:
        with _OPENER.open(url, timeout=timeout) as resp:
            if resp.status != 200:
                return None
            body = resp.read()
    except (OSError, urllib.error.URLError, ValueError):
        return None
    try:
        return json.loads(body)
    except ValueError:
        return {}


def http_ok(url: str, timeout: float = 5.0) -> bool:
    """Whether GET ``url`` answers 200."""
    try:
        with _OPENER.open(url, timeout=timeout) as resp:
            return bool(resp.status == 200)
    except (OSError, urllib.error.URLError, ValueError):
        return False


def redis_ping(port: int) -> bool:
    """Whether the Redis server on 127.0.0.1:``port`` answers PING with PONG."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
            s.sendall(b"PING\r\n")
            return s.recv(64).startswith(b"+PONG")
    except OSError:
        return False


def smtp_banner(port: int) -> bool:
    """Whether an SMTP server on 127.0.0.1:``port`` greets with 220."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
            ok = s.recv(256).startswith(b"220")
            s.sendall(b"QUIT\r\n")
            return ok
    except OSError:
        return False


def postgres_ok(conninfo: dict[str, Any]) -> bool:
    """Whether PostgreSQL accepts a connection and runs SELECT 1."""
    import psycopg

    try:
        with psycopg.connect(**conninfo, connect_timeout=3) as conn:
            conn.execute("SELECT 1")
        return True
    except psycopg.Error:
        return False


def airflow_job_alive(
    conninfo: dict[str, Any], job_type: str, hostname: str, since: float, within_s: float
) -> bool:
    """Whether a job of ``job_type`` (TriggererJob, DagProcessorJob) of ``hostname`` (the cluster's
    hostname_callable gives each process its name), started after ``since`` (epoch s), beat in the
    last ``within_s`` seconds: read from the metadata database, no Airflow import."""
    import psycopg

    try:
        with psycopg.connect(**conninfo, connect_timeout=3) as conn:
            row = conn.execute(
                "SELECT count(*) FROM job WHERE job_type = %s AND state = 'running' AND hostname = %s"
                " AND start_date >= to_timestamp(%s) AND latest_heartbeat > now() - make_interval(secs => %s)",
                (job_type, hostname, since, within_s),
            ).fetchone()
        return bool(row and row[0])
    except psycopg.Error:
        return False


def spark_workers(master_ui_port: int) -> list[dict[str, Any]]:
    """The workers the standalone master's /json lists (empty when it does not answer)."""
    doc = http_json(f"http://127.0.0.1:{master_ui_port}/json")
    if not isinstance(doc, dict):
        return []
    workers = doc.get("workers") or []
    return [w for w in workers if isinstance(w, dict)]


def spark_worker_alive(master_ui_port: int, worker_port: int) -> bool:
    """Whether the master lists the worker on 127.0.0.1:``worker_port`` as ALIVE."""
    return any(
        w.get("state") == "ALIVE" and w.get("port") == worker_port for w in spark_workers(master_ui_port)
    )
