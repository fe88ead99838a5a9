"""``Produce``: Kafka records become pgstreams events.

A record's value is stored as bytes (an event whose value a pgstreams consumer reads as ``bytes``), its
key as text (UTF-8), its headers as the event's headers (UTF-8, one value per name), in the partition the
client chose. The record batches of one partition are stored in one transaction, all or none. Their
time is the time of the commit (Kafka's ``LogAppendTime``), not the producer's.

Batches compressed with any of Kafka's codecs (gzip, snappy, lz4, zstd) are decompressed with
``cramjam``. ``Produce`` v0 to v2 carry legacy message sets (message formats v0 and v1, read by
:mod:`pgstreams.kafka.legacy`): their messages become events the same way, with no headers.

An idempotent producer's batches (``InitProducerId``) are checked against its last batches on the
partition (``0029_kafka_producers.sql``), in the transaction that stores them: a batch sent again is stored
once, one out of order is refused. A transactional producer's batches go into its open transaction (see
:mod:`pgstreams.kafka.transactions`).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import psycopg
from kio.schema.errors import ErrorCode
from psycopg import pq

from ..errors import PermissionDenied, PgStreamsError
from ..models import Message
from ..storage.notifications import channel
from .codec import Request
from .handlers import Context, topic_record
from .legacy import MAGIC_AT, read_message
from .records import (
    COMPRESSION_MASK,
    CONTROL_BIT,
    HEADER,
    TRANSACTIONAL_BIT,
    MalformedBatch,
    RecordError,
    RecordTuple,
    crc_ok,
    decompress,
    read_header,
    read_records,
)
from .transactions import TxnError

#: The API key of ``Produce``.
PRODUCE_KEY = 0
#: ``Produce`` versions below this one carry legacy message sets (v3 came with record batches v2).
LEGACY_BELOW = 3

#: Marks a produce with ``acks=0``: Kafka sends no reply to it.
NO_REPLY: dict[str, Any] = {}


async def produce(ctx: Context, req: Request) -> dict[str, Any]:
    """``Produce``: the request's batches stored in one transaction (see :func:`produce_group`)."""
    (reply,) = await produce_group(ctx, [req])
    return reply


@dataclass
class _Item:
    """One partition of one produce request: its batches, their events (checked), and what became of
    them: the position of each batch's first event, or the error of the whole item."""

    topic: str
    topic_id: int
    partition: int
    batches: list[Batch]
    events: list[list[Message]]
    positions: list[int] = field(default_factory=list)
    error: RecordError | None = None
    #: per batch: where it was stored before (an idempotent producer's batch sent again), else None
    known: list[int | None] = field(default_factory=list)
    #: per batch of an idempotent producer that is new: its remembered entry, whose position is filled in
    #: once stored (else None)
    pending: list[list[int] | None] = field(default_factory=list)

    def take_positions(self, stored: list[int], at: int) -> int:
        """Hand out the positions stored in the item's partition (in order) from index ``at`` to its new
        batches, each its first event's (batches sent again keep where they were stored), and fill them
        into the remembered entries; the index after the item's."""
        for events, known in zip(self.events, self.known, strict=True):
            if known is not None:
                self.positions.append(known)
                continue
            self.positions.append(stored[at] if events and at < len(stored) else -1)
            at += len(events)
        for entry, position in zip(self.pending, self.positions, strict=True):
            if entry is not None:
                entry[2] = position
        return at

    def response(self) -> dict[str, Any]:
        if self.error is not None:
            return _error(self.partition, self.error.code, str(self.error))
        base = self.positions[0] if self.positions else -1
        return {"index": self.partition, "error_code": ErrorCode.none, "base_offset": base,
                "log_append_time": None, "log_start_offset": -1, "record_errors": [], "error_message": None}


