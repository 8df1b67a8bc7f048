"""The ``delta-mirror`` command line.

Errors print one line (what, which table/version, what to do) and exit non-zero; ``--debug``
shows the traceback. Exit codes: 0 ok, 1 failure or validation problems, 2 usage, 3 conflict,
4 invalid data, 5 transient (safe to retry).

The commands live by topic: ``tables`` (init, import, commit), ``publishing`` (mirror, sync,
checkpoint, validate, reconcile, resume), ``recovery`` (recover: a store behind its
published log, a lost store rebuilt), ``monitoring`` (status, health), ``service`` (serve),
``jars`` (jar: where the jars shipped in the package are).
"""

from __future__ import annotations

import logging

import click

from delta_mirror.cli import jars, monitoring, publishing, recovery, service, tables
from delta_mirror.cli.common import EXIT_CODES, Ctx, end_process, process_start
from delta_mirror.version import __version__


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


for _command in (
    tables.init,
    tables.import_,
    tables.commit,
    publishing.mirror,
    publishing.sync,
    publishing.checkpoint,
    publishing.validate,
    publishing.reconcile,
    publishing.resume,
    recovery.recover,
    monitoring.status,
    monitoring.health,
    service.serve,
    jars.jar,
):
    cli.add_command(_command)
del _command


def main(argv: list[str] | None = None) -> None:
    """The console script (``delta-mirror``) and ``python -m delta_mirror.cli``: both call it without
    ``argv``, and the process ends as soon as the command has (``end_process``). With ``argv`` (a
    caller in this interpreter) it raises ``SystemExit`` as Click does."""
    try:
        with process_start():
            cli.main(args=argv, prog_name="delta-mirror")
    except SystemExit as exc:
        if argv is None:
            end_process(exc.code)
        raise


__all__ = ["EXIT_CODES", "cli", "main"]
