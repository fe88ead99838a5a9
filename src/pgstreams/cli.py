"""The ``pgstreams`` command line.

Commands: ``migrate``, ``topics create|list|describe|delete``, ``produce``, ``consume``,
``groups list|describe``, ``worker`` and ``quickstart``; ``docs/cli.md`` describes each one (``worker``:
``docs/workers.md``).

Exit codes: 0 on success, 2 on usage errors (bad options or values, invalid names, a time without a zone,
a bad input line for ``produce``), 1 on other errors (unknown topic or group, cannot connect, ...),
130 on Ctrl-C. Errors are printed as one line, ``error: ...``, on stderr; set ``PGSTREAMS_DEBUG=1`` to
get the traceback instead.

Adding a command: write one function decorated with ``@app.command()`` (or ``@topics_app.command()``,
``@groups_app.command()``) that takes ``dsn: DsnOption = None`` and ``schema: SchemaOption = "pgstreams"``,
opens the database with ``with open_client(dsn, schema) as client:``, and raises
:class:`pgstreams.PgStreamsError` subclasses or :class:`CliError` (``usage_error(...)`` for exit 2);
:func:`main` turns every exception into the one-line message and exit code.
"""

from __future__ import annotations

import base64
import json
import os
import re
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import psycopg
import typer
from psycopg.conninfo import conninfo_to_dict

import pgstreams
from pgstreams import migrate as _migrate
from pgstreams.client import resolve_dsn
from pgstreams.consumer import Consumer, Start
from pgstreams.errors import InvalidArgument, InvalidName, PgStreamsError
from pgstreams.names import check_group, check_partitions, check_schema, check_topic

if TYPE_CHECKING:  # rich is imported by the commands that print with it: startup stays light
    from rich.console import Console
    from rich.table import Table

#: Exit code of a usage error (bad option, name, value or input line).
EXIT_USAGE = 2
#: Exit code of any other error.
EXIT_FAILURE = 1
#: Exit code after Ctrl-C.
EXIT_INTERRUPTED = 130
#: Exit code when stdout is closed early (``pgstreams consume ... | head``), as a shell reports SIGPIPE.
EXIT_BROKEN_PIPE = 141

#: Lines ``produce`` publishes per transaction (``--batch-size``).
DEFAULT_PRODUCE_BATCH = 1000
#: Events ``consume`` reads per poll and commits at once (``--batch-size``).
DEFAULT_CONSUME_BATCH = 500
#: Seconds ``consume`` without ``--follow`` waits for events that are not yet readable (``--wait``).
DEFAULT_CONSUME_WAIT = 10.0

_HELP = (
    "Kafka-like durable event streaming on PostgreSQL.\n\n"
    "Every command takes --dsn (default: $PGSTREAMS_DSN, else the embedded PostgreSQL) and --schema."
)

app = typer.Typer(name="pgstreams", help=_HELP, no_args_is_help=True, add_completion=False,
                  pretty_exceptions_enable=False)
topics_app = typer.Typer(help="Create, list, describe and delete topics.", no_args_is_help=True)
groups_app = typer.Typer(help="Stream groups: checkpoints, heads and lag.", no_args_is_help=True)
app.add_typer(topics_app, name="topics")
app.add_typer(groups_app, name="groups")

DsnOption = Annotated[
    str | None,
    typer.Option("--dsn", help="PostgreSQL DSN. Default: $PGSTREAMS_DSN, else the embedded PostgreSQL.",
                 show_default=False),
]
SchemaOption = Annotated[str, typer.Option("--schema", help="Schema holding the pgstreams tables.")]
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


def _one_line(text: str) -> str:
    return re.sub(r"\s*\n\s*", "; ", str(text).strip()) or "unknown error"


def _report(message: str) -> None:
    try:
        sys.stderr.write(f"error: {_one_line(message)}\n")
        sys.stderr.flush()
    except OSError:  # pragma: no cover - stderr is gone too
        pass


def _exit_code_of(exc: BaseException) -> tuple[int, str | None]:
    """Map an exception to (exit code, message to print or None)."""
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
            msg = f"{_one_line(msg)} (see '{ctx.command_path} --help')"
        return code, msg
    if isinstance(exc, typer.Abort):
        return EXIT_FAILURE, "aborted"
    if isinstance(exc, OSError):
        return EXIT_FAILURE, str(exc)
    return EXIT_FAILURE, f"unexpected {type(exc).__name__}: {exc}"


