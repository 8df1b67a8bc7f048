"""``POST /v1/commits/<version>`` answered from uvicorn's HTTP parser callbacks, with no ASGI.

uvicorn keeps doing what it does well (workers, lifespan, signals, graceful shutdown, keep-alive,
every other route through Starlette); for the one route a fleet of writers keeps busy,
``CommitProtocol`` skips what cost the service a third of its CPU per append (an asyncio Task, an
Event, a request/response cycle and four ASGI messages per request): the parser's callbacks collect
the body, the checks of ``CommitService.handle_post`` run in the same order, the store call goes
straight onto the store-thread queue, and its answer is written with ``transport.write``. Flow
control stays uvicorn's: a connection has at most one commit in the queue (a pipelined request
waits, reading paused, until the one before it is answered), and an answer to a writer that does
not read waits until its transport's buffer drains.

It relies on these internals of ``HttpToolsProtocol`` (uvicorn 0.54; ``pyproject.toml`` pins the
range, ``tests/test_commit_http.py`` fails loudly when they change): ``self.cycle`` (read by
``connection_lost``, ``shutdown`` and the pipelining in ``on_headers_complete``: a request object
with ``response_complete``, ``disconnected``, ``keep_alive`` and ``message_event.set()``),
``self.pipeline`` of ``(cycle, app)`` started by ``_start_asgi_task``, ``on_response_complete``
(pipelining and the keep-alive timer), ``self.flow`` and ``server_state.default_headers``.
"""

from __future__ import annotations

import logging
from typing import Any

import httptools
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from delta_mirror.commit_service import (
    _INTERNAL,
    CommitService,
    _CommitApp,
    _root_of_query,
    error_response,
)
from delta_mirror.errors import MirrorError
from delta_mirror.store.sql_store import CommitResult

log = logging.getLogger("delta_mirror.commit_service")

_PREFIX = b"/v1/commits/"
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_CLOSE = b"connection: close\r\n"
# uvicorn's default headers (date, server), rendered once per list: the server swaps the list
# every second when the date changes.
_rendered: tuple[list[tuple[bytes, bytes]], bytes] = ([], b"")


def _default_headers(headers: list[tuple[bytes, bytes]]) -> bytes:
    global _rendered
    if _rendered[0] is not headers:
        _rendered = (headers, b"".join(b"%s: %s\r\n" % (name, value) for name, value in headers))
    return _rendered[1]


def _service_of(app: Any) -> CommitService | None:
    """The ``CommitService`` behind uvicorn's loaded app (under its proxy-headers middleware)."""
    for _ in range(8):
        if isinstance(app, _CommitApp):
            return app.service
        app = getattr(app, "app", None)
    return None


class CommitProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, with ``POST /v1/commits/<version>`` answered by ``_Commit``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.service = _service_of(self.app)
        self._after_drain: Any = None

    def on_headers_complete(self) -> None:
        service = self.service
        parser = self.parser
        url = self.url
        if (
            service is None
            or not url.startswith(_PREFIX)
            or parser.get_method() != b"POST"
            or parser.should_upgrade()
            or self.access_log  # the access log's line, written by uvicorn's own cycle
            or self.limit_concurrency is not None  # uvicorn's 503 when over the limit
            or self.root_path
        ):
            super().on_headers_complete()
            return
        parsed = httptools.parse_url(url)
        raw = parsed.path[len(_PREFIX) :]
        if not raw or b"/" in raw or b"%" in raw or not raw.isascii():
            super().on_headers_complete()  # Starlette's 404, or a quoted path: the ASGI route
            return
        authorization = declared = b""
        for name, value in self.headers:
            if name == b"authorization":
                authorization = value
            elif name == b"content-length":
                declared = value
        commit = _Commit(
            self,
            service,
            raw.decode("ascii"),
            parsed.query or b"",
            authorization,
            declared,
            keep_alive=parser.get_http_version() != "1.0" and parser.should_keep_alive(),
            expect_100=self.expect_100_continue,
        )
        previous = self.cycle
        self.cycle = commit  # type: ignore[assignment]
        if previous is None or previous.response_complete:
            commit.start()
        else:  # pipelined: answered in order, after the request before it
            self.flow.pause_reading()
            self.pipeline.appendleft((commit, None))  # type: ignore[arg-type]

    def _start_asgi_task(self, cycle: Any, app: Any) -> None:
        if type(cycle) is _Commit:
            cycle.start()
        else:
            super()._start_asgi_task(cycle, app)

    def on_body(self, body: bytes) -> None:
        cycle: Any = self.cycle
        if type(cycle) is _Commit:
            cycle.feed(body)
        else:
            super().on_body(body)

    def on_message_complete(self) -> None:
        cycle: Any = self.cycle
        if type(cycle) is _Commit:
            cycle.body_complete()
        else:
            super().on_message_complete()

    def resume_writing(self) -> None:
        super().resume_writing()
        after, self._after_drain = self._after_drain, None
        if after is not None:
            after()


