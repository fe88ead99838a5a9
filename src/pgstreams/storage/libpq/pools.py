"""Connection pools whose check of a connection waits for the server's answer a bounded time."""

from __future__ import annotations

import asyncio
import select
import time
from typing import Any

import psycopg
from psycopg import pq
from psycopg_pool import AsyncConnectionPool, ConnectionPool
from psycopg_pool.base import AttemptWithBackoff

from ...errors import ClientClosed
from .waits import check_alive, polled

#: The error of a closed client's pool when asked for a connection.
CLOSED = ("the client is closed (close() was called, or its with block ended): make a new one with "
          "pgstreams.connect()")

#: Seconds a pooled connection's check (:class:`CheckedPool`) waits for the server's answer.
CHECK_TIMEOUT = 5.0

#: The longest wait between two attempts of a pool to replace a lost connection (psycopg's pool doubles its
#: wait from 1 s up to its ``reconnect_timeout``, 5 minutes: after an outage of a minute the server could be
#: back for 30 s before the pool tried again, and every call waited for it). A refused connection costs
#: nothing, so the pools here try at least this often.
MAX_RECONNECT_DELAY = 1.0


class _CappedAttempt(AttemptWithBackoff):
    """psycopg's reconnection attempt, its backoff capped at :data:`MAX_RECONNECT_DELAY`."""

    INITIAL_DELAY = 0.1

    def update_delay(self, now: float) -> None:
        super().update_delay(now)
        self.delay = min(self.delay, MAX_RECONNECT_DELAY)


def check(pg: pq.abc.PGconn, timeout: float = CHECK_TIMEOUT) -> None:
    """Whether ``pg`` (idle) still reaches its server: an empty query answered within ``timeout`` seconds;
    else ``pg`` is closed and :class:`psycopg.OperationalError` raised."""
    pg.send_query(b"")
    ends = time.monotonic() + timeout
    while (pending := pg.flush()) or pg.is_busy():
        left = ends - time.monotonic()
        if left <= 0 or not polled(pg.socket, left, select.POLLIN | (select.POLLOUT if pending else 0)):
            pg.finish()
            raise psycopg.OperationalError(f"connection check: no answer within {timeout:g} s")
        pg.consume_input()
    while (res := pg.get_result()) is not None:
        if res.status == pq.ExecStatus.FATAL_ERROR:
            raise psycopg.errors.error_from_result(res)
    check_alive(pg)


class CheckedPool(ConnectionPool):
    """psycopg's pool, whose :meth:`check` (after a lost connection: see :mod:`pgstreams.reconnect`) waits
    :data:`CHECK_TIMEOUT` seconds at most for each connection's answer (psycopg's check waits for it
    without a bound: one connection cut silently would hold the check forever), and which, once closed,
    refuses connections with :class:`pgstreams.ClientClosed` (psycopg's ``PoolClosed`` is an
    ``OperationalError``, which the retry would take for a lost connection and retry for
    ``retry_timeout``)."""

    def getconn(self, timeout: float | None = None) -> Any:
        """A connection of the pool (psycopg's ``getconn``); :class:`pgstreams.ClientClosed` once closed."""
        if self.closed:
            raise ClientClosed(CLOSED)
        return super().getconn(timeout)

    def _add_connection(self, attempt: AttemptWithBackoff | None, growing: bool = False) -> None:
        # psycopg's own, with the capped backoff (the attempt is handed on to the next try)
        super()._add_connection(attempt or _CappedAttempt(timeout=self.reconnect_timeout), growing)

    def fresh(self, connect_timeout: float | None = None) -> psycopg.Connection:
        """A new connection made as the pool makes its own (its conninfo, connection options and set-up:
        see :func:`pgstreams.pooler.connection_options`), outside the pool: the caller closes it.
        ``connect_timeout``: seconds (at least 1) to connect, default libpq's."""
        kwargs = dict(self._resolve_kwargs())
        if connect_timeout is not None:
            kwargs["connect_timeout"] = max(1, int(connect_timeout))
        conn = psycopg.Connection.connect(self._resolve_conninfo(), **kwargs)
        if self._configure is not None:
            try:
                self._configure(conn)
            except BaseException:
                conn.close()
                raise
        return conn

    @staticmethod
    def check_connection(conn: psycopg.Connection) -> None:
        """Raise if ``conn`` (idle, autocommit: the client's) does not answer within
        :data:`CHECK_TIMEOUT` seconds."""
        if conn.closed or conn.pgconn.transaction_status != pq.TransactionStatus.IDLE:
            raise psycopg.OperationalError("connection check: the connection is not idle")
        check(conn.pgconn)


class AsyncCheckedPool(AsyncConnectionPool):
    """:class:`CheckedPool` for the asyncio client: psycopg's async pool, whose :meth:`check` (after a lost
    connection: see :class:`pgstreams.reconnect.AsyncReconnect`) waits :data:`CHECK_TIMEOUT` seconds at
    most for each connection's answer, and which refuses connections once closed."""

    async def getconn(self, timeout: float | None = None) -> Any:
        """A connection of the pool; :class:`pgstreams.ClientClosed` once closed."""
        if self.closed:
            raise ClientClosed(CLOSED)
        return await super().getconn(timeout)

    async def _add_connection(self, attempt: AttemptWithBackoff | None, growing: bool = False) -> None:
        await super()._add_connection(attempt or _CappedAttempt(timeout=self.reconnect_timeout), growing)

    async def fresh(self, connect_timeout: float | None = None) -> psycopg.AsyncConnection[Any]:
        """A new connection made as the pool makes its own, outside the pool (see
        :meth:`CheckedPool.fresh`): the caller closes it."""
        kwargs = dict(await self._resolve_kwargs())
        if connect_timeout is not None:
            kwargs["connect_timeout"] = max(1, int(connect_timeout))
        conn = await psycopg.AsyncConnection.connect(await self._resolve_conninfo(), **kwargs)
        if self._configure is not None:
            try:
                await self._configure(conn)
            except BaseException:
                await conn.close()
                raise
        return conn

    @staticmethod
    async def check_connection(conn: psycopg.AsyncConnection[Any]) -> None:
        """Raise if ``conn`` (idle, autocommit: the client's) does not answer within
        :data:`CHECK_TIMEOUT` seconds (it is closed then)."""
        if conn.closed or conn.pgconn.transaction_status != pq.TransactionStatus.IDLE:
            raise psycopg.OperationalError("connection check: the connection is not idle")
        try:
            await asyncio.wait_for(conn.execute(""), CHECK_TIMEOUT)
        except TimeoutError:
            await conn.close()
            raise psycopg.OperationalError(
                f"connection check: no answer within {CHECK_TIMEOUT:g} s") from None
