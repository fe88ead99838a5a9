"""The async executor and the async typed operations of the hot paths (publishing, polling, checkpoints,
topic lookups), for :mod:`pgstreams.aio`.

They run the same named queries as the sync :class:`~pgstreams.storage.Executor` (``core_query``), on
psycopg's async connections from a :class:`psycopg_pool.AsyncConnectionPool`, and map rows to the same
values; a poll sends the read fence and the read together (one round trip), like ``EventStore.poll``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

import psycopg
from psycopg import pq, sql
from psycopg.rows import RowFactory, dict_row, tuple_row
from psycopg.types.string import BytesBinaryDumper
from psycopg_pool import AsyncConnectionPool

from ..models import CommitOutcome
from .events import (
    _COPY_TYPES,
    EVENT_COLUMNS,
    EVENT_ID,
    PARTITION,
    Cursor,
    EventRow,
    StoredAt,
    TopicVersion,
    insert_params,
    insert_statement,
)
from .executor import Params, core_query
from .libpq import AsyncDirect, int_array, statement
from .naming import TopicTables
from .topics import TopicRecord, _record

if TYPE_CHECKING:
    from ..reconnect import AsyncReconnect

T = TypeVar("T")

#: The statements of a poll, as :meth:`pgstreams.storage.EventStore.poll_checked` sends them.
_POLL = ("load_fences", "poll_checked")


def _direct_ok(conn: psycopg.AsyncConnection[Any]) -> bool:
    """Whether statements may go straight through libpq on ``conn``: autocommit and idle (in a caller's
    transaction a failed statement would abort it, so psycopg's own path runs there)."""
    return conn.autocommit and conn.pgconn.transaction_status == pq.TransactionStatus.IDLE


class AsyncExecutor:
    """Runs core queries of ``schema`` on connections of ``pool`` (autocommit) or on one the caller
    passes (possibly inside its transaction): the async twin of :class:`~pgstreams.storage.Executor`.
    With ``retry`` (a :class:`pgstreams.reconnect.AsyncReconnect`), a call on a pooled connection that
    fails with a retriable error runs again on a fresh one."""

    def __init__(self, pool: AsyncConnectionPool, schema: str, retry: AsyncReconnect | None = None) -> None:
        self.pool = pool
        self.schema = schema
        self.retry = retry

    def query(self, name: str, topic_id: int | None = None) -> sql.Composed:
        """Core query ``name`` rendered for this schema (and topic)."""
        return core_query(name, self.schema, topic_id)

    def tables(self, topic_id: int) -> TopicTables:
        """The storage names of a topic in this schema."""
        return TopicTables(self.schema, topic_id)

    @asynccontextmanager
    async def connection(self, conn: psycopg.AsyncConnection | None = None
                         ) -> AsyncIterator[psycopg.AsyncConnection]:
        """``conn`` if given, else a pooled autocommit connection for the block."""
        if conn is not None:
            yield conn
            return
        async with self.pool.connection() as pooled:
            yield pooled

    async def pooled(self, fn: Callable[[psycopg.AsyncConnection], Awaitable[T]]) -> T:
        """``await fn(conn)`` on a pooled connection; with a retry rule, run again on fresh connections after
        a retriable failure (so ``fn`` must be safe to run again)."""
        if self.retry is not None:
            return await self.retry.pooled(fn)
        async with self.pool.connection() as c:
            return await fn(c)

    async def one(self, name: str, params: Params = None, *, conn: psycopg.AsyncConnection | None = None,
                  topic_id: int | None = None, row: RowFactory[Any] = tuple_row) -> Any:
        """The first row of query ``name`` (``None`` when there is none). On a pooled connection (no
        ``conn``) retried as by :meth:`pooled`."""
        query = self.query(name, topic_id)

        async def go(c: psycopg.AsyncConnection) -> Any:
            cur = c.cursor(row_factory=row)
            await cur.execute(query, params)
            return await cur.fetchone()

        return await (go(conn) if conn is not None else self.pooled(go))

    async def all(self, name: str, params: Params = None, *, conn: psycopg.AsyncConnection | None = None,
                  topic_id: int | None = None, row: RowFactory[Any] = tuple_row) -> list[Any]:
        """Every row of query ``name`` (retried as :meth:`one`)."""
        query = self.query(name, topic_id)

        async def go(c: psycopg.AsyncConnection) -> list[Any]:
            cur = c.cursor(row_factory=row)
            await cur.execute(query, params)
            return await cur.fetchall()

        return await (go(conn) if conn is not None else self.pooled(go))

    async def run(self, name: str, params: Params = None, *, conn: psycopg.AsyncConnection | None = None,
                  topic_id: int | None = None) -> int:
        """Run query ``name`` for its effect; return the number of rows it affected (retried as
        :meth:`one`)."""
        query = self.query(name, topic_id)

        async def go(c: psycopg.AsyncConnection) -> int:
            cur = await c.execute(query, params)
            return cur.rowcount

        return await (go(conn) if conn is not None else self.pooled(go))


class AsyncStore:
    """The async operations of one schema over one :class:`AsyncExecutor` (``retry``: its retry rule on
    pooled connections)."""

    def __init__(self, pool: AsyncConnectionPool, schema: str, retry: AsyncReconnect | None = None) -> None:
        self.executor = self.ex = AsyncExecutor(pool, schema, retry)
        self.schema = schema
        self._direct = AsyncDirect()

    # -- topics ------------------------------------------------------------------------------------------
    async def topic(self, name: str, conn: psycopg.AsyncConnection | None = None) -> TopicRecord | None:
        """The topic named ``name``, ``None`` if there is none."""
        params = {"name": name, "schema": self.schema}
        row = await self.ex.one("topic_by_name", params, conn=conn, row=dict_row)
        return None if row is None else _record(row)

    async def topic_version(self, topic_id: int) -> TopicVersion | None:
        """The partition count and configuration of topic ``topic_id`` now (``None``: no such topic)."""
        row = await self.ex.one("topic_version", (topic_id,))
        return None if row is None else TopicVersion.of(*row)

    async def ensure_segments(self, topic_id: int, until: int, conn: psycopg.AsyncConnection | None = None
                              ) -> int:
        """Make segments cover positions up to ``until``; the first position no segment covers after."""
        row = await self.ex.one("ensure_segments", (topic_id, until), conn=conn, topic_id=topic_id)
        return int(row[0]) if row and row[0] else 0

    async def last_position(self, topic_id: int, conn: psycopg.AsyncConnection | None = None) -> int:
        """The last position the topic's sequence handed out (0 before any)."""
        row = await self.ex.one("sequence_last_value", conn=conn, topic_id=topic_id)
        return int(row[0]) if row else 0

    async def analyze_segment(self, topic_id: int, position: int,
                              conn: psycopg.AsyncConnection | None = None) -> bool:
        """Give the segment holding ``position`` statistics; whether it is done for that segment."""
        row = await self.ex.one("analyze_segment", (topic_id, position), conn=conn)
        return row is None or bool(row[0])

    # -- writing -----------------------------------------------------------------------------------------
    async def insert(self, conn: psycopg.AsyncConnection, topic_id: int, row: EventRow) -> StoredAt:
        """Insert one event on ``conn`` (its own transaction in autocommit, else the caller's)."""
        if row[EVENT_ID] is not None:
            params: dict[str, Any] = dict(zip(EVENT_COLUMNS, row, strict=True))
            params["topic_id"] = topic_id
            got = await self.ex.one("insert_event_idempotent", params, conn=conn, topic_id=topic_id)
            if got is not None:
                return StoredAt(row[PARTITION], int(got[0]))
            prev = await self.ex.one("existing_event_id", (topic_id, row[EVENT_ID]), conn=conn)
            if prev is None:  # pragma: no cover - the conflicting row vanished (topic recreated)
                raise psycopg.errors.UndefinedTable("the topic changed while publishing")
            return StoredAt(int(prev[0]), int(prev[1]), duplicate=True)
        cur = await conn.execute(self.ex.query("insert_event", topic_id), (row[0], *row), prepare=True)
        got = await cur.fetchone()
        assert got is not None
        return StoredAt(row[PARTITION], int(got[0]))

    async def insert_pooled(self, conn: psycopg.AsyncConnection, topic_id: int, row: EventRow,
                            notify: tuple[str, str] | None = None) -> StoredAt:
        """Insert one event on a pooled autocommit connection (its own transaction), as
        ``EventStore.insert_pooled``: an event without id straight through libpq, with ``notify``
        (channel, payload) sent after its commit in the same round trip."""
        if row[EVENT_ID] is not None or not _direct_ok(conn):
            stored = await self.insert(conn, topic_id, row)
            if notify is not None:
                await self.notify(*notify, conn)
            return stored
        enc = self._direct.encoding(conn)
        ins = insert_statement(self.schema, topic_id, row)
        params = insert_params(row, enc, ins)
        res = await self._direct.run(
            conn, [(ins.statement, params, 0)], types=ins.oids, formats=ins.formats,
            notify=None if notify is None else (notify[0].encode(enc), notify[1].encode(enc)))
        return StoredAt(row[PARTITION], int(res[0].get_value(0, 0)))  # type: ignore[arg-type]

    async def copy(self, conn: psycopg.AsyncConnection, topic_id: int, rows: Sequence[EventRow],
                   has_ids: bool) -> int:
        """Store ``rows`` in one transaction with COPY (as ``EventStore.copy``); how many were stored."""
        partitions = sorted({r[PARTITION] for r in rows})
        if not has_ids and _direct_ok(conn):
            # the registration and the COPY in one message: one implicit transaction, one round trip
            fence = statement("join_fence", self.ex.schema, topic_id).text.replace(
                b"$1", b"'" + int_array(partitions) + b"'")
            copy = statement("copy_events_tagged", self.ex.schema, topic_id).text
            await self._direct.copy_in(conn, fence.rstrip().rstrip(b";") + b"; " + copy, _COPY_TYPES, rows)
            return len(rows)
        async with conn.transaction():
            await self.ex.run("join_fence", (partitions,), conn=conn, topic_id=topic_id)
            cur = conn.cursor()
            if not has_ids:
                cur.adapters.register_dumper(None, BytesBinaryDumper)  # as EventStore.copy
                async with cur.copy(self.ex.query("copy_events_tagged", topic_id)) as cp:
                    cp.set_types(list(_COPY_TYPES))
                    for r in rows:
                        await cp.write_row(r)
                return len(rows)
            await cur.execute(self.ex.query("staging_table"))
            async with cur.copy(self.ex.query("copy_staging_tagged")) as cp:
                for i, r in enumerate(rows):
                    await cp.write_row((i, *r))
            await self.ex.run("join_fence_staged", conn=conn, topic_id=topic_id)
            cur = await conn.execute(self.ex.query("insert_staged", topic_id),
                                     {"topic_id": topic_id,
                                      "seq": self.ex.tables(topic_id).sequence_regclass})
            return cur.rowcount

    # -- retried publishes (as EventStore's) -------------------------------------------------------------
    async def session_busy(self, conn: psycopg.AsyncConnection, pid: int) -> bool:
        """Whether the role's session ``pid`` may still be running a statement or transaction."""
        row = await self.ex.one("session_busy", (pid,), conn=conn)
        return bool(row and row[0])

    async def produced(self, conn: psycopg.AsyncConnection, topic_id: int, partitions: Sequence[int],
                       floor: int, producer: int) -> StoredAt | None:
        """Where an event tagged ``producer`` is stored in ``partitions`` above position ``floor`` (the
        lowest such event when several are), ``None`` if nowhere."""
        row = await self.ex.one("produced", {"partitions": list(partitions), "floor": floor,
                                             "producer": producer}, conn=conn, topic_id=topic_id)
        return None if row is None else StoredAt(int(row[0]), int(row[1]))

    async def count_produced(self, conn: psycopg.AsyncConnection, topic_id: int, partitions: Sequence[int],
                             floor: int, producer: int) -> int:
        """How many events tagged ``producer`` ``partitions`` hold above position ``floor``."""
        row = await self.ex.one("count_produced", {"partitions": list(partitions), "floor": floor,
                                                   "producer": producer}, conn=conn, topic_id=topic_id)
        return int(row[0]) if row else 0

    async def notify(self, channel: str, payload: str, conn: psycopg.AsyncConnection | None = None) -> None:
        """Send a notification (delivered when its transaction commits)."""
        await self.ex.one("notify", (channel, payload), conn=conn)

    # -- reading -----------------------------------------------------------------------------------------
    async def fences(self, conn: psycopg.AsyncConnection, topic_id: int, partitions: Sequence[int]
                     ) -> dict[int, int]:
        """The read fence of each partition (see ``EventStore.fences``)."""
        ps = list(partitions)
        row = await self.ex.one("fences", (ps,), conn=conn, topic_id=topic_id)
        assert row is not None
        return dict(zip(ps, (int(f) for f in row[0]), strict=True))

    async def time_cursors(self, conn: psycopg.AsyncConnection, topic_id: int, fences: Mapping[int, int],
                           at: datetime) -> dict[int, Cursor]:
        """Per partition, the cursor before its first event below its fence created at or after ``at``."""
        ps = sorted(fences)
        rows = await self.ex.all("time_cursors", (ps, [fences[p] for p in ps], at), conn=conn,
                                 topic_id=topic_id)
        return {int(p): (fences[p] if pos is None else int(pos)) - 1 for p, pos in rows}

    async def poll_checked(self, conn: psycopg.AsyncConnection, topic_id: int, params: dict[str, Any]
                           ) -> tuple[list[tuple[Any, ...]], list[tuple[int, ...]], int]:
        """The rows of a poll below the partitions' read fences, the removed segments after the cursors and
        the topic's partition count, as ``EventStore.poll_checked``: the fences and the read (with its
        trailer row) are sent together (one round trip; the read's snapshot is newer than the fences);
        the removed segments are read only when the trailer says there are some."""
        if _direct_ok(conn):
            return await self._poll_direct(conn, topic_id, params)
        curs = []
        async with conn.pipeline():
            for q in _POLL:
                cur = conn.cursor(binary=q == "poll_checked")
                await cur.execute(self.ex.query(q, topic_id), params, prepare=True)
                curs.append(cur)
        rows = await curs[1].fetchall()
        trailer = rows.pop()
        removed: list[tuple[int, ...]] = []
        if trailer[2]:
            cur = await conn.execute(self.ex.query("removed_after_cursors", topic_id), params, prepare=True)
            removed = await cur.fetchall()
        return rows, removed, int(trailer[1] or 0)

    async def _poll_direct(self, conn: psycopg.AsyncConnection, topic_id: int, params: dict[str, Any]
                           ) -> tuple[list[tuple[Any, ...]], list[tuple[int, ...]], int]:
        """:meth:`poll_checked` straight through libpq, as ``EventStore._poll``: the generic-plan setting,
        the fences and the read in one round trip."""
        text = {"partitions": int_array(params["partitions"]), "positions": int_array(params["positions"]),
                "limit": b"%d" % params["limit"], "total": b"%d" % params["total"]}
        steps = []
        for q in ("generic_plans", *_POLL):
            st = statement(q, self.schema, topic_id)
            steps.append((st, [text[n] for n in st.params], 1 if q == "poll_checked" else 0))
        results = await self._direct.run(conn, steps)
        rows = self._direct.rows(conn, results[2])
        trailer = rows.pop()
        removed: list[tuple[int, ...]] = []
        if trailer[2]:
            cur = await conn.execute(self.ex.query("removed_after_cursors", topic_id), params, prepare=True)
            removed = await cur.fetchall()
        return rows, removed, int(trailer[1] or 0)

    # -- checkpoints -------------------------------------------------------------------------------------
    async def load_checkpoints(self, conn: psycopg.AsyncConnection, group: str, topic_id: int,
                               partitions: Sequence[int]) -> dict[int, Cursor]:
        """The checkpoints of ``group`` on these partitions (partitions without one are absent)."""
        rows = await self.ex.all("load_checkpoints", (group, topic_id, list(partitions)), conn=conn)
        return {int(p): int(pos) for p, pos in rows}

    async def create_checkpoints(self, conn: psycopg.AsyncConnection, group: str, topic_id: int,
                                 starts: Mapping[int, Cursor]) -> None:
        """Create the checkpoints of ``starts`` that do not exist yet (existing ones win)."""
        ps = sorted(starts)
        await self.ex.run("init_checkpoints", (group, topic_id, ps, [starts[p] for p in ps]), conn=conn)

    async def store_checkpoints(self, conn: psycopg.AsyncConnection, group: str, topic_id: int,
                                targets: Mapping[int, Cursor], expected: Mapping[int, Cursor],
                                durable: bool = True) -> dict[int, CommitOutcome]:
        """Store ``targets`` given the ``expected`` previous checkpoints; per partition, what happened.
        ``durable=False`` on an idle autocommit connection: the commit does not wait for its flush."""
        ps = sorted(targets)
        direct = _direct_ok(conn)
        lazy = "" if durable or not direct else "_lazy"
        if direct:  # straight through libpq, one round trip
            st = statement("store_checkpoints" + lazy, self.schema)
            args = [group.encode(self._direct.encoding(conn)), b"%d" % topic_id, int_array(ps),
                    int_array([targets[p] for p in ps]), int_array([expected[p] for p in ps])]
            res = await self._direct.run(conn, [(st, args, 0)])
            return {int(p): CommitOutcome(code) for p, code in self._direct.rows(conn, res[0])}
        rows = await self.ex.all("store_checkpoints" + lazy, (group, topic_id, ps, [targets[p] for p in ps],
                                                      [expected[p] for p in ps]), conn=conn)
        return {int(p): CommitOutcome(code) for p, code in rows}

    async def seek_checkpoints(self, conn: psycopg.AsyncConnection, group: str, topic_id: int,
                               cursors: Mapping[int, Cursor]) -> None:
        """Set the checkpoints to ``cursors`` (they may move backwards)."""
        ps = sorted(cursors)
        await self.ex.run("seek_checkpoints", (group, topic_id, ps, [cursors[p] for p in ps]), conn=conn)


__all__ = ["AsyncExecutor", "AsyncStore"]
