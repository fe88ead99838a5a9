"""Stream-group consumers: gap-free polling, checkpoints with outcomes, seeking, exactly-once transactions.

Read order within a partition is ``(txid, position)``: the id of the publishing transaction, then the
position. A poll only returns events whose transaction id is below the read fence (SQL function
``read_fence()``): the oldest transaction still running, not counting those known to run in another
database of the cluster. Every transaction of this database below that fence has ended, so no event can
later appear before what was already read. A write transaction that stays open therefore holds back
every consumer of its database (not only of its topic) until it ends; keep write transactions short.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Literal, TypeVar, Union

import psycopg
from psycopg.rows import tuple_row

from ._codec import decode_value
from .errors import InvalidArgument, TopicNotFound
from .models import CommitOutcome, Event
from .names import check_group

if TYPE_CHECKING:
    from .client import Client, _TopicMeta
    from .worker import Worker

Start = Union[Literal["earliest", "latest"], datetime]
Cursor = tuple[int, int]  # (txid, position); (0, 0) is before every event
_ORIGIN: Cursor = (0, 0)
_SEVERITY = {
    CommitOutcome.STORED: 0, CommitOutcome.IGNORED: 1, CommitOutcome.OLDER: 2, CommitOutcome.FURTHER: 3,
    CommitOutcome.FENCED: 4,
}


_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_EVENT_FIELDS = ("topic", "partition", "position", "key", "value", "headers", "event_type", "event_id",
                 "correlation_id", "causation_id", "created_at", "txid")


def _event(topic: str, partition: int, position: int, key: str | None, value: object,
           headers: object, event_type: str | None, event_id: str | None, correlation_id: str | None,
           causation_id: str | None, created_at: datetime, txid: int) -> Event:
    """``Event(...)`` at a quarter of the cost (polls build one per row; a frozen dataclass's ``__init__``
    sets each field through ``object.__setattr__``). The result is the same as the constructor's. Filling
    the instance's own ``__dict__`` in field order keeps it a key-sharing dict, cheaper than assigning a
    new one."""
    ev = _new_event(Event)
    d = ev.__dict__
    d["topic"] = topic
    d["partition"] = partition
    d["position"] = position
    d["key"] = key
    d["value"] = value
    d["headers"] = headers
    d["event_type"] = event_type
    d["event_id"] = event_id
    d["correlation_id"] = correlation_id
    d["causation_id"] = causation_id
    d["created_at"] = created_at
    d["txid"] = txid
    return ev


_new_event = object.__new__
if tuple(Event.__dataclass_fields__) != _EVENT_FIELDS or hasattr(Event, "__slots__") or hasattr(
        Event, "__post_init__"):  # pragma: no cover - Event changed shape: use its constructor
    _event = Event  # type: ignore[assignment]


def _check_start(start: object) -> Start:
    if start in ("earliest", "latest"):
        return start
    if isinstance(start, datetime):
        if start.tzinfo is None or start.utcoffset() is None:
            raise InvalidArgument("start datetime must be timezone-aware (naive datetimes are ambiguous)")
        return start
    raise InvalidArgument(f"start must be 'earliest', 'latest' or an aware datetime, not {start!r}")


#: Reads of the partitions' heads when a running transaction caps them (see ``_start_cursors``).
_HEAD_READS = 3


def _capped(x: int | None, pos: int | None, fence: int | None) -> Cursor:
    """The cursor ``(x, pos)`` (the origin if ``None``), but not past ``(fence, 0)``: ``fence`` is the
    oldest transaction still in progress when the cursor was read, whose events commit later with a
    smaller id than events already visible and must not be skipped."""
    c = (int(x or 0), int(pos or 0))
    if fence is not None and (int(fence), 0) < c:
        return (int(fence), 0)
    return c


_Method = TypeVar("_Method", bound=Callable[..., Any])
_GONE = (psycopg.errors.UndefinedTable, psycopg.errors.ForeignKeyViolation)


def _topic_must_exist(method: _Method) -> _Method:
    """Report a topic deleted under a consumer as :class:`TopicNotFound`, not as the missing table or
    the foreign key violation that its absence causes."""
    @functools.wraps(method)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except _GONE as exc:
            topic = self.topic if isinstance(self, Consumer) else self._consumer.topic
            raise TopicNotFound(f"topic {topic!r} was deleted") from exc
    return wrapper  # type: ignore[return-value]


def _check_limits(max_events: object, timeout: object) -> tuple[int, float]:
    if isinstance(max_events, bool) or not isinstance(max_events, int) or max_events < 1:
        raise InvalidArgument(f"max_events must be a positive integer, got {max_events!r}")
    if (isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout < 0
            or math.isnan(timeout)):
        raise InvalidArgument(f"timeout must be a number >= 0, got {timeout!r}")
    return max_events, float(timeout)


class Consumer:
    """Reads a topic for a stream group, keeping one checkpoint per partition.

    Create with :meth:`Client.consumer`. Not thread-safe: use one consumer per thread. Delivery is
    at-least-once with :meth:`poll` + :meth:`commit`, exactly-once for effects kept in PostgreSQL with
    :meth:`transaction`. ``start`` (default ``"earliest"``) is as in :meth:`Client.consumer`;
    ``partitions`` (default ``None``: every partition of the topic) restricts the consumer to some.
    """

    def __init__(self, client: Client, topic: str, group: str, *, start: Start = "earliest",
                 partitions: Sequence[int] | None = None) -> None:
        self._client = client
        self.group = check_group(group)
        self.start = _check_start(start)
        self._meta: _TopicMeta = client._topic(topic, refresh=True)  # not a deleted topic's cached id
        self.topic = self._meta.name
        if partitions is None:
            parts = list(range(self._meta.partitions))
        else:
            parts = sorted(set(partitions))
            bad = [p for p in parts if isinstance(p, bool) or not isinstance(p, int)
                   or not 0 <= p < self._meta.partitions]
            if bad or not parts:
                raise InvalidArgument(f"partitions {bad or '[]'} invalid for topic {self.topic!r}")
        self.partitions: tuple[int, ...] = tuple(parts)
        self._committed: dict[int, Cursor] = {}
        self._cursor: dict[int, Cursor] = {}
        self._last: list[Event] = []
        self._rotate = 0
        self.last_outcomes: dict[int, CommitOutcome] = {}
        # set by pgstreams.worker for a group member: (member id, lease epoch per partition); commits
        # then go through store_checkpoint_fenced
        self._fence: tuple[str, dict[int, int]] | None = None
        try:
            with client._pool.connection() as conn:
                self._init_checkpoints(conn)
        except _GONE as exc:
            raise TopicNotFound(f"topic {self.topic!r} was deleted") from exc

    def __repr__(self) -> str:
        return f"<pgstreams.Consumer topic={self.topic!r} group={self.group!r}>"

    # -- checkpoints ---------------------------------------------------------------------------------
    def _start_cursors(self, conn: psycopg.Connection) -> dict[int, Cursor]:
        tid = self._meta.id
        parts = list(self.partitions)
        if self.start == "earliest":
            return dict.fromkeys(parts, _ORIGIN)
        cur = conn.cursor(row_factory=tuple_row)
        heads: dict[int, Cursor] = {}
        for _ in range(_HEAD_READS):
            rows = cur.execute(self._client._q("head_cursors", tid), (parts,)).fetchall()
            heads = {p: _capped(x, pos, f) for p, x, pos, f in rows}
            # capped: a transaction was running when the head was read. One of another database that ended
            # while this statement ran is indistinguishable from one of ours: read again (a new snapshot no
            # longer holds it) before settling for the cap, which re-delivers the events above it.
            if all(heads[p] == (int(x or 0), int(pos or 0)) for p, x, pos, _f in rows):
                break
        if self.start == "latest":
            return heads
        assert isinstance(self.start, datetime)
        out: dict[int, Cursor] = {}
        for p, x, pos, f in cur.execute(self._client._q("time_cursors", tid), (parts, self.start)).fetchall():
            out[p] = _capped(x, int(pos) - 1, f) if x is not None else heads[p]
        return out

    def _init_checkpoints(self, conn: psycopg.Connection) -> None:
        tid = self._meta.id
        q = self._client._q
        cur = conn.cursor(row_factory=tuple_row)
        existing = cur.execute(q("load_checkpoints"), (self.group, tid, list(self.partitions))).fetchall()
        missing = set(self.partitions) - {r[0] for r in existing}
        if missing:
            starts = self._start_cursors(conn)
            ps = sorted(missing)
            cur.execute(q("init_checkpoints"), (self.group, tid, ps, [str(starts[p][0]) for p in ps],
                                                [starts[p][1] for p in ps]))
        self._reload(conn)

    def _reload(self, conn: psycopg.Connection) -> None:
        rows = conn.cursor(row_factory=tuple_row).execute(
            self._client._q("load_checkpoints"), (self.group, self._meta.id, list(self.partitions))
        ).fetchall()
        self._committed = {p: (int(x), int(pos)) for p, x, pos in rows}
        self._cursor = dict(self._committed)

    def committed(self) -> dict[int, int | None]:
        """The last committed position per partition as this consumer knows it (``None``: none yet)."""
        return {p: (c[1] or None) for p, c in self._committed.items()}

    # -- polling -------------------------------------------------------------------------------------
    def _fetch(self, conn: psycopg.Connection, max_events: int) -> list[Event]:
        # partitions in rotated order: when a poll is cut at max_events, the next one starts at another
        # partition so none starves
        n = len(self.partitions)
        parts = list(self.partitions[self._rotate:] + self.partitions[:self._rotate])
        params = {
            "partitions": parts,
            "xids": [str(self._cursor[p][0]) for p in parts],
            "positions": [self._cursor[p][1] for p in parts],
            "limit": max_events,
            "total": max_events + 1,
        }
        rows = conn.cursor(row_factory=tuple_row, binary=True).execute(
            self._client._q("poll", self._meta.id), params, prepare=True
        ).fetchall()
        if not rows:
            return []
        if len(rows) > max_events:
            self._rotate = (self._rotate + 1) % n
            del rows[max_events:]
        topic = self.topic
        out: list[Event] = []
        append = out.append
        age: object = None
        created = _EPOCH
        for p, pos, x, since_epoch, kind, key, value, headers, et, eid, cid, sid in rows:
            if since_epoch != age:  # a batch's events share one time
                age, created = since_epoch, _EPOCH + since_epoch
            append(_event(topic, p, pos, key, value if kind == "b" else decode_value(kind, value),
                          headers or {}, et, eid, cid, sid, created, x))
        cursor = self._cursor
        for ev in out:
            cursor[ev.partition] = (ev.txid, ev.position)
        return out

    def _poll(self, conn: psycopg.Connection | None, max_events: int, timeout: float) -> list[Event]:
        client = self._client
        listener = client._listener
        listener.start()
        deadline = time.monotonic() + timeout
        backoff = 0.0
        while True:
            gen = listener.generation(self._meta.id)
            if conn is None:
                with client._pool.connection() as c:
                    events = self._fetch(c, max_events)
            else:
                events = self._fetch(conn, max_events)
            remaining = deadline - time.monotonic()
            if events or remaining <= 0:
                self._last = events
                return events
            wait = min(remaining, backoff or client.poll_interval)
            if listener.wait(self._meta.id, gen, wait):
                backoff = 0.002  # woken: events may still be behind the fence; recheck quickly
            elif backoff:
                backoff = min(backoff * 2, client.poll_interval)

    @_topic_must_exist
    def poll(self, max_events: int = 500, timeout: float = 1.0) -> list[Event]:
        """Return up to ``max_events`` next events (default 500), waiting at most ``timeout`` seconds
        (default 1.0) for the first one; an empty list when none arrived.

        Order is kept within each partition. New events wake the consumer through LISTEN/NOTIFY; it also
        polls every ``poll_interval`` as a fallback. Polling does not commit: see :meth:`commit`.
        """
        max_events, timeout = _check_limits(max_events, timeout)
        return self._poll(None, max_events, timeout)

    # -- committing ----------------------------------------------------------------------------------
    def _targets(self, events: Sequence[Event] | None) -> dict[int, Cursor]:
        evs = self._last if events is None else events
        out: dict[int, Cursor] = {}
        for ev in evs:
            if not isinstance(ev, Event):
                raise InvalidArgument(f"commit expects Event objects, not {type(ev).__name__}")
            if ev.topic != self.topic or ev.partition not in self._committed:
                raise InvalidArgument(
                    f"event {ev.topic}[{ev.partition}]@{ev.position} is not from this consumer's partitions"
                )
            c = (ev.txid, ev.position)
            if c > out.get(ev.partition, _ORIGIN):
                out[ev.partition] = c
        return out

    def _store(self, conn: psycopg.Connection, targets: dict[int, Cursor]) -> CommitOutcome:
        if not targets:
            self.last_outcomes = {}
            return CommitOutcome.IGNORED
        ps = sorted(targets)
        params = (self.group, self._meta.id, ps, [str(targets[p][0]) for p in ps],
                  [targets[p][1] for p in ps], [str(self._committed[p][0]) for p in ps],
                  [self._committed[p][1] for p in ps])
        if self._fence is None:
            rows = conn.cursor(row_factory=tuple_row).execute(
                self._client._q("store_checkpoints"), params).fetchall()
        else:
            member, epochs = self._fence
            rows = conn.cursor(row_factory=tuple_row).execute(
                self._client._q("store_checkpoints_fenced"),
                (*params[:2], member, *params[2:], [epochs.get(p, -1) for p in ps])).fetchall()
        outcomes = {p: CommitOutcome(code) for p, code in rows}
        self.last_outcomes = outcomes
        return max(outcomes.values(), key=_SEVERITY.__getitem__)

    def _apply(self, targets: dict[int, Cursor]) -> None:
        for p, outcome in self.last_outcomes.items():
            if outcome is CommitOutcome.STORED or (
                outcome is CommitOutcome.IGNORED and targets[p] > self._committed[p]
            ):
                self._committed[p] = targets[p]

    @_topic_must_exist
    def commit(self, events: Sequence[Event] | None = None) -> CommitOutcome:
        """Store the position after ``events`` (default: the events of the last poll) as the group's
        checkpoint on each of their partitions, passing the expected previous position.

        Returns the outcome (for several partitions, the most severe one; per partition in
        :attr:`last_outcomes`): ``STORED``; ``IGNORED`` (already stored, or it would move the checkpoint
        backwards); ``FURTHER`` (another consumer of the group moved on: stop or :meth:`seek`);
        ``OLDER`` (the checkpoint was reset behind the expected one). A checkpoint never moves backwards
        except through the ``seek`` methods.
        """
        targets = self._targets(events)
        with self._client._pool.connection() as conn:
            outcome = self._store(conn, targets)
        self._apply(targets)
        return outcome

    # -- seeking -------------------------------------------------------------------------------------
    def _set(self, cursors: dict[int, Cursor]) -> None:
        ps = sorted(cursors)
        with self._client._pool.connection() as conn:
            conn.execute(self._client._q("seek_checkpoints"),
                         (self.group, self._meta.id, ps, [str(cursors[p][0]) for p in ps],
                          [cursors[p][1] for p in ps]))
        self._committed.update(cursors)
        self._cursor.update(cursors)
        self._last = []

    def _check_partition(self, partition: object) -> int:
        if isinstance(partition, bool) or not isinstance(partition, int) or partition not in self._committed:
            raise InvalidArgument(f"partition {partition!r} is not one of this consumer's {self.partitions}")
        return partition

    @_topic_must_exist
    def seek(self, partition: int, position: int) -> None:
        """Move the group's checkpoint on ``partition`` so that every event at or after ``position`` is
        read (again): the checkpoint goes before the first of them in read order, which may also re-read
        some events of lower positions published by later transactions; to the end if there is none.
        May move backwards."""
        p = self._check_partition(partition)
        if isinstance(position, bool) or not isinstance(position, int) or position < 0:
            raise InvalidArgument(f"position must be an integer >= 0, got {position!r}")
        with self._client._pool.connection() as conn:
            row = conn.cursor(row_factory=tuple_row).execute(
                self._client._q("position_cursor", self._meta.id), (p, position)).fetchone()
            if row is None or row[0] is None:
                heads = conn.cursor(row_factory=tuple_row).execute(
                    self._client._q("head_cursors", self._meta.id), ([p],)).fetchall()
                target = _capped(heads[0][1], heads[0][2], heads[0][3])
            else:
                target = _capped(row[0], int(row[1]) - 1, row[2])
        self._set({p: target})

    @_topic_must_exist
    def seek_to_beginning(self) -> None:
        """Move every partition's checkpoint before the first event."""
        self._set(dict.fromkeys(self.partitions, _ORIGIN))

    @_topic_must_exist
    def seek_to_end(self) -> None:
        """Move every partition's checkpoint after the last event stored now (events of transactions
        still in progress are read when they commit)."""
        with self._client._pool.connection() as conn:
            rows = conn.cursor(row_factory=tuple_row).execute(
                self._client._q("head_cursors", self._meta.id), (list(self.partitions),)).fetchall()
        self._set({p: _capped(x, pos, f) for p, x, pos, f in rows})

    @_topic_must_exist
    def seek_to_time(self, dt: datetime) -> None:
        """Move every partition's checkpoint before its first event (in read order) created at or after
        ``dt`` (an aware datetime); to the end where there is none."""
        if not isinstance(dt, datetime) or dt.tzinfo is None or dt.utcoffset() is None:
            raise InvalidArgument("seek_to_time needs a timezone-aware datetime")
        tid = self._meta.id
        parts = list(self.partitions)
        with self._client._pool.connection() as conn:
            cur = conn.cursor(row_factory=tuple_row)
            heads = {p: _capped(x, pos, f) for p, x, pos, f in
                     cur.execute(self._client._q("head_cursors", tid), (parts,)).fetchall()}
            rows = cur.execute(self._client._q("time_cursors", tid), (parts, dt)).fetchall()
        self._set({p: (_capped(x, int(pos) - 1, f) if x is not None else heads[p]) for p, x, pos, f in rows})

    # -- running a handler -----------------------------------------------------------------------------
    def run(self, handler: Callable[..., Any], **options: Any) -> Worker:
        """Run ``handler`` on this consumer's partitions until SIGINT/SIGTERM (or ``until=``, a
        ``threading.Event``, is set); return the stopped :class:`pgstreams.Worker`.

        The consumer does not join the group's membership (no leases: it reads exactly its
        ``partitions``); use :class:`pgstreams.Worker` for that. ``options`` are those of
        :meth:`pgstreams.Worker.subscribe` except ``start`` and the membership timings (``batch``,
        ``min_events``, ``max_events``, ``max_wait``, ``mode``, ``retry``, ``dead_letter``), plus ``until``,
        ``install_signal_handlers`` (default true) and ``clock``. Failing events are retried and
        dead-lettered as by a worker; no retry state is recorded in the group status.
        """
        from .worker import run_consumer

        return run_consumer(self, handler, **options)

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
        saved = dict(self._cursor)
        tx: ConsumerTransaction | None = None
        keep = False
        try:
            with self._client._pool.connection() as conn:
                with conn.transaction():
                    tx = ConsumerTransaction(self, conn)
                    yield tx
                    targets = self._targets(tx.events)
                    tx.outcome = self._store(conn, targets)
                    # IGNORED with events means another member already stored this checkpoint after
                    # handling these same events: committing this handler's writes would repeat them
                    keep = tx.outcome is CommitOutcome.STORED or not targets
                    if not keep:
                        raise psycopg.Rollback()
                if keep:
                    self._apply(targets)
                else:
                    self._reload(conn)
        except BaseException:
            self._cursor = saved
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
        max_events, timeout = _check_limits(max_events, timeout)
        got = self._consumer._poll(self.connection, max_events, timeout)
        self.events.extend(got)
        return got