def run(argv: Sequence[str] | None = None) -> int:
    """Run the command line with ``argv`` (default: ``sys.argv[1:]``) and return the exit code."""
    command = typer.main.get_command(app)
    try:
        rv = command.main(args=list(argv) if argv is not None else None, prog_name="pgstreams",
                          standalone_mode=False)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except (BrokenPipeError, StdoutClosed):
        _silence_stdout()
        return EXIT_BROKEN_PIPE
    except typer.Exit as exc:
        return exc.exit_code
    except Exception as exc:
        if os.environ.get("PGSTREAMS_DEBUG"):
            raise
        code, message = _exit_code_of(exc)
        if message is not None:
            _report(message)
        return code
    return rv if isinstance(rv, int) else 0


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


# -- shared helpers ----------------------------------------------------------------------------------
def out_console() -> Console:
    """The rich console for tables on stdout (160 columns wide when stdout is not a terminal and
    ``$COLUMNS`` is unset, so piped tables do not wrap)."""
    from rich.console import Console

    console = Console(highlight=False)
    if not console.is_terminal and not os.environ.get("COLUMNS"):
        console = Console(highlight=False, width=160)
    return console


def err_console() -> Console:
    """The rich console for progress and notes on stderr."""
    from rich.console import Console

    return Console(stderr=True, highlight=False)


def check_dsn(dsn: str | None) -> str | None:
    """Validate the syntax of a ``--dsn`` value (exit 2 when malformed); ``None``/empty means default."""
    if not dsn:
        return None
    try:
        conninfo_to_dict(dsn)
    except psycopg.Error as exc:
        raise usage_error(f"invalid --dsn: {exc}") from None
    return dsn


def resolve(dsn: str | None) -> str:
    """The DSN to use: ``--dsn``, else ``$PGSTREAMS_DSN``, else the embedded server (started on demand)."""
    given = check_dsn(dsn)
    if given is None and not os.environ.get("PGSTREAMS_DSN"):
        console = err_console()
        if console.is_terminal:
            with console.status("starting the embedded PostgreSQL..."):
                return resolve_dsn(None)
    return resolve_dsn(given)


@contextmanager
def open_client(dsn: str | None, schema: str, *, migrate: bool = True) -> Iterator[pgstreams.Client]:
    """Connect (applying pending migrations unless ``migrate`` is false) and close on exit."""
    check_schema(schema)
    client = pgstreams.connect(resolve(dsn), schema=schema, migrate=migrate)
    try:
        yield client
    finally:
        client.close()


@contextmanager
def open_connection(dsn: str | None) -> Iterator[psycopg.Connection]:
    """A plain autocommit psycopg connection (for commands that must not migrate implicitly)."""
    target = resolve(dsn)
    try:
        conn = psycopg.connect(target, autocommit=True, connect_timeout=10)
    except psycopg.Error as exc:
        raise CliError(f"cannot connect to PostgreSQL: {exc}") from None
    with conn:
        yield conn


def iso(dt: datetime | None) -> str | None:
    """An aware datetime as ISO 8601 in UTC (``None`` stays ``None``)."""
    return None if dt is None else dt.astimezone(timezone.utc).isoformat()


def _short_time(dt: datetime | None) -> str:
    return "-" if dt is None else dt.astimezone(timezone.utc).isoformat(sep=" ", timespec="seconds")


def _cell(value: object) -> str:
    return "-" if value is None else str(value)


def write_stdout(text: str) -> None:
    """Write ``text`` to stdout as UTF-8 (whatever the locale) and flush."""
    sys.stdout.flush()
    out = getattr(sys.stdout, "buffer", None)
    if out is None:  # pragma: no cover - stdout replaced by a text-only stream
        sys.stdout.write(text)
    else:
        out.write(text.encode("utf-8"))
        out.flush()


def print_json(obj: object) -> None:
    """Print ``obj`` as indented JSON (UTF-8) on stdout."""
    write_stdout(json.dumps(obj, indent=2, ensure_ascii=False) + "\n")


def parse_time(text: str, option: str = "--from") -> datetime:
    """Parse an ISO 8601 time with a zone (``Z`` or ``+hh:mm``); naive or malformed is a usage error."""
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


