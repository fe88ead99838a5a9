"""Connections cut silently: the server's side ends, the client's socket stays open and hears nothing.

A network partition, a proxy or NAT dropping a flow, or a server that died while its socket stayed open
looks like this to the client: no error, no end of stream, just silence. The hot paths that wait for the
server through libpq (``storage.libpq``) must not wait forever: after ``SILENCE_PROBE`` seconds of silence
they ask the server whether it still runs the session, and give up the connection when it does not, so
the caller's retry takes a new one.

The cut is made by a TCP proxy of the test's own on loopback, in front of the test server: ``cut(port)``
closes the server side of the client connection from ``port`` and leaves its client side open and
silent.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

import pgstreams
from pgstreams.storage import libpq

pytestmark = pytest.mark.timeout(180)


class _Pair:
    def __init__(self, client: socket.socket, server: socket.socket) -> None:
        self.client, self.server = client, server
        self.port = int(client.getpeername()[1])
        self.cut = False


class CuttingProxy:
    """A TCP proxy on 127.0.0.1 to the server of ``dsn``; :attr:`dsn` is ``dsn`` through the proxy."""

    def __init__(self, dsn: str) -> None:
        info = conninfo_to_dict(dsn)
        host = str(info.get("host") or "/var/run/postgresql")
        port = int(info.get("port") or 5432)
        if host.startswith("/"):
            self._family, self._address = socket.AF_UNIX, f"{host}/.s.PGSQL.{port}"
        else:
            self._family, self._address = socket.AF_INET, (host, port)  # type: ignore[assignment]
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.dsn = make_conninfo(dsn, host="127.0.0.1", port=self._listener.getsockname()[1])
        self._pairs: list[_Pair] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.socket(self._family, socket.SOCK_STREAM)
            server.connect(self._address)
            pair = _Pair(client, server)
            with self._lock:
                self._pairs.append(pair)
            threading.Thread(target=self._pump, args=(pair, client, server), daemon=True).start()
            threading.Thread(target=self._pump, args=(pair, server, client), daemon=True).start()

    @staticmethod
    def _pump(pair: _Pair, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                if pair.cut:
                    break
                dst.sendall(data)
        except OSError:
            pass
        if not pair.cut:
            for s in (pair.client, pair.server):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def cut(self, client_port: int) -> None:
        """End the server side of the connection from local port ``client_port``; its client side stays
        open and silent."""
        with self._lock:
            pair = next(p for p in self._pairs if p.port == client_port)
        pair.cut = True
        pair.server.shutdown(socket.SHUT_RDWR)
        pair.server.close()

    def close(self) -> None:
        self._listener.close()
        with self._lock:
            for p in self._pairs:
                for s in (p.client, p.server):
                    s.close()


@pytest.fixture
def proxy(dsn: str) -> Iterator[CuttingProxy]:
    p = CuttingProxy(dsn)
    yield p
    p.close()


def _local_port(conn: psycopg.Connection) -> int:
    with socket.socket(fileno=conn.pgconn.socket) as s:
        try:
            return int(s.getsockname()[1])
        finally:
            s.detach()


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
    proxy.cut(_local_port(conn))
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
        proxy.cut(_local_port(own))
        deadline = time.monotonic() + 30
        while not _server_pid_gone(dsn, pid):
            assert time.monotonic() < deadline, "the server kept the cut session"
            time.sleep(0.05)
        outcome: list[object] = []

        def publish() -> None:
            try:
                outcome.append(client.publish("t", "after"))
            except BaseException as exc:  # noqa: BLE001 - asserted below
                outcome.append(exc)

        t = threading.Thread(target=publish, daemon=True)
        t.start()
        t.join(libpq.SILENCE_PROBE + 60)
        assert not t.is_alive(), "the publish still waits on the cut connection"
        assert len(outcome) == 1 and isinstance(outcome[0], pgstreams.PublishResult), outcome
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
