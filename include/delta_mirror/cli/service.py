"""``delta-mirror serve``: the commit service that Spark writers POST their commits to."""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from delta_mirror.cli.common import Ctx, errors, one_line, store_option
from delta_mirror.errors import TransientError

TOKEN_ENV = "DELTA_MIRROR_COMMIT_TOKEN"
ALLOW_ROOTS_ENV = "DELTA_MIRROR_COMMIT_ALLOW_ROOTS"


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", type=click.IntRange(0, 65535), default=8787, show_default=True)
@click.option(
    "--allow-root",
    "allow_roots",
    multiple=True,
    metavar="PREFIX",
    help=f"Root prefix under which version 0 creates a table (repeatable; else ${ALLOW_ROOTS_ENV}, comma-separated).",
)
@click.option(
    "--max-body-bytes",
    type=click.IntRange(min=1),
    default=64 << 20,
    show_default=True,
    help="Largest request body accepted (the store's commit limits apply too).",
)
@click.option(
    "--no-auth", is_flag=True, help=f"Start even without ${TOKEN_ENV}, unauthenticated (local tests only)."
)
@click.option(
    "--workers",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Service processes sharing the port (the service is stateless: the store decides races).",
)
@click.option("--access-log", is_flag=True, help="Log one line per request (off: it costs CPU per commit).")
@store_option
@click.pass_obj
def serve(
    ctx: Ctx,
    host: str,
    port: int,
    allow_roots: tuple[str, ...],
    max_body_bytes: int,
    no_auth: bool,
    workers: int,
    access_log: bool,
) -> None:
    """Run the commit service (docs/commit-service.md): writers POST their exact commit bytes."""
    import os

    token = os.environ.get(TOKEN_ENV) or None
    if token is None and not no_auth:
        click.echo(
            f"error: the commit service needs a token: set {TOKEN_ENV} (clients send it as a Bearer token),"
            " or pass --no-auth for a local test service",
            err=True,
        )
        sys.exit(2)
    roots = list(allow_roots) or [
        r.strip() for r in os.environ.get(ALLOW_ROOTS_ENV, "").split(",") if r.strip()
    ]
    with errors(ctx):
        if workers > 1:  # DuckDB: one read-write process per file
            from delta_mirror.config import store_url
            from delta_mirror.store.duckdb_store import refuse_several_processes

            refuse_several_processes(
                store_url(ctx.store_url),
                f"`serve --workers {workers}` would open it from {workers} processes",
            )
        import uvicorn

        from delta_mirror.commit_http import CommitProtocol
        from delta_mirror.commit_service import KEEP_ALIVE_SECONDS, SERVE_SETTINGS_ENV, create_app

        store = ctx.store(initialised=False)
        try:
            store.ensure_initialised()
        except TransientError as exc:  # a database restarting: answer 503 until it is back
            click.echo(
                f"warning: {one_line(exc.message)}; answering 503 until the store is reachable", err=True
            )
        app = create_app(store, token=token, allowed_roots=roots, max_body_bytes=max_body_bytes)
        click.echo(
            f"commit service on http://{host}:{port} for the store {store.display_url}"
            f" (tables may be created under: {', '.join(app.state.service.allowed_roots) or 'no root'};"
            f" authentication {'on' if token else 'OFF'}"
            + (f"; {workers} worker processes" if workers > 1 else "")
            + ")",
            err=True,
        )
        options: dict[str, Any] = {
            "host": host,
            "port": port,
            "log_level": "debug" if ctx.debug else "info",
            "access_log": access_log,
            "lifespan": "on",
            "timeout_keep_alive": KEEP_ALIVE_SECONDS,
            # uvicorn's httptools protocol, answering POST /v1/commits/<v> without ASGI (commit_http)
            "http": CommitProtocol,
        }
        if workers == 1:
            uvicorn.run(app, **options)
            return
        # Each worker builds its own app and store (a uvicorn factory) from these settings.
        store.close()
        os.environ[SERVE_SETTINGS_ENV] = json.dumps(
            {
                "store": store.url,
                "auth": token is not None,
                "allowed_roots": roots,
                "max_body_bytes": max_body_bytes,
                "debug": ctx.debug,
            }
        )
        uvicorn.run(
            "delta_mirror.commit_service:app_from_environment", factory=True, workers=workers, **options
        )


__all__ = ["ALLOW_ROOTS_ENV", "TOKEN_ENV", "serve"]
