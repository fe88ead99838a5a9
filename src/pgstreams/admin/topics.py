"""Administration of topics: creating, altering, describing, listing and deleting them, their retention
status and a look at their events (behind the :class:`TopicAdmin` methods of :class:`pgstreams.Client`
and the ``pgstreams topics`` commands)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from .. import topicconfig
from ..consumer.reader import events_of
from ..errors import InvalidArgument, InvalidConfig, TopicConflict, TopicNotFound
from ..models import DEFAULT_SEGMENT_SIZE, Event, KeySearch, RetentionStatus, TopicDescription, TopicInfo
from ..names import check_partitions, check_topic
from ..ports import HasSession, SessionPort
from ..session import denied

#: Events :meth:`pgstreams.Client.read_events` returns unless told otherwise.
DEFAULT_BROWSE_LIMIT = 20
#: How many events of a partition :meth:`TopicAdmin.search_events` walks back through at most, by default.
DEFAULT_SEARCH_SCAN = 10_000


def topic_definition(name: object, partitions: object, segment_size: object,
                     config: Mapping[str, Any] | None) -> tuple[int, dict[str, Any]]:
    """Validate a topic's definition (the arguments of :meth:`pgstreams.Client.create_topic`); return its
    segment size and configuration as stored (``segment.events`` is the segment size)."""
    check_topic(name)
    check_partitions(partitions)
    if isinstance(segment_size, bool) or not isinstance(segment_size, int) or segment_size < 1000:
        raise InvalidArgument(f"segment_size must be an integer >= 1000, got {segment_size!r}")
    settings = topicconfig.check_config(config)
    if topicconfig.SEGMENT_EVENTS in settings:
        events = int(settings.pop(topicconfig.SEGMENT_EVENTS))
        if segment_size not in (DEFAULT_SEGMENT_SIZE, events):
            raise InvalidConfig(f"segment.events {events} contradicts segment_size {segment_size}")
        segment_size = events
    topicconfig.check_consistent(settings)
    return segment_size, settings


def check_same_topic(info: TopicInfo, partitions: int, segment_size: int, settings: dict[str, Any] | None,
                     where: str = "") -> None:
    """:class:`TopicConflict` unless the existing topic ``info`` has this definition (``settings``
    ``None``: any configuration). ``where`` is appended to the topic's name in the message."""
    name = f"{info.name!r}{where}"
    if info.partitions != partitions:
        raise TopicConflict(f"topic {name} exists with {info.partitions} partitions, not {partitions}")
    if info.segment_size != segment_size:
        raise TopicConflict(f"topic {name} exists with segment_size {info.segment_size}, not {segment_size}")
    if settings is not None and dict(info.config) != settings:
        raise TopicConflict(f"topic {name} exists with config {dict(info.config)}, not {settings}")


def describe_topic(session: SessionPort, name: str) -> TopicDescription:
    """Topic ``name`` with its per-partition figures and every configuration key (see
    :meth:`pgstreams.Client.describe_topic`)."""
    record = session.topic_state(name, refresh=True).record
    compaction = session.store.compaction.status(name)
    return TopicDescription(record.info(), tuple(session.store.topics.partition_figures(record)),
                            topicconfig.effective(record.config, record.segment_size),
                            compaction[0] if compaction else None)


def _position(name: str, value: Any) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
        raise InvalidArgument(f"{name} must be an integer >= 0, not {value!r}")


def _browsed(session: SessionPort, topic: str, partition: int, limit: int) -> Any:
    state = session.topic_state(topic, refresh=True)
    if isinstance(partition, bool) or not isinstance(partition, int) or not (
            0 <= partition < state.partitions):
        raise InvalidArgument(f"partition must be an integer from 0 to {state.partitions - 1} for topic "
                              f"{state.name!r}, not {partition!r}")
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 1000:
        raise InvalidArgument(f"limit must be an integer from 1 to 1000, not {limit!r}")
    return state


