"""The asyncio :class:`AsyncDirect`: :class:`Statement` pipelines on psycopg async
connections, waiting for the server on the event loop."""

from __future__ import annotations

import asyncio
import functools
import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import psycopg
from psycopg import pq
from psycopg.types.string import BytesBinaryDumper

from .copywriters import AsyncCopyWriter
from .statements import DUPLICATE_PREPARED, NOTIFY, ConnectionStatements, Statement, Step
from .waits import OK, await_input_async, check_alive, flush_async

#: A message a batch of :meth:`AsyncDirect.exchange` sends (a callable given the libpq connection).
Send = Callable[[pq.abc.PGconn], None]


class AsyncDirect:
    """The asyncio twin of :class:`Direct`: :class:`Statement` pipelines on psycopg async connections,
    each statement prepared once per connection (or unnamed, on a connection that prepares nothing),
    waiting for the server on the event loop (one wake-up per round trip, without psycopg's query layer and
    its waiting generators). Use it only on a connection the caller holds alone (a pooled one), idle in
    autocommit mode."""

    def __init__(self) -> None:
        self._sessions: weakref.WeakKeyDictionary[psycopg.AsyncConnection[Any], ConnectionStatements] = (
            weakref.WeakKeyDictionary())

    def _session(self, conn: psycopg.AsyncConnection[Any]) -> ConnectionStatements:
        s = self._sessions.get(conn)
        if s is None:
            s = self._sessions[conn] = ConnectionStatements(conn)
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
            await flush_async(loop, pg, fd)
            i = 0
            while i < len(batches):
                if pg.is_busy():
                    await await_input_async(loop, pg, fd)
                    continue
                res = pg.get_result()
                if res is None:
                    check_alive(pg)
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
            await flush_async(loop, pg, fd)
            failed: pq.abc.PGresult | None = None
            while True:
                if pg.is_busy():
                    await await_input_async(loop, pg, fd)
                    continue
                res = pg.get_result()
                if res is None:
                    check_alive(pg)
                    if failed is not None:
                        raise psycopg.errors.error_from_result(failed, encoding=conn.info.encoding)
                    raise psycopg.ProgrammingError("the query did not start a COPY")
                if res.status == pq.ExecStatus.COPY_IN:
                    break
                if res.status not in OK and failed is None:
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
                        await await_input_async(loop, pg, fd)
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
        if not s.named:  # a connection that prepares nothing (behind a transaction pooler)
            return [], []
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
        Statements not prepared on ``conn`` yet are prepared in the same round trip; on a connection that
        prepares nothing (:func:`~.statements.prepares`) each runs as an unnamed statement. The results of
        the steps; the first error is raised after every result was read. Statements the server no longer
        holds are prepared again and the steps run once more."""
        s = self._session(conn)
        for attempt in (0, 1):
            prepares, names = self._prepares(conn, [st for st, _, _ in steps], types)
            batches: list[list[Send]] = [prepares] if prepares else []
            batches.append([functools.partial(_send_prepared, st.name, params, formats, fmt) if s.named
                            else functools.partial(_send_unnamed, st.text, params, types, formats, fmt)
                            for st, params, fmt in steps])
            if notify is not None:
                batches.append([functools.partial(_send_notify, notify)])
            got = await self.exchange(conn, batches)
            if prepares:
                bad = next((r for r in got[0] if r.status != pq.ExecStatus.COMMAND_OK and
                            r.error_field(pq.DiagnosticField.SQLSTATE) != DUPLICATE_PREPARED), None)
                if bad is not None:
                    raise psycopg.errors.error_from_result(bad, encoding=s.encoding)
                s.prepared.update(names)
            results = got[1 if prepares else 0]
            failed = next((r for r in results if r.status not in OK), None)
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


def _send_unnamed(text: bytes, params: Sequence[bytes | None], types: Sequence[int] | None,
                  formats: Sequence[int] | None, fmt: int, pg: pq.abc.PGconn) -> None:
    pg.send_query_params(text, params, types, formats, fmt)


def _send_notify(notify: tuple[bytes, bytes], pg: pq.abc.PGconn) -> None:
    pg.send_query_params(NOTIFY, notify)
