"""The storage layer: the only part of pgstreams that knows tables, segment names and SQL.

- :mod:`.queries`: named-query files and the one loader (:class:`QuerySet`), shared by the core, the
  Spark data source and applications;
- :mod:`.migrations`: the one migration runner (:class:`MigrationSet`) for every namespace;
- :mod:`.naming`: how a topic is stored (:class:`TopicTables`), a schema's notification channel;
- :mod:`.executor`: the sync :class:`Executor` running named queries on pooled or given connections;
- typed operations mapping rows to models: :class:`TopicStore`, :class:`EventStore`,
  :class:`CheckpointStore`, :class:`GroupStore`, :class:`ClusterStore`, :class:`SinkStore`,
  :class:`ShareStore`, :class:`CdcStore` (change data capture),
  :class:`OperationsStore`, :class:`StatusStore`, :class:`CompactionStore`, gathered by :class:`Store`;
- :mod:`.asyncstore`: the :class:`~.asyncstore.AsyncExecutor` and async operations of :mod:`pgstreams.aio`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from psycopg_pool import ConnectionPool

from ..pooler import DEFAULT_POOLER, Pooler
from .cdc import CdcStore
from .checkpoints import CheckpointStore
from .cluster import ClusterStore, CreatedTopic, ShardLayout
from .compaction import CompactionStore, Rewrite
from .events import EVENT_COLUMNS, EVENT_ID, PARTITION, Cursor, EventRow, EventStore, StoredAt, TopicVersion
from .executor import CORE_QUERIES, Executor, core_query
from .groups import GroupStore, LeaseRow
from .migrations import CORE, Migration, MigrationSet, MigrationStatus
from .naming import TopicTables, notification_channel
from .operations import OperationsStore, RemovedSegment
from .queries import QueryNotFound, QuerySet, render_script
from .shares import ShareSettings, ShareStore
from .sinks import SinkStore
from .status import StatusStore
from .topics import Segments, TopicRecord, TopicStore

if TYPE_CHECKING:
    from ..reconnect import Reconnect

__all__ = [
    "CORE",
    "CORE_QUERIES",
    "EVENT_COLUMNS",
    "EVENT_ID",
    "PARTITION",
    "CdcStore",
    "CheckpointStore",
    "ClusterStore",
    "CompactionStore",
    "CreatedTopic",
    "Cursor",
    "EventRow",
    "EventStore",
    "Executor",
    "GroupStore",
    "LeaseRow",
    "Migration",
    "MigrationSet",
    "MigrationStatus",
    "OperationsStore",
    "QueryNotFound",
    "QuerySet",
    "RemovedSegment",
    "Rewrite",
    "Segments",
    "ShardLayout",
    "ShareSettings",
    "ShareStore",
    "SinkStore",
    "StatusStore",
    "Store",
    "StoredAt",
    "TopicRecord",
    "TopicStore",
    "TopicTables",
    "TopicVersion",
    "core_query",
    "notification_channel",
    "render_script",
]


class Store:
    """Every typed operation on one schema, over one executor (``pool`` may be ``None`` when every call
    passes its connection; ``retry``, ``pooler``: see :class:`Executor`)."""

    def __init__(self, pool: ConnectionPool | None, schema: str, retry: Reconnect | None = None, *,
                 pooler: Pooler = DEFAULT_POOLER) -> None:
        self.executor = Executor(pool, schema, retry, pooler=pooler)
        self.schema = schema
        self.topics = TopicStore(self.executor)
        self.events = EventStore(self.executor)
        self.checkpoints = CheckpointStore(self.executor)
        self.groups = GroupStore(self.executor)
        self.sinks = SinkStore(self.executor)
        self.shares = ShareStore(self.executor)
        self.operations = OperationsStore(self.executor)
        self.status = StatusStore(self.executor)
        self.cluster = ClusterStore(self.executor)
        self.compaction = CompactionStore(self.executor)
        self.cdc = CdcStore(self.executor)

    def __repr__(self) -> str:
        return f"<pgstreams.storage.Store schema={self.schema!r}>"
