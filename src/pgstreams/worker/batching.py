"""Batches: when events at hand are handed to the handler (EventSQL's consumption config)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..errors import InvalidArgument
from ..models import Event
from ._checks import integer, number

#: A monotonic clock in seconds (``time.monotonic`` by default); inject another one in tests.
Clock = Callable[[], float]


@dataclass(frozen=True)
class BatchConfig:
    """When a batch is handed to the handler (EventSQL's consumption config).

    ``min_events`` (default 1): deliver as soon as this many events are at hand. ``max_events`` (default
    100): never more in one batch (also the read size of single-event handlers). ``max_wait`` (default
    1.0 s): with fewer than ``min_events`` (but at least one) at hand, deliver anyway once this long has
    passed since the previous batch was handed over (or since the start). An empty batch is never
    delivered.
    """

    min_events: int = 1
    max_events: int = 100
    max_wait: float = 1.0

    def __post_init__(self) -> None:
        integer("min_events", self.min_events)
        integer("max_events", self.max_events)
        if self.min_events > self.max_events:
            raise InvalidArgument(
                f"min_events ({self.min_events}) must not exceed max_events ({self.max_events})")
        number("max_wait", self.max_wait)


class BatchAssembler:
    """Collects events into batches by a :class:`BatchConfig`, timed by an injected clock (default
    ``time.monotonic``).

    :meth:`start` starts the ``max_wait`` timer unless it runs; :meth:`take` hands the batch over and
    stops it, so the next :meth:`start` times the next batch from then.
    """

    def __init__(self, config: BatchConfig, clock: Clock = time.monotonic) -> None:
        self.config = config
        self.clock = clock
        self.events: list[Event] = []
        self.started: float | None = None

    def start(self) -> None:
        """Start timing a batch (no-op if already timing one)."""
        if self.started is None:
            self.started = self.clock()

    def room(self) -> int:
        """How many more events fit."""
        return self.config.max_events - len(self.events)

    def add(self, events: Sequence[Event]) -> None:
        """Add events (at most :meth:`room` are expected)."""
        self.events.extend(events)

    def remaining(self) -> float:
        """Seconds until ``max_wait`` has passed (0 if it has)."""
        if self.started is None:
            return self.config.max_wait
        return max(0.0, self.started + self.config.max_wait - self.clock())

    def ready(self) -> bool:
        """True when a batch is due: ``min_events`` at hand, or at least one and ``max_wait`` passed."""
        n = len(self.events)
        return n >= self.config.min_events or (n > 0 and self.remaining() <= 0)

    def take(self) -> list[Event]:
        """Hand over the batch (at most ``max_events``) and stop timing."""
        out = self.events[:self.config.max_events]
        self.events = self.events[self.config.max_events:]
        self.started = None
        return out

    def clear(self) -> None:
        """Drop what is at hand and stop timing."""
        self.events = []
        self.started = None
