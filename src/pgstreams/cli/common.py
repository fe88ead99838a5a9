"""What every command shares: exit codes, errors and how they map to exit codes, the ``--dsn`` /
``--schema`` / ``--pooler`` / ``--json`` options, opening the database, and parsing of ``--from`` and
``--header`` values."""

from __future__ import annotations

import inspect
import re
import sys
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timezone
from typing import Annotated

import psycopg
import typer
from psycopg.conninfo import conninfo_to_dict

import pgstreams
from pgstreams.cluster import ClusterClient, split_dsns
from pgstreams.connecting import env_dsn, resolve_dsns
from pgstreams.consumer import Start
from pgstreams.errors import InvalidArgument, InvalidName, PgStreamsError

# The name rules live in the core's name module; checking a name before connecting makes a bad name a
# usage error (exit 2) even when the database cannot be reached.
from pgstreams.names import check_schema
from pgstreams.pooler import check_listen_dsn, check_pooler, connection_options
from pgstreams.reconnect import redact

from .output import err_console

#: Exit code of a usage error (bad option, name, value or input line).
EXIT_USAGE = 2
#: Exit code of any other error.
EXIT_FAILURE = 1
#: Exit code after Ctrl-C.
EXIT_INTERRUPTED = 130
#: Exit code after SIGTERM, as a shell reports it (128 + 15).
EXIT_TERMINATED = 143
#: Set when SIGTERM arrives while a command runs (see :func:`check_terminated`).
TERMINATING = threading.Event()


class Terminated(BaseException):
    """SIGTERM arrived while a command ran (outside the waits that handle it themselves): the command
    ends as after Ctrl-C, leaving its ``with`` blocks and running the exit handlers (the embedded server
    is released: it stops when no other process uses it), with exit code :data:`EXIT_TERMINATED`."""


def check_terminated() -> None:
    """Raise :class:`Terminated` if SIGTERM arrived during the command. The signal raises it wherever the
    command is, and there a clean-up may replace it with an error of its own that is then handled (psycopg
    leaving a pipeline that was busy, for one): the loops and waits of the commands that run until stopped
    check this too, so that such a SIGTERM still stops them."""
    if TERMINATING.is_set():
        raise Terminated()


#: Exit code when stdout is closed early (``pgstreams consume ... | head``), as a shell reports SIGPIPE.
EXIT_BROKEN_PIPE = 141

#: The schema commands use without ``--schema``: the default of :func:`pgstreams.connect`.
DEFAULT_SCHEMA: str = str(inspect.signature(pgstreams.connect).parameters["schema"].default)

DsnOption = Annotated[
    list[str] | None,
    typer.Option("--dsn", help="PostgreSQL DSN; repeat it for the shards of a cluster, in order (commands on "
                 "topics, produce, consume and cluster). Default: $PGSTREAMS_DSN (several separated by "
                 "commas), else the embedded PostgreSQL.",
                 show_default=False),
]
SchemaOption = Annotated[str, typer.Option("--schema", help="Schema holding the pgstreams tables.")]
PoolerOption = Annotated[
    str | None,
    typer.Option("--pooler", help="The mode of a connection pooler between this command and PostgreSQL: "
                 "session (the default: none, or one in session mode) or transaction (PgBouncer's "
                 "pool_mode = transaction: nothing is kept in a server session between transactions; see "
                 "docs/operations.md).", show_default=False),
]
ListenDsnOption = Annotated[
    str | None,
    typer.Option("--listen-dsn", help="With --pooler transaction: a DSN of the same database that reaches "
                 "PostgreSQL straight or through a pooler in session mode, for the LISTEN connection that "
                 "wakes waiting consumers (without it they poll).", show_default=False),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]


# -- errors ------------------------------------------------------------------------------------------
class CliError(Exception):
    """An error reported as one line on stderr, exiting with ``exit_code`` (default 1)."""

    def __init__(self, message: str, exit_code: int = EXIT_FAILURE) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class StdoutClosed(Exception):
    """stdout was closed by its reader; the command stops quietly with exit code 141."""


def usage_error(message: str) -> CliError:
    """A :class:`CliError` for something the user typed wrong (exit code 2)."""
    return CliError(message, EXIT_USAGE)


def one_line(text: str) -> str:
    """``text`` on one line: line breaks (with the blanks around them) become ``"; "``."""
    return re.sub(r"\s*\n\s*", "; ", str(text).strip()) or "unknown error"


