"""Hot statements run straight through libpq: prepared once per connection, sent in one pipeline.

psycopg's query layer (rendering a composed query, converting ``%(name)s`` placeholders, adapting lists,
its pipeline bookkeeping) costs several times the client CPU of the round trip it serves on the hottest
paths (a poll that finds a few events, a single publish). Here a statement is rendered once, its
placeholders become ``$n``, its parameters are sent as text, and its rows are loaded by psycopg's own
(compiled) loaders through a :class:`psycopg.adapt.Transformer`.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import re
import select
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import pq
from psycopg.adapt import Transformer
from psycopg.types.string import BytesBinaryDumper
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from .executor import core_query

_NAMED = re.compile(rb"%\((\w+)\)s")


@dataclass(frozen=True)
class Statement:
    """A query rendered for libpq: its prepared-statement name, text with ``$n`` placeholders, and the
    names of its parameters in ``$n`` order."""

    name: bytes
    text: bytes
    params: tuple[str, ...]


@functools.lru_cache(maxsize=4096)
def statement(query: str, schema: str, topic_id: int | None = None) -> Statement:
    """Core query ``query`` rendered for ``schema`` (and topic) with ``$n`` placeholders: its ``%s``
    parameters in order, or its ``%(name)s`` parameters numbered in order of first appearance."""
    return statement_of(query, core_query(query, schema, topic_id).as_bytes(None))


def statement_of(name: str, text: bytes) -> Statement:
    """A :class:`Statement` named after ``name`` (and a digest of its text) from a query's text with
    psycopg placeholders (``%s``, or ``%(name)s`` numbered in order of first appearance; ``%%`` is ``%``)."""
    if b"%s" in text:
        parts = text.split(b"%s")
        text = parts[0] + b"".join(b"$%d" % i + part for i, part in enumerate(parts[1:], 1))
        text = text.replace(b"%%", b"%")
        digest = hashlib.sha1(text).hexdigest()[:16]
        return Statement(f"pgstreams_{name}_{digest}".encode(), text, ())
    names: list[str] = []

    def number(m: re.Match[bytes]) -> bytes:
        key = m.group(1).decode()
        if key not in names:
            names.append(key)
        return b"$%d" % (names.index(key) + 1)

    text = _NAMED.sub(number, text).replace(b"%%", b"%")
    digest = hashlib.sha1(text).hexdigest()[:16]
    return Statement(f"pgstreams_{name}_{digest}".encode(), text, tuple(names))


def text_params(st: Statement, values: Mapping[str, Any], encoding: str) -> list[bytes | None]:
    """``values`` of ``st``'s named parameters in ``$n`` order, in text form: ``None`` (NULL), booleans,
    integers, strings and lists of integers."""
    out: list[bytes | None] = []
    for name in st.params:
        v = values[name]
        if v is None:
            out.append(None)
        elif v is True or v is False:
            out.append(b"t" if v else b"f")
        elif isinstance(v, int):
            out.append(b"%d" % v)
        elif isinstance(v, str):
            out.append(v.encode(encoding))
        elif isinstance(v, (list, tuple)):
            out.append(int_array(v))
        else:
            raise TypeError(f"parameter {name!r}: no text form for {type(v).__name__}")
    return out


def int_array(values: Sequence[int]) -> bytes:
    """An integer array parameter in text form."""
    return b"{" + b",".join(b"%d" % v for v in values) + b"}"


#: A step of a pipeline: the statement, its parameters in text form (None: NULL), the result format
#: (0 text, 1 binary).
Step = tuple[Statement, Sequence[bytes | None], int]


_OK = (pq.ExecStatus.TUPLES_OK, pq.ExecStatus.COMMAND_OK)
_NOTIFY = b"SELECT pg_notify($1, $2)"
_DUPLICATE_PREPARED = b"42P05"


def _check_alive(pg: pq.abc.PGconn) -> None:
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
#: Seconds a pooled connection's check (:class:`CheckedPool`) waits for the server's answer.
CHECK_TIMEOUT = 5.0


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


class _Patience:
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
        pid = self.pg.backend_pid
        self.pg.finish()
        return psycopg.OperationalError(
            f"connection lost: {what} (session {pid}, for {self.limit:g} s: the connection's "
            "tcp_user_timeout)")


#: The session states (of :func:`_session_state`) in which the server waits for the client: while its
#: results are awaited, what the client sent never arrived (or the results were lost on the way).
_WAITING_FOR_US = frozenset({"idle", "reading from the client"})


def _session_state(pg: pq.abc.PGconn) -> str | None:
    """The state in ``pg_stat_activity`` of ``pg``'s backend, asked on a new connection with the same
    parameters: ``None`` if the server no longer runs it, ``"unknown"`` if the server cannot be asked
    within :data:`PROBE_TIMEOUT` seconds (to connect, then to answer), ``"reading from the client"`` for a
    session in a transaction or a COPY that waits for the client to send more (``wait_event``
    ``ClientRead``)."""
    params = {o.keyword.decode(): o.val.decode() for o in pg.info if o.val is not None}
    params["connect_timeout"] = str(int(PROBE_TIMEOUT))
    params["application_name"] = "pgstreams probe"
    params.pop("replication", None)
    try:
        with psycopg.connect(psycopg.conninfo.make_conninfo("", **params), autocommit=True) as probe:
            ppg = probe.pgconn
            ppg.send_query_params(b"SELECT CASE WHEN state <> 'idle' AND wait_event = 'ClientRead' "
                                  b"THEN 'reading from the client' ELSE coalesce(state, '') END "
                                  b"FROM pg_stat_activity WHERE pid = $1",
                                  [b"%d" % pg.backend_pid])
            ends = time.monotonic() + PROBE_TIMEOUT
            while (pending := ppg.flush()) or ppg.is_busy():
                left = ends - time.monotonic()
                events = select.POLLIN | (select.POLLOUT if pending else 0)
                if left <= 0 or not _polled(ppg.socket, left, events):
                    return "unknown"
                ppg.consume_input()
            res = ppg.get_result()
            while ppg.get_result() is not None:
                pass
    except psycopg.Error:
        return "unknown"
    if res is None or res.status != pq.ExecStatus.TUPLES_OK:
        return "unknown"
    if res.ntuples == 0:
        return None
    return (res.get_value(0, 0) or b"").decode()


def _polled(fd: int, timeout: float, events: int = select.POLLIN) -> bool:
    """Whether ``fd`` became ready for ``events`` (or failed) within ``timeout`` seconds."""
    poller = select.poll()
    poller.register(fd, events | select.POLLERR | select.POLLHUP)
    return bool(poller.poll(timeout * 1000.0))


def _readable(fd: int, timeout: float) -> bool:
    return _polled(fd, timeout)


def _flush(pg: pq.abc.PGconn, force: bool = False) -> None:
    """Send what libpq still holds of the messages queued on ``pg`` (a connection in non-blocking mode,
    psycopg's, may keep part of a large one), reading what the server sends meanwhile (it may be waiting
    for us to read); if the socket moves nothing for the connection's :func:`wait_limit`, close ``pg`` and
    raise :class:`psycopg.OperationalError` (retriable). With ``force``, wait for the socket at least once
    (libpq refused to queue more: its buffer is full)."""
    if not pg.flush() and not force:
        return
    patience = _Patience(pg)
    fd = pg.socket
    while True:
        if _polled(fd, SILENCE_PROBE, select.POLLIN | select.POLLOUT):
            patience.sign()
            pg.consume_input()
        elif patience.exhausted():
            raise patience.gone("the server accepted nothing sent to it")
        if not pg.flush():
            return


def _await_input(pg: pq.abc.PGconn) -> None:
    """Wait until the server sends something on ``pg`` and read it; after :data:`SILENCE_PROBE` seconds of
    silence, ask the server whether it still runs the session, and if it does not (or waits for the client
    while nothing arrives: idle, or reading from it in a transaction or a COPY: what was sent never
    arrived), or it cannot be asked and nothing arrives for the connection's :func:`wait_limit`,
    close ``pg`` and raise :class:`psycopg.OperationalError` (retriable: a caller retries on a new
    connection instead of waiting forever)."""
    _flush(pg)
    fd = pg.socket
    patience: _Patience | None = None
    while not _readable(fd, SILENCE_PROBE):
        if patience is None:
            patience = _Patience(pg)
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
    pid = pg.backend_pid
    return psycopg.OperationalError(
        f"connection lost: the server no longer runs session {pid}, whose results were awaited"
        if state is None else
        f"connection lost: session {pid} waits on the server for the client ({state}) while its results were "
        "awaited")


def _result(pg: pq.abc.PGconn) -> pq.abc.PGresult | None:
    """``pg.get_result()``, waiting for the server through :func:`_await_input` (never blocked without a
    bound in libpq when the connection was cut silently)."""
    while pg.is_busy():
        _await_input(pg)
    return pg.get_result()


def usable(conn: psycopg.Connection) -> bool:
    """Whether :meth:`Direct.pipeline` may run on ``conn``: in autocommit mode and not in a transaction (in a
    caller's transaction a failed statement would abort it, so nothing could be retried)."""
    return conn.autocommit and conn.pgconn.transaction_status == pq.TransactionStatus.IDLE


class _Session:
    """What a connection has prepared, and a transformer that loads its rows."""

    __slots__ = ("encoding", "prepared", "transformer")

    def __init__(self, conn: psycopg.Connection) -> None:
        self.encoding = conn.info.encoding
        self.prepared: set[bytes] = set()
        self.transformer = Transformer(conn)


class Direct:
    """Runs :class:`Statement` pipelines on connections, preparing each statement once per connection."""

    def __init__(self) -> None:
        self._sessions: weakref.WeakKeyDictionary[psycopg.Connection, _Session] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()

    def _session(self, conn: psycopg.Connection) -> _Session:
        with self._lock:
            s = self._sessions.get(conn)
            if s is None:
                s = self._sessions[conn] = _Session(conn)
            return s

    def prepare(self, conn: psycopg.Connection, st: Statement, types: Sequence[int] | None = None) -> str:
        """Prepare ``st`` on ``conn`` unless done already (``types``: parameter type oids); the
        connection's encoding."""
        s = self._session(conn)
        if st.name not in s.prepared:
            res = self.exec_prepare(conn.pgconn, st, types)
            # "already exists": the server kept it while this registry forgot it (after a statement that
            # some other one had gone, the registry forgets them all); the name carries the text's digest
            if res.status != pq.ExecStatus.COMMAND_OK and (
                    res.error_field(pq.DiagnosticField.SQLSTATE) != _DUPLICATE_PREPARED):
                raise psycopg.errors.error_from_result(res, encoding=s.encoding)
            s.prepared.add(st.name)
        return s.encoding

    @staticmethod
    def exec_prepare(pg: pq.abc.PGconn, st: Statement, types: Sequence[int] | None = None) -> pq.abc.PGresult:
        """Prepare ``st`` (not registered: see :meth:`prepare`); its result."""
        pg.send_prepare(st.name, st.text, types)
        return _last(pg)

    @staticmethod
    def exec_prepared(conn: psycopg.Connection, st: Statement, params: Sequence[bytes | None],
                      formats: Sequence[int] | None = None, result_format: int = 0) -> pq.abc.PGresult:
        """Run prepared ``st`` (as ``PQexecPrepared``, waiting through :func:`_await_input`); its result."""
        conn.pgconn.send_query_prepared(st.name, params, formats, result_format)
        return _last(conn.pgconn)

    def forget(self, conn: psycopg.Connection) -> None:
        """The server no longer holds the statements prepared on ``conn`` (psycopg deallocates every
        prepared statement of a connection after a rollback): prepare them again when next used."""
        self._session(conn).prepared.clear()

    def pipeline(self, conn: psycopg.Connection, steps: Sequence[Step]) -> list[list[tuple[Any, ...]]]:
        """Run ``steps`` in one round trip, in order, each its own transaction: ``conn`` must be idle in
        autocommit mode (:func:`usable`). The rows of each; the first error is raised (as psycopg raises
        it) after every result was read. Statements that the server no longer holds are prepared again and
        the steps run once more."""
        for attempt in (0, 1):
            enc = ""
            for st, _params, _fmt in steps:
                enc = self.prepare(conn, st)
            results = self._run(conn.pgconn, steps)
            failed = next((r for r in results if r.status not in _OK), None)
            if failed is None:
                break
            if attempt == 0 and failed.error_field(pq.DiagnosticField.SQLSTATE) == b"26000":
                self.forget(conn)
                continue
            raise psycopg.errors.error_from_result(failed, encoding=enc)
        tx = self._session(conn).transformer
        out = []
        for res in results:
            tx.set_pgresult(res)
            out.append(tx.load_rows(0, res.ntuples, tuple))
        return out

    @staticmethod
    def run_then_commit(conn: psycopg.Connection, st: Statement, params: Sequence[bytes | None], *,
                        commit: bool) -> list[tuple[Any, ...]]:
        """Run ``st``'s text unprepared (nothing to prepare inside a transaction: a failed prepare would abort
        it) with text ``params``, in one round trip: as a transaction of its own (``conn`` idle in autocommit
        mode), or with ``commit`` in ``conn``'s open transaction, followed by its ``COMMIT``. Its rows (as
        text); its error is raised after every result was read, and with ``commit`` leaves the transaction
        failed, for the caller to roll back."""
        pg = conn.pgconn
        pg.enter_pipeline_mode()
        try:
            pg.send_query_params(st.text, params)
            if commit:
                pg.send_query_params(b"COMMIT", None)
            pg.pipeline_sync()
            results = _until_sync(pg)
        finally:
            if pg.status == pq.ConnStatus.OK:
                pg.exit_pipeline_mode()
        first = results[0]
        if first.status not in _OK:
            raise psycopg.errors.error_from_result(first, encoding=conn.info.encoding)
        if commit and results[1].status not in _OK:
            raise psycopg.errors.error_from_result(results[1], encoding=conn.info.encoding)
        return [tuple(first.get_value(r, c) for c in range(first.nfields)) for r in range(first.ntuples)]

    @staticmethod
    def exec_then_notify(conn: psycopg.Connection, st: Statement, params: Sequence[bytes | None],
                         formats: Sequence[int], notify: tuple[bytes, bytes]) -> pq.abc.PGresult:
        """Run prepared ``st`` (its own transaction, on an autocommit connection), then
        ``pg_notify(*notify)`` in a transaction of its own, after the first committed: one round trip (a
        libpq pipeline with a sync after each). Returns the statement's result; the notification's is
        dropped (a wake-up hint: consumers poll anyway)."""
        return Direct.exec_then(conn, st, params, formats, [(_NOTIFY, notify)])[0]

    @staticmethod
    def exec_then(conn: psycopg.Connection, st: Statement, params: Sequence[bytes | None],
                  formats: Sequence[int], after: Sequence[tuple[bytes, Sequence[bytes | None]]]
                  ) -> list[pq.abc.PGresult]:
        """Run prepared ``st`` (its own transaction, on an autocommit connection), then each query of
        ``after`` (text with ``$n`` placeholders, text parameters) in a transaction of its own, each after
        the one before committed: one round trip (a libpq pipeline with a sync after each). Returns the
        first result of each, ``st``'s first (a failed one's error result: the caller raises it)."""
        pg = conn.pgconn
        pg.enter_pipeline_mode()
        try:
            pg.send_query_prepared(st.name, params, formats)
            pg.pipeline_sync()
            for query, values in after:
                pg.send_query_params(query, values)
                pg.pipeline_sync()
            firsts: list[pq.abc.PGresult | None] = [None] * (len(after) + 1)
            syncs = 0
            while syncs < len(firsts):
                res = _result(pg)
                if res is None:
                    _check_alive(pg)
                    continue
                if res.status == pq.ExecStatus.PIPELINE_SYNC:
                    syncs += 1
                elif firsts[syncs] is None:
                    firsts[syncs] = res
        finally:
            if pg.status == pq.ConnStatus.OK:
                pg.exit_pipeline_mode()
        out = [r for r in firsts if r is not None]
        assert len(out) == len(firsts)
        return out

    @staticmethod
    def copy_in(conn: psycopg.Connection, query: bytes, types: Sequence[str],
                rows: Iterable[Sequence[Any]]) -> None:
        """Send ``query`` (statements separated by semicolons, the last one a binary ``COPY ... FROM
        STDIN``) in one message and copy ``rows`` (of ``types``): PostgreSQL runs such a message as one
        implicit transaction, committed after the copy, so the statements before it (a publisher's
        registration) and the copy cost one round trip, as a lone COPY does. ``conn`` must be idle in
        autocommit mode (:func:`usable`). An error (of a statement, of the copy, or raised by ``rows``)
        rolls everything back and is raised."""
        pg = conn.pgconn
        pg.send_query(query)
        cur = conn.cursor()
        # by oid, bytea would get the (Python) dumper of psycopg.Binary: use the C one for bytes
        cur.adapters.register_dumper(None, BytesBinaryDumper)
        # the first rows are encoded while the server runs the statements and starts the COPY: the writer
        # waits for the COPY to start only when it has its first data to send
        writer = CopyWriter(pg, conn.info.encoding, started=False)
        try:
            # ends the COPY; raises its error
            with psycopg.Copy(cur, binary=True, writer=writer) as cp:
                cp.set_types(types)
                for r in rows:
                    cp.write_row(r)
        finally:
            # the message's end (the implicit transaction's commit, or its rollback after an error)
            while pg.status == pq.ConnStatus.OK and _result(pg) is not None:
                pass

    @staticmethod
    def _run(pg: pq.abc.PGconn, steps: Sequence[Step]) -> list[pq.abc.PGresult]:
        pg.enter_pipeline_mode()
        try:
            for st, params, fmt in steps:
                pg.send_query_prepared(st.name, params, None, fmt)
            pg.pipeline_sync()
            results = _until_sync(pg)
        finally:
            if pg.status == pq.ConnStatus.OK:
                pg.exit_pipeline_mode()
        return results


#: Bytes of COPY data handed to libpq at once (psycopg splits larger buffers likewise).
_COPY_CHUNK = 128 * 1024
#: Bytes of COPY data queued in libpq before they are flushed to the server (psycopg's own cadence: the
#: server stores the first rows of a batch while the client still encodes the next).
_COPY_FLUSH = 32 * 1024


def _copy_end_message(exc: BaseException | None, encoding: str) -> bytes | None:
    if exc is None:
        return None
    return f"error from Python: {type(exc).__qualname__} - {exc}".encode(encoding, "replace")


def _copy_end_result(pg: pq.abc.PGconn, res: pq.abc.PGresult | None, message: bytes | None,
                     encoding: str) -> None:
    """Raise the error of the COPY's result, unless it is the cancellation ``message`` asked for (the
    Python error that caused it is the one raised)."""
    if res is None:
        _check_alive(pg)
        raise psycopg.OperationalError("the server sent no result for the COPY")
    if res.status == pq.ExecStatus.COMMAND_OK:
        return
    if message is not None and res.error_field(pq.DiagnosticField.SQLSTATE) == b"57014":
        return
    raise psycopg.errors.error_from_result(res, encoding=encoding)


class CopyWriter(psycopg.copy.Writer):
    """psycopg's COPY writer, with every wait bounded as :func:`_flush` and :func:`_await_input` bound
    theirs (psycopg's own waits for the socket have no bound: a connection cut silently during a COPY
    would hold it forever)."""

    def __init__(self, pg: pq.abc.PGconn, encoding: str, started: bool = True) -> None:
        self._pg = pg
        self._encoding = encoding
        self._queued = 0
        self._started = started

    def _start(self) -> None:
        """Wait until the query sent on the connection has started its COPY (``started=False``): read the
        results of the statements before it, and raise the first error among them (the server then ran
        no COPY)."""
        pg = self._pg
        failed: pq.abc.PGresult | None = None
        while True:
            res = _result(pg)
            if res is None:
                _check_alive(pg)
                if failed is not None:
                    raise psycopg.errors.error_from_result(failed, encoding=self._encoding)
                raise psycopg.ProgrammingError("the query did not start a COPY")
            if res.status == pq.ExecStatus.COPY_IN:
                break
            if res.status not in _OK and failed is None:
                failed = res
        self._started = True

    def write(self, data: Any) -> None:
        """Queue ``data`` (COPY data) in libpq, flushing it to the server every :data:`_COPY_FLUSH` bytes."""
        if not self._started:
            self._start()
        view = memoryview(data)
        for i in range(0, len(view), _COPY_CHUNK):
            chunk = view[i:i + _COPY_CHUNK]
            while not self._pg.put_copy_data(chunk):
                _flush(self._pg, force=True)
            self._queued += len(chunk)
            if self._queued >= _COPY_FLUSH:
                self._queued = 0
                _flush(self._pg)

    def finish(self, exc: BaseException | None = None) -> None:
        """End the COPY (with an error message when ``exc``: the server cancels it) and read its result."""
        pg = self._pg
        if exc is not None and pg.status != pq.ConnStatus.OK:
            return  # the connection is gone (closed by a bounded wait): exc is the error to raise
        if not self._started:
            try:
                self._start()
            except psycopg.Error:
                if exc is None:
                    raise
                return  # no COPY ran: exc is the error to raise
        message = _copy_end_message(exc, self._encoding)
        while not pg.put_copy_end(message):
            _flush(pg, force=True)
        _copy_end_result(pg, _result(pg), message, self._encoding)


def _until_sync(pg: pq.abc.PGconn) -> list[pq.abc.PGresult]:
    """The results of a pipeline up to its (one) sync, waiting through :func:`_await_input`."""
    results: list[pq.abc.PGresult] = []
    while True:
        res = _result(pg)
        if res is None:
            _check_alive(pg)
            continue
        if res.status == pq.ExecStatus.PIPELINE_SYNC:
            return results
        results.append(res)


def _last(pg: pq.abc.PGconn) -> pq.abc.PGresult:
    """The last result of the command sent on ``pg`` (outside pipeline mode), as ``PQexec`` returns it."""
    last: pq.abc.PGresult | None = None
    while (res := _result(pg)) is not None:
        last = res
        if res.status in (pq.ExecStatus.COPY_IN, pq.ExecStatus.COPY_OUT, pq.ExecStatus.COPY_BOTH):
            break
    if last is None:
        _check_alive(pg)
        raise psycopg.OperationalError("the server sent no result")
    return last


def send_statements(conn: psycopg.Connection, steps: Sequence[tuple[Statement, Sequence[bytes | None]]]
                    ) -> None:
    """Send the (unprepared) ``steps`` on ``conn`` (idle, autocommit) in one pipeline, without waiting
    for their results: the server works on them while the caller does something else (on another
    connection); :func:`collect_statements` reads them."""
    pg = conn.pgconn
    pg.enter_pipeline_mode()
    try:
        for st, params in steps:
            pg.send_query_params(st.text, params)
        pg.pipeline_sync()
        _flush(pg)
    except BaseException:
        conn.close()  # half a pipeline sent: no one may use it again
        raise


def collect_statements(conn: psycopg.Connection) -> list[list[tuple[Any, ...]]]:
    """The rows of each statement :func:`send_statements` sent on ``conn``; the first error is raised
    after every result was read."""
    pg = conn.pgconn
    try:
        results = _until_sync(pg)
    finally:
        if pg.status == pq.ConnStatus.OK:
            pg.exit_pipeline_mode()
    failed = next((r for r in results if r.status not in _OK), None)
    if failed is not None:
        raise psycopg.errors.error_from_result(failed, encoding=conn.info.encoding)
    tx = Transformer(conn)
    out = []
    for res in results:
        tx.set_pgresult(res)
        out.append(tx.load_rows(0, res.ntuples, tuple))
    return out


def check(pg: pq.abc.PGconn, timeout: float = CHECK_TIMEOUT) -> None:
    """Whether ``pg`` (idle) still reaches its server: an empty query answered within ``timeout`` seconds;
    else ``pg`` is closed and :class:`psycopg.OperationalError` raised."""
    pg.send_query(b"")
    ends = time.monotonic() + timeout
    while (pending := pg.flush()) or pg.is_busy():
        left = ends - time.monotonic()
        if left <= 0 or not _polled(pg.socket, left, select.POLLIN | (select.POLLOUT if pending else 0)):
            pg.finish()
            raise psycopg.OperationalError(f"connection check: no answer within {timeout:g} s")
        pg.consume_input()
    while (res := pg.get_result()) is not None:
        if res.status == pq.ExecStatus.FATAL_ERROR:
            raise psycopg.errors.error_from_result(res)
    _check_alive(pg)


class CheckedPool(ConnectionPool):
    """psycopg's pool, whose :meth:`check` (after a lost connection: see :mod:`pgstreams.reconnect`) waits
    :data:`CHECK_TIMEOUT` seconds at most for each connection's answer (psycopg's check waits for it
    without a bound: one connection cut silently would hold the check forever)."""

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
    most for each connection's answer."""

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


def exec_params(pg: pq.abc.PGconn, query: bytes, params: Sequence[bytes | None]) -> pq.abc.PGresult:
    """Run ``query`` with text ``params`` (as ``PQexecParams``, waiting through :func:`_await_input`)."""
    pg.send_query_params(query, params)
    return _last(pg)


async def _await_input_async(loop: asyncio.AbstractEventLoop, pg: pq.abc.PGconn, fd: int) -> None:
    """:func:`_await_input` on the event loop (the server is asked in a thread); the caller closes the
    connection when it raises."""
    await _flush_async(loop, pg, fd)
    patience: _Patience | None = None
    while not await _ready_within(loop, fd, SILENCE_PROBE):
        if patience is None:
            patience = _Patience(pg)
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


async def _flush_async(loop: asyncio.AbstractEventLoop, pg: pq.abc.PGconn, fd: int, force: bool = False
                       ) -> None:
    """:func:`_flush` on the event loop."""
    if not pg.flush() and not force:
        return
    patience = _Patience(pg)
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


class AsyncCopyWriter(psycopg.copy.AsyncWriter):
    """:class:`CopyWriter` on the event loop."""

    def __init__(self, pg: pq.abc.PGconn, encoding: str) -> None:
        self._pg = pg
        self._encoding = encoding
        self._queued = 0

    async def write(self, data: Any) -> None:
        """Queue ``data`` (COPY data) in libpq, flushing it to the server every :data:`_COPY_FLUSH` bytes."""
        pg = self._pg
        loop = asyncio.get_running_loop()
        view = memoryview(data)
        for i in range(0, len(view), _COPY_CHUNK):
            chunk = view[i:i + _COPY_CHUNK]
            while not pg.put_copy_data(chunk):
                await _flush_async(loop, pg, pg.socket, force=True)
            self._queued += len(chunk)
            if self._queued >= _COPY_FLUSH:
                self._queued = 0
                await _flush_async(loop, pg, pg.socket)

    async def finish(self, exc: BaseException | None = None) -> None:
        """End the COPY (with an error message when ``exc``: the server cancels it) and read its result."""
        pg = self._pg
        loop = asyncio.get_running_loop()
        if exc is not None and pg.status != pq.ConnStatus.OK:
            return  # the connection is gone (closed by a bounded wait): exc is the error to raise
        fd = pg.socket
        message = _copy_end_message(exc, self._encoding)
        while not pg.put_copy_end(message):
            await _flush_async(loop, pg, fd, force=True)
        await _flush_async(loop, pg, fd)
        while pg.is_busy():
            await _await_input_async(loop, pg, fd)
        _copy_end_result(pg, pg.get_result(), message, self._encoding)


#: A message a batch of :meth:`AsyncDirect.exchange` sends (a callable given the libpq connection).
Send = Callable[[pq.abc.PGconn], None]


class AsyncDirect:
    """The asyncio twin of :class:`Direct`: :class:`Statement` pipelines on psycopg async connections,
    each statement prepared once per connection, waiting for the server on the event loop (one wake-up
    per round trip, without psycopg's query layer and its waiting generators). Use it only on a
    connection the caller holds alone (a pooled one), idle in autocommit mode."""

    def __init__(self) -> None:
        self._sessions: weakref.WeakKeyDictionary[psycopg.AsyncConnection[Any], _Session] = (
            weakref.WeakKeyDictionary())

    def _session(self, conn: psycopg.AsyncConnection[Any]) -> _Session:
        s = self._sessions.get(conn)
        if s is None:
            s = self._sessions[conn] = _Session(conn)  # type: ignore[arg-type]
        return s

    def forget(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """The server no longer holds the statements prepared on ``conn``: prepare them again."""
        self._session(conn).prepared.clear()

    @staticmethod
    async def exchange(conn: psycopg.AsyncConnection[Any], batches: Sequence[Sequence[Send]]
                       ) -> list[list[pq.abc.PGresult]]:
        """Send ``batches`` in one libpq pipeline, a sync after each (each batch is its own transaction
        on an autocommit connection; an error skips the rest of its batch only), in one round trip; the
        results of each batch. If waiting is interrupted (cancelled) the connection is closed: its
        results are still on their way, so no one may use it again (a pool replaces it)."""
        pg = conn.pgconn
        loop = asyncio.get_running_loop()
        fd = pg.socket
        out: list[list[pq.abc.PGresult]] = [[] for _ in batches]
        pg.enter_pipeline_mode()
        done = False
        try:
            for batch in batches:
                for send in batch:
                    send(pg)
                pg.pipeline_sync()
            await _flush_async(loop, pg, fd)
            i = 0
            while i < len(batches):
                if pg.is_busy():
                    await _await_input_async(loop, pg, fd)
                    continue
                res = pg.get_result()
                if res is None:
                    _check_alive(pg)
                    continue
                if res.status == pq.ExecStatus.PIPELINE_SYNC:
                    i += 1
                else:
                    out[i].append(res)
            done = True
        finally:
            if done and pg.status == pq.ConnStatus.OK:
                pg.exit_pipeline_mode()
            elif not done:
                await conn.close()
        return out

    @staticmethod
    async def copy_in(conn: psycopg.AsyncConnection[Any], query: bytes, types: Sequence[str],
                      rows: Iterable[Sequence[Any]]) -> None:
        """:meth:`Direct.copy_in` on the event loop: ``query`` (statements, the last a binary ``COPY ... FROM
        STDIN``) sent as one message, ``rows`` copied; one implicit transaction, one round trip. ``conn``
        must be idle in autocommit mode, held alone; it is closed if this is interrupted half-way."""
        pg = conn.pgconn
        loop = asyncio.get_running_loop()
        fd = pg.socket
        done = False
        try:
            pg.send_query(query)
            await _flush_async(loop, pg, fd)
            failed: pq.abc.PGresult | None = None
            while True:
                if pg.is_busy():
                    await _await_input_async(loop, pg, fd)
                    continue
                res = pg.get_result()
                if res is None:
                    _check_alive(pg)
                    if failed is not None:
                        raise psycopg.errors.error_from_result(failed, encoding=conn.info.encoding)
                    raise psycopg.ProgrammingError("the query did not start a COPY")
                if res.status == pq.ExecStatus.COPY_IN:
                    break
                if res.status not in _OK and failed is None:
                    failed = res
            cur = conn.cursor()
            cur.adapters.register_dumper(None, BytesBinaryDumper)
            try:
                # ends the COPY; raises its error
                async with psycopg.AsyncCopy(cur, binary=True,
                                             writer=AsyncCopyWriter(pg, conn.info.encoding)) as cp:
                    cp.set_types(types)
                    for r in rows:
                        await cp.write_row(r)
            finally:
                # the message's end (the implicit transaction's commit, or its rollback after an error):
                # then the connection can be used again
                while pg.status == pq.ConnStatus.OK:
                    if pg.is_busy():
                        await _await_input_async(loop, pg, fd)
                        continue
                    if pg.get_result() is None:
                        break
                done = True
        finally:
            if not done and not conn.closed:
                await conn.close()

    def _prepares(self, conn: psycopg.AsyncConnection[Any], statements: Sequence[Statement],
                  types: Sequence[int] | None) -> tuple[list[Send], list[bytes]]:
        s = self._session(conn)
        names = [st.name for st in statements if st.name not in s.prepared]
        sends: list[Send] = [functools.partial(_send_prepare, st.name, st.text, types)
                             for st in statements if st.name in names]
        return sends, names

    async def run(self, conn: psycopg.AsyncConnection[Any], steps: Sequence[Step], *,
                  types: Sequence[int] | None = None, formats: Sequence[int] | None = None,
                  notify: tuple[bytes, bytes] | None = None) -> list[pq.abc.PGresult]:
        """Run ``steps`` in one round trip, in order, in one transaction (``types``: parameter type oids
        for statements prepared now; ``formats``: the parameters' formats, default text); with
        ``notify`` (channel, payload), then ``pg_notify`` in a transaction of its own (after the steps
        committed; its result is dropped: a wake-up hint).
        Statements not prepared on ``conn`` yet are prepared in the same round trip. The results of the
        steps; the first error is raised after every result was read. Statements the server no longer
        holds are prepared again and the steps run once more."""
        s = self._session(conn)
        for attempt in (0, 1):
            prepares, names = self._prepares(conn, [st for st, _, _ in steps], types)
            batches: list[list[Send]] = [prepares] if prepares else []
            batches.append([functools.partial(_send_prepared, st.name, params, formats, fmt)
                            for st, params, fmt in steps])
            if notify is not None:
                batches.append([functools.partial(_send_notify, notify)])
            got = await self.exchange(conn, batches)
            if prepares:
                bad = next((r for r in got[0] if r.status != pq.ExecStatus.COMMAND_OK and
                            r.error_field(pq.DiagnosticField.SQLSTATE) != _DUPLICATE_PREPARED), None)
                if bad is not None:
                    raise psycopg.errors.error_from_result(bad, encoding=s.encoding)
                s.prepared.update(names)
            results = got[1 if prepares else 0]
            failed = next((r for r in results if r.status not in _OK), None)
            if failed is None:
                return results
            if attempt == 0 and failed.error_field(pq.DiagnosticField.SQLSTATE) == b"26000":
                self.forget(conn)
                continue
            raise psycopg.errors.error_from_result(failed, encoding=s.encoding)
        raise AssertionError("unreachable")  # pragma: no cover

    def rows(self, conn: psycopg.AsyncConnection[Any], res: pq.abc.PGresult) -> list[tuple[Any, ...]]:
        """The rows of ``res``, loaded by psycopg's loaders."""
        tx = self._session(conn).transformer
        tx.set_pgresult(res)
        return tx.load_rows(0, res.ntuples, tuple)

    def encoding(self, conn: psycopg.AsyncConnection[Any]) -> str:
        """The connection's encoding."""
        return self._session(conn).encoding


def _send_prepare(name: bytes, text: bytes, types: Sequence[int] | None, pg: pq.abc.PGconn) -> None:
    pg.send_prepare(name, text, types)


def _send_prepared(name: bytes, params: Sequence[bytes | None], formats: Sequence[int] | None, fmt: int,
                   pg: pq.abc.PGconn) -> None:
    pg.send_query_prepared(name, params, formats, fmt)


def _send_notify(notify: tuple[bytes, bytes], pg: pq.abc.PGconn) -> None:
    pg.send_query_params(_NOTIFY, notify)
