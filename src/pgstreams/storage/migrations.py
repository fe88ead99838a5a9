"""Numbered forward migrations: one runner for every namespace (the core, applications on pgstreams).

A namespace ships its migrations as ``NNNN_name.sql`` files in a folder of its package, rendered for the
target schema (``{schema}``: the quoted schema, ``{schema_raw}``: its bare name; literal braces doubled).
Each is applied in its own transaction and recorded in ``<schema>.migrations``; concurrent migrators of
one schema are serialised by a transaction-level advisory lock, so any number of processes may migrate
at start-up. A schema holding migrations the namespace does not ship (migrated by a newer version) is
reported: :meth:`MigrationSet.status` lists them as unknown and :meth:`MigrationSet.migrate` logs a
warning once per schema.
"""

from __future__ import annotations

import functools
import logging
import re
from dataclasses import dataclass
from datetime import datetime
from importlib import resources

import psycopg

from ..names import check_schema
from .queries import QuerySet, render_script

_FILE_RE = re.compile(r"(\d{4})_([a-z0-9_]+)\.sql")
_QUERIES = QuerySet("pgstreams.storage", "sql", "queries")
log = logging.getLogger("pgstreams.migrate")


@dataclass(frozen=True)
class Migration:
    """One migration file: its ``version`` number, ``name`` and SQL text (not yet rendered)."""

    version: int
    name: str
    text: str


@dataclass(frozen=True)
class MigrationStatus:
    """Whether a migration is applied in a schema, and when (``applied_at`` is ``None`` if pending).

    ``known`` is ``False`` for a migration applied in the schema that this version does not ship (the
    schema was migrated by a newer version).
    """

    version: int
    name: str
    applied_at: datetime | None
    known: bool = True


class MigrationSet:
    """The migrations of one namespace: the ``*.sql`` files of ``package``/``folder``, applied under the
    advisory lock ``lock_name`` (one per namespace, so two namespaces sharing a schema name never wait
    for each other). ``label`` names the namespace in messages ("a newer pgstreams migrated it")."""

    def __init__(self, package: str, folder: tuple[str, ...], lock_name: str, label: str) -> None:
        self.package = package
        self.label = label
        self.folder = folder
        self.lock_name = lock_name
        self._warned: set[tuple[object, ...]] = set()  # (server, database, schema, versions) warned once

    def __repr__(self) -> str:
        return f"<MigrationSet {self.package}:{'/'.join(self.folder)}>"

    @functools.cached_property
    def _shipped(self) -> tuple[Migration, ...]:
        out = []
        for entry in resources.files(self.package).joinpath(*self.folder).iterdir():
            m = _FILE_RE.fullmatch(entry.name)
            if m:
                out.append(Migration(int(m.group(1)), m.group(2), entry.read_text("utf-8")))
        return tuple(sorted(out, key=lambda x: x.version))

    def available(self) -> list[Migration]:
        """Every shipped migration, in version order (read once per process)."""
        return list(self._shipped)

    def applied(self, conn: psycopg.Connection, schema: str) -> dict[int, tuple[str, datetime]]:
        """Migrations applied in ``schema``: version -> (name, time); empty if the schema has none."""
        check_schema(schema)
        exists = conn.execute(_QUERIES.get("migrations_table_exists", schema), (schema,)).fetchone()
        if not exists or not exists[0]:
            return {}
        rows = conn.execute(_QUERIES.get("applied_migrations", schema)).fetchall()
        return {int(v): (str(n), t) for v, n, t in rows}

    def status(self, conn: psycopg.Connection, schema: str) -> list[MigrationStatus]:
        """Every shipped migration with the time it was applied in ``schema`` (``None`` if pending), then
        those applied there that this version does not ship (``known=False``), in version order."""
        done = self.applied(conn, schema)
        out = [MigrationStatus(m.version, m.name, done[m.version][1] if m.version in done else None)
               for m in self._shipped]
        versions = {m.version for m in self._shipped}
        out.extend(MigrationStatus(v, n, t, known=False) for v, (n, t) in done.items() if v not in versions)
        return sorted(out, key=lambda r: r.version)

    def unknown_versions(self, conn: psycopg.Connection, schema: str) -> list[int]:
        """Versions applied in ``schema`` that this version does not ship; empty normally."""
        shipped = {m.version for m in self._shipped}
        return sorted(v for v in self.applied(conn, schema) if v not in shipped)

    def pending(self, conn: psycopg.Connection, schema: str) -> list[int]:
        """Shipped versions not yet applied in ``schema``."""
        done = self.applied(conn, schema)
        return [m.version for m in self._shipped if m.version not in done]

    def migrate(self, conn: psycopg.Connection, schema: str) -> list[int]:
        """Apply every pending migration to ``schema``; return the versions applied (empty if up to date).

        ``conn`` must be in autocommit mode (not inside a transaction): each migration commits on its own.
        """
        check_schema(schema)
        q = functools.partial(_QUERIES.get, schema=schema)
        applied: list[int] = []
        # up to date: read only (a role granted produce or consume rights has no DDL right)
        shipped = self._shipped if self.pending(conn, schema) else ()
        for mig in shipped:
            with conn.transaction():
                conn.execute(q("migration_lock"), (self.lock_name, schema))
                conn.execute(q("create_schema"))
                conn.execute(q("create_migrations_table"))
                if conn.execute(q("migration_done"), (mig.version,)).fetchone():
                    continue
                conn.execute(render_script(mig.text, schema))
                conn.execute(q("record_migration"), (mig.version, mig.name))
                applied.append(mig.version)
        if self._shipped:  # the migrations table exists now (every migration above made sure of it)
            with conn.transaction():
                rows = conn.execute(q("unknown_migrations"), ([m.version for m in self._shipped],)).fetchall()
            self._warn_unknown(conn, schema, [int(v) for (v,) in rows])
        return applied

    def drop_schema(self, conn: psycopg.Connection, schema: str) -> None:
        """Drop ``schema`` and everything in it."""
        check_schema(schema)
        conn.execute(_QUERIES.get("drop_schema", schema))

    def _warn_unknown(self, conn: psycopg.Connection, schema: str, unknown: list[int]) -> None:
        key = (conn.info.host, conn.info.port, conn.info.dbname, schema, tuple(unknown))
        if unknown and key not in self._warned:
            self._warned.add(key)
            log.warning("schema %r holds migrations %s that this %s does not ship: a newer %s migrated it; "
                        "upgrade this one before relying on it", schema, ", ".join(map(str, unknown)),
                        self.label, self.label)


#: The migrations of the pgstreams core (``pgstreams/storage/sql/migrations``).
CORE = MigrationSet("pgstreams.storage", ("sql", "migrations"), "pgstreams.migrate", "pgstreams")
