"""Stream groups run by members: configuration, membership (members, leases, heartbeats, balancing) and
status.

- :mod:`.config`: :class:`GroupConfig`, :func:`get_group_config`, :func:`configure_group`;
- :mod:`.members`: :class:`GroupMember` and its :class:`Leases`;
- :mod:`.services`: :class:`HeartbeatService` and :class:`BalancerService`;
- :mod:`.status`: :func:`group_status` and :func:`group_members`.
"""

from __future__ import annotations

from ..models import MemberInfo, PartitionStatus
from .config import (
    DEAD_LETTER_SUFFIX,
    DEFAULT_HEARTBEAT_INTERVAL,
    DEFAULT_SESSION_TIMEOUT,
    GroupConfig,
    check_timing,
    configure_group,
    default_dead_letter_topic,
    get_group_config,
)
from .members import ConnectionRole, GroupMember, Leases, new_member_id
from .services import BalancerService, HeartbeatService
from .status import group_members, group_status

__all__ = [
    "DEAD_LETTER_SUFFIX",
    "DEFAULT_HEARTBEAT_INTERVAL",
    "DEFAULT_SESSION_TIMEOUT",
    "BalancerService",
    "ConnectionRole",
    "GroupConfig",
    "GroupMember",
    "HeartbeatService",
    "Leases",
    "MemberInfo",
    "PartitionStatus",
    "check_timing",
    "configure_group",
    "default_dead_letter_topic",
    "get_group_config",
    "group_members",
    "group_status",
    "new_member_id",
]