async def produce_group(ctx: Context, requests: list[Request]) -> list[dict[str, Any]]:
    """The replies to consecutive ``Produce`` requests of one connection, all stored in one transaction
    (one COPY per partition, one commit): a group commit of the requests a client has in flight. Each
    partition of each request stays all or none on its own: one whose batches are refused (malformed, out
    of sequence, of a fenced producer) is answered with its error and the others are stored; when storing
    fails (a record the topic refuses), every partition is stored again on its own, so that only the
    failing one gets the error. ``base_offset`` is the position of a partition's first event stored."""
    plans: list[tuple[Request, list[tuple[str, list[dict[str, Any] | _Item]]]]] = []
    items: list[_Item] = []
    transactional: list[tuple[str, _Item]] = []
    for req in requests:
        body = req.body
        txn_id: str | None = getattr(body, "transactional_id", None)  # v3 on (none before record batches v2)
        legacy = req.api_version < LEGACY_BELOW
        topics: list[tuple[str, list[dict[str, Any] | _Item]]] = []
        for t in body.topic_data:
            record = await topic_record(ctx, t.name)
            parts: list[dict[str, Any] | _Item] = []
            for pd in t.partition_data:
                index = int(pd.index)
                if record is None or not 0 <= index < record.partitions:
                    parts.append(_error(index, ErrorCode.unknown_topic_or_partition, None))
                    continue
                try:
                    batches = _batches(pd.records or b"", txn_id is not None, legacy)
                    events = [_events_of(b, index) for b in batches]  # every record checked first
                except RecordError as exc:
                    parts.append(_error(index, exc.code, str(exc)))
                    continue
                item = _Item(t.name, record.id, index, batches, events)
                if txn_id is None:
                    items.append(item)
                elif batches:
                    transactional.append((txn_id, item))
                parts.append(item)
            topics.append((t.name, parts))
        plans.append((req, topics))
    for transactional_id, item in transactional:  # into the producer's open transaction
        await _store_in_transaction(ctx, transactional_id, item)
    todo = [i for i in items if i.batches]
    if len(todo) == 1:
        await _store_alone(ctx, todo[0])
    elif todo:
        try:
            await _store(ctx, todo)
        except (PgStreamsError, psycopg.errors.InsufficientPrivilege):
            for item in todo:  # one partition refused: each on its own, to answer only that one's error
                _reset(item)
                await _store_alone(ctx, item)
    replies: list[dict[str, Any]] = []
    for req, topics in plans:
        if int(req.body.acks) == 0:
            replies.append(NO_REPLY)
            continue
        replies.append({"responses": [
            {"name": name, "partition_responses": [p if isinstance(p, dict) else p.response() for p in parts]}
            for name, parts in topics], "throttle_time": 0})
    return replies


def _reset(item: _Item) -> None:
    item.positions, item.error, item.known, item.pending = [], None, [], []


async def _store_alone(ctx: Context, item: _Item) -> None:
    """Store one item in a transaction of its own; a record the topic refuses is the item's error."""
    batch = item.batches[0]
    if len(item.batches) == 1 and batch.producer_id < 0 and len(batch.records) == 1:
        # one record of no idempotent producer: the client's own publish (one round trip, its position)
        (e,) = item.events[0]
        try:
            stored = await ctx.client.publish(item.topic, e.value, key=e.key, headers=e.headers,
                                              partition=item.partition)
        except (PermissionDenied, psycopg.errors.InsufficientPrivilege) as exc:
            item.error = RecordError(ErrorCode.topic_authorization_failed, _denied(exc))
            return
        except PgStreamsError as exc:
            item.error = RecordError(ErrorCode.invalid_record, str(exc))
            return
        item.positions = [stored.position]
        return
    try:
        await _store(ctx, [item])
    except (PermissionDenied, psycopg.errors.InsufficientPrivilege) as exc:
        _reset(item)
        item.error = RecordError(ErrorCode.topic_authorization_failed, _denied(exc))
    except PgStreamsError as exc:
        _reset(item)
        item.error = RecordError(ErrorCode.invalid_record, str(exc))


