"""The commit service (``delta-mirror serve``): writers POST their exact commit bytes, the SQL store
commits them. The wire contract is ``docs/commit-service.md``.

- ``app``: the ASGI app (``create_app``), Starlette with the commit route in front of its router;
- ``routes``: what each route checks and answers (``CommitService``);
- ``auth``: the token check; ``errors``: the service's errors and the status each answers with;
- ``store_threads``: the store calls off the event loop; ``metrics``: ``GET /metrics``;
- ``server``: uvicorn, its worker processes and the ``--metrics-bind`` listener.

The service is stateless: the ``dl_commits`` primary key decides racing writers, so any number of
processes may serve one store.
"""

from __future__ import annotations

from delta_mirror.lazy import lazy_names

# Loaded on first use: the metrics and errors need no Starlette (the ``service`` extra).
_PUBLIC = {
    "create_app": "delta_mirror.service.app",
    "app_from_environment": "delta_mirror.service.app",
    "ERROR_STATUS": "delta_mirror.service.errors",
    "error_answer": "delta_mirror.service.errors",
    "CommitService": "delta_mirror.service.routes",
}
__getattr__ = lazy_names(__name__, _PUBLIC)

__all__ = ["ERROR_STATUS", "CommitService", "app_from_environment", "create_app", "error_answer"]
