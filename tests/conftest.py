"""Test fixtures: a real PostgreSQL and an isolated, migrated database per test.

Tests are grouped by tier: ``unit`` (no database), ``integration`` (a real PostgreSQL), ``faults``
(processes and threads that race, SIGKILL, concurrent producers), ``cli`` (the command line as real
subprocesses), ``spark`` (a local SparkSession), ``ml`` (the reference application's pipelines) and
``bench`` (benchmarks in their tiny mode, as real subprocesses).

The server is ``$PGSTREAMS_TEST_DSN`` when set, otherwise an embedded PostgreSQL (pgserver) that the
session starts itself. A template database is migrated once per server and migration set; every test
gets ``CREATE DATABASE ... TEMPLATE`` of it, dropped afterwards, so tests can run in parallel.

The cluster tests (tests/cluster, and the Spark source over a cluster) use three more PostgreSQL servers
of the session's own (:func:`shard_servers`), started the first time a test asks for them.
"""

from __future__ import annotations

import hashlib
import os
import queue
import tempfile
import threading
import uuid
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

import pgstreams
from _core_helpers import new_database
from pgstreams import migrate as _migrate
from pgstreams.cluster import init_cluster
from pgstreams.embedded import TemporaryServer, restartable_server


def _server_dsn() -> str:
    dsn = os.environ.get("PGSTREAMS_TEST_DSN")
    if dsn:
        return dsn
    from pgstreams.embedded import embedded_dsn

    root = Path(tempfile.gettempdir()) / f"pgstreams-test-{os.getuid()}"
    dsn = embedded_dsn(root / "pgdata")
    # The embedded test server holds only throw-away databases: skip the WAL flushes.
    with psycopg.connect(dsn, autocommit=True) as conn:
        if conn.execute("SHOW fsync").fetchone() != ("off",):
            conn.execute("ALTER SYSTEM SET fsync = off")
            conn.execute("ALTER SYSTEM SET synchronous_commit = off")
            conn.execute("ALTER SYSTEM SET full_page_writes = off")
            conn.execute("SELECT pg_reload_conf()")
    return dsn


class _Dropper:
    """Drops finished tests' databases in the background, so no test waits for DROP DATABASE."""

    def __init__(self, server_dsn: str) -> None:
        self._dsn = server_dsn
        self._queue: queue.Queue[str | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="drop-test-databases", daemon=True)
        self._thread.start()

    def drop(self, name: str) -> None:
        self._queue.put(name)

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join()

    def _run(self) -> None:
        with psycopg.connect(self._dsn, autocommit=True) as conn:
            while (name := self._queue.get()) is not None:
                conn.execute(psycopg.sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                    psycopg.sql.Identifier(name)))


def _template_name() -> str:
    h = hashlib.sha1()
    for m in _migrate.available():
        h.update(m.text.encode())
    return f"pgstreams_tpl_{h.hexdigest()[:12]}"


@pytest.fixture(scope="session")
def server_dsn() -> str:
    """DSN of the test server's maintenance database."""
    return _server_dsn()


@pytest.fixture(scope="session")
def template_db(server_dsn: str) -> str:
    """Name of a database with the pgstreams schema migrated, used as a template."""
    name = _template_name()
    with psycopg.connect(server_dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_advisory_lock(hashtext('pgstreams.test.template'))")
        try:
            exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
            if not exists:
                tmp = name + "_building"
                conn.execute(psycopg.sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                    psycopg.sql.Identifier(tmp)))
                conn.execute(psycopg.sql.SQL("CREATE DATABASE {}").format(psycopg.sql.Identifier(tmp)))
                with psycopg.connect(make_conninfo(server_dsn, dbname=tmp), autocommit=True) as t:
                    _migrate.migrate(t, "pgstreams")
                conn.execute(psycopg.sql.SQL("ALTER DATABASE {} RENAME TO {}").format(
                    psycopg.sql.Identifier(tmp), psycopg.sql.Identifier(name)))
        finally:
            conn.execute("SELECT pg_advisory_unlock(hashtext('pgstreams.test.template'))")
    return name


