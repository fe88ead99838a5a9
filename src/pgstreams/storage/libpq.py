"""Hot statements run straight through libpq: prepared once per connection, sent in one pipeline.

psycopg's query layer (rendering a composed query, converting ``%(name)s`` placeholders, adapting lists,
its pipeline bookkeeping) costs several times the client CPU of the round trip it serves on the hottest
paths (a poll that finds a few events, a single publish). Here a statement is rendered once, its
placeholders become ``$n``, its parameters are sent as text, and its rows are loaded by psycopg's own
(compiled) loaders through a :class:`psycopg.adapt.Transformer`.
"""

from __future__ import annotations

import functools
import hashlib
import re
import threading
import weakref
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import pq
from psycopg.adapt import Transformer
from psycopg.types.string import BytesBinaryDumper

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
    text = core_query(query, schema, topic_id).as_bytes(None)
    if b"%s" in text:
        parts = text.split(b"%s")
        text = parts[0] + b"".join(b"$%d" % i + part for i, part in enumerate(parts[1:], 1))
        digest = hashlib.sha1(text).hexdigest()[:16]
        return Statement(f"pgstreams_{query}_{digest}".encode(), text, ())
    names: list[str] = []

    def number(m: re.Match[bytes]) -> bytes:
        name = m.group(1).decode()
        if name not in names:
            names.append(name)
        return b"$%d" % (names.index(name) + 1)

    text = _NAMED.sub(number, text)
    digest = hashlib.sha1(text).hexdigest()[:16]
    return Statement(f"pgstreams_{query}_{digest}".encode(), text, tuple(names))


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
            res = conn.pgconn.prepare(st.name, st.text, types)
            # "already exists": the server kept it while this registry forgot it (after a statement that
            # some other one had gone, the registry forgets them all); the name carries the text's digest
            if res.status != pq.ExecStatus.COMMAND_OK and (
                    res.error_field(pq.DiagnosticField.SQLSTATE) != _DUPLICATE_PREPARED):
                raise psycopg.errors.error_from_result(res, encoding=s.encoding)
            s.prepared.add(st.name)
        return s.encoding

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
    def exec_then_notify(conn: psycopg.Connection, st: Statement, params: Sequence[bytes | None],
                         formats: Sequence[int], notify: tuple[bytes, bytes]) -> pq.abc.PGresult:
        """Run prepared ``st`` (its own transaction, on an autocommit connection), then
        ``pg_notify(*notify)`` in a transaction of its own, after the first committed: one round trip (a
        libpq pipeline with a sync after each). Returns the statement's result; the notification's is
        dropped (a wake-up hint: consumers poll anyway)."""
        pg = conn.pgconn
        pg.enter_pipeline_mode()
        try:
            pg.send_query_prepared(st.name, params, formats)
            pg.pipeline_sync()
            pg.send_query_params(_NOTIFY, notify)
            pg.pipeline_sync()
            first: pq.abc.PGresult | None = None
            syncs = 0
            while syncs < 2:
                res = pg.get_result()
                if res is None:
                    _check_alive(pg)
                    continue
                if res.status == pq.ExecStatus.PIPELINE_SYNC:
                    syncs += 1
                elif first is None:
                    first = res
        finally:
            if pg.status == pq.ConnStatus.OK:
                pg.exit_pipeline_mode()
        assert first is not None
        return first

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
        failed: pq.abc.PGresult | None = None
        while True:
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
        # by oid, bytea would get the (Python) dumper of psycopg.Binary: use the C one for bytes
        cur.adapters.register_dumper(None, BytesBinaryDumper)
        try:
            with psycopg.Copy(cur, binary=True) as cp:  # ends the COPY; raises its error
                cp.set_types(types)
                for r in rows:
                    cp.write_row(r)
        finally:
            # the message's end (the implicit transaction's commit, or its rollback after an error)
            while pg.status == pq.ConnStatus.OK and pg.get_result() is not None:
                pass

    @staticmethod
    def _run(pg: pq.abc.PGconn, steps: Sequence[Step]) -> list[pq.abc.PGresult]:
        pg.enter_pipeline_mode()
        try:
            for st, params, fmt in steps:
                pg.send_query_prepared(st.name, params, None, fmt)
            pg.pipeline_sync()
            results: list[pq.abc.PGresult] = []
            while True:
                res = pg.get_result()
                if res is None:
                    _check_alive(pg)
                    continue
                if res.status == pq.ExecStatus.PIPELINE_SYNC:
                    break
                results.append(res)
        finally:
            if pg.status == pq.ConnStatus.OK:
                pg.exit_pipeline_mode()
        return results
