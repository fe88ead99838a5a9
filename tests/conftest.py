"""Test fixtures: a real PostgreSQL and an isolated, migrated database per test.

Tests are grouped by tier: ``unit`` (no database), ``integration`` (a real PostgreSQL), ``faults``
(processes and threads that race, SIGKILL, concurrent producers), ``cli`` (the command line as real
subprocesses), ``spark`` (a local SparkSession), ``ml`` (the reference application's pipelines),
``gateway`` and ``conformance`` (the Kafka gateway with real Kafka clients, and against a reference broker)
and ``bench`` (benchmarks in their tiny mode, as real subprocesses).

The server is ``$PGSTREAMS_TEST_DSN`` when set, otherwise an embedded PostgreSQL (pgserver) that the
session starts itself. A template database is migrated once per server and migration set; every test
gets ``CREATE DATABASE ... TEMPLATE`` of it, dropped afterwards, so tests can run in parallel.

The cluster tests (tests/cluster, and the Spark source over a cluster) use three more PostgreSQL servers
of the session's own (:func:`shard_servers`), started the first time a test asks for them.
"""

from __future__ import annotations

import functools
import hashlib
import os
import queue
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
from _spark_helpers import JVM_OPTIONS, archive_path, jvm_archive, jvm_options
from _system import TEST_ROOT
from pgstreams import migrate as _migrate
from pgstreams.cluster import init_cluster
from pgstreams.embedded import TemporaryServer, restartable_server

# Every JVM the tests start, in this process or in a subprocess (Spark drivers of the CLI and the demo,
# standalone daemons, executors), with the options of _spark_helpers.JVM_OPTIONS, and the class-data archive
# of _spark_helpers.jvm_archive once there is one (see pytest_runtest_setup). Options set by the caller win.
_OWN_JVM_OPTIONS = "JAVA_TOOL_OPTIONS" not in os.environ
os.environ.setdefault("JAVA_TOOL_OPTIONS", JVM_OPTIONS)


def _server_dsn() -> str:
    dsn = os.environ.get("PGSTREAMS_TEST_DSN")
    if dsn:
        return dsn
    from pgstreams.embedded import embedded_dsn

    root = TEST_ROOT
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


@pytest.fixture(scope="session")
def copy_strategy(server_dsn: str) -> psycopg.sql.Composable:
    """How ``CREATE DATABASE ... TEMPLATE`` copies the template on the test server: ``FILE_COPY`` (a third of
    the time of the default ``WAL_LOG``, which writes every page of the copy to the WAL) when the server
    runs with ``fsync = off`` (the embedded test server: the checkpoint ``FILE_COPY`` takes then costs no
    flush), else the server's default."""
    with psycopg.connect(server_dsn, autocommit=True) as conn:
        off = conn.execute("SHOW fsync").fetchone() == ("off",)
    return psycopg.sql.SQL(" STRATEGY FILE_COPY" if off else "")


@pytest.fixture
def dsn(server_dsn: str, template_db: str, copy_strategy: psycopg.sql.Composable,
        _dropper: _Dropper) -> Iterator[str]:
    """DSN of a fresh database (migrated, schema ``pgstreams``) for this test only."""
    name = f"t_{uuid.uuid4().hex[:16]}"
    with psycopg.connect(server_dsn, autocommit=True) as conn:
        conn.execute(psycopg.sql.SQL("CREATE DATABASE {} TEMPLATE {}{}").format(
            psycopg.sql.Identifier(name), psycopg.sql.Identifier(template_db), copy_strategy))
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
    may stop and start them (a shard that is down); every test that uses them runs in a lane, one at a time,
    and each lane's worker process has servers of its own (see :data:`_LANES`)."""
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


@pytest.fixture(scope="session")
def logical_server() -> Iterator[TemporaryServer]:
    """A PostgreSQL server of this process's own with ``wal_level = logical`` (fsync off), for the change
    data capture tests, with a template database migrated once: :func:`cdc_dsn` makes each test's."""
    with restartable_server({"wal_level": "logical", "fsync": "off", "max_replication_slots": "20",
                             "max_wal_senders": "20"}) as server:
        with psycopg.connect(server.dsn, autocommit=True) as conn:
            conn.execute("CREATE DATABASE cdc_template")
        with psycopg.connect(make_conninfo(server.dsn, dbname="cdc_template"), autocommit=True) as t:
            _migrate.migrate(t, "pgstreams")
        yield server


@pytest.fixture(scope="session")
def replica_server() -> Iterator[TemporaryServer]:
    """A PostgreSQL server of this process's own with ``wal_level = replica`` (PostgreSQL's default; fsync
    off): where change data capture must be refused."""
    with restartable_server({"wal_level": "replica", "fsync": "off"}) as server:
        yield server


