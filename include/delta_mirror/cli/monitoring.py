"""Commands that report: ``status`` (lag per table) and ``health`` (the lag SLO, for probes).

Both read the effective table config (``health.coverage.effective_config``): a table it does not
list is "not configured: no DAG publishes it" instead of a lag, one it lists that the store lacks
is "not in store" (asked by name: the one-line error).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import click

from delta_mirror.cli.common import Ctx, emit, errors, json_option, store_option, version_text

_CONFIG_HELP = (
    "Table config (default: $DELTA_MIRROR_CONFIG or config/delta_mirror.yaml when it exists). A table it "
    "does not list has no DAG: 'not configured' instead of a lag"
)


def config_option(extra_help: str = "") -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``--config``: the table config that says which tables a DAG publishes."""
    return click.option(
        "--config",
        "config_path",
        type=click.Path(dir_okay=False),
        default=None,
        help=f"{_CONFIG_HELP}{extra_help}.",
    )


def _status_line(r: Any) -> None:
    """One table's row of ``status``: its lag, or what it has instead (not configured, not in store)."""
    v = version_text
    if not r.in_store:
        click.echo(f"{r.table:<24} {r.note}")
        return
    behind, lag = (f"{r.versions_behind:>6}", f"{r.lag_seconds:>8.1f}") if r.lag_judged else ("-", "-")
    click.echo(
        f"{r.table:<24} {r.state:<8} {v(r.latest_committed):>9} {v(r.last_published):>9} {behind:>6} "
        f"{lag:>8} {v(r.last_checkpoint):>10}  {r.location}"
    )
    if r.note:
        click.echo(f"  {r.note}")


def _name_of(table: Any) -> str:
    return table if isinstance(table, str) else str(table.name)


@click.command()
@click.argument("name", required=False)
@json_option
@click.option(
    "--limit",
    type=click.IntRange(min=1),
    default=None,
    help="Show only the first N tables by name (the text output says how many there are).",
)
@config_option()
@store_option
@click.pass_obj
def status(ctx: Ctx, name: str | None, as_json: bool, limit: int | None, config_path: str | None) -> None:
    """Mirror status and lag per table (a table no DAG publishes: 'not configured' instead)."""
    from delta_mirror.health.coverage import coverage_of, effective_config
    from delta_mirror.health.monitoring import failure_text, resolve_tables
    from delta_mirror.health.status import fleet_status, not_in_store_status

    with errors(ctx, name or None):
        config = effective_config(config_path)
        coverage = coverage_of(config)
        store = ctx.store(read_only=True)
        tables = resolve_tables(store, [name], config) if name else store.list_tables()
        # by name: the store's tables and those the config lists that the store lacks
        listed: list[Any] = list(tables)
        if coverage is not None and not name:
            listed = sorted([*tables, *coverage.missing(t.name for t in tables)], key=_name_of)
        total, shown = len(listed), listed[:limit]
        # a constant number of queries for any number of tables; the latency percentiles for --json
        measured = iter(
            fleet_status(
                store, [t for t in shown if not isinstance(t, str)], latency=as_json, coverage=coverage
            )
        )
        rows = [not_in_store_status(t, config) if isinstance(t, str) else next(measured) for t in shown]

        def text() -> None:
            if not rows:
                click.echo("no tables")
                return
            click.echo(
                f"{'TABLE':<24} {'STATE':<8} {'COMMITTED':>9} {'PUBLISHED':>9} {'BEHIND':>6} "
                f"{'LAG_S':>8} {'CHECKPOINT':>10}  LOCATION"
            )
            for r in rows:
                _status_line(r)
                if r.breaker != "CLOSED":
                    click.echo(
                        f"  circuit breaker {r.breaker}: publishing is paused after repeated transient failures"
                    )
                if r.halted_reason:
                    click.echo(f"  halted: {r.halted_reason}")
                elif r.last_error:
                    click.echo(f"  last error [{r.last_error_class}]: {r.last_error}")
                if r.failure:
                    click.echo(f"  {failure_text(r.failure)}")
            if len(rows) < total:
                click.echo(f"({len(rows)} of {total} tables shown: --limit {limit})")

        emit([r.to_json() for r in rows] if not name else rows[0].to_json(), as_json, text)


