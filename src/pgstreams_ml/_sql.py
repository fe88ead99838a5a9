"""The application's SQL: numbered migrations and named queries, shipped as ``.sql`` package data.

``{schema}`` in the files is the application schema, composed as a quoted identifier; values are always
bound parameters.
"""

from __future__ import annotations

import functools
import re
from importlib import resources

import psycopg
from psycopg import sql

from pgstreams.names import check_schema

_NAME_RE = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)
_FILE_RE = re.compile(r"(\d{4})_([a-z0-9_]+)\.sql")


@functools.cache
def _load() -> dict[str, str]:
    text = (resources.files("pgstreams_ml") / "sql" / "queries.sql").read_text("utf-8")
    parts = _NAME_RE.split(text)
    return {name: body.strip().rstrip(";") for name, body in zip(parts[1::2], parts[2::2], strict=True)}


@functools.lru_cache(maxsize=512)
def q(name: str, schema: str) -> sql.Composed:
    """The named query ``name`` rendered for ``schema``."""
    return sql.SQL(_load()[name]).format(schema=sql.Identifier(schema))


def migrations() -> list[tuple[int, str, str]]:
    """``(version, name, text)`` of every shipped migration, in order."""
    out = []
    for entry in (resources.files("pgstreams_ml") / "sql" / "migrations").iterdir():
        m = _FILE_RE.fullmatch(entry.name)
        if m:
            out.append((int(m.group(1)), m.group(2), entry.read_text("utf-8")))
    return sorted(out)


def migrate(conn: psycopg.Connection, schema: str) -> list[int]:
    """Create or upgrade the application's tables in ``schema``; return the versions applied.

    Each migration runs in its own transaction under an advisory lock, so concurrent callers are safe.
    ``conn`` must be in autocommit mode.
    """
    check_schema(schema)
    ident = sql.Identifier(schema)
    applied = []
    for version, name, text in migrations():
        with conn.transaction():
            conn.execute(q("migration_lock", schema), (schema,))
            conn.execute(q("create_schema", schema))
            conn.execute(q("create_migrations_table", schema))
            if conn.execute(q("migration_done", schema), (version,)).fetchone():
                continue
            conn.execute(sql.SQL(text).format(schema=ident))
            conn.execute(q("record_migration", schema), (version, name))
            applied.append(version)
    return applied


def drop_schema(conn: psycopg.Connection, schema: str) -> None:
    """Drop the application schema and everything in it (used by ``--reset``)."""
    check_schema(schema)
    conn.execute(q("drop_schema", schema))
