"""Share groups in the runtime: :class:`ShareSource`, the :class:`~pgstreams.worker.source.Source` of a
share group, and :class:`ShareRunner`, the loop that runs a handler on it.

A share group has no assignment (every consumer reads every partition) and redelivers and counts
deliveries itself, so its runner differs from the stream-group :class:`~pgstreams.worker.runner.Runner`
in how it retries: a failing event is released with the policy's backoff (any consumer of the group may
take it when the backoff is over, while this one goes on with the next events) and once delivered
``max_attempts`` times the group sends it to the dead-letter topic, in one transaction with its removal.
``concurrency`` runners share one :class:`ShareSource` in one process.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager

import psycopg

from ..consumer import Wakeup, topic_wakeup
from ..dltheaders import error_text
from ..models import CommitOutcome, Event, ShareOutcome
from ..services import Service
from ..shares import ShareConsumer
from ..shares.consumer import end_transaction
from .batching import Clock
from .handlers import call_handler
from .runner import _TRANSIENT, WorkerStats
from .source import Commit, Reassignment
from .subscription import Subscription

log = logging.getLogger("pgstreams.worker")


class ShareHandlerTransaction:
    """A handler's transaction on a share group: ``connection`` is in it; :meth:`ShareSource.commit` acks
    in it and commits it (with the acks, in one round trip), or rolls everything back if some ack did not
    take effect."""

    def __init__(self, conn: psycopg.Connection) -> None:
        self.connection = conn
        #: the acks committed the transaction (with the handler's writes), or rolled it back
        self.ended = False


class ShareSource:
    """Events of share group ``consumer.group`` on ``consumer.topic``: every partition, acquired per event,
    committed by acks, released (with a delay for retries)."""

    def __init__(self, consumer: ShareConsumer) -> None:
        self.consumer = consumer
        self.topic = consumer.topic
        self.group = consumer.group
        self._session = consumer.session
        self._never = threading.Event()

    @property
    def partitions(self) -> tuple[int, ...]:
        return self.consumer.partitions

    # -- assignment: none (every consumer of a share group reads every partition) ------------------------
    def sync(self) -> Reassignment | None:
        return None

    def changed(self) -> bool:
        return False

    def owns(self, partitions: Collection[int], *, leaving_ok: bool = False) -> bool:
        return True

    def idle(self, interrupt: Callable[[], bool]) -> None:
        self._never.wait(self._session.poll_interval)

    def lost(self, commit: Commit) -> None:
        """A refused ack: the events are no longer this consumer's; nothing else to do."""

    def reset(self) -> None:
        """After a database error: nothing is cached (unsettled events come back when their locks expire)."""

    # -- events -------------------------------------------------------------------------------------------
    def waiter(self, interrupt: Callable[[], bool]) -> Wakeup:
        return topic_wakeup(self._session, self.consumer.topic_id, interrupt=interrupt)

    def fetch(self, max_events: int, partitions: Collection[int]) -> list[Event]:
        parts = None if len(partitions) == len(self.partitions) else sorted(partitions)
        return self.consumer.acquire(max_events, parts)

    @contextmanager
    def transaction(self, *, bounded: bool = False) -> Iterator[ShareHandlerTransaction]:
        with self._session.connection() as conn:
            tx = ShareHandlerTransaction(conn)
            conn.execute("BEGIN")
            try:
                yield tx
            except BaseException:
                end_transaction(conn, b"ROLLBACK")
                raise
            if not tx.ended:
                end_transaction(conn, b"COMMIT", check=True)

    def commit(self, events: Sequence[Event], tx: object | None = None) -> Commit:
        """Ack ``events`` (in ``tx`` if given: then they take effect when it commits)."""
        if isinstance(tx, ShareHandlerTransaction):
            # the acks and the COMMIT of the handler's transaction in one round trip, all or nothing
            settled = self.consumer.ack_commit(events, tx.connection, began=True)
            tx.ended = True
            self.consumer.forget(settled.outcomes)  # refused: the locks of the others expire
        else:
            settled = self.consumer.ack(events)
        outcomes: dict[int, CommitOutcome] = {}
        for (p, _pos), o in settled.outcomes.items():
            if not o.ok:
                outcomes[p] = CommitOutcome.FENCED
            else:
                outcomes.setdefault(p, CommitOutcome.STORED)
        ok = settled.ok
        return Commit(CommitOutcome.STORED if ok else CommitOutcome.FENCED, outcomes)

    def release(self, events: Sequence[Event]) -> None:
        """Give back those of ``events`` still held (available again at once)."""
        self.retry(events, 0.0)

    def retry(self, events: Sequence[Event], delay: float, error: BaseException | None = None) -> int:
        """Release those of ``events`` still held, available again after ``delay`` seconds; those delivered
        ``max_deliveries`` times go to the dead-letter topic (with ``error``). Returns how many did."""
        held = [e for e in events if self.consumer.holds(e)]  # the others were settled already
        if not held:
            return 0
        settled = self.consumer.release(held, delay, error=error)
        return sum(1 for o in settled.outcomes.values() if o is ShareOutcome.DEAD_LETTERED)