# -- migrate -----------------------------------------------------------------------------------------
@app.command("migrate")
def migrate_command(
    status: Annotated[bool, typer.Option("--status", help="Only show which migrations are applied.")] = False,
    as_json: JsonOption = False,
    dsn: DsnOption = None,
    schema: SchemaOption = "pgstreams",
) -> None:
    """Apply pending schema migrations (or show their status with --status)."""
    check_schema(schema)
    with open_connection(dsn) as conn:
        if status:
            rows = _migrate.status(conn, schema)
            if as_json:
                print_json([{"version": r.version, "name": r.name, "applied_at": iso(r.applied_at),
                             "known": r.known} for r in rows])
                return
            from rich.table import Table

            table = Table(title=f"migrations in schema {schema!r}")
            table.add_column("version", justify="right")
            table.add_column("name")
            table.add_column("applied at")
            for r in rows:
                table.add_row(str(r.version), r.name if r.known else f"{r.name} [red](not shipped with this "
                              "pgstreams: applied by a newer one)[/]",
                              _short_time(r.applied_at) if r.applied_at else "[yellow]pending[/]")
            out_console().print(table)
            return
        applied = _migrate.migrate(conn, schema)
        unknown = _migrate.unknown_versions(conn, schema)
    latest = max((m.version for m in _migrate.available()), default=0)
    if unknown:
        err_console().print(f"[yellow]warning:[/] schema {schema!r} holds migrations "
                            f"{', '.join(map(str, unknown))}, newer than this pgstreams knows (up to "
                            f"{latest}): a newer pgstreams migrated it; upgrade this one")
    version = max([latest, *unknown])
    if as_json:
        print_json({"schema": schema, "applied": applied, "version": version, "unknown": unknown})
    elif applied:
        out_console().print(f"schema {schema!r}: applied migrations {', '.join(map(str, applied))} "
                            f"(now at version {version})")
    else:
        out_console().print(f"schema {schema!r} is up to date (version {version})")


# -- topics ------------------------------------------------------------------------------------------
def _topic_json(info: pgstreams.TopicInfo) -> dict[str, Any]:
    return {"name": info.name, "partitions": info.partitions, "created_at": iso(info.created_at),
            "segment_size": info.segment_size, "config": dict(info.config)}


@topics_app.command("create")
def topics_create(
    name: Annotated[str, typer.Argument(
        metavar="NAME", help="Topic name: 1 to 249 of [A-Za-z0-9._-].", show_default=False)],
    partitions: Annotated[int, typer.Option("--partitions", "-p", help="Number of partitions.")] = 1,
    segment_size: Annotated[int, typer.Option(
        "--segment-size", help="Positions per storage segment (the unit retention drops).")
    ] = pgstreams.DEFAULT_SEGMENT_SIZE,
    as_json: JsonOption = False,
    dsn: DsnOption = None,
    schema: SchemaOption = "pgstreams",
) -> None:
    """Create a topic. Succeeds if it already exists with the same partition count."""
    check_topic(name)
    check_partitions(partitions)
    with open_client(dsn, schema) as client:
        existed = any(t.name == name for t in client.list_topics())
        info = client.create_topic(name, partitions, segment_size=segment_size)
    if as_json:
        print_json({**_topic_json(info), "created": not existed})
    else:
        parts = f"{info.partitions} partition{'s' * (info.partitions != 1)}"
        if existed:
            out_console().print(f"topic {name!r} already exists ({parts})")
        else:
            out_console().print(f"created topic {name!r} ({parts})")


@topics_app.command("list")
def topics_list(
    as_json: JsonOption = False, dsn: DsnOption = None, schema: SchemaOption = "pgstreams"
) -> None:
    """List all topics."""
    with open_client(dsn, schema) as client:
        topics = client.list_topics()
    if as_json:
        print_json([_topic_json(t) for t in topics])
        return
    if not topics:
        out_console().print("no topics")
        return
    from rich.table import Table

    table = Table()
    table.add_column("topic", overflow="fold")
    table.add_column("partitions", justify="right")
    table.add_column("created at")
    for t in topics:
        table.add_row(t.name, str(t.partitions), _short_time(t.created_at))
    out_console().print(table)


@topics_app.command("describe")
def topics_describe(
    name: Annotated[str, typer.Argument(metavar="NAME", help="Topic name.", show_default=False)],
    as_json: JsonOption = False,
    dsn: DsnOption = None,
    schema: SchemaOption = "pgstreams",
) -> None:
    """Show a topic with, per partition, its event count and head position."""
    check_topic(name)
    with open_client(dsn, schema) as client:
        desc = client.describe_topic(name)
    if as_json:
        print_json({**_topic_json(desc.topic), "events": desc.events,
                    "partition_info": [{"partition": p.partition, "events": p.events, "head": p.head}
                                       for p in desc.partition_info]})
        return
    info = desc.topic
    console = out_console()
    console.print(f"topic {info.name!r}: {info.partitions} partition{'s' * (info.partitions != 1)}, "
                  f"{desc.events} events, created {_short_time(info.created_at)}")
    from rich.table import Table

    table = Table()
    table.add_column("partition", justify="right")
    table.add_column("events", justify="right")
    table.add_column("head", justify="right")
    for p in desc.partition_info:
        table.add_row(str(p.partition), str(p.events), _cell(p.head))
    console.print(table)


