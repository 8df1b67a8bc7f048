"""``delta-mirror serve``'s server: the app under uvicorn (its public ``uvicorn.run``), one process
or ``workers`` processes sharing the port, and the ``--metrics-bind`` listener.

With several workers each builds its own app and store from ``SERVE_SETTINGS_ENV`` (a uvicorn
factory), and they share their metrics through a folder (``metrics.py``) so that a scrape of any of
them, or of the ``--metrics-bind`` listener in the parent, answers for the whole service.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import socket
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from delta_mirror.errors import PermanentError
from delta_mirror.service import guard
from delta_mirror.service.app import SERVE_SETTINGS_ENV, create_app
from delta_mirror.service.metrics import CONTENT_TYPE, Metrics
from delta_mirror.store.sql_store import SqlStore

#: Seconds an idle keep-alive connection stays open (uvicorn's default is 5: a writer committing
#: every few seconds would reconnect for nearly every commit).
KEEP_ALIVE_SECONDS = 75
#: Connections (and requests in progress) at once per process; beyond it uvicorn answers 503.
LIMIT_CONCURRENCY = 1000
#: Connections the kernel queues before the service accepts them.
BACKLOG = 1024


@dataclass(frozen=True)
class ServeOptions:
    """What ``delta-mirror serve`` was asked for (the token stays in the environment)."""

    host: str
    port: int
    allowed_roots: tuple[str, ...]
    max_body_bytes: int
    workers: int = 1
    access_log: bool = False
    debug: bool = False
    metrics_bind: tuple[str, int] | None = None
    limits: guard.ConnectionLimits = dataclasses.field(default_factory=guard.ConnectionLimits)
    limit_concurrency: int = LIMIT_CONCURRENCY
    backlog: int = BACKLOG
    keep_alive_seconds: int = KEEP_ALIVE_SECONDS
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None


def parse_bind(raw: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:9464`` for IPv6) as a (host, port) pair; one clear error otherwise."""
    host, sep, port = raw.strip().rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise PermanentError(
            f"--metrics-bind {raw!r} is not HOST:PORT",
            hint="e.g. --metrics-bind 127.0.0.1:9464 (or 0.0.0.0:9464 for every interface)",
        )
    return host, int(port)


class MetricsListener:
    """``GET /metrics`` on its own address (a thread of this process; nothing else is served)."""

    def __init__(self, bind: tuple[str, int], metrics: Metrics) -> None:
        host, port = bind

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path.split("?", 1)[0] != "/metrics":
                    self._answer(
                        404,
                        b'{"error":"only /metrics is served here","code":"not_found"}',
                        "application/json",
                    )
                    return
                self._answer(200, metrics.exposition().encode(), CONTENT_TYPE)

            def _answer(self, status: int, body: bytes, content_type: str) -> None:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                """No line per scrape."""

        class Server(ThreadingHTTPServer):
            address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
            daemon_threads = True

        try:
            self._server = Server((host, port), Handler)
        except OSError as exc:
            raise PermanentError(
                f"cannot listen for metrics on {host}:{port}: {exc.strerror or exc}",
                hint="pick a free --metrics-bind HOST:PORT",
            ) from None
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, name="metrics", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def metrics_folder(port: int) -> Path:
    """A fresh folder for the metrics of the service's workers on ``port``: the same name each
    time, emptied at start, so a service killed before it could remove it leaves one folder behind."""
    path = Path(tempfile.gettempdir()) / f"delta-mirror-serve-{port}-metrics-{os.getuid()}"
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(mode=0o700)
    return path


def run(
    store: SqlStore,
    options: ServeOptions,
    *,
    token: str | None,
    announce: Callable[[], object] = lambda: None,
) -> None:
    """Serve until a signal stops uvicorn; ``store`` is this process's (closed here with workers).
    ``announce()`` runs once the metrics listener is bound, before uvicorn binds the commit port."""
    import uvicorn

    uvicorn_options: dict[str, Any] = {
        "host": options.host,
        "port": options.port,
        "log_level": "debug" if options.debug else "info",
        "access_log": options.access_log,
        "lifespan": "on",
        "timeout_keep_alive": options.keep_alive_seconds,
        "limit_concurrency": options.limit_concurrency,
        "backlog": options.backlog,
        "h11_max_incomplete_event_size": options.limits.max_head_bytes,
        "loop": guard.LOOP,
        "ssl_certfile": options.ssl_certfile,
        "ssl_keyfile": options.ssl_keyfile,
    }
    guard.configure(options.limits)
    folder = metrics_folder(options.port) if options.workers > 1 else None
    listener: MetricsListener | None = None
    try:
        if options.workers == 1:
            app = create_app(
                store,
                token=token,
                allowed_roots=options.allowed_roots,
                max_body_bytes=options.max_body_bytes,
                metrics_route=options.metrics_bind is None,
            )
            if options.metrics_bind is not None:
                listener = MetricsListener(options.metrics_bind, app.service.metrics)
            announce()
            uvicorn.run(app, **uvicorn_options)
            return
        if options.metrics_bind is not None:
            listener = MetricsListener(options.metrics_bind, Metrics(folder, record=False))
        announce()
        store.close()
        os.environ[SERVE_SETTINGS_ENV] = json.dumps(
            {
                "store": store.url,
                "auth": token is not None,
                "allowed_roots": list(options.allowed_roots),
                "max_body_bytes": options.max_body_bytes,
                "debug": options.debug,
                "metrics_dir": str(folder),
                "metrics_route": options.metrics_bind is None,
                "limits": dataclasses.asdict(options.limits),
            }
        )
        uvicorn.run(
            "delta_mirror.service.app:app_from_environment",
            factory=True,
            workers=options.workers,
            **uvicorn_options,
        )
    finally:
        if listener is not None:
            listener.close()
        if folder is not None:
            with contextlib.suppress(OSError):
                shutil.rmtree(folder)


__all__ = [
    "BACKLOG",
    "KEEP_ALIVE_SECONDS",
    "LIMIT_CONCURRENCY",
    "MetricsListener",
    "ServeOptions",
    "metrics_folder",
    "parse_bind",
    "run",
]
