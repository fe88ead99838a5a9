"""Workers: long-running consumers that run handlers on the partitions their group gives them.

A :class:`Worker` runs one or more subscriptions (topic, group, handler) in a process. For each one it
joins the group as a member (see :mod:`pgstreams.groups`): it registers, heartbeats, takes its fair share
of the partitions by leases and hands partitions over when others join or leave. Only the owner of a
partition's lease processes it, and its commits are fenced by the lease epoch.

Handlers take one event (``batch=False``, the default) or a list of events (``batch=True``); in
``"transactional"`` mode they also get the psycopg connection of the transaction that stores the
checkpoint. Batches follow EventSQL's consumption config: a batch is delivered once ``min_events`` events
are at hand (at most ``max_events``), or, with fewer, once ``max_wait`` seconds have passed since the
previous batch was handed over. New events wake the worker through LISTEN/NOTIFY; it also polls every
``poll_interval`` of the client.

A handler exception is retried with the :class:`RetryPolicy` backoff; the partition of the failing event
pauses meanwhile (its later events wait, other partitions go on). When the attempts are spent the event
goes to the group's dead-letter topic with headers saying why, and the partition moves on; with no
dead-letter topic the event is retried forever and the group status says ``blocked``.

On SIGINT/SIGTERM (:meth:`Worker.run`) or :meth:`Worker.stop` the worker finishes and commits the batch in
hand, gives back its leases and returns.

Modules: ``source`` (the :class:`Source` protocol the runtime works against) and ``streams`` (its
implementation for stream groups), ``batching``, ``retry`` (the policy and the retry decisions),
``handlers`` (checking and calling handlers), ``deadletter``, ``retrystate`` (retry states in the group
status), ``runner`` (the processing loop), ``subscription`` (the options) and ``worker`` (:class:`Worker`,
and :func:`run_consumer`, which runs a handler on a :class:`pgstreams.Consumer`'s own partitions).

The runtime works on the client's session (:mod:`pgstreams.session`) and publishes dead letters through
the client (:class:`pgstreams.ports.Publisher`).
"""

from __future__ import annotations

from .batching import BatchAssembler, BatchConfig, Clock
from .deadletter import (
    DLT_ATTEMPTS,
    DLT_DELIVERIES,
    DLT_ERROR_MESSAGE,
    DLT_ERROR_TYPE,
    DLT_EVENT_ID,
    DLT_FAILED_AT,
    DLT_GROUP,
    DLT_MEMBER,
    DLT_PARTITION,
    DLT_POSITION,
    DLT_TOPIC,
    DeadLetters,
)
from .handlers import EventFailed, Handler, load_handler
from .retry import RetryPolicy, RetryTracker
from .runner import Runner, WorkerStats
from .source import Commit, Reassignment, Source
from .streams import StreamSource
from .subscription import MODES, Mode, Subscription, SubscriptionOptions
from .worker import Worker, run_consumer

__all__ = [
    "DLT_ATTEMPTS",
    "DLT_DELIVERIES",
    "DLT_ERROR_MESSAGE",
    "DLT_ERROR_TYPE",
    "DLT_EVENT_ID",
    "DLT_FAILED_AT",
    "DLT_GROUP",
    "DLT_MEMBER",
    "DLT_PARTITION",
    "DLT_POSITION",
    "DLT_TOPIC",
    "MODES",
    "BatchAssembler",
    "BatchConfig",
    "Clock",
    "Commit",
    "DeadLetters",
    "EventFailed",
    "Handler",
    "Mode",
    "Reassignment",
    "RetryPolicy",
    "RetryTracker",
    "Runner",
    "Source",
    "StreamSource",
    "Subscription",
    "SubscriptionOptions",
    "Worker",
    "WorkerStats",
    "load_handler",
    "run_consumer",
]