def _denied(exc: BaseException) -> str:
    """The message of PostgreSQL's refusal (the role may not write the topic)."""
    if isinstance(exc, psycopg.Error):
        return f"permission denied: {(exc.diag.message_primary or str(exc)).strip()}"
    return str(exc)


def _error(index: int, code: ErrorCode, message: str | None) -> dict[str, Any]:
    return {"index": index, "error_code": code, "base_offset": -1, "log_append_time": None,
            "log_start_offset": -1, "record_errors": [], "error_message": message}


def _batches(records: bytes, transactional: bool, legacy: bool) -> list[Batch]:
    """The record batches in ``records`` (:class:`RecordError` for one that cannot be stored): transactional
    batches in a request of a transactional producer, the others elsewhere. With ``legacy`` (``Produce``
    v0-v2) messages of formats v0 and v1 too (:mod:`pgstreams.kafka.legacy`), consecutive ones making one
    batch of no producer; later versions carry record batches v2 only."""
    out: list[Batch] = []
    view = memoryview(records)
    offset = 0
    messages: list[RecordTuple] = []
    while offset < len(view):
        if len(view) - offset <= MAGIC_AT:
            break  # a partial entry at the end (Kafka's clients may send one): ignored, as Kafka does
        magic = view[offset + MAGIC_AT]
        if magic < 2:
            if not legacy:
                raise RecordError(ErrorCode.unsupported_for_message_format,
                                  f"messages of magic {magic} are served in Produce v0 to v2 only (later "
                                  "versions carry record batches v2)")
            found, size = read_message(view, offset)
            messages += found
            offset += size
            continue
        if messages:
            out.append(_legacy_batch(messages))
            messages = []
        if len(view) - offset < HEADER.size:
            break
        batch, size = read_batch(view, offset)
        offset += size
        _check(batch, transactional)
        out.append(batch)
    if messages:
        out.append(_legacy_batch(messages))
    return out


def _legacy_batch(records: list[RecordTuple]) -> Batch:
    """A batch of messages of format v0 or v1: of no producer, not transactional."""
    return Batch(0, -1, -1, -1, records)


@dataclass(frozen=True)
class Batch:
    """A decoded record batch (v2): what ``Produce`` needs of it."""

    attributes: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    records: list[RecordTuple]


def read_batch(view: memoryview, offset: int) -> tuple[Batch, int]:
    """The record batch at ``offset`` and its size; its records decompressed (gzip, snappy, lz4, zstd)."""
    try:
        header = read_header(view, offset)
    except MalformedBatch as exc:
        raise RecordError(ErrorCode.corrupt_message, str(exc)) from None
    end = offset + header.size
    if header.magic != 2:
        raise RecordError(ErrorCode.unsupported_for_message_format,
                          f"record batches of magic {header.magic} are not Kafka's")
    if end > len(view) or header.length < HEADER.size - 12:
        raise RecordError(ErrorCode.corrupt_message, "a record batch longer than its request")
    if not crc_ok(view, offset, header):
        raise RecordError(ErrorCode.corrupt_message, "a record batch whose CRC does not match")
    body: bytes | memoryview = view[offset + HEADER.size:end]
    codec = header.attributes & COMPRESSION_MASK
    if codec:
        body = decompress(codec, bytes(body))
    try:
        records = read_records(body, header.count)
    except MalformedBatch as exc:
        raise RecordError(ErrorCode.corrupt_message, f"a malformed record: {exc}") from None
    return Batch(header.attributes, header.producer_id, header.producer_epoch, header.base_sequence,
                 records), end - offset


def _check(batch: Batch, transactional: bool) -> None:
    if batch.attributes & CONTROL_BIT:
        raise RecordError(ErrorCode.invalid_request, "control batches are the broker's, not a producer's")
    if bool(batch.attributes & TRANSACTIONAL_BIT) != transactional:
        raise RecordError(ErrorCode.invalid_request,
                          "a batch that is not transactional in a transactional producer's request"
                          if transactional else "a transactional batch in a request of no transactional id")


