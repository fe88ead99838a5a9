"""Reading a topic for a stream group: cursors and checkpoints per partition, gap-free fetches,
checkpoints stored with outcomes (fenced by a lease claim for group members) and applied once committed."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Collection, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Literal, Union

import psycopg

from ..errors import InvalidArgument, TopicNotFound
from ..models import CommitOutcome, Event, read_event
from ..names import check_group
from ..storage.checkpoints import ORIGIN, head_cursors
from ._storage import ReaderStorage
from .wakeup import topic_wakeup

if TYPE_CHECKING:
    from ..ports import HasSession

log = logging.getLogger("pgstreams.consumer")

Start = Union[Literal["earliest", "latest"], datetime]
Cursor = int  # the position of the last event read; 0 is before every event (ORIGIN)
_SEVERITY = {
    CommitOutcome.STORED: 0, CommitOutcome.IGNORED: 1, CommitOutcome.OLDER: 2, CommitOutcome.FURTHER: 3,
    CommitOutcome.FENCED: 4,
}


_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)

#: What each row of a poll holds (see :meth:`StreamReader.fetch_rows` and :class:`EventBatch`).
ROW_FIELDS = ("partition", "position", "txid", "since_epoch", "kind", "key", "payload", "headers",
              "event_type", "event_id", "correlation_id", "causation_id")
Row = tuple[Any, ...]
#: What a poll's statements return: the rows, the removed segments after the cursors, the partition count.
Polled = tuple[list[Row], list[tuple[int, ...]], int]


def events_of(topic: str, rows: Sequence[Row]) -> list[Event]:
    """The :class:`Event` objects of a poll's rows."""
    out: list[Event] = []
    append = out.append
    age: object = None
    created = _EPOCH
    for p, pos, x, since_epoch, kind, key, value, headers, et, eid, cid, sid in rows:
        if since_epoch != age:  # a batch's events share one time
            age, created = since_epoch, _EPOCH + since_epoch
        append(read_event(topic, p, pos, key, kind, value, headers, et, eid, cid, sid, created, x))
    return out


def event_of_row(topic: str, row: Sequence[Any], delivery_count: int = 0) -> Event:
    """The :class:`Event` of one row in the column order of :data:`ROW_FIELDS` (a share group's
    acquisition returns its events so), delivered ``delivery_count`` times."""
    p, pos, x, since_epoch, kind, key, value, headers, et, eid, cid, sid = row[:12]
    return read_event(topic, p, pos, key, kind, value, headers, et, eid, cid, sid,
                      _EPOCH + since_epoch, x, delivery_count)


def check_start(start: object) -> Start:
    """Validate a start position: ``"earliest"``, ``"latest"`` or an aware datetime."""
    if start in ("earliest", "latest"):
        return start
    if isinstance(start, datetime):
        if start.tzinfo is None or start.utcoffset() is None:
            raise InvalidArgument("start datetime must be timezone-aware (naive datetimes are ambiguous)")
        return start
    raise InvalidArgument(f"start must be 'earliest', 'latest' or an aware datetime, not {start!r}")


#: What a statement on a deleted topic raises: its table is gone, or its id no longer exists.
TOPIC_GONE = (psycopg.errors.UndefinedTable, psycopg.errors.ForeignKeyViolation)


def check_limits(max_events: object, timeout: object) -> tuple[int, float]:
    """A poll's ``max_events`` (a positive int) and ``timeout`` (seconds, a number >= 0), checked
    (:class:`InvalidArgument` naming the bad one); the timeout as a float."""
    if isinstance(max_events, bool) or not isinstance(max_events, int) or max_events < 1:
        raise InvalidArgument(f"max_events must be a positive integer, got {max_events!r}")
    if (isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout < 0
            or math.isnan(timeout)):
        raise InvalidArgument(f"timeout must be a number >= 0, got {timeout!r}")
    return max_events, float(timeout)


def transaction_kept(outcome: CommitOutcome | None, targets: Mapping[int, Cursor], keep_ignored: bool
                     ) -> bool:
    """Whether a transaction that stored a checkpoint at ``targets`` with ``outcome`` (``None``: none
    stored) commits: nothing stored, ``STORED``, or ``IGNORED`` when ``keep_ignored`` (or there was
    nothing to store). Otherwise it rolls back (another member moved the checkpoint: the handler's writes
    would repeat or skip work)."""
    return outcome is None or outcome is CommitOutcome.STORED or (
        outcome is CommitOutcome.IGNORED and (keep_ignored or not targets))


