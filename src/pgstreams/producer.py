"""Publishing: validating and encoding events, choosing partitions, storing them through the storage layer.

Keys pick partitions with :func:`pgstreams.partitioner.partition_for_key`; events without key or partition
go round-robin from a random partition per topic and client. Single events are inserted straight through
libpq on a pooled connection; batches are one COPY (all or none).

Idempotent by default, as Kafka's producer: each client has a producer id (drawn once, at its first publish)
and numbers its publishes; a publish on a pooled connection stores its *producer tag* ``(producer id << 32)
| (number mod 2^32)`` in the event row itself. If the connection breaks during the call (a restart, a killed
session), the outcome is unknown: the publish is retried on a fresh connection (within the client's
``retry_timeout``), which first waits until the broken session ended, then looks for the tag in the event's
partitions above the last position the client knew before the attempt, and stores the event only if it is
absent. Nothing is written per event beyond the tag, and the successful path gains no round trip.
``connect(idempotent=False)`` turns the tags off (a retried publish is then stored again: at least once).
The asyncio client (:mod:`pgstreams.aio`) publishes with the tags of its sync client's :class:`Producer`
and retries the same way, sharing :func:`checked_row` and the session wait
(:meth:`pgstreams.reconnect.RetryRule.session_waits`).

A client caches each topic's row (partition count, ``max.message.bytes``), so that a publish costs one round
trip. A change of the topic in another process (:meth:`pgstreams.Client.alter_topic`) is noticed within
:data:`TOPIC_CHECK_INTERVAL` seconds of publishing: once per interval and topic, a single publish also
reads the topic's row in the same round trip (one more statement in its pipeline), and ``publish_many``
reads it before its batch; a changed row is forgotten, so the next publish reads the topic again and uses
the new partition count. Publishes inside a caller's transaction (``conn=``) do not check. An event given
an explicit partition beyond the cached count reads the topic again before it is refused. (Listening for
a notification of the change instead would cost the server more: PostgreSQL wakes every listening
session of a database for every notification, and publishers send wake-up notifications all the time.)
"""

from __future__ import annotations

import functools
import itertools
import random
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import pq
from psycopg.types.json import Jsonb

from .codec import KIND_BYTES, check_headers, check_optional_str, encode_value
from .errors import InvalidArgument, MessageTooLarge
from .models import Message, PublishResult
from .partitioner import partition_for_key
from .reconnect import Reconnect, retriable
from .storage import EventRow, Segments, Store, StoredAt, TopicRecord, TopicVersion
from .topicconfig import MAX_MESSAGE_BYTES, TOPIC_CONFIG_DEFAULTS

#: Seconds between two reads of a topic's row by a publishing client, which notice a change made elsewhere
#: (a partition count raised by :meth:`pgstreams.Client.alter_topic`).
TOPIC_CHECK_INTERVAL = 0.5

_MESSAGE_FIELDS = frozenset(Message.__dataclass_fields__)
# Keys repeat: remember recent keys' partitions (murmur2 in Python costs microseconds per key).
_key_partition = functools.lru_cache(maxsize=16384)(partition_for_key)


