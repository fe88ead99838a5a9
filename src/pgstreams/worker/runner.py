"""The runner: one subscription's processing loop, a :class:`~pgstreams.services.Service` whose every step
follows the assignment, collects a batch and delivers it.

It works against a :class:`~pgstreams.worker.source.Source` and runs no SQL of its own: the source
fetches and commits, :class:`~pgstreams.worker.retrystate.RetryStateStore` records retry states and
:class:`~pgstreams.worker.deadletter.DeadLetters` sends spent events on. Retry decisions come from
:mod:`pgstreams.worker.retry`, batch timing from :mod:`pgstreams.worker.batching`.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import psycopg

from ..dltheaders import error_text
from ..errors import ConnectionLost
from ..models import CommitOutcome, Event
from ..services import Service
from .batching import BatchAssembler, Clock
from .deadletter import DeadLetters
from .handlers import Attempt, call_handler
from .retry import Delivery, RetryTracker
from .retrystate import RetryStateStore
from .source import Commit, Source
from .subscription import Subscription

log = logging.getLogger("pgstreams.worker")

#: Longest uninterrupted backoff wait: stop requests and lost partitions are seen this fast.
_SLICE = 0.05
#: Database errors after which the runner reads again from the checkpoints instead of dying.
_TRANSIENT = (psycopg.OperationalError, psycopg.errors.DeadlockDetected, psycopg.errors.SerializationFailure,
              ConnectionLost)


#: A receiver of a worker's durations: ``(kind, seconds, topic, group)``; see :meth:`WorkerStats.watch`.
DurationWatcher = Callable[[str, float, str, str], None]


@dataclass
class WorkerStats:
    """Counters of a worker since it started: ``events`` handled, ``failures`` (handler calls that
    raised), ``retries`` (failed events or batches scheduled again), ``dead_lettered``; and durations
    reported to watchers (:meth:`watch`): ``"handler"`` (one handler call) and ``"batch"`` (one batch
    through its retries), in seconds of the worker's clock."""

    polls: int = 0
    batches: int = 0
    events: int = 0
    commits: int = 0
    fenced: int = 0
    failures: int = 0
    retries: int = 0
    dead_lettered: int = 0
    rebalances: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)
    _watchers: list[DurationWatcher] = field(default_factory=list, repr=False, compare=False)

    def watch(self, watcher: DurationWatcher) -> None:
        """Call ``watcher(kind, seconds, topic, group)`` for every duration measured from now on (``kind``:
        ``"handler"`` or ``"batch"``); it runs on the runner's thread and must be quick."""
        with self._lock:
            self._watchers.append(watcher)

    def observe(self, kind: str, seconds: float, topic: str, group: str) -> None:
        """Report a duration to the watchers."""
        for w in self._watchers:
            w(kind, seconds, topic, group)

    def add(self, **counts: int) -> None:
        """Add to counters."""
        with self._lock:
            for k, v in counts.items():
                setattr(self, k, getattr(self, k) + v)

    def snapshot(self) -> dict[str, int]:
        """The counters as a dict."""
        with self._lock:
            return {k: v for k, v in self.__dict__.items() if not k.startswith("_")}


@dataclass
class _Outcome:
    attempt: Attempt
    commit: Commit | None = None  # None: nothing was committed


