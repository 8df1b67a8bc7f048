"""What every command shares: the context object, the one-line error handling, progress and
``--json`` output, and the options that several commands accept."""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import click

from delta_mirror.errors import ErrorClass, MirrorError

#: Exit code per error class (0 ok, 1 failure or validation problems, 2 usage).
EXIT_CODES = {ErrorClass.CONFLICT: 3, ErrorClass.DATA: 4, ErrorClass.TRANSIENT: 5, ErrorClass.PERMANENT: 1}


class Ctx:
    """The group's options, handed to every command (``click.pass_obj``)."""

    def __init__(self, store_url: str | None, debug: bool) -> None:
        self.store_url = store_url
        self.debug = debug

    def store(self, *, initialised: bool = True) -> Any:
        from delta_mirror.store import SqlStore

        store = SqlStore(self.store_url)
        if initialised:
            store.ensure_initialised()
        return store


def one_line(text: str) -> str:
    """Error text as one line: drivers and object stores put newlines (and debug dumps) in theirs."""
    return " ".join(re.split(r"\n\s*Debug source:", text)[0].split())


@contextmanager
def errors(ctx: Ctx, table: str | None = None) -> Iterator[None]:
    """Errors become one ``error:`` line naming the table (what, where, what to do); no traceback."""
    try:
        yield
    except MirrorError as exc:
        if ctx.debug:
            raise
        if exc.table is None:
            exc.table = table
        exc.what = one_line(exc.what)
        click.echo(f"error: {one_line(exc.message)}", err=True)
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
            f"error: {where}unexpected {type(exc).__name__}: {one_line(str(exc))[:300]} — this is a bug; "
            "rerun with --debug for the traceback and report it",
            err=True,
        )
        sys.exit(1)


def progress(label: str) -> Callable[[int, int], None] | None:
    """A progress line on a terminal (stderr), nothing when piped."""
    if not sys.stderr.isatty():
        return None

    def report(done: int, total: int) -> None:
        end = "\n" if done >= total else ""
        click.echo(f"\r{label}: {done}/{total}", err=True, nl=False)
        if end:
            click.echo("", err=True)

    return report


def emit(data: object, as_json: bool, text: Callable[[], None]) -> None:
    """``--json``: the data as JSON on stdout; else the command's text lines."""
    if as_json:
        click.echo(json.dumps(data, indent=2, default=str))
    else:
        text()


def store_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The store option, accepted after the sub-command too (``delta-mirror status --store URL``)."""

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


def version_text(value: int | None) -> str:
    """A version for a table column (``-`` for none)."""
    return "-" if value is None else str(value)


__all__ = ["EXIT_CODES", "Ctx", "emit", "errors", "one_line", "progress", "store_option", "version_text"]
