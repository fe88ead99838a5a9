"""Kafka's administration APIs over pgstreams topics and groups: ``CreateTopics``, ``DeleteTopics``,
``CreatePartitions``, ``DescribeConfigs``, ``IncrementalAlterConfigs``, ``AlterConfigs``, ``ListGroups`` and
``DescribeGroups``. Topic configuration keys are pgstreams' own, which use Kafka's names
(:mod:`pgstreams.topicconfig`); a key pgstreams does not have is refused with ``INVALID_CONFIG``."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from kio.schema.errors import ErrorCode

from ..errors import (
    InvalidArgument,
    InvalidConfig,
    InvalidName,
    PermissionDenied,
    PgStreamsError,
    TopicConflict,
    TopicNotFound,
)
from ..topicconfig import CREATE_ONLY, check_config
from .codec import Request
from .handlers import Context, topic_id

#: DescribeConfigs' and IncrementalAlterConfigs' resource types.
TOPIC_RESOURCE, BROKER_RESOURCE = 2, 4

#: IncrementalAlterConfigs' operations.
SET, DELETE = 0, 1

#: DescribeConfigs' config sources: set on the topic, or the default.
TOPIC_CONFIG_SOURCE, DEFAULT_CONFIG_SOURCE = 1, 5


#: The Kafka error code of each pgstreams error, the first whose class matches (subclasses first).
_ERRORS: tuple[tuple[type[BaseException], ErrorCode], ...] = (
    (TopicConflict, ErrorCode.topic_already_exists),
    (TopicNotFound, ErrorCode.unknown_topic_or_partition),
    (InvalidName, ErrorCode.invalid_topic_exception),
    (InvalidConfig, ErrorCode.invalid_config),
    (PermissionDenied, ErrorCode.topic_authorization_failed),
    (InvalidArgument, ErrorCode.invalid_request),
)


def _error_of(exc: BaseException) -> ErrorCode:
    """The Kafka error code of a pgstreams error."""
    return next((code for kind, code in _ERRORS if isinstance(exc, kind)), ErrorCode.unknown_server_error)


async def create_topics(ctx: Context, req: Request) -> dict[str, Any]:
    """``CreateTopics``: each topic with its partition count (-1: 1) and configuration; the replication
    factor must be -1 or 1 (PostgreSQL keeps the copies) and replica assignments are refused."""
    body = req.body
    topics = []
    for t in body.topics:
        partitions = 1 if int(t.num_partitions) < 0 else int(t.num_partitions)
        config = {c.name: c.value for c in t.configs if c.value is not None}
        error, message = ErrorCode.none, None
        if int(t.replication_factor) not in (-1, 1) or t.assignments:
            error, message = ErrorCode.invalid_replication_factor, \
                "replicas are PostgreSQL's: the replication factor is -1 or 1, with no assignments"
        elif await _exists(ctx, t.name):
            error, message = ErrorCode.topic_already_exists, f"topic {t.name!r} already exists"
        elif not body.validate_only:
            try:
                await ctx.client.create_topic(t.name, partitions, config=config or None)
            except PgStreamsError as exc:
                error, message = _error_of(exc), str(exc)
        topics.append({"name": t.name, "topic_id": topic_id(ctx, t.name), "error_code": error,
                       "error_message": message, "num_partitions": partitions if error == 0 else -1,
                       "replication_factor": 1 if error == 0 else -1, "configs": []})
    return {"throttle_time": 0, "topics": topics}


async def _exists(ctx: Context, name: str) -> bool:
    return any(t.name == name for t in await ctx.client.list_topics())


async def delete_topics(ctx: Context, req: Request) -> dict[str, Any]:
    """``DeleteTopics``: each topic named, with its events."""
    body = req.body
    names = list(getattr(body, "topic_names", ()) or ()) or [t.name for t in getattr(body, "topics", ())]
    responses = []
    for name in names:
        error, message = ErrorCode.none, None
        try:
            await ctx.client.delete_topic(name)
        except PgStreamsError as exc:
            error, message = _error_of(exc), str(exc)
        responses.append({"name": name, "topic_id": topic_id(ctx, name), "error_code": error,
                          "error_message": message})
    return {"throttle_time": 0, "responses": responses}


async def create_partitions(ctx: Context, req: Request) -> dict[str, Any]:
    """``CreatePartitions``: raise a topic's partition count (never lower it, as in Kafka)."""
    body = req.body
    results = []
    for t in body.topics:
        error, message = ErrorCode.none, None
        try:
            current = (await ctx.client.describe_topic(t.name)).topic.partitions
            if int(t.count) <= current:
                error = ErrorCode.invalid_partitions
                message = f"topic {t.name!r} has {current} partitions: the count can only grow"
            elif t.assignments:
                error, message = ErrorCode.invalid_replica_assignment, "replica assignments are not served"
            elif not body.validate_only:
                await ctx.client.alter_topic(t.name, partitions=int(t.count))
        except PgStreamsError as exc:
            error, message = _error_of(exc), str(exc)
        results.append({"name": t.name, "error_code": error, "error_message": message})
    return {"throttle_time": 0, "results": results}