@topics_app.command("delete")
def topics_delete(
    name: Annotated[str, typer.Argument(metavar="NAME", help="Topic name.", show_default=False)],
    if_exists: Annotated[bool, typer.Option(
        "--if-exists", help="Succeed when the topic does not exist.")] = False,
    dsn: DsnOption = None,
    schema: SchemaOption = "pgstreams",
) -> None:
    """Delete a topic with all its events and every group checkpoint on it."""
    check_topic(name)
    with open_client(dsn, schema) as client:
        try:
            client.delete_topic(name)
        except pgstreams.TopicNotFound:
            if not if_exists:
                raise
            out_console().print(f"topic {name!r} does not exist")
            return
    out_console().print(f"deleted topic {name!r}")


# -- produce -----------------------------------------------------------------------------------------
def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _line_event(raw: bytes, lineno: int, *, key_separator: str | None, as_json: bool,
                base: dict[str, Any]) -> dict[str, Any] | None:
    """One stdin line to a publish_many event dict; ``None`` for a blank line."""
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise usage_error(f"line {lineno}: not valid UTF-8 ({exc.reason} at byte {exc.start})") from None
    line = line.removesuffix("\n").removesuffix("\r")
    if not line.strip():
        return None
    key: str | None = None
    text = line
    if key_separator is not None:
        key, sep, text = line.partition(key_separator)
        if not sep:
            raise usage_error(f"line {lineno}: no key separator {key_separator!r} found")
    value: Any = text
    if as_json:
        try:
            value = json.loads(text, parse_constant=_reject_constant)
        except ValueError as exc:
            raise usage_error(f"line {lineno}: invalid JSON: {exc}") from None
    return {**base, "value": value, "key": key}


@app.command("produce")
def produce(
    topic: Annotated[str, typer.Argument(metavar="TOPIC", help="Topic to publish to.", show_default=False)],
    key_separator: Annotated[str | None, typer.Option(
        "--key-separator", "-k", help="Split each line at the first SEP into key and value.", metavar="SEP",
        show_default=False)] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Parse each value as a JSON value.")] = False,
    partition: Annotated[int | None, typer.Option(
        "--partition", "-p", help="Publish to this partition (default: by key, else round-robin).",
        show_default=False)] = None,
    event_type: Annotated[str | None, typer.Option("--event-type", help="Event type of every event.",
                                                   show_default=False)] = None,
    header: Annotated[list[str] | None, typer.Option(
        "--header", "-H", help="Header KEY=VALUE added to every event (repeatable).", metavar="KEY=VALUE",
        show_default=False)] = None,
    correlation_id: Annotated[str | None, typer.Option(
        "--correlation-id", help="Correlation id of every event.", show_default=False)] = None,
    batch_size: Annotated[int, typer.Option(
        "--batch-size", help="Lines published per transaction.")] = DEFAULT_PRODUCE_BATCH,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Do not print the summary on stderr.")] = False,
    dsn: DsnOption = None,
    schema: SchemaOption = "pgstreams",
) -> None:
    """Publish one event per line of stdin (blank lines are skipped).

    Lines are published in batches of --batch-size, each batch in one transaction: a bad line stops the
    command with its line number; its batch is not published, earlier batches stay published. When stdin
    is a terminal every line is published as soon as it is typed.
    """
    check_topic(topic)
    if key_separator is not None and not key_separator:
        raise usage_error("--key-separator must not be empty")
    if batch_size < 1:
        raise usage_error(f"--batch-size must be at least 1, got {batch_size}")
    if partition is not None and partition < 0:
        raise usage_error(f"--partition must be >= 0, got {partition}")
    headers = parse_headers(header)
    base: dict[str, Any] = {}
    if partition is not None:
        base["partition"] = partition
    if headers:
        base["headers"] = headers
    for field, value in (("event_type", event_type), ("correlation_id", correlation_id)):
        if value is not None:
            if not value:
                raise usage_error(f"--{field.replace('_', '-')} must not be empty")
            base[field] = value
    with open_client(dsn, schema) as client:
        info = next((t for t in client.list_topics() if t.name == topic), None)
        if info is None:
            raise pgstreams.TopicNotFound(f"topic {topic!r} does not exist")
        if partition is not None and partition >= info.partitions:
            raise usage_error(
                f"--partition {partition} out of range for topic {topic!r} (0 to {info.partitions - 1})")
        if sys.stdin.isatty():
            batch_size = 1
        published = lines = 0
        batch: list[dict[str, Any]] = []
        first_line = 1

        def flush() -> None:
            nonlocal published, batch
            if batch:
                published += client.publish_many(topic, batch)
                batch = []

        try:
            for lines, raw in enumerate(sys.stdin.buffer, start=1):
                ev = _line_event(raw, lines, key_separator=key_separator, as_json=as_json, base=base)
                if ev is not None:
                    batch.append(ev)
                if len(batch) >= batch_size:
                    flush()
                    first_line = lines + 1
            flush()
        except CliError as exc:
            if published:
                note = (f"; lines {first_line} to {lines} not published ({published} events from earlier "
                        "lines were published)")
            else:
                note = "; nothing published"
            raise CliError(f"{exc}{note}", exc.exit_code) from None
    if not quiet:
        err_console().print(f"published {published} event{'s' * (published != 1)} to {topic!r}")


