"""The :class:`ShareConsumer`: acquire events of a share group, then ack, release, reject or renew them."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from typing import Any

import psycopg
from psycopg import pq

from ..consumer.reader import Start, event_of_row
from ..consumer.wakeup import topic_wakeup
from ..errors import InvalidArgument, TopicNotFound
from ..models import Event, Settlement, ShareOutcome
from ..names import check_group, check_topic
from ..ports import SessionPort, SessionPublisher
from ..session import denied
from ..storage.shares import ACK, REJECT, RELEASE, RENEW, AcquiredRow
from .deadletters import ShareDeadLetters
from .options import (
    DEFAULT_SHARE_WINDOW,
    MAX_DELAY,
    SHARE_DEFAULTS,
    Ordering,
    ShareOptions,
    check_poll_limits,
    check_seconds,
    check_share_options,
    new_consumer_id,
)

log = logging.getLogger("pgstreams.shares")

#: Longest interval (seconds) between a busy consumer's searches for events whose lock expired (half the
#: lock timeout when shorter; a consumer that finds nothing else searches at once).
_EXPIRY_SCAN = 1.0
#: Longest interval (seconds) between a consumer's searches of every expired lock. The searches in between
#: look only at the locks that expired in the last :data:`EXPIRY_WINDOW` seconds: under a held snapshot
#: the state rows of events done long ago stay in the index of locks, and a full search reads them all
#: (migration 0026). A lock that expired while no consumer searched is found by the next full search; a
#: consumer's first acquisition searches everything.
FULL_EXPIRY_SCAN = 30.0
#: Seconds of expired locks the searches between full ones look at (several times :data:`_EXPIRY_SCAN`,
#: so that a lock expiring while consumers poll is found by one of them).
EXPIRY_WINDOW = 5.0

_OUTCOMES = {"k": ShareOutcome.DONE, "e": ShareOutcome.EXPIRED, "o": ShareOutcome.LOST,
             "d": ShareOutcome.DEAD_LETTERED}


class ShareConsumer:
    """A consumer of share group ``group`` on ``topic``: competes with every other consumer of the group
    for individual events of every partition. Create one with :meth:`pgstreams.Client.share_consumer`
    (or :meth:`pgstreams.Client.queue`). Thread-safe.

    :meth:`poll` acquires events, each locked to this consumer for ``lock_timeout`` seconds and carrying
    its ``delivery_count``; then :meth:`ack` (done), :meth:`release` (delivered again, after a delay),
    :meth:`reject` (never delivered again: to the dead-letter topic when there is one) or :meth:`renew`
    (lock extended). An event whose lock expires becomes available again; once delivered
    ``max_deliveries`` times it goes to the dead-letter topic instead (in one transaction with its removal
    from the group). Settling an event whose lock expired, or that another consumer holds now, does
    nothing and says so (:class:`pgstreams.ShareOutcome`): it never acks an event twice. Settle the
    :class:`pgstreams.Event` objects :meth:`poll` returned: settling any other (an event of another topic,
    group or consumer, or one already settled here) raises :class:`pgstreams.InvalidArgument` and changes
    nothing.
    """

    def __init__(self, client: SessionPublisher, topic: str, group: str,
                 options: ShareOptions = SHARE_DEFAULTS, *, queue: bool = False,
                 consumer_id: str | None = None) -> None:
        check_group(group)
        if consumer_id is not None and (not isinstance(consumer_id, str) or not 0 < len(consumer_id) <= 200):
            raise InvalidArgument(f"consumer_id must be a string of 1 to 200 characters, got {consumer_id!r}")
        session = client.session
        state = session.topic_state(topic, refresh=True)  # checks the name
        checked = check_share_options(state.name, options)
        start, lock, md, dlt, ordering = (checked.start, checked.lock_timeout, checked.max_deliveries,
                                          checked.dead_letter, checked.ordering)
        self._client = client
        self._session = session
        self.topic = state.name
        self.group = group
        self.topic_id = state.id
        self.partition_count = state.partitions
        self.start: Start = start
        self.lock_timeout = lock
        self.max_deliveries = md
        self.dead_letter: str | None = dlt
        self.ordering: Ordering = ordering
        self.consumer_id = consumer_id or new_consumer_id()
        self.window = DEFAULT_SHARE_WINDOW
        #: Events of the group this consumer found removed by retention before they were settled
        #: (released, waiting, or whose lock expired), counted as lost; the group's total, with the events
        #: past its frontier that retention removed, is ``lost_events`` of
        #: :meth:`pgstreams.Client.describe_share_group`.
        self.lost_events = 0
        self._store = session.store.shares
        # the events acquired and not settled, as poll returned them: only those very objects can be settled
        # (an event of another group of the same topic has the same position and maybe delivery count)
        self._held: dict[tuple[int, int], Event] = {}
        # of those acquired in one go past the frontier: the first position of their shared batch row (a hint
        # for settling them: a batch acked whole is one row deleted; a stale hint costs nothing)
        self._batch: dict[tuple[int, int], int] = {}
        self._members: dict[tuple[int, int], tuple[int, ...]] = {}  # (partition, first) -> its positions
        self._lock = threading.Lock()
        self._turn = 0
        self._next_expiry_scan = 0.0
        self._next_full_expiry_scan = 0.0  # monotonic time of the next search of every expired lock
        self._last_expiry_scan: float | None = None  # monotonic time of the last search of expired locks
        self._dead_letters = ShareDeadLetters(session, client, group=group, topic_id=state.id,
                                              partitions=state.partitions, consumer_id=self.consumer_id,
                                              topic=dlt)
        self._dead_letters.ensure_topic()
        try:
            with denied(f"use share group {group!r} of topic {self.topic!r}"), session.connection() as conn:
                with conn.transaction():
                    self._store.upsert_group(conn, group, self.topic_id, queue=queue, lock_timeout=lock,
                                             max_deliveries=md, dead_letter=dlt, ordering=ordering)
                    self._init_partitions(conn)
        except psycopg.errors.ForeignKeyViolation as exc:
            raise TopicNotFound(f"topic {topic!r} was deleted") from exc

    @staticmethod
    def check(topic: str, group: str, options: ShareOptions) -> None:
        """Validate names and options without touching the database (raises :class:`InvalidArgument`,
        :class:`pgstreams.InvalidName`)."""
        check_topic(topic)
        check_group(group)
        check_share_options(topic, options)

    def __repr__(self) -> str:
        return f"<pgstreams.ShareConsumer topic={self.topic!r} group={self.group!r} id={self.consumer_id!r}>"

    def _init_partitions(self, conn: psycopg.Connection) -> None:
        parts = list(range(self.partition_count))
        missing = set(parts) - self._store.partitions(conn, self.group, self.topic_id)
        if not missing:
            return
        events = self._session.store.events
        if self.start == "earliest":
            frontiers = dict.fromkeys(missing, 0)
        else:
            fences = events.fences(conn, self.topic_id, sorted(missing))
            if self.start == "latest":
                frontiers = {p: f - 1 for p, f in fences.items()}
            else:
                frontiers = events.time_cursors(conn, self.topic_id, fences, self.start)
        self._store.init_partitions(conn, self.group, self.topic_id, frontiers)

    @property
    def client(self) -> SessionPublisher:
        """The client this consumer works through (it publishes the dead letters)."""
        return self._client

    @property
    def session(self) -> SessionPort:
        """The session of :attr:`client`."""
        return self._session

    @property
    def partitions(self) -> tuple[int, ...]:
        """Every partition of the topic (a share consumer reads them all)."""
        return tuple(range(self.partition_count))

    def held(self) -> list[tuple[int, int, int]]:
        """The events this consumer acquired and has not settled: ``(partition, position, delivery
        count)``, sorted (their locks may have expired meanwhile)."""
        with self._lock:
            return sorted((p, pos, e.delivery_count) for (p, pos), e in self._held.items())

    def holds(self, event: Event) -> bool:
        """``event`` (an object :meth:`poll` returned) is acquired by this consumer and not settled yet."""
        with self._lock:
            return self._held.get((event.partition, event.position)) is event

    # -- acquiring ---------------------------------------------------------------------------------------
    def _next_turn(self, count: int) -> int:
        """The partition (an index into the list polled) new events are looked for first: it rotates."""
        with self._lock:
            self._turn = (self._turn + 1) % max(1, count)
            return self._turn

    def _expiry_window(self, now: float) -> float | None:
        """How far back (seconds) this acquisition's search of expired locks looks: ``None`` (every
        expired lock) at the first search and every :data:`FULL_EXPIRY_SCAN` seconds, else back to a
        second before the previous search, and at least :data:`EXPIRY_WINDOW` seconds."""
        with self._lock:
            last, self._last_expiry_scan = self._last_expiry_scan, now
            if last is None or now >= self._next_full_expiry_scan:
                self._next_full_expiry_scan = now + FULL_EXPIRY_SCAN
                return None
            return max(EXPIRY_WINDOW, now - last + 1.0)

    def acquire(self, max_events: int = 500, partitions: Sequence[int] | None = None) -> list[Event]:
        """Acquire up to ``max_events`` events (default 500) of ``partitions`` (default all) now, without
        waiting; events due for the dead-letter topic on the way are sent there first."""
        return self._acquire(max_events, partitions)

    def _acquire(self, max_events: int, partitions: Sequence[int] | None,
                 on: psycopg.Connection | None = None) -> list[Event]:
        """:meth:`acquire`, on connection ``on`` (idle, autocommit) if given, else on a pooled one."""
        now = time.monotonic()
        expired = now >= self._next_expiry_scan
        if expired:
            self._next_expiry_scan = now + min(_EXPIRY_SCAN, self.lock_timeout / 2)
        order = list(self.partitions if partitions is None else partitions)
        turn = self._next_turn(len(order))
        since = self._expiry_window(now) if expired else None
        with nullcontext(on) if on is not None else self._session.connection() as conn:

            def take(scan_expired: bool, window: float | None, wait: bool = False) -> list[AcquiredRow]:
                return self._store.acquire(
                    conn, self.group, self.topic_id, order, owner=self.consumer_id,
                    max_events=max_events, lock_timeout=self.lock_timeout,
                    max_deliveries=self.max_deliveries, dead_letter=self.dead_letter is not None,
                    ordered=self.ordering == "key", window=self.window, expired=scan_expired, turn=turn,
                    wait=wait, expired_window=window)

            rows = take(expired, since)
            if not rows:
                if not expired:
                    since = self._expiry_window(time.monotonic())
                # nothing at hand: wait for a consumer advancing the first partition now (consumers of one
                # partition take turns), and look for expired locks
                rows = take(True, since, wait=True)
                if not rows and not expired:
                    rows = take(True, since)
        if not rows:
            return []
        acquired: list[Event] = []
        doomed: list[Event] = []
        batches: dict[tuple[int, int], int] = {}
        members: dict[tuple[int, int], list[int]] = {}
        removed = [(row[0], row[1]) for row in rows if row[4] is None]
        if removed:  # retention removed these events before the group settled them: lost
            rows = [row for row in rows if row[4] is not None]
            with self._session.connection() as conn:
                n = self._store.forget(conn, self.group, self.topic_id, self.consumer_id, removed)
            if n:
                with self._lock:
                    self.lost_events += n
                log.warning("share group %r of topic %r lost %d event(s) removed by retention before "
                            "they were settled (positions %s)", self.group, self.topic, n,
                            ", ".join(f"{p}@{pos}" for p, pos in removed[:10]) + (" ..." if n > 10 else ""))
        for row in rows:
            ev = self._event(row)
            if row[13] == "d":
                doomed.append(ev)
            else:
                acquired.append(ev)
                if row[14] is not None:
                    batches[(ev.partition, ev.position)] = row[14]
                    members.setdefault((ev.partition, row[14]), []).append(ev.position)
        with self._lock:
            for ev in acquired:
                self._held[(ev.partition, ev.position)] = ev
            self._batch.update(batches)
            for k, ps in members.items():
                self._members[k] = tuple(ps)
        for ev in doomed:
            self._dead_letters.finish([ev], "DeliveryLimit",
                              f"delivered {ev.delivery_count} times (max_deliveries {self.max_deliveries}); "
                              "the last lock expired", too_often=True)
        return acquired

    def _event(self, row: Sequence[Any]) -> Event:
        return event_of_row(self.topic, row, row[12])

    def poll(self, max_events: int = 500, timeout: float = 1.0) -> list[Event]:
        """Acquire up to ``max_events`` available events (default 500), waiting at most ``timeout`` seconds
        (default 1.0) for the first; an empty list when none came. Each is locked to this consumer for
        ``lock_timeout`` seconds and carries its ``delivery_count`` (1 on its first delivery). New events
        wake the consumer through LISTEN/NOTIFY; it polls every ``poll_interval`` as a fallback (events
        released, whose lock expired or whose delay passed are found by those polls)."""
        return self._poll(max_events, timeout)

    def _poll(self, max_events: int, timeout: float, on: psycopg.Connection | None = None) -> list[Event]:
        """:meth:`poll`, acquiring on connection ``on`` (idle, autocommit) if given."""
        max_events, timeout = check_poll_limits(max_events, timeout)
        wake = topic_wakeup(self._session, self.topic_id)
        wake.restart()
        deadline = time.monotonic() + timeout
        while True:
            wake.mark()
            got = self._acquire(max_events, None, on)
            remaining = deadline - time.monotonic()
            if got or remaining <= 0:
                return got
            wake.wait(remaining)

    # -- settling ----------------------------------------------------------------------------------------
    def _mine(self, events: Iterable[Event] | Event) -> list[tuple[Event, int]]:
        """The events with the delivery count they were acquired with; refuses events not held here."""
        if isinstance(events, Event):
            events = [events]
        if isinstance(events, (str, bytes)) or not isinstance(events, Iterable):
            raise InvalidArgument(f"events must be Event objects, not {type(events).__name__}")
        out: list[tuple[Event, int]] = []
        seen: set[tuple[int, int]] = set()
        with self._lock:
            for ev in events:
                if not isinstance(ev, Event):
                    raise InvalidArgument(f"events must be Event objects, not {type(ev).__name__}")
                if ev.topic != self.topic:
                    raise InvalidArgument(
                        f"event {ev.topic}[{ev.partition}]@{ev.position} is of topic {ev.topic!r}, not of "
                        f"{self.topic!r} (share group {self.group!r})")
                k = (ev.partition, ev.position)
                if self._held.get(k) is not ev:
                    raise InvalidArgument(
                        f"event {ev.topic}[{ev.partition}]@{ev.position} (delivery {ev.delivery_count}) is "
                        f"not held by this consumer of share group {self.group!r}: acquired by another "
                        "consumer or group, or already settled (pass the Event objects poll returned)")
                if k not in seen:
                    seen.add(k)
                    out.append((ev, ev.delivery_count))
        return out

    def forget(self, keys: Iterable[tuple[int, int]]) -> None:
        """Stop holding the events at ``keys`` (``(partition, position)``): their settlement is known (an
        ack that did not take effect: their locks were lost or expire)."""
        with self._lock:
            for k in keys:
                self._held.pop(k, None)
                first = self._batch.pop(k, None)
                if first is not None:
                    self._members.pop((k[0], first), None)

    def _whole_batches(self, held: list[tuple[Event, int]]) -> dict[tuple[int, int], tuple[int, ...]]:
        """The batch rows all of whose events are in ``held``."""
        named: dict[tuple[int, int], set[int]] = {}
        with self._lock:
            for e, _ in held:
                first = self._batch.get((e.partition, e.position))
                if first is not None:
                    named.setdefault((e.partition, first), set()).add(e.position)
            return {k: self._members[k] for k, ps in named.items()
                    if k in self._members and len(ps) == len(self._members[k])}

    def _settle(self, action: str, held: list[tuple[Event, int]], conn: psycopg.Connection | None,
                **kw: Any) -> dict[tuple[int, int], str]:
        if not held:
            return {}
        if action == ACK:
            whole = self._whole_batches(held)
            if whole:
                if conn is not None:
                    acked = self._store.ack_batches(conn, self.group, self.topic_id, self.consumer_id, whole)
                else:
                    with self._session.connection() as c:
                        acked = self._store.ack_batches(c, self.group, self.topic_id, self.consumer_id, whole)
                done = {(p, pos) for (p, first) in acked for pos in whole[(p, first)]}
                rest = [(e, d) for e, d in held if (e.partition, e.position) not in done]
                codes = dict.fromkeys(done, "k")
                if rest:
                    codes.update(self._settle_each(action, rest, conn, **kw))
                return codes
        return self._settle_each(action, held, conn, **kw)

    def _settle_each(self, action: str, held: list[tuple[Event, int]], conn: psycopg.Connection | None,
                     **kw: Any) -> dict[tuple[int, int], str]:
        with self._lock:
            batch = self._batch
            quads = [(e.partition, e.position, d, batch.get((e.partition, e.position))) for e, d in held]
        if conn is not None:
            return self._store.settle(conn, self.group, self.topic_id, self.consumer_id, action, quads,
                                      **kw)
        with self._session.connection() as c:
            return self._store.settle(c, self.group, self.topic_id, self.consumer_id, action, quads, **kw)

    def _settlement(self, name: str, codes: dict[tuple[int, int], str], held: list[tuple[Event, int]],
                    forget: bool = True) -> Settlement:
        outcomes = {(e.partition, e.position): _OUTCOMES[codes[(e.partition, e.position)]] for e, _ in held}
        if forget:
            self.forget(outcomes)  # settled, expired or lost: this consumer holds none of them any more
        return Settlement(name, outcomes)

    def ack(self, events: Iterable[Event] | Event, *, conn: psycopg.Connection | None = None) -> Settlement:
        """Mark ``events`` done: they are never delivered to this group again. Returns the outcome per
        event (:class:`pgstreams.Settlement`): ``DONE``, or ``EXPIRED`` / ``LOST`` when the lock was no
        longer held (nothing done: the event is delivered again or was settled by another acquisition).
        ``conn``: ack inside that connection's open transaction (it takes effect when the caller commits;
        :meth:`transaction` does this)."""
        held = self._mine(events)
        return self._settlement("ack", self._settle(ACK, held, conn), held)

    def release(self, events: Iterable[Event] | Event, delay: float = 0.0, *,
                error: BaseException | None = None) -> Settlement:
        """Give ``events`` back: available to any consumer of the group again after ``delay`` seconds
        (default 0). An event already delivered ``max_deliveries`` times goes to the dead-letter topic
        instead (outcome ``DEAD_LETTERED``; dropped without one), with ``error`` (default none) as the
        reason in its headers."""
        d = check_seconds("delay", delay, low=0.0, high=MAX_DELAY)
        held = self._mine(events)
        codes = self._settle(RELEASE, held, None, delay=d, lock_timeout=self.lock_timeout,
                             max_deliveries=self.max_deliveries, dead_letter=self.dead_letter is not None)
        doomed = [e for e, _ in held if codes[(e.partition, e.position)] == "d"]
        if doomed and self.dead_letter is not None:
            kind, msg = ("DeliveryLimit", "") if error is None else (type(error).__name__, str(error))
            msg = msg or f"delivered {self.max_deliveries} times (max_deliveries {self.max_deliveries})"
            sent = self._dead_letters.finish(doomed, kind, msg, too_often=True)
            for e in doomed:
                if (e.partition, e.position) not in sent:
                    codes[(e.partition, e.position)] = "o"
        return self._settlement("release", codes, held)

    def renew(self, events: Iterable[Event] | Event) -> Settlement:
        """Extend the locks of ``events`` by ``lock_timeout`` seconds from now (those still held)."""
        held = self._mine(events)
        codes = self._settle(RENEW, held, None, lock_timeout=self.lock_timeout)
        return self._settlement("renew", codes, held, forget=False)

    def reject(self, events: Iterable[Event] | Event, reason: str | None = None, *,
               conn: psycopg.Connection | None = None) -> Settlement:
        """Mark ``events`` as never to be delivered again: each goes to the dead-letter topic (when the
        group has one) in the same transaction, with ``reason`` (default none) in its headers. ``conn``:
        inside that connection's open transaction (default: a transaction of its own)."""
        if reason is not None and not isinstance(reason, str):
            raise InvalidArgument(f"reason must be a string or None, not {type(reason).__name__}")
        held = self._mine(events)
        if conn is not None:
            return self._reject(conn, held, reason)
        with self._session.connection() as c:
            with c.transaction():
                return self._reject(c, held, reason)

    def _reject(self, conn: psycopg.Connection, held: list[tuple[Event, int]], reason: str | None
                ) -> Settlement:
        by_key = {(e.partition, e.position): e for e, _ in held}
        with conn.transaction():
            codes = self._settle(REJECT, held, conn)
            done = [by_key[k] for k, c in codes.items() if c == "k"]
            self._dead_letters.publish(conn, done, "Rejected", reason or "rejected by a consumer",
                                       rejected=True)
        return self._settlement("reject", codes, held)

    # -- exactly-once ------------------------------------------------------------------------------------
    @contextmanager
    def transaction(self) -> Iterator[ShareTransaction]:
        """Poll, handle and ack in one PostgreSQL transaction.

        Yields a :class:`ShareTransaction` with ``.poll(...)`` and ``.connection``. Events are acquired
        at once (each acquisition counts a delivery, whatever becomes of the transaction); leaving the block
        normally acks every event polled in it in the transaction of the handler's writes on
        ``.connection`` and commits both, but only if every ack is ``DONE``: if a lock expired or was taken
        over meanwhile, everything is rolled back (:attr:`ShareTransaction.settlement` says which) and the
        events are delivered again. An exception rolls back the writes, releases the events (available at
        once) and propagates.

        The transaction begins when ``.connection`` is first used; the acks and the ``COMMIT`` go to the
        server in one round trip (a block that wrote nothing commits its acks as a transaction of their
        own: one round trip for the poll, one for the acks).
        """
        with self._session.connection() as conn:
            tx = ShareTransaction(self, conn)
            try:
                yield tx
                self._finish(tx, conn)
                if tx.settlement is not None:
                    self.forget(tx.settlement.outcomes)
            except _RollBack:
                # the acks that took effect were rolled back with the writes: those events are still held
                # here, give them back at once; the others are no longer this consumer's
                assert tx.settlement is not None
                self.forget(tx.settlement.failed())
                again = [e for e in tx.events if tx.settlement.outcome(e).ok]
                if again:
                    try:
                        self.release(again)
                    except psycopg.Error:
                        pass  # their locks expire
            except BaseException:
                end_transaction(conn, b"ROLLBACK")
                if tx.events and not conn.broken:
                    try:
                        self.release([e for e in tx.events if (e.partition, e.position) in self._held])
                    except psycopg.Error:
                        pass  # the locks expire
                raise

    def _finish(self, tx: ShareTransaction, conn: psycopg.Connection) -> None:
        """Ack ``tx``'s events in its transaction and commit, all or nothing (raises :class:`_RollBack`
        after rolling back when some ack did not take effect)."""
        if not tx.events:
            if tx.began:
                end_transaction(conn, b"COMMIT", check=True)
            return
        tx.settlement = self.ack_commit(tx.events, conn, began=tx.began)
        if not tx.settlement.ok:
            raise _RollBack

    def ack_commit(self, events: Sequence[Event], conn: psycopg.Connection, *, began: bool) -> Settlement:
        r"""Ack ``events`` in ``conn``'s open transaction (``began``; else as a transaction of their own) and
        commit it, all or nothing: when some ack does not take effect, the whole transaction is rolled
        back and the settlement says which failed. The events stay held (the caller :meth:`forget`\ s
        them, or releases them)."""
        held = self._mine(events)
        whole = self._whole_batches(held)
        if sum(len(ps) for ps in whole.values()) == len(held):
            # the common case: the acks (and the commit) in one round trip
            if self._store.ack_batches_all(conn, self.group, self.topic_id, self.consumer_id, whole,
                                           commit=began):
                return Settlement("ack", {(e.partition, e.position): ShareOutcome.DONE for e, _ in held})
            end_transaction(conn, b"ROLLBACK")
            with conn.transaction(force_rollback=True):  # which acks failed
                codes = self._settle(ACK, held, conn)
            return self._settlement("ack", codes, held, forget=False)
        if not began:
            conn.execute("BEGIN")
        codes = self._settle(ACK, held, conn)
        settlement = self._settlement("ack", codes, held, forget=False)
        end_transaction(conn, b"COMMIT" if settlement.ok else b"ROLLBACK", check=settlement.ok)
        return settlement