async def describe_configs(ctx: Context, req: Request) -> dict[str, Any]:
    """``DescribeConfigs``: a topic's every configuration key (those set on it, and the defaults); a broker
    has none."""
    results = []
    for r in req.body.resources:
        base: dict[str, Any] = {"resource_type": r.resource_type, "resource_name": r.resource_name,
                                "configs": []}
        if int(r.resource_type) == BROKER_RESOURCE:
            results.append({**base, "error_code": ErrorCode.none, "error_message": None})
            continue
        if int(r.resource_type) != TOPIC_RESOURCE:
            results.append({**base, "error_code": ErrorCode.invalid_request,
                            "error_message": f"resource type {r.resource_type} is not served"})
            continue
        try:
            described = await ctx.client.describe_topic(r.resource_name)
        except PgStreamsError as exc:
            results.append({**base, "error_code": _error_of(exc), "error_message": str(exc)})
            continue
        wanted = None if r.configuration_keys is None else set(r.configuration_keys)
        configs: list[dict[str, Any]] = [
            {"name": e.name, "value": str(e.value), "read_only": e.name == "segment.events",
             "is_default": e.is_default,
             "config_source": DEFAULT_CONFIG_SOURCE if e.is_default else TOPIC_CONFIG_SOURCE,
             "is_sensitive": False, "synonyms": [], "config_type": 0, "documentation": None}
            for e in described.config_entries if wanted is None or e.name in wanted]
        results.append({**base, "error_code": ErrorCode.none, "error_message": None, "configs": configs})
    return {"throttle_time": 0, "results": results}


async def incremental_alter_configs(ctx: Context, req: Request) -> dict[str, Any]:
    """``IncrementalAlterConfigs``: set (0) or delete (1, back to the default) a topic's keys, all or
    none; appending and subtracting (list values) are refused."""

    async def alter(r: Any) -> None:
        other = [c.name for c in r.configs if int(c.config_operation) not in (SET, DELETE)]
        if other:
            raise InvalidConfig(f"append and subtract are not served ({other})")
        if not req.body.validate_only:
            sets = {c.name: c.value for c in r.configs if int(c.config_operation) == SET}
            deletes = [c.name for c in r.configs if int(c.config_operation) == DELETE]
            await ctx.client.alter_topic(r.resource_name, sets or None, delete_config=deletes)

    return await _alter_topics(req, alter)