@pytest.fixture(scope="session")
def _dropper(server_dsn: str) -> Iterator[_Dropper]:
    d = _Dropper(server_dsn)
    yield d
    d.close()


@pytest.fixture
def dsn(server_dsn: str, template_db: str, _dropper: _Dropper) -> Iterator[str]:
    """DSN of a fresh database (migrated, schema ``pgstreams``) for this test only."""
    name = f"t_{uuid.uuid4().hex[:16]}"
    with psycopg.connect(server_dsn, autocommit=True) as conn:
        conn.execute(psycopg.sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
            psycopg.sql.Identifier(name), psycopg.sql.Identifier(template_db)))
    yield make_conninfo(server_dsn, dbname=name)
    _dropper.drop(name)


@pytest.fixture
def empty_dsn(server_dsn: str, _dropper: _Dropper) -> Iterator[str]:
    """DSN of a fresh database with nothing in it (for migration tests)."""
    name = f"e_{uuid.uuid4().hex[:16]}"
    with psycopg.connect(server_dsn, autocommit=True) as conn:
        conn.execute(psycopg.sql.SQL("CREATE DATABASE {}").format(psycopg.sql.Identifier(name)))
    yield make_conninfo(server_dsn, dbname=name)
    _dropper.drop(name)


@pytest.fixture
def client(dsn: str) -> Iterator[pgstreams.Client]:
    """A connected client on this test's database."""
    c = pgstreams.connect(dsn)
    yield c
    c.close()


def dbname(dsn: str) -> str:
    """The database name of a DSN."""
    return str(conninfo_to_dict(dsn)["dbname"])


#: How many servers :func:`shard_servers` starts: the shards of the cluster tests.
SHARDS = 3


@pytest.fixture(scope="session")
def shard_servers() -> Iterator[list[TemporaryServer]]:
    """Three running PostgreSQL servers of this session's own (embedded binaries, each on its own loopback
    port; fsync off: the machine does not crash, commits stay synchronous), for the cluster tests. Tests
    may stop and start them (a shard that is down); every test that uses them runs on one xdist worker
    (see :func:`pytest_collection_modifyitems`)."""
    with ExitStack() as stack:
        yield [stack.enter_context(restartable_server({"fsync": "off"})) for _ in range(SHARDS)]


@pytest.fixture
def shard_dsns(shard_servers: list[TemporaryServer]) -> list[str]:
    """A new empty database on each of :func:`shard_servers`: the DSNs of the shards of a cluster not
    created yet."""
    for server in shard_servers:  # a test that stopped a server and failed before starting it again
        try:
            psycopg.connect(server.dsn, connect_timeout=5).close()
        except psycopg.OperationalError:
            server.start()
    return [new_database(s.dsn, "shard_") for s in shard_servers]


@pytest.fixture
def cluster_dsns(shard_dsns: list[str]) -> list[str]:
    """The shard DSNs of a new cluster (``pgstreams cluster init`` done)."""
    init_cluster(shard_dsns)
    return shard_dsns


#: The tiers whose tests start a SparkSession.
_SPARK_TIERS = ("spark", "ml")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Run every test that starts a SparkSession, and every test that uses :func:`shard_servers`, on one
    xdist worker (``--dist loadgroup``, group ``spark``).

    Each SparkSession is a JVM; several at once on a small machine starve each other (Python workers
    then time out connecting back to their JVM). One worker runs them one module at a time while the
    other workers run the database tests.

    The tests of a cluster (tests/cluster and the Spark source over a cluster) share the three servers
    of :func:`shard_servers`, which some of them stop and start: they must run on one worker, which then
    starts the servers once, and never while another worker's test uses them. As the Spark tests over a
    cluster are among them, that worker is the Spark tests' one: a second group would either start a
    second JVM beside the Spark worker's or a second set of three servers.
    """
    for item in items:
        uses_shards = "shard_servers" in getattr(item, "fixturenames", ())
        if item.path.parent.name in _SPARK_TIERS or uses_shards:
            item.add_marker(pytest.mark.xdist_group("spark"))
