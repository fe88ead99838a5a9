"""``pgstreams groups list|describe``: stream groups' checkpoints, heads, lag and membership."""

from __future__ import annotations

from typing import Annotated

import typer

import pgstreams
from pgstreams.names import check_group, check_topic

from .common import DEFAULT_SCHEMA, DsnOption, JsonOption, SchemaOption, open_client
from .output import (
    group_json,
    group_partition_json,
    group_table,
    groups_table,
    member_line,
    out_console,
    print_json,
    print_listing,
    share_partition_json,
    share_table,
)

groups_app = typer.Typer(help="Stream groups (checkpoints, heads and lag) and share groups (events in "
                         "flight).", no_args_is_help=True)


@groups_app.command("list")
def groups_list(
    as_json: JsonOption = False, dsn: DsnOption = None, schema: SchemaOption = DEFAULT_SCHEMA
) -> None:
    """List stream groups with the topics they read and their total lag."""
    with open_client(dsn, schema) as client:
        groups = client.list_groups()
    print_listing(groups, as_json, group_json, groups_table, "no groups")


@groups_app.command("describe")
def groups_describe(
    group: Annotated[str, typer.Argument(metavar="GROUP", help="Group name.", show_default=False)],
    topic: Annotated[str | None, typer.Option(
        "--topic", "-t", help="Only this topic.", show_default=False)] = None,
    as_json: JsonOption = False,
    dsn: DsnOption = None,
    schema: SchemaOption = DEFAULT_SCHEMA,
) -> None:
    """Per topic and partition of a group: checkpoint, head and lag, and for groups run by workers the
    lease owner, its last heartbeat and whether it is stale (or the partition retries a failing event).
    For a share group: where it started, its frontier, acquired, available, waiting and delivered-too-often
    counts, the oldest lock and the dead-letter counters."""
    check_group(group)
    if topic is not None:
        check_topic(topic)
    with open_client(dsn, schema) as client:
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
        console.print(f"total lag: {sum(s.lag for s in statuses)}")
        for m in members:
            console.print(member_line(m))
    if shares:
        console.print(share_table(shares))
        console.print(f"acquired: {sum(s.acquired for s in shares)}, "
                      f"available: {sum(s.available for s in shares)}, "
                      f"dead-lettered: {sum(s.dead_lettered for s in shares)}")


def register(app: typer.Typer) -> None:
    """Add the ``groups`` commands to ``app``."""
    app.add_typer(groups_app, name="groups")
