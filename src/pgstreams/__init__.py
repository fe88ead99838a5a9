"""pgstreams: Kafka-like durable event streaming on PostgreSQL alone.

Start with :func:`connect`; see the README for a tour.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .client import DEFAULT_RETRY_TIMEOUT, DEFAULT_SEGMENT_SIZE, Client
from .connecting import connect
from .consumer import Consumer, ConsumerTransaction, EventBatch
from .errors import (
    ClientClosed,
    ConfigurationError,
    ConnectionLost,
    DataLoss,
    GroupActive,
    GroupNotFound,
    InvalidArgument,
    InvalidConfig,
    InvalidName,
    KeyRequired,
    LayoutMismatch,
    MessageTooLarge,
    MigrationError,
    PermissionDenied,
    PgStreamsError,
    ShardUnavailable,
    TopicConflict,
    TopicNotFound,
)
from .models import (
    GROUP_STATES,
    PARTITION_STATES,
    CheckpointReset,
    CommitOutcome,
    CompactionStatus,
    ConfigEntry,
    Event,
    GroupInfo,
    GroupLag,
    GroupPartitionStatus,
    KeySearch,
    MaintenanceReport,
    MemberStatus,
    Message,
    PartitionInfo,
    PartitionStats,
    PublishResult,
    ReplayResult,
    RetentionStatus,
    Settlement,
    ShareGroupStatus,
    ShareOutcome,
    StatusSnapshot,
    TopicDescription,
    TopicInfo,
    TopicStatus,
    group_state,
)
from .names import MAX_PARTITIONS, MAX_TOPIC_NAME
from .partitioner import partition_for_key
from .shares import (
    DEFAULT_LOCK_TIMEOUT,
    DEFAULT_MAX_DELIVERIES,
    SHARE_DEFAULTS,
    ShareConsumer,
    ShareOptions,
    ShareTransaction,
)
from .topicconfig import TOPIC_CONFIG_DEFAULTS

if TYPE_CHECKING:
    from .cluster import ClusterClient, ClusterConsumer, ClusterWorker
    from .groups import (
        DEFAULT_HEARTBEAT_INTERVAL,
        DEFAULT_SESSION_TIMEOUT,
        GroupConfig,
        MemberInfo,
        PartitionStatus,
        configure_group,
        get_group_config,
        group_members,
        group_status,
    )
    from .maintenance import DEFAULT_MAINTENANCE_INTERVAL, MaintenanceService
    from .services import ServiceFailed
    from .worker import BatchConfig, EventFailed, RetryPolicy, Worker

# The workers' modules are imported on first use of one of their names (pgstreams.Worker, ...), so that
# plain producers and consumers start without them.
_LAZY = {
    "ServiceFailed": ".services",
    **dict.fromkeys(("ClusterClient", "ClusterConsumer", "ClusterWorker"), ".cluster"),
    "DEFAULT_MAINTENANCE_INTERVAL": ".maintenance",
    "MaintenanceService": ".maintenance",
    **dict.fromkeys(("DEFAULT_HEARTBEAT_INTERVAL", "DEFAULT_SESSION_TIMEOUT", "GroupConfig", "MemberInfo",
                     "PartitionStatus", "configure_group", "get_group_config", "group_members",
                     "group_status"), ".groups"),
    **dict.fromkeys(("BatchConfig", "EventFailed", "RetryPolicy", "Worker"), ".worker"),
}

if not TYPE_CHECKING:  # hidden from type checkers, which see the imports above and nothing else

    def __getattr__(name: str) -> Any:
        """Import the module of a lazily loaded public name (see ``_LAZY``) and return the name."""
        module = _LAZY.get(name)
        if module is None:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        import importlib

        value = getattr(importlib.import_module(module, __name__), name)
        globals()[name] = value
        return value

    def __dir__() -> list[str]:
        """Public and lazily loaded names."""
        return sorted(set(globals()) | set(_LAZY))


__version__ = "0.1.0"

__all__ = [
    "DEFAULT_HEARTBEAT_INTERVAL",
    "DEFAULT_LOCK_TIMEOUT",
    "DEFAULT_MAINTENANCE_INTERVAL",
    "DEFAULT_MAX_DELIVERIES",
    "DEFAULT_RETRY_TIMEOUT",
    "DEFAULT_SEGMENT_SIZE",
    "DEFAULT_SESSION_TIMEOUT",
    "GROUP_STATES",
    "MAX_PARTITIONS",
    "MAX_TOPIC_NAME",
    "PARTITION_STATES",
    "SHARE_DEFAULTS",
    "TOPIC_CONFIG_DEFAULTS",
    "BatchConfig",
    "CheckpointReset",
    "Client",
    "ClientClosed",
    "ClusterClient",
    "ClusterConsumer",
    "ClusterWorker",
    "CommitOutcome",
    "CompactionStatus",
    "ConfigEntry",
    "ConfigurationError",
    "ConnectionLost",
    "Consumer",
    "ConsumerTransaction",
    "DataLoss",
    "Event",
    "EventBatch",
    "EventFailed",
    "GroupActive",
    "GroupConfig",
    "GroupInfo",
    "GroupLag",
    "GroupNotFound",
    "GroupPartitionStatus",
    "InvalidArgument",
    "InvalidConfig",
    "InvalidName",
    "KeyRequired",
    "KeySearch",
    "LayoutMismatch",
    "MaintenanceReport",
    "MaintenanceService",
    "MemberInfo",
    "MemberStatus",
    "Message",
    "MessageTooLarge",
    "MigrationError",
    "PartitionInfo",
    "PartitionStats",
    "PartitionStatus",
    "PermissionDenied",
    "PgStreamsError",
    "PublishResult",
    "ReplayResult",
    "RetentionStatus",
    "RetryPolicy",
    "ServiceFailed",
    "Settlement",
    "ShardUnavailable",
    "ShareConsumer",
    "ShareGroupStatus",
    "ShareOptions",
    "ShareOutcome",
    "ShareTransaction",
    "StatusSnapshot",
    "TopicConflict",
    "TopicDescription",
    "TopicInfo",
    "TopicNotFound",
    "TopicStatus",
    "Worker",
    "__version__",
    "configure_group",
    "connect",
    "get_group_config",
    "group_members",
    "group_state",
    "group_status",
    "partition_for_key",
]
