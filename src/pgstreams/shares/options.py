"""The options of a share consumer, their defaults and their checks."""

from __future__ import annotations

import math
import os
import socket
import uuid
from dataclasses import dataclass
from typing import Literal

from ..consumer.reader import Start, check_start
from ..errors import InvalidArgument
from ..names import check_topic

#: Seconds an acquired event stays locked to its consumer unless acked, released or renewed.
DEFAULT_LOCK_TIMEOUT = 30.0
#: Deliveries of an event (each acquisition counts one) after which it goes to the dead-letter topic.
DEFAULT_MAX_DELIVERIES = 5
#: Rows a share group keeps at most per partition before its frontier stops (the bounded window of events
#: in flight, released, delayed or waiting for their key); one poll may add a batch beyond it.
DEFAULT_SHARE_WINDOW = 10_000
#: The orderings of a share group: ``None`` (no order) or ``"key"``.
ORDERINGS: tuple[str | None, ...] = (None, "key")
#: Longest delay of a release, and longest lock timeout (seconds): a day.
MAX_DELAY = 86_400.0

Ordering = Literal["key"] | None


@dataclass(frozen=True)
class ShareOptions:
    """The options of :meth:`pgstreams.Client.share_consumer` with their defaults: ``start``
    (``"earliest"``), ``lock_timeout`` (:data:`DEFAULT_LOCK_TIMEOUT`, 30 s), ``max_deliveries``
    (:data:`DEFAULT_MAX_DELIVERIES`, 5), ``dead_letter`` (``True``: ``"<topic>.dlt"``; a topic name;
    ``False``: none) and ``ordering`` (``None``; ``"key"``)."""

    start: Start = "earliest"
    lock_timeout: float = DEFAULT_LOCK_TIMEOUT
    max_deliveries: int = DEFAULT_MAX_DELIVERIES
    dead_letter: bool | str = True
    ordering: Ordering = None


#: Every share-consumer option at its default: the one place their defaults come from.
SHARE_DEFAULTS = ShareOptions()


@dataclass(frozen=True)
class CheckedOptions:
    """Share-consumer options as checked for a topic: the dead-letter topic resolved (``None``: none)."""

    start: Start
    lock_timeout: float
    max_deliveries: int
    dead_letter: str | None
    ordering: Ordering


def check_seconds(name: str, value: object, *, low: float, high: float = math.inf, low_ok: bool = True
                  ) -> float:
    """``value`` as a number of seconds from ``low`` (excluded unless ``low_ok``) to ``high``, else
    :class:`InvalidArgument` naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InvalidArgument(f"{name} must be a number of seconds, got {value!r}")
    if value < low or (not low_ok and value == low) or value > high:
        bound = f"{'at least' if low_ok else 'more than'} {low:g}" + (
            f" and at most {high:g}" if high != math.inf else "")
        raise InvalidArgument(f"{name} must be {bound} seconds, got {value!r}")
    return float(value)


def check_poll_limits(max_events: object, timeout: object) -> tuple[int, float]:
    """A share poll's ``max_events`` (1 to 100,000) and ``timeout`` (seconds, at least 0), checked."""
    if isinstance(max_events, bool) or not isinstance(max_events, int) or not 1 <= max_events <= 100_000:
        raise InvalidArgument(f"max_events must be an integer from 1 to 100000, got {max_events!r}")
    return max_events, check_seconds("timeout", timeout, low=0.0)


def check_lock_timeout(value: object) -> float:
    """Validate a share group's lock timeout: a number of seconds from 0.01 to a day (86400); raises
    :class:`pgstreams.InvalidArgument` naming ``lock_timeout`` otherwise."""
    lock = check_seconds("lock_timeout", value, low=0.0, high=MAX_DELAY, low_ok=False)
    if lock < 0.01:
        raise InvalidArgument(f"lock_timeout must be at least 0.01 seconds, got {value!r}")
    return lock


def check_share_options(topic: str, options: ShareOptions) -> CheckedOptions:
    """Validate share-consumer options for ``topic`` (:class:`InvalidArgument`, :class:`InvalidName`)."""
    start = check_start(options.start)
    lock = check_lock_timeout(options.lock_timeout)
    md = options.max_deliveries
    if isinstance(md, bool) or not isinstance(md, int) or not 1 <= md <= 1_000_000:
        raise InvalidArgument(f"max_deliveries must be an integer from 1 to 1000000, got {md!r}")
    dl = options.dead_letter
    dlt: str | None
    if dl is True:
        dlt = f"{topic}.dlt"
    elif dl is False:
        dlt = None
    elif isinstance(dl, str):
        dlt = dl
    else:
        raise InvalidArgument(f"dead_letter must be True, False or a topic name, not {dl!r}")
    if dlt is not None:
        check_topic(dlt)
        if dlt == topic:
            raise InvalidArgument(f"the dead-letter topic of {topic!r} cannot be the topic itself")
    if options.ordering not in ORDERINGS:
        raise InvalidArgument(f"ordering must be None or 'key', not {options.ordering!r}")
    return CheckedOptions(start, lock, md, dlt, options.ordering)


def new_consumer_id() -> str:
    """A consumer id: ``host:pid:random``."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
