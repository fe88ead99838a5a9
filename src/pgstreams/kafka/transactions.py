"""Kafka transactions: ``InitProducerId`` with a transactional id, ``AddPartitionsToTxn``,
``AddOffsetsToTxn``, ``TxnOffsetCommit``, ``EndTxn`` and transactional ``Produce``.

A Kafka transaction is one PostgreSQL transaction, on a connection of its own that the gateway holds from
the transaction's first partition (or offsets) to ``EndTxn``: its records are inserted in it as they
arrive, the group offsets it commits (``send_offsets_to_transaction``) are the group's checkpoints written
in it, and ``EndTxn`` commits or rolls it back. So the records of an open transaction sit above their
partitions' read fences, held back from every reader (Kafka's last stable offset is that fence), appear
together at the commit, and vanish at an abort, with the offsets; consume-transform-produce is exactly
once. A transaction open longer than its timeout is rolled back, and its producer fenced.

A transactional id's producer id and epoch are in ``kafka_producers`` (``0030_kafka_transactions.sql``):
each ``InitProducerId`` with the id bumps the epoch, which fences earlier producers (their requests get
``PRODUCER_FENCED``) and rolls back a transaction of theirs open in this gateway. A transaction holds its
producer's row (shared) until it ends, so an ``InitProducerId`` on another gateway waits for it, up to a
few seconds (then ``CONCURRENT_TRANSACTIONS``, which clients retry). Sequence numbers of a transactional
producer are checked in the gateway's memory (the transaction lives there too).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field
from typing import Any

import psycopg
from kio.schema.errors import ErrorCode

from ..storage.notifications import channel
from .codec import Request
from .handlers import Context, topic_record

log = logging.getLogger("pgstreams.kafka")

#: The longest an ``InitProducerId`` waits for a transaction of the same transactional id open on
#: another gateway before answering ``CONCURRENT_TRANSACTIONS``.
LOCK_WAIT = "5s"

#: The transaction timeout when a producer gives none (Kafka's default ``transaction.timeout.ms``).
DEFAULT_TIMEOUT = 60.0


@dataclass
class Txn:
    """A transactional producer known to this gateway: its id and epoch, and its open transaction (the
    connection, the partitions and topics in it, the timer that aborts it), if any."""

    transactional_id: str
    producer_id: int
    epoch: int
    timeout: float
    conn: psycopg.AsyncConnection | None = None
    partitions: set[tuple[str, int]] = field(default_factory=set)
    topics: set[int] = field(default_factory=set)
    #: the producer's remembered batches per (topic id, partition): epoch, and (base sequence, count,
    #: position) of each of the last few (as ``pgstreams.kafka.writes`` keeps in the database)
    sequences: dict[tuple[int, int], tuple[int, list[list[int]]]] = field(default_factory=dict)
    timer: asyncio.TimerHandle | None = None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    fenced: bool = False
    #: the transaction failed in the database and was rolled back: only an abort ends it
    failed: bool = False

    @property
    def open(self) -> bool:
        conn = self.conn
        return conn is not None and conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE


class TxnError(Exception):
    """A transactional request refused: Kafka's error code and a message."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code


