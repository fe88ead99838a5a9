"""Retries: the policy, and the decisions after a handler failed (pure: no I/O, the clock is injected).

A :class:`RetryTracker` counts failed attempts per event and pauses the partition of a failing event for
its backoff (its later events wait, other partitions go on); once the attempts are spent the event is due
for the dead-letter topic, or, without one, retried forever at ``max_backoff`` ("blocked"). A
:class:`Delivery` walks one batch through the handler: what is handed over next, what is left after a
failure, and when a batch that failed as a whole is delivered event by event to find the failing ones.
"""

from __future__ import annotations

import random
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from ..errors import InvalidArgument
from ..models import Event
from ._checks import integer, number
from .batching import Clock

#: What the group status says about a failing event: retried, or retried forever (no dead-letter topic).
RetryState = Literal["retrying", "blocked"]


@dataclass(frozen=True)
class RetryPolicy:
    """How a failing handler is retried.

    An event is delivered at most ``max_attempts`` times (default 5) before it goes to the dead-letter
    topic (or, without one, is retried forever). Before attempt ``n + 1`` the worker waits
    ``min(max_backoff, backoff * multiplier ** (n - 1))`` seconds (defaults 0.5 s, 2.0, 30 s), varied by up
    to ``jitter`` (default 0.1, i.e. +-10 %).
    """

    max_attempts: int = 5
    backoff: float = 0.5
    multiplier: float = 2.0
    max_backoff: float = 30.0
    jitter: float = 0.1

    def __post_init__(self) -> None:
        integer("max_attempts", self.max_attempts)
        number("backoff", self.backoff)
        number("multiplier", self.multiplier, low=1.0)
        number("max_backoff", self.max_backoff)
        number("jitter", self.jitter)
        if self.jitter > 1:
            raise InvalidArgument(f"jitter must be between 0 and 1, got {self.jitter!r}")

    def delay(self, failures: int) -> float:
        """Seconds to wait after the ``failures``-th failed attempt."""
        base = min(self.max_backoff, self.backoff * self.multiplier ** max(0, min(failures - 1, 200)))
        if self.jitter:
            base *= 1 + self.jitter * (2 * random.random() - 1)
        return max(0.0, base)


@dataclass(frozen=True)
class EventRetry:
    """The decision after ``event`` failed for the ``attempts``-th time: its partition pauses ``delay``
    seconds; ``dead_letter`` when its attempts are spent and a dead-letter topic takes it next (then
    ``delay`` is 0); ``state`` is what the group status says meanwhile."""

    event: Event
    attempts: int
    delay: float
    state: RetryState
    dead_letter: bool

    @property
    def spent(self) -> bool:
        """No attempts left (dead-lettered next, or retried forever)."""
        return self.dead_letter or self.state == "blocked"


@dataclass(frozen=True)
class BatchRetry:
    """The decision after a batch failed as a whole for the ``attempts``-th time in a row: wait ``delay``
    seconds and deliver it again, or, its attempts spent (``isolate``), deliver its events one by one."""

    attempts: int
    delay: float
    isolate: bool