def _events_of(batch: Batch, partition: int) -> list[Message]:
    events = []
    for key, value, pairs in batch.records:
        try:
            headers: dict[str, str] = {}
            for name_bytes, header_value in pairs:
                name = name_bytes.decode("utf-8")
                if name in headers:
                    raise RecordError(ErrorCode.invalid_record, f"header {name!r} appears twice in a record")
                headers[name] = "" if header_value is None else header_value.decode("utf-8")
            text = None if key is None else key.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise RecordError(ErrorCode.invalid_record,
                              f"a record's key or header is not UTF-8 text: {exc}") from None
        events.append(Message(value, key=text, headers=headers or None, partition=partition))
    return events


#: How many of a producer's last batches per partition are remembered (Kafka's limit on the batches an
#: idempotent producer has in flight, ``max.in.flight.requests.per.connection``).
REMEMBERED_BATCHES = 5


async def _store(ctx: Context, items: list[_Item]) -> None:
    """Store the batches of ``items`` in one transaction (see :func:`_store_once`); once more after the
    topic's segments were grown when other clients' events outran them."""
    try:
        await _store_once(ctx, items)
    except psycopg.errors.CheckViolation:
        for item in items:
            _reset(item)
        for topic in {i.topic for i in items}:
            await ctx.client.make_room(topic, sum(len(b.records) for i in items for b in i.batches))
        await _store_once(ctx, items)


async def _store_once(ctx: Context, items: list[_Item]) -> None:
    """Store the batches of ``items`` in one transaction: per topic one multi-row insert of every
    partition's events, whose positions (in order per partition) are handed out to the batches in order,
    then the commit and the topics' consumers' wake-up. Without idempotent producers that is one round
    trip (:meth:`pgstreams.aio.AsyncClient.publish_returning`); their batches add the check of their
    sequences before and the producers' remembered batches after. Items refused by their sequence checks
    get their error and store nothing."""
    client = ctx.client
    ex = client.store.ex
    async with client.connection() as conn:
        try:
            if any(b.producer_id >= 0 for i in items for b in i.batches):
                await conn.execute("BEGIN")  # the producers' batches are checked in the transaction
            dirty = await _check_sequences(ex, conn, items)
            by_topic: dict[int, tuple[str, list[_Item], list[Message]]] = {}
            for item in items:
                if item.error is not None:
                    continue
                _name, its, rows = by_topic.setdefault(item.topic_id, (item.topic, [], []))
                its.append(item)
                for events, known in zip(item.events, item.known, strict=True):
                    if known is None:
                        rows.extend(events)
            written = [t for t, (_n, _i, rows) in by_topic.items() if rows]
            cur = psycopg.AsyncClientCursor(conn)
            # the wake-up of the topics' consumers, right after the commit (the requests in flight are
            # stored together, so a busy producer's wake-ups are coalesced already)
            ids = ",".join(map(str, written))
            wake = [cur.mogrify("SELECT pg_notify(%s, %s)", (channel(client.schema), ids))] if written else []
            batches = [(name, rows) for name, _its, rows in by_topic.values() if rows]
            stored = await client.publish_returning(conn, batches, [] if dirty else ["COMMIT", *wake]) \
                if batches else []
            got = iter(stored)
            for _name, its, rows in by_topic.values():
                positions = next(got) if rows else {}
                used: dict[int, int] = {}
                for item in its:
                    used[item.partition] = item.take_positions(positions.get(item.partition, []),
                                                               used.get(item.partition, 0))
            if conn.info.transaction_status != pq.TransactionStatus.IDLE:
                # still open: the producers' remembered batches, the commit and the wake-up in one message
                put = ex.query("kafka_sequences_put")
                end = [cur.mogrify(put, (*key, epoch, *([e[n] for e in entries] for n in range(3))))
                       for key, (epoch, entries) in dirty.items()]
                await cur.execute("; ".join([*end, "COMMIT", *wake]))
        except BaseException:
            if not conn.closed and conn.info.transaction_status != pq.TransactionStatus.IDLE:
                with contextlib.suppress(psycopg.Error):
                    await conn.execute("ROLLBACK")
            raise