# -- consume -----------------------------------------------------------------------------------------
def event_json(ev: pgstreams.Event) -> dict[str, Any]:
    """An event as the JSON object ``consume`` prints.

    ``value_type`` says how ``value`` was published: ``"json"`` (``value`` is that JSON value),
    ``"text"`` (a JSON string) or ``"bytes"`` (``value`` is the bytes in standard base64).
    """
    value: Any = ev.value
    if isinstance(value, (bytes, bytearray, memoryview)):
        value_type = "bytes"
        value = base64.b64encode(bytes(value)).decode("ascii")
    elif isinstance(value, str):
        value_type = "text"
    else:
        value_type = "json"
    return {
        "topic": ev.topic, "partition": ev.partition, "position": ev.position, "txid": ev.txid,
        "key": ev.key, "value_type": value_type, "value": value, "headers": dict(ev.headers),
        "event_type": ev.event_type, "event_id": ev.event_id, "correlation_id": ev.correlation_id,
        "causation_id": ev.causation_id, "created_at": iso(ev.created_at),
    }


def _catch_up_targets(client: pgstreams.Client, consumer: Consumer) -> dict[int, int]:
    """Per partition still behind: the head position (last event in read order) as of now."""
    statuses = client.describe_group(consumer.group, consumer.topic)
    return {s.partition: s.head for s in statuses
            if s.partition in consumer.partitions and s.lag > 0 and s.head is not None}


def _apply_reset(consumer: Consumer, start: Start) -> None:
    if start == "earliest":
        consumer.seek_to_beginning()
    elif start == "latest":
        consumer.seek_to_end()
    else:
        assert isinstance(start, datetime)
        consumer.seek_to_time(start)


@app.command("consume")
def consume(
    topic: Annotated[str, typer.Argument(metavar="TOPIC", help="Topic to read.", show_default=False)],
    group: Annotated[str, typer.Option("--group", "-g", help="Stream group whose checkpoints to use.",
                                       show_default=False)],
    start: Annotated[str, typer.Option(
        "--from", help="Where a group without a checkpoint starts: earliest, latest or an ISO 8601 time "
                       "with a zone.", metavar="earliest|latest|TIME")] = "earliest",
    reset: Annotated[bool, typer.Option(
        "--reset", help="Move the group's checkpoints to --from even if it has some.")] = False,
    max_events: Annotated[int | None, typer.Option(
        "--max", "-n", help="Stop after this many events.", show_default=False)] = None,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep waiting for new events.")] = False,
    partition: Annotated[list[int] | None, typer.Option(
        "--partition", "-p", help="Read only this partition (repeatable; default: all).",
        show_default=False)] = None,
    batch_size: Annotated[int, typer.Option(
        "--batch-size", help="Events per poll; each printed batch is committed.")] = DEFAULT_CONSUME_BATCH,
    wait: Annotated[float, typer.Option(
        "--wait", help="Without --follow: seconds to wait for events held back by open transactions.")
    ] = DEFAULT_CONSUME_WAIT,
    dsn: DsnOption = None,
    schema: SchemaOption = "pgstreams",
) -> None:
    """Print events as JSON lines, committing the group's checkpoint after each printed batch.

    Without --follow it stops once it has read every event stored when it started (or --max events).
    """
    check_topic(topic)
    check_group(group)
    begin = parse_start(start)
    if max_events is not None and max_events < 1:
        raise usage_error(f"--max must be at least 1, got {max_events}")
    if batch_size < 1:
        raise usage_error(f"--batch-size must be at least 1, got {batch_size}")
    if wait < 0:
        raise usage_error(f"--wait must be >= 0, got {wait}")
    if partition is not None and any(p < 0 for p in partition):
        raise usage_error(f"--partition must be >= 0, got {min(partition)}")
    with open_client(dsn, schema) as client:
        consumer = Consumer(client, topic, group, start=begin, partitions=partition or None)
        if reset:
            _apply_reset(consumer, begin)
        targets = None if follow else _catch_up_targets(client, consumer)
        timed_out = _consume_loop(consumer, targets, max_events, batch_size, wait)
        if timed_out and targets:
            lag = sum(s.lag for s in client.describe_group(group, topic) if s.partition in targets)
            if lag:
                err_console().print(
                    f"[yellow]warning:[/] stopped after {wait:g}s without new events; {lag} stored events "
                    "are not readable yet (a write transaction is still open)")


