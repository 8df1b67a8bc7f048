"""What every command shares: the context object, the one-line error handling, progress and
``--json`` output, and the options that several commands accept."""

from __future__ import annotations

import atexit
import gc
import json
import os
import re
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import click

from delta_mirror.errors import ErrorClass, MirrorError

#: Exit code per error class (0 ok, 1 failure or validation problems, 2 usage: also an invalid table name).
EXIT_CODES = {ErrorClass.CONFLICT: 3, ErrorClass.DATA: 4, ErrorClass.TRANSIENT: 5, ErrorClass.PERMANENT: 1}
USAGE = 2
#: What the store layer says of a transient error; true of Airflow tasks and the publisher, not of the CLI.
_RETRIED = "retried automatically"


class Ctx:
    """The group's options, handed to every command (``click.pass_obj``)."""

    def __init__(self, store_url: str | None, debug: bool) -> None:
        self.store_url = store_url
        self.debug = debug

    def store(self, *, initialised: bool = True, read_only: bool = False) -> Any:
        """The store; ``read_only`` commands refuse to create the default SQLite file where there is none."""
        from delta_mirror.store import SqlStore

        if read_only and not self.store_url:
            self._existing_default_store()
        store = SqlStore(self.store_url)
        from delta_mirror.store.urls import refuse_read_only

        # a read-only standby as the only node reached: one line now, not a failure at the first write
        refuse_read_only(store.engine, store.url, writes=not read_only)
        if initialised:
            store.ensure_initialised()
        started()  # the engine has imported the driver and its dialect, and connected
        return store

    def _existing_default_store(self) -> None:
        from delta_mirror.config import home, store_url
        from delta_mirror.errors import PermanentError

        url = store_url(None)
        path = home() / "store.db"
        if url == f"sqlite:///{path}" and not path.is_file():
            raise PermanentError(
                f"there is no store here yet: {path} does not exist (nothing was created)",
                hint="create one with `delta-mirror init` (or `make demo`), or point --store, "
                "DELTA_MIRROR_STORE or DELTA_MIRROR_HOME at an existing store",
            )


_starting = False


@contextmanager
def process_start() -> Iterator[None]:
    """The ``delta-mirror`` process (``main``): the cyclic garbage collector is off while it starts.

    Starting is importing SQLAlchemy, the database driver and its dialect, and connecting:
    ~10^5 objects that live until the process ends and no garbage, which the collector walked
    again and again (collections during the imports, a full one at exit: ~10% of the CPU of a
    ``status --json``, issue 15). ``started()`` (the store is open) freezes them (``gc.freeze``:
    no collection walks them again) and turns the collector back on; the end of the command does,
    if no store was opened. Every command opens its store first thing (``serve`` before it serves):
    a new one that runs long must too. In-process callers of the commands (tests) never get here.
    """
    global _starting
    if not gc.isenabled():
        yield
        return
    gc.disable()
    _starting = True
    try:
        yield
    finally:
        started()


def started() -> None:
    """The end of ``process_start``: freeze what start-up made, turn the collector back on (once)."""
    global _starting
    if _starting:
        _starting = False
        gc.freeze()
        gc.enable()


def end_process(code: object) -> None:
    """End the ``delta-mirror`` process now that its command is done, without the interpreter's teardown.

    The teardown frees every module and object one by one and runs the cyclic collector over what
    the command imported (SQLAlchemy, the driver, pyarrow): 0.05-0.1 s of a 1.5 s ``checkpoint``
    that nobody sees. What can be seen still happens, in the interpreter's order: the ``atexit``
    handlers (logging's flush among them), then stdout and stderr flushed. The store's connections
    close with the process: PostgreSQL sees the socket close instead of a goodbye message (logged at
    DEBUG1 only, outside a transaction), a SQLite store keeps its WAL file as it did before.
    Returns (the caller raises ``SystemExit`` as usual) when another thread still runs, the code is
    a message, or a flush fails (a closed pipe): the interpreter's own exit handles those.
    """
    if not (code is None or isinstance(code, int)):
        return  # a message: Python prints it and exits 1
    if any(
        t.is_alive() and not t.daemon for t in threading.enumerate() if t is not threading.current_thread()
    ):
        return
    atexit._run_exitfuncs()
    try:
        for stream in (sys.stdout, sys.stderr):
            if stream is not None:  # None without a console (pythonw)
                stream.flush()
    except (OSError, ValueError):
        return
    os._exit(code if isinstance(code, int) else 0)


def _cli_hint(exc: MirrorError) -> None:
    """The CLI does not retry: a transient error says to run the command again (exit 5)."""
    if exc.retryable and exc.hint and exc.hint.startswith(_RETRIED):
        rest = exc.hint[len(_RETRIED) :].lstrip("; ")
        exc.hint = "not retried by this command: safe to run it again" + (f"; {rest}" if rest else "")


def _check_name(table: str | None) -> None:
    """An invalid table name on the command line is a usage error (exit 2), before the store is touched."""
    from delta_mirror.errors import PermanentError
    from delta_mirror.store.tables import check_table_name

    if table is None:
        return
    try:
        check_table_name(table)
    except PermanentError as exc:
        click.echo(f"error: {one_line(exc.message)}", err=True)
        sys.exit(USAGE)


def one_line(text: str) -> str:
    """Error text as one line: drivers and object stores put newlines (and debug dumps) in theirs."""
    return " ".join(re.split(r"\n\s*Debug source:", text)[0].split())


@contextmanager
def errors(ctx: Ctx, table: str | None = None) -> Iterator[None]:
    """Errors become one ``error:`` line naming the table (what, where, what to do); no traceback."""
    _check_name(table)
    try:
        yield
    except MirrorError as exc:
        if ctx.debug:
            raise
        if exc.table is None:
            exc.table = table
        _cli_hint(exc)
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


#: ``--json`` on every command that reports something: one JSON document on stdout, for scripts.
json_option = click.option(
    "--json", "as_json", is_flag=True, help="Print the result as one JSON document instead of text."
)


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


__all__ = [
    "EXIT_CODES",
    "USAGE",
    "Ctx",
    "emit",
    "end_process",
    "errors",
    "json_option",
    "one_line",
    "process_start",
    "progress",
    "started",
    "store_option",
    "version_text",
]
