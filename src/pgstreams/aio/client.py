"""The asyncio client (:class:`AsyncClient`, made by :func:`pgstreams.aio.connect`): connections,
administration through the sync client in a worker thread, publishing on async connections. Its
publishes are idempotent by the rules of :mod:`pgstreams.producer.idempotence`, shared with the sync
producer (see :mod:`pgstreams.aio`)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import psycopg

from ..client import Client
from ..consumer.reader import TOPIC_GONE, Start, StreamReader
from ..errors import InvalidArgument, TopicNotFound
from ..models import (
    GroupInfo,
    GroupPartitionStatus,
    MaintenanceReport,
    Message,
    PublishResult,
    ReplayResult,
    RetentionStatus,
    StatusSnapshot,
    TopicDescription,
    TopicInfo,
)
from ..names import check_topic
from ..producer import Batch, TopicState, checked_row
from ..producer.idempotence import (
    Interrupted,
    Unknown,
    backend_pid,
    copy_again,
    publish_again,
    reusable,
    run_steps_async,
)
from ..reconnect import AsyncReconnect, retriable
from ..storage import PARTITION, EventRow, StoredAt
from ..storage.asyncstore import AsyncStore
from ..storage.events import PRODUCER
from ..storage.libpq import AsyncCheckedPool
from ..storage.notifications import channel
from .consumer import AsyncConsumer, create_checkpoints

T = TypeVar("T")


class AsyncClient:
    """The asyncio twin of :class:`pgstreams.Client` (create with :func:`pgstreams.aio.connect`). Safe to
    share among the tasks of one event loop. ``sync`` is the sync client the administration runs through;
    its ``retry_timeout`` and producer (id, numbering, ``idempotent``) are this client's too. ``retry`` is
    the client's :class:`~pgstreams.reconnect.AsyncReconnect`."""

    def __init__(self, sync: Client, pool: AsyncCheckedPool) -> None:
        self.sync = sync
        self.schema = sync.schema
        self.poll_interval = sync.poll_interval
        self.retry_timeout = sync.retry_timeout
        #: the server as ``user@host:port/dbname``, never with a password
        self.server = sync.server
        self._pool = pool
        self.retry = AsyncReconnect(pool, sync.dsn, sync.retry_timeout)
        self.store = AsyncStore(pool, sync.schema, self.retry, pooler=sync.pooler)
        producer = sync.producer
        #: the producer tags, shared with the sync client's publishes (none with ``idempotent=False``)
        self._tags = producer.tags if producer.idempotent else None
        self._channel = channel(sync.schema)  # of the consumers' wake-up notifications
        self._topics: dict[str, TopicState] = {}
        self._checks: set[asyncio.Task[None]] = set()  # reads of topic rows in flight (see topic_state)
        self._closed = False
        # single publishes run on a connection of their own when no other task of the client is using it
        # (as the sync producer's): the pool's check-out and return cost an eighth of the client's CPU
        self._own: psycopg.AsyncConnection | None = None
        self._own_lock = asyncio.Lock()

    def __repr__(self) -> str:
        return f"<pgstreams.aio.AsyncClient schema={self.schema!r}>"

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the pools and background threads. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._checks:
            await asyncio.gather(*self._checks, return_exceptions=True)
        if self._own is not None:
            await self._own.close()
            self._own = None
        await self._pool.close()
        await asyncio.to_thread(self.sync.close)

    async def new_connection(self) -> psycopg.AsyncConnection:
        """A new autocommit async connection of the client's own, outside the pool, made and set up as the
        pool's are (the caller closes it)."""
        return await self._pool.fresh()

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[psycopg.AsyncConnection]:
        """Borrow a pooled autocommit async connection (for ad-hoc SQL on the same database). Waiting for
        one is bounded by ``retry_timeout`` (then :class:`pgstreams.ConnectionLost`); the body is not
        retried (see :meth:`run`), as :meth:`pgstreams.Client.connection`."""
        cm = self._pool.connection()
        try:
            conn = await cm.__aenter__()
        except Exception as exc:
            if retriable(exc):
                raise self.retry.lost(exc) from exc
            raise
        try:
            yield conn
        except BaseException as exc:
            if not await cm.__aexit__(type(exc), exc, exc.__traceback__):
                raise
        else:
            await cm.__aexit__(None, None, None)

    async def run(self, fn: Callable[[psycopg.AsyncConnection], Awaitable[T]]) -> T:
        """``await fn(conn)`` on a pooled autocommit connection; if it fails because the connection broke
        or the server restarted, run again on a fresh one until ``retry_timeout`` passes (then
        :class:`pgstreams.ConnectionLost`): :meth:`pgstreams.Client.run`. ``fn`` must be safe to run
        again."""
        with self.retry.run_errors():
            return await self.retry.pooled(fn)

    async def topic_state(self, name: str, *, refresh: bool = False) -> TopicState:
        """The client's state of topic ``name`` (read once and cached; ``refresh`` reads it again).
        Raises :class:`TopicNotFound`."""
        if not refresh and type(name) is str and (state := self._topics.get(name)) is not None:
            if state.check_due():  # changed elsewhere? read its row beside the caller
                task = asyncio.get_running_loop().create_task(self._check_topic(name, state))
                self._checks.add(task)
                task.add_done_callback(self._checks.discard)
            return state
        check_topic(name)
        record = await self.store.topic(name)
        if record is None:
            self._topics.pop(name, None)
            raise TopicNotFound(f"topic {name!r} does not exist")
        state = self._topics[name] = TopicState.of(record)
        return state

    async def _check_topic(self, name: str, state: TopicState) -> None:
        """Forget the cached ``state`` of topic ``name`` if its row changed (as the sync producer does
        within :data:`pgstreams.producer.TOPIC_CHECK_INTERVAL`; here in a task of its own, so that no
        publish waits for it). A failed read is left to the next check."""
        try:
            version = await self.store.topic_version(state.id)
        except Exception:  # noqa: BLE001 - a lost connection, the pool closing: the next check reads again
            return
        if state.seen(version) and self._topics.get(name) is state:
            del self._topics[name]

    # -- administration (the sync client's, in a worker thread) ---------------------------------------
    async def create_topic(self, name: str, partitions: int = 1, **kwargs: Any) -> TopicInfo:
        """:meth:`pgstreams.Client.create_topic` (``partitions`` default 1; ``segment_size``, ``config``)."""
        return await asyncio.to_thread(self.sync.create_topic, name, partitions, **kwargs)

    async def alter_topic(self, name: str, config: Mapping[str, Any] | None = None, **kwargs: Any
                          ) -> TopicDescription:
        """:meth:`pgstreams.Client.alter_topic`."""
        self._topics.pop(name, None)
        return await asyncio.to_thread(self.sync.alter_topic, name, config, **kwargs)

    async def list_topics(self) -> list[TopicInfo]:
        """:meth:`pgstreams.Client.list_topics`."""
        return await asyncio.to_thread(self.sync.list_topics)

    async def describe_topic(self, name: str) -> TopicDescription:
        """:meth:`pgstreams.Client.describe_topic`."""
        return await asyncio.to_thread(self.sync.describe_topic, name)

    async def delete_topic(self, name: str) -> None:
        """:meth:`pgstreams.Client.delete_topic`."""
        self._topics.pop(name, None)
        await asyncio.to_thread(self.sync.delete_topic, name)

    async def describe_group(self, group: str, topic: str | None = None) -> list[GroupPartitionStatus]:
        """:meth:`pgstreams.Client.describe_group`."""
        return await asyncio.to_thread(self.sync.describe_group, group, topic)

    async def list_groups(self) -> list[GroupInfo]:
        """:meth:`pgstreams.Client.list_groups`."""
        return await asyncio.to_thread(self.sync.list_groups)

    async def reset_group(self, group: str, topic: str, **kwargs: Any) -> list[Any]:
        """:meth:`pgstreams.Client.reset_group`."""
        return await asyncio.to_thread(self.sync.reset_group, group, topic, **kwargs)

    async def delete_group(self, group: str, topic: str | None = None) -> int:
        """:meth:`pgstreams.Client.delete_group`."""
        return await asyncio.to_thread(self.sync.delete_group, group, topic)

    async def replay_dead_letters(self, dlt_topic: str, **kwargs: Any) -> ReplayResult:
        """:meth:`pgstreams.Client.replay_dead_letters`."""
        return await asyncio.to_thread(self.sync.replay_dead_letters, dlt_topic, **kwargs)

    async def retention_status(self, topic: str | None = None) -> list[RetentionStatus]:
        """:meth:`pgstreams.Client.retention_status`."""
        return await asyncio.to_thread(self.sync.retention_status, topic)

    async def status(self) -> StatusSnapshot:
        """:meth:`pgstreams.Client.status`."""
        return await asyncio.to_thread(self.sync.status)

    async def maintain(self) -> MaintenanceReport:
        """:meth:`pgstreams.Client.maintain`."""
        return await asyncio.to_thread(self.sync.maintain)

    # -- publishing -----------------------------------------------------------------------------------
    async def publish(self, topic: str, value: Any, *, key: str | None = None,
                      headers: Mapping[str, str] | None = None, partition: int | None = None,
                      event_type: str | None = None, event_id: str | None = None,
                      correlation_id: str | None = None, causation_id: str | None = None,
                      conn: psycopg.AsyncConnection | None = None, notify: bool = True) -> PublishResult:
        """Publish one event and return where it was stored: :meth:`pgstreams.Client.publish` (every
        keyword defaults to ``None``; ``notify`` to true), with ``conn`` an async psycopg connection whose
        open transaction the event joins."""
        if not isinstance(notify, bool):
            raise InvalidArgument(f"notify must be a bool, not {type(notify).__name__}")
        if conn is not None and not isinstance(conn, psycopg.AsyncConnection):
            raise InvalidArgument(f"conn must be a psycopg AsyncConnection, not {type(conn).__name__}")
        state = await self.topic_state(topic)
        if type(partition) is int and partition >= state.partitions:  # the topic may have grown since
            state = await self.topic_state(topic, refresh=True)
        row_args = (value, key, headers, partition, event_type, event_id, correlation_id, causation_id)
        if conn is not None:
            row = checked_row(state, row_args, None)
            stored = await self.store.insert(conn, state.id, row)
            if notify:
                await self.store.notify(self._channel, str(state.id), conn)
            return PublishResult(state.name, stored.partition, stored.position, stored.duplicate)
        tags = self._tags
        tag = None if tags is None else tags.next_tag() if tags.drawn else await self._first_tag()
        row = checked_row(state, row_args, tag)
        floor = state.known  # read before the attempt: its event is stored above it
        try:
            if not self._own_lock.locked():
                async with self._own_lock:
                    stored = await self._publish_own(topic, state, row, notify)
            else:
                stored = await self._publish_pooled(topic, state, row, notify)
        except Interrupted as lost:
            stored = await self._again(topic, state, row, floor, lost.pid, lost.error)
        state.known = stored.position
        return PublishResult(state.name, stored.partition, stored.position, stored.duplicate)

    async def _first_tag(self) -> int:
        """The producer tag of the client's first publish: the producer id is drawn (a round trip) in a
        worker thread."""
        assert self._tags is not None
        await asyncio.to_thread(self._tags.draw)
        return self._tags.next_tag()

    async def _publish_pooled(self, topic: str, state: TopicState, row: EventRow, notify: bool) -> StoredAt:
        """Publish on a pooled connection; a retriable failure raises
        :class:`~pgstreams.producer.Interrupted`."""
        try:
            async with self._pool.connection() as c:
                return await self._publish_on(c, topic, state, row, notify)
        except Interrupted:
            raise
        except Exception as exc:  # no connection from the pool
            if not retriable(exc):
                raise
            raise Interrupted(None, exc) from exc

    async def _publish_own(self, topic: str, state: TopicState, row: EventRow, notify: bool) -> StoredAt:
        """Publish on the client's own connection (made at first use; one that is no longer
        :func:`~pgstreams.producer.idempotence.reusable` is closed and made again by the next publish); a
        retriable failure raises :class:`~pgstreams.producer.Interrupted`."""
        c = self._own
        if c is None or c.closed:
            try:
                c = await self.new_connection()
            except Exception as exc:
                if not retriable(exc):
                    raise
                raise Interrupted(None, exc) from exc
            self._own = c
        try:
            return await self._publish_on(c, topic, state, row, notify)
        finally:
            if not reusable(c):
                self._own = None
                await c.close()

    async def _publish_on(self, c: psycopg.AsyncConnection, topic: str, state: TopicState, row: EventRow,
                          notify: bool) -> StoredAt:
        """Store ``row`` on ``c`` (autocommit, idle) in its own transaction, then keep segments ahead. A
        retriable failure of the insert raises :class:`~pgstreams.producer.Interrupted` with the session it
        ran on (its outcome is unknown); one of the segments' upkeep after it is retried on its own."""
        pid = backend_pid(c)  # before the attempt: a connection that broke may no longer tell
        try:
            stored = await self._insert(c, topic, state, row, notify)
        except Exception as exc:
            if not retriable(exc):
                raise
            raise Interrupted(pid, exc) from exc
        position = stored.position
        segments = state.segments
        if segments.room_until(position) or segments.stats_due(position):
            try:
                await self._keep_ahead(c, state, position)
            except Exception as exc:
                if not retriable(exc):
                    raise
                await self.retry.pooled(lambda fresh: self._keep_ahead(fresh, state, position))
        return stored

    async def _again(self, topic: str, state: TopicState, row: EventRow, floor: int, pid: int | None,
                     first: BaseException) -> StoredAt:
        """Publish ``row`` again after its attempt failed with ``first`` (retriable) on the session ``pid``:
        stored once, whether or not that attempt committed (as ``Producer._again``: by
        :func:`~pgstreams.producer.idempotence.publish_again`)."""
        unknown = Unknown(state.id, (row[PARTITION],), floor, pid, row[PRODUCER])
        ex = self.store.executor

        async def attempt(c: psycopg.AsyncConnection) -> StoredAt:
            return await run_steps_async(publish_again(unknown, self.retry.session_waits), ex, c,
                                         lambda: self._insert(c, topic, state, row, False))

        stored = await self.retry.again(attempt, first)
        self.sync.notifier.poke(state.id)
        await self.retry.pooled(lambda c: self._keep_ahead(c, state, stored.position))
        return stored

    async def _insert(self, c: psycopg.AsyncConnection, topic: str, state: TopicState, row: EventRow,
                      notify: bool) -> StoredAt:
        """Insert on pooled ``c``; with ``notify``, the consumers' wake-up when one is due: riding in the
        same round trip after the commit, or scheduled on the notifier (as the sync producer's, see
        :meth:`pgstreams.storage.notifications.Notifier.claim`)."""
        wake = (self._channel, str(state.id)) if (
            notify and not state.quiet and self.sync.notifier.claim(state.id)) else None
        try:
            return await self.store.insert_pooled(c, state.id, row, wake)
        except psycopg.errors.UndefinedTable:
            fresh = await self.topic_state(topic, refresh=True)
            return await self.store.insert_pooled(c, fresh.id, row, wake and (self._channel, str(fresh.id)))
        except psycopg.errors.CheckViolation:  # beyond the last segment: add segments, retry once
            await self.store.ensure_room_after(state.segments, 0, c)
            return await self.store.insert_pooled(c, state.id, row, wake)

    async def _keep_ahead(self, c: psycopg.AsyncConnection, state: TopicState, position: int) -> None:
        """As ``Segments.ensure_room`` and ``check_stats``: an empty segment beyond ``position``, and
        statistics for the segment being filled."""
        await self.store.ensure_room(state.segments, position, c)
        await self.store.check_stats(state.segments, position, c)

    async def publish_many(self, topic: str, events: Iterable[Message | Mapping[str, Any]], *,
                           conn: psycopg.AsyncConnection | None = None) -> int:
        """Publish events in one transaction with COPY, all or none: :meth:`pgstreams.Client.publish_many`.
        Returns the number stored. The batch carries one producer tag: retried after its connection broke,
        it is stored once (all or none). With ``conn``, an async connection in an open transaction, the
        events join that transaction instead (not retried, no producer tag, no wake-up notification: the
        caller's transaction decides, and announces them after its commit if it wants consumers woken)."""
        if conn is not None:
            if not isinstance(conn, psycopg.AsyncConnection):
                raise InvalidArgument(f"conn must be a psycopg AsyncConnection, not {type(conn).__name__}")
            state = await self.topic_state(topic)
            joined = Batch(state, events, None)
            rows = list(joined)
            return await self._copy(conn, state, rows, joined.has_ids) if rows else 0
        state = await self.topic_state(topic)
        tags = self._tags
        producer = None if tags is None else tags.next_tag() if tags.drawn else await self._first_tag()
        batch = Batch(state, events, producer)
        rows = list(batch)  # validated and size-checked
        if not rows:
            return 0
        floor = state.known
        pid: int | None = None
        try:
            async with self._pool.connection() as c:
                pid = backend_pid(c)
                stored = await self._copy(c, state, rows, batch.has_ids)
        except Exception as exc:
            if not retriable(exc):
                raise
            stored = await self._copy_again(state, batch, rows, floor, pid, producer, exc)
        if not state.quiet:
            self.sync.notifier.poke(state.id)
        return stored

    async def publish_returning(self, conn: psycopg.AsyncConnection,
                                batches: Sequence[tuple[str, Iterable[Message | Mapping[str, Any]]]],
                                finish: Sequence[str] = ()) -> list[dict[int, list[int]]]:
        """Publish the events of each ``(topic, events)`` of ``batches`` (events without ids) in a
        transaction on ``conn``, then run the SQL statements of ``finish`` (for example ``COMMIT``), all in
        one round trip; returns per batch the positions stored in each partition, in order. The
        transaction is the caller's, or one opened now when ``conn`` is idle; without a ``COMMIT`` in
        ``finish`` it stays open for the caller to add to and end. For callers that answer with positions
        (the Kafka gateway's produce); not retried, no producer tag, no notification. ``conn``: an async
        connection in autocommit mode that the caller holds alone. Raises
        ``psycopg.errors.CheckViolation`` (the transaction failed) when other clients' events outran a
        topic's segments: roll back, :meth:`make_room`, and publish again."""
        plans = []
        for topic, events in batches:
            state = await self.topic_state(topic)
            batch = Batch(state, events, None)
            rows = list(batch)  # validated and size-checked
            if batch.has_ids:
                raise InvalidArgument("publish_returning stores events without ids")
            last = -1
            if rows and state.copy_reads_last(len(rows)):
                last = await self.store.ensure_room_after(state.segments, len(rows), conn)
            plans.append((state, rows, last))
        stored = await self.store.insert_returning(conn, [(st.id, rows) for st, rows, _ in plans if rows],
                                                   finish)
        out: list[dict[int, list[int]]] = []
        got = iter(stored)
        for state, rows, last in plans:
            out.append(next(got) if rows else {})
            bound = state.copied(len(rows), last) if rows else -1
            if rows and state.segments.stats_due(bound):
                await self._check_stats(state, bound)
        return out

    async def _check_stats(self, state: TopicState, bound: int) -> None:
        await self.retry.pooled(lambda c: self.store.check_stats(state.segments, bound, c))

    async def make_room(self, topic: str, count: int) -> None:
        """Make sure the segments of ``topic`` have room for ``count`` more events (after
        :meth:`publish_returning` raised ``CheckViolation``)."""
        state = await self.topic_state(topic)
        await self.retry.pooled(lambda c: self.store.ensure_room_after(state.segments, count, c))

    async def _copy(self, c: psycopg.AsyncConnection, state: TopicState, rows: list[EventRow], has_ids: bool
                    ) -> int:
        """COPY ``rows`` on ``c``, keeping segments ahead as ``Producer._copy`` does (see
        :meth:`TopicState.copy_reads_last <pgstreams.producer.TopicState.copy_reads_last>`)."""
        store, segments, count = self.store, state.segments, len(rows)
        last = await store.ensure_room_after(segments, count, c) if state.copy_reads_last(count) else -1
        try:
            stored = await store.copy(c, state.id, rows, has_ids)
        except psycopg.errors.CheckViolation:
            await store.ensure_room_after(segments, count, c)
            stored = await store.copy(c, state.id, rows, has_ids)
        bound = state.copied(count, last)
        if segments.stats_due(bound):
            await store.check_stats(segments, bound, c)
        return stored

    async def _copy_again(self, state: TopicState, batch: Batch, rows: list[EventRow], floor: int,
                          pid: int | None, producer: int | None, first: BaseException) -> int:
        """``publish_many`` again after its attempt failed with ``first`` (retriable): the batch is stored
        once (all or none), whether or not that attempt committed (as ``Producer._copy_again``: by
        :func:`~pgstreams.producer.idempotence.copy_again`)."""
        unknown = Unknown(state.id, batch.used_partitions(), floor, pid, producer)
        has_ids = batch.has_ids
        ex = self.store.executor

        async def attempt(c: psycopg.AsyncConnection) -> int:
            return await run_steps_async(copy_again(unknown, len(rows), has_ids, self.retry.session_waits),
                                         ex, c, lambda: self._copy(c, state, rows, has_ids))

        return await self.retry.again(attempt, first)

    # -- consuming ------------------------------------------------------------------------------------
    async def consumer(self, topic: str, group: str, *, start: Start = "earliest",
                       partitions: Sequence[int] | None = None) -> AsyncConsumer:
        """An :class:`AsyncConsumer` of ``topic`` in stream group ``group`` (as
        :meth:`pgstreams.Client.consumer`: ``start`` default ``"earliest"``, ``partitions`` default all):
        partitions without a checkpoint of the group get one at ``start``."""
        reader = await asyncio.to_thread(StreamReader, self.sync, topic, group, start=start,
                                         partitions=partitions)
        try:
            await create_checkpoints(self, reader)
        except TOPIC_GONE as exc:
            raise TopicNotFound(f"topic {reader.topic!r} was deleted") from exc
        return AsyncConsumer(self, reader)