@dataclass
class TopicState:
    """What a client keeps per topic while publishing: the topic's row (``id``, ``name`` and ``partitions``
    copied from it as plain attributes: they are read once per event), its segments as last seen, the
    round-robin counter of keyless events, and when ``publish_many`` reads the sequence again."""

    record: TopicRecord
    id: int
    name: str
    partitions: int
    segments: Segments
    round_robin: Iterator[int]
    copies_until_check: int = 0  # events publish_many may still COPY before it re-checks the segments ahead
    copied_lower_bound: int = -1  # a lower bound of the last position publish_many stored (-1: unknown)
    max_bytes: int = int(TOPIC_CONFIG_DEFAULTS[MAX_MESSAGE_BYTES])  # the topic's max.message.bytes
    known: int = 0  # a position handed out already: every publish starting later stores its events above
    check_at: float = 0.0  # time.monotonic() when a publish next reads the topic's row (see the module)
    #: the last reading of the topic's row found no consumer waiting for its events: no wake-up
    #: notification until the next reading (see ``0027_topic_waiters.sql``)
    quiet: bool = False
    #: keys of ``publish_many`` events already checked, and their partitions (at most 16,384 kept)
    key_partitions: dict[str, int] = field(default_factory=dict)

    @classmethod
    def of(cls, record: TopicRecord) -> TopicState:
        """A fresh state for ``record``."""
        return cls(record, record.id, record.name, record.partitions,
                   Segments(record.id, record.segment_size, covered=record.segments_end),
                   itertools.count(random.randrange(record.partitions)),
                   max_bytes=int(record.config.get(MAX_MESSAGE_BYTES,
                                                   TOPIC_CONFIG_DEFAULTS[MAX_MESSAGE_BYTES])),
                   known=record.last_position, check_at=time.monotonic() + TOPIC_CHECK_INTERVAL)

    def changed(self, version: TopicVersion | None) -> bool:
        """Whether the topic's row read now (``None``: the topic is gone) differs from the cached one."""
        return (version is None or version.partitions != self.partitions
                or version.config != self.record.config)

    def check_due(self) -> bool:
        """Whether a publish should read the topic's row now (every :data:`TOPIC_CHECK_INTERVAL`); if so,
        the next reading is scheduled and wake-ups are sent until this one's answer (:meth:`seen`)."""
        now = time.monotonic()
        if now < self.check_at:
            return False
        self.check_at = now + TOPIC_CHECK_INTERVAL
        self.quiet = False
        return True

    def seen(self, version: TopicVersion | None) -> bool:
        """Take in the topic's row read now (``None``: the topic is gone): whether a consumer waits
        (:attr:`quiet`); true if the row differs from the cached one (see :meth:`changed`)."""
        self.quiet = version is not None and not version.waiting
        return self.changed(version)


def event_size(row: EventRow) -> int:
    """The size :data:`max.message.bytes <pgstreams.topicconfig.MAX_MESSAGE_BYTES>` limits: the value's bytes
    as stored, plus the key's and the header names' and values' (UTF-8)."""
    n = len(row[3])
    key = row[2]
    if key is not None:
        n += len(key) if key.isascii() else len(key.encode("utf-8"))
    headers = row[4]
    if headers is not None:
        n += sum(len(k.encode("utf-8")) + len(v.encode("utf-8")) for k, v in headers.obj.items())
    return n


def _bad_text(s: str) -> str | None:
    """Why PostgreSQL text cannot hold ``s`` (a NUL character, an unpaired surrogate), else ``None``."""
    if "\x00" in s:
        return "contains a NUL character"
    if not s.isascii():
        try:
            s.encode("utf-8")
        except UnicodeEncodeError:
            return "is not valid Unicode (unpaired surrogate)"
    return None


def choose_partition(state: TopicState, key: str | None, partition: object) -> int:
    """The partition of an event: ``partition`` if given (checked), else the key's, else round-robin."""
    if partition is not None:
        if isinstance(partition, bool) or not isinstance(partition, int):
            raise InvalidArgument(f"partition must be an integer, not {type(partition).__name__}")
        if not 0 <= partition < state.partitions:
            raise InvalidArgument(
                f"partition {partition} out of range for topic {state.name!r} (0 to {state.partitions - 1})")
        return partition
    if key is not None:
        return _key_partition(key, state.partitions)
    return next(state.round_robin) % state.partitions


def route(state: TopicState, key: object, partition: object) -> int:
    """Check an event's key and choose its partition (see :func:`choose_partition`)."""
    if key is not None:
        if not isinstance(key, str):
            raise InvalidArgument(f"key must be a string or None, not {type(key).__name__}")
        if why := _bad_text(key):
            raise InvalidArgument(f"key {key!r} {why}")
        if partition is None:
            return _key_partition(key, state.partitions)
    return choose_partition(state, key, partition)


