"""Versioned schema migrations.

Migrations are the numbered ``.sql`` files under ``pgstreams/sql/migrations`` (``0001_initial.sql``, ...),
rendered for the target schema. Each is applied in its own transaction and recorded in
``<schema>.migrations``; concurrent migrators are serialised by a transaction-level advisory lock, so
any number of processes may call :func:`migrate` at start-up. A schema holding migrations this version
does not ship (migrated by a newer pgstreams) is reported: :func:`status` lists them as unknown and
:func:`migrate` logs a warning.
"""

from __future__ import annotations

import functools
import logging
import re
from dataclasses import dataclass
from datetime import datetime
from importlib import resources

import psycopg
from psycopg import sql

from ._names import check_schema

_FILE_RE = re.compile(r"(\d{4})_([a-z0-9_]+)\.sql")
log = logging.getLogger(__name__)
_warned: set[tuple[object, ...]] = set()  # (server, database, schema, versions) warned about once


@dataclass(frozen=True)
class Migration:
    """One migration file: its ``version`` number, ``name`` and SQL text (not yet rendered)."""

    version: int
    name: str
    text: str


@dataclass(frozen=True)
class MigrationStatus:
    """Whether a migration is applied in a schema, and when (``applied_at`` is ``None`` if pending).

    ``known`` is ``False`` for a migration applied in the schema that this version of pgstreams does not
    ship (the schema was migrated by a newer pgstreams).
    """

    version: int
    name: str
    applied_at: datetime | None
    known: bool = True


def available() -> list[Migration]:
    """All migrations shipped with this version of pgstreams, in version order (read once per process)."""
    return list(_shipped())


@functools.cache
def _shipped() -> tuple[Migration, ...]:
    out = []
    folder = resources.files("pgstreams") / "sql" / "migrations"
    for entry in folder.iterdir():
        m = _FILE_RE.fullmatch(entry.name)
        if m:
            out.append(Migration(int(m.group(1)), m.group(2), entry.read_text("utf-8")))
    return tuple(sorted(out, key=lambda x: x.version))


def render(text: str, schema: str) -> str:
    """Render a migration's SQL for ``schema`` (validated, then quoted as an identifier)."""
    check_schema(schema)
    return text.format(schema='"' + schema + '"', schema_raw=schema)


def _lock(conn: psycopg.Connection, schema: str) -> None:
    conn.execute("SELECT pg_advisory_xact_lock(hashtext('pgstreams.migrate'), hashtext(%s))", (schema,))


def _ensure_table(conn: psycopg.Connection, schema: str) -> None:
    conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema)))
    conn.execute(
        sql.SQL(
            "CREATE TABLE IF NOT EXISTS {}.migrations ("
            " version integer PRIMARY KEY, name text NOT NULL,"
            " applied_at timestamptz NOT NULL DEFAULT now())"
        ).format(sql.Identifier(schema))
    )


def _applied(conn: psycopg.Connection, schema: str) -> dict[int, tuple[str, datetime]]:
    """Migrations applied in ``schema``: version -> (name, time); empty if the schema has none."""
    check_schema(schema)
    exists = conn.execute(
        "SELECT to_regclass(format('%%I.migrations', %s::text)) IS NOT NULL", (schema,)
    ).fetchone()
    if not exists or not exists[0]:
        return {}
    rows = conn.execute(
        sql.SQL("SELECT version, name, applied_at FROM {}.migrations").format(sql.Identifier(schema))
    ).fetchall()
    return {int(v): (str(n), t) for v, n, t in rows}


def applied_versions(conn: psycopg.Connection, schema: str) -> dict[int, datetime]:
    """Versions applied in ``schema`` with their time; empty if the schema has none."""
    return {v: t for v, (_name, t) in _applied(conn, schema).items()}


def status(conn: psycopg.Connection, schema: str = "pgstreams") -> list[MigrationStatus]:
    """Every shipped migration with the time it was applied in ``schema`` (``None`` if pending), then
    those applied in ``schema`` that this version does not ship (``known=False``), in version order."""
    done = _applied(conn, schema)
    shipped = available()
    out = [MigrationStatus(m.version, m.name, done[m.version][1] if m.version in done else None)
           for m in shipped]
    versions = {m.version for m in shipped}
    out.extend(MigrationStatus(v, n, t, known=False) for v, (n, t) in done.items() if v not in versions)
    return sorted(out, key=lambda r: r.version)


def unknown_versions(conn: psycopg.Connection, schema: str = "pgstreams") -> list[int]:
    """Versions applied in ``schema`` that this version of pgstreams does not ship (a newer one migrated
    it); empty normally."""
    shipped = {m.version for m in available()}
    return sorted(v for v in _applied(conn, schema) if v not in shipped)


def migrate(conn: psycopg.Connection, schema: str = "pgstreams") -> list[int]:
    """Apply every pending migration to ``schema``; return the versions applied (empty if up to date).

    ``conn`` must not be inside a transaction; each migration commits on its own.
    """
    check_schema(schema)
    applied: list[int] = []
    shipped = available()
    for mig in shipped:
        with conn.transaction():
            _lock(conn, schema)
            _ensure_table(conn, schema)
            row = conn.execute(
                sql.SQL("SELECT 1 FROM {}.migrations WHERE version = %s").format(sql.Identifier(schema)),
                (mig.version,),
            ).fetchone()
            if row:
                continue
            conn.execute(render(mig.text, schema).encode())
            conn.execute(
                sql.SQL("INSERT INTO {}.migrations (version, name) VALUES (%s, %s)").format(
                    sql.Identifier(schema)
                ),
                (mig.version, mig.name),
            )
            applied.append(mig.version)
    unknown: list[int] = []
    if shipped:  # the migrations table exists now (every migration above made sure of it)
        with conn.transaction():
            rows = conn.execute(
                sql.SQL("SELECT version FROM {}.migrations WHERE version <> ALL(%s) ORDER BY version").format(
                    sql.Identifier(schema)), ([m.version for m in shipped],)).fetchall()
        unknown = [int(v) for (v,) in rows]
    key = (conn.info.host, conn.info.port, conn.info.dbname, schema, tuple(unknown))
    if unknown and key not in _warned:
        _warned.add(key)
        log.warning("schema %r holds migrations %s that this pgstreams does not ship: a newer pgstreams "
                    "migrated it; upgrade this one before relying on it", schema,
                    ", ".join(map(str, unknown)))
    return applied
