"""Options of the ``pgstreams`` Spark data source: parsing and validation (no database access here).

Every error names the option at fault and is raised while Spark analyses the query (``load()``,
``save()``, ``start()``), before any data is read or written.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Union

from ..connecting import resolve_dsns
from ..errors import InvalidArgument, InvalidName
from ..names import check_group, check_schema, check_topic
from ..pooler import DEFAULT_POOLER, Pooler, check_pooler
from ..storage import Cursor

#: Offsets JSON value meaning "before the first event" (as in Kafka's source).
EARLIEST = -2
#: Offsets JSON value meaning "after the last event below the read fence" (as in Kafka's source).
LATEST = -1

#: Default of option ``failOnDataLoss`` (as Spark's Kafka source): a read whose offsets point at events
#: retention removed fails.
FAIL_ON_DATA_LOSS = True

#: Default of option ``maxWaitMs``: how long planning a micro-batch of a stream waits for new events when
#: there are none, woken early by the publishers' notifications (as a Kafka fetch waits up to
#: ``fetch.max.wait.ms``). Without it an idle query with the default trigger asks the database every
#: 10 ms (``spark.sql.streaming.pollingDelay``).
MAX_WAIT_MS = 250

#: The cursor before every event (a cursor, :data:`pgstreams.storage.Cursor`, is the position of the last
#: event read: "after this position").
ORIGIN: Cursor = 0


@dataclass(frozen=True)
class Earliest:
    """Before the first event of the partition."""


@dataclass(frozen=True)
class Latest:
    """After the last event below the partition's read fence (every event committed when it is taken)."""


@dataclass(frozen=True)
class AtPosition:
    """Just before position ``position``: starting there reads the event at ``position`` first, ending
    there reads up to the event before it."""

    position: int


@dataclass(frozen=True)
class AtLegacyCursor:
    """An offset of the former ``{"xid": x, "position": p}`` form (after the event ``(x, p)`` in the former
    read order), resolved against the stored events to a cursor that skips nothing (see
    :func:`pgstreams.spark._db.legacy_cursors`)."""

    xid: int
    position: int


@dataclass(frozen=True)
class AtGroup:
    """Where the pgstreams group of option ``group`` stands (earliest where it has no checkpoint)."""


@dataclass(frozen=True)
class AtTime:
    """Just before the first event created at or after ``at``; the latest if none."""

    at: datetime


Spec = Union[Earliest, Latest, AtPosition, AtLegacyCursor, AtGroup, AtTime]


@dataclass(frozen=True)
class OffsetsOption:
    """A parsed ``startingOffsets`` / ``endingOffsets``: a default and per (topic, partition) specs."""

    default: Spec
    per_partition: Mapping[str, Mapping[int, Spec]] = field(default_factory=dict)

    def spec(self, topic: str, partition: int) -> Spec:
        """The spec of one partition (the default where the JSON does not name it)."""
        return self.per_partition.get(topic, {}).get(partition, self.default)


def _get(options: Mapping[str, str], name: str) -> str | None:
    value = options.get(name) if name in options else None
    if value is None:
        return None
    value = str(value).strip()
    return value or None


def resolve_dsn(options: Mapping[str, str]) -> str:
    """Option ``dsn``, resolved as :func:`pgstreams.connect` resolves its ``dsn`` (see
    :mod:`pgstreams.connecting`): without it ``$PGSTREAMS_DSN``, else libpq's environment, else the
    embedded server (started on demand, on the driver). Several DSNs separated by commas name the shards
    of a cluster. Returned as one text (the shards' DSNs joined by commas), which the executors receive."""
    try:
        dsns = resolve_dsns(_get(options, "dsn"))
    except InvalidArgument as exc:
        raise InvalidArgument(f"option 'dsn': {exc}") from None
    return ",".join(dsns)


def schema_option(options: Mapping[str, str]) -> str:
    """Option ``schema`` (default ``pgstreams``), validated."""
    value = _get(options, "schema") or "pgstreams"
    try:
        return check_schema(value)
    except InvalidName as exc:
        raise InvalidName(f"option 'schema': {exc}") from None


def topics_option(options: Mapping[str, str], *, single: bool = False) -> list[str]:
    """Option ``topic`` or ``topics`` (a comma-separated list; reading only), validated and de-duplicated."""
    one = _get(options, "topic")
    many = _get(options, "topics")
    if one and many:
        raise InvalidArgument("set either option 'topic' or option 'topics', not both")
    if single and many:
        raise InvalidArgument("option 'topics' is for reading; writing takes one 'topic'")
    raw = one if one else many
    if not raw:
        raise InvalidArgument("option 'topic' is required" if single
                              else "option 'topic' (or 'topics', a comma-separated list) is required")
    names: list[str] = []
    for part in ([raw] if one else raw.split(",")):
        name = part.strip()
        try:
            check_topic(name)
        except InvalidName as exc:
            raise InvalidName(f"option '{'topic' if one else 'topics'}': {exc}") from None
        if name not in names:
            names.append(name)
    return names


