"""The application's SQL: numbered migrations and named queries, shipped as ``.sql`` package data and
loaded and applied by the pgstreams storage layer's loader and migration runner.

``{schema}`` in the files is the application schema, composed as a quoted identifier; values are always
bound parameters.
"""

from __future__ import annotations

import psycopg
from psycopg import sql

from pgstreams.storage import MigrationSet, QuerySet

#: The named queries of ``sql/queries.sql``.
QUERIES = QuerySet("pgstreams_ml", "sql", "queries.sql")

#: The application's migrations (``sql/migrations``), recorded in ``<schema>.migrations`` and serialised
#: by an advisory lock of their own.
MIGRATIONS = MigrationSet("pgstreams_ml", ("sql", "migrations"), "pgstreams_ml.migrate", "pgstreams_ml")


def q(name: str, schema: str) -> sql.Composed:
    """The named query ``name`` rendered for ``schema`` (cached)."""
    return QUERIES.get(name, schema)


def migrate(conn: psycopg.Connection, schema: str) -> list[int]:
    """Create or upgrade the application's tables in ``schema``; return the versions applied.

    Each migration runs in its own transaction under an advisory lock, so concurrent callers are safe.
    ``conn`` must be in autocommit mode.
    """
    return MIGRATIONS.migrate(conn, schema)


def drop_schema(conn: psycopg.Connection, schema: str) -> None:
    """Drop the application schema and everything in it (used by ``--reset``)."""
    MIGRATIONS.drop_schema(conn, schema)