def _consume_loop(consumer: Consumer, targets: dict[int, int] | None, max_events: int | None,
                  batch_size: int, wait: float) -> bool:
    """Poll, print and commit until caught up with ``targets`` (``None``: follow forever) or ``max_events``.

    ``targets`` (partition -> head position to reach) shrinks as heads are read. Returns true when it
    stopped because nothing arrived for ``wait`` seconds while still behind.
    """
    printed = 0
    deadline = time.monotonic() + wait
    while True:
        if targets is not None and not targets:
            return False
        want = batch_size if max_events is None else min(batch_size, max_events - printed)
        timeout = 1.0 if targets is None else max(0.0, min(1.0, deadline - time.monotonic()))
        events = consumer.poll(want, timeout=timeout)
        if not events:
            if targets is not None and time.monotonic() >= deadline:
                return True
            continue
        try:
            write_stdout("".join(json.dumps(event_json(ev), ensure_ascii=False) + "\n" for ev in events))
        except BrokenPipeError:
            raise StdoutClosed() from None  # not committed: these events will be read again
        outcome = consumer.commit(events)
        if not outcome.ok:
            raise CliError(
                f"group {consumer.group!r} was moved by another consumer ({outcome.name}); the last "
                f"{len(events)} events printed were not committed by this one; stopping")
        printed += len(events)
        if targets is not None:
            for ev in events:
                if targets.get(ev.partition) == ev.position:
                    del targets[ev.partition]
            deadline = time.monotonic() + wait
        if max_events is not None and printed >= max_events:
            return False


# -- groups ------------------------------------------------------------------------------------------
@groups_app.command("list")
def groups_list(
    as_json: JsonOption = False, dsn: DsnOption = None, schema: SchemaOption = "pgstreams"
) -> None:
    """List stream groups with the topics they read and their total lag."""
    with open_client(dsn, schema) as client:
        groups = client.list_groups()
    if as_json:
        print_json([{"group": g.group, "topics": list(g.topics), "lag": g.lag} for g in groups])
        return
    if not groups:
        out_console().print("no groups")
        return
    from rich.table import Table

    table = Table()
    table.add_column("group", overflow="fold")
    table.add_column("topics", overflow="fold")
    table.add_column("lag", justify="right")
    for g in groups:
        table.add_row(g.group, ", ".join(g.topics), str(g.lag))
    out_console().print(table)


def group_table(statuses: Sequence[pgstreams.GroupPartitionStatus], title: str | None = None,
                membership: dict[tuple[str, int], pgstreams.PartitionStatus] | None = None) -> Table:
    """A rich table of group statuses: group, topic, partition, checkpoint, head, lag, updated at; with
    ``membership`` (the ``consumer_group_status`` rows by topic and partition) also the lease owner, its
    last heartbeat and the partition's state (stale owner, retrying or blocked on an event)."""
    from rich.table import Table

    table = Table(title=title)
    table.add_column("group", overflow="fold")
    table.add_column("topic", overflow="fold")
    table.add_column("partition", justify="right")
    table.add_column("checkpoint", justify="right")
    table.add_column("head", justify="right")
    table.add_column("lag", justify="right")
    table.add_column("updated at")
    if membership is not None:
        table.add_column("owner", overflow="fold")
        table.add_column("last heartbeat")
        table.add_column("state")
    for s in statuses:
        lag = f"[bold yellow]{s.lag}[/]" if s.lag else "0"
        row = [s.group, s.topic, str(s.partition), _cell(s.checkpoint), _cell(s.head), lag,
               _short_time(s.updated_at)]
        if membership is not None:
            m = membership.get((s.topic, s.partition))
            row += [_cell(m.owner) if m else "-", _short_time(m.last_heartbeat if m else None),
                    _partition_state(m)]
        table.add_row(*row)
    return table