async def _store_in_transaction(ctx: Context, transactional_id: str, item: _Item) -> None:
    """Store ``item``'s batches in the open transaction of its transactional producer (see
    :mod:`pgstreams.kafka.transactions`): checked against the producer's epoch, the transaction's
    partitions and the producer's sequence numbers (kept in memory, with the transaction)."""
    first = item.batches[0]
    try:
        txn = await ctx.transactions.get(ctx, transactional_id, first.producer_id, first.producer_epoch)
    except TxnError as exc:
        item.error = RecordError(exc.code, str(exc))
        return
    if (item.topic, item.partition) not in txn.partitions:
        item.error = RecordError(ErrorCode.invalid_txn_state, f"partition {item.partition} of {item.topic!r} "
                                                              "was not added to the transaction")
        return
    key = (item.topic_id, item.partition)
    state: _Remembered = txn.sequences.get(key, (-1, []))
    try:
        for batch in item.batches:
            known, state = _sequence(txn.epoch, state, batch)
            item.known.append(known)
            item.pending.append(state[1][-1] if known is None else None)
    except RecordError as exc:
        _reset(item)
        item.error = exc
        return
    rows = [e for events, known in zip(item.events, item.known, strict=True) if known is None for e in events]
    async with txn.lock:
        if not txn.open:
            _reset(item)
            item.error = RecordError(ErrorCode.invalid_txn_state, "the transaction is not open (it ended or "
                                                                  "timed out)")
            return
        assert txn.conn is not None
        try:
            stored = (await ctx.client.publish_returning(txn.conn, [(item.topic, rows)]))[0] if rows else {}
        except PgStreamsError as exc:  # refused before anything was sent: the transaction goes on
            _reset(item)
            item.error = RecordError(ErrorCode.invalid_record, str(exc))
            return
        except psycopg.Error as exc:  # the transaction failed: it can only be aborted now
            await ctx.transactions.fail(ctx, txn)
            _reset(item)
            item.error = RecordError(ErrorCode.topic_authorization_failed, _denied(exc)) \
                if isinstance(exc, psycopg.errors.InsufficientPrivilege) \
                else RecordError(ErrorCode.unknown_server_error, f"the transaction failed: {exc}")
            return
    item.take_positions(stored.get(item.partition, []), 0)
    txn.sequences[key] = state
    txn.topics.add(item.topic_id)


#: An idempotent producer's remembered batches on a partition: its epoch, and per batch (oldest first) its
#: base sequence, record count and the position of its first event.
_Remembered = tuple[int, list[list[int]]]


async def _check_sequences(ex: Any, conn: psycopg.AsyncConnection, items: list[_Item]
                           ) -> dict[tuple[int, int, int], _Remembered]:
    """Check the batches of idempotent producers in ``items`` against each producer's remembered batches
    (locked for the transaction; producers in order of their ids): fill in each item's ``known`` (a batch
    sent again: where it was stored) and ``pending`` (the entries of its new batches), or its ``error``
    (then none of its batches counts). The remembered batches to store, per producer and partition."""
    producers = sorted({b.producer_id for i in items for b in i.batches if b.producer_id >= 0})
    epochs: dict[int, int | None] = {}
    for producer in producers:
        row = await ex.one("kafka_producer_epoch", (producer,), conn=conn)
        epochs[producer] = None if row is None else int(row[0])
    states: dict[tuple[int, int, int], _Remembered] = {}
    for item in items:
        trial: dict[tuple[int, int, int], _Remembered] = {}
        try:
            for batch in item.batches:
                if batch.producer_id < 0:
                    item.known.append(None)
                    item.pending.append(None)
                    continue
                key = (batch.producer_id, item.topic_id, item.partition)
                state = trial.get(key) or states.get(key)
                if state is None:
                    got = await ex.one("kafka_sequences_get", key, conn=conn)
                    state = (-1, []) if got is None else (
                        int(got[0]), [[int(s), int(c), int(p)] for s, c, p in zip(got[1], got[2], got[3],
                                                                                   strict=True)])
                known, state = _sequence(epochs[batch.producer_id], state, batch)
                trial[key] = state
                item.known.append(known)
                item.pending.append(state[1][-1] if known is None else None)
        except RecordError as exc:
            item.error, item.known, item.pending = exc, [], []
            continue
        states.update(trial)
    return states


