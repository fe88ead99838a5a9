"""``pgstreams dlt replay``: send dead letters back to their topics."""

from __future__ import annotations

from typing import Annotated

import typer

from pgstreams.admin import DEFAULT_REPLAY_GROUP
from pgstreams.models import to_json
from pgstreams.names import check_group, check_topic

from .common import DEFAULT_SCHEMA, DsnOption, JsonOption, PoolerOption, SchemaOption, open_client
from .output import event_json, events_table, out_console, print_json

dlt_app = typer.Typer(help="Dead-letter topics.", no_args_is_help=True)


@dlt_app.command("replay")
def dlt_replay(
    dlt_topic: Annotated[
        str,
        typer.Argument(metavar="DLT_TOPIC", help="The dead-letter topic (e.g. T.dlt).", show_default=False),
    ],
    to: Annotated[
        str | None,
        typer.Option(
            "--to", help="Publish to this topic instead of each event's original one.", show_default=False
        ),
    ] = None,
    group: Annotated[
        str, typer.Option("--group", help="The group recording the replay's progress.")
    ] = DEFAULT_REPLAY_GROUP,
    where_error_type: Annotated[
        str | None,
        typer.Option(
            "--where-error-type", help="Only dead letters whose dlt.error_type is this.", show_default=False
        ),
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Show what would be replayed; change nothing.")
    ] = False,
    as_json: JsonOption = False,
    dsn: DsnOption = None,
    pooler: PoolerOption = None,
    schema: SchemaOption = DEFAULT_SCHEMA,
) -> None:
    """Publish dead letters back to their original topic (or --to) with their original key, value and
    headers, plus the header dlt.replayed_from; each once, even if interrupted and run again."""
    check_topic(dlt_topic)
    if to is not None:
        check_topic(to)
    check_group(group)
    with open_client(dsn, schema, pooler=pooler) as client:
        result = client.replay_dead_letters(
            dlt_topic, to=to, group=group, where_error_type=where_error_type, dry_run=dry_run
        )
    if as_json:
        out = to_json(result)
        out["events"] = [event_json(e) for e in result.events]
        print_json(out)
        return
    console = out_console()
    if dry_run and result.events:
        console.print(events_table(list(result.events), "would replay (dry run: nothing changed)"))
    verb = "would replay" if dry_run else "replayed"
    console.print(
        f"{verb} {result.replayed} dead letter(s) of {result.read} read ({result.skipped} passed over)"
    )


def register(app: typer.Typer) -> None:
    """Add the ``dlt`` commands to ``app``."""
    app.add_typer(dlt_app, name="dlt")
