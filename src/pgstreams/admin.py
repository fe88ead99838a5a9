"""Administration of groups and dead letters: resetting and deleting groups (Kafka's
``kafka-consumer-groups --reset-offsets`` / ``--delete``) and replaying dead letters.

Behind :meth:`pgstreams.Client.reset_group`, :meth:`~pgstreams.Client.delete_group`,
:meth:`~pgstreams.Client.replay_dead_letters` and the ``pgstreams groups reset|delete`` and
``pgstreams dlt replay`` commands.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import TYPE_CHECKING

from .errors import GroupActive, GroupNotFound, InvalidArgument
from .models import CheckpointReset, Event, PublishResult, ReplayResult
from .names import check_group, check_topic

if TYPE_CHECKING:
    from .client import Client

log = logging.getLogger("pgstreams.admin")

#: The header a replayed dead letter carries: ``<dead-letter topic>/<partition>/<position>`` it came from.
REPLAYED_FROM = "dlt.replayed_from"
#: The group that records a replay's progress on a dead-letter topic unless ``group`` is given.
DEFAULT_REPLAY_GROUP = "pgstreams-dlt-replay"
#: Dead letters read per transaction of a replay.
REPLAY_BATCH = 500
_DLT_PREFIX = "dlt."


def _refuse_if_active(client: Client, group: str, topic: str | None, what: str) -> None:
    live = client.store.operations.live_members(group, topic)
    if live:
        raise GroupActive(
            f"cannot {what} group {group!r}: it has {len(live)} live member(s) "
            f"({', '.join(live[:3])}{', ...' if len(live) > 3 else ''}); stop them first"
        )


def reset_group(
    client: Client,
    group: str,
    topic: str,
    *,
    to_earliest: bool = False,
    to_latest: bool = False,
    to_datetime: datetime | None = None,
    shift_by: int | None = None,
    to_position: int | None = None,
    partition: int | None = None,
    dry_run: bool = False,
) -> list[CheckpointReset]:
    """See :meth:`pgstreams.Client.reset_group`."""
    from .consumer import StreamReader

    check_group(group)
    check_topic(topic)
    chosen = [
        name
        for name, on in (
            ("to_earliest", to_earliest),
            ("to_latest", to_latest),
            ("to_datetime", to_datetime is not None),
            ("shift_by", shift_by is not None),
            ("to_position", to_position is not None),
        )
        if on
    ]
    if len(chosen) != 1:
        raise InvalidArgument(
            "give exactly one of to_earliest, to_latest, to_datetime, shift_by, to_position"
            + (f" (got {', '.join(chosen)})" if chosen else "")
        )
    if to_datetime is not None and (not isinstance(to_datetime, datetime) or to_datetime.tzinfo is None):
        raise InvalidArgument("to_datetime must be a timezone-aware datetime")
    for name, value in (("shift_by", shift_by), ("to_position", to_position)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise InvalidArgument(f"{name} must be an integer, got {value!r}")
    if to_position is not None and to_position < 0:
        raise InvalidArgument(f"to_position must be >= 0, got {to_position}")
    parts = None if partition is None else [partition]
    reader = StreamReader(client, topic, group, partitions=parts)  # checks the topic and partition
    ops = client.store.operations
    current = ops.checkpoints(group, reader.topic_id)
    if not current:
        raise GroupNotFound(f"group {group!r} has no checkpoints on topic {topic!r}")
    _refuse_if_active(client, group, topic, "reset")
    floors = ops.retained_floors(None, reader.topic_id)
    targets: dict[int, int] = {}
    with client.connection() as conn:
        fences = client.store.events.fences(conn, reader.topic_id, list(reader.partitions))
        if to_datetime is not None:
            times = reader.time_cursors(conn, to_datetime)
        for p in reader.partitions:
            floor = floors.get(p, 0)
            head = fences[p] - 1
            before = current.get(p, 0)
            if to_earliest:
                target = floor
            elif to_latest:
                target = head
            elif to_datetime is not None:
                target = times[p]
            elif to_position is not None:
                target = to_position - 1
            else:
                assert shift_by is not None
                if shift_by == 0:
                    target = before
                else:
                    got = ops.shift(conn, reader.topic_id, p, max(before, floor), shift_by, fences[p])
                    target = got if got is not None else (head if shift_by > 0 else floor)
            targets[p] = max(floor, min(max(target, 0), head))
    out = [CheckpointReset(group, reader.topic, p, current.get(p), targets[p]) for p in sorted(targets)]
    if not dry_run:
        with client.connection() as conn:
            reader.seek(conn, targets)
        log.info(
            "group %s reset on topic %s: %s",
            group,
            topic,
            ", ".join(f"{r.partition}: {r.previous} -> {r.checkpoint}" for r in out),
        )
    return out


def delete_group(client: Client, group: str, topic: str | None = None) -> int:
    """See :meth:`pgstreams.Client.delete_group`."""
    check_group(group)
    topic_ids = None
    if topic is not None:
        check_topic(topic)
        topic_ids = [client.topic_state(topic, refresh=True).id]
    if topic is None and not client.store.operations.group_topics(group):
        raise GroupNotFound(f"group {group!r} has no checkpoints")
    if topic_ids is not None and not client.store.operations.checkpoints(group, topic_ids[0]):
        raise GroupNotFound(f"group {group!r} has no checkpoints on topic {topic!r}")
    _refuse_if_active(client, group, topic, "delete")
    return client.store.operations.delete_group(group, topic_ids)


def original_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """A dead letter's headers without those dead-lettering added (``dlt.*``)."""
    return {k: v for k, v in headers.items() if not k.startswith(_DLT_PREFIX)}


