"""``pgstreams topics create|list|describe|delete``."""

from __future__ import annotations

from typing import Annotated

import typer

import pgstreams
from pgstreams.cluster import ClusterTopicDescription
from pgstreams.names import check_partitions, check_topic
from pgstreams.topicconfig import TOPIC_CONFIG_DEFAULTS, check_config

from .common import DEFAULT_SCHEMA, DsnOption, JsonOption, PoolerOption, SchemaOption, open_any, usage_error
from .output import (
    config_table,
    out_console,
    partitions_table,
    plural,
    print_json,
    print_listing,
    topic_description_json,
    topic_heading,
    topic_json,
    topics_table,
)

topics_app = typer.Typer(help="Create, list, describe, alter and delete topics.", no_args_is_help=True)

ConfigOption = Annotated[list[str] | None, typer.Option(
    "--config", help="A topic config KEY=VALUE (repeatable); keys: " + ", ".join(TOPIC_CONFIG_DEFAULTS) + ".",
    show_default=False)]


def parse_config(items: list[str] | None) -> dict[str, int | str | float]:
    """``KEY=VALUE`` items of ``--config``, validated (usage error naming the key)."""
    out: dict[str, int | str] = {}
    for item in items or ():
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise usage_error(f"invalid --config {item!r}: expected KEY=VALUE")
        out[key.strip()] = value.strip()
    return check_config(out)


@topics_app.command("create")
def topics_create(
    name: Annotated[str, typer.Argument(
        metavar="NAME", help=f"Topic name: 1 to {pgstreams.MAX_TOPIC_NAME} of [A-Za-z0-9._-].",
        show_default=False)],
    partitions: Annotated[int, typer.Option("--partitions", "-p", help="Number of partitions.")] = 1,
    segment_size: Annotated[int, typer.Option(
        "--segment-size", help="Positions per storage segment.")
    ] = pgstreams.DEFAULT_SEGMENT_SIZE,
    config: ConfigOption = None,
    as_json: JsonOption = False,
    dsn: DsnOption = None,
    pooler: PoolerOption = None,
    schema: SchemaOption = DEFAULT_SCHEMA,
) -> None:
    """Create a topic. Succeeds if it already exists with the same partition count (and config)."""
    check_topic(name)
    check_partitions(partitions)
    settings = parse_config(config)
    with open_any(dsn, schema, pooler=pooler) as client:
        existed = any(t.name == name for t in client.list_topics())
        info = client.create_topic(name, partitions, segment_size=segment_size,
                                   config=settings if config else None)
    if as_json:
        print_json({**topic_json(info), "created": not existed})
    elif existed:
        out_console().print(f"topic {name!r} already exists ({plural(info.partitions, 'partition')})")
    else:
        out_console().print(f"created topic {name!r} ({plural(info.partitions, 'partition')})")


@topics_app.command("list")
def topics_list(
    as_json: JsonOption = False, dsn: DsnOption = None, schema: SchemaOption = DEFAULT_SCHEMA,
    pooler: PoolerOption = None,
) -> None:
    """List all topics."""
    with open_any(dsn, schema, pooler=pooler) as client:
        topics = client.list_topics()
    print_listing(topics, as_json, topic_json, topics_table, "no topics")


@topics_app.command("describe")
def topics_describe(
    name: Annotated[str, typer.Argument(metavar="NAME", help="Topic name.", show_default=False)],
    as_json: JsonOption = False,
    dsn: DsnOption = None,
    pooler: PoolerOption = None,
    schema: SchemaOption = DEFAULT_SCHEMA,
) -> None:
    """Show a topic with, per partition, its event count and head position."""
    check_topic(name)
    with open_any(dsn, schema, pooler=pooler) as client:
        found = client.describe_topic(name)
    shards = found.shards if isinstance(found, ClusterTopicDescription) else (found,)
    if as_json:
        out = topic_description_json(shards[0])
        if isinstance(found, ClusterTopicDescription):
            out["events"] = found.events
            out["span"] = found.span
            out["shards"] = [topic_description_json(d)["partition_info"] for d in shards]
        print_json(out)
        return
    console = out_console()
    console.print(topic_heading(shards[0]))
    for i, desc in enumerate(shards):
        if len(shards) > 1:
            console.print(f"shard {i}:")
        console.print(partitions_table(desc))
    console.print(config_table(shards[0]))


@topics_app.command("alter")
def topics_alter(
    name: Annotated[str, typer.Argument(metavar="NAME", help="Topic name.", show_default=False)],
    config: ConfigOption = None,
    delete_config: Annotated[list[str] | None, typer.Option(
        "--delete-config", help="Reset a config KEY to its default (repeatable).", show_default=False)
    ] = None,
    partitions: Annotated[int | None, typer.Option(
        "--partitions", "-p", help="New partition count (increase only).", show_default=False)] = None,
    as_json: JsonOption = False,
    dsn: DsnOption = None,
    pooler: PoolerOption = None,
    schema: SchemaOption = DEFAULT_SCHEMA,
) -> None:
    """Change a topic's config and raise its partition count (like kafka-configs --alter and
    kafka-topics --alter). All or nothing."""
    check_topic(name)
    settings = parse_config(config)
    for key in delete_config or ():
        if key not in TOPIC_CONFIG_DEFAULTS:
            raise usage_error(f"unknown topic config key {key!r} in --delete-config")
    if partitions is not None:
        check_partitions(partitions)
    if not settings and not delete_config and partitions is None:
        raise usage_error("nothing to change: give --config, --delete-config or --partitions")
    with open_any(dsn, schema, pooler=pooler) as client:
        altered = client.alter_topic(name, settings, partitions=partitions, delete_config=delete_config or ())
    desc = altered.shards[0] if isinstance(altered, ClusterTopicDescription) else altered
    if as_json:
        print_json(topic_description_json(desc))
        return
    console = out_console()
    console.print(f"altered topic {name!r}")
    console.print(config_table(desc))


@topics_app.command("delete")
def topics_delete(
    name: Annotated[str, typer.Argument(metavar="NAME", help="Topic name.", show_default=False)],
    if_exists: Annotated[bool, typer.Option(
        "--if-exists", help="Succeed when the topic does not exist.")] = False,
    dsn: DsnOption = None,
    pooler: PoolerOption = None,
    schema: SchemaOption = DEFAULT_SCHEMA,
) -> None:
    """Delete a topic with all its events and every group checkpoint on it."""
    check_topic(name)
    with open_any(dsn, schema, pooler=pooler) as client:
        try:
            client.delete_topic(name)
        except pgstreams.TopicNotFound:
            if not if_exists:
                raise
            out_console().print(f"topic {name!r} does not exist")
            return
    out_console().print(f"deleted topic {name!r}")


def register(app: typer.Typer) -> None:
    """Add the ``topics`` commands to ``app``."""
    app.add_typer(topics_app, name="topics")
