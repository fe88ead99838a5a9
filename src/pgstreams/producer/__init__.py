"""Publishing: validating and encoding events, choosing partitions, storing them through the storage layer.

The package's modules: :mod:`.state` (:class:`TopicState`, what a client keeps per topic), :mod:`.rows`
(validating, encoding and routing events; :class:`Batch`), :mod:`.idempotence` (producer tags and what a
publish whose outcome was lost does: the rules the sync producer and the asyncio client share, written
once) and :mod:`.producer` (:class:`Producer`, the sync client's publishing).

Keys pick partitions with :func:`pgstreams.partitioner.partition_for_key`; events without key or partition
go round-robin from a random partition per topic and client. Single events are inserted straight through
libpq on a pooled connection; batches are one COPY (all or none).

Idempotent by default, as Kafka's producer: each client has a producer id (drawn once, at its first publish)
and numbers its publishes; a publish on a pooled connection stores its *producer tag* ``(producer id << 32)
| (number mod 2^32)`` in the event row itself. If the connection breaks during the call (a restart, a killed
session), the outcome is unknown: the publish is retried on a fresh connection (within the client's
``retry_timeout``), which first waits until the broken session ended, then looks for the tag in the event's
partitions above the last position the client knew before the attempt, and stores the event only if it is
absent. Nothing is written per event beyond the tag, and the successful path gains no round trip.
``connect(idempotent=False)`` turns the tags off (a retried publish is then stored again: at least once).
The asyncio client (:mod:`pgstreams.aio`) publishes with the tags of its sync client's :class:`Producer`
(:attr:`pgstreams.Client.producer`) and settles a lost outcome by the same procedures
(:mod:`.idempotence`), with the same rows (:func:`checked_row`) and segment upkeep
(:class:`pgstreams.storage.Segments`).

A client caches each topic's row (partition count, ``max.message.bytes``), so that a publish costs one round
trip. A change of the topic in another process (:meth:`pgstreams.Client.alter_topic`) is noticed within
:data:`TOPIC_CHECK_INTERVAL` seconds of publishing: once per interval and topic, a single publish also
reads the topic's row in the same round trip (one more statement in its pipeline), and ``publish_many``
reads it before its batch; a changed row is forgotten, so the next publish reads the topic again and uses
the new partition count. Publishes inside a caller's transaction (``conn=``) do not check. An event given
an explicit partition beyond the cached count reads the topic again before it is refused. (Listening for
a notification of the change instead would cost the server more: PostgreSQL wakes every listening
session of a database for every notification, and publishers send wake-up notifications all the time.)
"""

from __future__ import annotations

from .idempotence import Interrupted, ProducerTags, backend_pid
from .producer import Producer
from .rows import Batch, checked_row, choose_partition, encode_row, event_row, event_size, route
from .state import MARK_WINDOW, TOPIC_CHECK_INTERVAL, TopicState

__all__ = ["MARK_WINDOW", "TOPIC_CHECK_INTERVAL", "Batch", "Interrupted", "Producer", "ProducerTags",
           "TopicState", "backend_pid", "checked_row", "choose_partition", "encode_row", "event_row",
           "event_size", "route"]