def read_events(session: SessionPort, topic: str, partition: int, *, position: int | None = None,
                at: datetime | None = None, before: int | None = None,
                limit: int = DEFAULT_BROWSE_LIMIT) -> list[Event]:
    """Committed events of one partition of ``topic`` without a group (see
    :meth:`pgstreams.Client.read_events`, which states the defaults)."""
    state = _browsed(session, topic, partition, limit)
    if sum(x is not None for x in (position, at, before)) > 1:
        raise InvalidArgument("give a position, a time or a position to read before, not several")
    _position("position", position)
    _position("before", before)
    if at is not None and (not isinstance(at, datetime) or at.tzinfo is None or at.utcoffset() is None):
        raise InvalidArgument(f"the time must be a timezone-aware datetime, not {at!r}")
    status = session.store.status
    if before is not None:
        return events_of(state.name, status.browse_before(state.id, partition, before, limit))
    start = position or 0
    if at is not None:
        found = status.position_at(state.id, partition, at)
        if found is None:
            return []
        start = found
    return events_of(state.name, status.browse(state.id, partition, start, limit))


class TopicAdmin:
    """The topic administration of :class:`pgstreams.Client` (a mixin over its session)."""

    def create_topic(
        self: HasSession, name: str, partitions: int = 1, *, segment_size: int = DEFAULT_SEGMENT_SIZE,
        config: Mapping[str, Any] | None = None,
    ) -> TopicInfo:
        """Create topic ``name`` with ``partitions`` partitions (default 1, at most
        :data:`pgstreams.MAX_PARTITIONS`) and configuration ``config`` (default none: every key has its
        default; keys and defaults in :mod:`pgstreams.topicconfig`, values as ints or strings).

        Idempotent for an identical definition; raises :class:`TopicConflict` if the topic exists with
        another partition count, segment size or (when ``config`` is given) configuration,
        :class:`InvalidName` for a bad name, :class:`InvalidConfig` naming a bad key or value.
        ``segment_size`` (default :data:`pgstreams.DEFAULT_SEGMENT_SIZE` positions; config key
        ``segment.events``) is the storage unit of the topic: retention removes whole segments.
        """
        topics = self.session.store.topics
        segment_size, settings = topic_definition(name, partitions, segment_size, config)
        with denied(f"create topic {name!r}"):
            topics.create(name, partitions, segment_size, settings)
        record = topics.get(name)
        if record is None:
            raise TopicNotFound(f"topic {name!r} does not exist")
        info = record.info()
        check_same_topic(info, partitions, segment_size, settings if config is not None else None)
        return info

    def alter_topic(self: HasSession, name: str, config: Mapping[str, Any] | None = None, *,
                    partitions: int | None = None, delete_config: Iterable[str] = ()) -> TopicDescription:
        """Change a topic: set the ``config`` keys (default none), reset the ``delete_config`` keys to their
        defaults, and raise the partition count to ``partitions`` (default: unchanged). All or nothing.

        Like Kafka, adding partitions keeps every event where it is, but keys may hash to other partitions
        from now on (per-key order holds only among events published with the same count); every group
        reading the topic starts the new partitions at their first event. Running consumers and workers
        see the new partitions once they are created again; publishers of other processes notice the
        change within :data:`pgstreams.producer.TOPIC_CHECK_INTERVAL` seconds of publishing (see
        :mod:`pgstreams.producer`) and use the new count from then on. Decreasing is refused, as is
        changing ``segment.events``.
        Raises :class:`InvalidConfig` (naming the key), :class:`InvalidArgument`, :class:`TopicNotFound`.
        """
        session = self.session
        check_topic(name)
        settings = topicconfig.check_config(config)
        if isinstance(delete_config, str):
            delete_config = [delete_config]
        deleted = list(delete_config)
        for key in deleted:
            if not isinstance(key, str) or key not in topicconfig.TOPIC_CONFIG_DEFAULTS:
                raise InvalidConfig(f"unknown topic config key {key!r}")
            if key in settings:
                raise InvalidConfig(f"{key}: both set and deleted")
        current = session.topic_state(name, refresh=True).record
        for key in (topicconfig.CREATE_ONLY & (set(settings) | set(deleted))):
            if key in deleted or int(settings[key]) != current.segment_size:
                raise InvalidConfig(f"{key} cannot be changed after the topic is created "
                                    f"(it is {current.segment_size})")
            settings.pop(key)
        topicconfig.check_consistent(
            {**{k: v for k, v in current.config.items() if k not in deleted}, **settings})
        if partitions is not None:
            check_partitions(partitions)
            if partitions < current.partitions:
                raise InvalidArgument(f"partitions: topic {name!r} has {current.partitions} partitions; "
                                      "decreasing is not possible")
        try:
            with denied(f"alter topic {name!r}"):
                done = session.store.operations.alter_topic(name, settings, deleted, partitions)
        except ValueError as exc:
            raise InvalidArgument(f"partitions: {exc}") from None
        if done is None:
            raise TopicNotFound(f"topic {name!r} does not exist")
        session.forget_topic(name)
        return describe_topic(session, name)

    def list_topics(self: HasSession) -> list[TopicInfo]:
        """All topics, by name."""
        return [r.info() for r in self.session.store.topics.all()]

    def describe_topic(self: HasSession, name: str) -> TopicDescription:
        """A topic's definition with, per partition, its event count and head position, and every
        configuration key (``.config``; defaults marked in ``.config_entries``).

        Counting reads the statistics of sealed segments (recorded by maintenance) and counts only the
        segments not sealed yet, so it stays flat as the topic grows while maintenance runs.
        """
        return describe_topic(self.session, name)

    def delete_topic(self: HasSession, name: str) -> None:
        """Delete a topic, its events and every group checkpoint on it. Raises :class:`TopicNotFound`."""
        session = self.session
        check_topic(name)
        with denied(f"delete topic {name!r}"):
            gone = session.store.topics.delete(name)
        if not gone:
            raise TopicNotFound(f"topic {name!r} does not exist")
        session.forget_topic(name)

    def retention_status(self: HasSession, topic: str | None = None) -> list[RetentionStatus]:
        """Per topic (or for ``topic`` only): its retention policy, oldest retained event, size on disk,
        segments, and when retention last ran (the ``retention_status`` view). Raises
        :class:`TopicNotFound` for an unknown ``topic``."""
        if topic is not None:
            check_topic(topic)
        out = self.session.store.operations.retention_status(topic)
        if topic is not None and not out:
            raise TopicNotFound(f"topic {topic!r} does not exist")
        return out

    def read_events(self: HasSession, topic: str, partition: int, *, position: int | None = None,
                    at: datetime | None = None, before: int | None = None,
                    limit: int = DEFAULT_BROWSE_LIMIT) -> list[Event]:
        """Up to ``limit`` (default :data:`DEFAULT_BROWSE_LIMIT`, at most 1000) committed events of one
        partition, in read order, from ``position`` (default: the first) or from the first event
        created at or after ``at`` (an aware datetime); or, with ``before`` (a position), the events
        before it, newest first. Without a group: a look at the log (the web console's event browser).
        Raises :class:`TopicNotFound`, :class:`InvalidArgument` naming a bad partition, position, time or
        limit, or more than one of ``position``, ``at`` and ``before``."""
        return read_events(self.session, topic, partition, position=position, at=at, before=before,
                           limit=limit)

    def search_events(self: HasSession, topic: str, partition: int, key: str, *, before: int | None = None,
                      scan: int = DEFAULT_SEARCH_SCAN, limit: int = DEFAULT_BROWSE_LIMIT) -> KeySearch:
        """The events with ``key`` among the last ``scan`` (default :data:`DEFAULT_SEARCH_SCAN`, at most
        1,000,000) committed events of a partition before position ``before`` (default: its end), newest
        first, at most ``limit``. A bounded walk back on the read index that compares each event's key:
        it costs ``scan`` index entries and rows, whatever it finds. :attr:`KeySearch.lowest_position`
        says where to go on: search again with ``before`` set to it to go further back (``None``: it
        reached the partition's first event)."""
        state = _browsed(self.session, topic, partition, limit)
        _position("before", before)
        if isinstance(scan, bool) or not isinstance(scan, int) or not 1 <= scan <= 1_000_000:
            raise InvalidArgument(f"scan must be an integer from 1 to 1000000, not {scan!r}")
        if not isinstance(key, str) or not key:
            raise InvalidArgument(f"key must be a non-empty string, not {key!r}")
        end = (1 << 62) if before is None else before
        rows, lowest, walked = self.session.store.status.browse_key(state.id, partition, key, end, scan,
                                                                   limit)
        found = events_of(state.name, rows)
        if len(found) == limit:  # more may match between the last one found and the end of the walk
            return KeySearch(found, scan, found[-1].position)
        # a walk shorter than scan reached the partition's first event; a full one may have ended on it
        status = self.session.store.status
        if lowest is None or walked < scan or not status.browse_before(state.id, partition, lowest, 1):
            return KeySearch(found, scan, None)
        return KeySearch(found, scan, lowest)
