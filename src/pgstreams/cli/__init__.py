"""The ``pgstreams`` command line.

Commands: ``migrate``, ``cluster init|describe``, ``topics create|list|describe|alter|delete``,
``produce``, ``consume``, ``cdc add|list|describe|remove|run``,
``groups list|describe|reset|delete``, ``worker``, ``maintain``, ``retention``, ``dlt replay`` and
``quickstart``; ``docs/cli.md`` describes each one (``worker``:
``docs/workers.md``).

Exit codes: 0 on success, 2 on usage errors (bad options or values, invalid names, a time without a zone,
a bad input line for ``produce``), 1 on other errors (unknown topic or group, cannot connect, ...),
130 on Ctrl-C. Errors are printed as one line, ``error: ...``, on stderr; set ``PGSTREAMS_DEBUG=1`` to
get the traceback instead.

Modules: :mod:`.common` (exit codes, errors and their exit codes, the options every command takes,
opening the database, parsing option values), :mod:`.cluster` (the layout of a cluster of shards),
:mod:`.output` (everything printed: each model's JSON form
and table), and one module per command group (:mod:`.migrate`, :mod:`.topics`, :mod:`.produce`,
:mod:`.consume`, :mod:`.groups`, :mod:`.worker`, :mod:`.maintain`, :mod:`.dlt`, :mod:`.quickstart`), each
with a ``register(app)`` that
adds its commands to the root application :data:`app`; :mod:`.plugins` adds the commands of
applications, declared as entry points of the ``pgstreams.commands`` group (:data:`COMMANDS_GROUP`): each
names a callable that receives :data:`app` and adds its commands. :func:`run_app` runs any typer
application with these exit codes and error messages.

Adding a command: write one function that takes ``dsn: DsnOption = None`` and
``schema: SchemaOption = DEFAULT_SCHEMA``, opens the database with ``with open_client(dsn, schema) as
client:``, prints through :mod:`.output`, and raises :class:`pgstreams.PgStreamsError` subclasses or
:class:`CliError` (``usage_error(...)`` for exit 2); register it with ``app.command("name")(function)``.
:func:`main` turns every exception into the one-line message and exit code.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from types import FrameType
from typing import Annotated, NoReturn

import typer

import pgstreams

from . import (
    cdc,
    cluster,
    console,
    consume,
    dlt,
    groups,
    kafka,
    maintain,
    metrics,
    migrate,
    produce,
    quickstart,
    security,
    server,
    topics,
    worker,
)
from .common import (
    DEFAULT_SCHEMA,
    EXIT_BROKEN_PIPE,
    EXIT_FAILURE,
    EXIT_INTERRUPTED,
    EXIT_TERMINATED,
    EXIT_USAGE,
    TERMINATING,
    CliError,
    DsnOption,
    JsonOption,
    SchemaOption,
    StdoutClosed,
    Terminated,
    check_dsn,
    exit_code_of,
    one_line,
    open_client,
    open_connection,
    parse_headers,
    parse_start,
    parse_time,
    report_error,
    resolve,
    usage_error,
)
from .consume import DEFAULT_CONSUME_BATCH, DEFAULT_CONSUME_WAIT
from .groups import groups_app, groups_describe, groups_list
from .migrate import migrate_command
from .output import err_console, event_json, group_table, iso, out_console, print_json, write_stdout
from .plugins import COMMANDS_GROUP, PluginFailure, RootGroup, load_commands
from .produce import DEFAULT_PRODUCE_BATCH
from .topics import topics_app, topics_create, topics_delete, topics_describe, topics_list
from .worker import worker_command

__all__ = [
    "COMMANDS_GROUP",
    "DEFAULT_CONSUME_BATCH",
    "DEFAULT_CONSUME_WAIT",
    "DEFAULT_PRODUCE_BATCH",
    "DEFAULT_SCHEMA",
    "EXIT_BROKEN_PIPE",
    "EXIT_FAILURE",
    "EXIT_INTERRUPTED",
    "EXIT_TERMINATED",
    "EXIT_USAGE",
    "CliError",
    "DsnOption",
    "JsonOption",
    "PluginFailure",
    "SchemaOption",
    "StdoutClosed",
    "app",
    "check_dsn",
    "err_console",
    "event_json",
    "exit_code_of",
    "group_table",
    "groups_app",
    "groups_describe",
    "groups_list",
    "iso",
    "load_commands",
    "main",
    "migrate_command",
    "one_line",
    "open_client",
    "open_connection",
    "out_console",
    "parse_headers",
    "parse_start",
    "parse_time",
    "print_json",
    "report_error",
    "resolve",
    "run",
    "run_app",
    "topics_app",
    "topics_create",
    "topics_delete",
    "topics_describe",
    "topics_list",
    "usage_error",
    "worker_command",
    "write_stdout",
]

_HELP = (
    "Kafka-like durable event streaming on PostgreSQL.\n\n"
    "Every command takes --dsn (default: $PGSTREAMS_DSN, else libpq's PGSERVICE/PGHOST environment, else the "
    "embedded PostgreSQL) and --schema."
)


#: The root ``pgstreams`` application; each command module adds its commands with ``register(app)``.
app = typer.Typer(name="pgstreams", help=_HELP, no_args_is_help=True, add_completion=False,
                  pretty_exceptions_enable=False, cls=RootGroup)
for _module in (migrate, cluster, topics, produce, consume, groups, worker, maintain, dlt, cdc, metrics,
                console, kafka, quickstart, security, server):
    _module.register(app)


def _version_callback(value: bool) -> None:
    if value:
        sys.stdout.write(f"pgstreams {pgstreams.__version__}\n")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: Annotated[bool, typer.Option("--version", help="Print the version and exit.", is_eager=True,
                                          callback=_version_callback)] = False,
) -> None:
    """Kafka-like durable event streaming on PostgreSQL."""


# -- running -----------------------------------------------------------------------------------------
def run_app(typer_app: typer.Typer, argv: Sequence[str] | None = None, prog_name: str = "pgstreams") -> int:
    """Run ``typer_app`` on ``argv`` (default: ``sys.argv[1:]``) the way ``pgstreams`` runs, and return the
    exit code instead of exiting; ``prog_name`` (default ``"pgstreams"``) names the program in usage lines.

    An exception ends the command with the one-line message ``error: ...`` on stderr and the exit code of
    :func:`exit_code_of` (2 for usage errors, 1 for the others); set ``$PGSTREAMS_DEBUG`` to get the
    exception raised instead. ``typer.Exit(n)`` exits with ``n``, Ctrl-C with 130, and a closed stdout
    (``| head``) quietly with 141.
    """
    command = typer.main.get_command(typer_app)
    restore = _end_on_sigterm()
    try:
        rv = command.main(args=list(argv) if argv is not None else None, prog_name=prog_name,
                          standalone_mode=False)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except Terminated:
        return EXIT_TERMINATED
    except (BrokenPipeError, StdoutClosed):
        _silence_stdout()
        return EXIT_BROKEN_PIPE
    except typer.Exit as exc:
        return exc.exit_code
    except Exception as exc:
        if os.environ.get("PGSTREAMS_DEBUG"):
            raise
        code, message = exit_code_of(exc)
        if message is not None:
            report_error(message)
        return code
    finally:
        restore()
    return rv if isinstance(rv, int) else 0


def _terminated(signum: int, frame: FrameType | None) -> None:
    TERMINATING.set()  # kept: the exception may be lost on its way (see check_terminated)
    raise Terminated()


def _end_on_sigterm() -> Callable[[], None]:
    """Make SIGTERM raise :class:`Terminated` while a command runs (SIGTERM's default action ends the
    process at once, without its exit handlers); returns what puts the former handler back. Only in the
    main thread, and only over the default action (an application's own handler stays)."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return lambda: None
    TERMINATING.clear()
    signal.signal(signal.SIGTERM, _terminated)

    def restore() -> None:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)

    return restore


def run(argv: Sequence[str] | None = None) -> int:
    """Run the command line with ``argv`` (default: ``sys.argv[1:]``) and return the exit code; the
    commands of applications (:data:`COMMANDS_GROUP` entry points) are added first."""
    load_commands(app)
    return run_app(app, argv, "pgstreams")


def main() -> NoReturn:
    """Console-script entry point: run the command line on ``sys.argv`` and exit with its code."""
    sys.exit(run())


def _silence_stdout() -> None:
    # the reader went away: point stdout at /dev/null so the interpreter's final flush stays quiet
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # pragma: no cover
        pass