def encode_row(p: int, value: Any, key: str | None, headers: object, event_type: object, event_id: object,
               correlation_id: object, causation_id: object, producer: int | None = None) -> EventRow:
    """Validate and encode the fields of an event routed to partition ``p`` (its key checked by
    :func:`route`)."""
    # runs once per event in publish_many: the checks of absent fields are skipped inline
    hdrs = None if headers is None else check_headers(headers)
    if hdrs:
        for k, v in hdrs.items():
            if why := _bad_text(k) or _bad_text(v):
                raise InvalidArgument(f"header {k!r}: {v!r} {why}")
    if event_type is None and event_id is None and correlation_id is None and causation_id is None:
        et = eid = cid = sid = None
    else:
        et = check_optional_str("event_type", event_type)
        eid = check_optional_str("event_id", event_id)
        cid = check_optional_str("correlation_id", correlation_id)
        sid = check_optional_str("causation_id", causation_id)
        for name, text in (("event_type", et), ("event_id", eid), ("correlation_id", cid),
                           ("causation_id", sid)):
            if text is not None and (why := _bad_text(text)):
                raise InvalidArgument(f"{name} {text!r} {why}")
    if type(value) is bytes:
        kind, payload = KIND_BYTES, value
    else:
        try:
            kind, payload = encode_value(value)
        except UnicodeEncodeError as exc:
            raise InvalidArgument(f"value is not valid Unicode (unpaired surrogate): {exc}") from None
    return (p, kind, key, payload, Jsonb(hdrs) if hdrs else None, et, eid, cid, sid, producer)


def event_row(state: TopicState, value: Any, key: object, headers: object, partition: object,
              event_type: object, event_id: object, correlation_id: object, causation_id: object,
              producer: int | None = None) -> EventRow:
    """Validate and encode one event (raises :class:`InvalidArgument` naming the bad field); ``producer``
    is its producer tag (default none)."""
    p = route(state, key, partition)
    return encode_row(p, value, key, headers, event_type, event_id,  # type: ignore[arg-type]
                      correlation_id, causation_id, producer)


def checked_row(state: TopicState, row_args: tuple[Any, ...], tag: int | None) -> EventRow:
    """:func:`event_row` of ``row_args`` (value, key, headers, partition, event_type, event_id,
    correlation_id, causation_id) with producer tag ``tag``, checked against the topic's
    ``max.message.bytes`` (:class:`MessageTooLarge`): a single publish's row, sync or async."""
    row = event_row(state, *row_args, producer=tag)  # type: ignore[misc]
    if len(row[3]) > state.max_bytes or event_size(row) > state.max_bytes:
        raise MessageTooLarge(f"event of {event_size(row)} bytes exceeds max.message.bytes "
                              f"({state.max_bytes}) of topic {state.name!r}; nothing was stored")
    return row


def _fields(ev: object) -> Mapping[str, Any]:
    """The fields of a batch's event given as a dict (checked) or a Message subclass."""
    if isinstance(ev, Message):
        return ev.__dict__
    if isinstance(ev, Mapping):
        unknown = set(ev) - _MESSAGE_FIELDS
        if unknown:
            raise InvalidArgument(f"unknown field(s) {sorted(unknown)}")
        if "value" not in ev:
            raise InvalidArgument("missing 'value'")
        return ev
    raise InvalidArgument(f"expected a Message or a dict, not {type(ev).__name__}")


#: Events a batch routes at a time while the COPY takes its rows.
_ROUTE_AHEAD = 256

#: Keys a client keeps checked and routed per topic (:attr:`TopicState.key_partitions`).
_KEYS_KEPT = 16384