def replay_dead_letters(
    client: Client,
    dlt_topic: str,
    *,
    to: str | None = None,
    group: str | None = None,
    where_error_type: str | None = None,
    dry_run: bool = False,
    max_events: int | None = None,
) -> ReplayResult:
    """Publish the dead letters of ``dlt_topic`` back to the topic each came from (its ``dlt.topic``
    header), or to ``to``, with the original key, value, headers (without the ``dlt.*`` ones), event type
    and correlation and causation ids, adding the header :data:`REPLAYED_FROM`.

    Progress is the checkpoint of stream group ``group`` (default :data:`DEFAULT_REPLAY_GROUP`) on the
    dead-letter topic, stored in the same transaction as the events it replayed, and each copy has the
    event id ``replay:<dlt topic>/<partition>/<position>``: each dead letter is replayed once, even if a
    replay is interrupted and run again. Dead letters whose ``dlt.error_type`` is not ``where_error_type``
    (default: no filter) are passed over (the group moves past them: use another group to replay them
    later). ``dry_run`` (default false) publishes nothing and moves nothing, and returns the events that
    would be replayed. ``max_events`` (default: all) bounds the number read. Stops once it has read up to
    the end of the dead-letter topic as it stood when the replay started.
    """
    from .consumer import Consumer, StreamReader

    check_topic(dlt_topic)
    if to is not None:
        check_topic(to)
        client.topic_state(to, refresh=True)
    group = check_group(group if group is not None else DEFAULT_REPLAY_GROUP)
    if where_error_type is not None and not isinstance(where_error_type, str):
        raise InvalidArgument(f"where_error_type must be a string, got {where_error_type!r}")
    if max_events is not None and (
        isinstance(max_events, bool) or not isinstance(max_events, int) or max_events < 1
    ):
        raise InvalidArgument(f"max_events must be a positive integer, got {max_events!r}")
    read = replayed = skipped = 0
    would: list[Event] = []
    now = datetime.now(timezone.utc).isoformat()

    def wanted(ev: Event) -> str | None:
        """The topic to replay ``ev`` to, ``None`` when it is passed over."""
        if where_error_type is not None and ev.headers.get("dlt.error_type") != where_error_type:
            return None
        target = to or ev.headers.get("dlt.topic")
        if not target:
            log.warning(
                "dead letter %s/%s/%s has no dlt.topic header and no target: passed over",
                dlt_topic,
                ev.partition,
                ev.position,
            )
        return target

    def room() -> int:
        return REPLAY_BATCH if max_events is None else min(REPLAY_BATCH, max_events - read)

    if dry_run:  # read from the group's checkpoints (earliest where it has none) and store nothing
        reader = StreamReader(client, dlt_topic, group)
        reader.record_losses = False
        with client.connection() as conn:
            reader.load(conn)
            reader.restore({p: reader.positions().get(p, 0) for p in reader.partitions})
            while room() > 0:
                events = reader.fetch(conn, room())
                if not events:
                    break
                for ev in events:
                    read += 1
                    if wanted(ev) is None:
                        skipped += 1
                    else:
                        replayed += 1
                        would.append(ev)
        return ReplayResult(read, replayed, skipped, True, tuple(would))

    consumer = Consumer(client, dlt_topic, group)
    while room() > 0:
        with consumer.transaction() as tx:
            events = tx.poll(room(), timeout=0)
            for ev in events:
                read += 1
                target = wanted(ev)
                if target is None:
                    skipped += 1
                    continue
                replayed += 1
                headers = original_headers(ev.headers)
                headers[REPLAYED_FROM] = f"{dlt_topic}/{ev.partition}/{ev.position}"
                headers["dlt.replayed_at"] = now
                client.publish(
                    target,
                    ev.value,
                    key=ev.key,
                    headers=headers,
                    event_type=ev.event_type,
                    event_id=f"replay:{dlt_topic}/{ev.partition}/{ev.position}",
                    correlation_id=ev.correlation_id,
                    causation_id=ev.causation_id,
                    conn=tx.connection,
                )
        if not events:
            break
        if tx.outcome is not None and not tx.outcome.ok:
            raise GroupActive(
                f"group {group!r} on {dlt_topic!r} was moved by another process during the "
                f"replay ({tx.outcome.name}): nothing of this batch was kept"
            )
    return ReplayResult(read, replayed, skipped, False, ())


def replay_dead_letter(client: Client, dlt_topic: str, partition: int, position: int, *,
                       to: str | None = None) -> PublishResult:
    """Replay the dead letter at ``partition`` / ``position`` of ``dlt_topic`` (see
    :meth:`pgstreams.Client.replay_dead_letter`)."""
    check_topic(dlt_topic)
    if to is not None:
        check_topic(to)
    if isinstance(position, bool) or not isinstance(position, int) or position < 1:
        raise InvalidArgument(f"position must be a positive integer, not {position!r}")
    found = client.read_events(dlt_topic, partition, position=position, limit=1)
    if not found or found[0].position != position:
        raise InvalidArgument(f"{dlt_topic!r} holds no event at partition {partition}, position {position}")
    ev = found[0]
    target = to or ev.headers.get("dlt.topic")
    if not target:
        raise InvalidArgument(f"dead letter {dlt_topic}/{partition}/{position} has no dlt.topic header: "
                              "say where to replay it")
    headers = original_headers(ev.headers)
    headers[REPLAYED_FROM] = f"{dlt_topic}/{partition}/{position}"
    headers["dlt.replayed_at"] = datetime.now(timezone.utc).isoformat()
    return client.publish(target, ev.value, key=ev.key, headers=headers, event_type=ev.event_type,
                          event_id=f"replay:{dlt_topic}/{partition}/{position}",
                          correlation_id=ev.correlation_id, causation_id=ev.causation_id)
