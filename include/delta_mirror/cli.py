"""The ``delta-mirror`` command line.

Errors print one line (what, which table/version, what to do) and exit non-zero; ``--debug``
shows the traceback. Exit codes: 0 ok, 1 failure or validation problems, 2 usage, 3 conflict,
4 invalid data, 5 transient (safe to retry).
"""

from __future__ import annotations

import json
import logging
import re
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import click

from delta_mirror.version import __version__

if TYPE_CHECKING:
    from delta_mirror.table_config import CheckpointSettings
from delta_mirror.errors import DataError, ErrorClass, MirrorError, TableNotFoundError, TransientError

EXIT_CODES = {ErrorClass.CONFLICT: 3, ErrorClass.DATA: 4, ErrorClass.TRANSIENT: 5, ErrorClass.PERMANENT: 1}


class Ctx:
    def __init__(self, store_url: str | None, debug: bool) -> None:
        self.store_url = store_url
        self.debug = debug

    def store(self, *, initialised: bool = True) -> Any:
        from delta_mirror.store import SqlStore

        store = SqlStore(self.store_url)
        if initialised:
            store.ensure_initialised()
        return store


def _one_line(text: str) -> str:
    """Error text as one line: drivers and object stores put newlines (and debug dumps) in theirs."""
    return " ".join(re.split(r"\n\s*Debug source:", text)[0].split())


@contextmanager
def _errors(ctx: Ctx, table: str | None = None) -> Iterator[None]:
    """Errors become one ``error:`` line naming the table (what, where, what to do); no traceback."""
    try:
        yield
    except MirrorError as exc:
        if ctx.debug:
            raise
        if exc.table is None:
            exc.table = table
        exc.what = _one_line(exc.what)
        click.echo(f"error: {_one_line(exc.message)}", err=True)
        sys.exit(EXIT_CODES.get(exc.error_class, 1))
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        sys.exit(130)
    except click.ClickException:
        raise
    except Exception as exc:
        if ctx.debug:
            raise
        where = f"table '{table}': " if table else ""
        click.echo(
            f"error: {where}unexpected {type(exc).__name__}: {_one_line(str(exc))[:300]} — this is a bug; "
            "rerun with --debug for the traceback and report it",
            err=True,
        )
        sys.exit(1)


def _progress(label: str) -> Callable[[int, int], None] | None:
    """A progress line on a terminal (stderr), nothing when piped."""
    if not sys.stderr.isatty():
        return None

    def report(done: int, total: int) -> None:
        end = "\n" if done >= total else ""
        click.echo(f"\r{label}: {done}/{total}", err=True, nl=False)
        if end:
            click.echo("", err=True)

    return report


def _emit(data: object, as_json: bool, text: Callable[[], None]) -> None:
    if as_json:
        click.echo(json.dumps(data, indent=2, default=str))
    else:
        text()


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--store",
    "store_url",
    envvar="DELTA_MIRROR_STORE",
    default=None,
    metavar="URL",
    help="SQL store URL (default: $DELTA_MIRROR_STORE, else sqlite under $DELTA_MIRROR_HOME).",
)
@click.option("--debug", is_flag=True, help="Show tracebacks and debug logs.")
@click.version_option(__version__, prog_name="delta-mirror")
@click.pass_context
def cli(click_ctx: click.Context, store_url: str | None, debug: bool) -> None:
    """Publish Delta logs whose authority is a SQL database."""
    logging.basicConfig(
        level=logging.DEBUG if debug else logging.WARNING, format="%(levelname)s %(name)s: %(message)s"
    )
    click_ctx.obj = Ctx(store_url, debug)


# The store option is accepted after the sub-command too (`delta-mirror status --store URL`).
def store_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    def callback(click_ctx: click.Context, _param: click.Parameter, value: str | None) -> None:
        if value:
            click_ctx.find_object(Ctx).store_url = value  # type: ignore[union-attr]

    return click.option(
        "--store",
        "store_url",
        default=None,
        metavar="URL",
        expose_value=False,
        callback=callback,
        help="SQL store URL.",
    )(fn)