def group_option(options: Mapping[str, str]) -> str | None:
    """Option ``group`` (a pgstreams group name), validated; ``None`` when not set."""
    value = _get(options, "group")
    if value is None:
        return None
    try:
        return check_group(value)
    except InvalidName as exc:
        raise InvalidName(f"option 'group': {exc}") from None


def _int_option(options: Mapping[str, str], name: str, least: int, what: str) -> int | None:
    """An optional option holding an integer >= ``least`` (``what`` names the rule in the error)."""
    value = _get(options, name)
    if value is None:
        return None
    try:
        number = int(value)
    except ValueError:
        number = least - 1
    if number < least:
        raise InvalidArgument(f"option '{name}' must be {what}, got {value!r}")
    return number


def positive_int_option(options: Mapping[str, str], name: str) -> int | None:
    """An optional option holding a positive integer."""
    return _int_option(options, name, 1, "a positive integer")


def non_negative_int_option(options: Mapping[str, str], name: str, default: int) -> int:
    """An option holding an integer >= 0; ``default`` when not set."""
    number = _int_option(options, name, 0, "an integer >= 0")
    return default if number is None else number


def bool_option(options: Mapping[str, str], name: str, default: bool) -> bool:
    """An option holding ``true`` or ``false`` (any case); ``default`` when not set."""
    value = _get(options, name)
    if value is None:
        return default
    if value.lower() not in ("true", "false"):
        raise InvalidArgument(f"option '{name}' must be 'true' or 'false', got {value!r}")
    return value.lower() == "true"


def timestamp_option(options: Mapping[str, str], name: str) -> datetime | None:
    """An optional time: milliseconds since the Unix epoch (as in Kafka's source) or ISO-8601 with a zone."""
    value = _get(options, name)
    if value is None:
        return None
    if value.lstrip("-").isdigit():
        return datetime.fromtimestamp(int(value) / 1000, tz=timezone.utc)
    try:
        at = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise InvalidArgument(f"option '{name}' must be milliseconds since the epoch or an ISO-8601 time "
                              f"with a zone, got {value!r}") from None
    if at.tzinfo is None or at.utcoffset() is None:
        raise InvalidArgument(f"option '{name}' needs a time zone (e.g. '2024-05-01T12:00:00Z'), "
                              f"got {value!r}")
    return at.astimezone(timezone.utc)


def legacy_cursor(value: object) -> tuple[int, int] | None:
    """``(xid, position)`` of an offset in the former form ``{"xid": x, "position": p}`` (integers >= 0);
    ``None`` for anything else."""
    if not isinstance(value, dict) or set(value) != {"xid", "position"}:
        return None
    x, p = value["xid"], value["position"]
    if any(isinstance(v, bool) or not isinstance(v, int) or v < 0 for v in (x, p)):
        return None
    return int(x), int(p)


def _spec_from_json(name: str, topic: str, partition: int, value: object, *, ending: bool) -> Spec:
    where = f"option '{name}': topic {topic!r} partition {partition}"
    if isinstance(value, bool):
        raise InvalidArgument(f"{where}: expected a position (>= 0), -2 or -1, got {value!r}")
    if isinstance(value, int):
        if value == EARLIEST:
            if ending:
                raise InvalidArgument(f"{where}: -2 (earliest) is not allowed in endingOffsets")
            return Earliest()
        if value == LATEST:
            return Latest()
        if value < 0:
            raise InvalidArgument(f"{where}: a position must be >= 0 (or -2 earliest, -1 latest), "
                                  f"got {value}")
        return AtPosition(value)
    legacy = legacy_cursor(value)
    if legacy is not None:
        return AtLegacyCursor(*legacy)
    if isinstance(value, dict):
        raise InvalidArgument(f"{where}: the only object accepted is the former offset form "
                              f"{{\"xid\": <int >= 0>, \"position\": <int >= 0>}}, got {value!r}")
    raise InvalidArgument(f"{where}: expected a position (>= 0), -2 or -1, got {value!r}")


