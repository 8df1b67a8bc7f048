"""``delta-mirror serve`` as a child process for the tests: started on 127.0.0.1 (a free port),
killed with SIGKILL and started again on the same port, and spoken to over plain HTTP.

Readiness is polled on ``/health`` with a deadline that grows with the machine's load.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.parse
import uuid
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from support.builders import action, add_body, log_line, metadata_body, protocol_body
from support.services import free_port
from support.waiting import load_scaled

TOKEN_ENV = "DELTA_MIRROR_COMMIT_TOKEN"


def commit_file(*actions: str) -> bytes:
    """A ``<v>.json`` as Delta-Spark writes it: a ``commitInfo`` line, then ``actions``, each ending in \\n."""
    info = log_line(action("commitInfo", {"timestamp": 1700000000000, "operation": "WRITE"}))
    return "".join(f"{x}\n" for x in (info, *actions)).encode()


def add_line(path: str) -> str:
    """One ``add`` action line for ``path``."""
    return log_line(action("add", add_body(path, size=10, modificationTime=1700000000000)))


#: Version 0 of a table: protocol, metaData and one file.
FIRST_COMMIT = commit_file(
    log_line(action("protocol", protocol_body(1, 2))),
    log_line(
        action(
            "metaData", metadata_body(id="a6b9e1c2-0000-4000-8000-000000000000", created_time=1700000000000)
        )
    ),
    add_line("part-0.parquet"),
)


def cli_path() -> str:
    """The ``delta-mirror`` console script of this interpreter's environment."""
    return str(Path(sys.executable).parent / "delta-mirror")


@dataclass
class Answer:
    status: int
    body: bytes
    headers: dict[str, str]

    def json(self) -> dict[str, Any]:
        return dict(json.loads(self.body))


class CommitService:
    """``delta-mirror serve`` for ``store_url``, creating tables under ``allow_roots``."""

    def __init__(
        self,
        store_url: str,
        allow_roots: Sequence[str] = (),
        *,
        extra_args: Sequence[str] = (),
        log_path: Path | None = None,
    ) -> None:
        self.store_url = store_url
        self.allow_roots = list(allow_roots)
        self.extra_args = list(extra_args)
        self.token = f"tok-{uuid.uuid4().hex}"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path or Path(tempfile.gettempdir()) / f"delta-mirror-serve-{self.port}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, ready: int = 200) -> CommitService:
        """Start it and wait until ``/health`` answers ``ready`` (503 while the store is down)."""
        args = [
            cli_path(),
            "--store",
            self.store_url,
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
        ]
        for root in self.allow_roots:
            args += ["--allow-root", root]
        args += self.extra_args
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                args, env={**os.environ, TOKEN_ENV: self.token}, stdout=log, stderr=subprocess.STDOUT
            )
        deadline = time.monotonic() + load_scaled(60)
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"serve exited {self.proc.returncode}: {self.log()[-4000:]}")
            try:
                if self.request("GET", "/health", token=None).status == ready:
                    return self
            except OSError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"serve not ready on port {self.port}: {self.log()[-4000:]}")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(load_scaled(15))
            except subprocess.TimeoutExpired:
                self.kill()

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def request(
        self,
        method: str,
        path: str,
        body: bytes | Iterable[bytes] | None = None,
        *,
        token: str | bool | None = True,
        conn: http.client.HTTPConnection | None = None,
    ) -> Answer:
        headers = {}
        if token is not None and token is not False:
            headers["Authorization"] = f"Bearer {self.token if token is True else token}"
        own = conn is None
        conn = conn or http.client.HTTPConnection("127.0.0.1", self.port, timeout=load_scaled(30))
        try:
            chunked = body is not None and not isinstance(body, bytes)
            conn.request(method, path, body=body, headers=headers, encode_chunked=chunked)
            r = conn.getresponse()
            return Answer(r.status, r.read(), {k.lower(): v for k, v in r.getheaders()})
        finally:
            if own:
                conn.close()

    def post(self, root: str, version: int, data: bytes | Iterable[bytes], **kw: Any) -> Answer:
        return self.request("POST", f"/v1/commits/{version}?root={_q(root)}", data, **kw)

    def get(self, root: str, version: int, **kw: Any) -> Answer:
        return self.request("GET", f"/v1/commits/{version}?root={_q(root)}", **kw)

    def latest(self, root: str, **kw: Any) -> Answer:
        return self.request("GET", f"/v1/latest?root={_q(root)}", **kw)


def _q(root: str) -> str:
    return urllib.parse.quote(root, safe="")


@contextmanager
def commit_service(store_url: str, allow_roots: Sequence[str] = (), **kwargs: Any) -> Iterator[CommitService]:
    """A started service for the ``with`` block, stopped afterwards."""
    service = CommitService(store_url, allow_roots, **kwargs).start()
    try:
        yield service
    finally:
        service.stop()
