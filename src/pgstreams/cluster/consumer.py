"""The cluster consumer: a stream group's reader of every (shard, partition) of a cluster's topic.

A :class:`ClusterConsumer` holds one :class:`pgstreams.Consumer` per shard of the topic's span; each
keeps the group's checkpoints of its partitions on its own shard. A poll returns the events of one shard
(taking the shards in turn), so a commit goes to one shard; events carry their ``shard``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import TYPE_CHECKING

from ..consumer import Consumer, ConsumerTransaction
from ..consumer.reader import check_limits
from ..errors import ConnectionLost, InvalidArgument, ShardUnavailable
from ..models import CommitOutcome, Event, with_shard

if TYPE_CHECKING:
    from ..consumer import Start
    from .client import ClusterClient

__all__ = ["SHARD_RETRY_INTERVAL", "ClusterConsumer"]

log = logging.getLogger("pgstreams.cluster")

#: Seconds a consumer leaves a shard it could not reach alone before trying it again (the other shards
#: are read meanwhile).
SHARD_RETRY_INTERVAL = 2.0


def tag_shard(events: Sequence[Event], shard: int) -> None:
    """Record ``shard`` in events built by a shard's reader (their instances are fresh, never shared)."""
    if shard:
        for e in events:
            with_shard(e, shard)


