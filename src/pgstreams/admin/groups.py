"""Administration of stream groups: their status, and resetting and deleting them (Kafka's
``kafka-consumer-groups --reset-offsets`` / ``--delete``).

Behind :meth:`pgstreams.Client.describe_group`, :meth:`~pgstreams.Client.list_groups`,
:meth:`~pgstreams.Client.reset_group`, :meth:`~pgstreams.Client.delete_group` (the :class:`GroupAdmin`
methods of the client) and the ``pgstreams groups`` commands.
"""

from __future__ import annotations

import logging
from datetime import datetime

from ..consumer import StreamReader
from ..errors import GroupActive, GroupNotFound, InvalidArgument
from ..models import CheckpointReset, GroupInfo, GroupPartitionStatus
from ..names import check_group, check_topic
from ..ports import HasSession, SessionPort
from ..session import denied

log = logging.getLogger("pgstreams.admin")


def _refuse_if_active(session: SessionPort, group: str, topic: str | None, what: str) -> None:
    live = session.store.operations.live_members(group, topic)
    if live:
        raise GroupActive(
            f"cannot {what} group {group!r}: it has {len(live)} live member(s) "
            f"({', '.join(live[:3])}{', ...' if len(live) > 3 else ''}); stop them first"
        )


def reset_group(
    client: HasSession,
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
    """See :meth:`pgstreams.Client.reset_group` (``client``: a client or a session)."""
    session = client.session
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
    reader = StreamReader(session, topic, group, partitions=parts)  # checks the topic and partition
    ops = session.store.operations
    current = ops.checkpoints(group, reader.topic_id)
    if not current:
        raise GroupNotFound(f"group {group!r} has no checkpoints on topic {topic!r}")
    _refuse_if_active(session, group, topic, "reset")
    floors = ops.retained_floors(None, reader.topic_id)
    targets: dict[int, int] = {}
    with session.connection() as conn:
        fences = session.store.events.fences(conn, reader.topic_id, list(reader.partitions))
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
        with session.connection() as conn:
            reader.seek(conn, targets)
        log.info(
            "group %s reset on topic %s: %s",
            group,
            topic,
            ", ".join(f"{r.partition}: {r.previous} -> {r.checkpoint}" for r in out),
        )
    return out


def delete_group(client: HasSession, group: str, topic: str | None = None) -> int:
    """See :meth:`pgstreams.Client.delete_group` (``client``: a client or a session)."""
    session = client.session
    ops = session.store.operations
    check_group(group)
    topic_ids = None
    if topic is not None:
        topic_ids = [session.topic_state(topic, refresh=True).id]  # checks the name
    if topic is None and not ops.group_topics(group):
        raise GroupNotFound(f"group {group!r} has no checkpoints")
    if topic_ids is not None and not ops.checkpoints(group, topic_ids[0]):
        raise GroupNotFound(f"group {group!r} has no checkpoints on topic {topic!r}")
    _refuse_if_active(session, group, topic, "delete")
    return ops.delete_group(group, topic_ids)


class GroupAdmin:
    """The stream-group administration of :class:`pgstreams.Client` (a mixin over its session)."""

    def describe_group(self: HasSession, group: str, topic: str | None = None) -> list[GroupPartitionStatus]:
        """Per topic and partition of ``group``: checkpoint, head and lag (and, for groups run by workers,
        the lease owner, heartbeat and retry state). Raises ``GroupNotFound``."""
        check_group(group)
        if topic is not None:
            check_topic(topic)
        out = self.session.store.groups.status(group, topic)
        if not out:
            raise GroupNotFound(f"group {group!r} has no checkpoints"
                                + (f" on topic {topic!r}" if topic else ""))
        return out

    def list_groups(self: HasSession) -> list[GroupInfo]:
        """Every group with checkpoints, the topics it reads and its total lag."""
        return self.session.store.groups.summaries()

    def reset_group(self: HasSession, group: str, topic: str, *, to_earliest: bool = False,
                    to_latest: bool = False, to_datetime: datetime | None = None, shift_by: int | None = None,
                    to_position: int | None = None, partition: int | None = None, dry_run: bool = False
                    ) -> list[CheckpointReset]:
        """Move the checkpoints of ``group`` on ``topic`` (every partition, or ``partition``), as Kafka's
        ``kafka-consumer-groups --reset-offsets``; exactly one target: ``to_earliest`` (the oldest retained
        event), ``to_latest`` (after every committed event), ``to_datetime`` (the first event at or after
        it; aware), ``shift_by`` (N events forward, or back when negative, within what is retained) or
        ``to_position`` (the next event read is the first at or after it). ``dry_run`` (default false)
        changes nothing. Refused with :class:`GroupActive` while the group has live members on the topic.
        Returns each partition's checkpoint before and after."""
        with denied(f"reset group {group!r} on topic {topic!r}"):
            return reset_group(self.session, group, topic, to_earliest=to_earliest, to_latest=to_latest,
                               to_datetime=to_datetime, shift_by=shift_by, to_position=to_position,
                               partition=partition, dry_run=dry_run)

    def delete_group(self: HasSession, group: str, topic: str | None = None) -> int:
        """Delete ``group``'s checkpoints, leases, losses and (without ``topic``) configuration, on ``topic``
        only if given. Refused with :class:`GroupActive` while it has live members there. Raises
        ``GroupNotFound`` when it has no checkpoints there. Returns the number of checkpoints deleted."""
        with denied(f"delete group {group!r}"):
            return delete_group(self.session, group, topic)
