"""Behind a connection pooler: PgBouncer (Debian's, installed here when missing) in session mode in front
of the test server, started by the tests themselves.

Behind a pooler the process id a connection gets at login is the pooler's cancel key, not the server's
process: ``pg_stat_activity`` never shows it. A publish that waits on a lock for longer than the silence
probe (:data:`pgstreams.storage.libpq.SILENCE_PROBE`) must still be known to run, and a publish whose
connection was lost must wait for the server's session of its attempt to end: stored once.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

import pgstreams
import pgstreams.aio
from _core_helpers import Background, run_async, wait_until
from _proxy import CuttingProxy, local_port
from _system import as_user, debian_package, free_port, service_user
from pgstreams.storage import identity
from pgstreams.storage.libpq import SILENCE_PROBE

PGBOUNCER = Path("/usr/sbin/pgbouncer")


def _pgbouncer(server_dsn: str, pool_mode: str) -> Iterator[Callable[[str], str]]:
    """PgBouncer in ``pool_mode`` in front of the server of ``server_dsn`` (every database, trust
    authentication, listening on a free loopback port); yields the map from a database's DSN to the same
    database through the pooler."""
    debian_package("pgbouncer", PGBOUNCER)
    server = conninfo_to_dict(server_dsn)
    host = str(server.get("host") or "127.0.0.1")
    port = str(server.get("port") or 5432)
    user = str(server.get("user") or "postgres")
    runner = service_user(host if host.startswith("/") else None)
    root = Path(tempfile.mkdtemp(prefix="pgstreams-pgbouncer-"))
    listen = free_port()
    (root / "users.txt").write_text(f'"{user}" ""\n')
    (root / "pgbouncer.ini").write_text(
        "[databases]\n"
        f"* = host={host} port={port}\n"
        "[pgbouncer]\n"
        "listen_addr = 127.0.0.1\n"
        f"listen_port = {listen}\n"
        "unix_socket_dir =\n"
        "auth_type = trust\n"
        f"auth_file = {root / 'users.txt'}\n"
        f"pool_mode = {pool_mode}\n"
        "max_client_conn = 200\n"
        "default_pool_size = 50\n"
        f"logfile = {root / 'pgbouncer.log'}\n"
        "ignore_startup_parameters = extra_float_digits\n")
    if runner:
        shutil.chown(root, runner)
        for f in root.iterdir():
            shutil.chown(f, runner)
    proc = subprocess.Popen([*as_user(runner), str(PGBOUNCER), str(root / "pgbouncer.ini")],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)

    def through(dsn: str) -> str:
        return make_conninfo(dsn, host="127.0.0.1", port=str(listen))

    def answers() -> bool:
        if proc.poll() is not None:
            out = proc.stdout.read().decode() if proc.stdout else ""
            log = (root / "pgbouncer.log").read_text() if (root / "pgbouncer.log").exists() else ""
            raise AssertionError(f"pgbouncer exited ({proc.returncode}): {out}\n{log}")
        try:
            psycopg.connect(through(server_dsn), connect_timeout=2).close()
        except psycopg.OperationalError:
            return False
        return True

    try:
        wait_until(answers, 30, "PgBouncer accepting connections", every=0.1)
        yield through
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(15)
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def session_pooler(server_dsn: str) -> Iterator[Callable[[str], str]]:
    """PgBouncer in session mode in front of the test server."""
    yield from _pgbouncer(server_dsn, "session")


def _waiting_on(dsn: str, table: str) -> list[float]:
    """How long (seconds, as the server measures) each session waiting for a lock on ``table`` has waited."""
    with psycopg.connect(dsn, autocommit=True) as c:
        rows = c.execute(
            "SELECT extract(epoch FROM now() - a.state_change)::float8 FROM pg_locks l"
            " JOIN pg_stat_activity a ON a.pid = l.pid"
            " WHERE NOT l.granted AND l.relation = %s::regclass", (table,)).fetchall()
    return [r[0] for r in rows]


def _held_past_probe(dsn: str, table: str, count: int) -> list[float]:
    """The waits on ``table``'s lock once the ``count`` waiting publishes all waited past the silence probe
    and its answer, or as soon as more than ``count`` wait (one was sent again)."""
    def done() -> list[float] | None:
        waits = _waiting_on(dsn, table)
        return waits if len(waits) > count or min(waits, default=0.0) > SILENCE_PROBE + 2.0 else None

    return wait_until(done, 60, "the publishes waiting past the silence probe", every=0.2)


def test_a_pooled_connection_knows_its_server_process_not_the_poolers_login_id(
        dsn: str, session_pooler: Callable[[str], str]) -> None:
    """The login's process id behind PgBouncer names no server process; pgstreams reads the server's at set
    up, and that one is the session ``pg_stat_activity`` shows."""
    client = pgstreams.connect(session_pooler(dsn))
    try:
        with client.connection() as c:
            server = c.execute("SELECT pg_backend_pid()").fetchone()
            assert server is not None
            assert identity.server_pid(c.pgconn) == server[0]
            assert identity.pooled(c.pgconn) is True and c.pgconn.backend_pid != server[0]
        with psycopg.connect(dsn, autocommit=True) as direct:
            seen = direct.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s",
                                  (server[0],)).fetchone()
            assert seen == (1,)
    finally:
        client.close()
    direct_client = pgstreams.connect(dsn)
    try:
        with direct_client.connection() as c:  # straight to the server the two agree
            assert identity.pooled(c.pgconn) is False
    finally:
        direct_client.close()


def test_publishes_held_on_a_lock_past_the_silence_probe_are_stored_once_behind_pgbouncer(
        dsn: str, session_pooler: Callable[[str], str]) -> None:
    """A single publish, a ``publish_many`` and an asyncio publish wait on a lock on the topic for longer
    than the silence probe, through PgBouncer in session mode: the probe finds their sessions running (by
    the server's process id), no attempt is cut and repeated, and each event is stored exactly once."""
    via = session_pooler(dsn)
    client = pgstreams.connect(via)
    try:
        client.create_topic("held", 1)
        table = _table(dsn, "held")

        async def apublish() -> pgstreams.PublishResult:
            async with await pgstreams.aio.connect(via) as ac:
                return await ac.publish("held", "async")

        with psycopg.connect(dsn) as holder:
            holder.execute(f"LOCK TABLE {table} IN SHARE MODE")  # stops writers
            one = Background(client.publish, "held", "single")
            many = Background(client.publish_many, "held", [{"value": f"batch-{i}"} for i in range(3)])
            aio = Background(run_async, apublish)
            wait_until(lambda: len(_waiting_on(dsn, table)) == 3, 60,
                       "the three publishes waiting on the lock")
            # held until every one has waited past the silence probe and its answer, unless one was sent
            # again meanwhile (then it waits on the lock beside the first)
            assert len(_held_past_probe(dsn, table, 3)) == 3  # none was cut and sent again
            holder.commit()
        single, batch, async_ = (b.result(60, "a publish") for b in (one, many, aio))
        assert isinstance(single, pgstreams.PublishResult) and single.duplicate is False, single
        assert batch == 3
        assert isinstance(async_, pgstreams.PublishResult), async_
        assert sorted(_values(dsn, "held")) == sorted(["single", "async", "batch-0", "batch-1", "batch-2"])
    finally:
        client.close()


def test_a_publish_cut_behind_pgbouncer_waits_for_its_server_session_and_is_stored_once(
        dsn: str, session_pooler: Callable[[str], str]) -> None:
    """A publish waits on a lock; its connection to the pooler is then cut silently (a TCP proxy between
    the client and PgBouncer closes the pooler's side). The server's session of the attempt goes on
    waiting: the silence probe must see it running until the lock is released, and when it ended (it
    committed, then found its client gone), the retry finds the event instead of storing it again."""
    proxy = CuttingProxy(session_pooler(dsn))
    client = pgstreams.connect(proxy.dsn, retry_timeout=60)
    try:
        client.create_topic("cut", 1)
        client.publish("cut", "before")  # makes the producer's own connection
        table = _table(dsn, "cut")
        own = client._producer._own  # the producer's own connection, made by that publish
        assert own is not None and identity.pooled(own.pgconn) is True
        server = identity.server_pid(own.pgconn)
        with psycopg.connect(dsn) as holder:
            holder.execute(f"LOCK TABLE {table} IN SHARE MODE")
            publish = Background(client.publish, "cut", "once")
            wait_until(lambda: _waiting_on(dsn, table) != [], 60, "the publish waiting on the lock")
            proxy.cut(local_port(own))
            # the client waits past the silence probe; its attempt's server session still waits on the lock
            assert len(_held_past_probe(dsn, table, 1)) == 1  # not sent again meanwhile
            holder.commit()
        got = publish.result(SILENCE_PROBE + 60, "the publish on the cut connection")
        assert isinstance(got, pgstreams.PublishResult), got
        assert _values(dsn, "cut") == ["before", "once"]
        with psycopg.connect(dsn, autocommit=True) as c:
            gone = c.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (server,)).fetchone()
        assert gone == (0,)  # the retry waited for it
    finally:
        client.close()
        proxy.close()


def _values(dsn: str, topic: str) -> list[Any]:
    """The values of every event of ``topic``, in order (read straight from the server)."""
    with pgstreams.connect(dsn) as c:
        consumer = c.consumer(topic, "count")
        values: list[Any] = []
        while got := consumer.poll(max_events=100, timeout=0.2):
            values += [e.value for e in got]
    return values


def _table(dsn: str, topic: str) -> str:
    """The event table of ``topic``."""
    with psycopg.connect(dsn, autocommit=True) as c:
        row = c.execute("SELECT format('pgstreams.topic_%%s', id) FROM pgstreams.topics WHERE name = %s",
                        (topic,)).fetchone()
    assert row is not None
    return str(row[0])
