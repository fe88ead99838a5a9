"""Value types of the public API (frozen dataclasses and enums)."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any


@dataclass(frozen=True)
class Event:
    """An event read from a topic.

    ``value`` has the type it was published with (bytes, str, or the decoded JSON value). ``position`` is
    unique within the topic; events of a partition are delivered in ``(txid, position)`` order, where
    ``txid`` is the id of the transaction that published the event. ``created_at`` is aware, in UTC.
    """

    topic: str
    partition: int
    position: int
    key: str | None
    value: Any
    headers: Mapping[str, str]
    event_type: str | None
    event_id: str | None
    correlation_id: str | None
    causation_id: str | None
    created_at: datetime
    txid: int = 0


@dataclass(frozen=True)
class Message:
    """An event to publish with :meth:`Client.publish_many` (dicts with the same keys work too).

    ``partition`` overrides the key's partition; defaults are ``None`` (no key, no headers, ...).
    """

    value: Any
    key: str | None = None
    headers: Mapping[str, str] | None = None
    partition: int | None = None
    event_type: str | None = None
    event_id: str | None = None
    correlation_id: str | None = None
    causation_id: str | None = None


@dataclass(frozen=True)
class PublishResult:
    """Where a published event was stored. ``duplicate`` is true when its ``event_id`` already existed
    and this is the first stored copy's location."""

    topic: str
    partition: int
    position: int
    duplicate: bool = False


@dataclass(frozen=True)
class TopicInfo:
    """A topic's definition: name, partition count, creation time (aware, UTC), ``segment_size``
    (positions per storage segment, default 1,000,000) and ``config`` (per-topic settings, default empty)."""

    name: str
    partitions: int
    created_at: datetime
    segment_size: int = 1_000_000
    config: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class PartitionInfo:
    """Per-partition figures of a topic: the number of events stored and the head (the position of the
    last event in read order, ``None`` when empty)."""

    partition: int
    events: int
    head: int | None


@dataclass(frozen=True)
class TopicDescription:
    """A topic's definition with per-partition figures (see :meth:`Client.describe_topic`)."""

    topic: TopicInfo
    partition_info: tuple[PartitionInfo, ...]

    @property
    def name(self) -> str:
        """The topic name."""
        return self.topic.name

    @property
    def events(self) -> int:
        """Events stored over all partitions."""
        return sum(p.events for p in self.partition_info)


class CommitOutcome(enum.Enum):
    """What storing a checkpoint did (seed 003).

    - ``STORED``: the new position is stored.
    - ``IGNORED``: that position (or a later one) was already stored by this consumer: nothing changed.
    - ``FURTHER``: the stored position is beyond the expected one: another consumer of the group moved on.
    - ``OLDER``: the stored position is behind the expected one (it was reset by a seek elsewhere).
    - ``FENCED``: the consumer belongs to a group member that no longer holds the partition's lease (it
      expired or was handed over): nothing was stored, and the member must stop processing the partition.
    """

    STORED = 1
    IGNORED = 0
    FURTHER = 2
    OLDER = 3
    FENCED = 4

    @property
    def ok(self) -> bool:
        """True for ``STORED`` and ``IGNORED``: the consumer's view of the checkpoint is current."""
        return self in (CommitOutcome.STORED, CommitOutcome.IGNORED)


@dataclass(frozen=True)
class GroupPartitionStatus:
    """A group's progress on one partition: its checkpoint position (``None`` before any event),
    the partition head, and the lag (events after the checkpoint)."""

    group: str
    topic: str
    partition: int
    checkpoint: int | None
    head: int | None
    lag: int
    updated_at: datetime


@dataclass(frozen=True)
class GroupInfo:
    """A group with the topics it has checkpoints on and its total lag."""

    group: str
    topics: tuple[str, ...]
    lag: int
