"""The asyncio API: ``client = await pgstreams.aio.connect(...)`` returns an :class:`AsyncClient` with the
methods of :class:`pgstreams.Client` as coroutines, for asyncio services (FastAPI, aiohttp, ...).

Publishing, polling and committing run on psycopg's async connections from a
:class:`psycopg_pool.AsyncConnectionPool` through the storage layer's async executor
(:mod:`pgstreams.storage.asyncstore`): the same named queries, the same gap-free read fence (a poll sends
the partitions' fences and the read in one round trip), the same checkpoint outcomes and the same errors.
Encoding, partition choice and validation are the producer's; cursor bookkeeping is the
:class:`~pgstreams.consumer.reader.StreamReader`'s. Administration (topics, groups, status, maintenance)
is rare and runs the sync client's methods in a worker thread (``asyncio.to_thread``), so it never blocks
the event loop either.

Faults are handled as by the sync client (:mod:`pgstreams.reconnect`): a publish, ``publish_many``, poll,
commit, seek, consumer creation or topic lookup whose connection broke or whose server restarted is run
again on a fresh connection (:class:`~pgstreams.reconnect.AsyncReconnect`: 50 ms doubling up to 1 s apart)
within ``connect(retry_timeout=...)`` (default 30 s), then raises one :class:`pgstreams.ConnectionLost`
naming the server without its password; a commit is retried with the same expected checkpoint, so a
checkpoint the lost attempt stored comes back ``IGNORED`` (already stored) and is applied. Publishes are
idempotent by default (``connect(idempotent=True)``): they carry the producer tags of the sync client's
:class:`~pgstreams.producer.Producer` (the same producer id and numbers), and a publish retried after its
outcome was lost (the connection broke during its commit) first waits until the broken session ended,
then looks for its tag and stores the events only if they are absent: stored once. A
:meth:`AsyncConsumer.transaction` gets a connection whose ``BEGIN`` succeeded (retried likewise); what
fails inside the block is the caller's, as with the sync consumer: it rolls back and raises.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from datetime import datetime
from typing import Any, TypeVar

import psycopg
from psycopg import pq
from psycopg_pool import AsyncConnectionPool

from .client import (
    DEFAULT_POLL_INTERVAL,
    DEFAULT_POOL_SIZE,
    DEFAULT_SCHEMA,
    Client,
    check_connect_options,
)
from .connecting import resolve_dsns
from .consumer.consumer import _check_limits
from .consumer.reader import _GONE, _ORIGIN, Cursor, Start, StreamReader, events_of
from .errors import InvalidArgument, TopicNotFound
from .models import (
    CommitOutcome,
    Event,
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
from .names import check_topic
from .producer import Batch, TopicState, _backend_pid, _Interrupted, checked_row
from .reconnect import DEFAULT_RETRY_TIMEOUT, AsyncReconnect, retriable
from .storage import EventRow, StoredAt
from .storage.asyncstore import AsyncStore
from .storage.executor import configure_session_async
from .storage.libpq import AsyncCheckedPool

__all__ = ["ADMIN_POOL_SIZE", "AsyncClient", "AsyncConsumer", "AsyncConsumerTransaction", "connect"]

#: Connections of the sync client an :class:`AsyncClient` runs its administration through.
ADMIN_POOL_SIZE = 2
#: The first recheck after an empty poll, in seconds; doubled up to the client's ``poll_interval``.
_FIRST_RECHECK = 0.002

T = TypeVar("T")


async def connect(dsn: str | None = None, *, schema: str = DEFAULT_SCHEMA, migrate: bool = True,
                  pool_size: int = DEFAULT_POOL_SIZE, poll_interval: float = DEFAULT_POLL_INTERVAL,
                  retry_timeout: float = DEFAULT_RETRY_TIMEOUT, idempotent: bool = True) -> AsyncClient:
    """Connect to PostgreSQL and return an :class:`AsyncClient` (use ``async with`` or ``await
    client.close()``). The arguments and defaults are those of :func:`pgstreams.connect`: ``dsn``
    (default ``$PGSTREAMS_DSN``, else the embedded server), ``schema`` ("pgstreams"), ``migrate`` (true),
    ``pool_size`` (10 async connections), ``poll_interval`` (0.25 s), ``retry_timeout``
    (:data:`pgstreams.DEFAULT_RETRY_TIMEOUT`, 30 s; 0 turns retrying off: how long a call keeps being
    retried on fresh connections after its connection broke or the server restarted, before it raises
    :class:`pgstreams.ConnectionLost`), ``idempotent`` (true: publishes carry producer tags, so that one
    retried after its outcome was lost is stored once); the same errors
    (:class:`pgstreams.ConfigurationError` when the server cannot be reached, ...)."""
    check_connect_options(schema, migrate, pool_size, poll_interval, retry_timeout, idempotent)
    dsns = await asyncio.to_thread(resolve_dsns, dsn)
    if len(dsns) > 1:
        raise InvalidArgument(f"the asyncio client connects to one server, but {len(dsns)} DSNs (the shards "
                              "of a cluster) were given")
    resolved = dsns[0]
    sync = await asyncio.to_thread(Client, resolved, schema=schema, migrate=migrate,
                                   pool_size=min(ADMIN_POOL_SIZE, pool_size), poll_interval=poll_interval,
                                   retry_timeout=retry_timeout, idempotent=idempotent)
    pool = AsyncCheckedPool(sync.conninfo, min_size=1, max_size=pool_size, kwargs={"autocommit": True},
                            configure=configure_session_async, timeout=max(sync.retry_timeout, 1.0),
                            open=False, name="pgstreams-aio")
    try:
        await pool.open(wait=True, timeout=30)
    except BaseException:
        await asyncio.to_thread(sync.close)
        raise
    return AsyncClient(sync, pool)


class AsyncClient:
    """The asyncio twin of :class:`pgstreams.Client` (create with :func:`connect`). Safe to share among
    the tasks of one event loop. ``sync`` is the sync client the administration runs through; its
    ``retry_timeout`` and producer (id, numbering, ``idempotent``) are this client's too. ``retry`` is the
    client's :class:`~pgstreams.reconnect.AsyncReconnect`."""

    def __init__(self, sync: Client, pool: AsyncConnectionPool) -> None:
        self.sync = sync
        self.schema = sync.schema
        self.poll_interval = sync.poll_interval
        self.retry_timeout = sync.retry_timeout
        #: the server as ``user@host:port/dbname``, never with a password
        self.server = sync.server
        self._pool = pool
        self.retry = AsyncReconnect(pool, sync.dsn, sync.retry_timeout)
        self.store = AsyncStore(pool, sync.schema, self.retry)
        self._producer = sync._producer  # the producer tags (shared with the sync client's publishes)
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

    @asynccontextmanager
    async def _begun(self) -> AsyncIterator[psycopg.AsyncConnection]:
        """A pooled connection in a transaction just begun, for the block (committed at its end, rolled
        back by an exception); a check-out or ``BEGIN`` that fails because the connection broke is run
        again on a fresh one (the block is not)."""

        async def begin(stack: AsyncExitStack, wait: float | None) -> psycopg.AsyncConnection:
            conn = await stack.enter_async_context(self._pool.connection(timeout=wait))
            await stack.enter_async_context(conn.transaction())
            return conn

        async with self.retry.entered(begin) as conn:
            yield conn

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
        row = checked_row(state, row_args, await self._tag())
        floor = state.known  # read before the attempt: its event is stored above it
        try:
            if not self._own_lock.locked():
                async with self._own_lock:
                    stored = await self._publish_own(topic, state, row, notify)
            else:
                stored = await self._publish_pooled(topic, state, row, notify)
        except _Interrupted as lost:
            stored = await self._again(topic, state, row, floor, lost.pid, lost.error)
        state.known = stored.position
        return PublishResult(state.name, stored.partition, stored.position, stored.duplicate)

    async def _tag(self) -> int | None:
        """The producer tag of the next publish (``None`` with ``connect(idempotent=False)``); the first
        draws the producer id, in a worker thread."""
        producer = self._producer
        if not producer.idempotent:
            return None
        if not producer.drawn:
            await asyncio.to_thread(producer.draw)
        return producer.tag()

    async def _publish_pooled(self, topic: str, state: TopicState, row: EventRow, notify: bool) -> StoredAt:
        """Publish on a pooled connection; a retriable failure raises ``_Interrupted``."""
        try:
            async with self._pool.connection() as c:
                return await self._publish_on(c, topic, state, row, notify)
        except _Interrupted:
            raise
        except Exception as exc:  # no connection from the pool
            if not retriable(exc):
                raise
            raise _Interrupted(None, exc) from exc

    async def _publish_own(self, topic: str, state: TopicState, row: EventRow, notify: bool) -> StoredAt:
        """Publish on the client's own connection (made at first use; one that broke, or was left in a
        transaction, is closed and made again by the next publish); a retriable failure raises
        ``_Interrupted``."""
        c = self._own
        if c is None or c.closed:
            try:
                c = await psycopg.AsyncConnection.connect(self.sync.conninfo, autocommit=True)
                await configure_session_async(c)
            except Exception as exc:
                if not retriable(exc):
                    raise
                raise _Interrupted(None, exc) from exc
            self._own = c
        try:
            return await self._publish_on(c, topic, state, row, notify)
        finally:
            if c.closed or c.broken or c.pgconn.transaction_status != pq.TransactionStatus.IDLE:
                self._own = None
                await c.close()

    async def _publish_on(self, c: psycopg.AsyncConnection, topic: str, state: TopicState, row: EventRow,
                          notify: bool) -> StoredAt:
        """Store ``row`` on ``c`` (autocommit, idle) in its own transaction, then keep segments ahead. A
        retriable failure of the insert raises ``_Interrupted`` with the session it ran on (its outcome is
        unknown); one of the segments' upkeep after it is retried on its own."""
        pid = _backend_pid(c)  # before the attempt: a connection that broke may no longer tell
        try:
            stored = await self._insert(c, topic, state, row, notify)
        except Exception as exc:
            if not retriable(exc):
                raise
            raise _Interrupted(pid, exc) from exc
        try:
            await self._keep_ahead(c, state, stored.position)
        except Exception as exc:
            if not retriable(exc):
                raise
            await self.retry.pooled(lambda fresh: self._keep_ahead(fresh, state, stored.position))
        return stored

    async def _again(self, topic: str, state: TopicState, row: EventRow, floor: int, pid: int | None,
                     first: BaseException) -> StoredAt:
        """Publish ``row`` again after its attempt failed with ``first`` (retriable) on the session ``pid``:
        stored once, whether or not that attempt committed (as ``Producer._again``)."""

        async def attempt(c: psycopg.AsyncConnection) -> StoredAt:
            found = await self._settled(c, state, [row[0]], floor, pid, row[-1])
            if found is not None:
                return found
            return await self._insert(c, topic, state, row, False)

        stored = await self.retry.again(attempt, first)
        self.sync.notifier.poke(state.id)
        await self.retry.pooled(lambda c: self._keep_ahead(c, state, stored.position))
        return stored

    async def _settled(self, c: psycopg.AsyncConnection, state: TopicState, partitions: list[int],
                       floor: int, pid: int | None, producer: int | None) -> StoredAt | None:
        """Wait until the broken session ``pid`` ended its work, then where the events tagged ``producer``
        were stored, if they were (``None``: not stored, publish them), as ``Producer._settled``."""
        if pid is not None:
            waits = self.retry.session_waits(pid)
            while await self.store.session_busy(c, pid):
                await asyncio.sleep(next(waits))
        if producer is None:
            return None
        return await self.store.produced(c, state.id, partitions, floor, producer)

    @property
    def _channel(self) -> str:
        from .storage.notifications import channel

        return channel(self.schema)

    async def _insert(self, c: psycopg.AsyncConnection, topic: str, state: TopicState, row: Any,
                      notify: bool) -> Any:
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
            last = await self.store.last_position(state.id, c)
            until = last + state.record.segment_size
            state.segments.covered = await self.store.ensure_segments(state.id, until, c)
            return await self.store.insert_pooled(c, state.id, row, wake)

    async def _keep_ahead(self, c: psycopg.AsyncConnection, state: TopicState, position: int) -> None:
        """As ``Segments.ensure_room`` and ``check_stats``: an empty segment beyond ``position``, and
        statistics for the segment being filled."""
        seg = state.segments
        if position + seg.segment_size >= seg.covered:
            covered = await self.store.ensure_segments(state.id, position + seg.segment_size, c)
            if covered:
                seg.covered = covered
        if position >= seg.stats_from:
            if await self.store.analyze_segment(state.id, position, c):
                seg.stats_from = (position // seg.segment_size + 1) * seg.segment_size
            else:
                seg.stats_from = position + min(1000, seg.segment_size // 2)

    async def publish_many(self, topic: str, events: Iterable[Message | Mapping[str, Any]]) -> int:
        """Publish events in one transaction with COPY, all or none: :meth:`pgstreams.Client.publish_many`.
        Returns the number stored. The batch carries one producer tag: retried after its connection broke,
        it is stored once (all or none)."""
        state = await self.topic_state(topic)
        producer = await self._tag()
        batch = Batch(state, events, producer)
        rows = list(batch)  # validated and size-checked
        if not rows:
            return 0
        floor = state.known
        pid: int | None = None
        try:
            async with self._pool.connection() as c:
                pid = _backend_pid(c)
                stored = await self._copy(c, state, rows, batch.has_ids)
        except Exception as exc:
            if not retriable(exc):
                raise
            stored = await self._copy_again(state, batch, rows, floor, pid, producer, exc)
        if not state.quiet:
            self.sync.notifier.poke(state.id)
        return stored

    async def _copy(self, c: psycopg.AsyncConnection, state: TopicState, rows: list[EventRow], has_ids: bool
                    ) -> int:
        """COPY ``rows`` on ``c``, keeping segments ahead (as ``Producer._copy``)."""
        # the sequence is read to keep segments ahead once every 1/16 segment of events (as the sync
        # client's); if other clients' events outran it, the COPY fails and is retried after it
        if state.copies_until_check <= 0:
            state.copies_until_check = max(1, state.record.segment_size // 16)
            last = await self.store.last_position(state.id, c)
            if last > state.known:
                state.known = last  # handed out before this batch's positions
            await self._keep_ahead(c, state, last + len(rows))
        state.copies_until_check -= len(rows)
        try:
            return await self.store.copy(c, state.id, rows, has_ids)
        except psycopg.errors.CheckViolation:
            last = await self.store.last_position(state.id, c)
            await self._keep_ahead(c, state, last + len(rows))
            return await self.store.copy(c, state.id, rows, has_ids)

    async def _copy_again(self, state: TopicState, batch: Batch, rows: list[EventRow], floor: int,
                          pid: int | None, producer: int | None, first: BaseException) -> int:
        """``publish_many`` again after its attempt failed with ``first`` (retriable): the batch is stored
        once (all or none), whether or not that attempt committed (as ``Producer._copy_again``)."""
        partitions = batch.used_partitions()
        has_ids = batch.has_ids

        async def attempt(c: psycopg.AsyncConnection) -> int:
            found = await self._settled(c, state, partitions, floor, pid, producer)
            if found is not None and producer is not None:
                return len(rows) if not has_ids else await self.store.count_produced(
                    c, state.id, partitions, floor, producer)
            return await self._copy(c, state, rows, has_ids)

        return await self.retry.again(attempt, first)

    # -- consuming ------------------------------------------------------------------------------------
    async def consumer(self, topic: str, group: str, *, start: Start = "earliest",
                       partitions: Sequence[int] | None = None) -> AsyncConsumer:
        """An :class:`AsyncConsumer` of ``topic`` in stream group ``group`` (as
        :meth:`pgstreams.Client.consumer`: ``start`` default ``"earliest"``, ``partitions`` default all):
        partitions without a checkpoint of the group get one at ``start``."""
        reader = await asyncio.to_thread(StreamReader, self.sync, topic, group, start=start,
                                         partitions=partitions)
        consumer = AsyncConsumer(self, reader)
        try:
            await consumer._create_checkpoints()
        except _GONE as exc:
            raise TopicNotFound(f"topic {reader.topic!r} was deleted") from exc
        return consumer


class AsyncConsumer:
    """Reads a topic for a stream group (create with :meth:`AsyncClient.consumer`): the asyncio twin of
    :class:`pgstreams.Consumer`, with the same cursors, gap-free polls and commit outcomes. Use one per
    task."""

    def __init__(self, client: AsyncClient, reader: StreamReader) -> None:
        self._client = client
        self._store = client.store
        self._reader = reader
        self.topic = reader.topic
        self.group = reader.group
        self.start = reader.start
        self._last: dict[int, Cursor] = {}

    def __repr__(self) -> str:
        return f"<pgstreams.aio.AsyncConsumer topic={self.topic!r} group={self.group!r}>"

    @property
    def partitions(self) -> tuple[int, ...]:
        """The partitions this consumer reads."""
        return self._reader.partitions

    @property
    def last_outcomes(self) -> dict[int, CommitOutcome]:
        """The outcome per partition of the last commit."""
        return self._reader.last_outcomes

    @property
    def lost_events(self) -> int:
        """Events retention removed before this consumer read them (as
        :attr:`pgstreams.Consumer.lost_events`)."""
        return self._reader.lost_events

    def committed(self) -> dict[int, int | None]:
        """The last committed position per partition as this consumer knows it (``None``: none yet)."""
        return {p: (c or None) for p, c in self._reader.checkpoints().items()}

    async def _create_checkpoints(self) -> None:
        reader, store, tid = self._reader, self._store, self._reader.topic_id
        parts = list(reader.partitions)

        async def create(conn: psycopg.AsyncConnection) -> dict[int, Cursor]:  # safe to run again
            cursors = await store.load_checkpoints(conn, reader.group, tid, parts)
            missing = sorted(set(parts) - set(cursors))
            if missing:
                if reader.start == "earliest":
                    starts = dict.fromkeys(missing, _ORIGIN)
                else:
                    fences = await store.fences(conn, tid, missing)
                    if isinstance(reader.start, datetime):
                        starts = await store.time_cursors(conn, tid, fences, reader.start)
                    else:
                        starts = {p: f - 1 for p, f in fences.items()}
                await store.create_checkpoints(conn, reader.group, tid, starts)
                cursors = await store.load_checkpoints(conn, reader.group, tid, parts)
            return cursors

        reader.set_checkpoints(await self._client.run(create))

    async def _fetch(self, conn: psycopg.AsyncConnection, max_events: int) -> list[Any]:
        params = self._reader.read_params(max_events)
        polled = await self._store.poll_checked(conn, self._reader.topic_id, params)
        rows, self._last = self._reader.advance(polled, params)
        return rows

    async def _poll(self, conn: psycopg.AsyncConnection | None, max_events: int, timeout: float
                    ) -> list[Event]:
        deadline = time.monotonic() + timeout
        pause = _FIRST_RECHECK
        try:
            while True:
                if conn is None:  # retried on a fresh connection if it broke (the cursors move after a read)
                    rows = await self._client.run(lambda c: self._fetch(c, max_events))
                else:
                    rows = await self._fetch(conn, max_events)
                remaining = deadline - time.monotonic()
                if rows or remaining <= 0:
                    return events_of(self.topic, rows)
                await asyncio.sleep(min(pause, remaining))
                pause = min(pause * 2, self._client.poll_interval)
        except _GONE as exc:
            raise TopicNotFound(f"topic {self.topic!r} was deleted") from exc

    async def poll(self, max_events: int = 500, timeout: float = 1.0) -> list[Event]:
        """Up to ``max_events`` next events (default 500), waiting at most ``timeout`` seconds (default
        1.0) for the first; an empty list when none arrived. Waiting rechecks after 2, 4, 8, ... ms up to
        the client's ``poll_interval``. Polling does not commit: see :meth:`commit`."""
        max_events, timeout = _check_limits(max_events, timeout)
        return await self._poll(None, max_events, timeout)

    async def commit(self, events: Sequence[Event] | None = None, *, durable: bool = True) -> CommitOutcome:
        """Store the position after ``events`` (default: the last poll's) as the group's checkpoint on
        their partitions: :meth:`pgstreams.Consumer.commit`, with the same outcomes and the same
        ``durable`` (default true; false: the call does not wait for the commit's flush to disk)."""
        if not isinstance(durable, bool):
            raise InvalidArgument(f"durable must be a bool, not {type(durable).__name__}")
        reader = self._reader
        targets = dict(self._last) if events is None else reader.targets(events)
        if not targets:
            return reader.outcome({})
        expected = reader.checkpoints()
        # retried on a fresh connection if it broke, with the same expected checkpoints: one the lost
        # attempt stored comes back IGNORED (already stored) and is applied as well
        try:
            outcomes = await self._client.run(lambda conn: self._store.store_checkpoints(
                conn, self.group, reader.topic_id, targets, expected, durable))
        except _GONE as exc:
            raise TopicNotFound(f"topic {self.topic!r} was deleted") from exc
        outcome = reader.outcome(outcomes)
        reader.apply(targets)
        return outcome

    async def seek_to_beginning(self) -> None:
        """Move every partition's checkpoint before the first event."""
        await self._seek(dict.fromkeys(self.partitions, _ORIGIN))

    async def seek_to_end(self) -> None:
        """Move every partition's checkpoint after the last event committed now."""
        tid, parts = self._reader.topic_id, list(self.partitions)
        fences = await self._client.run(lambda conn: self._store.fences(conn, tid, parts))
        await self._seek({p: f - 1 for p, f in fences.items()})

    async def _seek(self, cursors: dict[int, Cursor]) -> None:
        tid = self._reader.topic_id
        await self._client.run(lambda conn: self._store.seek_checkpoints(conn, self.group, tid, cursors))
        reader = self._reader
        reader.set_checkpoints({**reader.checkpoints(), **cursors})
        self._last = {}

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[AsyncConsumerTransaction]:
        """Poll, handle and checkpoint in one PostgreSQL transaction (exactly-once for effects kept in
        PostgreSQL): :meth:`pgstreams.Consumer.transaction`. Yields an :class:`AsyncConsumerTransaction`
        with ``.poll(...)`` and ``.connection``; leaving the block stores the checkpoint after the events
        polled, in the same transaction as the handler's writes; an exception rolls both back. The
        handler's writes are kept only with ``STORED`` (or when nothing was polled)."""
        reader = self._reader
        saved = reader.positions()
        kept = True
        targets: dict[int, Cursor] = {}
        try:
            # a connection whose BEGIN succeeded (a stale pooled one is replaced); the block is not retried
            async with self._client._begun() as conn:
                tx = AsyncConsumerTransaction(self, conn)
                yield tx
                targets = reader.targets(tx.events)
                if targets:
                    outcomes = await self._store.store_checkpoints(
                        conn, self.group, reader.topic_id, targets, reader.checkpoints())
                    tx.outcome = reader.outcome(outcomes)
                    kept = tx.outcome is CommitOutcome.STORED
                    if not kept:
                        raise psycopg.Rollback()
            if targets and kept:
                reader.apply(targets)
            elif not kept:
                tid, group, parts = reader.topic_id, self.group, list(reader.partitions)
                reader.set_checkpoints(await self._client.run(
                    lambda c: self._store.load_checkpoints(c, group, tid, parts)))
        except _GONE as exc:
            reader.restore(saved)
            raise TopicNotFound(f"topic {self.topic!r} was deleted") from exc
        except BaseException:
            reader.restore(saved)
            raise


class AsyncConsumerTransaction:
    """The handle of :meth:`AsyncConsumer.transaction`: ``connection`` is in the open transaction;
    ``outcome`` is ``None`` until the block ends."""

    def __init__(self, consumer: AsyncConsumer, conn: psycopg.AsyncConnection) -> None:
        self._consumer = consumer
        self.connection = conn
        self.events: list[Event] = []
        self.outcome: CommitOutcome | None = None

    async def poll(self, max_events: int = 500, timeout: float = 1.0) -> list[Event]:
        """Like :meth:`AsyncConsumer.poll` (defaults 500 and 1.0 s), inside the transaction; the events
        are checkpointed when the block ends."""
        max_events, timeout = _check_limits(max_events, timeout)
        got = await self._consumer._poll(self.connection, max_events, timeout)
        self.events.extend(got)
        return got