def report_error(message: str) -> None:
    """Print ``error: MESSAGE`` (on one line, see :func:`one_line`) on stderr."""
    try:
        sys.stderr.write(f"error: {one_line(message)}\n")
        sys.stderr.flush()
    except OSError:  # pragma: no cover - stderr is gone too
        pass


def exit_code_of(exc: BaseException) -> tuple[int, str | None]:
    """The exit code for an exception and the message to print (``None``: print nothing), without any
    password of a DSN (see :func:`pgstreams.reconnect.redact`)."""
    code, message = _exit_code_of(exc)
    if message is None:
        return code, None
    for dsn in split_dsns(env_dsn() or ""):
        message = redact(message, dsn)
    return code, redact(message, None)


def _exit_code_of(exc: BaseException) -> tuple[int, str | None]:
    """The exit code for an exception and the message to print (``None``: print nothing).

    :class:`CliError` carries its code; :class:`pgstreams.InvalidName` / :class:`pgstreams.InvalidArgument`
    and click's usage errors are 2; other :class:`pgstreams.PgStreamsError`, database and OS errors, and
    anything unexpected are 1.
    """
    if isinstance(exc, CliError):
        return exc.exit_code, str(exc)
    if isinstance(exc, (InvalidName, InvalidArgument)):
        return EXIT_USAGE, str(exc)
    if isinstance(exc, PgStreamsError):
        return EXIT_FAILURE, str(exc)
    if isinstance(exc, psycopg.Error):
        return EXIT_FAILURE, f"database error: {exc}"
    if isinstance(exc, typer.TyperException):  # click's ClickException / UsageError (exit code 2)
        code = int(getattr(exc, "exit_code", EXIT_FAILURE))
        if type(exc).__name__ == "NoArgsIsHelpError":
            return code, None  # the help text was already printed
        msg = exc.format_message()
        ctx = getattr(exc, "ctx", None)
        if ctx is not None and code == EXIT_USAGE:
            msg = f"{one_line(msg)} (see '{ctx.command_path} --help')"
        return code, msg
    if isinstance(exc, typer.Abort):
        return EXIT_FAILURE, "aborted"
    if isinstance(exc, OSError):
        return EXIT_FAILURE, str(exc)
    return EXIT_FAILURE, f"unexpected {type(exc).__name__}: {exc}"


# -- the database ------------------------------------------------------------------------------------
def check_dsn(dsn: str | None) -> str | None:
    """Validate the syntax of a ``--dsn`` value (exit 2 when malformed); ``None``/empty means default."""
    if not dsn:
        return None
    for part in split_dsns(dsn) or [dsn]:  # one value may hold several DSNs separated by commas
        try:
            conninfo_to_dict(part)
        except psycopg.Error as exc:
            raise usage_error(f"invalid --dsn: {redact(str(exc), part)}") from None
    return dsn


def given_dsns(dsn: str | Sequence[str] | None) -> list[str]:
    """The ``--dsn`` values given (each checked, see :func:`check_dsn`); empty when none was."""
    items = [dsn] if isinstance(dsn, str) else list(dsn or ())
    return [d for d in (check_dsn(item) for item in items) if d is not None]


def _resolved(dsn: str | Sequence[str] | None) -> list[str]:
    """The servers named by the ``--dsn`` values, or without one by ``$PGSTREAMS_DSN``, libpq's environment
    or the embedded server (started on demand, with a spinner on a terminal): exactly what
    :func:`pgstreams.connect` accepts (see :func:`pgstreams.connecting.resolve_dsns`). One ``--dsn`` may
    hold several DSNs separated by commas, as ``$PGSTREAMS_DSN`` may."""
    given = given_dsns(dsn)
    if len(given) > 1:  # --dsn repeated, each perhaps holding several
        return resolve_dsns([part for value in given for part in split_dsns(value)])
    if not given and not env_dsn():
        console = err_console()
        if console.is_terminal:
            with console.status("starting the embedded PostgreSQL..."):
                return resolve_dsns(None)
    return resolve_dsns(given[0] if given else None)


def resolve(dsn: str | Sequence[str] | None) -> str:
    """The one server's DSN: ``--dsn``, else ``$PGSTREAMS_DSN``, else libpq's environment, else the
    embedded server (started on demand). Several DSNs (a cluster) are a usage error: the command works on
    one server."""
    dsns = _resolved(dsn)
    if len(dsns) > 1:
        raise usage_error(f"this command works on one server, but {len(dsns)} DSNs (the shards of a cluster) "
                          "were given: give one --dsn")
    return dsns[0]