def _grace(config: Any, duration_text: str | None, attempts: int | None) -> Callable[[str], Any]:
    """Each table's failure grace: the table config's (its defaults), the flags given overriding."""
    from dataclasses import replace

    from delta_mirror.health.monitoring import FailureGrace, failure_grace_for
    from delta_mirror.table_config import parse_duration

    duration = None
    if duration_text is not None:  # "300" is seconds, as in the table config
        plain = duration_text.strip().replace(".", "", 1).isdigit()
        duration = parse_duration(float(duration_text) if plain else duration_text, "--failure-grace")

    def grace(table: str) -> FailureGrace:
        g = failure_grace_for(config, table)
        if duration is not None:
            g = replace(g, duration=duration)
        return g if attempts is None else replace(g, attempts=attempts)

    return grace


@click.command()
@click.argument("name", required=False)
@json_option
@config_option("; each table's lag_slo comes from it (without one: 15m for every table)")
@click.option("--record", is_flag=True, help="Also store a lag sample per table (lag history).")
@click.option(
    "--failure-grace",
    "grace_text",
    default=None,
    metavar="DURATION",
    help="Unhealthy once a table's publish attempts have failed in a row for this long, e.g. 5m "
    "(default: the table's `failure_grace` in the table config, else 5m).",
)
@click.option(
    "--failure-grace-attempts",
    type=click.IntRange(min=1),
    default=None,
    help="...or this many attempts in a row, whichever first (default: the table's "
    "`failure_grace_attempts`, else 2).",
)
@store_option
@click.pass_obj
def health(
    ctx: Ctx,
    name: str | None,
    as_json: bool,
    config_path: str | None,
    record: bool,
    grace_text: str | None,
    failure_grace_attempts: int | None,
) -> None:
    """Exit 1 when a table breaches its lag SLO, is halted, has failed versions or its publish
    attempts keep failing past the failure grace (for probes and cron). A table no DAG publishes
    (not in the table config) and a configured one the store lacks are warnings, not failures."""
    from delta_mirror.health.coverage import effective_config
    from delta_mirror.health.monitoring import (
        DEFAULT_LAG_RETENTION,
        health_report,
        record_lag_samples,
        resolve_tables,
    )

    with errors(ctx, name or None):
        config = effective_config(config_path)
        store = ctx.store(read_only=not record)
        grace = _grace(config, grace_text, failure_grace_attempts)
        tables = resolve_tables(store, [name], config) if name else store.list_tables()
        report = health_report(store, tables, config, grace=grace, not_in_store=not name)
        if record:

            def retention(table: str) -> Any:
                cfg = config.tables.get(table) if config else None
                return (cfg or config.defaults).lag_history_retention if config else DEFAULT_LAG_RETENTION

            record_lag_samples(store, tables, retention)

        def text() -> None:
            if not report.tables:
                click.echo("no tables")
            for t in report.tables:
                st = t.status
                verdict = "OK  " if t.healthy else "FAIL"
                if not st["in_store"]:
                    what = "not in store"
                elif st["configured"] is False:
                    what = f"not configured, {st['versions_behind']} version(s) not published, state {st['state']}"
                else:
                    what = (
                        f"lag {float(st['lag_seconds']):.1f} s (SLO {t.lag_slo_seconds:.0f} s), "
                        f"{st['versions_behind']} version(s) behind, state {st['state']}"
                    )
                click.echo(f"{verdict} {t.table}: {what}")
                for p in t.problems:
                    click.echo(f"  - {p}")
                for w in t.warnings:
                    click.echo(f"  ~ {w}")
            click.echo("healthy" if report.healthy else "UNHEALTHY")

        emit(report.to_json(), as_json, text)
        if not report.healthy:
            sys.exit(1)


__all__ = ["health", "status"]
