"""A fault-injecting HTTP proxy for the S3 endpoint (its own process, on 127.0.0.1).

Publishers talk to the proxy; it forwards to the real S3 server (moto) and, with a configurable
probability, injects one fault per request to the table's ``_delta_log/``:

- ``500`` / ``503``: an S3 XML error (``InternalError`` / ``SlowDown``), half of the time *after*
  the request reached the server (the write happened, the client is told it failed);
- ``timeout``: the request is forwarded, the answer is held past the client's timeout, then dropped;
- ``reset``: the request is forwarded, the answer stops mid-body with a TCP reset;
- ``slow``: the answer is trickled in small pieces (slower, but within the timeout);
- ``403`` / ``507``: refuse every write (``AccessDenied``: a read-only bucket; ``InsufficientStorage``:
  a full one) — a mode, not a random fault.

Control (not forwarded): ``GET /__chaos__/stats`` returns the counters as JSON, ``POST
/__chaos__/config`` with a JSON body changes ``rate``, ``kinds``, ``hold``, ``refuse_writes``.
The counters include every successful PUT per commit key as the server answered it: two for one key
means a commit file was overwritten.

Run: ``python chaos_proxy.py --upstream http://127.0.0.1:PORT --port PORT [--seed N]``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import re
import socket
import struct
from collections import Counter
from typing import Any

COMMIT_KEY = re.compile(r"/_delta_log/\d{20}\.json$")
CONTROL = "/__chaos__/"
ERRORS = {
    "500": (
        500,
        "Internal Server Error",
        "InternalError",
        "We encountered an internal error. Please try again.",
    ),
    "503": (503, "Slow Down", "SlowDown", "Please reduce your request rate."),
    "403": (403, "Forbidden", "AccessDenied", "Access Denied"),
    "507": (507, "Insufficient Storage", "InsufficientStorage", "The bucket is full."),
}


class Request:
    def __init__(self, method: str, target: str, version: str, headers: list[tuple[str, str]], body: bytes):
        self.method, self.target, self.version, self.headers, self.body = (
            method,
            target,
            version,
            headers,
            body,
        )

    @property
    def path(self) -> str:
        return self.target.split("?", 1)[0]

    def header(self, name: str) -> str | None:
        for k, v in self.headers:
            if k.lower() == name:
                return v
        return None


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    out = bytearray()
    while True:
        size = int((await reader.readline()).split(b";")[0].strip() or b"0", 16)
        if size == 0:
            while (await reader.readline()) not in (b"\r\n", b"\n", b""):
                pass
            return bytes(out)
        out += await reader.readexactly(size)
        await reader.readline()


async def _read_head(reader: asyncio.StreamReader) -> tuple[str, list[tuple[str, str]]] | None:
    try:
        raw = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, ConnectionError):
        return None
    lines = raw.decode("latin-1").split("\r\n")
    headers = []
    for line in lines[1:]:
        if ":" in line:
            k, v = line.split(":", 1)
            headers.append((k.strip(), v.strip()))
    return lines[0], headers


async def read_request(reader: asyncio.StreamReader) -> Request | None:
    head = await _read_head(reader)
    if head is None:
        return None
    first, headers = head
    method, target, version = first.split(" ", 2)
    req = Request(method, target, version, headers, b"")
    if (req.header("transfer-encoding") or "").lower() == "chunked":
        req.body = await _read_chunked(reader)
        req.headers = [(k, v) for k, v in headers if k.lower() != "transfer-encoding"]
        req.headers.append(("Content-Length", str(len(req.body))))
    else:
        req.body = await reader.readexactly(int(req.header("content-length") or 0))
    return req


def _abort(writer: asyncio.StreamWriter) -> None:
    """Close with a TCP reset (SO_LINGER 0), not a clean FIN."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


