"""The wait/backoff rule of every loop that polls a topic: woken by notifications, polling as fallback."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..storage.notifications import FAST_RECHECK, MIN_INTERVAL

if TYPE_CHECKING:
    from ..ports import SessionPort
    from ..storage.notifications import Listener

#: Longest uninterrupted wait of an interruptible :class:`Wakeup`: stop requests are seen this fast.
_SLICE = 0.05

#: After a notification, a read that found nothing is retried after this long, then after twice that,
#: and so on while the waits stay below the notifier's :data:`~pgstreams.storage.notifications.MIN_INTERVAL`,
#: even without a new notification: a publishing client announces the events that follow one of its
#: notifications at most that interval later (it coalesces them), so waiting for that announcement alone
#: would add up to that much latency to them. A read that finds events starts the sequence again. At
#: most a few empty reads per notification.
HOT_RECHECK = 0.0005


class Wakeup:
    """When a polling loop reads a topic again: the one wait/backoff rule of every such loop.

    Call :meth:`restart` when a loop starts, :meth:`mark` right before each read and, when the read found
    too little, :meth:`wait`. It waits for a notification about the topic newer than the mark, at most
    ``poll_interval`` (so a lost notification only costs latency). After a notification, or a read that
    found events, it rechecks after :data:`HOT_RECHECK`, twice that, ... while below the notifier's
    interval (events that follow a notification are announced that much later). After a notification
    whose read found nothing (its events were still behind the read fence of an open transaction) it
    rechecks after 2, 4, 8, ... ms up to ``poll_interval``. Each wait marks the topic as waited for (see
    :meth:`pgstreams.storage.notifications.Listener.waiting`: publishers notify only topics with a waiter)
    and, while publishers may not have seen that mark yet, rechecks every 5 ms. With ``interrupt``, the
    wait is cut into slices
    of 50 ms and ends early (returning false) as soon as ``interrupt()`` is true. Make one with
    :func:`topic_wakeup`.
    """

    __slots__ = ("_backoff", "_gen", "_interrupt", "_listener", "_poll_interval", "_recheck", "_tid",
                 "_waited")

    def __init__(self, listener: Listener, topic_id: int, poll_interval: float,
                 interrupt: Callable[[], bool] | None = None) -> None:
        self._listener = listener
        self._tid = topic_id
        self._poll_interval = poll_interval
        self._interrupt = interrupt
        self._backoff = 0.0
        self._gen = 0
        self._recheck = 0.0  # the next recheck after a notification (0: none)
        self._waited = False

    @property
    def poll_interval(self) -> float:
        """The longest wait without a notification (the session's ``poll_interval``)."""
        return self._poll_interval

    def restart(self) -> None:
        """A loop starts: listen (the session's listener starts on first use) and forget the backoff (not
        whether events are flowing)."""
        self._listener.start()
        self._backoff = 0.0

    def mark(self) -> None:
        """About to read: later notifications end the next :meth:`wait`."""
        gen = self._listener.generation(self._tid)
        if gen != self._gen or (self._recheck and not self._waited):
            # a notification came since the last read, or the last read found events: events are flowing
            self._recheck = HOT_RECHECK
            self._gen = gen
        self._waited = False

    def wait(self, limit: float = math.inf) -> bool:
        """Wait (at most ``limit`` seconds) until reading again is worth it; true if a notification came."""
        self._waited = True
        wait = min(limit, self._backoff or self._poll_interval)
        if self._recheck:
            wait = min(wait, self._recheck)
            self._recheck *= 2
            if self._recheck >= MIN_INTERVAL:
                self._recheck = 0.0
        if self._listener.waiting(self._tid):  # publishers may not know yet that a consumer waits
            wait = min(wait, FAST_RECHECK)
        woke = self._wait(wait)
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


def topic_wakeup(session: SessionPort, topic_id: int, *, interrupt: Callable[[], bool] | None = None
                 ) -> Wakeup:
    """A :class:`Wakeup` for a topic of ``session`` (its listener and ``poll_interval``)."""
    return Wakeup(session.listener, topic_id, session.poll_interval, interrupt)
