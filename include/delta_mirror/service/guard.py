"""Connection limits uvicorn has no option for: the time and bytes a client may take to send a
request's head, and the time to send its body.

uvicorn closes an idle keep-alive connection only after a response, caps no header size with
httptools, and has no deadline for a head or a body: a connection that sends nothing, or a head
that never ends, stays open and grows. The guard is an event loop (uvicorn's public ``loop``
option takes the import string of a callable making a loop, ``LOOP`` here) whose ``create_server`` wraps each
connection's protocol in ``GuardedProtocol``: it forwards every call unchanged and follows the
request stream with its own parser (``httptools``, not uvicorn's) to know when a head begins and
ends and when a body is complete. A connection over a limit is answered ``431`` (a head over
``max_head_bytes``) or ``408`` (a head or body not in within its time), in one line of JSON when
no answer is under way, and closed. Built on public asyncio, uvloop and httptools APIs only.

Limits per connection, checked by one sweep per second: the first request's head must be in
within ``head_seconds`` of connecting (a silent connection is closed then), a later one within
``head_seconds`` of its first byte; a body within ``body_seconds`` of its head.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import httptools

log = logging.getLogger("delta_mirror.service")

SWEEP_SECONDS = 1.0
#: uvicorn is handed a connection's bytes this many at a time, and no more while it holds
#: ``MAX_QUEUED`` requests it has not begun to answer (``GuardedProtocol.deliver``).
SLICE_BYTES = 4096
MAX_QUEUED = 8
_ANSWER, _INTERIM = b"HTTP/1.1 ", b"HTTP/1.1 1"


@dataclass(frozen=True)
class ConnectionLimits:
    """What one connection may take; ``docs/commit-service.md`` ("Security") lists the defaults."""

    max_head_bytes: int = 64 << 10
    head_seconds: float = 10.0
    body_seconds: float = 120.0


def _answer(status: int, reason: str, message: str, code: str) -> bytes:
    body = f'{{"error":"{message}","code":"{code}"}}'.encode()
    return (
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    ).encode() + body


HEAD_TOO_LARGE = "request_header_too_large"
TIMEOUT = "request_timeout"

_IDLE, _HEAD, _BODY = 0, 1, 2


class GuardedProtocol(asyncio.Protocol):
    """Forwards every call to ``inner`` (uvicorn's protocol) and keeps the limits above."""

    def __init__(self, inner: asyncio.Protocol, guard: Guard) -> None:
        self.inner = inner
        self.guard = guard
        self.transport: asyncio.Transport | None = None
        self.parser: Any = httptools.HttpRequestParser(self)
        self.phase = _HEAD  # the first head is due from the moment the connection opens
        self.deadline = time.monotonic() + guard.limits.head_seconds
        self.head_bytes = 0
        self.begun = self.completed = 0  # requests begun and complete on this connection
        self.began_here = False  # a head began in the chunk being parsed
        self.paused = False  # uvicorn stopped reading (its requests queue): no deadline runs
        self.closed = False
        # What uvicorn was handed: the heads in it (a parser of their own) and the answers it began.
        self.handed: Any = httptools.HttpRequestParser(_Heads(self))
        self.heads = self.answers = 0
        self.held = bytearray()  # received, not yet handed to uvicorn (``deliver``)
        self.holding = False  # the transport paused by the guard, not by uvicorn

    # -- httptools callbacks ----------------------------------------------------------------------
    def on_message_begin(self) -> None:
        self.begun += 1
        self.began_here = True
        if self.phase == _IDLE:
            self.phase, self.head_bytes = _HEAD, 0
            self.deadline = time.monotonic() + self.guard.limits.head_seconds

    def on_headers_complete(self) -> None:
        self.phase = _BODY
        self.deadline = time.monotonic() + self.guard.limits.body_seconds

    def on_message_complete(self) -> None:
        self.completed += 1
        self.phase = _IDLE

    # -- asyncio.Protocol, forwarded ----------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport = cast(asyncio.Transport, transport)  # uvloop's transports are not asyncio's classes
        self.transport = transport
        self.guard.connections.add(self)
        self.inner.connection_made(cast(asyncio.Transport, _ReadingWatch(transport, self)))

    def data_received(self, data: bytes) -> None:
        if self.parser is not None:
            before, self.began_here = self.phase, False
            try:
                self.parser.feed_data(data)
            except httptools.HttpParserUpgrade:
                self.parser = None  # an upgrade: uvicorn's to answer; nothing more to follow
            except httptools.HttpParserError:
                self.parser = None  # uvicorn's parser refuses it too, and answers 400
            if self.parser is not None and self.phase == _HEAD:
                # Bytes of a head not yet complete, counted from the first chunk after the one it
                # began in (the parser gives no offsets): at most one read more than the limit.
                if self.began_here:
                    self.head_bytes = 0
                elif before == _HEAD:
                    self.head_bytes += len(data)
                if self.head_bytes > self.guard.limits.max_head_bytes:
                    self.refuse(
                        431,
                        "Request Header Fields Too Large",
                        f"the request line and headers are over {self.guard.limits.max_head_bytes} bytes",
                        HEAD_TOO_LARGE,
                    )
                    return
        if self.held:
            self.held += data
            return
        self.deliver(data)

    def deliver(self, data: bytes) -> None:
        """Hand ``data`` to uvicorn a slice at a time while it holds fewer than ``MAX_QUEUED``
        requests it has not begun to answer; keep the rest (reading paused: at most one read).

        uvicorn parses every request of a read at once and keeps each until it is answered: 2,000
        pipelined requests in one write, never read, were 2,000 queued requests (~3 KiB each) on a
        connection (the fuzz suite's soak: +59 MiB for 10 such clients)."""
        view, at = memoryview(data), 0
        while at < len(data) and not self.closed:
            if self.handed is not None and self.heads - self.answers >= MAX_QUEUED:
                self.held += view[at:]
                self._hold()
                return
            piece = bytes(view[at : at + SLICE_BYTES])
            at += SLICE_BYTES
            if self.handed is not None:
                try:
                    self.handed.feed_data(piece)
                except httptools.HttpParserError:  # uvicorn answers it 400; stop counting
                    self.handed = None
            self.inner.data_received(piece)
        if not self.held and self.holding:
            self.holding = False
            if not self.paused and self.transport is not None and not self.transport.is_closing():
                self.transport.resume_reading()

    def _hold(self) -> None:
        if not self.holding and self.transport is not None and not self.transport.is_closing():
            self.holding = True
            self.transport.pause_reading()

    def answered(self) -> None:
        """uvicorn began an answer: hand it more of what is held, if any (soon: not inside its write)."""
        self.answers += 1
        if self.held and self.heads - self.answers < MAX_QUEUED and self.transport is not None:
            asyncio.get_running_loop().call_soon(self.flush)

    def flush(self) -> None:
        if self.held and not self.closed:
            data = bytes(self.held)
            self.held.clear()
            self.deliver(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.guard.connections.discard(self)
        self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()

    # -- the limits -------------------------------------------------------------------------------
    def expired(self, now: float) -> bool:
        waiting = self.paused or self.holding
        return self.phase != _IDLE and now > self.deadline and not self.closed and not waiting

    def reading_resumed(self) -> None:
        """The time a client had while uvicorn did not read does not count against it."""
        self.paused = False
        limit = self.guard.limits.head_seconds if self.phase == _HEAD else self.guard.limits.body_seconds
        self.deadline = max(self.deadline, time.monotonic() + limit)

    def refuse(self, status: int, reason: str, message: str, code: str) -> None:
        """Answer ``status`` (when no answer to an earlier request may be under way) and close."""
        self.parser = None
        self.closed = True
        self.held.clear()
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        log.warning("closing a connection from %s: %s", _peer(transport), message)
        if self.begun <= 1 and self.phase == _HEAD:
            transport.write(_answer(status, reason, message, code))
        transport.close()


class _ReadingWatch:
    """The transport as uvicorn's protocol sees it: the same object in every way, except that
    ``pause_reading``/``resume_reading`` also tell the guard (it stops the clock meanwhile) and a
    write to a closed connection is dropped."""

    __slots__ = ("_conn", "_transport")

    def __init__(self, transport: asyncio.Transport, conn: GuardedProtocol) -> None:
        self._transport = transport
        self._conn = conn

    def write(self, data: bytes | bytearray | memoryview) -> None:
        """As asyncio's transports do, a write after the connection closed is dropped: uvloop's raises,
        and uvicorn may still write pipelined answers to a client that left before its
        ``connection_lost`` runs (a traceback per such client, found by the fuzz suite's soak)."""
        if not self._transport.is_closing():
            if data[:9] == _ANSWER and data[:10] != _INTERIM:
                self._conn.answered()
            self._transport.write(data)

    def pause_reading(self) -> None:
        self._conn.paused = True
        self._transport.pause_reading()

    def resume_reading(self) -> None:
        if not self._conn.holding:
            self._transport.resume_reading()
        self._conn.reading_resumed()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class _Heads:
    """Counts the heads of the requests handed to uvicorn (``GuardedProtocol.heads``)."""

    __slots__ = ("_conn",)

    def __init__(self, conn: GuardedProtocol) -> None:
        self._conn = conn

    def on_headers_complete(self) -> None:
        self._conn.heads += 1


def _peer(transport: asyncio.BaseTransport) -> str:
    peer = transport.get_extra_info("peername")
    return f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) and len(peer) >= 2 else "a client"


class Guard:
    """The connections of one event loop, and the sweep that closes those over their time."""

    def __init__(self, limits: ConnectionLimits) -> None:
        self.limits = limits
        self.connections: set[GuardedProtocol] = set()
        self._sweeping = False

    def wrap(
        self, factory: Callable[[], asyncio.Protocol], loop: asyncio.AbstractEventLoop
    ) -> Callable[[], asyncio.Protocol]:
        if not self._sweeping:
            self._sweeping = True
            loop.call_later(SWEEP_SECONDS, self._sweep, loop)
        return lambda: GuardedProtocol(factory(), self)

    def _sweep(self, loop: asyncio.AbstractEventLoop) -> None:
        now = time.monotonic()
        for conn in [c for c in self.connections if c.expired(now)]:
            what = "head" if conn.phase == _HEAD else "body"
            seconds = self.limits.head_seconds if conn.phase == _HEAD else self.limits.body_seconds
            conn.refuse(
                408, "Request Timeout", f"the request {what} was not in within {seconds:g} s", TIMEOUT
            )
        if not loop.is_closed():
            loop.call_later(SWEEP_SECONDS, self._sweep, loop)


#: The limits of the loops ``new_loop`` makes in this process (``configure``: ``server.run`` before
#: uvicorn starts; a worker process from its settings, before its server listens).
_limits = ConnectionLimits()


def configure(limits: ConnectionLimits) -> None:
    global _limits
    _limits = limits


def _guarded(base: type[asyncio.AbstractEventLoop]) -> type[asyncio.AbstractEventLoop]:
    class GuardedLoop(base):  # type: ignore[valid-type,misc]
        """``base`` whose servers guard each connection (``GuardedProtocol``)."""

        async def create_server(
            self, protocol_factory: Callable[[], asyncio.Protocol], *args: Any, **kwargs: Any
        ) -> Any:
            guard = Guard(_limits)
            return await super().create_server(guard.wrap(protocol_factory, self), *args, **kwargs)

    return GuardedLoop


def _base_loop() -> type[asyncio.AbstractEventLoop]:
    try:
        import uvloop
    except ImportError:
        return asyncio.SelectorEventLoop
    return uvloop.Loop


_GuardedLoop = _guarded(_base_loop())

#: uvicorn's ``loop`` option: a custom loop is the import string of a callable making a loop.
LOOP = "delta_mirror.service.guard:new_loop"


def new_loop() -> asyncio.AbstractEventLoop:
    """A new event loop (uvloop's when installed, else asyncio's) whose servers are guarded."""
    return _GuardedLoop()


__all__ = [
    "HEAD_TOO_LARGE",
    "LOOP",
    "TIMEOUT",
    "ConnectionLimits",
    "Guard",
    "GuardedProtocol",
    "configure",
    "new_loop",
]