def _response_head(status: int, reason: str, headers: list[tuple[str, str]]) -> bytes:
    lines = [f"HTTP/1.1 {status} {reason}"] + [f"{k}: {v}" for k, v in headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def error_response(kind: str, resource: str) -> bytes:
    status, reason, code, message = ERRORS[kind]
    body = (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f"<Error><Code>{code}</Code><Message>{message}</Message>"
        f"<Resource>{resource}</Resource><RequestId>chaos</RequestId></Error>"
    ).encode()
    head = [
        ("Content-Type", "application/xml"),
        ("Content-Length", str(len(body))),
        ("x-amz-request-id", "chaos"),
    ]
    return _response_head(status, reason, head) + body


class FaultProxy:
    def __init__(self, upstream_host: str, upstream_port: int, seed: int | None) -> None:
        self.upstream = (upstream_host, upstream_port)
        self.rng = random.Random(seed)
        self.rate = 0.0
        self.kinds: dict[str, float] = {"500": 1, "503": 1, "timeout": 1, "reset": 1, "slow": 1}
        self.hold = 3.0  # seconds a "timeout" answer is held: longer than the client's timeout
        self.refuse_writes: str | None = None  # "403" (read-only) or "507" (full)
        self.counts: Counter[str] = Counter()
        self.commit_puts: Counter[str] = Counter()  # successful PUTs per commit key (from the server)

    # -- control --------------------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        overwrites = {k: n - 1 for k, n in self.commit_puts.items() if n > 1}
        return {
            "requests": self.counts["requests"],
            "faults": {k.removeprefix("fault:"): n for k, n in self.counts.items() if k.startswith("fault:")},
            "faults_total": sum(n for k, n in self.counts.items() if k.startswith("fault:")),
            "commit_puts_ok": sum(self.commit_puts.values()),
            "overwrites": overwrites,
        }

    def configure(self, cfg: dict[str, Any]) -> None:
        if "rate" in cfg:
            self.rate = float(cfg["rate"])
        if "kinds" in cfg:
            self.kinds = {str(k): float(v) for k, v in cfg["kinds"].items()}
        if "hold" in cfg:
            self.hold = float(cfg["hold"])
        if "refuse_writes" in cfg:
            self.refuse_writes = cfg["refuse_writes"] or None

    async def _control(self, req: Request, writer: asyncio.StreamWriter) -> None:
        if req.method == "POST" and req.path.endswith("/config"):
            self.configure(json.loads(req.body or b"{}"))
        if req.path.endswith("/reset"):
            self.counts.clear()
            self.commit_puts.clear()
        body = json.dumps(self.stats()).encode()
        writer.write(
            _response_head(
                200, "OK", [("Content-Type", "application/json"), ("Content-Length", str(len(body)))]
            )
            + body
        )
        await writer.drain()

    # -- proxying -------------------------------------------------------------------------------
    def _pick(self, req: Request) -> str | None:
        if "/_delta_log/" not in req.path:
            return None
        if self.refuse_writes and req.method in ("PUT", "POST", "DELETE"):
            return self.refuse_writes
        if self.rate <= 0 or self.rng.random() >= self.rate:
            return None
        return self.rng.choices(list(self.kinds), list(self.kinds.values()))[0]

    async def _forward(self, req: Request) -> tuple[int, str, list[tuple[str, str]], bytes]:
        reader, writer = await asyncio.open_connection(*self.upstream)
        try:
            headers = [(k, v) for k, v in req.headers if k.lower() not in ("connection", "keep-alive")]
            headers.append(("Connection", "close"))
            lines = [f"{req.method} {req.target} HTTP/1.1"] + [f"{k}: {v}" for k, v in headers]
            writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + req.body)
            await writer.drain()
            head = await _read_head(reader)
            if head is None:
                raise ConnectionError("upstream closed")
            first, rheaders = head
            _, status, reason = ([*first.split(" ", 2), ""])[:3]
            te = next((v for k, v in rheaders if k.lower() == "transfer-encoding"), "")
            if req.method == "HEAD":
                body = b""
            elif te.lower() == "chunked":
                body = await _read_chunked(reader)
            else:
                length = next((v for k, v in rheaders if k.lower() == "content-length"), None)
                body = await reader.readexactly(int(length)) if length is not None else await reader.read()
        finally:
            writer.close()
        keep = [
            (k, v) for k, v in rheaders if k.lower() not in ("connection", "transfer-encoding", "keep-alive")
        ]
        if req.method != "HEAD":
            keep = [(k, v) for k, v in keep if k.lower() != "content-length"]
            keep.append(("Content-Length", str(len(body))))
        return int(status), reason, keep, body

    async def _one(self, req: Request, writer: asyncio.StreamWriter) -> bool:
        """Answer one request; False when the connection was dropped."""
        self.counts["requests"] += 1
        fault = self._pick(req)
        if fault is not None:
            self.counts[f"fault:{fault}"] += 1
        if fault in ("403", "507") or (fault in ("500", "503") and self.rng.random() < 0.5):
            writer.write(error_response(fault, req.path))  # refused before reaching the server
            await writer.drain()
            return True
        status, reason, headers, body = await self._forward(req)
        if req.method == "PUT" and 200 <= status < 300 and COMMIT_KEY.search(req.path):
            self.commit_puts[req.path] += 1
        if fault in ("500", "503"):  # the server did it; the client is told it failed
            writer.write(error_response(fault, req.path))
        elif fault == "timeout":
            await asyncio.sleep(self.hold)
            _abort(writer)
            return False
        elif fault == "reset":
            head = _response_head(status, reason, headers)
            writer.write(head + body[: len(body) // 2] if body else head[: len(head) // 2])
            await writer.drain()
            await asyncio.sleep(0.01)
            _abort(writer)
            return False
        elif fault == "slow":
            data = _response_head(status, reason, headers) + body
            step = max(1, len(data) // 8)
            for i in range(0, len(data), step):
                writer.write(data[i : i + step])
                await writer.drain()
                await asyncio.sleep(self.rng.uniform(0.02, 0.08))
        else:
            writer.write(_response_head(status, reason, headers) + body)
        await writer.drain()
        return True

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                req = await read_request(reader)
                if req is None:
                    break
                if req.path.startswith(CONTROL):
                    await self._control(req, writer)
                    continue
                if not await self._one(req, writer):
                    return
                if (req.header("connection") or "").lower() == "close":
                    break
        except (ConnectionError, asyncio.IncompleteReadError, OSError):
            pass
        finally:
            if not writer.transport.is_closing():
                writer.close()


async def serve(args: argparse.Namespace) -> None:
    host, _, port = args.upstream.removeprefix("http://").partition(":")
    proxy = FaultProxy(host, int(port), args.seed)
    server = await asyncio.start_server(proxy.handle, "127.0.0.1", args.port)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--upstream", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--seed", type=int, default=None)
    asyncio.run(serve(parser.parse_args()))


if __name__ == "__main__":
    main()
