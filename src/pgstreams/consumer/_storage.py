"""Stream-group reading's use of the storage layer: checkpoints, start cursors, polls of one group and topic.

Rows come back in the shapes the reader consumes; nothing in :mod:`pgstreams.consumer` runs SQL itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any

import psycopg

from ..models import CommitOutcome

if TYPE_CHECKING:
    from ..storage import Store
    from .reader import Cursor, LeaseClaim


class ReaderStorage:
    """The storage operations of one reader (group ``group`` on topic ``topic_id``)."""

    __slots__ = ("_ex", "_group", "_store", "_tid")

    def __init__(self, store: Store, group: str, topic_id: int) -> None:
        self._store = store
        self._ex = store.executor
        self._group = group
        self._tid = topic_id

    def load(self, conn: psycopg.Connection, partitions: list[int]) -> dict[int, Cursor]:
        """The checkpoint of each of these partitions that has one."""
        return self._store.checkpoints.load(conn, self._group, self._tid, partitions)

    def init(self, conn: psycopg.Connection, starts: Mapping[int, Cursor]) -> None:
        """Create the missing checkpoints at ``starts``."""
        self._store.checkpoints.create(conn, self._group, self._tid, starts)

    def fences(self, conn: psycopg.Connection, partitions: list[int]) -> dict[int, int]:
        """The read fence of each partition (read positions below it, in a later statement)."""
        return self._store.events.fences(conn, self._tid, partitions)

    def times(self, conn: psycopg.Connection, fences: Mapping[int, int], dt: datetime) -> dict[int, Cursor]:
        """Per partition, the cursor before its first event below its fence created at or after ``dt``."""
        return self._store.events.time_cursors(conn, self._tid, fences, dt)

    def poll(self, conn: psycopg.Connection, params: dict[str, Any]
             ) -> tuple[list[tuple[Any, ...]], list[tuple[int, ...]], int]:
        """The rows of a poll (fences, then the events below them), the removed segments after the
        cursors and the topic's partition count (see ``EventStore.poll_checked``)."""
        return self._store.events.poll_checked(conn, self._tid, params)

    def record_losses(self, losses: list[tuple[int, int, int]]) -> None:
        """Record ``(partition, segment, events)`` the group lost to retention (once per group)."""
        with self._ex.connection() as conn:
            self._store.operations.record_losses(conn, self._group, self._tid, losses)

    def store(self, conn: psycopg.Connection, targets: Mapping[int, Cursor], expected: Mapping[int, Cursor],
              lease: LeaseClaim | None, durable: bool = True) -> dict[int, CommitOutcome]:
        """Store ``targets`` given ``expected``; what happened per partition (``durable``: see
        :meth:`pgstreams.storage.checkpoints.CheckpointStore.store`)."""
        claim = None if lease is None else (lease.member_id, lease.epochs)
        return self._store.checkpoints.store(conn, self._group, self._tid, targets, expected, claim, durable)

    def seek(self, conn: psycopg.Connection, cursors: Mapping[int, Cursor]) -> None:
        """Set the checkpoints to ``cursors``."""
        self._store.checkpoints.seek(self._group, self._tid, cursors, conn=conn)

    def limit_idle(self, conn: psycopg.Connection, seconds: float) -> None:
        """End the session if the open transaction sits idle longer than ``seconds``."""
        self._store.groups.limit_idle_transaction(conn, seconds)