def _partition_state(m: pgstreams.PartitionStatus | None) -> str:
    if m is None:
        return "-"
    states = []
    if m.stale:
        states.append("[bold red]stale[/]")
    if m.pending_owner:
        states.append(f"handing over to {m.pending_owner}")
    if m.retry_state == "blocked":
        states.append(f"[bold red]blocked[/] at {m.retry_position} after {m.retry_attempts} attempts: "
                      f"{m.last_error}")
    elif m.retry_state:
        states.append(f"[yellow]retrying[/] {m.retry_position} ({m.retry_attempts} attempts): {m.last_error}")
    if not states:
        states.append("ok" if m.owner else "unowned")
    return "; ".join(states)


def _membership_json(m: pgstreams.PartitionStatus | None) -> dict[str, Any]:
    keys = ("owner", "pending_owner", "last_heartbeat", "stale", "retry_state", "retry_position",
            "retry_attempts", "last_error")
    if m is None:
        return dict.fromkeys(keys)
    return {"owner": m.owner, "pending_owner": m.pending_owner, "last_heartbeat": iso(m.last_heartbeat),
            "stale": m.stale, "retry_state": m.retry_state, "retry_position": m.retry_position,
            "retry_attempts": m.retry_attempts, "last_error": m.last_error}


@groups_app.command("describe")
def groups_describe(
    group: Annotated[str, typer.Argument(metavar="GROUP", help="Group name.", show_default=False)],
    topic: Annotated[str | None, typer.Option(
        "--topic", "-t", help="Only this topic.", show_default=False)] = None,
    as_json: JsonOption = False,
    dsn: DsnOption = None,
    schema: SchemaOption = "pgstreams",
) -> None:
    """Per topic and partition of a group: checkpoint, head and lag, and for groups run by workers the
    lease owner, its last heartbeat and whether it is stale (or the partition retries a failing event)."""
    check_group(group)
    if topic is not None:
        check_topic(topic)
    with open_client(dsn, schema) as client:
        statuses = client.describe_group(group, topic)
        membership = {(m.topic, m.partition): m for m in pgstreams.group_status(client, group, topic)}
        members = pgstreams.group_members(client, group, topic)
    if as_json:
        print_json([{"group": s.group, "topic": s.topic, "partition": s.partition, "checkpoint": s.checkpoint,
                     "head": s.head, "lag": s.lag, "updated_at": iso(s.updated_at),
                     **_membership_json(membership.get((s.topic, s.partition)))} for s in statuses])
        return
    console = out_console()
    console.print(group_table(statuses, membership=membership))
    console.print(f"total lag: {sum(s.lag for s in statuses)}")
    for m in members:
        parts = ", ".join(map(str, m.partitions)) or "none"
        console.print(f"member {m.member_id} on {m.topic}: partitions {parts}; last heartbeat "
                      f"{_short_time(m.last_heartbeat)}{' [bold red](stale)[/]' if m.stale else ''}")


