"""Share groups: competing consumers per event (Kafka's share groups; a queue over the log).

Any number of :class:`ShareConsumer` objects, in any processes, share every partition of a topic: each
:meth:`~ShareConsumer.poll` acquires events (locked for ``lock_timeout`` seconds) that the consumer then
acks, releases, rejects or renews one by one. The group's state holds a frontier per partition and a row
per event in flight (see ``0007_share_groups.sql``), so it grows with the events in flight, not with the
log. A queue (:meth:`pgstreams.Client.create_queue`) is a topic with a share group of the same name.

Modules: ``options`` (:class:`ShareOptions`, their defaults and checks), ``consumer``
(:class:`ShareConsumer`: acquiring and settling), ``deadletters`` (the copies of events delivered too
often or rejected).
"""

from __future__ import annotations

from .consumer import ShareConsumer, ShareTransaction
from .options import (
    DEFAULT_LOCK_TIMEOUT,
    DEFAULT_MAX_DELIVERIES,
    DEFAULT_SHARE_WINDOW,
    ORDERINGS,
    SHARE_DEFAULTS,
    Ordering,
    ShareOptions,
)

__all__ = [
    "DEFAULT_LOCK_TIMEOUT",
    "DEFAULT_MAX_DELIVERIES",
    "DEFAULT_SHARE_WINDOW",
    "ORDERINGS",
    "SHARE_DEFAULTS",
    "Ordering",
    "ShareConsumer",
    "ShareOptions",
    "ShareTransaction",
]
