"""Versioned schema migrations of the pgstreams core.

Migrations are the numbered ``.sql`` files under ``pgstreams/storage/sql/migrations`` (``0001_initial.sql``,
...), rendered for the target schema. Each is applied in its own transaction and recorded in
``<schema>.migrations``; concurrent migrators are serialised by a transaction-level advisory lock, so
any number of processes may call :func:`migrate` at start-up. A schema holding migrations this version
does not ship (migrated by a newer pgstreams) is reported: :func:`status` lists them as unknown and
:func:`migrate` logs a warning. The runner is :class:`pgstreams.storage.migrations.MigrationSet`, shared
with applications that keep migrations of their own.
"""

from __future__ import annotations

from datetime import datetime

import psycopg

from .storage.migrations import CORE, Migration, MigrationStatus

__all__ = ["Migration", "MigrationStatus", "applied_versions", "available", "migrate", "pending", "status",
           "unknown_versions"]


def available() -> list[Migration]:
    """All migrations shipped with this version of pgstreams, in version order (read once per process)."""
    return CORE.available()


def applied_versions(conn: psycopg.Connection, schema: str) -> dict[int, datetime]:
    """Versions applied in ``schema`` with their time; empty if the schema has none."""
    return {v: t for v, (_name, t) in CORE.applied(conn, schema).items()}


def pending(conn: psycopg.Connection, schema: str = "pgstreams") -> list[int]:
    """Shipped versions not yet applied in ``schema`` (default ``"pgstreams"``)."""
    return CORE.pending(conn, schema)


def status(conn: psycopg.Connection, schema: str = "pgstreams") -> list[MigrationStatus]:
    """Every shipped migration with the time it was applied in ``schema`` (``None`` if pending), then
    those applied in ``schema`` that this version does not ship (``known=False``), in version order."""
    return CORE.status(conn, schema)


def unknown_versions(conn: psycopg.Connection, schema: str = "pgstreams") -> list[int]:
    """Versions applied in ``schema`` that this version of pgstreams does not ship (a newer one migrated
    it); empty normally."""
    return CORE.unknown_versions(conn, schema)


def migrate(conn: psycopg.Connection, schema: str = "pgstreams") -> list[int]:
    """Apply every pending migration to ``schema``; return the versions applied (empty if up to date).

    ``conn`` must not be inside a transaction; each migration commits on its own.
    """
    return CORE.migrate(conn, schema)