class Transactions:
    """The transactional producers of one gateway, by transactional id."""

    def __init__(self) -> None:
        self._txns: dict[str, Txn] = {}

    async def init(self, ctx: Context, transactional_id: str, timeout_ms: int) -> tuple[int, int]:
        """A producer initialises with ``transactional_id``: the transaction of an earlier producer open
        here is rolled back, and the id's producer id and next epoch are returned."""
        old = self._txns.pop(transactional_id, None)
        if old is not None:
            old.fenced = True
            async with old.lock:
                await _finish(ctx, old, commit=False)
                await _close(old)

        async def go(conn: psycopg.AsyncConnection) -> Any:
            async with conn.transaction():
                await conn.execute(f"SET LOCAL lock_timeout = '{LOCK_WAIT}'")
                return await ctx.client.store.ex.one("kafka_txn_producer", (transactional_id,), conn=conn)

        try:
            row = await ctx.client.run(go)
        except psycopg.errors.LockNotAvailable:
            raise TxnError(ErrorCode.concurrent_transactions,
                           f"a transaction of {transactional_id!r} is still open elsewhere") from None
        timeout = timeout_ms / 1000 if timeout_ms > 0 else DEFAULT_TIMEOUT
        txn = Txn(transactional_id, int(row[0]), int(row[1]), timeout)
        self._txns[transactional_id] = txn
        return txn.producer_id, txn.epoch

    async def get(self, ctx: Context, transactional_id: str, producer_id: int, epoch: int) -> Txn:
        """The producer ``producer_id`` of ``epoch`` with ``transactional_id`` (:class:`TxnError` when that
        producer is fenced or unknown)."""
        txn = self._txns.get(transactional_id)
        if txn is None:  # initialised on another gateway, or before this one started
            row = await ctx.client.store.ex.one("kafka_txn_of", (transactional_id,))
            if row is None:
                raise TxnError(ErrorCode.invalid_producer_id_mapping,
                               f"transactional id {transactional_id!r} is not initialised")
            txn = Txn(transactional_id, int(row[0]), int(row[1]), DEFAULT_TIMEOUT)
            self._txns[transactional_id] = txn
        if txn.producer_id != producer_id:
            raise TxnError(ErrorCode.invalid_producer_id_mapping,
                           f"producer id {producer_id} is not that of {transactional_id!r}")
        if txn.fenced or epoch != txn.epoch:
            raise TxnError(ErrorCode.producer_fenced,
                           f"producer epoch {epoch} of {transactional_id!r} is fenced")
        return txn

    async def begin(self, ctx: Context, txn: Txn) -> psycopg.AsyncConnection:
        """The connection of ``txn``'s open transaction, begun now if it is not (call with ``txn.lock``)."""
        if txn.open:
            assert txn.conn is not None
            return txn.conn
        if txn.conn is None or txn.conn.closed:
            txn.conn = await ctx.client.new_connection()
        conn = txn.conn
        await conn.execute("BEGIN")
        row = await ctx.client.store.ex.one("kafka_txn_hold", (txn.producer_id,), conn=conn)
        if row is None or int(row[0]) != txn.epoch:
            await conn.execute("ROLLBACK")
            txn.fenced = True
            raise TxnError(ErrorCode.producer_fenced, f"producer epoch {txn.epoch} of "
                                                       f"{txn.transactional_id!r} is fenced")
        loop = asyncio.get_running_loop()
        txn.timer = loop.call_later(txn.timeout, lambda: loop.create_task(self._expire(ctx, txn, conn)))
        return conn

    async def _expire(self, ctx: Context, txn: Txn, conn: psycopg.AsyncConnection) -> None:
        """Roll back ``txn``'s transaction on ``conn`` if it is still open past its timeout, and fence the
        producer (as Kafka does)."""
        async with txn.lock:
            if txn.conn is not conn or not txn.open:
                return
            log.warning("rolling back the transaction of %r: open longer than its timeout (%g s)",
                        txn.transactional_id, txn.timeout)
            txn.fenced = True
            await _finish(ctx, txn, commit=False)
            with contextlib.suppress(psycopg.Error):
                await ctx.client.store.ex.one("kafka_txn_producer", (txn.transactional_id,))

    async def end(self, ctx: Context, txn: Txn, commit: bool) -> None:
        """Commit or roll back ``txn``'s open transaction (nothing to do when none is open); a commit of a
        transaction that failed is refused (``INVALID_TXN_STATE``: the producer must abort)."""
        async with txn.lock:
            if txn.failed:
                if commit:
                    raise TxnError(ErrorCode.invalid_txn_state,
                                   "the transaction failed and was rolled back: abort it")
                txn.failed = False
            if not txn.open:
                txn.partitions.clear()
                return
            await _finish(ctx, txn, commit)

    async def fail(self, ctx: Context, txn: Txn) -> None:
        """``txn``'s transaction failed in the database: roll it back; only an abort ends it now (call
        with ``txn.lock``)."""
        txn.failed = True
        try:
            await _finish(ctx, txn, commit=False)
        except psycopg.Error:
            pass  # the connection is closed: the transaction is gone with it

    async def close(self) -> None:
        """Roll back every open transaction and close the connections (the gateway stops)."""
        for txn in list(self._txns.values()):
            if txn.timer is not None:
                txn.timer.cancel()
            await _close(txn)
        self._txns.clear()


async def _finish(ctx: Context, txn: Txn, commit: bool) -> None:
    if txn.timer is not None:
        txn.timer.cancel()
        txn.timer = None
    conn = txn.conn
    topics, txn.topics, txn.partitions = txn.topics, set(), set()
    if conn is None or conn.closed or not txn.open:
        return
    try:
        if commit:
            await conn.execute("COMMIT")
            if topics:  # wake the consumers of what the transaction wrote
                payload = ",".join(map(str, sorted(topics)))
                await ctx.client.store.notify(channel(ctx.client.schema), payload, conn)
        else:
            await conn.execute("ROLLBACK")
    except psycopg.Error:
        await _close(txn)
        raise


async def _close(txn: Txn) -> None:
    if txn.conn is not None:
        with contextlib.suppress(Exception):
            await txn.conn.close()
        txn.conn = None


