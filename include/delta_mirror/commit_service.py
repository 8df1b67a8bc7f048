"""The commit service: writers POST their exact commit bytes, the SQL store commits them.

The wire contract (routes, status codes, what the Delta-Spark LogStore does with each) is
``docs/commit-service.md``. The service is stateless: the ``dl_commits`` primary key decides
racing writers, so any number of processes may serve one store. Blocking store calls run in
worker threads; every error is one line of JSON whose status follows the error's type.
"""

from __future__ import annotations

import functools
import hmac
import logging
from collections.abc import Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import anyio
import anyio.to_thread
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from delta_mirror.errors import (
    CommitConflictError,
    CommitTooLargeError,
    DataError,
    MirrorError,
    PermanentError,
    TableHaltedError,
    TableNotFoundError,
    TransientError,
)
from delta_mirror.storage import normalize_commit_root
from delta_mirror.store.sql_store import CommitResult, SqlStore, default_table_name

log = logging.getLogger(__name__)

DEFAULT_MAX_BODY_BYTES = 64 << 20
RETRY_AFTER_SECONDS = 1
#: The largest Delta version (a Java ``long``, as the LogStore and the store's BIGINT hold it).
MAX_VERSION = (1 << 63) - 1
# Store calls in flight at once, at most: no more than the store's connection pool keeps open
# (``_store_threads``), so no call waits for a connection and none opens and closes an overflow
# connection per request; more requests queue here without holding a thread.
STORE_THREADS = 12
# ``delta-mirror serve --workers N``: the settings each worker process builds its app from (JSON in
# the workers' inherited environment, as private as the service's own; the token is not in it, the
# workers read DELTA_MIRROR_COMMIT_TOKEN as the service does).
SERVE_SETTINGS_ENV = "DELTA_MIRROR_SERVE_SETTINGS"
TOKEN_ENV = "DELTA_MIRROR_COMMIT_TOKEN"
T = TypeVar("T")


class UnauthorizedError(PermanentError):
    """The request has no token, or a wrong one."""


class RootNotAllowedError(PermanentError):
    """Version 0 of an unknown table whose root lies outside every ``--allow-root`` prefix."""


class NotCommittedError(PermanentError):
    """The table has no commit file for that version."""


class BadRequestError(PermanentError):
    """The request itself is malformed (no ``root``, a root that is no table URI)."""


# The status of an error is decided by its type, the first match in this order (subclasses first).
ERROR_STATUS: tuple[tuple[type[MirrorError], int, str], ...] = (
    (UnauthorizedError, 401, "unauthorized"),
    (RootNotAllowedError, 403, "root_not_allowed"),
    (NotCommittedError, 404, "not_committed"),
    (TableNotFoundError, 404, "unknown_table"),
    (CommitConflictError, 409, "version_taken"),
    (CommitTooLargeError, 413, "too_large"),
    (TableHaltedError, 423, "halted"),
    (DataError, 422, "invalid"),
    (BadRequestError, 400, "bad_request"),
    (TransientError, 503, "unavailable"),
    (MirrorError, 500, "internal"),
)


def error_response(exc: MirrorError) -> JSONResponse:
    """One line of JSON: what happened, which table and version, what to do; status by type."""
    status, code = next((s, c) for kind, s, c in ERROR_STATUS if isinstance(exc, kind))
    headers = {"Retry-After": str(RETRY_AFTER_SECONDS)} if status == 503 else None
    return JSONResponse({"error": " ".join(exc.message.split()), "code": code}, status, headers=headers)


@functools.lru_cache(maxsize=4096)
def _normalized_root(raw: str) -> str:
    """``normalize_commit_root``, remembered: resolving a local root stats every folder of its path,
    and this runs on the event loop for every request (writers commit to a few roots, again and again)."""
    return normalize_commit_root(raw)


