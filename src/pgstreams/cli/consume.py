"""``pgstreams consume``: print a group's events as JSON lines, committing after each printed batch."""

from __future__ import annotations

import time
from datetime import datetime
from typing import Annotated

import typer

import pgstreams
from pgstreams.cluster import ClusterClient, ClusterConsumer
from pgstreams.consumer import Consumer, Start
from pgstreams.names import check_group, check_topic

from .common import (
    DEFAULT_SCHEMA,
    CliError,
    DsnOption,
    ListenDsnOption,
    PoolerOption,
    SchemaOption,
    StdoutClosed,
    check_terminated,
    open_any,
    parse_start,
    usage_error,
)
from .output import err_console, event_json, json_line, write_stdout

#: Events ``consume`` reads per poll and commits at once (``--batch-size``).
DEFAULT_CONSUME_BATCH = 500
#: Seconds ``consume`` without ``--follow`` waits for events that are not yet readable (``--wait``).
DEFAULT_CONSUME_WAIT = 10.0


#: A place of the log: (shard, partition); the shard is 0 on a single server.
Place = tuple[int, int]


def _shard_targets(client: pgstreams.Client, consumer: Consumer, shard: int) -> dict[Place, int]:
    statuses = client.describe_group(consumer.group, consumer.topic)
    return {(shard, s.partition): s.head for s in statuses
            if s.partition in consumer.partitions and s.lag > 0 and s.head is not None}


def _catch_up_targets(client: pgstreams.Client | ClusterClient, consumer: Consumer | ClusterConsumer
                      ) -> dict[Place, int]:
    """Per (shard, partition) still behind: the head position (last event in read order) as of now."""
    if isinstance(client, ClusterClient) and isinstance(consumer, ClusterConsumer):
        out: dict[Place, int] = {}
        for shard, one in enumerate(consumer.consumers):
            out.update(_shard_targets(client.shards[shard], one, shard))
        return out
    assert isinstance(client, pgstreams.Client) and isinstance(consumer, Consumer)
    return _shard_targets(client, consumer, 0)


def _lag(client: pgstreams.Client | ClusterClient, group: str, topic: str, targets: dict[Place, int]) -> int:
    shards = client.shards if isinstance(client, ClusterClient) else (client,)
    return sum(s.lag for i, c in enumerate(shards) for s in c.describe_group(group, topic)
               if (i, s.partition) in targets)


def _apply_reset(consumer: Consumer | ClusterConsumer, start: Start) -> None:
    if start == "earliest":
        consumer.seek_to_beginning()
    elif start == "latest":
        consumer.seek_to_end()
    else:
        assert isinstance(start, datetime)
        consumer.seek_to_time(start)


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
    pooler: PoolerOption = None,
    listen_dsn: ListenDsnOption = None,
    schema: SchemaOption = DEFAULT_SCHEMA,
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
    with open_any(dsn, schema, pooler=pooler, listen_dsn=listen_dsn) as client:
        consumer: Consumer | ClusterConsumer
        if isinstance(client, ClusterClient):
            if partition:
                raise usage_error("--partition reads one server's partitions: give one --dsn")
            consumer = client.consumer(topic, group, start=begin)
        else:
            consumer = Consumer(client, topic, group, start=begin, partitions=partition or None)
        if reset:
            _apply_reset(consumer, begin)
        targets = None if follow else _catch_up_targets(client, consumer)
        timed_out = _consume_loop(consumer, targets, max_events, batch_size, wait)
        if timed_out and targets:
            lag = _lag(client, group, topic, targets)
            if lag:
                err_console().print(
                    f"[yellow]warning:[/] stopped after {wait:g}s without new events; {lag} stored events "
                    "are not readable yet (a write transaction is still open)")


def _consume_loop(consumer: Consumer | ClusterConsumer, targets: dict[Place, int] | None,
                  max_events: int | None, batch_size: int, wait: float) -> bool:
    """Poll, print and commit until caught up with ``targets`` (``None``: follow forever) or ``max_events``.

    ``targets`` ((shard, partition) -> head position to reach) shrinks as heads are read. Returns true when it
    stopped because nothing arrived for ``wait`` seconds while still behind.
    """
    printed = 0
    deadline = time.monotonic() + wait
    while True:
        check_terminated()
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
            if isinstance(consumer, ClusterConsumer):  # (partition, position) is per shard
                write_stdout("".join(json_line({**event_json(ev), "shard": ev.shard}) for ev in events))
            else:
                write_stdout("".join(json_line(event_json(ev)) for ev in events))
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
                if targets.get((ev.shard, ev.partition)) == ev.position:
                    del targets[(ev.shard, ev.partition)]
            deadline = time.monotonic() + wait
        if max_events is not None and printed >= max_events:
            return False


def register(app: typer.Typer) -> None:
    """Add ``consume`` to ``app``."""
    app.command("consume")(consume)
