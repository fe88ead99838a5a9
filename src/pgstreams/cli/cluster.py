"""``pgstreams cluster init|describe``: the layout of a cluster of shards (docs/shards.md)."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from pgstreams.cluster import ClusterDescription, ClusterInit, describe_cluster, init_cluster
from pgstreams.names import check_schema

from .common import DEFAULT_SCHEMA, DsnOption, JsonOption, SchemaOption, check_dsn, resolve_all, usage_error
from .output import iso, out_console, print_json

cluster_app = typer.Typer(help="Create and show a cluster of shards (several PostgreSQL servers).",
                          no_args_is_help=True)


def _layout_json(description: ClusterDescription | ClusterInit) -> dict[str, Any]:
    layout = description.layout
    return {"cluster_id": layout.cluster_id, "created_at": iso(layout.created_at),
            "shards": [{"shard": i, "server": s} for i, s in enumerate(layout.shards)]}


@cluster_app.command("init")
def cluster_init(
    dsns: Annotated[list[str], typer.Argument(
        metavar="DSN...", help="The shards' DSNs, in the cluster's order (at least two; to add shards, "
        "give the existing ones first, in their order, then the new ones).", show_default=False)],
    as_json: JsonOption = False,
    schema: SchemaOption = DEFAULT_SCHEMA,
) -> None:
    """Make the servers the shards of a cluster, or add shards to one (idempotent). Existing topics keep
    their shards: new shards take only topics created from now on."""
    check_schema(schema)
    given = [d for d in (check_dsn(d) for d in dsns) if d is not None]
    if len(given) < 2:
        raise usage_error("cluster init needs at least two DSNs (the shards, in order)")
    done = init_cluster(given, schema=schema)
    if as_json:
        print_json({**_layout_json(done), "action": done.action, "added": list(done.added)})
        return
    console = out_console()
    layout = done.layout
    if done.action == "created":
        console.print(f"created cluster {layout.cluster_id} with {len(layout.shards)} shards")
    elif done.action == "extended":
        console.print(f"added shards {', '.join(map(str, done.added))} to cluster {layout.cluster_id} "
                      f"(now {len(layout.shards)} shards; existing topics keep their shards)")
    else:
        console.print(f"cluster {layout.cluster_id} is already so ({len(layout.shards)} shards)")
    for i, server in enumerate(layout.shards):
        console.print(f"  shard {i}: {server}")


@cluster_app.command("describe")
def cluster_describe(
    as_json: JsonOption = False,
    dsn: DsnOption = None,
    schema: SchemaOption = DEFAULT_SCHEMA,
) -> None:
    """Show the cluster's layout as its shards record it (checked against the --dsn list, in order) and
    the topics of each shard with their span (the shards a topic's events go to)."""
    check_schema(schema)
    description = describe_cluster(resolve_all(dsn), schema=schema)
    if as_json:
        out = _layout_json(description)
        for entry, shard in zip(out["shards"], description.shards, strict=True):
            entry["topics"] = {name: span for name, span in shard.spans}
        print_json(out)
        return
    console = out_console()
    layout = description.layout
    console.print(f"cluster {layout.cluster_id} (created {iso(layout.created_at)}), "
                  f"{len(layout.shards)} shards")
    for shard in description.shards:
        topics = ", ".join(f"{name} (span {span})" for name, span in shard.spans) or "no topics"
        console.print(f"  shard {shard.shard}: {shard.server}: {topics}")


def register(app: typer.Typer) -> None:
    """Add the ``cluster`` commands to ``app``."""
    app.add_typer(cluster_app, name="cluster")
