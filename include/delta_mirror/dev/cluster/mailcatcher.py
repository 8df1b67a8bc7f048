"""The cluster's SMTP catcher: every message accepted on 127.0.0.1 lands as one .eml file.

``python -m delta_mirror.dev.cluster.mailcatcher --port P --dir D``. Files are written whole, then
renamed (``<ns>-<n>.eml``), so a test reading the folder never sees half a message. No TLS, no auth:
the cluster's Airflow connection ``smtp_default`` points here.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import signal
import time
from pathlib import Path
from typing import Any

__all__ = ["EmlFolder", "main", "serve"]


class EmlFolder:
    """aiosmtpd handler writing each message (as received, headers included) to ``folder``."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._seq = itertools.count(1)

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        raw = envelope.original_content or envelope.content
        if isinstance(raw, str):
            raw = raw.encode()
        name = f"{time.time_ns()}-{next(self._seq)}.eml"
        tmp = self.folder / f".{name}.tmp"
        tmp.write_bytes(raw)
        os.replace(tmp, self.folder / name)
        return "250 Message accepted for delivery"


def serve(port: int, folder: Path) -> None:
    """Serve until SIGTERM/SIGINT."""
    from aiosmtpd.smtp import SMTP

    folder.mkdir(parents=True, exist_ok=True)
    handler = EmlFolder(folder)
    loop = asyncio.new_event_loop()
    server = loop.run_until_complete(loop.create_server(lambda: SMTP(handler), "127.0.0.1", port))
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, loop.stop)
    try:
        loop.run_forever()
    finally:
        server.close()
        loop.run_until_complete(server.wait_closed())
        loop.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--dir", type=Path, required=True)
    args = parser.parse_args(argv)
    serve(args.port, args.dir)


if __name__ == "__main__":
    main()