def end_transaction(conn: psycopg.Connection, command: bytes, *, check: bool = False) -> None:
    """End ``conn``'s open transaction (if any: nothing to do on an idle or broken connection) with
    ``command``; ``check``: raise its error."""
    if conn.broken or conn.pgconn.transaction_status == pq.TransactionStatus.IDLE:
        return
    try:
        conn.execute(command.decode())
    except psycopg.Error:
        if check:
            raise


class _RollBack(Exception):
    """Leaves a transaction block with a rollback."""


class ShareTransaction:
    """The handle of :meth:`ShareConsumer.transaction`: ``connection`` is in the open transaction;
    ``events`` are those polled in it; ``settlement`` is set when the block ends (``None`` before, or when
    nothing was polled)."""

    def __init__(self, consumer: ShareConsumer, conn: psycopg.Connection) -> None:
        self._consumer = consumer
        self._conn = conn
        #: whether the transaction has begun (at the first use of :attr:`connection`)
        self.began = False
        self.events: list[Event] = []
        self.settlement: Settlement | None = None

    @property
    def connection(self) -> psycopg.Connection:
        """The connection in the open transaction, for the handler's writes (the transaction begins at
        its first use)."""
        if not self.began:
            self._conn.execute("BEGIN")
            self.began = True
        return self._conn

    @property
    def committed(self) -> bool:
        """The block ended and its writes and acks were committed (or nothing was polled)."""
        return self.settlement is None or self.settlement.ok

    def poll(self, max_events: int = 500, timeout: float = 1.0) -> list[Event]:
        """Like :meth:`ShareConsumer.poll` (``max_events`` default 500, ``timeout`` default 1.0 s); the
        events are acked with the transaction."""
        # before the transaction begins, acquire on its connection (the acquisition commits at once)
        got = self._consumer._poll(max_events, timeout, None if self.began else self._conn)
        self.events.extend(got)
        return got

    def reject(self, events: Sequence[Event], reason: str | None = None) -> Settlement:
        """Reject ``events`` (polled in this transaction) in the transaction (see
        :meth:`ShareConsumer.reject`): they are not acked at its end, and their rejection is kept only
        if it commits."""
        out = self._consumer.reject(events, reason, conn=self.connection)
        gone = {(e.partition, e.position) for e in events}
        self.events = [e for e in self.events if (e.partition, e.position) not in gone]
        return out