@cli.command()
@store_option
@click.pass_obj
def init(ctx: Ctx) -> None:
    """Create or upgrade the store's schema."""
    with _errors(ctx):
        store = ctx.store(initialised=False)
        store.init()
        click.echo(f"store ready: {store.display_url}")


@cli.command("import")
@click.argument("source_uri")
@click.option("--table", "name", required=True, help="Name of the table in the store.")
@click.option("--location", default=None, help="Where to publish (default: the source, in place).")
@click.option("--json", "as_json", is_flag=True)
@store_option
@click.pass_obj
def import_(ctx: Ctx, source_uri: str, name: str, location: str | None, as_json: bool) -> None:
    """Import an existing Delta table's log into the store."""
    from delta_mirror.jobs.importer import import_table

    with _errors(ctx, name):
        result = import_table(
            ctx.store(), source_uri, name=name, location=location, progress=_progress(f"importing {name}")
        )

        def text() -> None:
            start = (
                f"checkpoint {result.base_checkpoint_version}"
                if result.base_checkpoint_version is not None
                else f"version {result.start_version}"
            )
            click.echo(
                f"imported '{name}': versions {result.start_version}..{result.end_version} "
                f"({result.commits} commits, starting at {start}) -> {result.location}"
                + (" (in place)" if result.in_place else "")
            )

        _emit(result.to_json(), as_json, text)


@cli.command()
@click.argument("name")
@click.option(
    "--actions",
    "actions_file",
    required=True,
    type=click.File("rb"),
    help="JSON lines of Delta actions ('-' for stdin).",
)
@click.option("--location", default=None, help="Create the table at this location if it does not exist.")
@click.option(
    "--expected-version",
    type=click.IntRange(min=0),
    default=None,
    help="Fail unless the commit becomes exactly this version.",
)
@click.option("--operation", default=None, help="commitInfo operation (default WRITE / CREATE TABLE).")
@store_option
@click.pass_obj
def commit(
    ctx: Ctx,
    name: str,
    actions_file: Any,
    location: str | None,
    expected_version: int | None,
    operation: str | None,
) -> None:
    """Commit actions as the table's next version; prints the version."""
    from delta_mirror.config import max_commit_bytes
    from delta_mirror.delta.actions import parse_actions
    from delta_mirror.storage import normalize_location

    with _errors(ctx, name):
        store = ctx.store()
        limit = max_commit_bytes()
        data = actions_file.read(limit + 1)  # never more than the limit in memory
        if len(data) > limit:
            raise DataError(
                f"the actions input is larger than the limit of {limit:,} bytes",
                table=name,
                hint="split it into several commits, or raise DELTA_MIRROR_MAX_COMMIT_BYTES",
            )
        actions = parse_actions(data, table=name)
        target = normalize_location(location) if location else None
        if target is not None:
            try:
                store.get_table(name)
            except TableNotFoundError:
                _check_new_location(name, target)
        # The table is created in the commit's own transaction: a refused commit leaves no table.
        click.echo(
            store.commit(
                name, actions, expected_version=expected_version, operation=operation, location=target
            )
        )


def _check_new_location(name: str, location: str) -> None:
    """A new table's location must be reachable and hold no Delta log (that one is imported instead)."""
    from delta_mirror.delta.log_path import LOG_DIR, parse_log_file
    from delta_mirror.errors import TableExistsError
    from delta_mirror.storage import local_path, open_store

    folder = local_path(location)
    if folder is not None and not (folder / LOG_DIR).is_dir():
        return  # nothing there: do not create folders for a commit that may yet be refused
    existing = [m for m in open_store(location).list(LOG_DIR) if parse_log_file(m.path.rsplit("/", 1)[-1])]
    if existing:
        raise TableExistsError(
            f"{location} already holds a Delta log ({existing[0].path})",
            table=name,
            hint=f"import it with `delta-mirror import {location} --table {name}`",
        )