@pytest.fixture
def cdc_dsn(logical_server: TemporaryServer) -> Iterator[str]:
    """DSN of a fresh migrated database on :func:`logical_server` for this test only; its replication
    slots are dropped with it."""
    name = f"c_{uuid.uuid4().hex[:16]}"
    with psycopg.connect(logical_server.dsn, autocommit=True) as conn:
        conn.execute(psycopg.sql.SQL("CREATE DATABASE {} TEMPLATE cdc_template STRATEGY FILE_COPY").format(
            psycopg.sql.Identifier(name)))
    yield make_conninfo(logical_server.dsn, dbname=name)
    with psycopg.connect(logical_server.dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (name,))
        conn.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                     "WHERE database = %s AND NOT active", (name,))
        conn.execute(psycopg.sql.SQL("DROP DATABASE {} WITH (FORCE)").format(psycopg.sql.Identifier(name)))


@pytest.fixture
def cdc_client(cdc_dsn: str) -> Iterator[pgstreams.Client]:
    """A client of :func:`cdc_dsn`'s database, closed after the test."""
    c = pgstreams.connect(cdc_dsn)
    yield c
    c.close()


#: The lanes of a parallel run (``--dist loadgroup``): each lane's tests run on one xdist worker of its
#: own, one at a time, first thing (worker ``gw<i>`` for the lane at index ``i``, modulo the number of
#: workers); every other test module goes to whichever worker is free, the longest first.
#:
#: - ``spark`` and ``ml``: the tests that start a SparkSession in the test process (tests/spark, and the
#:   ML pipelines and serving process). Each SparkSession is a JVM; two at once in one process would share
#:   it; two lanes, so that the longest chain of tests that must run one after the other is half as long.
#:   The other ML modules (simulator, services, latency) start no Spark and run on any worker.
#: - ``demo``: ``pgstreams demo`` on ``local[2]``, a subprocess of a few minutes, beside the spark lane.
#: - ``cluster``: the demo on a Spark standalone cluster, the read-fence benchmark (its Spark reader) and
#:   the cluster tests (tests/cluster).
#:
#: The tests that use :func:`shard_servers` (tests/cluster in the cluster lane, Spark over a cluster in the
#: spark lane) stop and start those servers: each lane's worker process has three of its own.
_LANES: dict[str, tuple[str, ...]] = {
    "spark": ("tests/spark/",),
    "ml": ("tests/ml/test_ml_pipelines.py", "tests/ml/test_ml_serving.py"),
    "demo": ("tests/ml/test_ml_demo.py",),
    "cluster": ("tests/ml/test_ml_cluster.py", "tests/cluster/", "tests/bench/test_bench_fence.py"),
}
#: The modules of no lane that take longest (about 20 s or more on a quiet 2-core machine), handed out
#: first so that no long one starts last.
_LONG_FIRST = (
    "tests/cli/test_cli.py",
    "tests/cli/test_operations_cli.py",
    "tests/faults/test_silent_cut.py",
    "tests/faults/test_cdc_faults.py",
    "tests/faults/test_snapshot_bench.py",
    "tests/faults/test_aio_restarts.py",
    "tests/integration/test_shares.py",
    "tests/faults/test_restarts.py",
    "tests/faults/test_maintenance.py",
    "tests/cli/test_worker_cli.py",
    "tests/cli/test_cdc_cli.py",
    "tests/integration/test_connect.py",
    "tests/integration/test_operations.py",
    "tests/faults/test_pooler.py",
    "tests/faults/test_fault_bench.py",
    "tests/integration/test_sql_publish.py",
    "tests/integration/test_roles.py",
    "tests/bench/test_bench_shares.py",
)
#: How much nicer than the lanes the other workers, their subprocesses and the embedded test server run
#: when the tests run in parallel (see :func:`pytest_configure`).
_BACKGROUND_NICE = 2


def _lane_of(nodeid: str) -> str | None:
    """The lane of a test (the last lane whose paths match wins: ``demo`` and ``cluster`` within
    ``tests/ml/``)."""
    found = None
    for lane, paths in _LANES.items():
        if nodeid.startswith(paths):
            found = lane
    return found


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Refuse a test marked ``spark`` or using :func:`shard_servers` outside the lanes: it would start a
    JVM beside a lane's, or share a worker's shard servers with tests that stop and start them."""
    for item in items:
        spark = item.get_closest_marker("spark") is not None
        shards = "shard_servers" in getattr(item, "fixturenames", ())
        lane = _lane_of(item.nodeid)
        if (spark or shards) and lane is None:
            raise pytest.UsageError(
                f"{item.nodeid} is marked spark or uses shard_servers: add its path to a lane of _LANES")


def _parallel_worker() -> str | None:
    """This process's xdist worker id when the tests run on more than one worker, else None."""
    if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) < 2:
        return None
    return os.environ.get("PYTEST_XDIST_WORKER")


