"""Waiting for the server on a libpq connection, every wait bounded: the socket waits (sync, and on the
event loop), the silence probe that asks the server whether it still runs a session whose results are
awaited, and the readers of results built on them.

psycopg's own waits for the socket have no bound: a connection cut silently (a network partition, a proxy
or NAT that dropped it, a server that died while its socket stayed open) would hold them forever.
"""

from __future__ import annotations

import asyncio
import select
import time

import psycopg
from psycopg import pq

from ..identity import server_pid

#: The statuses of a result that succeeded.
OK = (pq.ExecStatus.TUPLES_OK, pq.ExecStatus.COMMAND_OK)


def check_alive(pg: pq.abc.PGconn) -> None:
    """Raise if the connection broke while results were awaited."""
    if pg.status != pq.ConnStatus.OK:
        why = pg.error_message.decode("utf-8", "replace").strip()
        raise psycopg.OperationalError(why or "connection lost")


#: Seconds of silence from the server, while a result is awaited, after which the server is asked (on a
#: connection of its own) whether it still runs the session. A statement may rightly run for long (a lock
#: wait, a synchronous commit waiting for a standby): only a session the server no longer runs, or one it
#: runs idle, gets no more results (a connection cut without either side seeing it close: a network
#: partition, a proxy or NAT that dropped it, a server that died while its socket stayed open).
SILENCE_PROBE = 5.0
#: Seconds the probe of :data:`SILENCE_PROBE` may take (to connect, and to answer).
PROBE_TIMEOUT = 5.0
#: Seconds a wait goes on without a sign of the server (bytes received or sent, or a probe that found the
#: session running) on a connection that sets no ``tcp_user_timeout``: the default ``retry_timeout``. A
#: client's connections set ``tcp_user_timeout`` from its ``retry_timeout`` (see
#: :func:`pgstreams.storage.executor.session_conninfo`), and their waits give up after as long.
DEFAULT_WAIT_LIMIT = 30.0


def wait_limit(pg: pq.abc.PGconn) -> float:
    """Seconds a wait on ``pg`` goes on without a sign of the server: its ``tcp_user_timeout`` (the bound
    the kernel sets on data the server does not acknowledge), else :data:`DEFAULT_WAIT_LIMIT`."""
    for o in pg.info:
        if o.keyword == b"tcp_user_timeout" and o.val:
            try:
                ms = int(o.val)
            except ValueError:
                break
            if ms > 0:
                return ms / 1000.0
    return DEFAULT_WAIT_LIMIT


class Patience:
    """When a wait on a connection started to go without a sign of the server, and whether it went so for
    longer than the connection's :func:`wait_limit` (read once, when first needed: off the fast path)."""

    __slots__ = ("limit", "pg", "since")

    def __init__(self, pg: pq.abc.PGconn) -> None:
        self.pg = pg
        self.since = time.monotonic()
        self.limit: float | None = None

    def sign(self) -> None:
        """The server showed it is there: the wait starts again."""
        self.since = time.monotonic()

    def silent_for(self) -> float:
        """Seconds since the last sign."""
        return time.monotonic() - self.since

    def exhausted(self) -> bool:
        """Whether the wait went without a sign for longer than the limit."""
        if self.limit is None:
            self.limit = wait_limit(self.pg)
        return self.silent_for() >= self.limit

    def gone(self, what: str) -> psycopg.OperationalError:
        """Close the connection; the (retriable) error to raise: ``what`` did not happen in time."""
        pid = server_pid(self.pg) or self.pg.backend_pid
        self.pg.finish()
        return psycopg.OperationalError(
            f"connection lost: {what} (session {pid}, for {self.limit:g} s: the connection's "
            "tcp_user_timeout)")


#: The session states (of :func:`_session_state`) in which the server waits for the client: while its
#: results are awaited, what the client sent never arrived (or the results were lost on the way).
_WAITING_FOR_US = frozenset({"idle", "reading from the client"})
#: What :func:`_session_state` says of a session it cannot name (a connection not set up by pgstreams,
#: behind a pooler): taken as running.
UNTRUSTED = "untrusted"