def engine_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``--engine`` and ``--config``: who builds checkpoints (the table config decides by default)."""
    fn = click.option(
        "--config",
        "config_path",
        type=click.Path(dir_okay=False),
        default=None,
        help="Table config (default: $DELTA_MIRROR_CONFIG or config/delta_mirror.yaml when it exists).",
    )(fn)
    return click.option(
        "--engine",
        type=click.Choice(["local", "spark", "auto"]),
        default=None,
        help="Who builds checkpoints: in-process (local), Spark (reads the store over JDBC), or auto by "
        "file count (default: the table's `checkpoint.engine` in the table config when it exists, else local).",
    )(fn)


def _checkpoint_settings(config_path: str | None, name: str) -> CheckpointSettings | None:
    """The table's ``checkpoint`` settings from the table config, when there is one."""
    from pathlib import Path

    from delta_mirror.table_config import default_config_path, load_config

    path = Path(config_path) if config_path else default_config_path()
    if not (config_path or path.is_file()):
        return None
    config = load_config(path)
    return config.tables.get(name, config.defaults).checkpoint


@cli.command()
@click.argument("name")
@click.option("--to-version", type=click.IntRange(min=0), default=None)
@click.option("--json", "as_json", is_flag=True)
@engine_options
@store_option
@click.pass_obj
def mirror(
    ctx: Ctx, name: str, to_version: int | None, as_json: bool, engine: str | None, config_path: str | None
) -> None:
    """Publish pending versions (and checkpoints when due) to the table's location."""
    from delta_mirror.jobs.publisher import Publisher
    from delta_mirror.spark.checkpoint_engine import ConfiguredBuilder

    with _errors(ctx, name):
        settings = _checkpoint_settings(config_path, name)
        builder = None
        if (engine or (settings.engine if settings else "local")) != "local":
            builder = ConfiguredBuilder(name, engine, settings)  # Spark starts only if a checkpoint is due
        publisher = Publisher(ctx.store(), checkpoint_builder=builder, lease_ttl=3600.0 if builder else None)
        result = publisher.publish(name, to_version, progress=_progress(f"publishing {name}"))
        engines = f" ({', '.join(sorted(set(builder.used)))} engine)" if builder and builder.used else ""

        def text() -> None:
            if not result.published and not result.already_present:
                click.echo(f"'{name}' is up to date (published through version {result.last_published})")
                return
            click.echo(
                f"published {len(result.published)} version(s) of '{name}' through version "
                f"{result.last_published}"
                + (f", {len(result.already_present)} already present" if result.already_present else "")
                + (
                    f"; checkpoint at {', '.join(map(str, result.checkpoints))}{engines}"
                    if result.checkpoints
                    else ""
                )
            )

        _emit(result.to_json(), as_json, text)


@cli.command()
@click.argument("name")
@click.option("--version", "version", type=click.IntRange(min=0), default=None)
@engine_options
@store_option
@click.pass_obj
def checkpoint(ctx: Ctx, name: str, version: int | None, engine: str | None, config_path: str | None) -> None:
    """Write a checkpoint (default: at the last published version)."""
    from delta_mirror.jobs.publisher import Publisher
    from delta_mirror.spark.checkpoint_engine import builder_for

    with _errors(ctx, name):
        store = ctx.store()
        settings = _checkpoint_settings(config_path, name)
        chosen, builder = builder_for(store, name, engine, settings)
        v = Publisher(store, checkpoint_builder=builder, lease_ttl=3600.0 if builder else None).checkpoint(
            name, version
        )
        click.echo(f"checkpoint written for '{name}' at version {v} ({chosen} engine)")