async def alter_configs(ctx: Context, req: Request) -> dict[str, Any]:
    """``AlterConfigs`` (the older, whole-configuration form): a topic's configuration becomes the keys
    given, every other key set on it goes back to its default (``segment.events``, fixed at creation,
    stays). As in Kafka, reading the keys set and replacing them are two steps: a concurrent change of the
    same topic may be lost; ``IncrementalAlterConfigs`` has no such race."""

    async def alter(r: Any) -> None:
        sets = {c.name: c.value for c in r.configs if c.value is not None}
        described = await ctx.client.describe_topic(r.resource_name)  # also: the topic exists
        if req.body.validate_only:
            check_config(sets)
            return
        deletes = [e.name for e in described.config_entries
                   if not e.is_default and e.name not in sets and e.name not in CREATE_ONLY]
        await ctx.client.alter_topic(r.resource_name, sets or None, delete_config=deletes)

    return await _alter_topics(req, alter)


async def _alter_topics(req: Request, alter: Callable[[Any], Awaitable[None]]) -> dict[str, Any]:
    """The response of ``IncrementalAlterConfigs`` or ``AlterConfigs``: ``alter`` run on each resource
    that is a topic, a pgstreams error it raises answered as Kafka's; other resource types refused."""
    responses = []
    for r in req.body.resources:
        base = {"resource_type": r.resource_type, "resource_name": r.resource_name}
        if int(r.resource_type) != TOPIC_RESOURCE:
            responses.append({**base, "error_code": ErrorCode.invalid_request,
                              "error_message": "only topics have configuration keys"})
            continue
        error, message = ErrorCode.none, None
        try:
            await alter(r)
        except PgStreamsError as exc:
            error, message = _error_of(exc), str(exc)
        responses.append({**base, "error_code": error, "error_message": message})
    return {"throttle_time": 0, "responses": responses}

async def list_groups(ctx: Context, req: Request) -> dict[str, Any]:
    """``ListGroups``: the groups with members or committed offsets (pgstreams stream groups included),
    with their state."""
    states = {r[0]: (r[1], r[2]) for r in await ctx.client.store.ex.all("kafka_groups_list", ())}
    names = {g.group for g in await ctx.client.list_groups()} | set(states)
    wanted = {s.lower() for s in (getattr(req.body, "states_filter", ()) or ())}
    groups = []
    for name in sorted(names):
        state, protocol_type = states.get(name, ("empty", "consumer"))
        kafka_state = _KAFKA_STATES[state]
        if wanted and kafka_state.lower() not in wanted:
            continue
        groups.append({"group_id": name, "protocol_type": protocol_type or "consumer",
                       "group_state": kafka_state})
    return {"throttle_time": 0, "error_code": ErrorCode.none, "groups": groups}


_KAFKA_STATES = {"empty": "Empty", "joining": "PreparingRebalance", "syncing": "CompletingRebalance",
                 "stable": "Stable"}


async def describe_groups(ctx: Context, req: Request) -> dict[str, Any]:
    """``DescribeGroups``: each group's state, protocol and members (with their subscriptions and
    assignments)."""
    ex = ctx.client.store.ex
    groups = {r[0]: r for r in await ex.all("kafka_groups_list", ())}
    out = []
    for gid in req.body.groups:
        rows = await ex.all("kafka_members", (gid,))
        group = groups.get(gid)
        state = _KAFKA_STATES[group[1]] if group is not None else "Dead"
        protocol = group[3] if group is not None else None
        members = [{"member_id": r[0], "group_instance_id": None, "client_id": r[1], "client_host": r[2],
                    "member_metadata": _metadata(r, protocol),
                    "member_assignment": bytes(r[10]) if r[10] is not None else b""} for r in rows]
        out.append({"error_code": ErrorCode.none, "group_id": gid, "group_state": state,
                    "protocol_type": (group[2] if group else None) or "", "protocol_data": protocol or "",
                    "members": members, "authorized_operations": -2147483648})
    return {"throttle_time": 0, "groups": out}


def _metadata(row: Any, protocol: str | None) -> bytes:
    names, metadata = list(row[6]), list(row[7])
    return bytes(metadata[names.index(protocol)]) if protocol in names else b""