class ClusterConsumer:
    """Reads a cluster's topic for a stream group: every partition of every shard of the topic's span.

    Make one with :meth:`ClusterClient.consumer`. Not thread-safe. :meth:`poll` returns the events of
    one shard at a time (order is kept within each (shard, partition)), :meth:`commit` stores the
    checkpoints on the shards that hold the partitions. A shard that cannot be reached is left alone for
    :data:`SHARD_RETRY_INTERVAL` seconds while the others are read (its events wait there, nothing is
    lost); :class:`pgstreams.ShardUnavailable` is raised only when no shard can be read.
    ``consumers`` holds the per-shard :class:`pgstreams.Consumer` objects (their events have ``shard``
    0; the cluster consumer's carry their shard).
    """

    def __init__(self, cluster: ClusterClient, topic: str, group: str, *, start: Start = "earliest") -> None:
        state = cluster.topic(topic, refresh=True)
        self.cluster = cluster
        self.topic = topic
        self.group = group
        consumers = cluster.each_shard(lambda c: c.consumer(topic, group, start=start), range(state.span))
        #: one consumer per shard of the topic's span, in shard order
        self.consumers: tuple[Consumer, ...] = tuple(consumers)
        self._next = 0
        self._last: int | None = None  # the shard of the last poll's events
        self._down: dict[int, float] = {}  # shard -> when to try it again
        self._slice = max(0.01, cluster.poll_interval / len(consumers))

    def __repr__(self) -> str:
        return (f"<pgstreams.ClusterConsumer topic={self.topic!r} group={self.group!r} "
                f"shards={len(self.consumers)}>")

    @property
    def partitions(self) -> tuple[tuple[int, int], ...]:
        """The (shard, partition) pairs this consumer reads."""
        return tuple((s, p) for s, c in enumerate(self.consumers) for p in c.partitions)

    def committed(self) -> dict[tuple[int, int], int | None]:
        """The last committed position per (shard, partition) as this consumer knows it."""
        return {(s, p): pos for s, c in enumerate(self.consumers) for p, pos in c.committed().items()}

    # -- polling -------------------------------------------------------------------------------------
    def _poll_shard(self, shard: int, max_events: int, timeout: float) -> list[Event]:
        until = self._down.get(shard)
        if until is not None:
            if time.monotonic() < until:
                return []
            del self._down[shard]
        try:
            got = self.consumers[shard].poll(max_events, timeout)
        except ConnectionLost as exc:
            self._down[shard] = time.monotonic() + SHARD_RETRY_INTERVAL
            log.warning("%s is unavailable, reading the other shards: %s", self.cluster.shard_name(shard),
                        exc)
            if len(self._down) == len(self.consumers):
                raise ShardUnavailable(f"no shard of topic {self.topic!r} can be read; "
                                       f"{self.cluster.shard_name(shard)}: {exc}") from exc
            return []
        if got:
            tag_shard(got, shard)
            self._last = shard
            self._next = shard + 1
        return got

    def poll(self, max_events: int = 500, timeout: float = 1.0) -> list[Event]:
        """Up to ``max_events`` next events (default 500) of one shard, waiting at most ``timeout`` seconds
        (default 1.0) for the first one; an empty list when none arrived. The shards are taken in turn;
        while all are idle, the wait goes to each in turn for ``poll_interval / shards`` seconds."""
        max_events, timeout = check_limits(max_events, timeout)
        n = len(self.consumers)
        deadline = time.monotonic() + timeout
        turn = self._next
        while True:
            for k in range(n):
                got = self._poll_shard((self._next + k) % n, max_events, 0.0)
                if got:
                    return got
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self._last = None
                return []
            got = self._poll_shard(turn % n, max_events, min(remaining, self._slice))
            turn += 1
            if got:
                return got

    # -- committing ----------------------------------------------------------------------------------
    def commit(self, events: Sequence[Event] | None = None, *, durable: bool = True) -> CommitOutcome:
        """Store the position after ``events`` (default: the last poll's) on each of their (shard,
        partition) pairs, on the shards holding them (see :meth:`pgstreams.Consumer.commit`; ``durable``
        default true). Returns the most severe outcome. Raises :class:`pgstreams.ShardUnavailable` when a
        shard of the events cannot be reached: that shard's events polled and not committed are then
        read again (from its checkpoints) once it is back, at-least-once."""
        if events is None:
            if self._last is None:
                return CommitOutcome.IGNORED
            groups: dict[int, list[Event] | None] = {self._last: None}
        else:
            if isinstance(events, (str, bytes)) or not isinstance(events, Sequence):
                raise InvalidArgument(f"events must be a list of events, not {type(events).__name__}")
            groups = {}
            for e in events:
                bucket = groups.setdefault(e.shard, [])
                assert bucket is not None
                bucket.append(e)
            if not groups:
                return CommitOutcome.IGNORED
        worst = CommitOutcome.IGNORED
        for shard, chunk in groups.items():
            if not 0 <= shard < len(self.consumers):
                raise InvalidArgument(f"an event of shard {shard} is no event of this consumer")
            try:
                with self.cluster.on_shard(shard):
                    outcome = self.consumers[shard].commit(chunk, durable=durable)
            except ShardUnavailable:
                # its uncommitted events are read again from its checkpoints once it is back
                self.consumers[shard].reader.rewind()
                raise
            worst = max(worst, outcome, key=lambda o: o.value)
        return worst

    # -- seeking -------------------------------------------------------------------------------------
    def _check_shard(self, shard: object) -> None:
        if isinstance(shard, bool) or not isinstance(shard, int) or not 0 <= shard < len(self.consumers):
            raise InvalidArgument(f"shard must be an integer from 0 to {len(self.consumers) - 1}, "
                                  f"not {shard!r}")

    def seek(self, shard: int, partition: int, position: int) -> None:
        """Move the group's checkpoint on (``shard``, ``partition``), as :meth:`pgstreams.Consumer.seek`."""
        self._check_shard(shard)
        with self.cluster.on_shard(shard):
            self.consumers[shard].seek(partition, position)

    def seek_to_beginning(self) -> None:
        """Move every checkpoint of every shard before its first event."""
        self.cluster.each_shard(lambda c: self._of(c).seek_to_beginning(), range(len(self.consumers)))

    def seek_to_end(self) -> None:
        """Move every checkpoint of every shard after its last event stored now."""
        self.cluster.each_shard(lambda c: self._of(c).seek_to_end(), range(len(self.consumers)))

    def seek_to_time(self, dt: datetime) -> None:
        """Move every checkpoint of every shard before its first event created at or after ``dt``."""
        if not isinstance(dt, datetime) or dt.tzinfo is None or dt.utcoffset() is None:
            raise InvalidArgument("seek_to_time needs a timezone-aware datetime")
        self.cluster.each_shard(lambda c: self._of(c).seek_to_time(dt), range(len(self.consumers)))

    def _of(self, client: object) -> Consumer:
        return self.consumers[next(i for i, c in enumerate(self.cluster.shards) if c is client)]

    # -- exactly-once ----------------------------------------------------------------------------------
    @contextmanager
    def transaction(self, shard: int) -> Iterator[ConsumerTransaction]:
        """:meth:`pgstreams.Consumer.transaction` on shard ``shard``: poll its partitions, write on its
        ``.connection`` and store the checkpoint in one transaction of that shard (exactly-once holds per
        shard: keep a handler's writes on the shard of its events)."""
        self._check_shard(shard)
        with self.cluster.on_shard(shard), self.consumers[shard].transaction() as tx:
            original = tx.poll

            def poll(max_events: int = 500, timeout: float = 1.0) -> list[Event]:
                got = original(max_events, timeout)
                tag_shard(got, shard)
                return got

            tx.poll = poll  # type: ignore[method-assign]
            yield tx
