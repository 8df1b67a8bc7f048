"""fake-gcs-server (the Go module) for the GCS tests, with a small front for object uploads.

Why the front: object_store (obstore, deltalake) uploads an object with the XML API's
``PUT /<bucket>/<object>`` (put-if-absent adds ``x-goog-if-generation-match: 0``). fake-gcs-server
1.56 has no such route (``400 invalid uploadType``; its issue #331, pull request #1164 unmerged;
object_store's own CI uses a patched image). The front turns exactly that request into the JSON
API's media upload, ``POST /upload/storage/v1/b/<bucket>/o?uploadType=media&name=<object>`` with
``ifGenerationMatch=<the header's value>``, and answers as GCS's XML API does (200 with ETag and
``x-goog-generation``; 412 PreconditionFailed). Everything else (GET, HEAD, list, DELETE) passes
through unchanged. So the precondition is decided by the emulator's own generation check, not by
the front; ``tests/test_cloud_storage.py`` shows the emulator's refusal of the XML upload, so the front
can go once fake-gcs-server serves it.

Run as a script it is the front (``python fake_gcs.py --port P --upstream U``); stdlib only.
One emulator and one front per session on 127.0.0.1 and free ports; buckets fresh per test.
``scripts/install-emulators.sh`` installs the binary into ``.cache/go/bin``;
``DELTA_MIRROR_FAKE_GCS`` names another one.
"""

from __future__ import annotations

import argparse
import http.client
import json
import re
import sys
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from functools import partial
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import quote, unquote, urlsplit

FAKE_GCS_ENV = "DELTA_MIRROR_FAKE_GCS"
_OBJECT_PATH = re.compile(r"^/(?!storage/|upload/|download/|batch/|_internal/)([^/?]+)/(.+)$")
_HOP_HEADERS = {"connection", "keep-alive", "transfer-encoding", "host", "content-length"}
PRECONDITION_FAILED = (
    b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>PreconditionFailed</Code>'
    b"<Message>At least one of the pre-conditions you specified did not hold.</Message></Error>"
)


# --------------------------------------------------------------------------------------------------
# the front (a separate process: deltalake holds the GIL while it waits on HTTP, see S3Server)


class _Front(BaseHTTPRequestHandler):
    upstream = ("127.0.0.1", 0)
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        return None

    def _body(self) -> bytes:
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _send(self, status: int, headers: list[tuple[str, str]], body: bytes) -> None:
        self.send_response(status)
        for k, v in headers:
            if k.lower() not in _HOP_HEADERS:
                self.send_header(k, v)
        length = str(len(body))
        if self.command == "HEAD":  # the object's size, as the emulator said it
            length = next((v for k, v in headers if k.lower() == "content-length"), length)
        self.send_header("Content-Length", length)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _upstream(
        self, method: str, path: str, body: bytes, headers: dict[str, str]
    ) -> tuple[int, list[tuple[str, str]], bytes]:
        conn = http.client.HTTPConnection(*self.upstream, timeout=60)
        try:
            conn.request(
                method, path, body=body if body or method in ("PUT", "POST") else None, headers=headers
            )
            response = conn.getresponse()
            return response.status, response.getheaders(), response.read()
        finally:
            conn.close()

    def _passthrough(self) -> None:
        headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_HEADERS}
        self._send(*self._upstream(self.command, self.path, self._body(), headers))

    def _xml_upload(self, bucket: str, name: str) -> None:
        query = f"uploadType=media&name={quote(unquote(name), safe='')}"
        generation = self.headers.get("x-goog-if-generation-match")
        if generation is not None:
            query += f"&ifGenerationMatch={generation}"
        content_type = self.headers.get("Content-Type") or "application/octet-stream"
        status, _, body = self._upstream(
            "POST", f"/upload/storage/v1/b/{bucket}/o?{query}", self._body(), {"Content-Type": content_type}
        )
        if status == 200:
            meta = json.loads(body)
            headers = [("ETag", f'"{meta.get("etag") or meta.get("md5Hash") or ""}"')]
            headers.append(("x-goog-generation", str(meta.get("generation", ""))))
            self._send(200, headers, b"")
        elif status == 412:
            self._send(412, [("Content-Type", "application/xml")], PRECONDITION_FAILED)
        else:
            self._send(status, [("Content-Type", "application/json")], body)

    def do_PUT(self) -> None:
        match = _OBJECT_PATH.match(urlsplit(self.path).path)
        if match and not urlsplit(self.path).query:
            self._xml_upload(match.group(1), match.group(2))
        else:
            self._passthrough()

    do_GET = do_HEAD = do_POST = do_DELETE = _passthrough


