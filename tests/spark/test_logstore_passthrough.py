"""The delta-mirror LogStore in the shared SparkSession, without the real commit service.

The session runs ``SqlAuthorityLogStore`` for ``file`` (tests/spark/conftest.py). Here its settings
are set at runtime, as a job would: a table outside the governed roots is written by Delta's own
LogStore whatever the URL; a governed table whose service cannot be reached, or refuses, fails the
write with the reason and leaves no ``<v>.json``. (The round trip with ``delta-mirror serve`` is in
the writer tests.)
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from support.services import skip_or_fail

KEYS = (
    "delta.mirror.commit.url",
    "delta.mirror.commit.roots",
    "delta.mirror.commit.retries",
    "delta.mirror.commit.timeoutMs",
)
V0 = "00000000000000000000.json"


@pytest.fixture(autouse=True)
def _needs_logstore(logstore_loaded: bool) -> None:
    if not logstore_loaded:
        skip_or_fail("the delta-mirror LogStore jar is not built: run `make jar` (needs Maven and a JDK 17)")


def free_port() -> int:
    """A port nothing listens on (bound, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def root_prefix(path: Path) -> str:
    """A local folder as Hadoop names it (``file:/...``), as a governed root prefix."""
    return "file:" + str(path).rstrip("/") + "/"


@contextmanager
def hadoop_settings(spark: Any, **settings: str) -> Iterator[None]:
    """``delta.mirror.commit.<key>`` in the Hadoop configuration while the block runs."""
    conf = spark.sparkContext._jsc.hadoopConfiguration()
    for key, value in settings.items():
        conf.set(f"delta.mirror.commit.{key}", value)
    try:
        yield
    finally:
        for key in KEYS:
            conf.unset(key)


@contextmanager
def session_settings(spark: Any, **settings: str) -> Iterator[None]:
    """The same through the session conf (``spark.conf.set``), which Delta copies into its Hadoop conf."""
    for key, value in settings.items():
        spark.conf.set(f"delta.mirror.commit.{key}", value)
    try:
        yield
    finally:
        for key in KEYS:
            spark.conf.unset(key)


@contextmanager
def refusing_service(status: int, code: str, message: str) -> Iterator[tuple[str, list[str]]]:
    """A stand-in commit service answering every POST with ``status``; yields its URL and requests."""
    seen: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def _answer(self, status: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # /v1/latest: the table is not known yet
            seen.append(f"GET {self.path}")
            self._answer(404, {"error": "unknown table", "code": "unknown_table"})

        def do_POST(self) -> None:
            seen.append(f"POST {self.path}")
            self.rfile.read(int(self.headers.get("Content-Length", "0")))
            self._answer(status, {"error": message, "code": code})

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()


def write_rows(spark: Any, location: Path, n: int, mode: str = "append") -> None:
    spark.range(n).write.format("delta").mode(mode).save(str(location))


def test_a_table_outside_the_governed_roots_is_written_by_deltas_own_logstore(
    spark: Any, tmp_path: Path
) -> None:
    unreachable = f"http://127.0.0.1:{free_port()}"
    plain = tmp_path / "plain" / "t"
    with hadoop_settings(spark, url=unreachable, roots=root_prefix(tmp_path / "governed"), retries="1"):
        write_rows(spark, plain, 3)
        write_rows(spark, plain, 2)
        rows = sorted(r.id for r in spark.read.format("delta").load(str(plain)).collect())
    assert rows == [0, 0, 1, 1, 2]
    names = sorted(p.name for p in (plain / "_delta_log").glob("*.json"))
    assert names == [V0, "00000000000000000001.json"]


def test_a_governed_table_with_the_service_unreachable_fails_and_writes_no_commit(
    spark: Any, tmp_path: Path
) -> None:
    port = free_port()  # nothing listens there
    governed = tmp_path / "lake"
    location = governed / "events"
    with (
        session_settings(spark, url=f"http://127.0.0.1:{port}", roots=root_prefix(governed), retries="2"),
        pytest.raises(Exception) as failed,
    ):
        write_rows(spark, location, 3)
    text = str(failed.value)
    assert "java.io.IOException: delta-mirror: commit of version 0 of file:" in text, text[:2000]
    assert f"the commit service at http://127.0.0.1:{port} is unreachable after 2 attempt(s)" in text
    assert not (location / "_delta_log" / V0).exists()
    assert list((location / "_delta_log").glob("*.json")) == []
    # the same table, once ungoverned again, is an ordinary Delta table starting at version 0
    write_rows(spark, location, 1)
    assert (location / "_delta_log" / V0).exists()


def test_a_refusal_reaches_the_spark_user_with_the_services_message(spark: Any, tmp_path: Path) -> None:
    governed = tmp_path / "lake"
    location = governed / "events"
    message = "table events is halted (CONFLICT at version 0): see delta-mirror status events"
    with (
        refusing_service(423, "halted", message) as (url, seen),
        hadoop_settings(spark, url=url, roots=root_prefix(governed)),
        pytest.raises(Exception) as failed,
    ):
        write_rows(spark, location, 3)
    text = str(failed.value)
    assert f"delta-mirror: commit of version 0 of file:{location}" in text, text[:2000]
    assert f"HTTP 423 halted: {message}" in text
    assert [s.split("?")[0] for s in seen if s.startswith("POST")] == ["POST /v1/commits/0"]
    assert not (location / "_delta_log" / V0).exists()
