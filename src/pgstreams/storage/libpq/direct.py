"""The sync :class:`Direct`: :class:`~.statements.Statement` pipelines on psycopg connections, each
statement prepared once per connection, and the statement helpers built on the same waits."""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterable, Sequence
from typing import Any

import psycopg
from psycopg import pq
from psycopg.adapt import Transformer
from psycopg.types.string import BytesBinaryDumper

from .copywriters import CopyWriter
from .statements import DUPLICATE_PREPARED, NOTIFY, ConnectionStatements, Statement, Step
from .waits import OK, check_alive, flush, last_result, next_result, until_sync


def usable(conn: psycopg.Connection) -> bool:
    """Whether :meth:`Direct.pipeline` may run on ``conn``: in autocommit mode and not in a transaction (in a
    caller's transaction a failed statement would abort it, so nothing could be retried)."""
    return conn.autocommit and conn.pgconn.transaction_status == pq.TransactionStatus.IDLE



class Direct:
    """Runs :class:`Statement` pipelines on connections, preparing each statement once per connection, or,
    on a connection that prepares nothing (:func:`~.statements.prepares`: behind a transaction pooler),
    running each as an unnamed statement (parsed with every execution)."""

    def __init__(self) -> None:
        self._sessions: weakref.WeakKeyDictionary[psycopg.Connection, ConnectionStatements] = (
            weakref.WeakKeyDictionary())
        self._lock = threading.Lock()

    def _session(self, conn: psycopg.Connection) -> ConnectionStatements:
        with self._lock:
            s = self._sessions.get(conn)
            if s is None:
                s = self._sessions[conn] = ConnectionStatements(conn)
            return s

    def prepare(self, conn: psycopg.Connection, st: Statement, types: Sequence[int] | None = None) -> str:
        """Prepare ``st`` on ``conn`` unless done already (``types``: parameter type oids); the
        connection's encoding. On a connection that prepares nothing, only its ``types`` are recorded, for
        its unnamed executions."""
        s = self._session(conn)
        if not s.named:
            s.types[st.name] = types
            return s.encoding
        if st.name not in s.prepared:
            res = self.exec_prepare(conn.pgconn, st, types)
            # "already exists": the server kept it while this registry forgot it (after a statement that
            # some other one had gone, the registry forgets them all); the name carries the text's digest
            if res.status != pq.ExecStatus.COMMAND_OK and (
                    res.error_field(pq.DiagnosticField.SQLSTATE) != DUPLICATE_PREPARED):
                raise psycopg.errors.error_from_result(res, encoding=s.encoding)
            s.prepared.add(st.name)
        return s.encoding

    @staticmethod
    def exec_prepare(pg: pq.abc.PGconn, st: Statement, types: Sequence[int] | None = None) -> pq.abc.PGresult:
        """Prepare ``st`` (not registered: see :meth:`prepare`); its result."""
        pg.send_prepare(st.name, st.text, types)
        return last_result(pg)

    def send(self, conn: psycopg.Connection, st: Statement, params: Sequence[bytes | None],
             formats: Sequence[int] | None = None, result_format: int = 0) -> None:
        """Send the execution of ``st`` (prepared by :meth:`prepare`): by its name, or as an unnamed
        statement on a connection that prepares nothing."""
        s = self._session(conn)
        if s.named:
            conn.pgconn.send_query_prepared(st.name, params, formats, result_format)
        else:
            conn.pgconn.send_query_params(st.text, params, s.types.get(st.name), formats, result_format)

    def exec_prepared(self, conn: psycopg.Connection, st: Statement, params: Sequence[bytes | None],
                      formats: Sequence[int] | None = None, result_format: int = 0) -> pq.abc.PGresult:
        """Run ``st`` (prepared by :meth:`prepare`; as ``PQexecPrepared``, waiting through
        :func:`await_input`); its result."""
        self.send(conn, st, params, formats, result_format)
        return last_result(conn.pgconn)

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
            results = self._run(conn, steps)
            failed = next((r for r in results if r.status not in OK), None)
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
            results = until_sync(pg)
        finally:
            if pg.status == pq.ConnStatus.OK:
                pg.exit_pipeline_mode()
        first = results[0]
        if first.status not in OK:
            raise psycopg.errors.error_from_result(first, encoding=conn.info.encoding)
        if commit and results[1].status not in OK:
            raise psycopg.errors.error_from_result(results[1], encoding=conn.info.encoding)
        return [tuple(first.get_value(r, c) for c in range(first.nfields)) for r in range(first.ntuples)]

    def exec_then_notify(self, conn: psycopg.Connection, st: Statement, params: Sequence[bytes | None],
                         formats: Sequence[int], notify: tuple[bytes, bytes]) -> pq.abc.PGresult:
        """Run ``st`` (prepared by :meth:`prepare`; its own transaction, on an autocommit connection), then
        ``pg_notify(*notify)`` in a transaction of its own, after the first committed: one round trip (a
        libpq pipeline with a sync after each). Returns the statement's result; the notification's is
        dropped (a wake-up hint: consumers poll anyway)."""
        return self.exec_then(conn, st, params, formats, [(NOTIFY, notify)])[0]

    def exec_then(self, conn: psycopg.Connection, st: Statement, params: Sequence[bytes | None],
                  formats: Sequence[int], after: Sequence[tuple[bytes, Sequence[bytes | None]]]
                  ) -> list[pq.abc.PGresult]:
        """Run ``st`` (prepared by :meth:`prepare`; its own transaction, on an autocommit connection), then
        each query of ``after`` (text with ``$n`` placeholders, text parameters) in a transaction of its
        own, each after the one before committed: one round trip (a libpq pipeline with a sync after each).
        Returns the first result of each, ``st``'s first (a failed one's error result: the caller raises
        it)."""
        pg = conn.pgconn
        pg.enter_pipeline_mode()
        try:
            self.send(conn, st, params, formats)
            pg.pipeline_sync()
            for query, values in after:
                pg.send_query_params(query, values)
                pg.pipeline_sync()
            firsts: list[pq.abc.PGresult | None] = [None] * (len(after) + 1)
            syncs = 0
            while syncs < len(firsts):
                res = next_result(pg)
                if res is None:
                    check_alive(pg)
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
            while pg.status == pq.ConnStatus.OK and next_result(pg) is not None:
                pass

    def _run(self, conn: psycopg.Connection, steps: Sequence[Step]) -> list[pq.abc.PGresult]:
        pg = conn.pgconn
        pg.enter_pipeline_mode()
        try:
            for st, params, fmt in steps:
                self.send(conn, st, params, None, fmt)
            pg.pipeline_sync()
            results = until_sync(pg)
        finally:
            if pg.status == pq.ConnStatus.OK:
                pg.exit_pipeline_mode()
        return results


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
        flush(pg)
    except BaseException:
        conn.close()  # half a pipeline sent: no one may use it again
        raise


def collect_statements(conn: psycopg.Connection) -> list[list[tuple[Any, ...]]]:
    """The rows of each statement :func:`send_statements` sent on ``conn``; the first error is raised
    after every result was read."""
    pg = conn.pgconn
    try:
        results = until_sync(pg)
    finally:
        if pg.status == pq.ConnStatus.OK:
            pg.exit_pipeline_mode()
    failed = next((r for r in results if r.status not in OK), None)
    if failed is not None:
        raise psycopg.errors.error_from_result(failed, encoding=conn.info.encoding)
    tx = Transformer(conn)
    out = []
    for res in results:
        tx.set_pgresult(res)
        out.append(tx.load_rows(0, res.ntuples, tuple))
    return out



def exec_params(pg: pq.abc.PGconn, query: bytes, params: Sequence[bytes | None]) -> pq.abc.PGresult:
    """Run ``query`` with text ``params`` (as ``PQexecParams``, waiting through :func:`await_input`)."""
    pg.send_query_params(query, params)
    return last_result(pg)
