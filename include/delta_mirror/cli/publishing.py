"""Commands that publish and repair: ``mirror``, ``sync``, ``checkpoint``, ``validate``,
``reconcile`` and ``resume``."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import click

from delta_mirror.cli.common import Ctx, emit, errors, json_option, progress, store_option
from delta_mirror.errors import DataError, TableNotFoundError
from delta_mirror.jobs.validate.readers import reader_names
from delta_mirror.store.states import TableState
from delta_mirror.table_config import CheckpointEngine

if TYPE_CHECKING:
    from delta_mirror.table_config import CheckpointSettings, TableConfig


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
        type=click.Choice([e.value for e in CheckpointEngine]),
        default=None,
        help="Who builds checkpoints: in-process (local), Spark (reads the store over JDBC), or auto by "
        "file count (default: the table's `checkpoint.engine` in the table config when it exists, else local).",
    )(fn)


def _table_config(config_path: str | None, name: str) -> TableConfig | None:
    """The table's settings from the table config (its defaults if unlisted), when there is one."""
    from delta_mirror.health.coverage import effective_config

    config = effective_config(config_path)
    return None if config is None else config.settings_for(name)


@contextmanager
def _in_store(name: str, config_path: str | None) -> Iterator[None]:
    """A table the store lacks is the one line that says whether the table config (this command's
    ``--config``) lists it and what to do; the publisher refuses it before writing anything."""
    try:
        yield
    except TableNotFoundError as exc:
        if exc.table != name:
            raise
        from delta_mirror.health.coverage import effective_config, not_in_store_error

        raise not_in_store_error(name, effective_config(config_path)) from None


def _checkpoint_settings(config_path: str | None, name: str) -> CheckpointSettings | None:
    """The table's ``checkpoint`` settings from the table config, when there is one."""
    cfg = _table_config(config_path, name)
    return cfg.checkpoint if cfg else None


@click.command()
@click.argument("name")
@click.option("--to-version", type=click.IntRange(min=0), help="Publish up to this version (default: all).")
@json_option
@engine_options
@store_option
@click.pass_obj
def mirror(
    ctx: Ctx, name: str, to_version: int | None, as_json: bool, engine: str | None, config_path: str | None
) -> None:
    """Publish pending versions (and checkpoints when due) to the table's location."""
    from delta_mirror.spark.checkpoint_choice import engines_used, publisher_for

    with errors(ctx, name), _in_store(name, config_path):
        # Spark starts only if a checkpoint is due
        publisher = publisher_for(ctx.store(), name, engine, settings=_checkpoint_settings(config_path, name))
        result = publisher.publish(name, to_version, progress=progress(f"publishing {name}"))
        used = sorted(set(engines_used(publisher)))
        engines = f" ({', '.join(used)} engine)" if used else ""

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

        emit(result.to_json(), as_json, text)


@click.command()
@click.argument("name")
@json_option
@engine_options
@store_option
@click.pass_obj
def sync(ctx: Ctx, name: str, as_json: bool, engine: str | None, config_path: str | None) -> None:
    """What one `sync` task of the table's DAG does: publish every pending version, checkpoint when
    due, validate the new versions when `validate_every` has passed, record the lag sample.

    The cadence, reader and engine come from the table config (its defaults without one).
    Exit 1 on a validation problem.
    """
    from functools import partial

    from delta_mirror.jobs.sync import sync_table
    from delta_mirror.spark.checkpoint_choice import publisher_for
    from delta_mirror.table_config import TableConfig

    with errors(ctx, name), _in_store(name, config_path):
        cfg = _table_config(config_path, name) or TableConfig(name=name)
        store = ctx.store()
        result = sync_table(
            store,
            name,
            make_publisher=partial(publisher_for, store, name, engine, settings=cfg.checkpoint),
            validate_every=cfg.validate_every if cfg.validate else None,
            reader=cfg.reader,
            lag_retention=cfg.lag_history_retention,
        )
        summary = result.to_json()

        def text() -> None:
            v = summary["validation"]
            checked = v["state"]
            if "ok" in v:
                verdict = "OK" if v["ok"] else f"{v['problems']} problem(s)"
                checked = f"versions {v['from_version']}..{v['to_version']}: {verdict}"
            click.echo(
                f"'{name}': published {summary['published']} version(s) through {summary['last_published']}; "
                f"checkpoint {', '.join(map(str, summary['checkpoints'])) or 'not due'}; "
                f"validation {checked}; lag {result.status.lag_seconds:.1f} s"
            )
            for p in result.report.problems if result.report else []:
                click.echo(f"PROBLEM [{p.kind}] version {p.version}: {p.message}\n  what to do: {p.hint}")

        emit(summary, as_json, text)
        if result.report is not None and not result.report.ok:
            sys.exit(1)


