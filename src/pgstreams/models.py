"""Value types of the public API (frozen dataclasses and enums)."""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from .codec import KIND_BYTES, decode_value
from .opsmodels import CheckpointReset as CheckpointReset
from .opsmodels import CompactionStatus as CompactionStatus
from .opsmodels import MaintenanceReport as MaintenanceReport
from .opsmodels import ReplayResult as ReplayResult
from .opsmodels import RetentionStatus as RetentionStatus
from .opsmodels import TopicStatus as TopicStatus

#: Default number of positions per storage segment of a topic.
DEFAULT_SEGMENT_SIZE = 1_000_000


#: The mark of a value's stored form ``(ENCODED, kind, payload)`` (:mod:`pgstreams.codec`) in the value's slot
#: of an event read from a topic, until the value is read: private, so no value given can look like it.
ENCODED = object()


class _DecodedOnRead:
    """The data descriptor of :attr:`Event.value`: a value given to the constructor is kept as given; the
    stored form of an event read from a topic is decoded the first time the value is read, and kept. A
    poll builds thousands of events that the caller may route, count or commit without reading every
    value: JSON is decoded only for those it reads."""

    __slots__ = ("slot",)

    def __init__(self, slot: Any) -> None:
        self.slot = slot  # the member descriptor of the field's slot

    def __get__(self, obj: object, owner: type | None = None) -> Any:
        if obj is None:
            return self
        value = self.slot.__get__(obj)
        if type(value) is tuple and len(value) == 3 and value[0] is ENCODED:
            value = decode_value(value[1], value[2])
            self.slot.__set__(obj, value)  # a concurrent reader decodes it too: the same value
        return value

    def __set__(self, obj: object, value: Any) -> None:
        self.slot.__set__(obj, value)


class _EmptyOnRead(_DecodedOnRead):
    """The data descriptor of :attr:`Event.headers`: an event read from a topic without headers holds
    ``None`` until its headers are first read, then an empty dict of its own (most have none, unread)."""

    __slots__ = ()

    def __get__(self, obj: object, owner: type | None = None) -> Any:
        if obj is None:
            return self
        headers = self.slot.__get__(obj)
        if headers is None:
            headers = {}
            self.slot.__set__(obj, headers)
        return headers


