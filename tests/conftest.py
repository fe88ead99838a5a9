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
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

import pgstreams
from _core_helpers import new_database
from _spark_helpers import JVM_OPTIONS
from pgstreams import migrate as _migrate
from pgstreams.cluster import init_cluster
from pgstreams.embedded import TemporaryServer, restartable_server


# Every JVM the tests start, in this process or in a subprocess (Spark drivers of the CLI and the demo,
# standalone daemons, executors), with the options of _spark_helpers.JVM_OPTIONS.
os.environ.setdefault("JAVA_TOOL_OPTIONS", JVM_OPTIONS)


def _server_dsn() -> str:
    dsn = os.environ.get("PGSTREAMS_TEST_DSN")
    if dsn:
        return dsn
    from pgstreams.embedded import embedded_dsn

    root = Path(tempfile.gettempdir()) / f"pgstreams-test-{os.getuid()}"
    dsn = embedded_dsn(root / "pgdata")
    _nice_embedded_server(root / "pgdata")
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


#: The test folders and modules whose tests run on one xdist worker, one at a time: those that start a
#: SparkSession (spark, ml, the read-fence benchmark's) and those that use :func:`shard_servers`
#: (cluster, and spark's tests over a cluster).
_SPARK_PATHS = ("tests/spark/", "tests/ml/", "tests/cluster/", "tests/bench/test_bench_fence.py")
#: The xdist group (scheduling unit) of the tests in :data:`_SPARK_PATHS`.
_SPARK_GROUP = "spark"
#: The xdist worker that runs :data:`_SPARK_GROUP` (see :func:`pytest_xdist_make_scheduler`).
_SPARK_WORKER = "gw0"
#: How much nicer than the Spark worker the other workers, their subprocesses and the embedded test
#: server run when the tests run in parallel (see :func:`pytest_configure`).
_BACKGROUND_NICE = 5


def _in_spark_group(nodeid: str) -> bool:
    return nodeid.startswith(_SPARK_PATHS)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Refuse a test marked ``spark`` or using :func:`shard_servers` outside :data:`_SPARK_PATHS`: it
    would start a JVM beside the Spark worker's, or run beside the cluster tests, which stop and start
    those servers."""
    for item in items:
        spark = item.get_closest_marker("spark") is not None
        shards = "shard_servers" in getattr(item, "fixturenames", ())
        if (spark or shards) and not _in_spark_group(item.nodeid):
            raise pytest.UsageError(
                f"{item.nodeid} is marked spark or uses shard_servers: add its path to _SPARK_PATHS")


def _parallel_worker() -> str | None:
    """This process's xdist worker id when the tests run on more than one worker, else None."""
    if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) < 2:
        return None
    return os.environ.get("PYTEST_XDIST_WORKER")


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist: without it (-p no:xdist), not called
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """With ``--dist loadgroup``: every test in :data:`_SPARK_PATHS` runs on worker :data:`_SPARK_WORKER`,
    one at a time, first thing; the other tests are shared out by module as usual.

    Each SparkSession is a JVM; several at once on a small machine starve each other (the Python
    processes Spark starts then miss the 10 seconds Spark gives them to connect back). The tests of a
    cluster share the three servers of :func:`shard_servers`, which some of them stop and start: they
    must run on one worker, never while another worker's test uses them; as the Spark tests over a
    cluster are among them, that worker is the Spark one.

    The grouping is done here from the node ids' paths, not with ``xdist_group`` marks (which
    pytest-xdist 3.8 cannot apply to node ids under pytest 9.2). The Spark worker is the one
    :func:`pytest_configure` leaves at full priority.
    """
    if config.getoption("dist", "no") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling

    class SparkOnFirstWorker(LoadGroupScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _SPARK_GROUP if _in_spark_group(nodeid) else nodeid.rsplit("::", 1)[0]

        def _assign_work_unit(self, node: Any) -> None:
            if _SPARK_GROUP in self.workqueue:
                if node.gateway.id == _SPARK_WORKER:
                    self.workqueue.move_to_end(_SPARK_GROUP, last=False)
                elif len(self.workqueue) > 1:
                    self.workqueue.move_to_end(_SPARK_GROUP, last=True)
            super()._assign_work_unit(node)

    return SparkOnFirstWorker(config, log)


def pytest_configure(config: pytest.Config) -> None:
    """In a parallel run, every worker but the Spark one lowers its priority by :data:`_BACKGROUND_NICE`.

    Spark starts Python processes that must connect back to its JVM within 10 seconds (a limit Spark
    hard-codes); on a 2-core machine the database tests' processes and backends on the other workers can
    starve such a process that long. Niced, they still have the CPU whenever Spark does not use it.
    """
    worker = _parallel_worker()
    if worker is not None and worker != _SPARK_WORKER:
        os.nice(_BACKGROUND_NICE)


def _nice_embedded_server(pgdata: Path) -> None:
    """In a parallel run, let the embedded test server's new backends run :data:`_BACKGROUND_NICE` nicer
    than the Spark worker (they inherit the postmaster's priority), as the other workers do."""
    if _parallel_worker() is None:
        return
    try:
        pid = int((pgdata / "postmaster.pid").read_text().split()[0])
        if os.getpriority(os.PRIO_PROCESS, pid) < _BACKGROUND_NICE:
            os.setpriority(os.PRIO_PROCESS, pid, _BACKGROUND_NICE)
    except (OSError, ValueError, IndexError):  # stopped meanwhile, or another user's: leave it
        pass

