"""``pgstreams produce``: publish one event per line of stdin."""

from __future__ import annotations

import json
import sys
from typing import Annotated, Any

import typer

import pgstreams
from pgstreams.names import check_topic

from .common import (
    DEFAULT_SCHEMA,
    CliError,
    DsnOption,
    PoolerOption,
    SchemaOption,
    open_any,
    parse_headers,
    usage_error,
)
from .output import err_console, plural

#: Lines ``produce`` publishes per transaction (``--batch-size``).
DEFAULT_PRODUCE_BATCH = 1000


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


def _base_event(partition: int | None, headers: dict[str, str] | None, event_type: str | None,
                correlation_id: str | None) -> dict[str, Any]:
    """The fields every published event gets from the options."""
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
    return base


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
    pooler: PoolerOption = None,
    schema: SchemaOption = DEFAULT_SCHEMA,
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
    base = _base_event(partition, parse_headers(header), event_type, correlation_id)
    with open_any(dsn, schema, pooler=pooler) as client:
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
        err_console().print(f"published {plural(published, 'event')} to {topic!r}")


def register(app: typer.Typer) -> None:
    """Add ``produce`` to ``app``."""
    app.command("produce")(produce)