class RetryTracker:
    """Failed attempts per event (and the last error) and the partitions paused for a backoff.

    ``policy`` sets the attempts and backoffs; ``dead_letter`` says whether spent events go to a
    dead-letter topic (else they are retried forever); ``clock`` (seconds) times the pauses.
    """

    def __init__(self, policy: RetryPolicy, clock: Clock, *, dead_letter: bool) -> None:
        self.policy = policy
        self.clock = clock
        self.dead_letter = dead_letter
        self.fails: dict[tuple[int, int], int] = {}
        self.errors: dict[tuple[int, int], BaseException] = {}
        #: partition -> clock time its backoff ends
        self.paused: dict[int, float] = {}

    def attempts(self, event: Event) -> int:
        """Failed deliveries of ``event`` so far."""
        return self.fails.get((event.partition, event.position), 0)

    def error(self, event: Event) -> BaseException | None:
        """The last error of ``event`` (``None`` if unknown here, e.g. counted by a previous owner)."""
        return self.errors.get((event.partition, event.position))

    def due_for_dead_letter(self, event: Event) -> bool:
        """Its attempts are spent and a dead-letter topic takes it."""
        return self.dead_letter and self.fails.get((event.partition, event.position), 0) >= (
            self.policy.max_attempts)

    # -- assignment ---------------------------------------------------------------------------------------
    def retain(self, partitions: Collection[int]) -> None:
        """Forget the pauses and attempts of partitions no longer assigned."""
        self.paused = {p: t for p, t in self.paused.items() if p in partitions}
        self.fails = {k: v for k, v in self.fails.items() if k[0] in partitions}

    def restore(self, states: Iterable[tuple[int, int, int]]) -> None:
        """Count attempts recorded elsewhere, ``(partition, position, attempts)``: a partition taken over
        goes on from its previous owner's count, so a hand-over does not give a poison event a fresh set
        of attempts."""
        for p, position, attempts in states:
            key = (int(p), int(position))
            self.fails[key] = max(self.fails.get(key, 0), int(attempts))

    # -- pauses -------------------------------------------------------------------------------------------
    def resume(self, now: float) -> None:
        """End the pauses whose backoff is over at ``now``."""
        for p in [p for p, t in self.paused.items() if t <= now]:
            del self.paused[p]

    def active(self, partitions: Iterable[int]) -> list[int]:
        """Those of ``partitions`` not paused."""
        return [p for p in partitions if p not in self.paused]

    def next_resume(self, now: float) -> float | None:
        """Seconds from ``now`` until the first pause ends (``None``: nothing paused)."""
        if not self.paused:
            return None
        return max(0.0, min(self.paused.values()) - now)

    # -- outcomes -----------------------------------------------------------------------------------------
    def handled(self, events: Iterable[Event]) -> None:
        """These events were committed: forget their failures."""
        for e in events:
            self.fails.pop((e.partition, e.position), None)
            self.errors.pop((e.partition, e.position), None)

    def event_failed(self, event: Event, error: BaseException) -> EventRetry:
        """Count a failed delivery of ``event`` and pause its partition for the backoff."""
        key = (event.partition, event.position)
        n = self.fails[key] = self.fails.get(key, 0) + 1
        self.errors[key] = error
        spent = n >= self.policy.max_attempts
        state: RetryState = "blocked" if spent and not self.dead_letter else "retrying"
        delay = 0.0 if spent and self.dead_letter else self.policy.delay(n)
        self.paused[event.partition] = self.clock() + delay
        return EventRetry(event, n, delay, state, spent and self.dead_letter)


class Delivery:
    """One batch on its way through the handler (what the runner hands over next; pure).

    :meth:`chunk` is what to deliver next: every event left, or only the first while isolating the events
    of a batch that failed as a whole. After each attempt the runner reports :meth:`passed`,
    :meth:`batch_failed` or :meth:`event_failed`; :meth:`next_dead_letter` takes out the events whose
    attempts are spent before the next attempt.
    """

    def __init__(self, events: Sequence[Event], tracker: RetryTracker) -> None:
        self.events = list(events)
        self.tracker = tracker
        self._isolate = 0  # events still to deliver one by one
        self._failures = 0  # consecutive failures of the current chunk as a whole

    def partitions(self) -> set[int]:
        """The partitions of the events left."""
        return {e.partition for e in self.events}

    def chunk(self) -> list[Event]:
        """What to hand the handler next."""
        return self.events[:1] if self._isolate else self.events

    def next_dead_letter(self) -> Event | None:
        """Take out and return the first event that heads its partition here with its attempts spent
        (due for the dead-letter topic), if any."""
        if not self.tracker.fails:
            return None
        seen: set[int] = set()
        for i, e in enumerate(self.events):
            if e.partition in seen:
                continue
            if self.tracker.due_for_dead_letter(e):
                del self.events[i]
                return e
            seen.add(e.partition)
        return None

    def passed(self, chunk: Sequence[Event]) -> None:
        """``chunk`` was handled and committed."""
        self.events = self.events[len(chunk):]
        self._isolate = max(0, self._isolate - len(chunk))
        self._failures = 0

    def batch_failed(self, chunk: Sequence[Event]) -> BatchRetry:
        """``chunk`` failed as a whole (no event named): retry it after a backoff, or once its attempts
        are spent deliver its events one by one."""
        self._failures += 1
        n = self._failures
        if n >= self.tracker.policy.max_attempts:
            self._isolate, self._failures = len(chunk), 0
            return BatchRetry(n, 0.0, True)
        return BatchRetry(n, self.tracker.policy.delay(n), False)

    def event_failed(self, chunk: Sequence[Event], done: int, index: int, error: BaseException) -> EventRetry:
        """``chunk[index]`` failed after the first ``done`` events of the chunk were committed: count it,
        pause its partition, and keep the events before it in its partition and those of the others."""
        failed = chunk[index]
        decision = self.tracker.event_failed(failed, error)
        rest = self.events[done:]
        at = next(i for i, e in enumerate(rest) if e is failed)
        self.events = [e for i, e in enumerate(rest) if e.partition != failed.partition or i < at]
        self._isolate = min(self._isolate, len(self.events))
        return decision
