"""Stream-group consumers: gap-free polling, checkpoints with outcomes, seeking, exactly-once transactions.

Read order within a partition is the position. A poll only returns events below each partition's read
fence (SQL function ``partition_fences()``, like Kafka's last stable offset): the first position that may
still belong to a transaction that published to the partition and is still open. Every event below it is
committed or rolled back for good, so no event can later appear before what was already read. An open
transaction holds back only the partitions it published to; transactions that published nothing, and
publishers of other partitions and topics, hold back nobody.

:class:`Consumer` is the public facade. It and the worker runtime (:mod:`pgstreams.worker`) both work
through a :class:`StreamReader` (module ``reader``): the read cursors and committed checkpoints of a
group on some partitions; it fetches, stores checkpoints (fenced by a :class:`LeaseClaim` for group
members) and applies them once committed. :func:`create_checkpoints` gives a group its missing
checkpoints. :class:`Wakeup` (module ``wakeup``) is the wait/backoff rule of every polling loop. The
private ``_storage`` module is the reader's one door to the storage layer. Everything here works on a
session (:class:`pgstreams.ports.SessionPort`); the public constructors take a client and use its session.
"""

from __future__ import annotations

from .batch import ROW_FIELDS, EventBatch
from .consumer import Consumer, ConsumerTransaction
from .reader import (
    CheckpointTransaction,
    Cursor,
    LeaseClaim,
    Start,
    StreamReader,
    check_start,
    create_checkpoints,
)
from .wakeup import Wakeup, topic_wakeup

__all__ = [
    "ROW_FIELDS",
    "CheckpointTransaction",
    "Consumer",
    "ConsumerTransaction",
    "Cursor",
    "EventBatch",
    "LeaseClaim",
    "Start",
    "StreamReader",
    "Wakeup",
    "check_start",
    "create_checkpoints",
    "topic_wakeup",
]