class CommitService:
    """The routes' logic over one ``SqlStore`` (one per process, shared by every request)."""

    def __init__(
        self,
        store: SqlStore,
        *,
        token: str | None,
        allowed_roots: Sequence[str] = (),
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    ) -> None:
        self.store = store
        self._token = token.encode("utf-8") if token else None
        self.allowed_roots = tuple(normalize_commit_root(r) for r in allowed_roots)
        self.max_body_bytes = max_body_bytes
        self._limiter = anyio.CapacityLimiter(_store_threads(store))

    async def _run(self, fn: Callable[[], T]) -> T:
        return await anyio.to_thread.run_sync(fn, limiter=self._limiter)

    # -- request checks ---------------------------------------------------------------------------
    def authorize(self, request: Request) -> None:
        """``Authorization: Bearer <token>``, compared in constant time; never echoed."""
        if self._token is None:
            return
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode("utf-8"), self._token):
            raise UnauthorizedError(
                "missing or wrong token",
                hint="send Authorization: Bearer <the service's DELTA_MIRROR_COMMIT_TOKEN>",
            )

    @staticmethod
    def root(request: Request) -> str:
        raw = request.query_params.get("root")
        if not raw:
            raise BadRequestError("the query parameter 'root' is missing", hint="pass ?root=<table root URI>")
        try:
            return _normalized_root(raw)
        except PermanentError as exc:
            raise BadRequestError(exc.what, hint=exc.hint) from None

    def allowed(self, root: str) -> bool:
        return any(root == p or root.startswith(p.rstrip("/") + "/") for p in self.allowed_roots)

    def _too_large(self, version: int) -> CommitTooLargeError:
        return CommitTooLargeError(
            f"the request body is over the service's limit of {self.max_body_bytes:,} bytes",
            version=version,
            hint="raise `delta-mirror serve --max-body-bytes`, or commit less at once",
        )

    async def body(self, request: Request, version: int) -> bytes:
        """The request body, refused (413) as soon as it passes the limit, whatever the header says."""
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > self.max_body_bytes:
            raise self._too_large(version)
        chunks: list[bytes] = []
        size = 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > self.max_body_bytes:
                raise self._too_large(version)
            chunks.append(chunk)
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    def authorized(self, request: Request) -> bool:
        try:
            self.authorize(request)
        except UnauthorizedError:
            return False
        return True

    @staticmethod
    def version(request: Request) -> int:
        """The path's version: a Delta version is a non-negative 64-bit integer (Spark's ``long``)."""
        raw = request.path_params["version"]
        if not (raw.isascii() and raw.isdigit()) or int(raw) > MAX_VERSION:
            shown = raw if len(raw) <= 40 else raw[:40] + "..."
            raise BadRequestError(
                f"invalid version {shown!r}: a version is an integer from 0 to {MAX_VERSION}",
                hint="send /v1/commits/<version> with the decimal version of the commit file",
            )
        return int(raw)

    # -- routes -----------------------------------------------------------------------------------
    async def health(self, request: Request) -> Response:
        """Liveness for probes: without the token only ``{"status": ...}``; with it, what kind of
        failure, never the store's URL, host, user or database (those are in the service's log)."""
        try:
            await self._run(self.store.ensure_initialised)
        except MirrorError as exc:
            log.warning("health: %s", exc.message)
            body = {"status": "unavailable"}
            if self.authorized(request):
                body["error"] = (
                    f"the store cannot be used ({exc.error_class.value}); the service's log names the cause"
                    + (f"; {exc.hint}" if exc.hint else "")
                )
            return JSONResponse(body, 503, headers={"Retry-After": str(RETRY_AFTER_SECONDS)})
        return JSONResponse({"status": "ok"})

    async def latest(self, request: Request) -> Response:
        self.authorize(request)
        root = self.root(request)

        def read() -> dict[str, Any]:
            table = self.store.table_at(root)
            return {"table": table.name, "version": self.store.latest_version(table.id)}

        return JSONResponse(await self._run(read))

    async def get_commit(self, request: Request) -> Response:
        self.authorize(request)
        root, version = self.root(request), self.version(request)

        def read() -> tuple[bytes, str]:
            table = self.store.table_at(root)
            rows = self.store.commit_rows(table.id, version, version)
            if not rows or not rows[0].has_json:
                raise NotCommittedError(
                    "no commit file for this version in the store",
                    table=table.name,
                    version=version,
                    hint="GET /v1/latest for the newest version",
                )
            return self.store.commit_bytes(table.id, version), rows[0].sha256

        data, sha256 = await self._run(read)
        return Response(
            data, media_type="application/octet-stream", headers={"X-Delta-Mirror-Sha256": sha256}
        )

    async def post_commit(self, request: Request) -> Response:
        self.authorize(request)
        root, version = self.root(request), self.version(request)
        data = await self.body(request, version)
        allowed = self.allowed(root)

        def commit() -> CommitResult:
            try:
                return self.store.commit_verbatim(
                    root, version, data, create_name=default_table_name(root) if allowed else None
                )
            except TableNotFoundError:
                if version == 0 and not allowed:
                    raise RootNotAllowedError(
                        f"{root} is not under any root this service may create tables in",
                        version=version,
                        hint="start the service with --allow-root for it, or import the table first",
                    ) from None
                raise

        result = await self._run(commit)
        body: dict[str, Any] = {
            "table": result.table,
            "version": result.version,
            "sha256": result.sha256,
            "size": result.size,
        }
        if result.existing:
            body["existing"] = True
        return JSONResponse(body, 200 if result.existing else 201)