@dataclass(frozen=True)
class LeaseClaim:
    """The leases a group member processes under: its ``member_id`` and the lease ``epochs`` per partition.
    A checkpoint stored with a claim is refused (:attr:`CommitOutcome.FENCED`) on every partition whose
    lease has moved on since (``store_checkpoint_fenced``)."""

    member_id: str
    epochs: Mapping[int, int]


class CheckpointTransaction:
    """An open transaction on :attr:`connection` that may store a reader's checkpoint (see
    :meth:`StreamReader.transaction`). :attr:`outcome` is ``None`` until :meth:`store` ran."""

    def __init__(self, reader: StreamReader, conn: psycopg.Connection, lease: LeaseClaim | None,
                 keep_ignored: bool) -> None:
        self.connection = conn
        self.outcome: CommitOutcome | None = None
        self._reader = reader
        self._lease = lease
        self._keep_ignored = keep_ignored
        self._targets: dict[int, Cursor] = {}

    def store(self, events: Sequence[Event]) -> CommitOutcome:
        """Store the checkpoint after ``events`` in this transaction (call it once); returns the outcome
        (per partition in the reader's ``last_outcomes``)."""
        targets = self._reader.targets(events)
        self.outcome = self._reader.store(self.connection, targets, self._lease)
        self._targets = targets
        return self.outcome

    @property
    def kept(self) -> bool:
        """Whether the transaction commits: nothing stored, ``STORED``, or ``IGNORED`` when the reader's
        transaction keeps it (or there was nothing to store). Otherwise it rolls back."""
        return transaction_kept(self.outcome, self._targets, self._keep_ignored)


