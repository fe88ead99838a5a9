"""Migrations: concurrent migrators, migrate=False, status, and independent schemas in one database."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor

import psycopg
import pytest

import pgstreams
from _core_helpers import SPAWN, connect_worker, take
from pgstreams import MigrationError
from pgstreams import migrate as _migrate

SHIPPED = [m.version for m in _migrate.available()]


def _recorded(dsn: str, schema: str = "pgstreams") -> list[int]:
    with psycopg.connect(dsn) as conn:
        return [r[0] for r in conn.execute(
            psycopg.sql.SQL("SELECT version FROM {}.migrations ORDER BY version").format(
                psycopg.sql.Identifier(schema))).fetchall()]


# numbers never used (set aside for features that in the end needed no migration); a schema migrated
# since records 0017 and later under their numbers, so they stay as they are
_RESERVED = {16, 18}


def test_shipped_migrations_are_numbered_from_one() -> None:
    missing = set(range(1, SHIPPED[-1] + 1)) - set(SHIPPED)
    assert SHIPPED == sorted(set(SHIPPED)) and SHIPPED[0] == 1 and missing <= _RESERVED


def test_concurrent_migrators_in_threads_apply_each_migration_once(empty_dsn: str) -> None:
    n = 6
    barrier = threading.Barrier(n)

    def run(_: int) -> list[int]:
        barrier.wait(10)
        with pgstreams.connect(empty_dsn, pool_size=1) as client, client.connection() as conn:
            return sorted(_migrate.applied_versions(conn, "pgstreams"))

    with ThreadPoolExecutor(n) as pool:
        results = list(pool.map(run, range(n)))
    assert results == [SHIPPED] * n
    assert _recorded(empty_dsn) == SHIPPED
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        assert _migrate.migrate(conn) == []  # nothing left to do
        status = _migrate.status(conn)
    assert [s.version for s in status] == SHIPPED
    assert all(s.applied_at is not None and s.applied_at.utcoffset() is not None for s in status)


@pytest.mark.slow
def test_concurrent_migrators_in_processes_apply_each_migration_once(empty_dsn: str) -> None:
    start_at = time.time() + 2.0
    with ProcessPoolExecutor(4, mp_context=SPAWN) as pool:
        futures = [pool.submit(connect_worker, empty_dsn, schema, start_at)
                   for schema in ("pgstreams", "pgstreams", "pgstreams", "other_schema")]
        results = [f.result(60) for f in futures]
    assert results == [SHIPPED] * 4
    assert _recorded(empty_dsn) == SHIPPED
    assert _recorded(empty_dsn, "other_schema") == SHIPPED


def test_migrate_false_requires_a_migrated_schema(empty_dsn: str) -> None:
    with pytest.raises(MigrationError, match="run `pgstreams migrate`"):
        pgstreams.connect(empty_dsn, migrate=False)
    with psycopg.connect(empty_dsn) as conn:
        row = conn.execute("SELECT count(*) FROM pg_namespace WHERE nspname = 'pgstreams'").fetchone()
        assert row == (0,)
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        assert _migrate.migrate(conn) == SHIPPED
    with pgstreams.connect(empty_dsn, migrate=False) as client:
        client.create_topic("t")
    # a schema behind the package (a migration missing) is refused too
    if len(SHIPPED) > 1:
        with psycopg.connect(empty_dsn, autocommit=True) as conn:
            conn.execute("DELETE FROM pgstreams.migrations WHERE version = %s", (SHIPPED[-1],))
        with pytest.raises(MigrationError, match=str(SHIPPED[-1])):
            pgstreams.connect(empty_dsn, migrate=False)


def test_two_schemas_in_one_database_are_independent(dsn: str) -> None:
    with pgstreams.connect(dsn, schema="alpha") as a, pgstreams.connect(dsn, schema="beta") as b:
        a.create_topic("t", 2)
        b.create_topic("t", 3)
        a.publish("t", "in alpha")
        for i in range(3):
            b.publish("t", f"in beta {i}")
        assert [t.partitions for t in a.list_topics()] == [2]
        assert [t.partitions for t in b.list_topics()] == [3]
        assert [e.value for e in take(a.consumer("t", "g"), 1, commit=True)] == ["in alpha"]
        assert sorted(e.value for e in take(b.consumer("t", "g"), 3)) == [f"in beta {i}" for i in range(3)]
        assert sum(s.lag for s in a.describe_group("g")) == 0
        assert sum(s.lag for s in b.describe_group("g")) == 3
        a.delete_topic("t")
        assert [t.name for t in b.list_topics()] == ["t"]
        assert b.describe_topic("t").events == 3
    assert _recorded(dsn, "alpha") == SHIPPED and _recorded(dsn, "beta") == SHIPPED


def test_a_failing_migration_is_rolled_back_as_a_whole(dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    shipped = _migrate.available()
    broken = _migrate.Migration(SHIPPED[-1] + 1, "broken",
                                "CREATE TABLE {schema}.half_done (x int);\nSELECT 1 / 0;\n")
    monkeypatch.setattr(_migrate.CORE, "_shipped", (*shipped, broken))
    with psycopg.connect(dsn, autocommit=True) as conn:
        with pytest.raises(psycopg.errors.DivisionByZero):
            _migrate.migrate(conn)
        assert conn.execute("SELECT to_regclass('pgstreams.half_done')").fetchone() == (None,)
    assert _recorded(dsn) == SHIPPED  # not recorded, earlier ones intact
    with pytest.raises(psycopg.Error):
        pgstreams.connect(dsn)  # connecting retries it, and fails the same way
    assert _recorded(dsn) == SHIPPED


def test_a_schema_migrated_by_a_newer_pgstreams_is_reported(dsn: str,
                                                           caplog: pytest.LogCaptureFixture) -> None:
    """A migration recorded in the schema but not shipped with this pgstreams is listed as unknown by
    status and warned about by migrate, which applies nothing."""
    future = SHIPPED[-1] + 1
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO pgstreams.migrations (version, name) VALUES (%s, 'from_the_future')",
                     (future,))
        rows = _migrate.status(conn)
        assert [(r.version, r.known) for r in rows] == [*((v, True) for v in SHIPPED), (future, False)]
        assert rows[-1].name == "from_the_future" and rows[-1].applied_at is not None
        assert _migrate.unknown_versions(conn) == [future]
        with caplog.at_level("WARNING", logger="pgstreams.migrate"):
            assert _migrate.migrate(conn) == []
    assert any(f"migrations {future}" in r.getMessage() and "newer pgstreams" in r.getMessage()
               for r in caplog.records)
    assert _recorded(dsn) == [*SHIPPED, future]
