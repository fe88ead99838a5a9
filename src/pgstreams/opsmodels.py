"""Value types of operations (re-exported by :mod:`pgstreams.models`, which holds the other value types of
the public API): a topic's retention and compaction figures, what a maintenance pass did, a group reset,
a dead-letter replay, and a topic in the database-wide status."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .models import Event


@dataclass(frozen=True)
class RetentionStatus:
    """A topic's retention: its policy (``None``: unlimited; see :mod:`pgstreams.topicconfig`), the oldest
    retained event (``oldest_position``, ``oldest_at``; ``None`` when empty), its size on disk in bytes
    (segments, indexes and TOAST), the number of segments, when retention last ran on it
    (``retention_ran_at``, ``None``: never) and what it removed so far. Times are aware, in UTC."""

    topic: str
    cleanup_policy: str
    retention_ms: int | None
    retention_events: int | None
    retention_bytes: int | None
    oldest_position: int | None
    oldest_at: datetime | None
    bytes: int
    segments: int
    retention_ran_at: datetime | None
    segments_removed: int
    events_removed: int
    bytes_removed: int
    #: compaction (compacted topics): the share of mapped events superseded by a newer event of their key
    #: (``None``: nothing mapped), the last segment rewrite, and what rewrites removed so far
    dirty_ratio: float | None = None
    compacted_at: datetime | None = None
    segments_compacted: int = 0
    events_compacted: int = 0
    tombstones_removed: int = 0
    bytes_compacted: int = 0


@dataclass(frozen=True)
class CompactionStatus:
    """Compaction's figures of a topic (see docs/operations.md, *Compaction*): its ``dirty_ratio`` (the
    share of the events of its mapped segments that a newer event of their key superseded; ``None``:
    nothing mapped yet), when compaction last looked at it (``ran_at``) and last rewrote a segment
    (``compacted_at``; ``None``: never), the segments rewritten, the events and tombstones removed and the
    bytes freed so far. Times are aware, in UTC."""

    topic: str
    dirty_ratio: float | None
    ran_at: datetime | None
    compacted_at: datetime | None
    segments_rewritten: int
    events_removed: int
    tombstones_removed: int
    bytes_removed: int


@dataclass(frozen=True)
class MaintenanceReport:
    """What one maintenance pass did: segments created ahead of publishers, segments sealed (their
    statistics recorded), segments and events removed by retention (detached from their topic), stale
    members expired, and how long it took (seconds). ``skipped`` is true when another pass of the schema
    was running (nothing done). ``segments_dropped`` and ``purge_duration`` (seconds) are those of the
    purge that followed the pass (dropping detached segments, which frees their space; 0 without one);
    ``segments_to_purge``: the detached segments it left for the next call (its time budget was spent).
    ``topics_checked``: the topics whose state had moved since the last pass (the others were skipped).
    Compaction's figures: see the fields' comments."""

    segments_created: int = 0
    segments_sealed: int = 0
    segments_removed: int = 0
    events_removed: int = 0
    members_expired: int = 0
    duration: float = 0.0
    skipped: bool = False
    segments_dropped: int = 0
    purge_duration: float = 0.0
    topics_checked: int = 0
    segments_to_purge: int = 0
    #: compaction: sealed segments mapped into their topics' key maps, segments rewritten, events removed
    segments_mapped: int = 0
    segments_compacted: int = 0
    events_compacted: int = 0
    #: compacted segments left for the next pass (the pass's compaction budget was spent)
    segments_to_compact: int = 0


@dataclass(frozen=True)
class CheckpointReset:
    """One partition of a group reset: its checkpoint before (``None``: none) and after."""

    group: str
    topic: str
    partition: int
    previous: int | None
    checkpoint: int


@dataclass(frozen=True)
class ReplayResult:
    """What a dead-letter replay did: events read from the dead-letter topic, events published (or, with
    ``dry_run``, that would be), events skipped by the filter, and the target topic per source topic."""

    read: int
    replayed: int
    skipped: int
    dry_run: bool
    events: tuple[Event, ...] = ()


@dataclass(frozen=True)
class TopicStatus:
    """A topic in the database-wide status (:class:`StatusSnapshot`): its partition count, size on disk in
    bytes (segments, indexes, TOAST), segments, retention limits (``None``: unlimited), whether it is
    a dead-letter topic (``<topic>.dlt`` or a group's configured dead-letter topic), and compaction's
    figures."""

    topic: str
    partitions: int
    bytes: int
    segments: int
    retention_ms: int | None
    retention_events: int | None
    retention_bytes: int | None
    dead_letter: bool
    created_at: datetime
    #: compaction (compacted topics, see :class:`CompactionStatus`): the dirty ratio (``None``: nothing
    #: mapped, or not compacted), the last segment rewrite, the events and bytes it removed so far
    dirty_ratio: float | None = None
    compacted_at: datetime | None = None
    events_compacted: int = 0
    bytes_compacted: int = 0
