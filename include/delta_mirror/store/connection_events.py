"""What a long-running process may learn about the store's connections (the commit service's
``delta_mirror_service_store_reconnects_total``), without touching the engine itself."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy import Engine, event


def on_dead_connection(engine: Engine, callback: Callable[[], None]) -> None:
    """Call ``callback()`` each time ``engine``'s pool drops a connection found dead (a database
    restart, a dropped link, a connection the server closed while it was idle); the next use of that
    pool slot opens a new connection. It runs on the thread that found the connection dead."""

    def invalidated(_dbapi_conn: Any, _record: Any, _exc: Any) -> None:
        callback()

    event.listen(engine, "invalidate", invalidated)


__all__ = ["on_dead_connection"]
