"""``pgstreams quickstart``: a short end-to-end tour for newcomers.

Creates a topic with 3 partitions, publishes orders (string keys, JSON values) one by one and as a batch,
consumes them with two independent stream groups (``billing`` reads everything, ``analytics`` starts
later and reads part, then catches up) and prints both groups' status. The topic name is unique per run
(``quickstart-<random>``) and the topic is deleted at the end unless ``keep`` is true, so the tour can
run any number of times on the same database.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated

import psycopg
import typer
from psycopg.conninfo import conninfo_to_dict

import pgstreams
from pgstreams.names import check_schema
from pgstreams.pooler import Pooler, check_pooler

from .common import DEFAULT_SCHEMA, DsnOption, PoolerOption, SchemaOption, resolve
from .output import events_table, group_table, out_console, published_table

if TYPE_CHECKING:  # rich is imported when the tour prints: startup stays light
    from rich.console import Console

#: Partitions of the demo topic.
PARTITIONS = 3
#: Groups of the tour: the first reads everything at once, the second in two steps.
GROUPS = ("billing", "analytics")
_CUSTOMERS = ("alice", "bob", "carol", "dave")


@dataclass
class QuickstartResult:
    """What the tour did: the topic it used, events published, events read per group, and the final
    status of both groups (per partition) before the topic was deleted."""

    topic: str
    published: int
    consumed: dict[str, int] = field(default_factory=dict)
    status: list[pgstreams.GroupPartitionStatus] = field(default_factory=list)
    kept: bool = False


def _where(dsn: str) -> str:
    """A description of the database without secrets."""
    try:
        info = conninfo_to_dict(dsn)
    except psycopg.Error:  # pragma: no cover - the DSN was already used successfully
        return "PostgreSQL"
    host = str(info.get("host") or "localhost")
    if host.startswith("/"):
        host = f"socket {host}"
    port = info.get("port")
    return f"PostgreSQL database {info.get('dbname', '?')!r} at {host}{':' + str(port) if port else ''}"


def _orders(first: int, count: int) -> list[pgstreams.Message]:
    out = []
    for n in range(first, first + count):
        customer = _CUSTOMERS[n % len(_CUSTOMERS)]
        out.append(pgstreams.Message(
            value={"order": n, "customer": customer, "amount": round(9.5 * n + 3, 2)},
            key=customer, event_type="order_placed", event_id=f"order-{n}",
        ))
    return out


def _read(consumer: pgstreams.Consumer, count: int, *, batch: int, deadline_s: float = 60.0
          ) -> list[pgstreams.Event]:
    """Poll and commit until ``count`` events were read (or the deadline passes)."""
    got: list[pgstreams.Event] = []
    deadline = time.monotonic() + deadline_s
    while len(got) < count and time.monotonic() < deadline:
        events = consumer.poll(min(batch, count - len(got)), timeout=1.0)
        if events:
            consumer.commit(events)
            got.extend(events)
    if len(got) < count:
        raise pgstreams.PgStreamsError(
            f"quickstart read {len(got)} of {count} events within {deadline_s:g}s "
            "(is a long write transaction open on this server?)")
    return got


def run_quickstart(dsn: str, *, schema: str = DEFAULT_SCHEMA, keep: bool = False,
                   console: Console | None = None, pooler: Pooler | None = None) -> QuickstartResult:
    """Run the tour on ``dsn`` (schema ``schema``, default ``"pgstreams"``; ``pooler``: see
    :func:`pgstreams.connect`), printing to ``console`` (default: a new stdout console). Deletes its topic
    at the end unless ``keep`` (default false)."""
    # imported when it prints, as in .output: every other command starts without rich
    from rich.console import Console

    con = console or Console()
    topic = f"quickstart-{secrets.token_hex(4)}"
    con.rule("[bold]pgstreams quickstart")
    con.print(f"Using {_where(dsn)}, schema {schema!r}.")
    with pgstreams.connect(dsn, schema=schema, pooler=pooler) as client:
        try:
            result = _tour(client, topic, con)
        finally:
            if not keep:
                try:
                    client.delete_topic(topic)
                except pgstreams.TopicNotFound:
                    pass
        result.kept = keep
    if keep:
        opt = "" if schema == DEFAULT_SCHEMA else f" --schema {schema}"
        con.print(f"\nKept topic {topic!r}. Try (with the same --dsn, if you gave one):\n"
                  f"  pgstreams topics describe {topic}{opt}\n"
                  f"  pgstreams consume {topic} --group me --max 5{opt}\n"
                  f"  pgstreams groups describe billing --topic {topic}{opt}")
    else:
        con.print(f"\nDeleted topic {topic!r} (run with --keep to explore it with the other commands).")
    return result


def _tour(client: pgstreams.Client, topic: str, con: Console) -> QuickstartResult:
    info = client.create_topic(topic, partitions=PARTITIONS)
    con.print(f"\n[bold]1.[/] Created topic {info.name!r} with {info.partitions} partitions.")

    con.print("\n[bold]2.[/] Publishing orders: the key (customer) picks the partition, so each "
              "customer's orders stay in order.")
    first = _orders(0, 4)
    results = [client.publish(topic, msg.value, key=msg.key, event_type=msg.event_type, event_id=msg.event_id)
               for msg in first]
    con.print(published_table(list(zip(first, results, strict=True)), "publish(): one event per call"))
    rest = _orders(4, 8)
    stored = client.publish_many(topic, rest)
    con.print(f"publish_many(): {stored} more events in one transaction (COPY).")
    published = len(first) + stored

    con.print(f"\n[bold]3.[/] Group {GROUPS[0]!r} reads every event from the earliest and commits "
              "its checkpoint after each batch.")
    billing = client.consumer(topic, GROUPS[0], start="earliest")
    got_billing = _read(billing, published, batch=100)
    con.print(events_table(got_billing, f"{GROUPS[0]} read {len(got_billing)} events"))

    part = 5
    con.print(f"\n[bold]4.[/] Group {GROUPS[1]!r} is independent: it starts later, replays from the "
              f"earliest, and reads only {part} events for now.")
    analytics = client.consumer(topic, GROUPS[1], start="earliest")
    got_analytics = _read(analytics, part, batch=part)
    status = [s for g in GROUPS for s in client.describe_group(g, topic)]
    con.print(group_table(status, title="group status: checkpoint, head and lag per partition"))

    con.print(f"\n[bold]5.[/] {GROUPS[1]!r} catches up; {GROUPS[0]!r} is unaffected.")
    got_analytics += _read(analytics, published - part, batch=100)
    status = [s for g in GROUPS for s in client.describe_group(g, topic)]
    con.print(group_table(status, title="group status after catching up"))
    return QuickstartResult(topic, published, {GROUPS[0]: len(got_billing), GROUPS[1]: len(got_analytics)},
                            status)


def quickstart(
    keep: Annotated[bool, typer.Option("--keep", help="Keep the demo topic (default: delete it at the end).")
                    ] = False,
    dsn: DsnOption = None,
    pooler: PoolerOption = None,
    schema: SchemaOption = DEFAULT_SCHEMA,
) -> None:
    """A short end-to-end tour: create a topic, publish, consume with two groups, show their status."""
    check_schema(schema)
    mode = check_pooler(pooler, "--pooler")
    run_quickstart(resolve(dsn), schema=schema, keep=keep, console=out_console(), pooler=mode)


def register(app: typer.Typer) -> None:
    """Add ``quickstart`` to ``app``."""
    app.command("quickstart")(quickstart)
