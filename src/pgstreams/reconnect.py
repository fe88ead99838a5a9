"""Riding through lost connections and server restarts.

A pooled connection is not checked before it is handed out (that would cost a round trip per call).
Instead a call that fails with a *retriable* error (:func:`retriable`: the connection broke, the server
is shutting down, starting up or refused the connection) is run again on a fresh connection, after a
backoff of 50 ms doubling up to 1 s, until the client's ``retry_timeout`` (default
:data:`DEFAULT_RETRY_TIMEOUT`) has passed since the first failure; then :class:`pgstreams.ConnectionLost`
names the server (without its password). After the first failure the pool checks its idle connections
(off the successful path), so the next calls get live ones.

What may be run again is the caller's business: reads, checkpoint stores with an expected position and
the idempotent publishes (see :mod:`pgstreams.producer`) are.

:class:`Reconnect` is the rule of the sync client (:class:`pgstreams.Client`), :class:`AsyncReconnect`
the same rule for the asyncio client (:mod:`pgstreams.aio`): the same errors, backoff, window and
:class:`pgstreams.ConnectionLost`, waiting on the event loop.
"""

from __future__ import annotations

import asyncio
import logging
import random
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import AsyncExitStack, asynccontextmanager, contextmanager
from typing import Any, TypeVar

import psycopg
from psycopg.conninfo import conninfo_to_dict
from psycopg_pool import PoolClosed, PoolTimeout

from .errors import ConnectionLost, PermissionDenied
from .storage.libpq.pools import AsyncCheckedPool, CheckedPool

log = logging.getLogger("pgstreams.reconnect")

T = TypeVar("T")

#: Seconds a call keeps being retried on fresh connections after its first retriable failure
#: (``connect(retry_timeout=...)``); 0 turns retrying off.
DEFAULT_RETRY_TIMEOUT = 30.0
#: The first pause between attempts (doubled each time, see :data:`MAX_BACKOFF`).
FIRST_BACKOFF = 0.05
#: The longest pause between attempts.
MAX_BACKOFF = 1.0
#: Seconds a retry waits for a pooled connection before it opens one of its own.
POOL_WAIT = 1.0

# SQLSTATEs that say the server ended or refused the session (any 08xxx is a connection exception):
# admin_shutdown (pg_terminate_backend, fast shutdown), crash_shutdown, cannot_connect_now (starting up
# or shutting down), too_many_connections.
_RETRIABLE_STATES = frozenset({"57P01", "57P02", "57P03", "53300"})


def retriable(exc: BaseException) -> bool:
    """Whether ``exc`` says the connection (not the statement) failed, so the call may succeed on a fresh
    connection: SQLSTATE class 08 or 57P01/57P02/57P03/53300, a client-side connection failure (an
    ``OperationalError`` without SQLSTATE: connection refused, server closed the connection), a closed
    connection, or no pooled connection within the pool's timeout."""
    if isinstance(exc, PoolClosed):
        return False  # the client was closed: no retry brings it back
    if isinstance(exc, PoolTimeout):
        return True
    if isinstance(exc, psycopg.Error):
        state = exc.sqlstate
        if state:
            return state.startswith("08") or state in _RETRIABLE_STATES
        if isinstance(exc, psycopg.OperationalError) or type(exc) is psycopg.DatabaseError:
            return True  # without SQLSTATE: from libpq, not the server (a result of a broken connection)
        return isinstance(exc, psycopg.InterfaceError) and "closed" in str(exc)
    return False


def server_label(dsn: str) -> str:
    """``user@host:port/dbname`` of a DSN, never its password (for errors and logs)."""
    try:
        info = conninfo_to_dict(dsn)
    except psycopg.Error:
        return "the configured server"
    host = str(info.get("host") or info.get("hostaddr") or "local socket")
    port = info.get("port")
    user = info.get("user")
    service = info.get("service")
    label = f"{host}:{port}" if port else host
    if user:
        label = f"{user}@{label}"
    label += f"/{info.get('dbname') or user or 'postgres'}"
    if service:
        label += f" (service {service})"
    return label


