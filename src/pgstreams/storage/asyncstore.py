"""The async executor and the async typed operations of the hot paths (publishing, polling, checkpoints,
topic lookups), for :mod:`pgstreams.aio`.

They run the very statements of the sync stores, on psycopg's async connections from a
:class:`psycopg_pool.AsyncConnectionPool`: the :class:`~pgstreams.storage.calls.Call` values the sync
stores define (:mod:`.events`, :mod:`.checkpoints`, :mod:`.topics`), through :meth:`AsyncExecutor.perform`,
and, on the hot paths that go straight through libpq, the statements and parameters their functions
build and the readings of their results (:func:`~.events.poll_steps`, :func:`~.events.split_trailer`,
:func:`~.events.copy_message`, :func:`~.checkpoints.store_args`, ...). Only the waiting is the asyncio
store's own. A poll sends the read fence and the read together (one round trip), like
``EventStore.poll``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

import psycopg
from psycopg import pq, sql
from psycopg.rows import RowFactory, tuple_row
from psycopg.types.string import BytesBinaryDumper
from psycopg_pool import AsyncConnectionPool

from ..models import CommitOutcome
from ..pooler import DEFAULT_POOLER, Pooler
from .arrays import column_arrays
from .calls import ALL, ONE, Call, Steps
from .checkpoints import (
    init_checkpoints_call,
    lazy_commit,
    load_checkpoints_call,
    missing_checkpoints,
    outcomes_of,
    seek_checkpoints_call,
    store_args,
    store_query,
)
from .events import (
    BINARY_QUERIES,
    COPY_TYPES,
    EVENT_COLUMNS,
    EVENT_ID,
    INSERT_MANY_TYPES,
    PARTITION,
    POLL_CHECKED,
    POLL_FENCED,
    Cursor,
    EventRow,
    StoredAt,
    TopicVersion,
    copy_message,
    count_produced_call,
    existing_event_call,
    fences_call,
    fences_query,
    idle_autocommit,
    insert_params,
    insert_statement,
    insert_with_id_call,
    join_fence_call,
    notify_call,
    poll_steps,
    produced_call,
    session_busy_call,
    split_trailer,
    staging_table,
    time_cursors_call,
    topic_version_call,
)
from .executor import Params, core_query
from .libpq import AsyncDirect, int_array, statement
from .naming import TopicTables
from .topics import (
    Segments,
    TopicRecord,
    analyze_segment_call,
    ensure_segments_call,
    last_position_call,
    topic_call,
)

if TYPE_CHECKING:
    from ..reconnect import AsyncReconnect

T = TypeVar("T")

#: Whether statements may go straight through libpq on an async connection (the sync store's rule).
_direct_ok = idle_autocommit


class AsyncExecutor:
    """Runs core queries of ``schema`` on connections of ``pool`` (autocommit) or on one the caller
    passes (possibly inside its transaction): the async twin of :class:`~pgstreams.storage.Executor`.
    With ``retry`` (a :class:`pgstreams.reconnect.AsyncReconnect`), a call on a pooled connection that
    fails with a retriable error runs again on a fresh one. ``pooler``: as for the sync executor."""

    def __init__(self, pool: AsyncConnectionPool, schema: str, retry: AsyncReconnect | None = None, *,
                 pooler: Pooler = DEFAULT_POOLER) -> None:
        self.pool = pool
        self.schema = schema
        self.retry = retry
        self.pooler: Pooler = pooler

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
                  topic_id: int | None = None, prepare: bool | None = None) -> int:
        """Run query ``name`` for its effect; return the number of rows it affected (retried as
        :meth:`one`)."""
        query = self.query(name, topic_id)

        async def go(c: psycopg.AsyncConnection) -> int:
            cur = await c.execute(query, params, prepare=prepare)
            return cur.rowcount

        return await (go(conn) if conn is not None else self.pooled(go))

    async def perform(self, call: Call[T], conn: psycopg.AsyncConnection | None = None) -> T:
        """Run ``call`` (see :mod:`pgstreams.storage.calls`) on ``conn`` (default: a pooled connection,
        retried as :meth:`one`) and return its value: what :func:`pgstreams.storage.calls.perform` does
        with a sync executor."""
        query = self.query(call.query, call.topic_id)
        params, fetch, row, prepare = call.params, call.fetch, call.row, call.prepare

        async def go(c: psycopg.AsyncConnection) -> Any:
            if fetch == ONE:
                cur = c.cursor(row_factory=row)
                await cur.execute(query, params, prepare=prepare)
                return await cur.fetchone()
            if fetch == ALL:
                cur = c.cursor(row_factory=row)
                await cur.execute(query, params, prepare=prepare)
                return await cur.fetchall()
            return (await c.execute(query, params, prepare=prepare)).rowcount

        return call.read(await (go(conn) if conn is not None else self.pooled(go)))

    async def perform_steps(self, steps: Steps[T], conn: psycopg.AsyncConnection) -> T:
        """Run the procedure ``steps`` on ``conn``: each call it yields, its result sent back (as
        :func:`pgstreams.storage.calls.perform_steps`)."""
        result: Any = None
        while True:
            try:
                call = steps.send(result)
            except StopIteration as done:
                return done.value
            result = await self.perform(call, conn)


class AsyncStore:
    """The async operations of one schema over one :class:`AsyncExecutor` (``retry``: its retry rule on
    pooled connections; ``pooler``: see :class:`AsyncExecutor`)."""

    def __init__(self, pool: AsyncConnectionPool, schema: str, retry: AsyncReconnect | None = None, *,
                 pooler: Pooler = DEFAULT_POOLER) -> None:
        self.executor = self.ex = AsyncExecutor(pool, schema, retry, pooler=pooler)
        self.schema = schema
        self._direct = AsyncDirect()

    # -- topics ------------------------------------------------------------------------------------------
    async def topic(self, name: str, conn: psycopg.AsyncConnection | None = None) -> TopicRecord | None:
        """The topic named ``name``, ``None`` if there is none."""
        return await self.ex.perform(topic_call(self.schema, name), conn)

    async def topic_version(self, topic_id: int) -> TopicVersion | None:
        """The partition count and configuration of topic ``topic_id`` now (``None``: no such topic)."""
        return await self.ex.perform(topic_version_call(topic_id))

    async def last_position(self, topic_id: int, conn: psycopg.AsyncConnection | None = None) -> int:
        """The last position the topic's sequence handed out (0 before any)."""
        return await self.ex.perform(last_position_call(topic_id), conn)

    async def ensure_room(self, segments: Segments, position: int, conn: psycopg.AsyncConnection | None = None
                          ) -> None:
        """:meth:`Segments.ensure_room <pgstreams.storage.Segments.ensure_room>`: make sure at least one
        empty segment lies beyond ``position``."""
        until = segments.room_until(position)
        if until:
            segments.room_made(await self.ex.perform(ensure_segments_call(segments.topic_id, until), conn))

    async def ensure_room_after(self, segments: Segments, count: int,
                                conn: psycopg.AsyncConnection | None = None) -> int:
        """:meth:`Segments.ensure_room_after <pgstreams.storage.Segments.ensure_room_after>`: room for
        ``count`` more positions after the last one handed out; return that last position."""
        last = await self.last_position(segments.topic_id, conn)
        await self.ensure_room(segments, last + count, conn)
        return last

    async def check_stats(self, segments: Segments, position: int, conn: psycopg.AsyncConnection | None = None
                          ) -> None:
        """:meth:`Segments.check_stats <pgstreams.storage.Segments.check_stats>`: make sure the segment
        holding ``position`` has column statistics."""
        if not segments.stats_due(position):
            return
        try:
            done = await self.ex.perform(analyze_segment_call(segments.topic_id, position), conn)
        except psycopg.errors.UndefinedFunction:  # a schema migrated before the function existed
            done = True
        segments.stats_checked(position, done)

    # -- writing -----------------------------------------------------------------------------------------
    async def insert(self, conn: psycopg.AsyncConnection, topic_id: int, row: EventRow) -> StoredAt:
        """Insert one event on ``conn`` (its own transaction in autocommit, else the caller's)."""
        if row[EVENT_ID] is not None:
            stored = await self.ex.perform(insert_with_id_call(topic_id, row), conn)
            return stored if stored is not None else await self.ex.perform(existing_event_call(topic_id, row),
                                                                          conn)
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
            message = copy_message(self.schema, topic_id, partitions)
            await self._direct.copy_in(conn, message, COPY_TYPES, rows)
            return len(rows)
        async with conn.transaction():
            await self.ex.perform(join_fence_call(topic_id, partitions), conn)
            cur = conn.cursor()
            if not has_ids:
                cur.adapters.register_dumper(None, BytesBinaryDumper)  # as EventStore.copy
                async with cur.copy(self.ex.query("copy_events_tagged", topic_id)) as cp:
                    cp.set_types(list(COPY_TYPES))
                    for r in rows:
                        await cp.write_row(r)
                return len(rows)
            await cur.execute(self.ex.query(staging_table(self.ex.pooler)))
            async with cur.copy(self.ex.query("copy_staging_tagged")) as cp:
                for i, r in enumerate(rows):
                    await cp.write_row((i, *r))
            await self.ex.run("join_fence_staged", conn=conn, topic_id=topic_id)
            cur = await conn.execute(self.ex.query("insert_staged", topic_id),
                                     {"topic_id": topic_id,
                                      "seq": self.ex.tables(topic_id).sequence_regclass})
            return cur.rowcount

    # -- retried publishes (as EventStore's) -------------------------------------------------------------
    async def insert_returning(self, conn: psycopg.AsyncConnection,
                               batches: Sequence[tuple[int, Sequence[EventRow]]], finish: Sequence[str] = ()
                               ) -> list[dict[int, list[int]]]:
        """Store the ``rows`` of each ``(topic id, rows)`` of ``batches`` (events without ids) in a
        transaction on ``conn``: the caller's, or one opened now (``BEGIN``) when ``conn`` is idle; each
        topic's registration as the publisher of its partitions and a multi-row insert, then the
        statements of ``finish`` (complete SQL, e.g. ``COMMIT``), all in one pipeline: one round trip.
        Returns per batch the positions stored in each partition, in order. ``conn``: autocommit, held
        alone; after a failure its transaction is left failed, for the caller to roll back."""
        cursors = []
        async with conn.pipeline():
            if conn.info.transaction_status == pq.TransactionStatus.IDLE:
                await conn.execute("BEGIN")
            for topic_id, rows in batches:
                partitions = sorted({r[PARTITION] for r in rows})
                await conn.execute(self.ex.query("join_fence", topic_id), (partitions,), prepare=True)
                columns = column_arrays(rows, EVENT_COLUMNS, INSERT_MANY_TYPES, conn.info.encoding)
                cursors.append(await conn.execute(self.ex.query("insert_many_returning", topic_id), columns,
                                                   binary=True))
            for statement_text in finish:
                await conn.execute(statement_text.encode())
        out: list[dict[int, list[int]]] = []
        for cur in cursors:
            stored: dict[int, list[int]] = {}
            for partition, position in await cur.fetchall():
                stored.setdefault(int(partition), []).append(int(position))
            for positions in stored.values():
                positions.sort()
            out.append(stored)
        return out

    async def session_busy(self, conn: psycopg.AsyncConnection, pid: int) -> bool:
        """Whether the role's session ``pid`` may still be running a statement or transaction."""
        return await self.ex.perform(session_busy_call(pid), conn)

    async def produced(self, conn: psycopg.AsyncConnection, topic_id: int, partitions: Sequence[int],
                       floor: int, producer: int) -> StoredAt | None:
        """Where an event tagged ``producer`` is stored in ``partitions`` above position ``floor`` (the
        lowest such event when several are), ``None`` if nowhere."""
        return await self.ex.perform(produced_call(topic_id, partitions, floor, producer), conn)

    async def count_produced(self, conn: psycopg.AsyncConnection, topic_id: int, partitions: Sequence[int],
                             floor: int, producer: int) -> int:
        """How many events tagged ``producer`` ``partitions`` hold above position ``floor``."""
        return await self.ex.perform(count_produced_call(topic_id, partitions, floor, producer), conn)

    async def notify(self, channel: str, payload: str, conn: psycopg.AsyncConnection | None = None) -> None:
        """Send a notification (delivered when its transaction commits)."""
        await self.ex.perform(notify_call(channel, payload), conn)

    # -- reading -----------------------------------------------------------------------------------------
    async def fences(self, conn: psycopg.AsyncConnection, topic_id: int, partitions: Sequence[int]
                     ) -> dict[int, int]:
        """The read fence of each partition (see ``EventStore.fences``)."""
        return await self.ex.perform(fences_call(topic_id, partitions), conn)

    async def time_cursors(self, conn: psycopg.AsyncConnection, topic_id: int, fences: Mapping[int, int],
                           at: datetime) -> dict[int, Cursor]:
        """Per partition, the cursor before its first event below its fence created at or after ``at``."""
        return await self.ex.perform(time_cursors_call(topic_id, fences, at), conn)

    async def poll_checked(self, conn: psycopg.AsyncConnection, topic_id: int, params: dict[str, Any]
                           ) -> tuple[list[tuple[Any, ...]], list[tuple[int, ...]], int]:
        """The rows of a poll below the partitions' read fences, the removed segments after the cursors and
        the topic's partition count, as ``EventStore.poll_checked``: the fences and the read (with its
        trailer row) are sent together (one round trip; the read's snapshot is newer than the fences);
        the removed segments are read only when the trailer says there are some."""
        got, _ = await self._poll(conn, topic_id, params, POLL_CHECKED)
        rows, removed_after, partitions = split_trailer(got)
        removed: list[tuple[int, ...]] = []
        if removed_after:
            cur = await conn.execute(self.ex.query("removed_after_cursors", topic_id), params, prepare=True)
            removed = await cur.fetchall()
        return rows, removed, partitions

    async def poll_fenced(self, conn: psycopg.AsyncConnection, topic_id: int, params: dict[str, Any]
                          ) -> tuple[list[tuple[Any, ...]], dict[int, int]]:
        """The rows of a poll below the partitions' read fences (as :meth:`poll_checked`, without the
        removed segments) and those fences, per partition: one round trip."""
        got, fences = await self._poll(conn, topic_id, params, POLL_FENCED)
        rows, _removed_after, _partitions = split_trailer(got)
        return rows, dict(zip(params["partitions"], fences, strict=True))

    async def _poll(self, conn: psycopg.AsyncConnection, topic_id: int, params: dict[str, Any],
                    queries: Sequence[str]) -> tuple[list[tuple[Any, ...]], list[int]]:
        """Run a poll's ``queries`` (:data:`POLL_CHECKED` or :data:`POLL_FENCED`) in one round trip: the
        rows of the read (with its trailer row), and the fences ``loaded_fences`` returned when it is one."""
        fences: list[int] = []
        if _direct_ok(conn):
            # straight through libpq: the generic-plan setting, the fences and the read in one round trip
            results = await self._direct.run(conn, poll_steps(self.schema, topic_id, params, queries,
                                                              self.ex.pooler))
            got = self._direct.rows(conn, results[2])
            if len(queries) > 2:
                loaded = results[3].get_value(0, 0) or b"{}"
                fences = [int(v) for v in loaded.decode().strip("{}").split(",") if v]
            return got, fences
        curs = []
        async with conn.pipeline():
            for q in queries:
                cur = conn.cursor(binary=q in BINARY_QUERIES)
                name = fences_query(self.ex.pooler) if q == "load_fences" else q
                await cur.execute(self.ex.query(name, topic_id), params, prepare=True)
                curs.append(cur)
        got = await curs[1].fetchall()
        if len(queries) > 2:
            row = await curs[2].fetchone()
            fences = [int(v) for v in (row[0] if row else [])]
        return got, fences

    # -- checkpoints -------------------------------------------------------------------------------------
    async def load_checkpoints(self, conn: psycopg.AsyncConnection, group: str, topic_id: int,
                               partitions: Sequence[int]) -> dict[int, Cursor]:
        """The checkpoints of ``group`` on these partitions (partitions without one are absent)."""
        return await self.ex.perform(load_checkpoints_call(group, topic_id, partitions), conn)

    async def create_checkpoints(self, conn: psycopg.AsyncConnection, group: str, topic_id: int,
                                 starts: Mapping[int, Cursor]) -> None:
        """Create the checkpoints of ``starts`` that do not exist yet (existing ones win)."""
        await self.ex.perform(init_checkpoints_call(group, topic_id, starts), conn)

    async def create_missing_checkpoints(self, conn: psycopg.AsyncConnection, group: str, topic_id: int,
                                         partitions: Sequence[int], start: str | datetime
                                         ) -> dict[int, Cursor]:
        """Give ``group`` a checkpoint at ``start`` on each of ``partitions`` that has none, as
        ``CheckpointStore.create_missing`` (:func:`~pgstreams.storage.checkpoints.missing_checkpoints`);
        the checkpoints of ``partitions``."""
        return await self.ex.perform_steps(missing_checkpoints(group, topic_id, partitions, start), conn)

    async def store_checkpoints(self, conn: psycopg.AsyncConnection, group: str, topic_id: int,
                                targets: Mapping[int, Cursor], expected: Mapping[int, Cursor],
                                durable: bool = True) -> dict[int, CommitOutcome]:
        """Store ``targets`` given the ``expected`` previous checkpoints; per partition, what happened
        (as ``CheckpointStore.store``). ``durable=False`` on an idle autocommit connection: the commit does
        not wait for its flush."""
        ps, to, expect = store_args(targets, expected)
        query = store_query(lazy_commit(durable, conn))
        if _direct_ok(conn):  # straight through libpq, one round trip
            st = statement(query, self.schema)
            args = [group.encode(self._direct.encoding(conn)), b"%d" % topic_id, int_array(ps), int_array(to),
                    int_array(expect)]
            res = await self._direct.run(conn, [(st, args, 0)])
            return outcomes_of(self._direct.rows(conn, res[0]))
        return outcomes_of(await self.ex.all(query, (group, topic_id, ps, to, expect), conn=conn))

    async def seek_checkpoints(self, conn: psycopg.AsyncConnection, group: str, topic_id: int,
                               cursors: Mapping[int, Cursor]) -> None:
        """Set the checkpoints to ``cursors`` (they may move backwards)."""
        await self.ex.perform(seek_checkpoints_call(group, topic_id, cursors), conn)


__all__ = ["AsyncExecutor", "AsyncStore"]
