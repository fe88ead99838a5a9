"""The public consumer: a facade over a :class:`StreamReader` with polling, commits, seeks and exactly-once
transactions (:func:`pgstreams.worker.run_consumer` runs a handler on one)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

import psycopg

from ..errors import InvalidArgument, TopicNotFound
from ..models import CommitOutcome, Event
from .batch import EventBatch
from .reader import (
    ORIGIN,
    TOPIC_GONE,
    Cursor,
    Row,
    Start,
    StreamReader,
    check_limits,
    create_checkpoints,
    events_of,
)

if TYPE_CHECKING:
    from ..ports import HasSession

_Method = TypeVar("_Method", bound=Callable[..., Any])


def _topic_must_exist(method: _Method) -> _Method:
    """Report a topic deleted under a consumer as :class:`TopicNotFound`, not as the missing table or
    the foreign key violation that its absence causes."""
    @functools.wraps(method)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except TOPIC_GONE as exc:
            topic = self.topic if isinstance(self, Consumer) else self._consumer.topic
            raise TopicNotFound(f"topic {topic!r} was deleted") from exc
    return wrapper  # type: ignore[return-value]


class Consumer:
    """Reads a topic for a stream group, keeping one checkpoint per partition.

    Create with :meth:`Client.consumer`. Not thread-safe: use one consumer per thread. Delivery is
    at-least-once with :meth:`poll` + :meth:`commit`, exactly-once for effects kept in PostgreSQL with
    :meth:`transaction`. ``start`` (default ``"earliest"``) is as in :meth:`Client.consumer`;
    ``partitions`` (default ``None``: every partition of the topic) restricts the consumer to some.
    Constructing one directly is the same as :meth:`Client.consumer`: partitions without a checkpoint
    of the group get one (:func:`create_checkpoints`), then the checkpoints are loaded. ``client``: a
    :class:`pgstreams.Client` (or its session). :func:`pgstreams.worker.run_consumer` runs a handler on
    the consumer's partitions.
    """

    def __init__(self, client: HasSession, topic: str, group: str, *, start: Start = "earliest",
                 partitions: Sequence[int] | None = None) -> None:
        self._attach(create_checkpoints(client, topic, group, start=start, partitions=partitions))

    @classmethod
    def of(cls, reader: StreamReader) -> Consumer:
        """A consumer over ``reader``, whose checkpoints exist already (see :func:`create_checkpoints`)."""
        consumer = cls.__new__(cls)
        consumer._attach(reader)
        return consumer

    def _attach(self, reader: StreamReader) -> None:
        self._session = reader.session
        self._reader = reader
        self.group = reader.group
        self.start = reader.start
        self.topic = reader.topic
        self._last: dict[int, Cursor] = {}  # per partition, the cursor after the last poll's events

    def __repr__(self) -> str:
        return f"<pgstreams.Consumer topic={self.topic!r} group={self.group!r}>"

    @property
    def partitions(self) -> tuple[int, ...]:
        """The partitions this consumer reads."""
        return self._reader.partitions

    @property
    def lost_events(self) -> int:
        """Events retention removed before this consumer read them (0 unless it fell behind retention;
        the consumer then reads on from the oldest retained event and logs a warning)."""
        return self._reader.lost_events

    @property
    def last_outcomes(self) -> dict[int, CommitOutcome]:
        """The outcome per partition of the last commit."""
        return self._reader.last_outcomes

    @property
    def reader(self) -> StreamReader:
        """The :class:`StreamReader` holding this consumer's cursors and checkpoints (what
        :func:`pgstreams.worker.run_consumer` hands to the worker runtime)."""
        return self._reader

    def committed(self) -> dict[int, int | None]:
        """The last committed position per partition as this consumer knows it (``None``: none yet)."""
        return {p: (c or None) for p, c in self._reader.checkpoints().items()}

    # -- polling -------------------------------------------------------------------------------------
    def _poll(self, conn: psycopg.Connection | None, max_events: int, timeout: float) -> list[Event]:
        return events_of(self.topic, self._poll_rows(conn, max_events, timeout))

    def _poll_rows(self, conn: psycopg.Connection | None, max_events: int, timeout: float) -> list[Row]:
        rows, self._last = self._reader.poll_rows(max_events, timeout, conn)
        return rows

    @_topic_must_exist
    def poll(self, max_events: int = 500, timeout: float = 1.0) -> list[Event]:
        """Return up to ``max_events`` next events (default 500), waiting at most ``timeout`` seconds
        (default 1.0) for the first one; an empty list when none arrived.

        Order is kept within each partition. New events wake the consumer through LISTEN/NOTIFY; it also
        polls every ``poll_interval`` as a fallback. Polling does not commit: see :meth:`commit`.
        """
        max_events, timeout = check_limits(max_events, timeout)
        return self._poll(None, max_events, timeout)

    @_topic_must_exist
    def poll_batch(self, max_events: int = 500, timeout: float = 1.0) -> EventBatch:
        """:meth:`poll`, returning the events as one :class:`EventBatch`: the rows as read, with columns
        (``batch.values``, ``batch.positions``, ...) and :class:`Event` objects built only when asked for.
        The fastest way to drain a backlog; commit it like a poll's list."""
        max_events, timeout = check_limits(max_events, timeout)
        rows = self._poll_rows(None, max_events, timeout)
        return EventBatch(self.topic, rows, self._last)

    # -- committing ----------------------------------------------------------------------------------
    @_topic_must_exist
    def commit(self, events: Sequence[Event] | EventBatch | None = None, *, durable: bool = True
               ) -> CommitOutcome:
        """Store the position after ``events`` (default: the events of the last poll; a list of events or
        an :class:`EventBatch`) as the group's
        checkpoint on each of their partitions, passing the expected previous position.

        Returns the outcome (for several partitions, the most severe one; per partition in
        :attr:`last_outcomes`): ``STORED``; ``IGNORED`` (already stored, or it would move the checkpoint
        backwards); ``FURTHER`` (another consumer of the group moved on: stop or :meth:`seek`);
        ``OLDER`` (the checkpoint was reset behind the expected one). A checkpoint never moves backwards
        except through the ``seek`` methods.

        ``durable`` (default true): the call returns once PostgreSQL flushed the commit to disk. With
        ``durable=False`` it does not wait for that flush (``synchronous_commit = off`` for this one
        transaction), which costs more than the rest of a commit: the checkpoint is visible at once and
        reaches the disk at the server's next synchronous commit or within three ``wal_writer_delay``
        (600 ms by default). If PostgreSQL itself crashes before, the group's checkpoint is an earlier one:
        its events are read again by new consumers, never skipped (at-least-once), and this consumer's next
        commit reports ``OLDER`` (re-read from it with :meth:`seek`, or make a new consumer). Commits inside
        :meth:`transaction` always commit with the transaction's own setting.
        """
        if events is None:
            targets = dict(self._last)
        elif isinstance(events, EventBatch):
            targets = self._reader.check_targets(events.ends) if events.topic == self.topic else \
                self._reader.targets(events.events())
        else:
            targets = self._reader.targets(events)
        # retried on a fresh connection if it broke: a checkpoint stored by the lost attempt comes back
        # IGNORED (already stored) and is applied as well
        if not isinstance(durable, bool):
            raise InvalidArgument(f"durable must be a bool, not {type(durable).__name__}")
        return self._session.run(lambda conn: self._reader.commit(conn, targets, durable=durable))

    # -- seeking -------------------------------------------------------------------------------------
    def _set(self, cursors: dict[int, Cursor]) -> None:
        self._session.run(lambda conn: self._reader.seek(conn, cursors))
        self._last = {}

    def _check_partition(self, partition: object) -> int:
        if isinstance(partition, bool) or not isinstance(partition, int) or (
                partition not in self._reader.checkpoints()):
            raise InvalidArgument(f"partition {partition!r} is not one of this consumer's {self.partitions}")
        return partition

    @_topic_must_exist
    def seek(self, partition: int, position: int) -> None:
        """Move the group's checkpoint on ``partition`` so that every event at or after ``position`` is
        read (again); to the end if ``position`` lies beyond it. May move backwards."""
        p = self._check_partition(partition)
        if isinstance(position, bool) or not isinstance(position, int) or position < 0:
            raise InvalidArgument(f"position must be an integer >= 0, got {position!r}")
        target = self._session.run(lambda conn: self._reader.position_cursor(conn, p, position))
        self._set({p: target})

    @_topic_must_exist
    def seek_to_beginning(self) -> None:
        """Move every partition's checkpoint before the first event."""
        self._set(dict.fromkeys(self.partitions, ORIGIN))

    @_topic_must_exist
    def seek_to_end(self) -> None:
        """Move every partition's checkpoint after the last event stored now (events of transactions
        still in progress are read when they commit)."""
        heads = self._session.run(self._reader.head_cursors)
        self._set(heads)

    @_topic_must_exist
    def seek_to_time(self, dt: datetime) -> None:
        """Move every partition's checkpoint before its first event created at or after
        ``dt`` (an aware datetime); to the end where there is none."""
        if not isinstance(dt, datetime) or dt.tzinfo is None or dt.utcoffset() is None:
            raise InvalidArgument("seek_to_time needs a timezone-aware datetime")
        cursors = self._session.run(lambda conn: self._reader.time_cursors(conn, dt))
        self._set(cursors)

    # -- exactly-once ----------------------------------------------------------------------------------
    @contextmanager
    def transaction(self) -> Iterator[ConsumerTransaction]:
        """Poll, handle and checkpoint in one PostgreSQL transaction.

        Yields a :class:`ConsumerTransaction` with ``.poll(...)`` and ``.connection``. Leaving the block
        normally stores the checkpoint after the events polled in it, in the same transaction as the
        handler's writes on ``.connection``; an exception rolls both back (and the events are read again).
        If another consumer of the group moved the checkpoint meanwhile, everything is rolled back and
        :attr:`ConsumerTransaction.outcome` says ``FURTHER``/``OLDER``, or ``IGNORED`` when the other
        consumer stored this very checkpoint (it handled the same events); this consumer then continues
        from the stored checkpoint. The handler's writes are kept only with ``STORED`` (or when no event
        was polled).
        """
        reader = self._reader
        saved = reader.positions()
        try:
            with self._session.connection() as conn:
                # IGNORED with events means another member already stored this checkpoint after handling
                # these same events: committing this handler's writes would repeat them
                with reader.transaction(conn, keep_ignored=False) as ckpt:
                    tx = ConsumerTransaction(self, conn)
                    yield tx
                    tx.outcome = ckpt.store(tx.events)
                if not ckpt.kept:
                    reader.load(conn)
        except BaseException:
            reader.restore(saved)
            raise


class ConsumerTransaction:
    """The handle of :meth:`Consumer.transaction`: ``connection`` is in the open transaction."""

    def __init__(self, consumer: Consumer, conn: psycopg.Connection) -> None:
        self._consumer = consumer
        self.connection = conn
        self.events: list[Event] = []
        self.outcome: CommitOutcome | None = None

    @_topic_must_exist
    def poll(self, max_events: int = 500, timeout: float = 1.0) -> list[Event]:
        """Like :meth:`Consumer.poll` (``max_events`` default 500, ``timeout`` default 1.0 s), inside the
        transaction; the events are checkpointed on commit."""
        max_events, timeout = check_limits(max_events, timeout)
        got = self._consumer._poll(self.connection, max_events, timeout)
        self.events.extend(got)
        return got
