"""Commands that report: ``status`` (lag per table) and ``health`` (the lag SLO, for probes)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import click

from delta_mirror.cli.common import Ctx, emit, errors, store_option, version_text


@click.command()
@click.argument("name", required=False)
@click.option("--json", "as_json", is_flag=True)
@click.option(
    "--limit",
    type=click.IntRange(min=1),
    default=None,
    help="Show only the first N tables by name (the text output says how many there are).",
)
@store_option
@click.pass_obj
def status(ctx: Ctx, name: str | None, as_json: bool, limit: int | None) -> None:
    """Mirror status and lag per table."""
    from delta_mirror.health.monitoring import failure_text
    from delta_mirror.health.status import fleet_status

    with errors(ctx, name or None):
        store = ctx.store(read_only=True)
        tables = [store.get_table(name)] if name else store.list_tables()
        total = len(tables)
        # a constant number of queries for any number of tables; the latency percentiles for --json
        rows = fleet_status(store, tables[:limit], latency=as_json)

        def text() -> None:
            if not rows:
                click.echo("no tables")
                return
            click.echo(
                f"{'TABLE':<24} {'STATE':<8} {'COMMITTED':>9} {'PUBLISHED':>9} {'BEHIND':>6} "
                f"{'LAG_S':>8} {'CHECKPOINT':>10}  LOCATION"
            )
            v = version_text
            for r in rows:
                click.echo(
                    f"{r.table:<24} {r.state:<8} {v(r.latest_committed):>9} {v(r.last_published):>9} "
                    f"{r.versions_behind:>6} {r.lag_seconds:>8.1f} {v(r.last_checkpoint):>10}  {r.location}"
                )
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
    attempts keep failing past the failure grace (for probes and cron)."""
    from pathlib import Path

    from delta_mirror.health.monitoring import DEFAULT_LAG_RETENTION, health_report, record_lag_samples
    from delta_mirror.table_config import default_config_path, load_config

    with errors(ctx, name or None):
        store = ctx.store(read_only=not record)
        config = None
        if config_path:
            config = load_config(Path(config_path))
        elif default_config_path().is_file():
            config = load_config(default_config_path())
        grace = _grace(config, grace_text, failure_grace_attempts)
        tables = [store.get_table(name)] if name else store.list_tables()
        report = health_report(store, tables, config, grace=grace)
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
                click.echo(
                    f"{verdict} {t.table}: lag {float(st['lag_seconds']):.1f} s (SLO {t.lag_slo_seconds:.0f} s), "
                    f"{st['versions_behind']} version(s) behind, state {st['state']}"
                )
                for p in t.problems:
                    click.echo(f"  - {p}")
                for w in t.warnings:
                    click.echo(f"  ~ {w}")
            click.echo("healthy" if report.healthy else "UNHEALTHY")

        emit(report.to_json(), as_json, text)
        if not report.healthy:
            sys.exit(1)


__all__ = ["health", "status"]
