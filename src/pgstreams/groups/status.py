"""Group status: per partition checkpoint, head, lag, lease owner and retry state; registered members."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..models import GroupPartitionStatus, MemberInfo
from ..names import check_group, check_topic

if TYPE_CHECKING:
    from ..ports import HasSession


def group_status(client: HasSession, group: str, topic: str | None = None) -> list[GroupPartitionStatus]:
    """The status of ``group`` per topic and partition (of one ``topic`` if given), by topic and
    partition (the ``consumer_group_status`` view). Empty when the group has no checkpoints. Counting the
    lag is proportional to it. ``client``: a :class:`pgstreams.Client` or a session."""
    check_group(group)
    if topic is not None:
        check_topic(topic)
    return client.session.store.groups.status(group, topic)


def group_members(client: HasSession, group: str, topic: str | None = None) -> list[MemberInfo]:
    """The registered members of ``group`` (on one ``topic`` if given), stale ones included."""
    check_group(group)
    if topic is not None:
        check_topic(topic)
    return client.session.store.groups.members(group, topic)