def _txn_error(exc: TxnError, version: int) -> ErrorCode:
    # PRODUCER_FENCED is known to clients from the versions that follow KIP-588; older ones know it as
    # INVALID_PRODUCER_EPOCH
    if exc.code == ErrorCode.producer_fenced and version < 2:
        return ErrorCode.invalid_producer_epoch
    return exc.code


async def add_partitions_to_txn(ctx: Context, req: Request) -> dict[str, Any]:
    """``AddPartitionsToTxn`` (v0 to v3): the transaction begins with its first partition."""
    body = req.body
    tid = body.v3_and_below_transactional_id if hasattr(body, "v3_and_below_transactional_id") \
        else body.transactional_id
    pid = int(getattr(body, "v3_and_below_producer_id", getattr(body, "producer_id", -1)))
    epoch = int(getattr(body, "v3_and_below_producer_epoch", getattr(body, "producer_epoch", -1)))
    topics = tuple(getattr(body, "v3_and_below_topics", None) or getattr(body, "topics", None) or ())
    code = ErrorCode.none
    unknown: set[tuple[str, int]] = set()
    try:
        txn = await ctx.transactions.get(ctx, tid, pid, epoch)
        async with txn.lock:
            await ctx.transactions.begin(ctx, txn)
            for t in topics:
                record = await topic_record(ctx, t.name)
                for p in t.partitions:
                    if record is None or not 0 <= int(p) < record.partitions:
                        unknown.add((t.name, int(p)))
                    else:
                        txn.partitions.add((t.name, int(p)))
    except TxnError as exc:
        code = _txn_error(exc, req.api_version)
    results = [{"name": t.name, "results_by_partition": [
        {"partition_index": p, "partition_error_code": ErrorCode.unknown_topic_or_partition
         if (t.name, int(p)) in unknown else code} for p in t.partitions]} for t in topics]
    return {"throttle_time": 0, "error_code": ErrorCode.none, "results_by_topic_v3_and_below": results,
            "results": results}


async def add_offsets_to_txn(ctx: Context, req: Request) -> dict[str, Any]:
    """``AddOffsetsToTxn``: the transaction will commit offsets of a group (it begins if it has not)."""
    body = req.body
    try:
        txn = await ctx.transactions.get(ctx, body.transactional_id, int(body.producer_id),
                                         int(body.producer_epoch))
        async with txn.lock:
            await ctx.transactions.begin(ctx, txn)
    except TxnError as exc:
        return {"throttle_time": 0, "error_code": _txn_error(exc, req.api_version)}
    return {"throttle_time": 0, "error_code": ErrorCode.none}


async def txn_offset_commit(ctx: Context, req: Request) -> dict[str, Any]:
    """``TxnOffsetCommit``: the group's checkpoints (offset - 1, as ``OffsetCommit``) written in the
    transaction: they move at its commit, and not at all when it aborts."""
    body = req.body
    code = ErrorCode.none
    results = []
    try:
        txn = await ctx.transactions.get(ctx, body.transactional_id, int(body.producer_id),
                                         int(body.producer_epoch))
    except TxnError as exc:
        txn, code = None, _txn_error(exc, req.api_version)
    for t in body.topics:
        record = await topic_record(ctx, t.name)
        parts = []
        cursors = {int(p.partition_index): max(0, int(p.committed_offset) - 1) for p in t.partitions
                   if record is not None and 0 <= p.partition_index < record.partitions}
        status = code
        if txn is not None and record is not None and cursors and code == ErrorCode.none:
            try:
                async with txn.lock:
                    conn = await ctx.transactions.begin(ctx, txn)
                    await ctx.client.store.seek_checkpoints(conn, body.group_id, record.id, cursors)
            except TxnError as exc:
                status = _txn_error(exc, req.api_version)
        for p in t.partitions:
            parts.append({"partition_index": p.partition_index,
                          "error_code": status if int(p.partition_index) in cursors
                          else ErrorCode.unknown_topic_or_partition})
        results.append({"name": t.name, "partitions": parts})
    return {"throttle_time": 0, "topics": results}


async def end_txn(ctx: Context, req: Request) -> dict[str, Any]:
    """``EndTxn``: commit or abort the producer's open transaction."""
    body = req.body
    try:
        txn = await ctx.transactions.get(ctx, body.transactional_id, int(body.producer_id),
                                         int(body.producer_epoch))
        await ctx.transactions.end(ctx, txn, bool(body.committed))
    except TxnError as exc:
        return {"throttle_time": 0, "error_code": _txn_error(exc, req.api_version)}
    return {"throttle_time": 0, "error_code": ErrorCode.none}
