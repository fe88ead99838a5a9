"""The handlers' shared context, and the handshake and metadata APIs (the others: ``reads``).

A handler gets the gateway's :class:`Context` and the decoded request, and returns the response as plain
values for :func:`pgstreams.kafka.codec.build` (the same for every version of its API).
"""

from __future__ import annotations

import asyncio
import contextvars
import uuid
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from ..aio import AsyncClient
from ..errors import InvalidName, TopicNotFound
from ..storage import TopicRecord
from .codec import Request
from .versions import SERVED

if TYPE_CHECKING:
    from .transactions import Transactions

#: The namespace of the topic ids the gateway hands out: a topic's id is derived from its server, schema
#: and name, so that every gateway over the same database gives the same one.
TOPIC_ID_NAMESPACE = uuid.UUID("5d0b3c1e-7f53-4e0c-9a43-6f2c3c1b8a10")


#: Set, for the task serving a connection, once its client closed it (or reading from it failed): a request
#: that waits (a ``JoinGroup`` for its round) stops waiting for a client that is gone.
CLIENT_GONE: contextvars.ContextVar[asyncio.Event | None] = contextvars.ContextVar(
    "pgstreams_kafka_client_gone", default=None)


def client_gone() -> bool:
    """Whether the client of the request being answered closed its connection."""
    gone = CLIENT_GONE.get()
    return gone is not None and gone.is_set()


@dataclass(frozen=True)
class Context:
    """What the handlers of one gateway share: its client, its broker identity, the cluster id, the
    threads that wait for the publishers' notifications (the listener is a thread's) and its transactional
    producers."""

    client: AsyncClient
    node_id: int
    host: str
    port: int
    cluster_id: str
    waits: Executor
    transactions: Transactions
    #: set when the gateway closes: waiting requests answer with what they have
    stopping: asyncio.Event = field(default_factory=asyncio.Event)


Handler = Callable[[Context, Request], Awaitable[dict[str, Any]]]


def topic_id(ctx: Context, name: str) -> uuid.UUID:
    """The Kafka topic id of topic ``name`` (stable across gateways and restarts)."""
    return uuid.uuid5(TOPIC_ID_NAMESPACE, f"{ctx.cluster_id}/{name}")


async def topic_record(ctx: Context, name: str | None) -> TopicRecord | None:
    """Topic ``name``'s row (``None`` for a name that is not a topic's)."""
    if not name:
        return None
    try:
        return (await ctx.client.topic_state(name)).record
    except (TopicNotFound, InvalidName):
        return None


async def api_versions(ctx: Context, req: Request) -> dict[str, Any]:
    """``ApiVersions``: every API served, with its versions (from the one table)."""
    return api_versions_reply(ErrorCode.none)


def api_versions_reply(error: ErrorCode) -> dict[str, Any]:
    """The ``ApiVersions`` response values with ``error``."""
    return {
        "error_code": error,
        "api_keys": [
            {"api_key": api.key, "min_version": api.min_version, "max_version": api.max_version}
            for api in sorted(SERVED.values(), key=lambda a: a.key)
        ],
        "throttle_time": 0,
    }


async def metadata(ctx: Context, req: Request) -> dict[str, Any]:
    """``Metadata``: this gateway as the one broker, leader of every partition; the topics asked for
    (all when the request names none: a null list, or in v0, which cannot send one, an empty list), an
    unknown one with ``UNKNOWN_TOPIC_OR_PARTITION``. Topics are not created on request: create them with
    ``pgstreams topics create`` (or ``CreateTopics``)."""
    known = {t.name: t for t in await ctx.client.list_topics()}
    asked = req.body.topics
    every = asked is None or (req.api_version == 0 and not asked)
    names = sorted(known) if every else [t.name for t in asked if t.name is not None]
    topics: list[dict[str, Any]] = []
    for name in names:
        info = known.get(name)
        if info is None:
            topics.append({"error_code": ErrorCode.unknown_topic_or_partition, "name": name,
                           "topic_id": uuid.UUID(int=0), "partitions": []})
            continue
        topics.append({
            "error_code": ErrorCode.none,
            "name": name,
            "topic_id": topic_id(ctx, name),
            "is_internal": False,
            "partitions": [
                {"error_code": ErrorCode.none, "partition_index": p, "leader_id": ctx.node_id,
                 "leader_epoch": 0, "replica_nodes": [ctx.node_id], "isr_nodes": [ctx.node_id],
                 "offline_replicas": []}
                for p in range(info.partitions)
            ],
        })
    return {
        "throttle_time": 0,
        "brokers": [{"node_id": ctx.node_id, "host": ctx.host, "port": ctx.port, "rack": None}],
        "cluster_id": ctx.cluster_id,
        "controller_id": ctx.node_id,
        "topics": topics,
    }