def offsets_option(options: Mapping[str, str], name: str, topics: list[str], *, ending: bool,
                   group: str | None = None) -> OffsetsOption:
    """Parse ``startingOffsets`` (``ending=False``; default ``earliest``) or ``endingOffsets``
    (``ending=True``; default ``latest``).

    Accepted: ``earliest`` (starting only), ``latest``, ``group`` (starting only, needs option ``group``),
    or JSON ``{"topic": {"partition": spec}}`` where spec is a position (>= 0), ``-2`` (earliest) or ``-1``
    (latest); the former offset form ``{"xid": x, "position": p}`` is still accepted (see
    :class:`AtLegacyCursor`). Partitions not named take the default.
    """
    value = _get(options, name)
    default: Spec = Latest() if ending else Earliest()
    if value is None:
        return OffsetsOption(default)
    word = value.lower()
    if word == "latest":
        return OffsetsOption(Latest())
    if word == "earliest" and not ending:
        return OffsetsOption(Earliest())
    if word == "group" and not ending:
        if group is None:
            raise InvalidArgument(f"option '{name}' = 'group' needs option 'group'")
        return OffsetsOption(AtGroup())
    if not value.startswith("{"):
        allowed = "'latest' or JSON" if ending else "'earliest', 'latest', 'group' or JSON"
        raise InvalidArgument(f"option '{name}' must be {allowed}, got {value!r}")
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError as exc:
        raise InvalidArgument(f"option '{name}' is not valid JSON: {exc}") from None
    if not isinstance(parsed, dict):
        raise InvalidArgument(f"option '{name}' must be a JSON object of topics, got {value!r}")
    per: dict[str, dict[int, Spec]] = {}
    for topic, parts in parsed.items():
        if topic not in topics:
            raise InvalidArgument(f"option '{name}' names topic {topic!r}, which the query does not read "
                                  f"(topics: {', '.join(topics)})")
        if not isinstance(parts, dict):
            raise InvalidArgument(f"option '{name}': topic {topic!r} must map partition numbers to offsets")
        per[topic] = {}
        for key, spec in parts.items():
            try:
                partition = int(key)
            except ValueError:
                raise InvalidArgument(f"option '{name}': topic {topic!r} has a partition key {key!r} "
                                      "that is not an integer") from None
            if partition < 0:
                raise InvalidArgument(f"option '{name}': topic {topic!r} partition {partition} is negative")
            per[topic][partition] = _spec_from_json(name, topic, partition, spec, ending=ending)
    return OffsetsOption(default, per)


@dataclass(frozen=True)
class ReadOptions:
    """Validated reading options (see ``docs/spark.md`` for each)."""

    dsn: str
    schema: str
    topics: tuple[str, ...]
    starting: OffsetsOption
    ending: OffsetsOption
    starting_time: datetime | None
    ending_time: datetime | None
    max_events_per_trigger: int | None
    min_partitions: int | None
    max_records_per_partition: int | None
    group: str | None
    batch_size: int
    fail_on_data_loss: bool = FAIL_ON_DATA_LOSS
    max_wait_ms: int = MAX_WAIT_MS
    pooler: Pooler = DEFAULT_POOLER


def pooler_option(options: Mapping[str, str]) -> Pooler:
    """Option ``pooler``: the mode of a connection pooler in front of PostgreSQL (``session``, the default,
    or ``transaction``; see :mod:`pgstreams.pooler`)."""
    return check_pooler(_get(options, "pooler"), "option 'pooler'")


def read_options(options: Mapping[str, str]) -> ReadOptions:
    """Parse and validate every reading option."""
    dsn = resolve_dsn(options)
    schema = schema_option(options)
    topics = topics_option(options)
    group = group_option(options)
    return ReadOptions(
        dsn=dsn,
        schema=schema,
        topics=tuple(topics),
        starting=offsets_option(options, "startingOffsets", topics, ending=False, group=group),
        ending=offsets_option(options, "endingOffsets", topics, ending=True),
        starting_time=timestamp_option(options, "startingTimestamp"),
        ending_time=timestamp_option(options, "endingTimestamp"),
        max_events_per_trigger=positive_int_option(options, "maxEventsPerTrigger"),
        min_partitions=positive_int_option(options, "minPartitions"),
        max_records_per_partition=positive_int_option(options, "maxRecordsPerPartition"),
        group=group,
        batch_size=positive_int_option(options, "arrowBatchSize") or 32768,
        fail_on_data_loss=bool_option(options, "failOnDataLoss", FAIL_ON_DATA_LOSS),
        max_wait_ms=non_negative_int_option(options, "maxWaitMs", MAX_WAIT_MS),
        pooler=pooler_option(options),
    )


@dataclass(frozen=True)
class WriteOptions:
    """Validated writing options."""

    dsn: str
    schema: str
    topic: str
    pooler: Pooler = DEFAULT_POOLER


def write_options(options: Mapping[str, str]) -> WriteOptions:
    """Parse and validate every writing option."""
    dsn = resolve_dsn(options)
    schema = schema_option(options)
    topic = topics_option(options, single=True)[0]
    return WriteOptions(dsn, schema, topic, pooler_option(options))