class Batch:
    """A ``publish_many`` batch. The publisher's registration names the batch's partitions before the COPY
    starts (:meth:`fence_partitions`); its events are routed (keys checked, partitions chosen) only as far
    as that needs: when events of a :class:`Message` without an explicit partition have covered every
    partition of the topic, the rest are routed as the COPY takes them. Each row is validated, encoded and
    size-checked when the COPY takes it, so that the server stores the first rows while the client encodes
    the next ones. Iterating gives the rows in order (encoded once, kept for another attempt); an invalid
    event raises :class:`InvalidArgument` (or :class:`MessageTooLarge`) naming it, which rolls the COPY
    back. Explicit partitions and dict events are routed when the batch is made (an explicit partition
    beyond the cached partition count makes the caller read the topic again)."""

    __slots__ = ("_covered", "events", "has_ids", "partitions", "producer", "rows", "state")

    def __init__(self, state: TopicState, events: Iterable[Message | Mapping[str, Any]],
                 producer: int | None = None) -> None:
        if isinstance(events, (Message, Mapping, str, bytes)) or not isinstance(events, Iterable):
            raise InvalidArgument(
                f"events must be an iterable of Message objects or dicts, not {type(events).__name__}")
        self.state = state
        self.events = events if isinstance(events, (list, tuple)) else list(events)
        self.producer = producer
        self.rows: list[EventRow] = []
        #: the partitions of the events routed so far (a prefix of the events)
        self.partitions: list[int] = []
        self._covered: set[int] = set()
        has_ids = eager = False
        for ev in self.events:
            if type(ev) is not Message or ev.partition is not None:
                eager = True
                break
            if ev.event_id is not None:
                has_ids = True
        if eager:
            self._route(len(self.events))
            has_ids = any((ev.event_id if type(ev) is Message else _fields(ev).get("event_id")) is not None
                          for ev in self.events)
        self.has_ids = has_ids

    def _route(self, until: int) -> None:
        """Route the events up to index ``until`` (exclusive) not routed yet."""
        state, partitions, events = self.state, self.partitions, self.events
        keyed = state.key_partitions
        for i in range(len(partitions), until):
            ev = events[i]
            try:
                if type(ev) is Message:  # the common case, without a dict's lookups
                    key = ev.key
                    if ev.partition is None and type(key) is str and (p := keyed.get(key, -1)) >= 0:
                        pass  # a key checked and routed before
                    else:
                        p = route(state, key, ev.partition)
                        if ev.partition is None and type(key) is str:
                            if len(keyed) >= _KEYS_KEPT:
                                keyed.clear()
                            keyed[key] = p
                else:
                    f = _fields(ev)
                    p = route(state, f.get("key"), f.get("partition"))
            except InvalidArgument as exc:
                raise InvalidArgument(f"event {i}: {exc}") from None
            partitions.append(p)
            self._covered.add(p)

    def fence_partitions(self) -> list[int]:
        """The partitions of the batch's events, each once, in order: its events are routed until they
        cover every partition of the topic (then the rest can only fall in them) or are all routed."""
        everything = self.state.partitions
        n = len(self.events)
        while len(self.partitions) < n and len(self._covered) < everything:
            self._route(min(n, len(self.partitions) + 16))
        return sorted(self._covered)

    def __len__(self) -> int:
        return len(self.events)

    def __iter__(self) -> Iterator[EventRow]:
        rows = self.rows
        yield from rows[:]
        events, partitions, producer = self.events, self.partitions, self.producer
        limit = self.state.max_bytes
        row: EventRow
        for i in range(len(rows), len(events)):
            ev = events[i]
            if i >= len(partitions):  # route ahead in blocks: a call per event would cost a third more
                self._route(min(len(events), i + _ROUTE_AHEAD))
            try:
                if type(ev) is Message:
                    if type(ev.value) is bytes and ev.headers is None and ev.event_type is None \
                            and ev.event_id is None and ev.correlation_id is None and ev.causation_id is None:
                        # the common case, as encode_row makes it (the key was checked by routing)
                        row = (partitions[i], KIND_BYTES, ev.key, ev.value, None, None, None, None, None,
                               producer)
                    else:
                        row = encode_row(partitions[i], ev.value, ev.key, ev.headers, ev.event_type,
                                         ev.event_id, ev.correlation_id, ev.causation_id, producer)
                else:
                    f = _fields(ev)
                    row = encode_row(partitions[i], f["value"], f.get("key"), f.get("headers"),
                                     f.get("event_type"), f.get("event_id"), f.get("correlation_id"),
                                     f.get("causation_id"), producer)
            except InvalidArgument as exc:
                raise InvalidArgument(f"event {i}: {exc}") from None
            key = row[2]
            # exact sizes only when a bound (4 UTF-8 bytes a character) may exceed the limit
            if (len(row[3]) + (0 if key is None else 4 * len(key)) > limit or row[4] is not None) \
                    and event_size(row) > limit:
                raise MessageTooLarge(f"event {i}: {event_size(row)} bytes exceed max.message.bytes "
                                      f"({limit}) of topic {self.state.name!r}; nothing was stored")
            rows.append(row)
            yield row

    def used_partitions(self) -> list[int]:
        """The partitions of the batch's events, each once, in order (routing every event)."""
        self._route(len(self.events))
        return sorted(self._covered)


