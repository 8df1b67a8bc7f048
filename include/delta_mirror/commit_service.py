"""The commit service: writers POST their exact commit bytes, the SQL store commits them.

The wire contract (routes, status codes, what the Delta-Spark LogStore does with each) is
``docs/commit-service.md``. The service is stateless: the ``dl_commits`` primary key decides
racing writers, so any number of processes may serve one store. Blocking store calls run on a
fixed set of store threads; every error is one line of JSON whose status follows the error's type.

``POST /v1/commits/<version>`` (the one route a fleet of writers keeps busy) is answered under
``delta-mirror serve`` by ``commit_http.CommitProtocol`` straight from uvicorn's HTTP parser, and
under any other ASGI server by a thin handler in front of Starlette (``_CommitApp``): the same
checks, the same bytes, one queue hop to a store thread and back. Where a commit's time goes is in
``docs/commit-service.md`` ("Where the time goes").
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hmac
import json
import logging
import queue
import threading
from collections.abc import Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any, TypeVar
from urllib.parse import parse_qsl

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
#: Seconds an idle keep-alive connection stays open (uvicorn's default is 5: a writer committing
#: every few seconds would reconnect for nearly every commit).
KEEP_ALIVE_SECONDS = 75
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
def _root_of_query(query: bytes) -> str | None:
    """The ``root`` parameter of a raw query string (the last one, as Starlette's ``query_params``
    reads it), remembered: writers send the same few query strings again and again."""
    found = None
    for key, value in parse_qsl(query.decode("latin-1"), keep_blank_values=True):
        if key == "root":
            found = value
    return found


class _StoreThreads:
    """Blocking store calls on ``size`` long-lived threads fed by one queue; each result comes back to
    the event loop with ``call_soon_threadsafe``. This is the whole hop: anyio's ``to_thread`` (a
    capacity limiter, a cancel scope and run-variable lookups per call) cost the event loop more
    than the store call itself on an append (docs/commit-service.md, "Where the time goes")."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._queue: queue.SimpleQueue[_Call | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()

    async def run(self, fn: Callable[[], T]) -> T:
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self.submit(fn, future.get_loop(), functools.partial(_settle, future))
        return await future

    def submit(
        self,
        fn: Callable[[], T],
        loop: asyncio.AbstractEventLoop,
        done: Callable[[T | None, BaseException | None], None],
    ) -> None:
        """Run ``fn`` on a store thread, then ``done(result, error)`` on ``loop`` (no future, no task:
        the commit route's protocol answers from ``done`` itself, ``delta_mirror.commit_http``)."""
        if len(self._threads) < self.size:
            self._start()
        self._queue.put((fn, loop, done))

    def _start(self) -> None:
        with self._lock:
            while len(self._threads) < self.size:
                t = threading.Thread(target=self._work, name="store-call", daemon=True)
                t.start()
                self._threads.append(t)

    def _work(self) -> None:
        while (item := self._queue.get()) is not None:
            fn, loop, done = item
            try:
                result, error = fn(), None
            except BaseException as exc:  # handed to the waiting request, answered there
                result, error = None, exc
            with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits for this answer
                loop.call_soon_threadsafe(done, result, error)

    def stop(self) -> None:
        """Let every call already queued finish (a commit whose writer hung up still completes), then
        end the threads; the store may be closed after this returns."""
        with self._lock:
            threads, self._threads = self._threads, []
            for _ in threads:
                self._queue.put(None)
        for t in threads:
            t.join()


_Call = tuple[Callable[[], Any], asyncio.AbstractEventLoop, Callable[[Any, "BaseException | None"], None]]