def _session_state(pg: pq.abc.PGconn) -> str | None:
    """The state in ``pg_stat_activity`` of ``pg``'s server session, asked on a new connection with the
    same parameters: ``None`` if the server no longer runs it, ``"unknown"`` if the server cannot be asked
    within :data:`PROBE_TIMEOUT` seconds (to connect, then to answer), ``"reading from the client"`` for a
    session in a transaction or a COPY that waits for the client to send more (``wait_event``
    ``ClientRead``), :data:`UNTRUSTED` if the session cannot be named.

    The session is named by the server's process id recorded when pgstreams set the connection up
    (:mod:`..identity`); on another connection, by the id given at login, which names the server's
    process only when no pooler stands between: the probe, on the same route, compares its own two ids,
    and when they differ says :data:`UNTRUSTED` (the wait then goes on: never cut on a guess)."""
    pid = server_pid(pg)
    params = {o.keyword.decode(): o.val.decode() for o in pg.info if o.val is not None}
    params["connect_timeout"] = str(int(PROBE_TIMEOUT))
    params["application_name"] = "pgstreams probe"
    params.pop("replication", None)
    try:
        with psycopg.connect(psycopg.conninfo.make_conninfo("", **params), autocommit=True) as probe:
            ppg = probe.pgconn
            ppg.send_query_params(b"SELECT (SELECT CASE WHEN state <> 'idle' AND wait_event = 'ClientRead' "
                                  b"THEN 'reading from the client' ELSE coalesce(state, '') END "
                                  b"FROM pg_stat_activity WHERE pid = $1), pg_backend_pid()",
                                  [b"%d" % (pg.backend_pid if pid is None else pid)])
            ends = time.monotonic() + PROBE_TIMEOUT
            while (pending := ppg.flush()) or ppg.is_busy():
                left = ends - time.monotonic()
                events = select.POLLIN | (select.POLLOUT if pending else 0)
                if left <= 0 or not polled(ppg.socket, left, events):
                    return "unknown"
                ppg.consume_input()
            res = ppg.get_result()
            while ppg.get_result() is not None:
                pass
            probe_login = ppg.backend_pid
    except psycopg.Error:
        return "unknown"
    if res is None or res.status != pq.ExecStatus.TUPLES_OK or res.ntuples != 1:
        return "unknown"
    if pid is None and int(res.get_value(0, 1) or b"0") != probe_login:
        return UNTRUSTED
    state = res.get_value(0, 0)
    return None if state is None else state.decode()


def polled(fd: int, timeout: float, events: int = select.POLLIN) -> bool:
    """Whether ``fd`` became ready for ``events`` (or failed) within ``timeout`` seconds."""
    poller = select.poll()
    poller.register(fd, events | select.POLLERR | select.POLLHUP)
    return bool(poller.poll(timeout * 1000.0))


def _readable(fd: int, timeout: float) -> bool:
    return polled(fd, timeout)


def flush(pg: pq.abc.PGconn, force: bool = False) -> None:
    """Send what libpq still holds of the messages queued on ``pg`` (a connection in non-blocking mode,
    psycopg's, may keep part of a large one), reading what the server sends meanwhile (it may be waiting
    for us to read); if the socket moves nothing for the connection's :func:`wait_limit`, close ``pg`` and
    raise :class:`psycopg.OperationalError` (retriable). With ``force``, wait for the socket at least once
    (libpq refused to queue more: its buffer is full)."""
    if not pg.flush() and not force:
        return
    patience = Patience(pg)
    fd = pg.socket
    while True:
        if polled(fd, SILENCE_PROBE, select.POLLIN | select.POLLOUT):
            patience.sign()
            pg.consume_input()
        elif patience.exhausted():
            raise patience.gone("the server accepted nothing sent to it")
        if not pg.flush():
            return


def await_input(pg: pq.abc.PGconn) -> None:
    """Wait until the server sends something on ``pg`` and read it; after :data:`SILENCE_PROBE` seconds of
    silence, ask the server whether it still runs the session, and if it does not (or waits for the client
    while nothing arrives: idle, or reading from it in a transaction or a COPY: what was sent never
    arrived), or it cannot be asked and nothing arrives for the connection's :func:`wait_limit`,
    close ``pg`` and raise :class:`psycopg.OperationalError` (retriable: a caller retries on a new
    connection instead of waiting forever)."""
    flush(pg)
    fd = pg.socket
    patience: Patience | None = None
    while not _readable(fd, SILENCE_PROBE):
        if patience is None:
            patience = Patience(pg)
            patience.since -= SILENCE_PROBE
        state = _session_state(pg)
        if state == "unknown":
            if patience.exhausted():
                raise patience.gone("no answer from the server, and no new connection could ask it about "
                                    "the session")
            continue
        if state is not None and state not in _WAITING_FOR_US:
            patience.sign()  # the server runs the statement: a long one
            continue
        if state is not None and _readable(fd, 1.0):
            break  # its last results were on their way
        exc = _lost(pg, state)
        pg.finish()
        raise exc
    pg.consume_input()