def _store_threads(store: SqlStore) -> int:
    """``STORE_THREADS``, or fewer when the store's pool keeps fewer connections open."""
    size = getattr(store.engine.pool, "size", None)
    return max(1, min(STORE_THREADS, size())) if callable(size) else STORE_THREADS


def _handled(route: Callable[[Request], Awaitable[Response]]) -> Callable[[Request], Awaitable[Response]]:
    async def endpoint(request: Request) -> Response:
        try:
            return await route(request)
        except MirrorError as exc:
            return error_response(exc)
        except Exception:
            log.exception("unexpected error in %s %s", request.method, request.url.path)
            return JSONResponse(
                {"error": "unexpected error in the commit service (see its log)", "code": "internal"}, 500
            )

    return endpoint


async def _http_error(request: Request, exc: Exception) -> Response:
    """Unknown routes and methods answer in the same one-line JSON as every other error."""
    assert isinstance(exc, HTTPException)
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "bad_request")
    return JSONResponse({"error": str(exc.detail), "code": code}, exc.status_code)


def create_app(
    store: SqlStore | str | None,
    *,
    token: str | None,
    allowed_roots: Sequence[str] = (),
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
) -> Starlette:
    """The ASGI app serving ``docs/commit-service.md``; ``token=None`` turns authentication off."""
    owned = not isinstance(store, SqlStore)
    sql = store if isinstance(store, SqlStore) else SqlStore(store)
    service = CommitService(sql, token=token, allowed_roots=allowed_roots, max_body_bytes=max_body_bytes)

    @asynccontextmanager
    async def lifespan(_app: Starlette) -> Any:
        log.info(
            "commit service for the store %s; tables may be created under %s; authentication %s",
            sql.display_url,
            ", ".join(service.allowed_roots) or "(no root)",
            "on" if token else "OFF",
        )
        yield
        if owned:
            sql.close()

    app = Starlette(
        routes=[
            Route("/health", _handled(service.health), methods=["GET"]),
            Route("/v1/latest", _handled(service.latest), methods=["GET"]),
            Route("/v1/commits/{version}", _handled(service.get_commit), methods=["GET"]),
            Route("/v1/commits/{version}", _handled(service.post_commit), methods=["POST"]),
        ],
        exception_handlers={HTTPException: _http_error},
        lifespan=lifespan,
    )
    app.state.service = service
    return app


def app_from_environment() -> Starlette:
    """The app of one ``delta-mirror serve --workers N`` worker process (a uvicorn factory): the
    settings from ``SERVE_SETTINGS_ENV``, the token from ``DELTA_MIRROR_COMMIT_TOKEN``."""
    import json
    import os

    settings = json.loads(os.environ[SERVE_SETTINGS_ENV])
    logging.basicConfig(  # as the CLI configures the parent process
        level=logging.DEBUG if settings.get("debug") else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    return create_app(
        settings["store"],
        token=(os.environ.get(TOKEN_ENV) or None) if settings["auth"] else None,
        allowed_roots=settings["allowed_roots"],
        max_body_bytes=settings["max_body_bytes"],
    )


__all__ = [
    "DEFAULT_MAX_BODY_BYTES",
    "ERROR_STATUS",
    "BadRequestError",
    "CommitService",
    "NotCommittedError",
    "RootNotAllowedError",
    "UnauthorizedError",
    "app_from_environment",
    "create_app",
    "error_response",
]
