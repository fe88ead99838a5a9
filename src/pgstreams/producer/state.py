"""What a publishing client keeps per topic (:class:`TopicState`), and the rules that read and update it,
shared by the sync producer and the asyncio client: when to read the topic's row again, and
``publish_many``'s bookkeeping of positions and segments."""

from __future__ import annotations

import itertools
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from ..storage import Segments, TopicRecord, TopicVersion
from ..topicconfig import MAX_MESSAGE_BYTES, TOPIC_CONFIG_DEFAULTS, compacts

#: Seconds between two reads of a topic's row by a publishing client, which notice a change made elsewhere
#: (a partition count raised by :meth:`pgstreams.Client.alter_topic`).
TOPIC_CHECK_INTERVAL = 0.5

#: Seconds after a consumer marked a topic as waited for (after a lapse) during which it rechecks fast:
#: publishers see the mark with the topic's row, read every :data:`TOPIC_CHECK_INTERVAL`, plus that
#: reading's round trip (see ``0027_topic_waiters.sql``).
MARK_WINDOW = TOPIC_CHECK_INTERVAL + 0.2


@dataclass
class TopicState:
    """What a client keeps per topic while publishing: the topic's row (``id``, ``name`` and ``partitions``
    copied from it as plain attributes: they are read once per event), its segments as last seen, the
    round-robin counter of keyless events, and when ``publish_many`` reads the sequence again."""

    record: TopicRecord
    id: int
    name: str
    partitions: int
    segments: Segments
    round_robin: Iterator[int]
    copies_until_check: int = 0  # events publish_many may still COPY before it re-checks the segments ahead
    copied_lower_bound: int = -1  # a lower bound of the last position publish_many stored (-1: unknown)
    max_bytes: int = int(TOPIC_CONFIG_DEFAULTS[MAX_MESSAGE_BYTES])  # the topic's max.message.bytes
    known: int = 0  # a position handed out already: every publish starting later stores its events above
    check_at: float = 0.0  # time.monotonic() when a publish next reads the topic's row (see the package)
    #: the last reading of the topic's row found no consumer waiting for its events: no wake-up
    #: notification until the next reading (see ``0027_topic_waiters.sql``)
    quiet: bool = False
    #: the topic is compacted: events without a key are refused
    compacted: bool = False
    #: keys of ``publish_many`` events already checked, and their partitions (at most 16,384 kept)
    key_partitions: dict[str, int] = field(default_factory=dict)

    @classmethod
    def of(cls, record: TopicRecord) -> TopicState:
        """A fresh state for ``record``."""
        return cls(record, record.id, record.name, record.partitions,
                   Segments(record.id, record.segment_size, covered=record.segments_end),
                   itertools.count(random.randrange(record.partitions)),
                   max_bytes=int(record.config.get(MAX_MESSAGE_BYTES,
                                                   TOPIC_CONFIG_DEFAULTS[MAX_MESSAGE_BYTES])),
                   known=record.last_position, check_at=time.monotonic() + TOPIC_CHECK_INTERVAL,
                   compacted=compacts(record.config))

    def changed(self, version: TopicVersion | None) -> bool:
        """Whether the topic's row read now (``None``: the topic is gone) differs from the cached one."""
        return (version is None or version.partitions != self.partitions
                or version.config != self.record.config)

    def check_due(self) -> bool:
        """Whether a publish should read the topic's row now (every :data:`TOPIC_CHECK_INTERVAL`); if so,
        the next reading is scheduled and wake-ups are sent until this one's answer (:meth:`seen`)."""
        now = time.monotonic()
        if now < self.check_at:
            return False
        self.check_at = now + TOPIC_CHECK_INTERVAL
        self.quiet = False
        return True

    def seen(self, version: TopicVersion | None) -> bool:
        """Take in the topic's row read now (``None``: the topic is gone): whether a consumer waits
        (:attr:`quiet`); true if the row differs from the cached one (see :meth:`changed`)."""
        self.quiet = version is not None and not version.waiting
        return self.changed(version)

    def copy_reads_last(self, count: int) -> bool:
        """Whether ``publish_many``'s COPY of ``count`` events reads the topic's last position first, to
        keep segments ahead of it: once every 1/16 segment of events (the read costs a round trip; if
        other clients' events outran it, the COPY fails for want of a segment and is retried after
        adding segments). Counts the events."""
        due = self.copies_until_check <= 0
        if due:
            self.copies_until_check = max(1, self.record.segment_size // 16)
        self.copies_until_check -= count
        return due

    def copied(self, count: int, last: int) -> int:
        """Take in a COPY of ``count`` events, ``last`` the topic's last position read before it (-1: not
        read, see :meth:`copy_reads_last`): a position handed out before them (:attr:`known`) and a lower
        bound of the last position stored (other clients' events only move the true one further; it is
        read again with the segments). Returns that lower bound (-1: unknown), where the statistics of the
        segment being filled are checked."""
        if last >= 0:
            self.copied_lower_bound = last + count
            if last > self.known:
                self.known = last
        elif self.copied_lower_bound >= 0:
            self.copied_lower_bound += count
        return self.copied_lower_bound


__all__ = ["TOPIC_CHECK_INTERVAL", "TopicState"]
