"""The wait/backoff rule of every loop that polls a topic: woken by notifications, polling as fallback."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..client import Client
    from ..storage.notifications import Listener

#: Longest uninterrupted wait of an interruptible :class:`Wakeup`: stop requests are seen this fast.
_SLICE = 0.05

class Wakeup:
    """When a polling loop reads a topic again: the one wait/backoff rule of every such loop.

    Call :meth:`restart` when a loop starts, :meth:`mark` right before each read and, when the read found
    too little, :meth:`wait`. It waits for a notification about the topic newer than the mark, at most
    ``poll_interval`` (so a lost notification only costs latency). After a notification whose read found
    nothing (its events were still behind the read fence of an open transaction) it rechecks after 2, 4,
    8, ... ms up to ``poll_interval``. With ``interrupt``, the wait is cut into slices of 50 ms and ends
    early (returning false) as soon as ``interrupt()`` is true. Make one with :func:`topic_wakeup`.
    """

    __slots__ = ("_backoff", "_gen", "_interrupt", "_listener", "_poll_interval", "_tid")

    def __init__(self, listener: Listener, topic_id: int, poll_interval: float,
                 interrupt: Callable[[], bool] | None = None) -> None:
        self._listener = listener
        self._tid = topic_id
        self._poll_interval = poll_interval
        self._interrupt = interrupt
        self._backoff = 0.0
        self._gen = 0

    @property
    def poll_interval(self) -> float:
        """The longest wait without a notification (the client's ``poll_interval``)."""
        return self._poll_interval

    def restart(self) -> None:
        """A loop starts: listen (the client's listener starts on first use) and forget the backoff."""
        self._listener.start()
        self._backoff = 0.0

    def mark(self) -> None:
        """About to read: later notifications end the next :meth:`wait`."""
        self._gen = self._listener.generation(self._tid)

    def wait(self, limit: float = math.inf) -> bool:
        """Wait (at most ``limit`` seconds) until reading again is worth it; true if a notification came."""
        woke = self._wait(min(limit, self._backoff or self._poll_interval))
        if woke:
            self._backoff = 0.002  # the events may still be behind the fence: recheck quickly
        elif self._backoff:
            self._backoff = min(self._backoff * 2, self._poll_interval)
        return woke

    def _wait(self, seconds: float) -> bool:
        if self._interrupt is None:
            return self._listener.wait(self._tid, self._gen, seconds)
        end = time.monotonic() + max(0.0, seconds)
        while True:
            left = end - time.monotonic()
            if left <= 0:
                return False
            if self._listener.wait(self._tid, self._gen, min(left, _SLICE)):
                return True
            if self._interrupt():
                return False


def topic_wakeup(client: Client, topic_id: int, *, interrupt: Callable[[], bool] | None = None) -> Wakeup:
    """A :class:`Wakeup` for a topic of ``client`` (its listener and ``poll_interval``)."""
    return Wakeup(client.listener, topic_id, client.poll_interval, interrupt)