class Runner(Service):
    """The processing loop of subscription ``sub`` on ``source`` (one step delivers at most one batch).

    ``member_id`` names this process in logs and dead-letter headers; ``clock`` times batches and
    backoffs; ``stats`` counts. ``retry_states`` (group members only) records failing events in the group
    status; ``dead_letters`` takes spent events (``None``: they are retried forever).
    """

    def __init__(self, sub: Subscription, source: Source, *, member_id: str, clock: Clock,
                 stats: WorkerStats, retry_states: RetryStateStore | None = None,
                 dead_letters: DeadLetters | None = None) -> None:
        super().__init__(f"runner:{sub.group}/{sub.topic}", interval=0)
        self.sub = sub
        self.source = source
        self.member_id = member_id
        self.clock = clock
        self.stats = stats
        self.retry_states = retry_states
        self.dead_letters = dead_letters
        self.asm = BatchAssembler(sub.config, clock)
        self.retries = RetryTracker(sub.retry, clock, dead_letter=dead_letters is not None)
        self.waiter = source.waiter(self._interrupted)

    def _interrupted(self) -> bool:
        return self.stopping.is_set() or self.source.changed()

    # -- the loop -----------------------------------------------------------------------------------------
    def step(self) -> None:
        try:
            self._sync()
            if not self.source.partitions:
                self.source.idle(self.stopping.is_set)
                return
            batch = self._collect()
            if batch:
                self._deliver(batch)
        except _TRANSIENT as exc:
            log.warning("%s on %s: database error (%s); reading again from the checkpoints",
                        self.member_id, self.sub.topic, str(exc).strip())
            self.asm.clear()
            self.source.reset()
            self.stopping.wait(0.5)

    def _sync(self) -> None:
        """Between batches: follow the assignment; what was at hand is read again after a change."""
        change = self.source.sync()
        if change is None:
            return
        self.asm.clear()
        if not change.rebalanced:
            return
        if change.gained or change.lost:
            log.info("%s: partitions of %s now %s (gained %s, lost %s)", self.member_id, self.sub.topic,
                     list(change.partitions), list(change.gained), list(change.lost))
        self.retries.retain(change.partitions)
        if change.gained and self.retry_states is not None:
            # attempts on an event that failed under a previous owner count here too: a hand-over (or a
            # crash-looping member) does not give a poison event a fresh set of attempts
            self.retries.restore(self.retry_states.take_over(change.gained))
        self.stats.add(rebalances=1)

    def _collect(self) -> list[Event]:
        """Fetch until a batch is due (see :class:`BatchAssembler`); empty if stopped or reassigned."""
        asm, source, retries, waiter = self.asm, self.source, self.retries, self.waiter
        asm.start()
        waiter.restart()
        while True:
            if self._interrupted():
                if self.stopping.is_set():
                    asm.clear()
                return []
            now = self.clock()
            retries.resume(now)
            active = retries.active(source.partitions)
            waiter.mark()
            if asm.room() > 0 and active:
                asm.add(source.fetch(asm.room(), active))
                self.stats.add(polls=1)
            if asm.ready():
                return asm.take()
            limit = asm.remaining() if asm.events else math.inf
            resume = retries.next_resume(now)
            if resume is not None:
                limit = min(limit, resume)
            waiter.wait(limit)

    def _sleep(self, seconds: float, partitions: set[int]) -> bool:
        """Back off (by the clock); false if stopped or the partitions were lost meanwhile."""
        deadline = self.clock() + seconds
        while True:
            left = deadline - self.clock()
            if left <= 0:
                return True
            if self.stopping.wait(min(_SLICE, left)):
                return False
            if not self.source.owns(partitions):
                return False

    # -- delivering ---------------------------------------------------------------------------------------
    def _deliver(self, batch: list[Event]) -> None:
        """Hand ``batch`` to the handler until it is handled, paused or dead-lettered event by event, or
        the partitions were lost; whatever was not committed is delivered again later."""
        self.stats.add(batches=1)
        delivery = Delivery(batch, self.retries)
        first = True
        began = self.clock()
        try:
            while delivery.events:
                if not first and (self.stopping.is_set() or not self.source.owns(delivery.partitions())):
                    return
                first = False
                while (spent := delivery.next_dead_letter()) is not None:
                    if not self._dead_letter(spent):
                        return
                if not delivery.events:
                    return
                chunk = delivery.chunk()
                out = self._attempt(chunk)
                if out.commit is not None and not out.commit.ok:
                    self._lost(out.commit)
                    return
                res = out.attempt
                self.stats.add(events=res.done)
                if res.interrupted:
                    return
                if res.error is None:
                    delivery.passed(chunk)
                    continue
                self.stats.add(failures=1)
                if res.index is None:
                    if not self._batch_failed(delivery, chunk, res.error):
                        return
                    continue
                self._event_failed(delivery, chunk, res)
        finally:
            self.source.release(batch)  # whatever was not committed is read again
            self.stats.observe("batch", self.clock() - began, self.sub.topic, self.sub.group)

    def _batch_failed(self, delivery: Delivery, chunk: list[Event], error: BaseException) -> bool:
        """The chunk failed as a whole: back off and retry it, or deliver its events one by one. False if
        stopped or the partitions were lost during the backoff."""
        decision = delivery.batch_failed(chunk)
        kind, msg = error_text(error)
        if not decision.isolate:
            self.stats.add(retries=1)
        if decision.isolate:
            log.warning("%s: batch of %d events of %s failed %d times (%s: %s); delivering them one by one",
                        self.member_id, len(chunk), self.sub.topic, decision.attempts, kind, msg)
            return True
        log.warning("%s: batch of %d events of %s failed (attempt %d/%d, %s: %s); retrying in %.2fs",
                    self.member_id, len(chunk), self.sub.topic, decision.attempts,
                    self.sub.retry.max_attempts, kind, msg, decision.delay)
        return self._sleep(decision.delay, {e.partition for e in chunk})

    def _event_failed(self, delivery: Delivery, chunk: list[Event], res: Attempt) -> None:
        """An identified event failed: its partition pauses from that event on; record its state."""
        assert res.index is not None and res.error is not None
        decision = delivery.event_failed(chunk, res.done, res.index, res.error)
        ev, n = decision.event, decision.attempts
        kind, msg = error_text(res.error)
        if not decision.dead_letter:
            self.stats.add(retries=1)
        if decision.dead_letter:
            log.warning("%s: event %s[%d]@%d failed %d times (%s: %s); sending it to %s", self.member_id,
                        ev.topic, ev.partition, ev.position, n, kind, msg, self.sub.dead_letter)
        else:
            log.warning("%s: event %s[%d]@%d failed (attempt %d%s, %s: %s); retrying in %.2fs",
                        self.member_id, ev.topic, ev.partition, ev.position, n,
                        f"/{self.sub.retry.max_attempts}" if not decision.spent
                        else ", no dead-letter topic: retrying forever", kind, msg, decision.delay)
        if self.retry_states is not None:
            self.retry_states.record(ev.partition, ev.position, n, f"{kind}: {msg}", decision.state)

    def _attempt(self, chunk: list[Event]) -> _Outcome:
        """Call the handler on ``chunk`` and commit what it handled (in its transaction if transactional)."""
        source = self.source
        if self.sub.mode != "transactional":
            began = self.clock()
            out = _Outcome(call_handler(self.sub.handler, chunk, None, batch=self.sub.batch,
                                        owns=source.owns))
            self.stats.observe("handler", self.clock() - began, self.sub.topic, self.sub.group)
            if out.attempt.done:
                out.commit = source.commit(chunk[:out.attempt.done])
                self._committed(chunk[:out.attempt.done], out.commit)
            return out
        with source.transaction(bounded=True) as tx:
            began = self.clock()
            out = _Outcome(call_handler(self.sub.handler, chunk, tx.connection, batch=self.sub.batch,
                                        owns=source.owns))
            self.stats.observe("handler", self.clock() - began, self.sub.topic, self.sub.group)
            if out.attempt.done:
                out.commit = source.commit(chunk[:out.attempt.done], tx)
        if out.commit is not None:
            self._committed(chunk[:out.attempt.done], out.commit)
        return out

    def _committed(self, events: Sequence[Event], commit: Commit) -> None:
        if not commit.ok:
            return
        self.stats.add(commits=1)
        self.retries.handled(events)
        if self.retry_states is not None:
            self.retry_states.committed({e.partition for e in events})

    def _lost(self, commit: Commit) -> None:
        """A commit was refused: stop processing its partitions and read again from the checkpoints."""
        bad = commit.refused()
        if commit.outcome is CommitOutcome.FENCED:
            self.stats.add(fenced=1)
            log.warning("%s: commit on %s partitions %s fenced: the lease moved to another member; stopped "
                        "processing them", self.member_id, self.sub.topic, bad)
        else:
            log.warning("%s: commit on %s partitions %s returned %s: the checkpoint was moved by someone "
                        "else; reading again from it", self.member_id, self.sub.topic, bad,
                        commit.outcome.name)
        self.source.lost(commit)

    # -- dead letters -------------------------------------------------------------------------------------
    def _dead_letter(self, ev: Event) -> bool:
        """Send ``ev`` to the dead-letter topic with its commit; false if the commit was refused."""
        assert self.dead_letters is not None
        commit = self.dead_letters.send(ev, attempts=self.retries.attempts(ev), error=self.retries.error(ev))
        if not commit.ok:
            self._lost(commit)
            return False
        self.stats.add(dead_lettered=1)
        self._committed([ev], commit)
        return True