class ShareRunner(Service):
    """One of the ``concurrency`` loops of a share subscription ``sub`` on ``source``: acquire a batch,
    hand it to the handler, ack what it handled (in its transaction if transactional), release what
    failed with the retry policy's backoff."""

    def __init__(self, sub: Subscription, source: ShareSource, *, index: int, member_id: str, clock: Clock,
                 stats: WorkerStats) -> None:
        super().__init__(f"share-runner:{sub.group}/{sub.topic}#{index}", interval=0)
        self.sub = sub
        self.source = source
        self.member_id = member_id
        self.clock = clock
        self.stats = stats
        self.waiter = source.waiter(self.stopping.is_set)

    def step(self) -> None:
        try:
            batch = self._collect()
            if batch:
                self._deliver(batch)
        except _TRANSIENT as exc:
            log.warning("%s on %s: database error (%s); going on (unsettled events come back when their "
                        "locks expire)", self.member_id, self.sub.topic, str(exc).strip())
            self.stopping.wait(0.5)

    def _collect(self) -> list[Event]:
        """Acquire until ``min_events`` are at hand or ``max_wait`` passed with some (at most
        ``max_events``); empty if stopped."""
        cfg = self.sub.config
        events: list[Event] = []
        waiter = self.waiter
        waiter.restart()
        first: float | None = None
        while not self.stopping.is_set():
            waiter.mark()
            events += self.source.fetch(cfg.max_events - len(events), self.source.partitions)
            self.stats.add(polls=1)
            now = self.clock()
            if events and first is None:
                first = now
            if len(events) >= cfg.min_events or len(events) >= cfg.max_events:
                return events
            if first is not None and now - first >= cfg.max_wait:
                return events
            waiter.wait(cfg.max_wait - (now - first) if first is not None else waiter.poll_interval)
        if events:
            self.source.release(events)
        return []

    def _deliver(self, batch: list[Event]) -> None:
        self.stats.add(batches=1)
        pending = list(batch)
        try:
            while pending and not self.stopping.is_set():
                pending = self._attempt(pending)
        finally:
            if pending:
                self.source.release(pending)

    def _attempt(self, chunk: list[Event]) -> list[Event]:
        """Deliver ``chunk`` once; return what is left to deliver (after a failing event, the events after
        it; the failing event is released with a backoff)."""
        sub, source = self.sub, self.source
        if sub.mode == "transactional":
            with source.transaction(bounded=True) as tx:
                res = call_handler(sub.handler, chunk, tx.connection, batch=sub.batch, owns=source.owns)
                if res.done:
                    commit = source.commit(chunk[:res.done], tx)
        else:
            res = call_handler(sub.handler, chunk, None, batch=sub.batch, owns=source.owns)
            if res.done:
                commit = source.commit(chunk[:res.done])
        if res.done:
            self.stats.add(events=res.done)
            if commit.ok:
                self.stats.add(commits=1)
            else:
                self.stats.add(fenced=1)
                log.warning("%s: acks of %d events of %s refused (locks expired or taken over): they are "
                            "delivered again", self.member_id, res.done, sub.topic)
                return []  # the transaction rolled back or the locks are gone: nothing of the chunk is ours
        if res.error is None:
            return []
        self.stats.add(failures=1)
        if res.index is None:  # the chunk failed as a whole: retry each of its events after its backoff
            self._retry(chunk[res.done:], res.error)
            return []
        failed = chunk[res.index]
        self._retry([failed], res.error)
        return chunk[res.index + 1:] if sub.mode != "transactional" or not sub.batch else [
            e for i, e in enumerate(chunk) if i != res.index]

    def _retry(self, events: list[Event], error: BaseException) -> None:
        kind, msg = error_text(error)
        policy = self.sub.retry
        for ev in events:
            delay = policy.delay(ev.delivery_count)
            if self.sub.dead_letter is not None or ev.delivery_count < policy.max_attempts:
                log.warning("%s: event %s[%d]@%d failed (delivery %d/%d, %s: %s)", self.member_id, ev.topic,
                            ev.partition, ev.position, ev.delivery_count, policy.max_attempts, kind, msg)
            n = self.source.retry([ev], delay, error)
            if n:
                self.stats.add(dead_lettered=n)