def redact(text: str, dsn: str | None) -> str:
    """``text`` with the password of ``dsn`` (and any ``password=...`` or ``:password@`` of a DSN)
    replaced by ``***``."""
    out = re.sub(r"(password\s*=\s*)('[^']*'|\S+)", r"\1***", text, flags=re.IGNORECASE)
    out = re.sub(r"(postgres(?:ql)?://[^:/@\s]*:)[^@\s]*@", r"\1***@", out)
    if dsn:
        try:
            password = conninfo_to_dict(dsn).get("password")
        except psycopg.Error:
            password = None
        if password:
            out = out.replace(str(password), "***")
    return out


class RetryRule:
    """What the sync and the async retry rules share: ``timeout`` seconds (0: no retry) from the first
    failure, ``dsn`` the server (named in :class:`ConnectionLost`, without its password), ``clock``
    (default ``time.monotonic``); the deadline, the backoff and the error past the deadline."""

    def __init__(self, dsn: str, timeout: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.dsn = dsn
        self.timeout = timeout
        self.server = server_label(dsn)
        self._clock = clock
        #: calls that failed with a retriable error and were run again (for the fault benchmark)
        self.retried = 0

    def lost(self, exc: BaseException) -> ConnectionLost:
        """The :class:`ConnectionLost` to raise after ``exc``, the last retriable failure."""
        reason = redact(" ".join(str(exc).split()) or type(exc).__name__, self.dsn)
        return ConnectionLost(f"lost the connection to PostgreSQL at {self.server} for more than "
                              f"{self.timeout:g} s (retry_timeout): {reason}")

    @contextmanager
    def run_errors(self) -> Iterator[None]:
        """The errors of a call retried by this rule, as ``Client.run`` and ``AsyncClient.run`` raise them:
        PostgreSQL's refusal (SQLSTATE 42501) as :class:`PermissionDenied`, a retriable failure left over
        as :class:`ConnectionLost` (see :meth:`lost`)."""
        try:
            yield
        except psycopg.errors.InsufficientPrivilege as exc:
            detail = (exc.diag.message_primary or str(exc)).strip()
            raise PermissionDenied(f"permission denied: {detail}") from None
        except Exception as exc:
            if retriable(exc) and not isinstance(exc, ConnectionLost):
                raise self.lost(exc) from exc
            raise

    def start(self) -> float:
        """The deadline of a retry that starts now."""
        return self._clock() + self.timeout

    def backoff(self, exc: BaseException, deadline: float, attempt: int) -> float:
        """After retriable failure ``exc`` of attempt ``attempt`` (1 for the first): the seconds to wait
        before the next attempt (logging the first failure); raise :class:`ConnectionLost` past
        ``deadline``."""
        now = self._clock()
        if now >= deadline:
            raise self.lost(exc) from exc
        self.retried += 1
        if attempt == 1:
            log.warning("connection to %s failed (%s); retrying for up to %g s", self.server,
                        redact(" ".join(str(exc).split()), self.dsn), self.timeout)
        backoff = min(MAX_BACKOFF, FIRST_BACKOFF * 2 ** (attempt - 1)) * random.uniform(0.5, 1.0)
        return max(0.0, min(backoff, deadline - now))

    def remaining(self, deadline: float) -> float:
        """Seconds left before ``deadline`` (at least a short wait for a pooled connection)."""
        return max(0.1, deadline - self._clock())

    def session_waits(self, pid: int) -> Iterator[float]:
        """The pauses between checks whether the broken session ``pid`` still runs (10 ms doubling up to
        0.5 s); raises :class:`ConnectionLost` once the retry window passed (a retried publish waits
        for the session of its interrupted attempt to end before it looks for its events)."""
        deadline = self.start()
        pause = 0.01
        while True:
            if self.remaining(deadline) <= 0.1:
                raise self.lost(psycopg.OperationalError(
                    f"the session {pid} of the interrupted publish is still running"))
            yield pause
            pause = min(0.5, pause * 2)


class Reconnect(RetryRule):
    """The retry rule of one client: ``timeout`` seconds (0: no retry) from the first failure, ``pool``
    the connections to retry on, ``dsn`` the server (named in :class:`ConnectionLost`, without its
    password). ``clock`` and ``sleep`` default to ``time.monotonic`` and ``time.sleep``."""

    def __init__(self, pool: CheckedPool | None, dsn: str, timeout: float, *,
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep
                 ) -> None:
        super().__init__(dsn, timeout, clock)
        self.pool = pool
        self._sleep = sleep

    def pause(self, exc: BaseException, deadline: float, attempt: int) -> None:
        """After retriable failure ``exc`` of attempt ``attempt`` (1 for the first): check the pool's idle
        connections on the first, then wait the backoff; raise :class:`ConnectionLost` past ``deadline``."""
        wait = self.backoff(exc, deadline, attempt)
        if attempt == 1:
            self.check_pool()
        self._sleep(wait)

    def check_pool(self) -> None:
        """Discard the pool's broken idle connections (a round trip per idle one: failure path only)."""
        if self.pool is None:
            return
        try:
            self.pool.check()
        except Exception as exc:  # noqa: BLE001 - the pool refills in the background anyway
            log.debug("pool check failed: %s", exc)

    def again(self, fn: Callable[[psycopg.Connection], T], first: BaseException) -> T:
        """Run ``fn`` on fresh pooled connections after its first attempt failed with ``first`` (a
        retriable error), until it succeeds, fails otherwise, or the timeout passes
        (:class:`ConnectionLost`)."""
        if self.timeout <= 0 or self.pool is None:
            raise self.lost(first) from first
        deadline = self.start()
        exc = first
        attempt = 1
        while True:
            self.pause(exc, deadline, attempt)
            attempt += 1
            try:
                with self.pool.connection(timeout=min(self.remaining(deadline), POOL_WAIT)) as conn:
                    return fn(conn)
            except PoolTimeout as err:
                # the pool reconnects in the background with a backoff of its own (1 s, 2 s, 4 s, ...):
                # once the server is back, a connection of this call's own gets on without waiting for it
                exc = err
                try:
                    # as the pool's: its options, its settings, its server's identity
                    own = self.pool.fresh(connect_timeout=max(1.0, self.remaining(deadline)))
                except psycopg.Error as failed:
                    exc = failed
                    continue
                try:
                    with own:
                        return fn(own)
                except Exception as err2:
                    if not retriable(err2):
                        raise
                    exc = err2
            except Exception as err:
                if not retriable(err):
                    raise
                exc = err

    def pooled(self, fn: Callable[[psycopg.Connection], T]) -> T:
        """``fn(conn)`` on a pooled connection, run again on fresh ones after a retriable failure (see
        :meth:`again`). The successful path is one ``try`` around the call."""
        assert self.pool is not None
        try:
            with self.pool.connection() as conn:
                return fn(conn)
        except Exception as exc:
            if not retriable(exc):
                raise
            return self.again(fn, exc)


class AsyncReconnect(RetryRule):
    """:class:`Reconnect` for the asyncio client (:mod:`pgstreams.aio`): the same retriable errors,
    backoff, window and :class:`ConnectionLost`, with ``pool`` an
    :class:`~psycopg_pool.AsyncConnectionPool`, ``fn`` coroutine functions and the pauses awaited on the
    event loop. ``clock`` and ``sleep`` default to ``time.monotonic`` and ``asyncio.sleep``."""

    def __init__(self, pool: AsyncCheckedPool | None, dsn: str, timeout: float, *,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep) -> None:
        super().__init__(dsn, timeout, clock)
        self.pool = pool
        self._sleep = sleep

    async def pause(self, exc: BaseException, deadline: float, attempt: int) -> None:
        """As :meth:`Reconnect.pause`, awaited."""
        wait = self.backoff(exc, deadline, attempt)
        if attempt == 1:
            await self.check_pool()
        await self._sleep(wait)

    async def check_pool(self) -> None:
        """Discard the pool's broken idle connections (a round trip per idle one: failure path only)."""
        if self.pool is None:
            return
        try:
            await self.pool.check()
        except Exception as exc:  # noqa: BLE001 - the pool refills in the background anyway
            log.debug("pool check failed: %s", exc)

    async def again(self, fn: Callable[[psycopg.AsyncConnection[Any]], Awaitable[T]], first: BaseException
                    ) -> T:
        """As :meth:`Reconnect.again`: run ``fn`` on fresh pooled connections after its first attempt
        failed with ``first`` (retriable), until it succeeds, fails otherwise, or the timeout passes
        (:class:`ConnectionLost`); while the pool has none to give, on a connection of the call's own."""
        if self.timeout <= 0 or self.pool is None:
            raise self.lost(first) from first
        deadline = self.start()
        exc = first
        attempt = 1
        while True:
            await self.pause(exc, deadline, attempt)
            attempt += 1
            try:
                async with self.pool.connection(timeout=min(self.remaining(deadline), POOL_WAIT)) as conn:
                    return await fn(conn)
            except PoolTimeout as err:
                # the pool reconnects in the background with a backoff of its own: once the server is
                # back, a connection of this call's own gets on without waiting for it
                exc = err
                try:
                    own = await self.pool.fresh(connect_timeout=max(1.0, self.remaining(deadline)))
                except psycopg.Error as failed:
                    exc = failed
                    continue
                try:
                    async with own:
                        return await fn(own)
                except Exception as err2:
                    if not retriable(err2):
                        raise
                    exc = err2
            except Exception as err:
                if not retriable(err):
                    raise
                exc = err

    async def pooled(self, fn: Callable[[psycopg.AsyncConnection[Any]], Awaitable[T]]) -> T:
        """``await fn(conn)`` on a pooled connection, run again on fresh ones after a retriable failure (see
        :meth:`again`). The successful path is one ``try`` around the call."""
        assert self.pool is not None
        try:
            async with self.pool.connection() as conn:
                return await fn(conn)
        except Exception as exc:
            if not retriable(exc):
                raise
            return await self.again(fn, exc)

    @asynccontextmanager
    async def entered(self, enter: Callable[[AsyncExitStack, float | None], Awaitable[T]]
                      ) -> AsyncIterator[T]:
        """The block runs with what ``await enter(stack, timeout)`` returned, the contexts it entered on
        ``stack`` (a pooled connection, its transaction just begun) left when the block ends; ``timeout``
        is how long to wait for a pooled connection (``None``: the pool's own wait). A retriable failure
        of ``enter`` itself (no connection from the pool, a stale one whose ``BEGIN`` failed) leaves what
        it entered and runs it again, with the backoff of :meth:`pause`, until the timeout passes
        (:class:`ConnectionLost`). The block itself is never run again."""
        deadline = 0.0
        attempt = 0
        wait: float | None = None
        while True:
            stack = AsyncExitStack()
            try:
                got = await enter(stack, wait)
            except Exception as exc:
                await stack.__aexit__(type(exc), exc, exc.__traceback__)
                if not retriable(exc):
                    raise
                if self.timeout <= 0 or self.pool is None:
                    raise self.lost(exc) from exc
                attempt += 1
                if attempt == 1:
                    deadline = self.start()
                await self.pause(exc, deadline, attempt)
                wait = min(self.remaining(deadline), POOL_WAIT)
                continue
            break
        async with stack:
            yield got
