"""Commands that create tables and versions: ``init``, ``import`` and ``commit``."""

from __future__ import annotations

from typing import Any

import click

from delta_mirror.cli.common import Ctx, emit, errors, json_option, progress, store_option
from delta_mirror.errors import DataError, TableNotFoundError


@click.command()
@store_option
@click.pass_obj
def init(ctx: Ctx) -> None:
    """Create or upgrade the store's schema."""
    with errors(ctx):
        store = ctx.store(initialised=False)
        store.init()
        click.echo(f"store ready: {store.display_url}")


@click.command("import")
@click.argument("source_uri")
@click.option("--table", "name", required=True, help="Name of the table in the store.")
@click.option("--location", default=None, help="Where to publish (default: the source, in place).")
@json_option
@store_option
@click.pass_obj
def import_(ctx: Ctx, source_uri: str, name: str, location: str | None, as_json: bool) -> None:
    """Import an existing Delta table's log into the store."""
    from delta_mirror.jobs.importer import import_table

    with errors(ctx, name):
        result = import_table(
            ctx.store(), source_uri, name=name, location=location, progress=progress(f"importing {name}")
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
            for warning in result.warnings():  # a source checkpoint disagreed with its JSON commits
                click.echo(f"warning: {warning}", err=True)

        emit(result.to_json(), as_json, text)


@click.command()
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

    with errors(ctx, name):
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
        try:
            table = store.get_table(name)
        except TableNotFoundError:
            if target is not None:
                _check_new_location(name, target)
        else:
            _refuse_if_store_behind(store, table)
        # The table is created in the commit's own transaction: a refused commit leaves no table.
        click.echo(
            store.commit(
                name, actions, expected_version=expected_version, operation=operation, location=target
            )
        )


def _refuse_if_store_behind(store: Any, table: Any) -> None:
    """No version is committed while its ``<v>.json`` is already published (the store lost it: an
    asynchronous failover, a restore from backup): ``StoreBehindError`` naming ``recover``."""
    from delta_mirror.jobs.published_frontier import nothing_published_at, refuse_if_published
    from delta_mirror.storage import open_store

    if nothing_published_at(table.location):
        return
    latest = store.latest_version(table.id)
    version = table.first_version if latest is None else latest + 1
    refuse_if_published(open_store(table.location), table.name, version, store_latest=latest)


def _check_new_location(name: str, location: str) -> None:
    """A new table's location must be reachable and hold no Delta log (that one is imported instead)."""
    from delta_mirror.delta.log_listing import list_log
    from delta_mirror.delta.log_path import LOG_DIR
    from delta_mirror.errors import TableExistsError
    from delta_mirror.storage import local_path, open_store

    folder = local_path(location)
    if folder is not None and not (folder / LOG_DIR).is_dir():
        return  # nothing there: do not create folders for a commit that may yet be refused
    existing = list_log(open_store(location)).entries
    if existing:
        raise TableExistsError(
            f"{location} already holds a Delta log ({existing[0][0].path})",
            table=name,
            hint=f"import it with `delta-mirror import {location} --table {name}`",
        )


__all__ = ["commit", "import_", "init"]