@cli.command()
@click.argument("name")
@click.option("--from-version", type=click.IntRange(min=0), default=None)
@click.option("--to-version", type=click.IntRange(min=0), default=None)
@click.option("--reader", type=click.Choice(["deltalake", "spark"]), default="deltalake", show_default=True)
@click.option("--json", "as_json", is_flag=True)
@store_option
@click.pass_obj
def validate(
    ctx: Ctx, name: str, from_version: int | None, to_version: int | None, reader: str, as_json: bool
) -> None:
    """Compare a reader's view of the published table and the log listing with the store."""
    from delta_mirror.jobs.validate import validate_table

    with _errors(ctx, name):
        if from_version is not None and to_version is not None and from_version > to_version:
            raise DataError(
                f"--from-version {from_version} is after --to-version {to_version}",
                table=name,
                hint="swap them",
            )
        store = ctx.store()
        report = validate_table(store, name, from_version=from_version, to_version=to_version, reader=reader)
        from delta_mirror.health.monitoring import record_validation

        record_validation(store, name, {**report.to_json(), "reader": reader})

        def text() -> None:
            for p in report.problems:
                where = f"version {p.version}: " if p.version is not None else ""
                click.echo(f"PROBLEM [{p.kind}] {where}{p.message}\n  what to do: {p.hint}")
            verdict = "OK" if report.ok else f"{len(report.problems)} problem(s)"
            click.echo(
                f"validated '{name}' versions {report.from_version}..{report.to_version} "
                f"({report.versions_checked} checked with {reader}): {verdict}"
            )

        _emit(report.to_json(), as_json, text)
        if not report.ok:
            sys.exit(1)


@cli.command()
@click.argument("name", required=False)
@click.option("--json", "as_json", is_flag=True)
@store_option
@click.pass_obj
def status(ctx: Ctx, name: str | None, as_json: bool) -> None:
    """Mirror status and lag per table."""
    from delta_mirror.health.status import table_status

    with _errors(ctx, name):
        store = ctx.store()
        tables = [store.get_table(name)] if name else store.list_tables()
        rows = [table_status(store, t) for t in tables]

        def text() -> None:
            if not rows:
                click.echo("no tables")
                return
            click.echo(
                f"{'TABLE':<24} {'STATE':<8} {'COMMITTED':>9} {'PUBLISHED':>9} {'BEHIND':>6} "
                f"{'LAG_S':>8} {'CHECKPOINT':>10}  LOCATION"
            )
            for r in rows:
                click.echo(
                    f"{r.table:<24} {r.state:<8} {_v(r.latest_committed):>9} {_v(r.last_published):>9} "
                    f"{r.versions_behind:>6} {r.lag_seconds:>8.1f} {_v(r.last_checkpoint):>10}  {r.location}"
                )
                if r.breaker != "CLOSED":
                    click.echo(
                        f"  circuit breaker {r.breaker}: publishing is paused after repeated transient failures"
                    )
                if r.halted_reason:
                    click.echo(f"  halted: {r.halted_reason}")
                elif r.last_error:
                    click.echo(f"  last error [{r.last_error_class}]: {r.last_error}")

        _emit([r.to_json() for r in rows] if not name else rows[0].to_json(), as_json, text)


@cli.command()
@click.argument("name", required=False)
@click.option(
    "--strategy",
    type=click.Choice(["incremental", "full", "smart"]),
    default="incremental",
    show_default=True,
    help="incremental: re-drive PENDING / FAILED / stuck versions; full: also list _delta_log/ against the store and repair what is safe; smart: full only where there are signs of trouble.",
)
@click.option("--json", "as_json", is_flag=True)
@store_option
@click.pass_obj
def reconcile(ctx: Ctx, name: str | None, strategy: str, as_json: bool) -> None:
    """Re-drive failed, stuck and lagging versions (every table, or NAME)."""
    from delta_mirror.jobs.reconcile import reconcile as run_reconcile

    with _errors(ctx):
        report = run_reconcile(ctx.store(), [name] if name else None, strategy=strategy)

        def text() -> None:
            for t in report.tables:
                extra = f" ({t.published} version(s))" if t.published else ""
                click.echo(f"{t.table}: {t.action}{extra}" + (f" — {t.error}" if t.error else ""))
                for f in t.persistent_failures:
                    click.echo(
                        f"  version {f['version']} {f['artifact']}: {f['attempts']} attempt(s), "
                        f"[{f['error_class']}] {f['error']}"
                    )

        _emit(report.to_json(), as_json, text)
        if any(t.action in ("failed", "halted") for t in report.tables):
            sys.exit(1)


