"""``pgstreams groups list|describe``: stream groups' checkpoints, heads, lag and membership."""

from __future__ import annotations

from typing import Annotated

import typer

import pgstreams
from pgstreams.models import to_json
from pgstreams.names import check_group, check_topic

from .common import (
    DEFAULT_SCHEMA,
    DsnOption,
    JsonOption,
    PoolerOption,
    SchemaOption,
    open_client,
    parse_time,
    usage_error,
)
from .output import (
    group_json,
    group_partition_json,
    group_table,
    groups_table,
    member_line,
    out_console,
    print_json,
    print_listing,
    resets_table,
    share_partition_json,
    share_table,
)

groups_app = typer.Typer(help="Stream groups: checkpoints, heads and lag; reset and delete. Share groups: "
                         "events in flight.", no_args_is_help=True)


@groups_app.command("list")
def groups_list(
    as_json: JsonOption = False, dsn: DsnOption = None, schema: SchemaOption = DEFAULT_SCHEMA,
    pooler: PoolerOption = None,
) -> None:
    """List stream groups with the topics they read and their total lag."""
    with open_client(dsn, schema, pooler=pooler) as client:
        groups = client.list_groups()
    print_listing(groups, as_json, group_json, groups_table, "no groups")


@groups_app.command("describe")
def groups_describe(
    group: Annotated[str, typer.Argument(metavar="GROUP", help="Group name.", show_default=False)],
    topic: Annotated[str | None, typer.Option(
        "--topic", "-t", help="Only this topic.", show_default=False)] = None,
    as_json: JsonOption = False,
    dsn: DsnOption = None,
    pooler: PoolerOption = None,
    schema: SchemaOption = DEFAULT_SCHEMA,
) -> None:
    """Per topic and partition of a group: checkpoint, head and lag, and for groups run by workers the
    lease owner, its last heartbeat and whether it is stale (or the partition retries a failing event).
    For a share group: where it started, its frontier, acquired, available, waiting and delivered-too-often
    counts, the oldest lock and the dead-letter counters."""
    check_group(group)
    if topic is not None:
        check_topic(topic)
    with open_client(dsn, schema, pooler=pooler) as client:
        shares = client.store.shares.status(group, topic)
        try:
            statuses = client.describe_group(group, topic)  # one read of each partition's head and lag
        except pgstreams.GroupNotFound:
            if not shares:
                raise
            statuses = []
        members = pgstreams.group_members(client, group, topic) if statuses else []
    if as_json:
        print_json([group_partition_json(s) for s in statuses] + [share_partition_json(s) for s in shares])
        return
    console = out_console()
    if statuses:
        console.print(group_table(statuses, membership=True))
        for t in dict.fromkeys(s.topic for s in statuses):
            console.print(f"state on {t}: {pgstreams.group_state(s for s in statuses if s.topic == t)}")
        console.print(f"total lag: {sum(s.lag for s in statuses)}")
        for m in members:
            console.print(member_line(m))
    if shares:
        console.print(share_table(shares))
        console.print(f"acquired: {sum(s.acquired for s in shares)}, "
                      f"available: {sum(s.available for s in shares)}, "
                      f"dead-lettered: {sum(s.dead_lettered for s in shares)}, "
                      f"lost: {sum(s.lost_events for s in shares)}")


@groups_app.command("reset")
def groups_reset(
    group: Annotated[str, typer.Argument(metavar="GROUP", help="Group name.", show_default=False)],
    topic: Annotated[str, typer.Option("--topic", "-t", help="The topic.", show_default=False)],
    to_earliest: Annotated[bool, typer.Option("--to-earliest", help="The oldest retained event.")] = False,
    to_latest: Annotated[bool, typer.Option("--to-latest", help="After the last committed event.")] = False,
    to_datetime: Annotated[str | None, typer.Option(
        "--to-datetime", help="The first event at or after this ISO 8601 time (with a zone).",
        show_default=False)] = None,
    shift_by: Annotated[int | None, typer.Option(
        "--shift-by", help="Move by N events of each partition (negative: back), as Kafka's --shift-by; "
             "positions are topic-wide, so a checkpoint moves by more positions than events.",
        show_default=False)] = None,
    to_position: Annotated[int | None, typer.Option(
        "--to-position", help="The next event read is the first at or after position P.",
        show_default=False)] = None,
    partition: Annotated[int | None, typer.Option(
        "--partition", help="Only this partition.", show_default=False)] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Show the new checkpoints; change nothing.")
                       ] = False,
    as_json: JsonOption = False,
    dsn: DsnOption = None,
    pooler: PoolerOption = None,
    schema: SchemaOption = DEFAULT_SCHEMA,
) -> None:
    """Move a group's checkpoints (kafka-consumer-groups --reset-offsets). Refused while the group has live
    members on the topic."""
    check_group(group)
    check_topic(topic)
    chosen = sum((to_earliest, to_latest, to_datetime is not None, shift_by is not None,
                  to_position is not None))
    if chosen != 1:
        raise usage_error("give exactly one of --to-earliest, --to-latest, --to-datetime, --shift-by, "
                          "--to-position")
    when = parse_time(to_datetime, "--to-datetime") if to_datetime is not None else None
    with open_client(dsn, schema, pooler=pooler) as client:
        rows = client.reset_group(group, topic, to_earliest=to_earliest, to_latest=to_latest,
                                  to_datetime=when, shift_by=shift_by, to_position=to_position,
                                  partition=partition,
                                  dry_run=dry_run)
    if as_json:
        print_json({"dry_run": dry_run, "partitions": [to_json(r) for r in rows]})
        return
    out_console().print(resets_table(rows, dry_run))


@groups_app.command("delete")
def groups_delete(
    group: Annotated[str, typer.Argument(metavar="GROUP", help="Group name.", show_default=False)],
    topic: Annotated[str | None, typer.Option(
        "--topic", "-t", help="Only on this topic.", show_default=False)] = None,
    dsn: DsnOption = None,
    pooler: PoolerOption = None,
    schema: SchemaOption = DEFAULT_SCHEMA,
) -> None:
    """Delete a group's checkpoints, leases and configuration (kafka-consumer-groups --delete). Refused
    while the group has live members."""
    check_group(group)
    if topic is not None:
        check_topic(topic)
    with open_client(dsn, schema, pooler=pooler) as client:
        n = client.delete_group(group, topic)
    out_console().print(f"deleted group {group!r}" + (f" on topic {topic!r}" if topic else "")
                        + f" ({n} checkpoint(s))")


def register(app: typer.Typer) -> None:
    """Add the ``groups`` commands to ``app``."""
    app.add_typer(groups_app, name="groups")