@click.command()
@click.argument("name")
@click.option(
    "--version", type=click.IntRange(min=0), help="The published version to checkpoint (default: the last)."
)
@engine_options
@store_option
@click.pass_obj
def checkpoint(ctx: Ctx, name: str, version: int | None, engine: str | None, config_path: str | None) -> None:
    """Write a checkpoint (default: at the last published version)."""
    from delta_mirror.spark.checkpoint_choice import last_engine, publisher_for

    with errors(ctx, name), _in_store(name, config_path):
        publisher = publisher_for(ctx.store(), name, engine, settings=_checkpoint_settings(config_path, name))
        v = publisher.checkpoint(name, version)
        click.echo(f"checkpoint written for '{name}' at version {v} ({last_engine(publisher)} engine)")


@click.command()
@click.argument("name")
@click.option(
    "--from-version", type=click.IntRange(min=0), help="First version to compare (default: the first)."
)
@click.option(
    "--to-version", type=click.IntRange(min=0), help="Last version to compare (default: the last published)."
)
@click.option(
    "--reader",
    type=click.Choice(reader_names()),
    default="deltalake",
    show_default=True,
    help="auto: deltalake, and Delta-Spark for the versions deltalake cannot read (when installed).",
)
@click.option("--strict", is_flag=True, help="Fail on reader limitations too, not only on mirror problems.")
@json_option
@store_option
@click.pass_obj
def validate(
    ctx: Ctx,
    name: str,
    from_version: int | None,
    to_version: int | None,
    reader: str,
    strict: bool,
    as_json: bool,
) -> None:
    """Compare a reader's view of the published table and the log listing with the store.

    Exit 1 on a mirror problem; a reader limitation (the table is right, the reader cannot read it)
    is reported with the reader to use instead, and fails only with --strict.
    """
    from delta_mirror.jobs.validate import validate_table

    with errors(ctx, name):
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
            for lim in report.limitations:
                where = f"version {lim.version}: " if lim.version is not None else ""
                click.echo(
                    f"LIMITATION [{lim.reader}] {where}{lim.message}\n  read it with: {lim.use_instead}"
                )
            for note in report.fallbacks:
                click.echo(f"NOTE {note}")
            verdict = "OK" if report.ok else f"{len(report.problems)} problem(s)"
            if report.limitations:
                verdict += f", {len(report.limitations)} reader limitation(s)" + (
                    " (--strict)" if strict else ""
                )
            click.echo(
                f"validated '{name}' versions {report.from_version}..{report.to_version} "
                f"({report.versions_checked} checked with {reader}): {verdict}"
            )

        emit(report.to_json(), as_json, text)
        if not report.passed(strict=strict):
            sys.exit(1)


@click.command()
@click.argument("name", required=False)
@click.option(
    "--strategy",
    type=click.Choice(["incremental", "full", "smart"]),
    default="incremental",
    show_default=True,
    help="incremental: re-drive PENDING / FAILED / stuck versions; full: also list _delta_log/ against the store and repair what is safe; smart: full only where there are signs of trouble.",
)
@json_option
@store_option
@click.pass_obj
def reconcile(ctx: Ctx, name: str | None, strategy: str, as_json: bool) -> None:
    """Re-drive failed, stuck and lagging versions (every table, or NAME)."""
    from delta_mirror.jobs.reconcile import reconcile as run_reconcile

    with errors(ctx):
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

        emit(report.to_json(), as_json, text)
        if any(t.action in ("failed", "halted") for t in report.tables):
            sys.exit(1)


@click.command()
@click.argument("name")
@store_option
@click.pass_obj
def resume(ctx: Ctx, name: str) -> None:
    """Clear a halted table after its cause was fixed; failed versions are retried."""
    with errors(ctx, name):
        store = ctx.store()
        table = store.get_table(name)
        halted = table.state == TableState.HALTED
        if halted:
            store.resume_table(table.id)
        failed = store.status_rows(table.id, states=("FAILED", "CONFLICT"))
        for row in failed:
            store.mark_failed(
                table.id, row.version, row.artifact, "PENDING", row.error_class or "", row.last_error or ""
            )
        queued = f"; {len(failed)} failed version(s) queued again" if failed else ""
        if halted:
            click.echo(f"'{name}' is active again{queued}; run `delta-mirror mirror {name}`")
        elif failed:
            click.echo(f"'{name}' was not halted{queued}; run `delta-mirror mirror {name}`")
        else:
            click.echo(f"'{name}' was not halted and has no failed versions: nothing to resume")


__all__ = ["checkpoint", "engine_options", "mirror", "reconcile", "resume", "sync", "validate"]