@cli.command()
@click.argument("name", required=False)
@click.option("--json", "as_json", is_flag=True)
@click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="Table config with each table's lag_slo (default: $DELTA_MIRROR_CONFIG or config/delta_mirror.yaml "
    "when it exists; else a 15m SLO for every table).",
)
@click.option("--record", is_flag=True, help="Also store a lag sample per table (lag history).")
@store_option
@click.pass_obj
def health(ctx: Ctx, name: str | None, as_json: bool, config_path: str | None, record: bool) -> None:
    """Exit 1 when a table breaches its lag SLO, is halted or has failed versions (for probes and cron)."""
    from pathlib import Path

    from delta_mirror.health.monitoring import DEFAULT_LAG_RETENTION, health_report, record_lag_sample
    from delta_mirror.table_config import default_config_path, load_config

    with _errors(ctx, name):
        store = ctx.store()
        config = None
        if config_path:
            config = load_config(Path(config_path))
        elif default_config_path().is_file():
            config = load_config(default_config_path())
        report = health_report(store, [name] if name else None, config)
        if record:
            for t in report.tables:
                cfg = config.tables.get(t.table) if config else None
                retention = (
                    (cfg or config.defaults).lag_history_retention if config else DEFAULT_LAG_RETENTION
                )
                record_lag_sample(store, t.table, retention=retention)

        def text() -> None:
            if not report.tables:
                click.echo("no tables")
            for t in report.tables:
                st = t.status
                verdict = "OK  " if t.healthy else "FAIL"
                click.echo(
                    f"{verdict} {t.table}: lag {float(st['lag_seconds']):.1f} s (SLO {t.lag_slo_seconds:.0f} s), "
                    f"{st['versions_behind']} version(s) behind, state {st['state']}"
                )
                for p in t.problems:
                    click.echo(f"  - {p}")
            click.echo("healthy" if report.healthy else "UNHEALTHY")

        _emit(report.to_json(), as_json, text)
        if not report.healthy:
            sys.exit(1)


def _v(value: int | None) -> str:
    return "-" if value is None else str(value)


@cli.command()
@click.argument("name")
@store_option
@click.pass_obj
def resume(ctx: Ctx, name: str) -> None:
    """Clear a halted table after its cause was fixed; failed versions are retried."""
    with _errors(ctx, name):
        store = ctx.store()
        table = store.get_table(name)
        store.resume_table(table.id)
        for row in store.status_rows(table.id, states=("FAILED", "CONFLICT")):
            store.mark_failed(
                table.id, row.version, row.artifact, "PENDING", row.error_class or "", row.last_error or ""
            )
        click.echo(f"'{name}' is active again; run `delta-mirror mirror {name}`")


TOKEN_ENV = "DELTA_MIRROR_COMMIT_TOKEN"
ALLOW_ROOTS_ENV = "DELTA_MIRROR_COMMIT_ALLOW_ROOTS"


@cli.command()
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
    with _errors(ctx):
        import uvicorn

        from delta_mirror.commit_service import SERVE_SETTINGS_ENV, create_app

        store = ctx.store(initialised=False)
        try:
            store.ensure_initialised()
        except TransientError as exc:  # a database restarting: answer 503 until it is back
            click.echo(
                f"warning: {_one_line(exc.message)}; answering 503 until the store is reachable", err=True
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


def main(argv: list[str] | None = None) -> None:
    cli.main(args=argv, prog_name="delta-mirror")


if __name__ == "__main__":
    main()
