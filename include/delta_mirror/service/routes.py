"""The commit service's routes over one ``SqlStore``: what each request checks and answers.

The wire contract (routes, status codes, what the Delta-Spark LogStore does with each) is
``docs/commit-service.md``. ``POST /v1/commits/<version>``, the route a fleet of writers keeps busy,
is a bare ASGI handler (``CommitService.handle_post``) that ``app.CommitApp`` calls before
Starlette's middleware and router; the other routes are Starlette endpoints. Every check runs in the
same order on every route (token, root, version, body limit) and every error is one line of JSON
whose status follows the error's type (``errors.ERROR_STATUS``).
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Callable, Sequence
from typing import Any, TypeVar
from urllib.parse import parse_qsl

from starlette.requests import Request
from starlette.responses import Response

from delta_mirror.delta.locations import normalize_table_root
from delta_mirror.errors import (
    CommitTooLargeError,
    MirrorError,
    PermanentError,
    StoreBehindError,
    TableNotFoundError,
    VersionGapError,
)
from delta_mirror.jobs.published_frontier import PublishedFrontiers, recover_hint
from delta_mirror.service.auth import TokenCheck
from delta_mirror.service.errors import (
    INTERNAL_BODY,
    RETRY_AFTER_SECONDS,
    BadRequestError,
    NotCommittedError,
    RootNotAllowedError,
    error_answer,
    json_body,
)
from delta_mirror.service.metrics import CONTENT_TYPE, Metrics
from delta_mirror.service.store_threads import StoreThreads
from delta_mirror.store.connection_events import on_dead_connection
from delta_mirror.store.sql_store import CommitResult, SqlStore, default_table_name

log = logging.getLogger("delta_mirror.service")

DEFAULT_MAX_BODY_BYTES = 64 << 20
#: The largest Delta version (a Java ``long``, as the LogStore and the store's BIGINT hold it).
MAX_VERSION = (1 << 63) - 1
# Store calls in flight at once, at most: no more than the store's connection pool keeps open
# (``_store_threads``), so no call waits for a connection and none opens and closes an overflow
# connection per request; more requests queue without holding a thread.
STORE_THREADS = 12
T = TypeVar("T")

_JSON = [(b"content-type", b"application/json")]


def error_response(exc: MirrorError) -> Response:
    """One line of JSON: what happened, which table and version, what to do; status by type."""
    status, body, headers = error_answer(exc)
    return Response(
        body, status, headers={k.decode(): v.decode() for k, v in headers}, media_type="application/json"
    )


def internal_response() -> Response:
    return Response(INTERNAL_BODY, 500, media_type="application/json")


#: Entries of each cache keyed by what a client sends, and the longest key remembered: the caches
#: hold at most ``CACHE_ENTRIES * CACHE_KEY_CHARS`` characters of keys whatever the clients send
#: (a longer query or root is parsed every time).
CACHE_ENTRIES = 1024
CACHE_KEY_CHARS = 2048


def _root_of_query(query: bytes) -> str | None:
    """The ``root`` parameter of a raw query string (the last one, as Starlette's ``query_params``
    reads it), remembered when short: writers send the same few query strings again and again."""
    return _root_of_short_query(query) if len(query) <= CACHE_KEY_CHARS else _parse_root(query)


def _parse_root(query: bytes) -> str | None:
    found = None
    for key, value in parse_qsl(query.decode("latin-1"), keep_blank_values=True):
        if key == "root":
            found = value
    return found


_root_of_short_query = functools.lru_cache(maxsize=CACHE_ENTRIES)(_parse_root)


@functools.lru_cache(maxsize=CACHE_ENTRIES)
def _json_string(text: str) -> str:
    """``text`` as a JSON string, as ``json_body`` renders it, remembered (a few table names)."""
    return json.dumps(text, ensure_ascii=False)


def _normalized_root(raw: str) -> str:
    """``normalize_table_root``, remembered for short roots: resolving a local root stats every folder
    of its path, and this runs on the event loop for every request (writers commit to a few roots,
    again and again)."""
    return _normalized_short_root(raw) if len(raw) <= CACHE_KEY_CHARS else normalize_table_root(raw)


_normalized_short_root = functools.lru_cache(maxsize=CACHE_ENTRIES)(normalize_table_root)


class CommitService:
    """The routes' logic over one ``SqlStore`` (one per process, shared by every request)."""

    def __init__(
        self,
        store: SqlStore,
        *,
        token: str | None,
        allowed_roots: Sequence[str] = (),
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        metrics: Metrics | None = None,
        frontiers: PublishedFrontiers | None = None,
    ) -> None:
        self.store = store
        # what of each table is published: no version is accepted while its <v>.json exists with
        # other bytes (a store behind its log after a failover or a restore)
        self.frontiers = frontiers or PublishedFrontiers()
        self.auth = TokenCheck(token)
        self.allowed_roots = tuple(normalize_table_root(r) for r in allowed_roots)
        self.max_body_bytes = max_body_bytes
        self.metrics = metrics or Metrics()
        self.threads = StoreThreads(_store_threads(store))
        on_dead_connection(store.engine, self.metrics.store_reconnected)
        on_dead_connection(store.engine, self.frontiers.forget)  # perhaps a promoted standby now

    # -- request checks ---------------------------------------------------------------------------
    def authorize(self, request: Request) -> None:
        """``Authorization: Bearer <token>``, compared in constant time; never echoed."""
        self.auth.check(request.headers.get("authorization", ""))

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

    def too_large(self, version: int) -> CommitTooLargeError:
        return CommitTooLargeError(
            f"the request body is over the service's limit of {self.max_body_bytes:,} bytes",
            version=version,
            hint="raise `delta-mirror serve --max-body-bytes`, or commit less at once",
        )

    @staticmethod
    def version_of(raw: str) -> int:
        """The path's version: a Delta version is a non-negative 64-bit integer (Spark's ``long``)."""
        if not (0 < len(raw) <= 19 and raw.isascii() and raw.isdigit()) or int(raw) > MAX_VERSION:
            shown = raw if len(raw) <= 40 else raw[:40] + "..."
            raise BadRequestError(
                f"invalid version {shown!r}: a version is an integer from 0 to {MAX_VERSION}",
                hint="send /v1/commits/<version> with the decimal version of the commit file",
            )
        return int(raw)

    # -- GET routes (Starlette endpoints) ---------------------------------------------------------
    async def health(self, request: Request) -> Response:
        """Liveness for probes: without the token only ``{"status": ...}``; with it, what kind of
        failure, never the store's URL, host, user or database (those are in the service's log)."""
        try:
            await self.threads.run(self.store.ensure_initialised)
        except MirrorError as exc:
            log.warning("health: %s", exc.message)
            body = {"status": "unavailable"}
            if self.auth.accepts(request.headers.get("authorization", "")):
                body["error"] = (
                    f"the store cannot be used ({exc.error_class.value}); the service's log names the cause"
                    + (f"; {exc.hint}" if exc.hint else "")
                )
            return _json(body, 503, {"Retry-After": str(RETRY_AFTER_SECONDS)})
        return _json({"status": "ok"})

    async def latest(self, request: Request) -> Response:
        self.authorize(request)
        root = self.root(request)

        def read() -> dict[str, Any]:
            table = self.store.table_at(root)
            return {"table": table.name, "version": self.store.latest_version(table.id)}

        return _json(await self.threads.run(read))

    async def get_commit(self, request: Request) -> Response:
        self.authorize(request)
        root, version = self.root(request), self.version_of(request.path_params["version"])

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

        data, sha256 = await self.threads.run(read)
        return Response(
            data, media_type="application/octet-stream", headers={"X-Delta-Mirror-Sha256": sha256}
        )

    async def metrics_page(self, _request: Request) -> Response:
        """``GET /metrics`` (no token: it names no table, root or secret)."""
        return Response(self.metrics.exposition(), media_type=CONTENT_TYPE)

    # -- POST /v1/commits/<version> (bare ASGI) ---------------------------------------------------
    async def handle_post(self, scope: dict[str, Any], receive: Any, send: Any, raw_version: str) -> None:
        """Commit the request body as ``raw_version`` of the table at ``?root=``: 201, or 200 with
        ``"existing":true``, or an error by type. The writer hanging up before its body is in
        commits and answers nothing."""
        metrics = self.metrics
        started = metrics.commit_started()
        try:
            answer = await self._post(scope, receive, raw_version)
        except BaseException:
            metrics.commit_abandoned()  # cancelled: the server is going away
            raise
        if answer is None:
            metrics.commit_abandoned()
            return
        status, body, headers = answer
        metrics.commit_answered(status, started)
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [(b"content-length", b"%d" % len(body)), *_JSON, *headers],
            }
        )
        await send({"type": "http.response.body", "body": body})

    async def _post(
        self, scope: dict[str, Any], receive: Any, raw_version: str
    ) -> tuple[int, bytes, list[tuple[bytes, bytes]]] | None:
        try:
            authorization = declared = ""
            for name, value in scope["headers"]:
                if name == b"authorization":
                    authorization = value.decode("latin-1")
                elif name == b"content-length":
                    declared = value.decode("latin-1")
            self.auth.check(authorization)
            root = self.root_of(_root_of_query(scope["query_string"]))
            version = self.version_of(raw_version)
            if declared.isdigit() and int(declared) > self.max_body_bytes:
                raise self.too_large(version)
            chunks: list[bytes] = []
            size = 0
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    return None  # the writer is gone: nothing to answer, nothing committed
                chunk = message.get("body", b"")
                size += len(chunk)
                if size > self.max_body_bytes:
                    raise self.too_large(version)
                chunks.append(chunk)
                if not message.get("more_body", False):
                    break
            data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
            result = await self.threads.run(self._commit_call(root, version, data))
        except MirrorError as exc:
            return error_answer(exc)
        except Exception:
            log.exception("unexpected error in POST %s", scope.get("path"))
            return 500, INTERNAL_BODY, []
        return self.commit_answer(result)

    def _commit_call(self, root: str, version: int, data: bytes) -> Callable[[], CommitResult]:
        """The store call committing ``data`` as ``version`` (run on a store thread)."""
        allowed = self.allowed(root)

        def commit() -> CommitResult:
            try:
                self.frontiers.check(root, version, data)
            except StoreBehindError as exc:
                if self._refusal_stands(exc, root, version):
                    raise
                # The store has the version (recovered, or another replica's writer won it and its
                # LogStore published it): the store's own answer, 200 existing or 409 conflict.
            try:
                result = self.store.commit_verbatim(
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
            except VersionGapError as gap:  # after a lost tail the writer lists it and asks beyond it
                self.frontiers.refuse_if_tail_lost(root, gap.table, gap.next_version)
                raise
            self.frontiers.acknowledged(root, version)
            return result

        return commit

    def _refusal_stands(self, exc: StoreBehindError, root: str, version: int) -> bool:
        """False when the store already holds ``version`` at ``root`` (its own answer decides);
        else the refusal names the table and the command that recovers it. Read only when refusing."""
        try:
            table = self.store.table_at(root)
        except MirrorError:
            return True
        try:
            latest = self.store.latest_version(table.id)
        except MirrorError:
            latest = None
        if latest is not None and latest >= version:
            return False
        exc.table, exc.hint = table.name, recover_hint(table.name)
        return True

    @staticmethod
    def commit_answer(result: CommitResult) -> tuple[int, bytes, list[tuple[bytes, bytes]]]:
        """201, or 200 with ``"existing":true``, and the JSON body."""
        # The bytes json_body renders for these keys, formatted directly (json.dumps took a tenth of
        # the event loop's time per append); only the table name needs escaping.
        body = (
            f'{{"table":{_json_string(result.table)},"version":{result.version:d},'
            f'"sha256":"{result.sha256}","size":{result.size:d}'
            + (',"existing":true}' if result.existing else "}")
        ).encode("utf-8")
        return (200 if result.existing else 201), body, []


def _json(content: object, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(json_body(content), status, headers=headers, media_type="application/json")


def _store_threads(store: SqlStore) -> int:
    """``STORE_THREADS``, or fewer when the store's pool keeps fewer connections open."""
    size = getattr(store.engine.pool, "size", None)
    return max(1, min(STORE_THREADS, size())) if callable(size) else STORE_THREADS


__all__ = [
    "DEFAULT_MAX_BODY_BYTES",
    "MAX_VERSION",
    "CommitService",
    "error_response",
    "internal_response",
]
