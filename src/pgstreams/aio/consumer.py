"""The asyncio consumer (:class:`AsyncConsumer`, made by :meth:`pgstreams.aio.AsyncClient.consumer`): the
cursor bookkeeping of a :class:`~pgstreams.consumer.reader.StreamReader` (read parameters, advancing,
outcomes, applying a commit) and the storage's rules (:mod:`pgstreams.storage.checkpoints`,
:mod:`pgstreams.storage.events`), run on async connections."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from typing import TYPE_CHECKING, Any

import psycopg

from ..consumer.reader import TOPIC_GONE, Cursor, StreamReader, check_limits, events_of, transaction_kept
from ..errors import InvalidArgument, TopicNotFound
from ..models import CommitOutcome, Event
from ..storage.checkpoints import ORIGIN, head_cursors

if TYPE_CHECKING:
    from .client import AsyncClient

#: The first recheck after an empty poll, in seconds; doubled up to the client's ``poll_interval``.
FIRST_RECHECK = 0.002


async def create_checkpoints(client: AsyncClient, reader: StreamReader) -> None:
    """Give ``reader``'s group a checkpoint at the reader's start on each of its partitions that has none
    (:func:`pgstreams.storage.checkpoints.missing_checkpoints`, as the sync reader does), then put the
    reader on the checkpoints."""
    store, group, tid = client.store, reader.group, reader.topic_id
    parts, start = reader.partitions, reader.start
    reader.set_checkpoints(await client.run(  # safe to run again
        lambda conn: store.create_missing_checkpoints(conn, group, tid, parts, start)))


@asynccontextmanager
async def begun(client: AsyncClient) -> AsyncIterator[psycopg.AsyncConnection]:
    """A pooled connection of ``client`` in a transaction just begun, for the block (committed at its end,
    rolled back by an exception); a check-out or ``BEGIN`` that fails because the connection broke is run
    again on a fresh one (the block is not)."""
    pool = client.store.executor.pool

    async def begin(stack: AsyncExitStack, wait: float | None) -> psycopg.AsyncConnection:
        conn = await stack.enter_async_context(pool.connection(timeout=wait))
        await stack.enter_async_context(conn.transaction())
        return conn

    async with client.retry.entered(begin) as conn:
        yield conn


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

    async def _fetch(self, conn: psycopg.AsyncConnection, max_events: int) -> list[Any]:
        params = self._reader.read_params(max_events)
        polled = await self._store.poll_checked(conn, self._reader.topic_id, params)
        rows, self._last = self._reader.advance(polled, params)
        return rows

    async def _poll(self, conn: psycopg.AsyncConnection | None, max_events: int, timeout: float
                    ) -> list[Event]:
        deadline = time.monotonic() + timeout
        pause = FIRST_RECHECK
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
        except TOPIC_GONE as exc:
            raise TopicNotFound(f"topic {self.topic!r} was deleted") from exc

    async def poll(self, max_events: int = 500, timeout: float = 1.0) -> list[Event]:
        """Up to ``max_events`` next events (default 500), waiting at most ``timeout`` seconds (default
        1.0) for the first; an empty list when none arrived. Waiting rechecks after 2, 4, 8, ... ms up to
        the client's ``poll_interval``. Polling does not commit: see :meth:`commit`."""
        max_events, timeout = check_limits(max_events, timeout)
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
        except TOPIC_GONE as exc:
            raise TopicNotFound(f"topic {self.topic!r} was deleted") from exc
        outcome = reader.outcome(outcomes)
        reader.apply(targets)
        return outcome

    async def seek_to_beginning(self) -> None:
        """Move every partition's checkpoint before the first event."""
        await self._seek(dict.fromkeys(self.partitions, ORIGIN))

    async def seek_to_end(self) -> None:
        """Move every partition's checkpoint after the last event committed now."""
        tid, parts = self._reader.topic_id, list(self.partitions)
        fences = await self._client.run(lambda conn: self._store.fences(conn, tid, parts))
        await self._seek(head_cursors(fences))

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
            async with begun(self._client) as conn:
                tx = AsyncConsumerTransaction(self, conn)
                yield tx
                targets = reader.targets(tx.events)
                if targets:
                    outcomes = await self._store.store_checkpoints(
                        conn, self.group, reader.topic_id, targets, reader.checkpoints())
                    tx.outcome = reader.outcome(outcomes)
                    # IGNORED: another member stored this checkpoint after handling these same events
                    kept = transaction_kept(tx.outcome, targets, keep_ignored=False)
                    if not kept:
                        raise psycopg.Rollback()
                else:
                    tx.outcome = reader.outcome({})  # nothing polled, nothing stored: the reader's rule
            if targets and kept:
                reader.apply(targets)
            elif not kept:
                tid, group, parts = reader.topic_id, self.group, list(reader.partitions)
                reader.set_checkpoints(await self._client.run(
                    lambda c: self._store.load_checkpoints(c, group, tid, parts)))
        except TOPIC_GONE as exc:
            reader.restore(saved)
            raise TopicNotFound(f"topic {self.topic!r} was deleted") from exc
        except BaseException:
            reader.restore(saved)
            raise


class AsyncConsumerTransaction:
    """The handle of :meth:`AsyncConsumer.transaction`: ``connection`` is in the open transaction;
    ``outcome`` is ``None`` until the block ends, then as :class:`pgstreams.ConsumerTransaction`'s
    (``IGNORED`` when nothing was polled)."""

    def __init__(self, consumer: AsyncConsumer, conn: psycopg.AsyncConnection) -> None:
        self._consumer = consumer
        self.connection = conn
        self.events: list[Event] = []
        self.outcome: CommitOutcome | None = None

    async def poll(self, max_events: int = 500, timeout: float = 1.0) -> list[Event]:
        """Like :meth:`AsyncConsumer.poll` (defaults 500 and 1.0 s), inside the transaction; the events
        are checkpointed when the block ends."""
        max_events, timeout = check_limits(max_events, timeout)
        got = await self._consumer._poll(self.connection, max_events, timeout)
        self.events.extend(got)
        return got