def _settle(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if future.done():  # the request was cancelled meanwhile
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


@functools.lru_cache(maxsize=4096)
def _json_string(text: str) -> str:
    """``text`` as a JSON string, as JSONResponse renders it, remembered (a few table names)."""
    return json.dumps(text, ensure_ascii=False)


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
        self.threads = _StoreThreads(_store_threads(store))

    async def _run(self, fn: Callable[[], T]) -> T:
        return await self.threads.run(fn)

    # -- request checks ---------------------------------------------------------------------------
    def authorize(self, request: Request) -> None:
        """``Authorization: Bearer <token>``, compared in constant time; never echoed."""
        self.check_authorization(request.headers.get("authorization", ""))

    def check_authorization(self, header: str) -> None:
        if self._token is None:
            return
        scheme, _, given = header.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode("utf-8"), self._token):
            raise UnauthorizedError(
                "missing or wrong token",
                hint="send Authorization: Bearer <the service's DELTA_MIRROR_COMMIT_TOKEN>",
            )

    @staticmethod
    def root(request: Request) -> str:
        return CommitService.root_of(_root_of_query(request.scope["query_string"]))

    @staticmethod
    def root_of(raw: str | None) -> str:
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
        return CommitService.version_of(request.path_params["version"])

    @staticmethod
    def version_of(raw: str) -> int:
        """The path's version: a Delta version is a non-negative 64-bit integer (Spark's ``long``)."""
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

    async def post_commit(self, root: str, version: int, data: bytes) -> tuple[int, bytes]:
        """Commit ``data`` as ``version`` of the table at ``root``: the status and the JSON body."""
        return self.commit_answer(await self._run(self.commit_call(root, version, data)))

    def commit_call(self, root: str, version: int, data: bytes) -> Callable[[], CommitResult]:
        """The store call committing ``data`` as ``version`` (run on a store thread)."""
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

        return commit

    @staticmethod
    def commit_answer(result: CommitResult) -> tuple[int, bytes]:
        """The status and JSON body answering a commit: 201, or 200 with ``"existing":true``."""
        # The bytes Starlette's JSONResponse renders for these keys, formatted directly (json.dumps
        # took a tenth of the event loop's time per append); only the table name needs escaping.
        body = (
            f'{{"table":{_json_string(result.table)},"version":{result.version:d},'
            f'"sha256":"{result.sha256}","size":{result.size:d}'
            + (',"existing":true}' if result.existing else "}")
        ).encode("utf-8")
        return (200 if result.existing else 201), body

    async def handle_post(self, scope: dict[str, Any], receive: Any, send: Any, raw_version: str) -> None:
        """``POST /v1/commits/<version>`` as a bare ASGI handler: the checks of every route (token,
        root, version, body limit) in the same order, the same one-line JSON errors."""
        try:
            authorization = declared = ""
            for name, value in scope["headers"]:
                if name == b"authorization":
                    authorization = value.decode("latin-1")
                elif name == b"content-length":
                    declared = value.decode("latin-1")
            self.check_authorization(authorization)
            root = self.root_of(_root_of_query(scope["query_string"]))
            version = self.version_of(raw_version)
            if declared.isdigit() and int(declared) > self.max_body_bytes:
                raise self._too_large(version)
            chunks: list[bytes] = []
            size = 0
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    return  # the writer is gone: nothing to answer, nothing committed
                chunk = message.get("body", b"")
                size += len(chunk)
                if size > self.max_body_bytes:
                    raise self._too_large(version)
                chunks.append(chunk)
                if not message.get("more_body", False):
                    break
            status, body = await self.post_commit(
                root, version, chunks[0] if len(chunks) == 1 else b"".join(chunks)
            )
        except MirrorError as exc:
            await error_response(exc)(scope, receive, send)
            return
        except Exception:
            log.exception("unexpected error in POST %s", scope.get("path"))
            await _INTERNAL(scope, receive, send)
            return
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    (b"content-length", str(len(body)).encode()),
                    (b"content-type", b"application/json"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})


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


_INTERNAL = JSONResponse(
    {"error": "unexpected error in the commit service (see its log)", "code": "internal"}, 500
)


class _CommitApp(Starlette):
    """Starlette, with ``POST /v1/commits/<version>`` answered before its middleware and router
    (``CommitService.handle_post``); every other request, and the lifespan, go through Starlette."""

    service: CommitService

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            path: str = scope["path"]
            if path.startswith(_COMMITS) and len(path) > len(_COMMITS) and "/" not in path[len(_COMMITS) :]:
                await self.service.handle_post(scope, receive, send, path[len(_COMMITS) :])
                return
        await super().__call__(scope, receive, send)


_COMMITS = "/v1/commits/"


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
        service.threads.stop()
        if owned:
            sql.close()

    app = _CommitApp(
        routes=[
            Route("/health", _handled(service.health), methods=["GET"]),
            Route("/v1/latest", _handled(service.latest), methods=["GET"]),
            Route("/v1/commits/{version}", _handled(service.get_commit), methods=["GET"]),
        ],
        exception_handlers={HTTPException: _http_error},
        lifespan=lifespan,
    )
    app.state.service = app.service = service
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
    "KEEP_ALIVE_SECONDS",
    "BadRequestError",
    "CommitService",
    "NotCommittedError",
    "RootNotAllowedError",
    "UnauthorizedError",
    "app_from_environment",
    "create_app",
    "error_response",
]
