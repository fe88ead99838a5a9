"""Connections cut silently: the server's side ends, the client's socket stays open and hears nothing.

A network partition, a proxy or NAT dropping a flow, or a server that died while its socket stayed open
looks like this to the client: no error, no end of stream, just silence. The hot paths that wait for the
server through libpq (``storage.libpq``) must not wait forever: after ``SILENCE_PROBE`` seconds of silence
they ask the server whether it still runs the session, and give up the connection when it does not, so
the caller's retry takes a new one.

The cut is made by a TCP proxy of the test's own on loopback, in front of the test server: ``cut(port)``
closes the server side of the client connection from ``port`` and leaves its client side open and
silent; ``blackhole(...)`` keeps both sides open and drops what the connection carries (one way or both),
and can drop every new connection too, as a network partition does: the silence probe cannot reach the
server then, and the wait gives up after the connection's ``tcp_user_timeout`` (the proxy's kernel still
acknowledges every byte, so only the client's own bound ends the wait, not the kernel's).
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

import pgstreams
from _core_helpers import Background
from _proxy import CuttingProxy, local_port
from pgstreams.storage import libpq

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def proxy(dsn: str) -> Iterator[CuttingProxy]:
    p = CuttingProxy(dsn)
    yield p
    p.close()


def _server_pid_gone(dsn: str, pid: int) -> bool:
    with psycopg.connect(dsn, autocommit=True) as c:
        return c.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone() == (0,)


def test_a_wait_on_a_silently_cut_connection_ends_with_a_retriable_error(dsn: str,
                                                                          proxy: CuttingProxy) -> None:
    conn = psycopg.connect(proxy.dsn, autocommit=True)
    st = libpq.Statement(b"pgstreams_test_sleep", b"SELECT pg_sleep(0.5)", ())
    direct = libpq.Direct()
    assert direct.pipeline(conn, [(st, [], 0)]) == [[("",)]]
    pid = conn.pgconn.backend_pid
    proxy.cut(local_port(conn))
    deadline = time.monotonic() + 30
    while not _server_pid_gone(dsn, pid):
        assert time.monotonic() < deadline, "the server kept the cut session"
        time.sleep(0.05)
    started = time.monotonic()
    with pytest.raises(psycopg.OperationalError, match="no longer runs session") as info:
        direct.pipeline(conn, [(st, [], 0)])
    waited = time.monotonic() - started
    assert pgstreams.reconnect.retriable(info.value)
    assert conn.closed  # a pool discards it
    assert libpq.SILENCE_PROBE <= waited < libpq.SILENCE_PROBE + 20


def test_a_long_statement_is_awaited_past_the_silence_probe(proxy: CuttingProxy) -> None:
    """Silence alone is not a cut: a statement that runs for longer than the probe's delay (a lock wait,
    a slow query) is awaited to its end, as long as the server runs its session."""
    conn = psycopg.connect(proxy.dsn, autocommit=True)
    seconds = libpq.SILENCE_PROBE * 1.6
    st = libpq.Statement(b"pgstreams_test_long", b"SELECT pg_sleep($1::float8), 7", ())
    started = time.monotonic()
    assert libpq.Direct().pipeline(conn, [(st, [b"%f" % seconds], 0)]) == [[("", 7)]]
    assert time.monotonic() - started >= seconds
    assert not conn.closed
    conn.close()


def test_a_publish_on_a_silently_cut_connection_is_retried_and_stored_once(dsn: str,
                                                                           proxy: CuttingProxy) -> None:
    with pgstreams.connect(proxy.dsn, retry_timeout=60) as client:
        client.create_topic("t", 1)
        client.publish("t", "before")
        own = client._producer._own  # the producer's own connection, made by the first publish
        assert own is not None
        pid = own.pgconn.backend_pid
        proxy.cut(local_port(own))
        deadline = time.monotonic() + 30
        while not _server_pid_gone(dsn, pid):
            assert time.monotonic() < deadline, "the server kept the cut session"
            time.sleep(0.05)
        outcome = Background(client.publish, "t", "after").result(libpq.SILENCE_PROBE + 60,
                                                                  "the publish on the cut connection")
        assert isinstance(outcome, pgstreams.PublishResult), outcome
    with pgstreams.connect(dsn) as c:
        consumer = c.consumer("t", "count")
        values = []
        while got := consumer.poll(max_events=100, timeout=0.2):
            values += [e.value for e in got]
    assert values == ["before", "after"]


def test_an_async_wait_on_a_silently_cut_connection_ends_with_a_retriable_error(
        dsn: str, proxy: CuttingProxy) -> None:
    import asyncio

    st = libpq.Statement(b"pgstreams_test_one", b"SELECT 1", ())

    async def scenario() -> tuple[BaseException, float, bool]:
        conn = await psycopg.AsyncConnection.connect(proxy.dsn, autocommit=True)
        direct = libpq.AsyncDirect()
        got = await direct.run(conn, [(st, [], 0)])
        assert direct.rows(conn, got[0]) == [(1,)]
        pid = conn.pgconn.backend_pid
        with socket.socket(fileno=conn.pgconn.socket) as s:
            port = int(s.getsockname()[1])
            s.detach()
        proxy.cut(port)
        deadline = time.monotonic() + 30
        while not await asyncio.to_thread(_server_pid_gone, dsn, pid):
            assert time.monotonic() < deadline, "the server kept the cut session"
            await asyncio.sleep(0.05)
        started = time.monotonic()
        try:
            await direct.run(conn, [(st, [], 0)])
        except psycopg.OperationalError as exc:
            return exc, time.monotonic() - started, conn.closed
        raise AssertionError("the cut connection answered")

    # a loop of its own in a thread of its own: the test process may have a loop running already
    got: list[tuple[BaseException, float, bool]] = []
    runner = threading.Thread(target=lambda: got.append(asyncio.run(scenario())))
    runner.start()
    runner.join(120)
    assert got, "the scenario did not finish"
    exc, waited, closed = got[0]
    assert "no longer runs session" in str(exc) and pgstreams.reconnect.retriable(exc)
    assert closed
    assert libpq.SILENCE_PROBE <= waited < libpq.SILENCE_PROBE + 20


def test_a_publish_whose_result_a_partition_swallowed_is_retried_and_stored_once(
        dsn: str, proxy: CuttingProxy) -> None:
    """The network drops everything the server sends back, mid-publish, and every new connection: the
    insert commits, its result never comes, and the silence probe cannot reach the server. The wait gives
    up after the connection's ``tcp_user_timeout`` (retriable), and the retry, on a pooled connection that
    still works, finds the committed event by its producer tag: stored once, the caller sees no error."""
    with pgstreams.connect(proxy.dsn, retry_timeout=5) as client:
        client.create_topic("t", 1)
        client.publish("t", "before")
        own = client._producer._own  # the producer's own connection, made by the first publish
        assert own is not None
        limit = libpq.wait_limit(own.pgconn)
        assert limit == 10.0  # tcp_user_timeout: retry_timeout, at least MIN_USER_TIMEOUT
        proxy.blackhole(local_port(own), to_server=False, new=True)
        started = time.monotonic()
        outcome = Background(client.publish, "t", "after").result(
            limit + 90, "the publish on the blackholed connection")
        waited = time.monotonic() - started
        assert isinstance(outcome, pgstreams.PublishResult), outcome
        assert limit <= waited < limit + 60
    with pgstreams.connect(dsn) as c:
        consumer = c.consumer("t", "count")
        values = []
        while got := consumer.poll(max_events=100, timeout=0.2):
            values += [e.value for e in got]
    assert values == ["before", "after"]


def test_a_poll_during_a_partition_raises_connection_lost_within_a_bound(dsn: str,
                                                                          proxy: CuttingProxy) -> None:
    """Every connection, old and new, blackholed: a poll's wait gives up after the connection's
    ``tcp_user_timeout``, the retry finds no working connection (the pool's check of its idle ones is
    bounded too) and raises :class:`pgstreams.ConnectionLost` once ``retry_timeout`` has passed."""
    with pgstreams.connect(proxy.dsn, retry_timeout=1) as client:
        client.create_topic("t", 1)
        client.publish("t", "x")
        consumer = client.consumer("t", "g")
        assert [e.value for e in consumer.poll(max_events=10, timeout=5)] == ["x"]
        limit = libpq.DEFAULT_WAIT_LIMIT
        with client.connection() as conn:
            limit = libpq.wait_limit(conn.pgconn)
        assert limit == 10.0
        proxy.blackhole(new=True)
        started = time.monotonic()
        outcome = Background(lambda: consumer.poll(max_events=10, timeout=0))
        got = outcome.result(limit + 120, "the poll on the blackholed connections")
        waited = time.monotonic() - started
        assert isinstance(got, pgstreams.ConnectionLost), got
        assert limit <= waited < limit + 90


def test_the_client_s_connections_use_keepalives_and_a_tcp_user_timeout(dsn: str) -> None:
    """Pooled and own connections carry keepalive settings and ``tcp_user_timeout`` (from
    ``retry_timeout``), on their sockets too; what the DSN sets itself is kept."""
    import socket as so

    with pgstreams.connect(dsn, retry_timeout=45) as client:
        with client.connection() as pooled:
            conns = [pooled, client.raw_connection()]
            for conn in conns:
                info = {o.keyword.decode(): (o.val or b"").decode() for o in conn.pgconn.info}
                assert info["keepalives"] == "1" and info["keepalives_idle"] == "10"
                assert info["tcp_user_timeout"] == "45000"
                with so.socket(fileno=conn.pgconn.socket) as s:
                    try:
                        if s.family == so.AF_INET:
                            assert s.getsockopt(so.SOL_SOCKET, so.SO_KEEPALIVE) == 1
                            assert s.getsockopt(so.IPPROTO_TCP, so.TCP_USER_TIMEOUT) == 45000
                    finally:
                        s.detach()
            conns[1].close()
    with pgstreams.connect(make_conninfo(dsn, keepalives_idle="77", tcp_user_timeout="12000")) as client:
        with client.connection() as conn:
            info = {o.keyword.decode(): (o.val or b"").decode() for o in conn.pgconn.info}
            assert info["keepalives_idle"] == "77" and info["tcp_user_timeout"] == "12000"
            assert info["keepalives_interval"] == "5"
            assert libpq.wait_limit(conn.pgconn) == 12.0


def test_a_commit_lost_on_the_way_to_the_server_ends_with_a_retriable_error(dsn: str,
                                                                            proxy: CuttingProxy) -> None:
    """What the client sends is dropped while its transaction is open: the server's session waits for the
    client (idle in transaction, wait event ClientRead) while the client waits for the server. The probe
    sees it, and the wait ends with a retriable error instead of taking the session for a long statement."""
    conn = psycopg.connect(proxy.dsn, autocommit=True)
    st = libpq.Statement(b"pgstreams_test_two", b"SELECT 2", ())
    conn.execute("BEGIN")
    conn.execute("SELECT 1")
    proxy.blackhole(local_port(conn), to_client=False)
    started = time.monotonic()
    with pytest.raises(psycopg.OperationalError, match="waits on the server for the client") as info:
        libpq.Direct.run_then_commit(conn, st, [], commit=True)
    waited = time.monotonic() - started
    assert pgstreams.reconnect.retriable(info.value)
    assert conn.closed
    assert libpq.SILENCE_PROBE <= waited < libpq.SILENCE_PROBE + 20