@dataclass(frozen=True, slots=True, weakref_slot=True)
class Event:
    """An event read from a topic.

    ``value`` has the type it was published with (bytes, str, or the decoded JSON value), decoded the first
    time it is read (a poll's events cost no JSON decoding until their values are used). ``position`` is
    unique within the topic; events of a partition are delivered in position order. ``txid`` is the id of
    the transaction that published the event. ``created_at`` is aware, in UTC. ``delivery_count`` is how
    many times a share group has delivered the event, this delivery included (``0`` for stream groups,
    which have no per-event deliveries). ``shard`` is the place of the shard holding the event in a
    cluster (see :mod:`pgstreams.cluster`; ``0`` on a single server).

    Events are immutable, compare equal field by field, pickle and copy (with their values decoded); they
    have slots, not a ``__dict__``.
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
    delivery_count: int = 0
    shard: int = 0


#: The member descriptors of the slots holding an event's value (decoded or not) and headers (or None).
_VALUE_SLOT: Any = Event.__dict__["value"]
_HEADERS_SLOT: Any = Event.__dict__["headers"]
setattr(Event, "value", _DecodedOnRead(_VALUE_SLOT))  # noqa: B010 - replaces the slot's descriptor
setattr(Event, "headers", _EmptyOnRead(_HEADERS_SLOT))  # noqa: B010 - the same


class _NewEvent(Event):
    """An :class:`Event` being built by :func:`read_event`: the same slots, without the frozen dataclass's
    ``__setattr__`` (which sets each field through ``object.__setattr__``, several times the cost of a plain
    slot store); the instance becomes an ``Event`` once filled."""

    __slots__ = ()
    # both, or the type's attribute stores go through Python (they share one slot of the type)
    __setattr__ = object.__setattr__
    __delattr__ = object.__delattr__
    raw_value = _VALUE_SLOT
    raw_headers = _HEADERS_SLOT


_new = object.__new__


def read_event(topic: str, partition: int, position: int, key: str | None, kind: str, payload: Any,
               headers: Mapping[str, str] | None, event_type: str | None, event_id: str | None,
               correlation_id: str | None, causation_id: str | None, created_at: datetime, txid: int,
               delivery_count: int = 0, shard: int = 0) -> Event:
    """The :class:`Event` of a stored event whose value is ``payload`` of ``kind`` (see
    :mod:`pgstreams.codec`): bytes kept as they are, text and JSON decoded when the value is first read;
    ``headers`` ``None`` for none (an empty dict made when they are first read). Equal to ``Event(...)``
    with the decoded value, at a fraction of its cost: a plain function (calling a class costs more than
    its fifteen stores) filling the slots of a :class:`_NewEvent`."""
    ev: Any = _new(_NewEvent)  # a frozen Event's fields, as mypy sees them: set once here
    ev.topic = topic
    ev.partition = partition
    ev.position = position
    ev.key = key
    ev.raw_value = payload if kind == KIND_BYTES else (ENCODED, kind, payload)
    ev.raw_headers = headers
    ev.event_type = event_type
    ev.event_id = event_id
    ev.correlation_id = correlation_id
    ev.causation_id = causation_id
    ev.created_at = created_at
    ev.txid = txid
    ev.delivery_count = delivery_count
    ev.shard = shard
    ev.__class__ = Event
    return ev


def with_shard(event: Event, shard: int) -> None:
    """Set the ``shard`` of an event just read (by a shard's reader of a cluster; never shared yet)."""
    object.__setattr__(event, "shard", shard)


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
    and this is the first stored copy's location. ``shard``: the place of the shard holding it in a
    cluster (``0`` on a single server)."""

    topic: str
    partition: int
    position: int
    duplicate: bool = False
    shard: int = 0


@dataclass(frozen=True)
class TopicInfo:
    """A topic's definition: name, partition count, creation time (aware, UTC), ``segment_size``
    (positions per storage segment, default :data:`DEFAULT_SEGMENT_SIZE`; the config key
    ``segment.events``) and ``config`` (the configuration keys set on the topic; the others have their
    defaults, see :mod:`pgstreams.topicconfig` and :attr:`TopicDescription.config`)."""

    name: str
    partitions: int
    created_at: datetime
    segment_size: int = DEFAULT_SEGMENT_SIZE
    config: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class PartitionInfo:
    """Per-partition figures of a topic: the number of events stored and the head (the position of the
    last event in read order, ``None`` when empty)."""

    partition: int
    events: int
    head: int | None


@dataclass(frozen=True)
class ConfigEntry:
    """One configuration key of a topic: its ``value`` and whether it is the default (``is_default``)."""

    name: str
    value: int | str | float
    is_default: bool


@dataclass(frozen=True)
class TopicDescription:
    """A topic's definition with per-partition figures (see :meth:`Client.describe_topic`) and every
    configuration key (``config_entries``, defaults marked; :attr:`config` as a plain mapping)."""

    topic: TopicInfo
    partition_info: tuple[PartitionInfo, ...]
    config_entries: tuple[ConfigEntry, ...] = ()
    #: compaction's figures (dirty ratio, last compaction, what it removed); ``None`` when not read
    compaction: CompactionStatus | None = None

    @property
    def config(self) -> dict[str, int | str | float]:
        """Every configuration key's value, defaults included."""
        return {e.name: e.value for e in self.config_entries}

    @property
    def name(self) -> str:
        """The topic name."""
        return self.topic.name

    @property
    def events(self) -> int:
        """Events stored over all partitions."""
        return sum(p.events for p in self.partition_info)


class CommitOutcome(enum.Enum):
    """What storing a checkpoint given the expected previous one did.

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


def to_json(value: Any) -> Any:
    """A JSON-ready copy of a model: a dataclass becomes an object of its fields in their order, a datetime
    ISO 8601 in UTC, an enum its name, a mapping an object, a tuple or list an array; other values stay as
    they are. The one conversion behind every ``as_dict`` and the command line's ``--json``."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_json(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, datetime):
        return value.astimezone(timezone.utc).isoformat()
    if isinstance(value, enum.Enum):
        return value.name
    if isinstance(value, Mapping):
        return {k: to_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_json(v) for v in value]
    return value


@dataclass(frozen=True)
class GroupPartitionStatus:
    """A group's state on one partition of a topic: the one status model, behind
    :meth:`Client.describe_group`, :func:`pgstreams.group_status` and ``pgstreams groups describe``.

    ``checkpoint`` is the last committed position (``None`` before any), ``head`` the position of the
    partition's last event in read order (``None`` when empty), ``lag`` the events after the checkpoint,
    ``updated_at`` when the checkpoint last moved (aware, UTC; also as ``checkpoint_at``).

    For groups run by workers: ``owner`` is the member holding the partition's lease (``None``: unowned)
    and ``pending_owner`` the member waiting for it, ``epoch`` the lease's epoch and ``acquired_at`` when
    it was taken; ``last_heartbeat`` is the owner's; ``stale`` is true when the owner missed its session
    timeout (or is gone) and the lease is about to expire. ``retry_state`` is ``"retrying"`` while the
    owner retries the event at ``retry_position`` (after ``retry_attempts`` failures, the last one
    ``last_error`` at ``error_at``), ``"blocked"`` when its retries are spent and no dead-letter topic
    takes it (the group retries it forever), else ``None``. Every one of these defaults to ``None``
    (``stale`` to false).

    ``lost_events`` (default 0) counts the events of the partition that retention removed before the
    group read them: those its consumers skipped, and those after its checkpoint already removed (the
    events of the segment holding the checkpoint are estimated from positions).
    """

    group: str
    topic: str
    partition: int
    checkpoint: int | None
    head: int | None
    lag: int
    updated_at: datetime
    owner: str | None = None
    pending_owner: str | None = None
    epoch: int | None = None
    acquired_at: datetime | None = None
    last_heartbeat: datetime | None = None
    stale: bool = False
    retry_state: str | None = None
    retry_position: int | None = None
    retry_attempts: int | None = None
    last_error: str | None = None
    error_at: datetime | None = None
    lost_events: int = 0

    @property
    def checkpoint_at(self) -> datetime:
        """When the checkpoint last moved (the same as ``updated_at``)."""
        return self.updated_at

    @property
    def state(self) -> str:
        """The group's state on this partition, one of :data:`PARTITION_STATES`."""
        return partition_state(self.owner, self.stale, self.retry_state, self.pending_owner)

    def as_dict(self) -> dict[str, Any]:
        """A JSON-friendly dict (datetimes as ISO 8601 strings in UTC; see :func:`to_json`)."""
        out: dict[str, Any] = to_json(self)
        return out


#: The status of a group's partition as the membership functions name it: the same model.
PartitionStatus = GroupPartitionStatus

@dataclass(frozen=True)
class KeySearch:
    """What :meth:`pgstreams.Client.search_events` found: the ``events`` with the key (newest first),
    how many events it walked through at most (``scan``), and ``lowest_position``: search again before
    it to go further back (the lowest position walked, or the last event found when ``limit`` cut the
    list); ``None`` when the walk reached the partition's first event."""

    events: list[Event]
    scan: int
    lowest_position: int | None


#: The states of a group on one partition, in the same words in :meth:`GroupPartitionStatus.state`,
#: ``pgstreams groups describe``, the console and the metrics (``pgstreams_group_partition_state``), the
#: first that applies: ``blocked`` (the owner's retries of an event are spent and no dead-letter topic takes
#: it), ``retrying`` (the owner retries an event), ``stale`` (the owner missed its session timeout),
#: ``handing over`` (another member waits for the lease), ``assigned`` (a live member holds the lease),
#: ``unassigned`` (no member: plain consumers, or no worker running).
PARTITION_STATES = ("blocked", "retrying", "stale", "handing over", "assigned", "unassigned")

#: The states of a group on a topic, Kafka's words where they mean the same: ``Empty`` (no live member
#: holds a partition: the group is read by plain consumers, or by nobody), ``Stable`` (live members hold
#: every partition, none is being handed over), ``Rebalancing`` (some partitions are being handed over,
#: have a stale owner or none while others have one: Kafka's PreparingRebalance and CompletingRebalance).
GROUP_STATES = ("Empty", "Stable", "Rebalancing")


def partition_state(owner: str | None, stale: bool, retry_state: str | None = None,
                    pending_owner: str | None = None) -> str:
    """The state of a group on a partition (one of :data:`PARTITION_STATES`)."""
    if retry_state == "blocked":
        return "blocked"
    if retry_state:
        return "retrying"
    if owner is not None and stale:
        return "stale"
    if pending_owner:
        return "handing over"
    return "assigned" if owner is not None else "unassigned"


def group_state(partitions: Iterable[GroupPartitionStatus | GroupLag]) -> str:
    """The state of a group on a topic (one of :data:`GROUP_STATES`) from its partitions' statuses."""
    parts = list(partitions)
    live = [p for p in parts if p.owner is not None and not p.stale]
    if not live:
        return "Empty"
    moving = any(getattr(p, "pending_owner", None) for p in parts)
    if moving or len(live) < len(parts):
        return "Rebalancing"
    return "Stable"


@dataclass(frozen=True)
class MemberInfo:
    """A registered member of a group on a topic, with the partitions it owns. Times are aware, in UTC;
    ``heartbeat_interval`` and ``session_timeout`` are seconds; ``stale`` is true once the member missed
    its session timeout."""

    group: str
    topic: str
    member_id: str
    host: str | None
    pid: int | None
    registered_at: datetime
    last_heartbeat: datetime
    heartbeat_interval: float
    session_timeout: float
    stale: bool
    partitions: tuple[int, ...]

    def as_dict(self) -> dict[str, Any]:
        """A JSON-friendly dict (datetimes as ISO 8601 strings in UTC, partitions as a list; see
        :func:`to_json`)."""
        out: dict[str, Any] = to_json(self)
        return out


@dataclass(frozen=True)
class GroupInfo:
    """A group with the topics it has checkpoints on and its total lag."""

    group: str
    topics: tuple[str, ...]
    lag: int


class ShareOutcome(enum.Enum):
    """What acking, releasing, rejecting or renewing one acquired event of a share group did.

    - ``DONE``: it took effect.
    - ``EXPIRED``: the event's lock had expired: nothing was done, and the event is (or will be)
      delivered again.
    - ``LOST``: another acquisition holds the event now, or it was already acked, rejected or
      dead-lettered: nothing was done.
    - ``DEAD_LETTERED``: (release only) the event had been delivered ``max_deliveries`` times: instead of
      being delivered again it went to the dead-letter topic (dropped without one).
    """

    DONE = "done"
    EXPIRED = "expired"
    LOST = "lost"
    DEAD_LETTERED = "dead_lettered"

    @property
    def ok(self) -> bool:
        """True for ``DONE`` and ``DEAD_LETTERED``: this consumer settled the event."""
        return self in (ShareOutcome.DONE, ShareOutcome.DEAD_LETTERED)


@dataclass(frozen=True)
class Settlement:
    """What :meth:`ShareConsumer.ack` (``release``, ``reject``, ``renew``) did: ``action`` (``"ack"``,
    ``"release"``, ``"reject"``, ``"renew"``) and the :class:`ShareOutcome` per ``(partition, position)``
    of each event given, in the order given."""

    action: str
    outcomes: Mapping[tuple[int, int], ShareOutcome] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """Every event was settled by this call (``DONE`` or ``DEAD_LETTERED``)."""
        return all(o.ok for o in self.outcomes.values())

    def failed(self) -> list[tuple[int, int]]:
        """The ``(partition, position)`` of the events not settled (``EXPIRED`` or ``LOST``)."""
        return [k for k, o in self.outcomes.items() if not o.ok]

    def outcome(self, event: Event) -> ShareOutcome:
        """The outcome of ``event`` (raises ``KeyError`` if it was not part of the call)."""
        return self.outcomes[(event.partition, event.position)]


@dataclass(frozen=True)
class ShareGroupStatus:
    """A share group's state on one partition of a topic (the ``share_group_status`` view; see
    :meth:`Client.describe_share_group` and ``pgstreams groups describe``).

    ``start`` is the position the group started after (``None``: the beginning), ``frontier`` the last
    position taken into its state (every event up to it was acquired at least once or is waiting),
    ``head`` the partition's last position (``None`` when empty). ``acquired``: events locked by a
    consumer now; ``available``: events that can be acquired now (due again, or past the frontier);
    ``waiting``: events released with a delay, published with a delay, or waiting behind an earlier
    event of their key; ``delivered_too_often``: events delivered ``max_deliveries`` times, not locked,
    about to be dead-lettered; ``oldest_lock``: when the oldest lock held now was taken (aware, UTC;
    ``None``: none). Counters since the group was created: ``removed_too_often`` (events removed after
    ``max_deliveries``), ``rejected``, ``dead_lettered`` (copies published to the dead-letter topic).
    ``dead_letter``, ``max_deliveries``, ``lock_timeout`` (seconds) and ``ordering`` are the group's
    settings as its latest consumer set them; ``queue`` is true for queues (:meth:`Client.create_queue`).
    ``lost_events`` (default 0) counts the events retention removed before the group settled them: past
    its frontier when their segment was marked for removal, or released, waiting or with an expired lock
    (an event acquired when its segment goes can still be acked by its consumer).
    """

    group: str
    topic: str
    partition: int
    queue: bool
    start: int | None
    frontier: int
    head: int | None
    acquired: int
    available: int
    waiting: int
    delivered_too_often: int
    oldest_lock: datetime | None
    removed_too_often: int
    rejected: int
    dead_lettered: int
    dead_letter: str | None
    max_deliveries: int
    lock_timeout: float
    ordering: str | None
    lost_events: int = 0

    def as_dict(self) -> dict[str, Any]:
        """A JSON-friendly dict (datetimes as ISO 8601 strings in UTC; see :func:`to_json`)."""
        out: dict[str, Any] = to_json(self)
        return out


@dataclass(frozen=True)
class PartitionStats:
    """A partition in the database-wide status: its ``head`` (newest position in read order, ``None`` when
    empty), the ``events`` stored, and ``published``: the events stored plus those retention removed, a
    count that only grows (its rate is the partition's publish rate)."""

    topic: str
    partition: int
    head: int | None
    events: int
    published: int


@dataclass(frozen=True)
class GroupLag:
    """A group's progress on one partition in the database-wide status: checkpoint (``None`` before
    any), head, ``lag`` (events after the checkpoint), ``lag_seconds`` (age of the first unread event, 0
    when there is none), ``checkpoint_age`` (seconds since the checkpoint last moved), the lease
    ``owner`` (``None``: unowned), whether the owner is ``stale``, and ``retry_state`` (see
    :class:`GroupPartitionStatus`)."""

    group: str
    topic: str
    partition: int
    checkpoint: int | None
    head: int | None
    lag: int
    lag_seconds: float
    checkpoint_age: float
    owner: str | None
    stale: bool
    retry_state: str | None

    @property
    def state(self) -> str:
        """The group's state on this partition, one of :data:`PARTITION_STATES` (``handing over`` is not
        part of the database-wide status)."""
        return partition_state(self.owner, self.stale, self.retry_state)


@dataclass(frozen=True)
class MemberStatus:
    """A registered member in the database-wide status: seconds since its last heartbeat
    (``heartbeat_age``), whether it missed its session timeout (``stale``), and how many partitions it
    owns."""

    group: str
    topic: str
    member_id: str
    host: str | None
    pid: int | None
    heartbeat_age: float
    stale: bool
    partitions: int


@dataclass(frozen=True)
class StatusSnapshot:
    """The database-wide status at ``taken_at`` (the database's clock, aware, UTC), read by
    :meth:`Client.status` in O(topics + partitions + groups + members) work (index probes and segment
    statistics, never a scan of the log): ``topics``, ``partitions``, ``groups`` (one :class:`GroupLag`
    per group, topic and partition), ``members``; ``duration``: seconds the reading took; ``shares``: one
    :class:`ShareGroupStatus` per share group, topic and partition (empty without share groups)."""

    taken_at: datetime
    topics: tuple[TopicStatus, ...]
    partitions: tuple[PartitionStats, ...]
    groups: tuple[GroupLag, ...]
    members: tuple[MemberStatus, ...]
    duration: float
    shares: tuple[ShareGroupStatus, ...] = ()
