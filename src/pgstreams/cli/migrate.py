"""``pgstreams migrate``: apply pending schema migrations, or show their status."""

from __future__ import annotations

from typing import Annotated

import typer

from pgstreams import migrate as migrations
from pgstreams.names import check_schema

from .common import DEFAULT_SCHEMA, DsnOption, JsonOption, PoolerOption, SchemaOption, open_connection
from .output import err_console, migrate_json, migration_json, migrations_table, out_console, print_json


def migrate_command(
    status: Annotated[bool, typer.Option("--status", help="Only show which migrations are applied.")] = False,
    as_json: JsonOption = False,
    dsn: DsnOption = None,
    pooler: PoolerOption = None,
    schema: SchemaOption = DEFAULT_SCHEMA,
) -> None:
    """Apply pending schema migrations (or show their status with --status)."""
    check_schema(schema)
    with open_connection(dsn, pooler) as conn:
        if status:
            rows = migrations.status(conn, schema)
            if as_json:
                print_json([migration_json(r) for r in rows])
            else:
                out_console().print(migrations_table(rows, schema))
            return
        applied = migrations.migrate(conn, schema)
        unknown = migrations.unknown_versions(conn, schema)
    latest = max((m.version for m in migrations.available()), default=0)
    if unknown:
        err_console().print(f"[yellow]warning:[/] schema {schema!r} holds migrations "
                            f"{', '.join(map(str, unknown))}, newer than this pgstreams knows (up to "
                            f"{latest}): a newer pgstreams migrated it; upgrade this one")
    version = max([latest, *unknown])
    if as_json:
        print_json(migrate_json(schema, applied, version, unknown))
    elif applied:
        out_console().print(f"schema {schema!r}: applied migrations {', '.join(map(str, applied))} "
                            f"(now at version {version})")
    else:
        out_console().print(f"schema {schema!r} is up to date (version {version})")


def register(app: typer.Typer) -> None:
    """Add ``migrate`` to ``app``."""
    app.command("migrate")(migrate_command)
