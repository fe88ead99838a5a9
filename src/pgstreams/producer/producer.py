"""The sync client's publishing (:class:`Producer`): single events straight through libpq on the
producer's own connection (or a pooled one), batches in one COPY, each retried after a lost outcome by
the procedures of :mod:`pgstreams.producer.idempotence` (see the package's docstring)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import psycopg

from ..errors import InvalidArgument
from ..models import Message, PublishResult
from ..reconnect import Reconnect, retriable
from ..storage import PARTITION, EventRow, Store, StoredAt, TopicVersion
from ..storage.events import PRODUCER
from .idempotence import (
    Interrupted,
    ProducerTags,
    Unknown,
    backend_pid,
    copy_again,
    publish_again,
    reusable,
    run_steps,
)
from .rows import Batch, checked_row
from .state import TopicState


@dataclass
class Producer:
    """Publishes for a client: ``store`` is its storage, ``topic`` resolves a name to its state
    (``refresh=True`` reads it again, ``conn`` is a connection the caller already holds), ``announce``
    schedules a wake-up notification of a topic after a commit, ``claim`` says whether a single publish
    should send it itself (see :meth:`pgstreams.storage.notifications.Notifier.claim`) and ``connect``
    makes the producer's own autocommit connection. Single publishes use that connection (one thread at a
    time; concurrent ones take pooled connections): the pool's check-out and return cost a sixth of the
    client's CPU per publish. ``producer_id`` draws the client's producer id (once, at its first
    publish: see :attr:`tags`); ``retry`` is its retry rule (see the package docstring). ``idempotent``
    (default true) false: no producer tag (and no producer id): a publish retried after an unknown
    outcome is stored again."""

    store: Store
    topic: Callable[..., TopicState]
    announce: Callable[[int], None]
    claim: Callable[[int], bool]
    channel: str
    connect: Callable[[], psycopg.Connection]
    producer_id: Callable[[], int]
    retry: Reconnect
    #: forgets the cached state of a topic id (its row changed); default: nothing
    forget: Callable[[int], None] = field(default=lambda topic_id: None, repr=False)
    idempotent: bool = True
    _own: psycopg.Connection | None = field(default=None, init=False, repr=False)
    _own_lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    def __post_init__(self) -> None:
        #: the client's producer tags (its producer id drawn with ``producer_id()`` at the first publish),
        #: shared with the asyncio client built over the client
        self.tags = ProducerTags(self.producer_id)
        self._next_tag = self.tags.next_tag

    @property
    def _base(self) -> int:
        """The producer id in the tags' high bits (see :attr:`ProducerTags.base
        <pgstreams.producer.ProducerTags.base>`)."""
        return self.tags.base

    def tag(self) -> int:
        """The producer tag of the next publish."""
        return self._next_tag()

    @property
    def drawn(self) -> bool:
        """Whether the producer id was drawn already (then :meth:`tag` makes no round trip; the asyncio
        client draws it in a worker thread first)."""
        return self.tags.drawn

    def draw(self) -> int:
        """The producer id, drawn now if it was not yet (a round trip, retried as the client's calls)."""
        return self.tags.draw()

    def _state(self, topic: str, partition: object) -> TopicState:
        """The cached state of ``topic``, read again when an explicit ``partition`` lies beyond its cached
        partition count (the topic may have grown since)."""
        state = self.topic(topic)
        if type(partition) is int and partition >= state.partitions:
            state = self.topic(topic, refresh=True)
        return state

    def publish(self, topic: str, row_args: tuple[Any, ...], conn: psycopg.Connection | None,
                notify: bool = True) -> PublishResult:
        """Publish one event (see :meth:`pgstreams.Client.publish`)."""
        ex = self.store.executor
        if conn is not None:
            state = self._state(topic, row_args[3])
            row = checked_row(state, row_args, None)
            if not isinstance(conn, psycopg.Connection):
                raise InvalidArgument(f"conn must be a psycopg Connection, not {type(conn).__name__}")
            events = self.store.events
            stored = events.insert(conn, state.id, row)
            if notify:
                events.notify(conn, self.channel, str(state.id))
            state.segments.ensure_room(ex, stored.position)
            return PublishResult(state.name, stored.partition, stored.position, stored.duplicate)
        lost: Interrupted | None = None
        own = self._own_lock.acquire(blocking=False)  # else another thread publishes on the own connection
        try:
            state = self._state(topic, row_args[3])
            tag = self._next_tag() if self.idempotent else None
            row = checked_row(state, row_args, tag)
            floor = state.known  # read before the attempt: its event is stored above it
            try:
                if own:
                    stored = self._publish_own(topic, state, row)
                else:
                    stored = self._publish_pooled(topic, state, row)
            except Interrupted as exc:
                lost = exc
        finally:
            if own:
                self._own_lock.release()
        if lost is not None:
            stored = self._again(topic, state, row, floor, lost.pid, lost.error)
        state.known = stored.position
        state.segments.ensure_room(ex, stored.position)
        return PublishResult(state.name, stored.partition, stored.position, stored.duplicate)

    def _publish_pooled(self, topic: str, state: TopicState, row: EventRow) -> StoredAt:
        pool = self.store.executor.pool
        assert pool is not None
        # getconn/putconn: the connection() context manager costs as much again on this path
        try:
            c = pool.getconn()
        except Exception as exc:
            if not retriable(exc):
                raise
            raise Interrupted(None, exc) from exc
        try:
            return self._publish_on(c, topic, state, row)
        except Exception as exc:
            if not retriable(exc):
                raise
            raise Interrupted(backend_pid(c), exc) from exc
        finally:
            pool.putconn(c)

    def _publish_own(self, topic: str, state: TopicState, row: EventRow) -> StoredAt:
        """Publish on the producer's own connection (made on first use; a broken one is closed and made
        again by the next publish)."""
        c = self._own
        try:
            if c is None or c.closed:
                c = self._own = self.connect()
        except Exception as exc:
            if not retriable(exc):
                raise
            raise Interrupted(None, exc) from exc
        try:
            return self._publish_on(c, topic, state, row)
        except BaseException as exc:
            pid = backend_pid(c)
            if not reusable(c):
                c.close()
                self._own = None
            if isinstance(exc, Exception) and retriable(exc):
                raise Interrupted(pid, exc) from exc
            raise

    def _publish_on(self, c: psycopg.Connection, topic: str, state: TopicState, row: EventRow) -> StoredAt:
        """Store ``row`` on ``c`` (autocommit, idle) in its own transaction, with the consumers' wake-up when
        one is due (see :meth:`pgstreams.storage.notifications.Notifier.claim`)."""
        check = state.check_due()  # then read the topic's row too, in the same round trip
        wake = (self.channel, str(state.id)) if not state.quiet and self.claim(state.id) else None
        stored = self._insert_pooled(c, topic, state, row, wake, check=check)
        segments = state.segments
        if segments.stats_due(stored.position):
            segments.check_stats(self.store.executor, stored.position, c)
        return stored

    def close(self) -> None:
        """Close the producer's own connection, if it made one."""
        with self._own_lock:
            if self._own is not None:
                self._own.close()
                self._own = None

    def _again(self, topic: str, state: TopicState, row: EventRow, floor: int, pid: int | None,
               first: BaseException) -> StoredAt:
        """Publish ``row`` again after its attempt failed with ``first`` (retriable) on the session ``pid``:
        stored once, whether or not that attempt committed (:func:`~.idempotence.publish_again`)."""
        unknown = Unknown(state.id, (row[PARTITION],), floor, pid, row[PRODUCER])
        ex = self.store.executor

        def attempt(c: psycopg.Connection) -> StoredAt:
            return run_steps(publish_again(unknown, self.retry.session_waits), ex, c,
                             lambda: self._insert_pooled(c, topic, state, row, None))

        stored = self.retry.again(attempt, first)
        self.announce(state.id)
        return stored

    def _insert_pooled(self, c: psycopg.Connection, topic: str, state: TopicState, row: EventRow,
                       notify: tuple[str, str] | None, check: bool = False) -> StoredAt:
        events = self.store.events
        try:
            if check:
                def seen(version: TopicVersion | None) -> None:
                    if state.seen(version):
                        self.forget(state.id)

                return events.insert_pooled(c, state.id, row, notify, version=seen)
            return events.insert_pooled(c, state.id, row, notify)
        except psycopg.errors.UndefinedTable:
            fresh = self.topic(topic, refresh=True, conn=c)
            return events.insert_pooled(c, fresh.id, row, notify and (self.channel, str(fresh.id)))
        except psycopg.errors.CheckViolation:
            # the position fell beyond the last segment: add segments and retry once
            state.segments.ensure_room_after(self.store.executor, 0, c)
            return events.insert_pooled(c, state.id, row, notify)

    def publish_many(self, topic: str, events: Iterable[Message | Mapping[str, Any]]) -> int:
        """Publish a batch in one transaction (see :meth:`pgstreams.Client.publish_many`)."""
        state = self.topic(topic)
        if state.check_due():  # the topic may have changed elsewhere: read its row
            if state.seen(self.store.events.topic_version(None, state.id)):
                self.forget(state.id)
                state = self.topic(topic)
        producer = self._next_tag() if self.idempotent else None
        try:
            rows = Batch(state, events, producer)
        except InvalidArgument:
            # an explicit partition beyond the cached count: the topic may have grown since it was read
            fresh = self.topic(topic, refresh=True)
            if fresh.partitions == state.partitions:
                raise
            state = fresh
            rows = Batch(state, events, producer)
        if not len(rows):
            return 0
        pool = self.store.executor.pool
        assert pool is not None
        floor = state.known
        pid: int | None = None
        try:
            with pool.connection() as conn:
                pid = backend_pid(conn)
                stored = self._copy(conn, state, rows)
        except Exception as exc:
            if not retriable(exc):
                raise
            stored = self._copy_again(state, rows, floor, pid, producer, exc)
        if not state.quiet:
            self.announce(state.id)
        return stored

    def copy_in(self, conn: psycopg.Connection, topic: str, events: Iterable[Message | Mapping[str, Any]]
                ) -> int:
        """Publish a batch with COPY on ``conn`` in its open transaction (visible when the caller commits;
        not retried: the caller's transaction decides), with the consumers' wake-up sent at commit; the
        number stored. No producer tag: what the caller commits with the batch (a capture's position)
        is what keeps it from being stored twice."""
        state = self.topic(topic, conn=conn)
        rows = Batch(state, events, None)
        if not len(rows):
            return 0
        stored = self._copy(conn, state, rows)
        self.store.events.notify(conn, self.channel, str(state.id))
        return stored

    def _copy_again(self, state: TopicState, rows: Batch, floor: int, pid: int | None, producer: int | None,
                    first: BaseException) -> int:
        """``publish_many`` again after its attempt failed with ``first`` (retriable): the batch is stored
        once (all or none), whether or not that attempt committed (:func:`~.idempotence.copy_again`).
        Returns what the committed attempt stored (for a batch with event ids that committed before, the
        events found: at least one)."""
        unknown = Unknown(state.id, rows.used_partitions(), floor, pid, producer)
        ex = self.store.executor

        def attempt(c: psycopg.Connection) -> int:
            return run_steps(copy_again(unknown, len(rows), rows.has_ids, self.retry.session_waits), ex, c,
                             lambda: self._copy(c, state, rows))

        return self.retry.again(attempt, first)

    def _copy(self, conn: psycopg.Connection, state: TopicState, rows: Batch) -> int:
        """COPY ``rows`` on ``conn``, keeping segments ahead (see :meth:`TopicState.copy_reads_last`: if
        other clients' events outran the segments, the COPY fails for want of one and is retried once
        after adding segments)."""
        ex = self.store.executor
        segments = state.segments
        count = len(rows)
        last = segments.ensure_room_after(ex, count, conn) if state.copy_reads_last(count) else -1
        try:
            stored = self.store.events.copy(conn, state.id, rows, rows.has_ids, rows.fence_partitions())
        except psycopg.errors.CheckViolation:
            segments.ensure_room_after(ex, count, conn)
            stored = self.store.events.copy(conn, state.id, rows, rows.has_ids, rows.fence_partitions())
        segments.check_stats(ex, state.copied(count, last), conn)
        return stored