@dataclass
class Producer:
    """Publishes for a client: ``store`` is its storage, ``topic`` resolves a name to its state
    (``refresh=True`` reads it again, ``conn`` is a connection the caller already holds), ``announce``
    schedules a wake-up notification of a topic after a commit, ``claim`` says whether a single publish
    should send it itself (see :meth:`pgstreams.storage.notifications.Notifier.claim`) and ``connect``
    makes the producer's own autocommit connection. Single publishes use that connection (one thread at a
    time; concurrent ones take pooled connections): the pool's check-out and return cost a sixth of the
    client's CPU per publish. ``producer_id`` draws the client's producer id (once, at its first
    publish); ``retry`` is its retry rule (see the module docstring). ``idempotent`` (default true) false:
    no producer tag (and no producer id): a publish retried after an unknown outcome is stored again."""

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
        self._base_value: int | None = None
        self._id_lock = threading.Lock()
        self._numbers = itertools.count(1)  # thread-safe in CPython (one C call)

    @property
    def _base(self) -> int:
        """The producer id in the tags' high bits, drawn with ``producer_id()`` at the first publish (a
        client that never publishes draws none)."""
        base = self._base_value
        if base is None:
            with self._id_lock:
                if self._base_value is None:
                    self._base_value = (self.producer_id() & 0x7FFFFFFF) << 32
                base = self._base_value
        return base

    def tag(self) -> int:
        """The producer tag of the next publish."""
        return self._base | (next(self._numbers) & 0xFFFFFFFF)

    @property
    def drawn(self) -> bool:
        """Whether the producer id was drawn already (then :meth:`tag` makes no round trip; the asyncio
        client draws it in a worker thread first)."""
        return self._base_value is not None

    def draw(self) -> int:
        """The producer id, drawn now if it was not yet (a round trip, retried as the client's calls)."""
        return self._base >> 32

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
        lost: _Interrupted | None = None
        own = self._own_lock.acquire(blocking=False)  # else another thread publishes on the own connection
        try:
            state = self._state(topic, row_args[3])
            tag = self._base | (next(self._numbers) & 0xFFFFFFFF) if self.idempotent else None
            row = checked_row(state, row_args, tag)
            floor = state.known  # read before the attempt: its event is stored above it
            try:
                if own:
                    stored = self._publish_own(topic, state, row)
                else:
                    stored = self._publish_pooled(topic, state, row)
            except _Interrupted as exc:
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
            raise _Interrupted(None, exc) from exc
        try:
            return self._publish_on(c, topic, state, row)
        except Exception as exc:
            if not retriable(exc):
                raise
            raise _Interrupted(_backend_pid(c), exc) from exc
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
            raise _Interrupted(None, exc) from exc
        try:
            return self._publish_on(c, topic, state, row)
        except BaseException as exc:
            pg = c.pgconn
            pid = _backend_pid(c)
            if pg.status != pq.ConnStatus.OK or pg.transaction_status != pq.TransactionStatus.IDLE:
                c.close()
                self._own = None
            if isinstance(exc, Exception) and retriable(exc):
                raise _Interrupted(pid, exc) from exc
            raise

    def _publish_on(self, c: psycopg.Connection, topic: str, state: TopicState, row: EventRow) -> StoredAt:
        """Store ``row`` on ``c`` (autocommit, idle) in its own transaction, with the consumers' wake-up when
        one is due (see :meth:`pgstreams.storage.notifications.Notifier.claim`)."""
        check = state.check_due()  # then read the topic's row too, in the same round trip
        wake = (self.channel, str(state.id)) if not state.quiet and self.claim(state.id) else None
        stored = self._insert_pooled(c, topic, state, row, wake, check=check)
        if stored.position >= state.segments.stats_from:
            state.segments.check_stats(self.store.executor, stored.position, c)
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
        stored once, whether or not that attempt committed."""

        def attempt(c: psycopg.Connection) -> StoredAt:
            found = self._settled(c, state, [row[0]], floor, pid, row[-1])
            if found is not None:
                return found
            return self._insert_pooled(c, topic, state, row, None)

        stored = self.retry.again(attempt, first)
        self.announce(state.id)
        return stored

    def _settled(self, c: psycopg.Connection, state: TopicState, partitions: list[int], floor: int,
                 pid: int | None, producer: int | None) -> StoredAt | None:
        """Wait until the broken session ``pid`` ended its work, then where the events tagged ``producer``
        were stored, if they were (``None``: not stored, publish them)."""
        events = self.store.events
        if pid is not None:
            waits = self.retry.session_waits(pid)
            while events.session_busy(c, pid):
                time.sleep(next(waits))
        if producer is None:
            return None
        return events.produced(c, state.id, partitions, floor, producer)

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
        producer = self._base | (next(self._numbers) & 0xFFFFFFFF) if self.idempotent else None
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
                pid = _backend_pid(conn)
                stored = self._copy(conn, state, rows)
        except Exception as exc:
            if not retriable(exc):
                raise
            stored = self._copy_again(state, rows, floor, pid, producer, exc)
        if not state.quiet:
            self.announce(state.id)
        return stored

    def _copy_again(self, state: TopicState, rows: Batch, floor: int, pid: int | None, producer: int | None,
                    first: BaseException) -> int:
        """``publish_many`` again after its attempt failed with ``first`` (retriable): the batch is stored
        once (all or none), whether or not that attempt committed. Returns what the committed attempt
        stored (for a batch with event ids that committed before, the events found: at least one)."""
        partitions = rows.used_partitions()
        has_ids = rows.has_ids

        def attempt(c: psycopg.Connection) -> int:
            found = self._settled(c, state, partitions, floor, pid, producer)
            if found is not None and producer is not None:
                return len(rows) if not has_ids else self.store.events.count_produced(
                    c, state.id, partitions, floor, producer)
            return self._copy(c, state, rows)

        return self.retry.again(attempt, first)

    def _copy(self, conn: psycopg.Connection, state: TopicState, rows: Batch) -> int:
        # Reading the sequence to keep segments ahead costs a round trip: do it once every 1/16 segment
        # of events; if other clients' events outran it, the COPY fails (no segment for a position)
        # and is retried once after adding segments.
        ex = self.store.executor
        segments = state.segments
        last = -1
        if state.copies_until_check <= 0:
            state.copies_until_check = max(1, state.record.segment_size // 16)
            last = segments.ensure_room_after(ex, len(rows), conn)
        state.copies_until_check -= len(rows)
        try:
            stored = self.store.events.copy(conn, state.id, rows, rows.has_ids, rows.fence_partitions())
        except psycopg.errors.CheckViolation:
            segments.ensure_room_after(ex, len(rows), conn)
            stored = self.store.events.copy(conn, state.id, rows, rows.has_ids, rows.fence_partitions())
        # positions of other clients' events only move the true last position further: this is a lower
        # bound, read again with the segments every 1/16 segment
        if last >= 0:
            state.copied_lower_bound = last + len(rows)
        elif state.copied_lower_bound >= 0:
            state.copied_lower_bound += len(rows)
        if last > state.known:
            state.known = last  # handed out before this batch's positions
        if state.copied_lower_bound >= segments.stats_from:
            segments.check_stats(ex, state.copied_lower_bound, conn)
        return stored


def _backend_pid(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> int | None:
    """The server process of ``conn`` (still known after the connection broke), ``None`` if unknown."""
    try:
        pid = conn.pgconn.backend_pid
    except Exception:  # noqa: BLE001 - a closed connection may not tell
        return None
    return int(pid) if pid else None


class _Interrupted(Exception):
    """A publish's connection broke (``error``, retriable) on session ``pid`` (``None`` if none was used)."""

    def __init__(self, pid: int | None, error: BaseException) -> None:
        super().__init__(str(error))
        self.pid = pid
        self.error = error
