"""Shards: one logical pgstreams cluster over several PostgreSQL servers (docs/shards.md).

- :mod:`.layout`: the cluster layout every shard records, :func:`init_cluster` (``pgstreams cluster
  init``), the layout check at connect, :func:`split_dsns` (a comma-separated ``PGSTREAMS_DSN``);
- :mod:`.client`: :class:`ClusterClient`, a layer over one :class:`pgstreams.Client` per shard: topics on
  every shard, publishing routed by key (:func:`shard_for_key`);
- :mod:`.consumer`: :class:`ClusterConsumer`, a stream group's reader of every (shard, partition);
- :mod:`.worker`: :class:`ClusterWorker`, one :class:`pgstreams.Worker` per shard.
"""

from __future__ import annotations

from .client import ClusterClient, ClusterTopic, ClusterTopicDescription, shard_for_key
from .consumer import SHARD_RETRY_INTERVAL, ClusterConsumer
from .layout import (
    ClusterDescription,
    ClusterInit,
    ClusterLayout,
    ShardDescription,
    check_layout,
    describe_cluster,
    init_cluster,
    split_dsns,
)
from .worker import ClusterWorker

__all__ = [
    "SHARD_RETRY_INTERVAL",
    "ClusterClient",
    "ClusterConsumer",
    "ClusterDescription",
    "ClusterInit",
    "ClusterLayout",
    "ClusterTopic",
    "ClusterTopicDescription",
    "ClusterWorker",
    "ShardDescription",
    "check_layout",
    "describe_cluster",
    "init_cluster",
    "shard_for_key",
    "split_dsns",
]
