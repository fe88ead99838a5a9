"""Stream-group consumers: gap-free polling, checkpoints with outcomes, seeking, exactly-once transactions.

Read order within a partition is ``(txid, position)``: the id of the publishing transaction, then the
position. A poll only returns events whose transaction id is below the read fence (SQL function
``read_fence()``): the oldest transaction still running, not counting those known to run in another
database of the cluster. Every transaction of this database below that fence has ended, so no event can
later appear before what was already read. A write transaction that stays open therefore holds back
every consumer of its database (not only of its topic) until it ends; keep write transactions short.

:class:`Consumer` is the public facade. It and the worker runtime (:mod:`pgstreams.worker`) both work
through a :class:`StreamReader` (module ``reader``): the read cursors and committed checkpoints of a
group on some partitions; it fetches, stores checkpoints (fenced by a :class:`LeaseClaim` for group
members) and applies them once committed. :func:`create_checkpoints` gives a group its missing
checkpoints. :class:`Wakeup` (module ``wakeup``) is the wait/backoff rule of every polling loop. All SQL
of stream-group reading is in the private ``_sql`` module.
"""

from __future__ import annotations

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
    "CheckpointTransaction",
    "Consumer",
    "ConsumerTransaction",
    "Cursor",
    "LeaseClaim",
    "Start",
    "StreamReader",
    "Wakeup",
    "check_start",
    "create_checkpoints",
    "topic_wakeup",
]
