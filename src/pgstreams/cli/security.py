"""``pgstreams grant ROLE ...`` and ``pgstreams revoke ROLE ...``: least-privilege roles."""

from __future__ import annotations

from typing import Annotated

import typer

from .common import DEFAULT_SCHEMA, DsnOption, PoolerOption, SchemaOption, open_client, usage_error
from .output import out_console

ProduceOption = Annotated[list[str] | None, typer.Option(
    "--produce", metavar="TOPIC", help="A topic the role may publish to (repeat, or separate by commas).",
    show_default=False)]
ConsumeOption = Annotated[str | None, typer.Option(
    "--consume", metavar="GROUP",
    help="The group whose checkpoints the role may store, and the share group (or queue) it may use "
    "(with --topic).",
    show_default=False)]
TopicOption = Annotated[list[str] | None, typer.Option(
    "--topic", metavar="TOPIC", help="A topic the --consume group reads (repeat, or separate by commas).",
    show_default=False)]
AdminOption = Annotated[bool, typer.Option(
    "--admin", help="Everything: create, alter and delete topics, reset and delete groups, maintenance.")]


def _names(values: list[str] | None) -> list[str]:
    out = [v.strip() for value in values or [] for v in value.split(",")]
    if any(not v for v in out):
        raise usage_error("empty topic name in --produce / --topic")
    return out


def grant_command(
    role: Annotated[str, typer.Argument(help="An existing PostgreSQL role.")],
    produce: ProduceOption = None,
    consume: ConsumeOption = None,
    topic: TopicOption = None,
    admin: AdminOption = False,
    dsn: DsnOption = None,
    pooler: PoolerOption = None,
    schema: SchemaOption = DEFAULT_SCHEMA,
) -> None:
    """Grant ROLE the right to publish to topics (--produce), to read topics as a group (--consume GROUP
    --topic TOPIC), or everything (--admin). Enforced by PostgreSQL itself."""
    produced, topics = _names(produce), _names(topic)
    with open_client(dsn, schema, migrate=False, pooler=pooler) as client:
        client.grant(role, produce=produced, consume=consume, topics=topics, admin=admin)
    done = [f"produce {t}" for t in produced]
    if consume:
        done.append(f"consume {consume} on {', '.join(topics)}")
    if admin:
        done.append("admin")
    out_console().print(f"granted to {role}: " + ", ".join(done))


def revoke_command(
    role: Annotated[str, typer.Argument(help="An existing PostgreSQL role.")],
    produce: ProduceOption = None,
    consume: ConsumeOption = None,
    topic: TopicOption = None,
    admin: AdminOption = False,
    dsn: DsnOption = None,
    pooler: PoolerOption = None,
    schema: SchemaOption = DEFAULT_SCHEMA,
) -> None:
    """Revoke what grant gave ROLE (--consume GROUP without --topic: on every topic)."""
    with open_client(dsn, schema, migrate=False, pooler=pooler) as client:
        n = client.revoke(role, produce=_names(produce), consume=consume, topics=_names(topic), admin=admin)
    out_console().print(f"revoked {n} grant(s) of {role}")


def register(app: typer.Typer) -> None:
    """Add ``grant`` and ``revoke`` to ``app``."""
    app.command("grant")(grant_command)
    app.command("revoke")(revoke_command)
