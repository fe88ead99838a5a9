"""Typed operations on a shard's record of its cluster (``0015_cluster.sql``): the layout, the topics'
spans and the creation of a cluster's topic with the id the cluster chose."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from .executor import Executor


@dataclass(frozen=True)
class ShardLayout:
    """What one shard records of its cluster: the cluster's id, the shard's place (from 0) and the name
    of every shard in order (``user@host:port/dbname``, never a password)."""

    cluster_id: uuid.UUID
    shard: int
    shards: tuple[str, ...]
    created_at: datetime


@dataclass(frozen=True)
class CreatedTopic:
    """The outcome of creating a cluster's topic on one shard: its id there, its span (``None`` for a topic
    created by a single-server client) and whether this call created it."""

    topic_id: int
    shards: int | None
    created: bool


class ClusterStore:
    """A shard's cluster records, over one executor."""

    def __init__(self, executor: Executor) -> None:
        self.ex = executor

    def layout(self, conn: psycopg.Connection | None = None) -> ShardLayout | None:
        """The layout this shard records, ``None`` when it belongs to no cluster."""
        row = self.ex.one("cluster_layout", conn=conn)
        if row is None:
            return None
        return ShardLayout(uuid.UUID(str(row[0])), int(row[1]), tuple(row[2]), row[3])

    def lock(self, conn: psycopg.Connection) -> None:
        """Serialise layout changes and the cluster's topic administration (``conn`` in a transaction)."""
        self.ex.one("lock_cluster_layout", {"schema": self.ex.schema}, conn=conn)

    def try_lock(self, conn: psycopg.Connection, key: int) -> bool:
        """Take advisory lock ``key`` on ``conn``'s database for the transaction open on ``conn`` (it lasts
        no longer, also behind a transaction pooler); false if another transaction holds it."""
        row = self.ex.one("try_lock_shard", (key,), conn=conn)
        return bool(row and row[0])

    def record(self, conn: psycopg.Connection, cluster_id: uuid.UUID, shard: int, shards: list[str]) -> None:
        """Record that this shard is shard ``shard`` of ``cluster_id`` with ``shards``."""
        self.ex.run("insert_cluster_layout", (cluster_id, shard, shards), conn=conn)

    def set_shards(self, conn: psycopg.Connection, cluster_id: uuid.UUID, shards: list[str]) -> None:
        """Record a longer shard list (a shard was added)."""
        self.ex.run("update_cluster_shards", (shards, cluster_id), conn=conn)

    def next_topic_id(self, conn: psycopg.Connection | None = None) -> int:
        """The smallest topic id this shard never handed out."""
        row = self.ex.one("next_topic_id", {"schema": self.ex.schema}, conn=conn)
        return int(row[0])

    def create_topic(self, topic_id: int, name: str, partitions: int, segment_size: int,
                     config: dict[str, Any], shards: int, conn: psycopg.Connection | None = None
                     ) -> CreatedTopic:
        """Create topic ``name`` with id ``topic_id`` and span ``shards`` unless a topic of that name exists
        (then nothing changes and its id and span are returned)."""
        row = self.ex.one("create_cluster_topic",
                          (topic_id, name, partitions, segment_size, Jsonb(config), shards), conn=conn)
        return CreatedTopic(int(row[0]), None if row[1] is None else int(row[1]), bool(row[2]))

    def holds_topics(self, conn: psycopg.Connection | None = None) -> bool:
        """Whether this shard holds any topic."""
        row = self.ex.one("holds_topics", conn=conn)
        return bool(row and row[0])

    def set_span(self, conn: psycopg.Connection, topic_id: int, shards: int) -> None:
        """Record the span of a topic that has none (created by a single-server client)."""
        self.ex.run("insert_topic_span", (topic_id, shards), conn=conn)

    def spans(self, conn: psycopg.Connection | None = None) -> dict[str, tuple[int, int | None]]:
        """Every topic's id and span (``None`` when created without a cluster), by name."""
        return {str(n): (int(i), None if s is None else int(s))
                for n, i, s in self.ex.all("cluster_topic_spans", conn=conn)}

    def span(self, name: str, conn: psycopg.Connection | None = None) -> tuple[int, int | None] | None:
        """Topic ``name``'s id and span (``None`` when created without a cluster); ``None`` if absent."""
        row = self.ex.one("cluster_topic_span", (name,), conn=conn)
        if row is None:
            return None
        return int(row[0]), None if row[1] is None else int(row[1])