class StreamReader:
    """The read state of stream group ``group`` on some ``partitions`` of ``topic`` (default: all): per
    partition a read cursor and the committed checkpoint.

    Creating one reads the topic's definition only; :meth:`create_checkpoints` or :meth:`load` read the
    checkpoints and put the cursors on them. :meth:`fetch` reads on and moves the cursors; :meth:`store`
    stores a checkpoint (fenced with a :class:`LeaseClaim`) and :meth:`apply` makes it the committed one
    once its transaction committed (:meth:`commit` and :meth:`transaction` do both); :meth:`rewind` sends
    the cursors back to the checkpoints, so whatever was fetched but not committed is read again. Not
    thread-safe. ``start`` (default ``"earliest"``): where :meth:`create_checkpoints` starts a partition.
    """

    def __init__(self, client: HasSession, topic: str, group: str, *, start: Start = "earliest",
                 partitions: Sequence[int] | None = None) -> None:
        self.session = session = client.session
        self.group = check_group(group)
        self.start = check_start(start)
        meta = session.topic_state(topic, refresh=True)  # not a deleted topic's cached id
        self.topic: str = meta.name
        self.topic_id: int = meta.id
        #: the number of partitions of the topic
        self.partition_count: int = meta.partitions
        #: whether the reader reads every partition of the topic, new ones too (``partitions`` not given)
        self.follows_topic = partitions is None
        if partitions is None:
            parts = list(range(meta.partitions))
        else:
            parts = sorted(set(partitions))
            bad = [p for p in parts if isinstance(p, bool) or not isinstance(p, int)
                   or not 0 <= p < meta.partitions]
            if bad or not parts:
                raise InvalidArgument(f"partitions {bad or '[]'} invalid for topic {self.topic!r}")
        self.partitions: tuple[int, ...] = tuple(parts)
        #: the outcome per partition of the last :meth:`store`
        self.last_outcomes: dict[int, CommitOutcome] = {}
        #: events retention removed before this reader read them (see :meth:`_losses`)
        self.lost_events = 0
        #: whether losses found are recorded in the group status (false for dry runs)
        self.record_losses = True
        self._committed: dict[int, Cursor] = {}
        self._cursor: dict[int, Cursor] = {}
        self._rotate = 0
        self._ahead: tuple[dict[str, Any], Future[Polled]] | None = None
        self._ahead_pool: ThreadPoolExecutor | None = None
        self._storage = ReaderStorage(session.store, self.group, meta.id)
        self._wakeup = topic_wakeup(session, meta.id)

    def __repr__(self) -> str:
        return (f"<pgstreams.StreamReader topic={self.topic!r} group={self.group!r} "
                f"partitions={self.partitions}>")

    # -- checkpoints ---------------------------------------------------------------------------------
    def create_checkpoints(self, conn: psycopg.Connection) -> None:
        """Give every partition of the reader that has no checkpoint of the group one at ``start``
        (``"latest"``: the head now), keep the existing ones, then :meth:`load` them (the rule of
        :func:`pgstreams.storage.checkpoints.missing_checkpoints`, the asyncio consumer's too)."""
        self._loaded(self.session.store.checkpoints.create_missing(conn, self.group, self.topic_id,
                                                                  self.partitions, self.start))

    def load(self, conn: psycopg.Connection) -> None:
        """Read the checkpoints again and put every cursor on its checkpoint."""
        self._loaded(self._storage.load(conn, list(self.partitions)))

    def _loaded(self, cursors: dict[int, Cursor]) -> None:
        self._committed = cursors
        self._cursor = dict(cursors)

    def set_checkpoints(self, cursors: Mapping[int, Cursor]) -> None:
        """Make ``cursors`` (as read from the database) the checkpoints and put every cursor on them (what
        :meth:`load` does, for a caller that read them itself, such as :mod:`pgstreams.aio`)."""
        self._loaded(dict(cursors))

    def checkpoints(self) -> dict[int, Cursor]:
        """The committed checkpoint per partition as this reader knows it."""
        return dict(self._committed)

    # -- cursors ---------------------------------------------------------------------------------------
    def positions(self) -> dict[int, Cursor]:
        """The read cursor per partition (a copy, for :meth:`restore`)."""
        return dict(self._cursor)

    def restore(self, positions: Mapping[int, Cursor]) -> None:
        """Put the read cursors back where :meth:`positions` saw them."""
        self._cursor = dict(positions)

    def rewind(self, partitions: Collection[int] | None = None) -> None:
        """Send the cursors of ``partitions`` (default: all) back to their checkpoints: the events fetched
        but not committed there are fetched again."""
        if partitions is None:
            self._cursor.update(self._committed)
        else:
            for p in partitions:
                if p in self._committed:
                    self._cursor[p] = self._committed[p]

    # -- reading ---------------------------------------------------------------------------------------
    def _params(self, max_events: int, partitions: Sequence[int] | None) -> dict[str, Any]:
        # partitions in rotated order: when a poll is cut at max_events, the next one starts at another
        # partition so none starves
        own = self.partitions if partitions is None else tuple(partitions)
        parts = list(own[self._rotate:] + own[:self._rotate])
        cursor = self._cursor
        return {"partitions": parts, "positions": [cursor[p] for p in parts], "limit": max_events,
                "total": max_events + 1}

    def _losses(self, rows: list[Row], params: Mapping[str, Any], removed: list[tuple[int, ...]]) -> None:
        """Tell apart, among the removed segments after the cursors (``removed``, read after ``rows``),
        those whose events this read missed: retention dropped them before the read. A partition whose
        first row read is ``r`` missed the removed segments wholly below ``r`` (one holding ``r`` was still
        there when it was read, and so were the older ones it did not skip); a partition without rows
        missed all of them, unless the poll was cut before reaching it. Counts the events lost (those of
        the segment holding the cursor estimated from positions), logs a warning, records them for the
        group status, and moves the cursor of a partition without rows past them."""
        first: dict[int, int] = {}
        for r in rows:
            if r[0] not in first:
                first[r[0]] = r[1]
        order = params["partitions"]
        if len(rows) > params["limit"]:
            last = order.index(rows[-1][0])
            known = set(order[:last + 1])
        else:
            known = set(order)
        cursors: dict[int, int] = dict(zip(order, params["positions"], strict=True))
        lost: list[tuple[int, int, int]] = []
        skip_to: dict[int, int] = {}
        for p, segment, hi, first_pos, last_pos, events in removed:
            c = cursors[p]
            if p in first:
                if hi > first[p]:
                    continue
            elif p not in known:
                continue
            else:
                skip_to[p] = max(skip_to.get(p, c), int(last_pos))
            n = events if first_pos > c else max(
                1, round(events * (last_pos - c) / (last_pos - first_pos + 1)))
            lost.append((p, segment, n))
        if not lost:
            return
        for p, end in skip_to.items():
            if self._cursor.get(p, end) < end:
                self._cursor[p] = end
        total = sum(n for _, _, n in lost)
        self.lost_events += total
        parts = sorted({p for p, _, _ in lost})
        log.warning("group %s lost %d event(s) of topic %s (partitions %s): retention removed them before "
                    "they were read; reading on from the oldest retained events", self.group, total,
                    self.topic, parts)
        if not self.record_losses:
            return
        try:
            self._storage.record_losses(lost)
        except psycopg.Error as exc:  # the status then counts them from the checkpoint instead
            log.warning("could not record the loss in the group status: %s", str(exc).strip())

    def _advance(self, polled: Polled, params: Mapping[str, Any]) -> tuple[list[Row], dict[int, Cursor]]:
        """Move the cursors past the rows of ``polled`` (read with ``params``, with the removed segments
        after the cursors and the topic's partition count); return the rows, cut to the limit, and the
        cursor after them per partition. A reader of every partition takes up partitions added since."""
        rows, removed, count = polled
        if removed:
            self._losses(rows, params, removed)
        if count > self.partition_count and self.follows_topic:
            self._grow(count)
        if not rows:
            return rows, {}
        if len(rows) > params["limit"]:
            self._rotate = (self._rotate + 1) % len(params["partitions"])
            del rows[params["limit"]:]
        ends = {r[0]: r[1] for r in rows}  # rows come partition by partition, in position order
        self._cursor.update(ends)
        return rows, ends

    def _grow(self, count: int) -> None:
        """Read the partitions the topic gained (up to ``count``) from their checkpoints, created at their
        first event where the group has none (so none of their events is missed, whatever ``start``)."""
        new = list(range(self.partition_count, count))
        checkpoint_store = self.session.store.checkpoints

        def checkpoints(conn: psycopg.Connection) -> dict[int, Cursor]:  # safe to run again
            return checkpoint_store.create_missing(conn, self.group, self.topic_id, new, "earliest")

        cursors = self.session.run(checkpoints)
        self.session.topic_state(self.topic, refresh=True)  # publishers of this session hash over them too
        self.partition_count = count
        self.partitions = (*self.partitions, *new)
        self._committed.update(cursors)
        self._cursor.update(cursors)
        log.info("group %s reads the new partitions %s of topic %s", self.group, new, self.topic)

    def read_params(self, max_events: int) -> dict[str, Any]:
        """The parameters of the next read of up to ``max_events`` events after the cursors (for a caller
        that runs the poll itself, such as :mod:`pgstreams.aio`; pass its result to :meth:`advance`)."""
        return self._params(max_events, None)

    def advance(self, polled: Polled, params: Mapping[str, Any]) -> tuple[list[Row], dict[int, Cursor]]:
        """Move the cursors past the rows a poll with ``params`` read (``polled``: the rows, the removed
        segments after the cursors and the partition count); the rows, cut to the limit, and the cursor
        after them per partition. The reader keeps its partitions (a caller running the poll itself
        creates its reader again to read partitions added since)."""
        rows, removed, _ = polled
        return self._advance((rows, removed, 0), params)

    def outcome(self, outcomes: Mapping[int, CommitOutcome]) -> CommitOutcome:
        """Record the outcome per partition of a store the caller ran (:attr:`last_outcomes`); return the
        most severe (``IGNORED`` for none). Then :meth:`apply` once committed."""
        self.last_outcomes = dict(outcomes)
        if not outcomes:
            return CommitOutcome.IGNORED
        return max(outcomes.values(), key=_SEVERITY.__getitem__)

    def fetch_rows(self, conn: psycopg.Connection, max_events: int,
                   partitions: Sequence[int] | None = None) -> tuple[list[Row], dict[int, Cursor]]:
        """Up to ``max_events`` rows (see :data:`ROW_FIELDS`) after the cursors of ``partitions`` (default:
        all the reader's), in read order per partition, and the cursor after them per partition that had
        any; moves the cursors past them. No waiting."""
        params = self._params(max_events, partitions)
        return self._advance(self._storage.poll(conn, params), params)

    def _read_ahead(self, max_events: int) -> None:
        """Start reading the next rows on a pooled connection in the background, for the next
        :meth:`poll_rows` with the same cursors (a backlog is drained while the caller works on the
        rows it got and commits them). Any change of the cursors in between makes it useless: it is
        then dropped."""
        params = self._params(max_events, None)
        if self._ahead_pool is None:
            self._ahead_pool = ThreadPoolExecutor(1, thread_name_prefix=f"pgstreams-read-ahead-{self.topic}")
        storage, session = self._storage, self.session

        def read() -> Polled:
            return session.run(lambda c: storage.poll(c, params))

        self._ahead = (params, self._ahead_pool.submit(read))

    def _take_ahead(self, max_events: int) -> tuple[list[Row], dict[int, Cursor]] | None:
        ahead, self._ahead = self._ahead, None
        if ahead is None:
            return None
        params, future = ahead
        if params != self._params(max_events, None):
            return None  # the cursors moved (seek, rewind): read again
        return self._advance(future.result(), params)

    def fetch(self, conn: psycopg.Connection, max_events: int,
              partitions: Sequence[int] | None = None) -> list[Event]:
        """:meth:`fetch_rows` as :class:`Event` objects."""
        return events_of(self.topic, self.fetch_rows(conn, max_events, partitions)[0])

    def poll_rows(self, max_events: int, timeout: float, conn: psycopg.Connection | None = None
                  ) -> tuple[list[Row], dict[int, Cursor]]:
        """:meth:`fetch_rows` (on ``conn``, default a pooled connection per read), waiting up to
        ``timeout`` seconds for the first event (see :class:`Wakeup`); no rows when none arrived."""
        if conn is None:
            got = self._take_ahead(max_events)
            if got is not None and got[0]:
                if len(got[0]) == max_events:
                    self._read_ahead(max_events)
                return got
        session = self.session
        wakeup = self._wakeup
        wakeup.restart()
        deadline = time.monotonic() + timeout
        while True:
            wakeup.mark()
            if conn is None:  # retried on a fresh connection if it broke (the cursors move after a read)
                got = session.run(lambda c: self.fetch_rows(c, max_events))
                if len(got[0]) == max_events:  # a backlog: read on while the caller works
                    self._read_ahead(max_events)
            else:
                got = self.fetch_rows(conn, max_events)
            remaining = deadline - time.monotonic()
            if got[0] or remaining <= 0:
                return got
            wakeup.wait(remaining)

    def poll(self, max_events: int, timeout: float, conn: psycopg.Connection | None = None) -> list[Event]:
        """:meth:`poll_rows` as :class:`Event` objects."""
        return events_of(self.topic, self.poll_rows(max_events, timeout, conn)[0])

    # -- committing ------------------------------------------------------------------------------------
    def targets(self, events: Sequence[Event]) -> dict[int, Cursor]:
        """The checkpoint after ``events`` per partition; :class:`InvalidArgument` for an event that is
        not of this reader's partitions."""
        out: dict[int, Cursor] = {}
        for ev in events:
            if not isinstance(ev, Event):
                raise InvalidArgument(f"commit expects Event objects, not {type(ev).__name__}")
            if ev.topic != self.topic or ev.partition not in self._committed:
                raise InvalidArgument(
                    f"event {ev.topic}[{ev.partition}]@{ev.position} is not from this consumer's partitions"
                )
            if ev.position > out.get(ev.partition, ORIGIN):
                out[ev.partition] = ev.position
        return out

    def check_targets(self, targets: Mapping[int, Cursor]) -> dict[int, Cursor]:
        """``targets`` (a batch's cursors after it), checked to be of this reader's partitions."""
        bad = [p for p in targets if p not in self._committed]
        if bad:
            raise InvalidArgument(f"partitions {bad} are not this consumer's {list(self.partitions)}")
        return dict(targets)

    def store(self, conn: psycopg.Connection, targets: Mapping[int, Cursor],
              lease: LeaseClaim | None = None, durable: bool = True) -> CommitOutcome:
        """Store ``targets`` as the checkpoints on ``conn``, expecting the committed ones (fenced by
        ``lease`` if given). Returns the most severe outcome; per partition in :attr:`last_outcomes`.
        Nothing to store is ``IGNORED``. Does not change the reader: :meth:`apply` once committed.
        ``durable=False`` (on an autocommit connection only): the commit does not wait for the disk."""
        if not targets:
            self.last_outcomes = {}
            return CommitOutcome.IGNORED
        return self.outcome(self._storage.store(conn, targets, self._committed, lease, durable))

    def apply(self, targets: Mapping[int, Cursor]) -> None:
        """Make the stored ``targets`` the committed checkpoints, as :attr:`last_outcomes` allow."""
        for p, outcome in self.last_outcomes.items():
            if outcome is CommitOutcome.STORED or (
                outcome is CommitOutcome.IGNORED and targets[p] > self._committed[p]
            ):
                self._committed[p] = targets[p]

    def commit(self, conn: psycopg.Connection, targets: Mapping[int, Cursor],
               lease: LeaseClaim | None = None, durable: bool = True) -> CommitOutcome:
        """Store ``targets`` (see :meth:`targets`) on ``conn`` in autocommit mode (the statement is its own
        transaction) and apply them. ``durable=False``: the commit does not wait for its WAL flush (see
        :meth:`pgstreams.Consumer.commit`)."""
        outcome = self.store(conn, targets, lease, durable)
        self.apply(targets)
        return outcome

    @contextmanager
    def transaction(self, conn: psycopg.Connection, *, lease: LeaseClaim | None = None,
                    keep_ignored: bool = True, idle_timeout: float | None = None
                    ) -> Iterator[CheckpointTransaction]:
        """A transaction on ``conn`` in which the caller works and stores a checkpoint
        (:meth:`CheckpointTransaction.store`, fenced by ``lease``). At the end it commits if the outcome
        allows (:attr:`CheckpointTransaction.kept`; ``keep_ignored``, default true, keeps ``IGNORED``),
        else rolls back; the checkpoint is applied to the reader only once committed. An exception rolls
        back and propagates. ``idle_timeout`` (seconds, default none): the server ends the transaction if
        its holder stays idle in it that long, so a holder paused inside cannot keep its locks and the
        read fence of every consumer forever."""
        tx = CheckpointTransaction(self, conn, lease, keep_ignored)
        with conn.transaction():
            if idle_timeout is not None:
                self._storage.limit_idle(conn, idle_timeout)
            yield tx
            if not tx.kept:
                raise psycopg.Rollback()
        if tx.outcome is not None and tx.kept:
            self.apply(tx._targets)

    # -- seeking -------------------------------------------------------------------------------------
    def seek(self, conn: psycopg.Connection, cursors: Mapping[int, Cursor]) -> None:
        """Set the checkpoints (and cursors) of some partitions to ``cursors``, backwards too."""
        self._storage.seek(conn, cursors)
        self._committed.update(cursors)
        self._cursor.update(cursors)

    def head_cursors(self, conn: psycopg.Connection, partitions: Sequence[int] | None = None
                     ) -> dict[int, Cursor]:
        """Before each partition's read fence: after every event committed now (those of transactions still
        open on the partition are read later)."""
        parts = list(self.partitions if partitions is None else partitions)
        return head_cursors(self._storage.fences(conn, parts))

    def time_cursors(self, conn: psycopg.Connection, dt: datetime) -> dict[int, Cursor]:
        """Before each partition's first event created at or after ``dt``; the head where there is none."""
        return self._storage.times(conn, self._storage.fences(conn, list(self.partitions)), dt)

    def position_cursor(self, conn: psycopg.Connection, partition: int, position: int) -> Cursor:
        """Before ``position`` (every event from there on is read), but not past the head."""
        head = self.head_cursors(conn, [partition])[partition]
        return max(0, min(int(position) - 1, head))


def create_checkpoints(client: HasSession, topic: str, group: str, *, start: Start = "earliest",
                       partitions: Sequence[int] | None = None) -> StreamReader:
    """Give ``group`` a checkpoint at ``start`` on every partition of ``topic`` (or of ``partitions``)
    where it has none; existing checkpoints are kept. ``start`` (default ``"earliest"``): ``"latest"`` is
    the head at this moment, a datetime the first event from then on. Returns a reader positioned at the
    checkpoints."""
    reader = StreamReader(client, topic, group, start=start, partitions=partitions)
    try:
        reader.session.run(reader.create_checkpoints)
    except TOPIC_GONE as exc:
        raise TopicNotFound(f"topic {reader.topic!r} was deleted") from exc
    return reader