def _lost(pg: pq.abc.PGconn, state: str | None) -> psycopg.OperationalError:
    pid = server_pid(pg) or pg.backend_pid
    return psycopg.OperationalError(
        f"connection lost: the server no longer runs session {pid}, whose results were awaited"
        if state is None else
        f"connection lost: session {pid} waits on the server for the client ({state}) while its results were "
        "awaited")


def next_result(pg: pq.abc.PGconn) -> pq.abc.PGresult | None:
    """``pg.get_result()``, waiting for the server through :func:`await_input` (never blocked without a
    bound in libpq when the connection was cut silently)."""
    while pg.is_busy():
        await_input(pg)
    return pg.get_result()


def until_sync(pg: pq.abc.PGconn) -> list[pq.abc.PGresult]:
    """The results of a pipeline up to its (one) sync, waiting through :func:`await_input`."""
    results: list[pq.abc.PGresult] = []
    while True:
        res = next_result(pg)
        if res is None:
            check_alive(pg)
            continue
        if res.status == pq.ExecStatus.PIPELINE_SYNC:
            return results
        results.append(res)


def last_result(pg: pq.abc.PGconn) -> pq.abc.PGresult:
    """The last result of the command sent on ``pg`` (outside pipeline mode), as ``PQexec`` returns it."""
    last: pq.abc.PGresult | None = None
    while (res := next_result(pg)) is not None:
        last = res
        if res.status in (pq.ExecStatus.COPY_IN, pq.ExecStatus.COPY_OUT, pq.ExecStatus.COPY_BOTH):
            break
    if last is None:
        check_alive(pg)
        raise psycopg.OperationalError("the server sent no result")
    return last


async def await_input_async(loop: asyncio.AbstractEventLoop, pg: pq.abc.PGconn, fd: int) -> None:
    """:func:`await_input` on the event loop (the server is asked in a thread); the caller closes the
    connection when it raises."""
    await flush_async(loop, pg, fd)
    patience: Patience | None = None
    while not await _ready_within(loop, fd, SILENCE_PROBE):
        if patience is None:
            patience = Patience(pg)
            patience.since -= SILENCE_PROBE
        state = await asyncio.to_thread(_session_state, pg)
        if state == "unknown":
            if patience.exhausted():
                raise patience.gone("no answer from the server, and no new connection could ask it about "
                                    "the session")
            continue
        if state is not None and state not in _WAITING_FOR_US:
            patience.sign()
            continue
        if state is not None and await _ready_within(loop, fd, 1.0):
            break
        raise _lost(pg, state)
    pg.consume_input()


async def flush_async(loop: asyncio.AbstractEventLoop, pg: pq.abc.PGconn, fd: int, force: bool = False
                       ) -> None:
    """:func:`flush` on the event loop."""
    if not pg.flush() and not force:
        return
    patience = Patience(pg)
    while True:
        if await _ready_within(loop, fd, SILENCE_PROBE, write=True):
            patience.sign()
            pg.consume_input()
        elif patience.exhausted():
            raise patience.gone("the server accepted nothing sent to it")
        if not pg.flush():
            return


async def _ready_within(loop: asyncio.AbstractEventLoop, fd: int, timeout: float, write: bool = False
                        ) -> bool:
    """Wait until ``fd`` is readable (or, with ``write``, readable or writable) (``True``) or ``timeout``
    seconds passed (``False``): a timer on the loop, not ``asyncio.wait_for`` (which makes a task per
    wait)."""
    fut: asyncio.Future[bool] = loop.create_future()
    loop.add_reader(fd, _settle, fut, True)
    if write:
        loop.add_writer(fd, _settle, fut, True)
    timer = loop.call_later(timeout, _settle, fut, False)
    try:
        return await fut
    finally:
        loop.remove_reader(fd)
        if write:
            loop.remove_writer(fd)
        timer.cancel()


def _settle(fut: asyncio.Future[bool], value: bool) -> None:
    if not fut.done():
        fut.set_result(value)

