"""The worker runtime without a database: the runner over a fake Source, timed by a fake clock.

The fake source keeps events per partition with a read cursor and a committed position, like a stream
group; its waiter moves the fake clock instead of waiting, so "max_wait passed" and "the backoff is over"
happen at known clock readings and the tests never sleep.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone

import pytest

from pgstreams import CommitOutcome, Event
from pgstreams.worker import BatchConfig, EventFailed, RetryPolicy, RetryTracker, Subscription
from pgstreams.worker.retry import Delivery
from pgstreams.worker.runner import Runner, WorkerStats
from pgstreams.worker.source import Commit, Reassignment

NOW = datetime(2024, 1, 1, tzinfo=timezone.utc)
POLL_INTERVAL = 0.25


class FakeClock:
    """A clock that moves only when told to (by the tests, or by the fake waiter)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def event(partition: int, position: int) -> Event:
    return Event("t", partition, position, None, f"{partition}@{position}", {}, None, None, None, None, NOW,
                 position)


class FakeWaiter:
    """Waits by moving the fake clock by what a real wait would last (no notification ever comes)."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.waits: list[float] = []

    def restart(self) -> None:
        pass

    def mark(self) -> None:
        pass

    def wait(self, limit: float = math.inf) -> bool:
        seconds = min(limit, POLL_INTERVAL)
        self.waits.append(seconds)
        if sum(self.waits) > 3600:  # a step with nothing to deliver never returns: fail instead of hanging
            raise AssertionError("the runner waited an hour for events")
        self.clock.advance(seconds)
        return False


@dataclass
class FakeTx:
    connection: FakeConn
    staged: list[Event] = field(default_factory=list)
    commit: Commit | None = None


class FakeConn:
    broken = False

    @contextmanager
    def transaction(self) -> Iterator[None]:
        yield


class FakeSource:
    """A stream group in memory: per partition its events, a read cursor and the committed position
    (both indexes into the events). ``refuse`` makes the next commit return that outcome."""

    topic = "t"
    group = "g"

    def __init__(self, clock: FakeClock, events: dict[int, list[Event]]) -> None:
        self.clock = clock
        self.events = events
        self.cursor = dict.fromkeys(events, 0)
        self.committed = dict.fromkeys(events, 0)
        self._partitions = tuple(sorted(events))
        self.refuse: CommitOutcome | None = None
        self.lost_commits: list[Commit] = []
        self.reread = False
        self.fetched: list[list[Event]] = []

    @property
    def partitions(self) -> tuple[int, ...]:
        return self._partitions

    def sync(self) -> Reassignment | None:
        if not self.reread:
            return None
        self.reread = False
        self.cursor = dict(self.committed)
        return Reassignment(self._partitions, rebalanced=False)

    def changed(self) -> bool:
        return False

    def owns(self, partitions: Collection[int], *, leaving_ok: bool = False) -> bool:
        return set(partitions) <= set(self._partitions)

    def idle(self, interrupt: Callable[[], bool]) -> None:
        pass

    def lost(self, commit: Commit) -> None:
        self.lost_commits.append(commit)
        self.reread = True

    def reset(self) -> None:
        self.reread = True

    def waiter(self, interrupt: Callable[[], bool]) -> FakeWaiter:
        return FakeWaiter(self.clock)

    def fetch(self, max_events: int, partitions: Collection[int]) -> list[Event]:
        out: list[Event] = []
        for p in sorted(partitions):
            got = self.events[p][self.cursor[p]:self.cursor[p] + max_events - len(out)]
            self.cursor[p] += len(got)
            out += got
        self.fetched.append(out)
        return out

    def _store(self, events: Sequence[Event]) -> Commit:
        parts = {e.partition for e in events}
        if self.refuse is not None:
            outcome, self.refuse = self.refuse, None
            return Commit(outcome, dict.fromkeys(parts, outcome))
        return Commit(CommitOutcome.STORED, dict.fromkeys(parts, CommitOutcome.STORED))

    def _apply(self, events: Sequence[Event]) -> None:
        for e in events:
            done = self.events[e.partition].index(e) + 1
            self.committed[e.partition] = max(self.committed[e.partition], done)

    @contextmanager
    def transaction(self, *, bounded: bool = False) -> Iterator[FakeTx]:
        tx = FakeTx(FakeConn())
        yield tx
        if tx.commit is not None and tx.commit.ok:
            self._apply(tx.staged)

    def commit(self, events: Sequence[Event], tx: FakeTx | None = None) -> Commit:
        result = self._store(events)
        if tx is None:
            if result.ok:
                self._apply(events)
        else:
            tx.staged, tx.commit = list(events), result
        return result

    def release(self, events: Sequence[Event]) -> None:
        for p in {e.partition for e in events}:
            self.cursor[p] = self.committed[p]


class FakeDeadLetters:
    def __init__(self, source: FakeSource) -> None:
        self.source = source
        self.sent: list[tuple[Event, int, str]] = []

    def send(self, ev: Event, *, attempts: int, error: BaseException | None) -> Commit:
        with self.source.transaction() as tx:
            commit = self.source.commit([ev], tx)
        if commit.ok:
            self.sent.append((ev, attempts, repr(error)))
        return commit


FAST = RetryPolicy(max_attempts=3, backoff=0.5, multiplier=2.0, max_backoff=30.0, jitter=0)


def make_runner(source: FakeSource, clock: FakeClock, handler: Callable[..., object], *,
                batch: bool = False, config: BatchConfig | None = None, mode: str = "at-least-once",
                retry: RetryPolicy = FAST, dead_letter: bool = True) -> tuple[Runner, FakeDeadLetters]:
    sub = Subscription("t", "g", handler, batch, config or BatchConfig(), mode, retry,
                       "t.dlt" if dead_letter else None, "earliest")
    dlt = FakeDeadLetters(source)
    runner = Runner(sub, source, member_id="m", clock=clock, stats=WorkerStats(),
                    dead_letters=dlt if dead_letter else None)  # type: ignore[arg-type]
    return runner, dlt


def steps(runner: Runner, n: int) -> None:
    for _ in range(n):
        runner.step()


# -- batching -------------------------------------------------------------------------------------------
def test_min_events_at_hand_go_out_at_once() -> None:
    clock = FakeClock()
    source = FakeSource(clock, {0: [event(0, i) for i in range(1, 6)]})
    batches: list[list[int]] = []
    runner, _ = make_runner(source, clock, lambda evs: batches.append([e.position for e in evs]), batch=True,
                            config=BatchConfig(min_events=3, max_events=4, max_wait=10))
    start = clock()
    runner.step()
    assert batches == [[1, 2, 3, 4]] and clock() == start, "max_events per batch, no waiting"
    assert source.committed[0] == 4


def test_fewer_than_min_events_wait_for_max_wait_since_the_last_batch() -> None:
    clock = FakeClock()
    source = FakeSource(clock, {0: [event(0, 1), event(0, 2)]})
    handed: list[tuple[float, list[int]]] = []
    runner, _ = make_runner(source, clock, lambda evs: handed.append((clock(), [e.position for e in evs])),
                            batch=True, config=BatchConfig(min_events=5, max_events=10, max_wait=2))
    start = clock()
    runner.step()
    assert handed == [(start + 2, [1, 2])], "delivered once max_wait passed, not before"
    assert all(w <= POLL_INTERVAL for w in runner.waiter.waits)  # type: ignore[attr-defined]
    # the next batch is timed from the hand-over
    source.events[0].append(event(0, 3))
    runner.step()
    assert handed[1] == (start + 4, [3])


# -- retries --------------------------------------------------------------------------------------------
def test_backoff_doubles_up_to_max_backoff() -> None:
    policy = RetryPolicy(max_attempts=10, backoff=0.5, multiplier=2, max_backoff=3, jitter=0)
    assert [policy.delay(n) for n in range(1, 6)] == [0.5, 1.0, 2.0, 3.0, 3.0]


def test_a_failing_event_pauses_its_partition_and_is_dead_lettered_once_spent() -> None:
    clock = FakeClock()
    tracker = RetryTracker(FAST, clock, dead_letter=True)
    ev = event(0, 7)
    first = tracker.event_failed(ev, ValueError("x"))
    assert (first.attempts, first.delay, first.state, first.dead_letter) == (1, 0.5, "retrying", False)
    assert tracker.paused == {0: clock() + 0.5} and tracker.active([0, 1]) == [1]
    assert tracker.next_resume(clock()) == 0.5
    tracker.resume(clock() + 0.5)
    assert tracker.active([0, 1]) == [0, 1]
    assert tracker.event_failed(ev, ValueError("x")).delay == 1.0
    last = tracker.event_failed(ev, ValueError("x"))
    assert (last.attempts, last.delay, last.dead_letter) == (3, 0.0, True)
    assert tracker.due_for_dead_letter(ev)
    tracker.handled([ev])
    assert tracker.attempts(ev) == 0 and tracker.error(ev) is None


def test_without_a_dead_letter_topic_a_spent_event_is_blocked() -> None:
    tracker = RetryTracker(FAST, FakeClock(), dead_letter=False)
    ev = event(0, 1)
    decisions = [tracker.event_failed(ev, ValueError("x")) for _ in range(4)]
    assert [d.state for d in decisions] == ["retrying", "retrying", "blocked", "blocked"]
    assert [d.delay for d in decisions] == [0.5, 1.0, 2.0, 4.0]
    assert not tracker.due_for_dead_letter(ev)


def test_attempts_recorded_elsewhere_carry_over_and_lost_partitions_are_forgotten() -> None:
    tracker = RetryTracker(FAST, FakeClock(), dead_letter=True)
    tracker.restore([(0, 7, 2), (1, 3, 1)])
    assert tracker.event_failed(event(0, 7), ValueError("x")).dead_letter, "2 + 1 attempts are spent"
    tracker.retain([1])
    assert tracker.attempts(event(0, 7)) == 0 and tracker.attempts(event(1, 3)) == 1
    assert tracker.paused == {}


def test_a_batch_failing_as_a_whole_is_retried_then_isolated() -> None:
    tracker = RetryTracker(FAST, FakeClock(), dead_letter=True)
    batch = [event(0, 1), event(0, 2), event(1, 1)]
    d = Delivery(batch, tracker)
    assert d.chunk() == batch
    assert [(r.attempts, r.delay, r.isolate) for r in (d.batch_failed(batch), d.batch_failed(batch))] == [
        (1, 0.5, False), (2, 1.0, False)]
    assert d.batch_failed(batch).isolate
    assert d.chunk() == batch[:1]
    d.passed(batch[:1])
    assert d.chunk() == batch[1:2]
    decision = d.event_failed(batch[1:2], 0, 0, ValueError("x"))
    assert decision.event == batch[1] and d.events == [batch[2]], "the rest of partition 0 waits"
    assert d.chunk() == [batch[2]], "still one by one"


def test_runner_isolates_a_failing_batch_and_dead_letters_only_the_poison_event() -> None:
    clock = FakeClock()
    source = FakeSource(clock, {0: [event(0, i) for i in range(1, 5)]})
    calls: list[list[int]] = []

    def handle(evs: list[Event]) -> None:
        calls.append([e.position for e in evs])
        if any(e.position == 3 for e in evs):
            raise ValueError("poison")

    runner, dlt = make_runner(source, clock, handle, batch=True,
                              retry=RetryPolicy(max_attempts=2, backoff=0, jitter=0),
                              config=BatchConfig(min_events=4, max_events=4))
    steps(runner, 3)
    assert calls[:2] == [[1, 2, 3, 4], [1, 2, 3, 4]], "the whole batch, max_attempts times"
    assert calls[2:5] == [[1], [2], [3]], "then one by one"
    assert [(e.position, n) for e, n, _ in dlt.sent] == [(3, 2)]
    assert [4] in calls[5:] and source.committed[0] == 4
    assert runner.stats.dead_lettered == 1


def test_runner_retries_a_failing_event_after_its_backoff_then_dead_letters_it() -> None:
    clock = FakeClock()
    source = FakeSource(clock, {0: [event(0, i) for i in range(1, 4)], 1: [event(1, 1)]})
    seen: list[tuple[float, str]] = []

    def handle(ev: Event) -> None:
        seen.append((clock(), ev.value))
        if ev.value == "0@2":
            raise ValueError("always")

    runner, dlt = make_runner(source, clock, handle)
    start = clock()
    steps(runner, 4)
    assert [v for _, v in seen if v == "0@2"] == ["0@2"] * 3, "max_attempts deliveries"
    times = [t - start for t, v in seen if v == "0@2"]
    assert times[1] - times[0] >= 0.5 and times[2] - times[1] >= 1.0, "after each backoff"
    assert [v for _, v in seen].count("1@1") == 1, "the other partition went on"
    assert [v for _, v in seen].count("0@1") == 1, "committed before the failing event"
    assert [(e.value, n, "always" in err) for e, n, err in dlt.sent] == [("0@2", 3, True)]
    assert "0@3" in [v for _, v in seen] and source.committed == {0: 3, 1: 1}


def test_what_was_fetched_but_not_committed_is_released_on_failure() -> None:
    clock = FakeClock()
    source = FakeSource(clock, {0: [event(0, 1), event(0, 2), event(0, 3)]})
    fail = {2}

    def handle(ev: Event) -> None:
        if ev.position in fail:
            fail.discard(ev.position)
            raise ValueError("once")

    runner, _ = make_runner(source, clock, handle)
    runner.step()
    assert source.committed[0] == 1 and source.cursor[0] == 1, "released back to the commit"
    runner.step()
    assert source.committed[0] == 3


def test_transactional_batch_naming_the_failed_event_redelivers_the_events_before_it() -> None:
    clock = FakeClock()
    source = FakeSource(clock, {0: [event(0, i) for i in range(1, 4)]})
    calls: list[list[int]] = []

    def handle(evs: list[Event], conn: FakeConn) -> None:
        calls.append([e.position for e in evs])
        if calls[1:] == [] and len(evs) == 3:
            raise EventFailed(evs[1], ValueError("second"))

    runner, _ = make_runner(source, clock, handle, batch=True, mode="transactional",
                            config=BatchConfig(min_events=3, max_events=3))
    runner.step()
    assert calls[:2] == [[1, 2, 3], [1]], "all rolled back: the event before the failed one again"
    assert source.committed[0] == 1
    runner.step()
    assert calls[-1] == [2, 3] and source.committed[0] == 3


# -- refused commits ------------------------------------------------------------------------------------
@pytest.mark.parametrize("outcome", [CommitOutcome.FENCED, CommitOutcome.FURTHER])
@pytest.mark.parametrize("mode", ["at-least-once", "transactional"])
def test_a_refused_commit_stops_the_delivery_and_reads_again_from_the_checkpoints(
        outcome: CommitOutcome, mode: str) -> None:
    clock = FakeClock()
    source = FakeSource(clock, {0: [event(0, 1), event(0, 2)], 1: [event(1, 1)]})
    seen: list[str] = []
    fail = {"0@2"}

    def handle(ev: Event, conn: object = None) -> None:
        seen.append(ev.value)
        if ev.value in fail:
            fail.discard(ev.value)
            raise ValueError("once")

    runner, _ = make_runner(source, clock, handle, mode=mode)
    source.refuse = outcome
    runner.step()  # 0@1 handled, 0@2 fails; committing 0@1 is refused
    assert seen == ["0@1", "0@2"], "nothing more is delivered after the refused commit"
    assert [c.outcome for c in source.lost_commits] == [outcome]
    assert source.committed == {0: 0, 1: 0}
    assert runner.stats.fenced == (1 if outcome is CommitOutcome.FENCED else 0)
    runner.step()  # read again from the checkpoints
    assert seen[2:] == ["0@1", "0@2", "1@1"]
    assert source.committed == {0: 2, 1: 1}
