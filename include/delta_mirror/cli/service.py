"""``delta-mirror serve``: the commit service that Spark writers POST their commits to."""

from __future__ import annotations

import functools
import sys

import click

from delta_mirror.cli.common import Ctx, errors, one_line, store_option
from delta_mirror.errors import TransientError

TOKEN_ENV = "DELTA_MIRROR_COMMIT_TOKEN"
ALLOW_ROOTS_ENV = "DELTA_MIRROR_COMMIT_ALLOW_ROOTS"
STORE_ENV = "DELTA_MIRROR_STORE"


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option(
    "--port", type=click.IntRange(0, 65535), default=8787, show_default=True, help="Port to listen on."
)
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
@click.option(
    "--metrics-bind",
    metavar="HOST:PORT",
    help="Serve GET /metrics (Prometheus) on this address instead of the commit port.",
)
@click.option(
    "--max-header-bytes",
    type=click.IntRange(min=1024),
    default=64 << 10,
    show_default=True,
    help="Largest request line plus headers; over it: 431 and the connection closed.",
)
@click.option(
    "--timeout-headers",
    type=click.FloatRange(min=0.1),
    default=10.0,
    show_default=True,
    help="Seconds to receive a request's line and headers (from connecting, for the first); then 408, closed.",
)
@click.option(
    "--timeout-body",
    type=click.FloatRange(min=0.1),
    default=60.0,
    show_default=True,
    help="Seconds to receive a request's body after its headers; then the connection is closed.",
)
@click.option(
    "--timeout-keep-alive",
    type=click.IntRange(min=1),
    default=75,
    show_default=True,
    help="Seconds an idle keep-alive connection stays open after an answer.",
)
@click.option(
    "--limit-concurrency",
    type=click.IntRange(min=1),
    default=1000,
    show_default=True,
    help="Connections and requests in progress at once per process; beyond it: 503.",
)
@click.option(
    "--backlog",
    type=click.IntRange(min=1),
    default=1024,
    show_default=True,
    help="Connections the kernel queues before the service accepts them.",
)
@click.option(
    "--ssl-certfile",
    type=click.Path(exists=True, dir_okay=False),
    help="Serve HTTPS with this certificate (PEM).",
)
@click.option(
    "--ssl-keyfile", type=click.Path(exists=True, dir_okay=False), help="The certificate's private key (PEM)."
)
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
    metrics_bind: str | None,
    max_header_bytes: int,
    timeout_headers: float,
    timeout_body: float,
    timeout_keep_alive: int,
    limit_concurrency: int,
    backlog: int,
    ssl_certfile: str | None,
    ssl_keyfile: str | None,
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
    if ctx.store_url and ctx.store_url != os.environ.get(STORE_ENV) and _has_password(ctx.store_url):
        click.echo(
            "warning: --store carries a password, which every user of this machine can read in its process"
            f" list (ps); pass the store URL in {STORE_ENV} instead",
            err=True,
        )
    roots = list(allow_roots) or [
        r.strip() for r in os.environ.get(ALLOW_ROOTS_ENV, "").split(",") if r.strip()
    ]
    with errors(ctx):
        if workers > 1:  # DuckDB: one read-write process per file
            from delta_mirror.config import store_url
            from delta_mirror.store.backends.duckdb import refuse_several_processes

            refuse_several_processes(
                store_url(ctx.store_url),
                f"`serve --workers {workers}` would open it from {workers} processes",
            )
        from delta_mirror.extras import require

        require("uvicorn", "service", "`delta-mirror serve` (the commit service)")
        require("starlette", "service", "`delta-mirror serve` (the commit service)")
        from delta_mirror.delta.locations import normalize_table_root
        from delta_mirror.service.guard import ConnectionLimits
        from delta_mirror.service.server import ServeOptions, parse_bind, run

        options = ServeOptions(
            host=host,
            port=port,
            allowed_roots=tuple(roots),
            max_body_bytes=max_body_bytes,
            workers=workers,
            access_log=access_log,
            debug=ctx.debug,
            metrics_bind=parse_bind(metrics_bind) if metrics_bind is not None else None,
            limits=ConnectionLimits(
                max_head_bytes=max_header_bytes, head_seconds=timeout_headers, body_seconds=timeout_body
            ),
            limit_concurrency=limit_concurrency,
            backlog=backlog,
            keep_alive_seconds=timeout_keep_alive,
            ssl_certfile=ssl_certfile,
            ssl_keyfile=ssl_keyfile,
        )
        store = ctx.store(initialised=False)
        try:
            store.ensure_initialised()
        except TransientError as exc:  # a database restarting: answer 503 until it is back
            click.echo(
                f"warning: {one_line(exc.message)}; answering 503 until the store is reachable", err=True
            )
        announce = functools.partial(
            click.echo,
            f"commit service on http{'s' if ssl_certfile else ''}://{host}:{port} for the store {store.display_url}"
            f" (tables may be created under: {', '.join(map(normalize_table_root, roots)) or 'no root'};"
            f" authentication {'on' if token else 'OFF'}"
            + (f"; {workers} worker processes" if workers > 1 else "")
            + (f"; metrics on http://{metrics_bind}/metrics" if metrics_bind else "; metrics on /metrics")
            + ")",
            err=True,
        )
        run(store, options, token=token, announce=announce)


def _has_password(url: str) -> bool:
    """Whether the store URL holds a password (in its userinfo or query string)."""
    from delta_mirror.config import redact_url

    return "***" in redact_url(url) and "***" not in url


__all__ = ["ALLOW_ROOTS_ENV", "TOKEN_ENV", "serve"]