def _lane_workers(count: int) -> dict[str, str]:
    """The worker of each lane when ``count`` workers run."""
    return {lane: f"gw{i % count}" for i, lane in enumerate(_LANES)}


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist: without it (-p no:xdist), not called
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """With ``--dist loadgroup``: the tests of each lane of :data:`_LANES` run on the lane's worker, one at
    a time, first thing; the other modules are handed out to free workers, :data:`_LONG_FIRST` first.

    The grouping is done here from the node ids' paths, not with ``xdist_group`` marks (which
    pytest-xdist 3.8 cannot apply to node ids under pytest 9.2). The lanes' workers are the ones
    :func:`pytest_configure` leaves at full priority.
    """
    if config.getoption("dist", "no") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling

    long_first = {path: rank for rank, path in enumerate(_LONG_FIRST)}

    class Lanes(LoadGroupScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _lane_of(nodeid) or nodeid.split("::", 1)[0]

        def schedule(self) -> None:
            self._owners = _lane_workers(len(self.nodes))
            super().schedule()

        def _eligible(self, node: Any) -> str | None:
            """The scope this node takes next: its lane's, else the first of the longest of no lane."""
            me = node.gateway.id
            best: tuple[int, int, int] | None = None
            pick = None
            for n, scope in enumerate(self.workqueue):
                owner = self._owners.get(scope)
                if owner is not None and owner != me:
                    continue
                rank = (0 if owner else 1, long_first.get(scope, len(long_first)), n)
                if best is None or rank < best:
                    best, pick = rank, scope
            return pick

        def _assign_work_unit(self, node: Any) -> None:
            scope = self._eligible(node)
            if scope is None:
                return
            self.workqueue.move_to_end(scope, last=False)
            super()._assign_work_unit(node)

        def _reschedule(self, node: Any) -> None:
            if not node.shutting_down and self.workqueue and self._eligible(node) is None:
                node.shutdown()  # what is left belongs to other lanes
                return
            super()._reschedule(node)

    return Lanes(config, log)


#: The lanes whose tests wait for the JVMs' class-data archive before they start: their JVMs start at the
#: beginning of the run and live long. The ``spark`` lane starts many short JVMs; those that start before the
#: archive is written load their classes from the jars, the later ones use it.
_ARCHIVE_WAITERS = ("demo", "cluster")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Before a test of a lane (:data:`_LANES`), point ``$JAVA_TOOL_OPTIONS`` at the class-data archive of
    the JVMs (:func:`_spark_helpers.jvm_archive`): written by the controller of a parallel run while the
    first tests run (waited for by the lanes of :data:`_ARCHIVE_WAITERS`), or by the first lane test of a
    run on one process."""
    lane = _lane_of(item.nodeid)
    if lane is None or not _OWN_JVM_OPTIONS:
        return
    path = _archive_path()
    if not path.exists() and (lane in _ARCHIVE_WAITERS or _parallel_worker() is None):
        jvm_archive()
    os.environ["JAVA_TOOL_OPTIONS"] = jvm_options(path if path.exists() else None)


@functools.cache
def _archive_path() -> Path:
    return archive_path()  # runs `java -version`: once per process


def pytest_configure(config: pytest.Config) -> None:
    """In a parallel run, every worker that runs no lane of :data:`_LANES` lowers its priority by
    :data:`_BACKGROUND_NICE`, and the controller writes the JVMs' class-data archive in the background
    (when it is not there yet) while the workers start.

    Spark starts Python processes that must connect back to its JVM within 10 seconds (a limit Spark
    hard-codes); on a 2-core machine the database tests' processes and backends on the other workers can
    starve such a process that long. Niced, they still have the CPU whenever Spark does not use it.
    """
    worker = _parallel_worker()
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if worker is not None and worker not in _lane_workers(count).values():
        os.nice(_BACKGROUND_NICE)
    controller = not hasattr(config, "workerinput") and config.getoption("numprocesses", None)
    if controller and _OWN_JVM_OPTIONS and not _archive_path().exists():
        builder = threading.Thread(target=jvm_archive, name="jvm-archive", daemon=True)
        builder.start()
        config.stash[_BUILDER] = builder


_BUILDER = pytest.StashKey[threading.Thread]()


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Stop the SparkSession the Spark modules of this process shared (``_spark_helpers.session``)."""
    import sys

    if "pyspark.sql" in sys.modules:
        from pyspark.sql import SparkSession

        active = SparkSession.getActiveSession()
        if active is not None:
            for q in active.streams.active:
                q.stop()
            active.stop()


def pytest_unconfigure(config: pytest.Config) -> None:
    """The controller waits for the archive's writer (it takes well under the run's time)."""
    builder = config.stash.get(_BUILDER, None)
    if builder is not None:
        builder.join(600)


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