def resolve_all(dsn: str | Sequence[str] | None) -> list[str]:
    """Every DSN given: the ``--dsn`` values (each may hold several separated by commas), else those of
    ``$PGSTREAMS_DSN``, else the one server :func:`resolve` finds."""
    return _resolved(dsn)


@contextmanager
def open_client(dsn: str | Sequence[str] | None, schema: str, *, migrate: bool = True,
                pooler: str | None = None, listen_dsn: str | None = None) -> Iterator[pgstreams.Client]:
    """Connect to ``schema`` of one server (applying pending migrations unless ``migrate``, default true,
    is false; ``pooler`` and ``listen_dsn``: the ``--pooler`` and ``--listen-dsn`` values) and close on
    exit."""
    check_schema(schema)
    mode = check_pooler(pooler, "--pooler")
    listen = check_listen_dsn(listen_dsn, "--listen-dsn")
    client = pgstreams.Client(resolve(dsn), schema=schema, migrate=migrate, pooler=mode, listen_dsn=listen)
    try:
        yield client
    finally:
        client.close()


@contextmanager
def open_any(dsn: str | Sequence[str] | None, schema: str, *, pooler: str | None = None,
             listen_dsn: str | None = None) -> Iterator[pgstreams.Client | ClusterClient]:
    """A :class:`pgstreams.Client` for one DSN, a :class:`pgstreams.ClusterClient` for several (the
    shards of a cluster); closed on exit. ``pooler``, ``listen_dsn``: the ``--pooler`` and
    ``--listen-dsn`` values."""
    check_schema(schema)
    mode = check_pooler(pooler, "--pooler")
    listen = check_listen_dsn(listen_dsn, "--listen-dsn")
    dsns = resolve_all(dsn)
    # one server: its DSN as resolved, which may be libpq's environment (an empty conninfo: PGSERVICE,
    # PGHOST, ... with the password from the service file or PGPASSFILE), that connect() refuses in a list
    client = (pgstreams.Client(dsns[0], schema=schema, pooler=mode, listen_dsn=listen) if len(dsns) == 1
              else pgstreams.connect(dsns, schema=schema, pooler=mode, listen_dsn=listen))
    try:
        yield client
    finally:
        client.close()


@contextmanager
def open_connection(dsn: str | Sequence[str] | None, pooler: str | None = None
                    ) -> Iterator[psycopg.Connection]:
    """A plain autocommit psycopg connection (for commands that must not migrate implicitly; ``pooler``:
    the ``--pooler`` value)."""
    options = connection_options(check_pooler(pooler, "--pooler"))
    target = resolve(dsn)
    try:
        conn = psycopg.connect(target, connect_timeout=10, **options)
    except psycopg.Error as exc:
        raise CliError(f"cannot connect to PostgreSQL: {exc}") from None
    with conn:
        yield conn


# -- option values -----------------------------------------------------------------------------------
def parse_time(text: str, option: str = "--from") -> datetime:
    """Parse an ISO 8601 time with a zone (``Z`` or ``+hh:mm``); naive or malformed is a usage error
    naming ``option`` (default ``"--from"``)."""
    try:
        dt = datetime.fromisoformat(text.strip())
    except ValueError:
        raise usage_error(
            f"invalid {option} value {text!r}: expected earliest, latest or an ISO 8601 time with a zone, "
            "e.g. 2024-05-01T12:00:00Z"
        ) from None
    if dt.tzinfo is None or dt.utcoffset() is None:
        raise usage_error(f"{option} time {text!r} has no time zone: add Z or an offset such as +02:00")
    return dt.astimezone(timezone.utc)


def parse_start(text: str) -> Start:
    """``earliest``, ``latest`` or an aware datetime parsed from ``--from``."""
    word = text.strip().lower()
    if word in ("earliest", "latest"):
        return word  # type: ignore[return-value]
    return parse_time(text)


def parse_headers(items: Sequence[str] | None) -> dict[str, str] | None:
    """``KEY=VALUE`` strings to a headers dict (``None`` when there are none)."""
    if not items:
        return None
    out: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise usage_error(f"invalid --header {item!r}: expected KEY=VALUE")
        out[name] = value
    return out
