"""``delta-mirror recover``: a store behind its published log caught up, or a lost store rebuilt.

- ``recover NAME...`` / ``recover --all``: the versions published beyond the store's latest (an
  asynchronous failover lost them, or the store was restored from a backup) adopted back,
  byte-identical and verified (``jobs/recover.py``). A table that is not behind prints "nothing to
  recover" and exits 0, as ``git pull`` does when up to date: running it again is always safe.
- ``recover --from-storage FILE``: the store was lost; every table FILE names (``NAME ROOT`` lines,
  or a saved ``delta-mirror status --json``) is imported again from its published log, and the
  recovery point (the version rebuilt up to; anything committed later and never published is lost)
  is printed per table.

Exit codes: 0 done (or nothing to do), 1 an unknown table or a failure, 3 a split brain recover
cannot adopt on top of (the store's latest version differs from the published one).
"""

from __future__ import annotations

import sys
from typing import Any

import click

from delta_mirror.cli.common import Ctx, emit, errors, json_option, store_option


def _publish_with(store: Any) -> Any:
    """Confirm the adopted versions published (the publisher finds each file there, identical); a
    running publisher holding the table's lease will do it instead."""
    from delta_mirror.errors import LeaseHeldError
    from delta_mirror.jobs.publisher import Publisher

    publisher = Publisher(store, cadence_checkpoints=False)

    def publish(name: str) -> None:
        try:
            publisher.publish(name)
        except LeaseHeldError:
            click.echo(f"{name}: a running publisher holds the table's lease; it confirms them", err=True)

    return publish


@click.command()
@click.argument("names", nargs=-1, metavar="[NAME]...")
@click.option("--all", "all_tables", is_flag=True, help="Every table in the store.")
@click.option(
    "--from-storage",
    "from_storage",
    type=click.File("r"),
    default=None,
    metavar="FILE",
    help="The store was lost: rebuild the tables FILE names ('NAME ROOT' lines, or a saved "
    "`status --json`) from their published logs.",
)
@json_option
@store_option
@click.pass_obj
def recover(ctx: Ctx, names: tuple[str, ...], all_tables: bool, from_storage: Any, as_json: bool) -> None:
    """Adopt the versions published beyond the store's latest back into the store (after an
    asynchronous failover or a restore from backup), or rebuild a lost store from storage."""
    if from_storage is not None:
        if names or all_tables:
            raise click.UsageError("--from-storage takes the tables from FILE: give no NAME and no --all")
        _rebuild(ctx, from_storage, as_json)
        return
    if all_tables == bool(names):
        raise click.UsageError("give the table NAMEs to recover, or --all")
    from delta_mirror.jobs.recover import recover_table

    with errors(ctx):
        store = ctx.store()
        wanted = [t.name for t in store.list_tables()] if all_tables else list(names)
    publish = _publish_with(store)
    done: list[Any] = []
    failed = 0
    for name in wanted:
        try:
            with errors(ctx, name):
                recovery = recover_table(store, name, publish=publish)
                done.append(recovery)
                if not as_json:
                    click.echo(recovery.line())
        except SystemExit as exc:
            if not all_tables:
                raise
            failed += 1  # the line is printed; the other tables are still recovered
            code = exc.code
    if as_json:
        emit([r.to_json() for r in done], True, lambda: None)
    if failed:
        sys.exit(code if isinstance(code, int) else 1)


def _rebuild(ctx: Ctx, source: Any, as_json: bool) -> None:
    from delta_mirror.jobs.recover import parse_table_list, rebuild_from_storage

    with errors(ctx):
        tables = parse_table_list(source.read(), getattr(source, "name", "the table list"))
        store = ctx.store()
        done = rebuild_from_storage(
            store,
            tables,
            publish=_publish_with(store),
            progress=None if as_json else (lambda r: click.echo(r.line())),
        )
        if as_json:
            emit([r.to_json() for r in done], True, lambda: None)


__all__ = ["recover"]