def serve_front(port: int, upstream_port: int) -> None:
    _Front.upstream = ("127.0.0.1", upstream_port)
    ThreadingHTTPServer(("127.0.0.1", port), _Front).serve_forever()


# --------------------------------------------------------------------------------------------------
# the session's emulator


class FakeGcsServer:
    """fake-gcs-server (in memory) and the upload front, each in its own process group."""

    def __init__(self) -> None:
        from support.emulator import REPO, EmulatorProcesses, require_binary
        from support.services import free_port, listening

        local = REPO / ".cache" / "go" / "bin" / "fake-gcs-server"
        binary = require_binary(FAKE_GCS_ENV, local, "fake-gcs-server", "fake-gcs-server")
        self.upstream_port, self.port = free_port(), free_port()
        host = f"127.0.0.1:{self.upstream_port}"
        self.processes = EmulatorProcesses("fake-gcs")
        self.processes.start(
            binary, "-backend", "memory", "-scheme", "http", "-host", "127.0.0.1",
            "-port", str(self.upstream_port), "-public-host", host, "-log-level", "warn",
        )  # fmt: skip
        self.processes.start(
            sys.executable, __file__, "--port", str(self.port), "--upstream", str(self.upstream_port)
        )
        for port in (self.upstream_port, self.port):
            self.processes.wait(partial(listening, port), 30, f"fake-gcs-server on {port}")
        self.upstream = f"http://{host}"
        self.endpoint = f"http://127.0.0.1:{self.port}"

    def options(self, *, direct: bool = False) -> dict[str, str]:
        """A service-account key naming the emulator (``gcs_base_url``, no OAuth), as the
        ``GOOGLE_*`` variables / storage options; ``direct``: the emulator itself, not the front."""
        key = {
            "gcs_base_url": self.upstream if direct else self.endpoint,
            "disable_oauth": True,
            "client_email": "",
            "private_key": "",
            "private_key_id": "",
        }
        return {"GOOGLE_SERVICE_ACCOUNT_KEY": json.dumps(key), "GOOGLE_ALLOW_HTTP": "true"}

    def make_bucket(self, prefix: str = "dm-") -> str:
        name = f"{prefix}{uuid.uuid4().hex[:16]}"
        request = urllib.request.Request(
            f"{self.upstream}/storage/v1/b",
            data=json.dumps({"name": name}).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            if response.status != 200:
                raise RuntimeError(f"fake-gcs-server refused bucket {name}: {response.status}")
        return name

    def json_upload(self, bucket: str, name: str, data: bytes, if_generation_match: int | None) -> int:
        """The emulator's JSON media upload; the HTTP status (200, or 412 when the precondition fails)."""
        query = f"uploadType=media&name={quote(name, safe='')}"
        if if_generation_match is not None:
            query += f"&ifGenerationMatch={if_generation_match}"
        request = urllib.request.Request(
            f"{self.upstream}/upload/storage/v1/b/{bucket}/o?{query}", data=data, method="POST"
        )
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return int(response.status)
        except urllib.error.HTTPError as exc:
            return int(exc.code)

    def stop(self) -> None:
        """Both killed at once: everything is in memory."""
        self.processes.stop()


def fake_gcs_session() -> Iterator[FakeGcsServer]:
    """The body of a session fixture: skipped without the binary, failed under CI (``.ci/run`` installs it)."""
    from support.services import session_service

    return session_service(FakeGcsServer, FakeGcsServer.stop, "fake-gcs-server")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="fake-gcs-server's XML upload front (tests only)")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", type=int, required=True)
    args = parser.parse_args()
    serve_front(args.port, args.upstream)


__all__ = ["FakeGcsServer", "fake_gcs_session", "serve_front"]