def _sequence(current: int | None, state: _Remembered, batch: Batch) -> tuple[int | None, _Remembered]:
    """Check ``batch`` of an idempotent producer whose current epoch is ``current`` (None: unknown)
    against its remembered batches ``state``: the position it was stored at before (sent again) or None
    (new), and the remembered batches with it (a new list: ``state`` is unchanged); ``RecordError`` for a
    batch out of order or of an old epoch."""
    if current is None:
        raise RecordError(ErrorCode.unknown_producer_id, f"producer id {batch.producer_id} is unknown")
    if batch.producer_epoch < current:
        raise RecordError(ErrorCode.invalid_producer_epoch,
                          f"producer epoch {batch.producer_epoch} is older than {current}")
    count = len(batch.records)
    epoch, entries = state
    if not entries or batch.producer_epoch > epoch:  # a new producer, or a new epoch: from sequence 0
        if batch.base_sequence != 0:
            raise RecordError(ErrorCode.out_of_order_sequence_number,
                              f"the first batch of a producer epoch starts at sequence "
                              f"{batch.base_sequence}, not 0")
        return None, (batch.producer_epoch, [[0, count, -1]])
    for seq, n, position in entries:
        if seq == batch.base_sequence and n == count:
            if position < 0:  # sent again within the same group, not stored yet: a duplicate
                raise RecordError(ErrorCode.duplicate_sequence_number,
                                  f"batch sequence {seq} was sent twice in a row")
            return position, state  # sent again: stored once
    expected = (entries[-1][0] + entries[-1][1]) % 2**31
    if batch.base_sequence != expected:
        code = ErrorCode.duplicate_sequence_number if batch.base_sequence < entries[0][0] \
            else ErrorCode.out_of_order_sequence_number
        raise RecordError(code, f"batch sequence {batch.base_sequence}, expected {expected}")
    return None, (epoch, [*entries, [batch.base_sequence, count, -1]][-REMEMBERED_BATCHES:])


async def init_producer_id(ctx: Context, req: Request) -> dict[str, Any]:
    """``InitProducerId``: a new producer id (epoch 0), or, given a producer's id and current epoch, its
    next epoch (earlier epochs are then fenced); with a transactional id, that id's producer id and its
    next epoch (see :mod:`pgstreams.kafka.transactions`)."""
    body = req.body
    fail = {"throttle_time": 0, "producer_id": -1, "producer_epoch": -1}
    if body.transactional_id is not None:
        timeout = body.transaction_timeout
        ms = int(timeout.total_seconds() * 1000) if isinstance(timeout, timedelta) else int(timeout)
        try:
            producer, epoch = await ctx.transactions.init(ctx, body.transactional_id, ms)
        except TxnError as exc:
            return {**fail, "error_code": exc.code}
        return {"throttle_time": 0, "error_code": ErrorCode.none, "producer_id": producer,
                "producer_epoch": epoch}
    ex = ctx.client.store.ex
    pid = int(getattr(body, "producer_id", -1))
    epoch = int(getattr(body, "producer_epoch", -1))

    async def go(conn: psycopg.AsyncConnection) -> Any:
        if pid >= 0 and epoch >= 0:
            return await ex.one("kafka_producer_bump", (pid, epoch), conn=conn)
        return await ex.one("kafka_producer_new", (), conn=conn)

    row = await ctx.client.run(go)
    if row is None:
        return {**fail, "error_code": ErrorCode.invalid_producer_epoch}
    return {"throttle_time": 0, "error_code": ErrorCode.none, "producer_id": int(row[0]),
            "producer_epoch": int(row[1])}