class _Commit:
    """One ``POST /v1/commits/<version>``, standing where uvicorn keeps its request cycle."""

    __slots__ = (
        "accepted",
        "authorization",
        "chunks",
        "complete",
        "declared",
        "disconnected",
        "expect_100",
        "keep_alive",
        "message_event",
        "over_limit",
        "protocol",
        "query",
        "raw_version",
        "response_complete",
        "root",
        "service",
        "size",
        "version",
    )

    def __init__(
        self,
        protocol: CommitProtocol,
        service: CommitService,
        raw_version: str,
        query: bytes,
        authorization: bytes,
        declared: bytes,
        *,
        keep_alive: bool,
        expect_100: bool,
    ) -> None:
        self.protocol = protocol
        self.service = service
        self.raw_version = raw_version
        self.query = query
        self.authorization = authorization
        self.declared = declared
        self.keep_alive = keep_alive  # uvicorn's shutdown() sets it False: close after the answer
        self.expect_100 = expect_100
        self.response_complete = False
        self.disconnected = False  # set by uvicorn's connection_lost
        self.message_event = self  # connection_lost calls message_event.set()
        self.chunks: list[bytes] = []
        self.size = 0
        self.over_limit = False
        self.complete = False  # the whole body is in
        self.accepted = False  # the checks passed; the body goes to the store when complete
        self.root = ""
        self.version = 0

    def set(self) -> None:
        """Nothing waits on this request: its store call's answer checks ``disconnected``."""

    # -- the request, as the parser delivers it ----------------------------------------------------
    def feed(self, chunk: bytes) -> None:
        if self.response_complete or self.over_limit:
            return
        self.size += len(chunk)
        if self.size > self.service.max_body_bytes:
            self.over_limit = True
            self.chunks = []
            if self.accepted:
                self.refuse(self.service._too_large(self.version))
            return
        self.chunks.append(chunk)

    def body_complete(self) -> None:
        if self.response_complete:
            return
        self.complete = True
        if self.accepted:
            self.submit()

    def start(self) -> None:
        """Its turn on the connection: the checks of ``handle_post`` in the same order, then the body."""
        service = self.service
        try:
            service.check_authorization(self.authorization.decode("latin-1"))
            self.root = service.root_of(_root_of_query(self.query))
            self.version = version = service.version_of(self.raw_version)
            declared = self.declared.decode("latin-1")
            if self.over_limit or (declared.isdigit() and int(declared) > service.max_body_bytes):
                raise service._too_large(version)
        except MirrorError as exc:
            self.refuse(exc)
            return
        except Exception:
            log.exception("unexpected error in POST /v1/commits/%s", self.raw_version)
            self.answer(_INTERNAL.status_code, bytes(_INTERNAL.body), _headers(_INTERNAL.raw_headers))
            return
        self.accepted = True
        if self.expect_100 and not self.protocol.transport.is_closing():
            self.protocol.transport.write(_CONTINUE)
        if self.complete:
            self.submit()

    def submit(self) -> None:
        chunks = self.chunks
        data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        self.chunks = []
        self.service.threads.submit(
            self.service.commit_call(self.root, self.version, data), self.protocol.loop, self.committed
        )

    # -- the answer ----------------------------------------------------------------------------------
    def committed(self, result: CommitResult | None, error: BaseException | None) -> None:
        """On the event loop, after the store call (a writer that hung up meanwhile gets nothing)."""
        if self.disconnected:
            return
        if error is None:
            assert result is not None
            status, body = self.service.commit_answer(result)
            self.answer(status, body, b"content-length: %d\r\ncontent-type: application/json\r\n" % len(body))
        elif isinstance(error, MirrorError):
            self.refuse(error)
        else:
            log.error("unexpected error in POST /v1/commits/%s", self.raw_version, exc_info=error)
            self.answer(_INTERNAL.status_code, bytes(_INTERNAL.body), _headers(_INTERNAL.raw_headers))

    def refuse(self, exc: MirrorError) -> None:
        response = error_response(exc)
        self.answer(response.status_code, bytes(response.body), _headers(response.raw_headers))

    def answer(self, status: int, body: bytes, headers: bytes) -> None:
        """The response as uvicorn writes it: status line, its default headers, then ours."""
        protocol = self.protocol
        if self.disconnected:
            return
        if protocol.flow.write_paused:  # the writer reads slowly: answer once its buffer drains
            protocol._after_drain = lambda: self.answer(status, body, headers)
            return
        self.response_complete = True
        protocol.transport.write(
            b"".join(
                (
                    STATUS_LINE[status],
                    _default_headers(protocol.server_state.default_headers),
                    headers,
                    b"" if self.keep_alive else _CLOSE,
                    b"\r\n",
                    body,
                )
            )
        )
        if not self.keep_alive:
            protocol.transport.close()
        protocol.on_response_complete()


def _headers(raw_headers: list[tuple[bytes, bytes]]) -> bytes:
    """A Starlette response's headers, in its order, as uvicorn writes them."""
    return b"".join(b"%s: %s\r\n" % (n, v) for n, v in raw_headers)


__all__ = ["CommitProtocol"]