# -- worker ----------------------------------------------------------------------------------------
@app.command("worker")
def worker_command(
    handler: Annotated[str, typer.Argument(
        metavar="MODULE:FUNCTION", help="The handler, e.g. myapp.handlers:on_order (MODULE is imported with "
        "the current directory on the path).", show_default=False)],
    topic: Annotated[str, typer.Option("--topic", "-t", help="Topic to consume.", show_default=False)],
    group: Annotated[str, typer.Option("--group", "-g", help="Stream group to join.", show_default=False)],
    batch: Annotated[bool, typer.Option("--batch", help="Call the handler with a list of events.")] = False,
    min_events: Annotated[int, typer.Option("--min-events", help="Deliver a batch once this many events "
                                            "are at hand.")] = 1,
    max_events: Annotated[int, typer.Option("--max-events", help="Largest batch.")] = 100,
    max_wait: Annotated[float, typer.Option("--max-wait", help="Seconds after which a batch smaller than "
                                            "--min-events is delivered anyway.")] = 1.0,
    mode: Annotated[str, typer.Option(
        "--mode", help="at-least-once (commit after the handler) or transactional (the handler gets the "
        "transaction's connection as second argument).", metavar="at-least-once|transactional")
    ] = "at-least-once",
    max_attempts: Annotated[int, typer.Option("--max-attempts", help="Deliveries of a failing event before "
                                              "it goes to the dead-letter topic.")] = 5,
    backoff: Annotated[float, typer.Option("--backoff", help="Seconds before the first retry (doubling).")
                       ] = 0.5,
    max_backoff: Annotated[float, typer.Option("--max-backoff", help="Longest wait between retries.")] = 30.0,
    dead_letter: Annotated[str | None, typer.Option(
        "--dead-letter", help="Dead-letter topic. Default: the group's configuration (TOPIC.dlt).",
        show_default=False)] = None,
    no_dead_letter: Annotated[bool, typer.Option(
        "--no-dead-letter", help="No dead-letter topic: retry a failing event forever.")] = False,
    start: Annotated[str, typer.Option(
        "--from", help="Where the group starts on partitions without a checkpoint: earliest, latest or an "
        "ISO 8601 time with a zone.", metavar="earliest|latest|TIME")] = "earliest",
    heartbeat_interval: Annotated[float | None, typer.Option(
        "--heartbeat-interval", help="Seconds between heartbeats. Default: the group's configuration (3).",
        show_default=False)] = None,
    session_timeout: Annotated[float | None, typer.Option(
        "--session-timeout", help="Seconds without heartbeat before this member's partitions move. Default: "
        "the group's configuration (30).", show_default=False)] = None,
    member_id: Annotated[str | None, typer.Option(
        "--member-id", help="Name of this member. Default: host:pid:random.", show_default=False)] = None,
    log_level: Annotated[str, typer.Option("--log-level", help="debug, info, warning or error.")] = "info",
    dsn: DsnOption = None,
    schema: SchemaOption = "pgstreams",
) -> None:
    """Run a handler as a member of a group until SIGINT/SIGTERM: it gets its share of the partitions,
    retries failing events and sends them to the dead-letter topic, and on a signal finishes its batch,
    commits, gives its partitions back and exits 0."""
    import logging

    from .worker import RetryPolicy, Worker, load_handler

    check_topic(topic)
    check_group(group)
    begin = parse_start(start)
    level = getattr(logging, log_level.upper(), None)
    if log_level.lower() not in ("debug", "info", "warning", "error") or not isinstance(level, int):
        raise usage_error(f"--log-level must be debug, info, warning or error, not {log_level!r}")
    if no_dead_letter and dead_letter:
        raise usage_error("--dead-letter and --no-dead-letter exclude each other")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    fn = load_handler(handler)
    retry = RetryPolicy(max_attempts=max_attempts, backoff=backoff, max_backoff=max_backoff)
    logging.basicConfig(level=level, stream=sys.stderr, format="%(asctime)s %(levelname)s %(message)s")
    with open_client(dsn, schema) as client:
        worker = Worker(client, member_id=member_id)
        worker.subscribe(topic, group, fn, batch=batch, min_events=min_events, max_events=max_events,
                         max_wait=max_wait, mode=mode, retry=retry,  # type: ignore[arg-type]
                         dead_letter=False if no_dead_letter else dead_letter, start=begin,
                         heartbeat_interval=heartbeat_interval, session_timeout=session_timeout)
        worker.run()
        err_console().print(f"worker {worker.member_id} stopped: {worker.stats.snapshot()}")


# -- quickstart --------------------------------------------------------------------------------------
@app.command("quickstart")
def quickstart(
    keep: Annotated[bool, typer.Option("--keep", help="Keep the demo topic (default: delete it at the end).")
                    ] = False,
    dsn: DsnOption = None,
    schema: SchemaOption = "pgstreams",
) -> None:
    """A short end-to-end tour: create a topic, publish, consume with two groups, show their status."""
    from ._demo_basic import run_quickstart

    check_schema(schema)
    run_quickstart(resolve(dsn), schema=schema, keep=keep, console=out_console())


# -- the ML reference application (pgstreams[ml]) ---------------------------------------------------------
_FORWARDED = {"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": []}


def _ml_command(command: str, args: Sequence[str]) -> None:
    try:
        from pgstreams_ml.cli import run_command
    except ImportError as exc:
        raise CliError(f"'pgstreams {command}' needs the ML application: pip install 'pgstreams[ml]' ({exc})"
                       ) from None
    run_command(command, args)


@app.command("demo", context_settings=_FORWARDED, add_help_option=False)
def demo(ctx: typer.Context) -> None:
    """Run the ML reference system end to end on the embedded PostgreSQL (or --dsn); see 'pgstreams demo
    --help'. Needs the ml extra."""
    _ml_command("demo", ctx.args)


@app.command("sim", context_settings=_FORWARDED, add_help_option=False)
def sim(ctx: typer.Context) -> None:
    """Run the event simulator of the ML reference system; see 'pgstreams sim --help'. Needs the ml extra."""
    _ml_command("sim", ctx.args)


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


if __name__ == "__main__":
    main()
