"""The commit service's ASGI app: Starlette for the lifespan and the GET routes, and
``POST /v1/commits/<version>`` answered by ``CommitService.handle_post`` before Starlette's
middleware and router (they cost about a tenth of the service's CPU per append: docs/commit-service.md,
"Where the time goes"). Any ASGI server can run it; ``delta-mirror serve`` runs it under uvicorn
(``server.py``).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from delta_mirror.errors import MirrorError
from delta_mirror.service import guard
from delta_mirror.service.auth import TOKEN_ENV
from delta_mirror.service.errors import json_body
from delta_mirror.service.metrics import Metrics
from delta_mirror.service.routes import (
    DEFAULT_MAX_BODY_BYTES,
    CommitService,
    error_response,
    internal_response,
    log,
)
from delta_mirror.store.sql_store import SqlStore

# ``delta-mirror serve --workers N``: the settings each worker process builds its app from (JSON in
# the workers' inherited environment, as private as the service's own; the token is not in it, the
# workers read DELTA_MIRROR_COMMIT_TOKEN as the service does).
SERVE_SETTINGS_ENV = "DELTA_MIRROR_SERVE_SETTINGS"
_COMMITS = "/v1/commits/"


class CommitApp(Starlette):
    """Starlette, with ``POST /v1/commits/<version>`` answered before its middleware and router;
    every other request, and the lifespan, go through Starlette."""

    service: CommitService

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            path: str = scope["path"]
            if path.startswith(_COMMITS) and len(path) > len(_COMMITS) and "/" not in path[len(_COMMITS) :]:
                await self.service.handle_post(scope, receive, send, path[len(_COMMITS) :])
                return
        await super().__call__(scope, receive, send)


def _handled(route: Callable[[Request], Awaitable[Response]]) -> Callable[[Request], Awaitable[Response]]:
    async def endpoint(request: Request) -> Response:
        try:
            return await route(request)
        except MirrorError as exc:
            return error_response(exc)
        except Exception:
            log.exception("unexpected error in %s %s", request.method, request.url.path)
            return internal_response()

    return endpoint


async def _http_error(request: Request, exc: Exception) -> Response:
    """Unknown routes and methods answer in the same one-line JSON as every other error."""
    assert isinstance(exc, HTTPException)
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "bad_request")
    body = json_body({"error": str(exc.detail), "code": code})
    return Response(body, exc.status_code, media_type="application/json")


def create_app(
    store: SqlStore | str | None,
    *,
    token: str | None,
    allowed_roots: Sequence[str] = (),
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    metrics_dir: Path | None = None,
    metrics_route: bool = True,
) -> CommitApp:
    """The ASGI app serving ``docs/commit-service.md``; ``token=None`` turns authentication off.

    ``metrics_dir``: the folder the service's worker processes share their metrics in (``None``: one
    process); ``metrics_route=False`` leaves ``GET /metrics`` off this app (``--metrics-bind``).
    """
    owned = not isinstance(store, SqlStore)
    sql = store if isinstance(store, SqlStore) else SqlStore(store)
    metrics = Metrics(metrics_dir)
    service = CommitService(
        sql, token=token, allowed_roots=allowed_roots, max_body_bytes=max_body_bytes, metrics=metrics
    )

    @asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        log.info(
            "commit service for the store %s; tables may be created under %s; authentication %s",
            sql.display_url,
            ", ".join(service.allowed_roots) or "(no root)",
            "on" if token else "OFF",
        )
        yield
        service.threads.stop()
        metrics.close()
        if owned:
            sql.close()

    routes = [
        Route("/health", _handled(service.health), methods=["GET"]),
        Route("/v1/latest", _handled(service.latest), methods=["GET"]),
        Route("/v1/commits/{version}", _handled(service.get_commit), methods=["GET"]),
    ]
    if metrics_route:
        routes.append(Route("/metrics", _handled(service.metrics_page), methods=["GET"]))
    app = CommitApp(routes=routes, exception_handlers={HTTPException: _http_error}, lifespan=lifespan)
    app.state.service = app.service = service
    return app


def app_from_environment() -> CommitApp:
    """The app of one ``delta-mirror serve --workers N`` worker process (a uvicorn factory): the
    settings from ``SERVE_SETTINGS_ENV``, the token from ``DELTA_MIRROR_COMMIT_TOKEN``."""
    settings = json.loads(os.environ[SERVE_SETTINGS_ENV])
    logging.basicConfig(  # as the CLI configures the parent process
        level=logging.DEBUG if settings.get("debug") else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    metrics_dir = settings.get("metrics_dir")
    guard.configure(guard.ConnectionLimits(**settings.get("limits", {})))
    return create_app(
        settings["store"],
        token=(os.environ.get(TOKEN_ENV) or None) if settings["auth"] else None,
        allowed_roots=settings["allowed_roots"],
        max_body_bytes=settings["max_body_bytes"],
        metrics_dir=Path(metrics_dir) if metrics_dir else None,
        metrics_route=settings.get("metrics_route", True),
    )


__all__ = ["SERVE_SETTINGS_ENV", "CommitApp", "app_from_environment", "create_app"]
