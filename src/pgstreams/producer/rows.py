"""Validating, encoding and routing events: an event's row (:func:`checked_row`, :func:`event_row`), the
partition it goes to (:func:`route`, :func:`choose_partition`; keys with
:func:`pgstreams.partitioner.partition_for_key`, events without key or partition round-robin), its size as
``max.message.bytes`` counts it (:func:`event_size`), and a ``publish_many`` batch (:class:`Batch`). The
sync producer and the asyncio client both build their rows here."""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from psycopg.types.json import Jsonb

from ..codec import KIND_BYTES, check_headers, check_optional_str, encode_value
from ..errors import InvalidArgument, KeyRequired, MessageTooLarge
from ..models import Message
from ..partitioner import partition_for_key
from ..storage import EventRow
from .state import TopicState

_MESSAGE_FIELDS = frozenset(Message.__dataclass_fields__)
# Keys repeat: remember recent keys' partitions (murmur2 in Python costs microseconds per key).
_key_partition = functools.lru_cache(maxsize=16384)(partition_for_key)


def event_size(row: EventRow) -> int:
    """The size :data:`max.message.bytes <pgstreams.topicconfig.MAX_MESSAGE_BYTES>` limits: the value's bytes
    as stored, plus the key's and the header names' and values' (UTF-8)."""
    value = row[3]
    n = 0 if value is None else len(value)
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
    """Check an event's key and choose its partition (see :func:`choose_partition`); an event without a key
    on a compacted topic is refused (:class:`KeyRequired`)."""
    if key is None and state.compacted:
        raise KeyRequired(f"topic {state.name!r} is compacted (cleanup.policy "
                          f"{state.record.config.get('cleanup.policy')}): every event needs a key; "
                          "nothing was stored")
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
    :func:`route`). ``None`` with a key is a tombstone (stored without a value, read as ``None``); without
    a key, a JSON null."""
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
    payload: bytes | None
    if type(value) is bytes:
        kind, payload = KIND_BYTES, value
    elif value is None and key is not None:
        kind, payload = KIND_BYTES, None  # a tombstone: no value at all (without a key: a JSON null)
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
    if (row[3] is not None and len(row[3]) > state.max_bytes) or event_size(row) > state.max_bytes:
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
            except InvalidArgument as exc:  # KeyRequired stays what it is
                raise type(exc)(f"event {i}: {exc}") from None
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
            if ((0 if row[3] is None else len(row[3])) + (0 if key is None else 4 * len(key)) > limit
                    or row[4] is not None) \
                    and event_size(row) > limit:
                raise MessageTooLarge(f"event {i}: {event_size(row)} bytes exceed max.message.bytes "
                                      f"({limit}) of topic {self.state.name!r}; nothing was stored")
            rows.append(row)
            yield row

    def used_partitions(self) -> list[int]:
        """The partitions of the batch's events, each once, in order (routing every event)."""
        self._route(len(self.events))
        return sorted(self._covered)


__all__ = ["Batch", "checked_row", "choose_partition", "encode_row", "event_row", "event_size", "route"]
