"""``FindCoordinator``, ``OffsetCommit`` and ``OffsetFetch``: a Kafka consumer group's committed offsets are
the checkpoints of the pgstreams stream group of the same name.

Kafka commits the offset of the next record to read; a pgstreams checkpoint is the position of the last
event read: a commit of offset ``o`` stores the checkpoint ``o - 1``, and a fetch answers checkpoint + 1.
So ``pgstreams groups describe G`` shows a Kafka group's positions and lag, and ``pgstreams groups reset``
moves it. Every gateway is the coordinator of every group (their state is in the database).
"""

from __future__ import annotations

from typing import Any

import psycopg
from kio.schema.errors import ErrorCode

from ..errors import GroupNotFound, InvalidName, PgStreamsError
from ..names import check_group
from ..storage import TopicRecord
from .codec import Request
from .handlers import Context, topic_record
from .membership import check_member

#: FindCoordinator's key types.
GROUP_KEY, TRANSACTION_KEY = 0, 1


async def find_coordinator(ctx: Context, req: Request) -> dict[str, Any]:
    """``FindCoordinator``: this gateway, for every group and every transactional id."""
    body = req.body
    keys = list(getattr(body, "coordinator_keys", ()) or ()) or [getattr(body, "key", "")]
    key_type = int(getattr(body, "key_type", GROUP_KEY))
    error, message = ErrorCode.none, None
    if key_type not in (GROUP_KEY, TRANSACTION_KEY):
        error, message = ErrorCode.invalid_request, f"key type {key_type} is not a group's or a transaction's"
    node = ctx.node_id if error == ErrorCode.none else -1
    host, port = (ctx.host, ctx.port) if error == ErrorCode.none else ("", -1)
    return {
        "throttle_time": 0, "error_code": error, "error_message": message, "node_id": node, "host": host,
        "port": port,
        "coordinators": [{"key": k, "node_id": node, "host": host, "port": port, "error_code": error,
                          "error_message": message} for k in keys],
    }


def _group_error(group: str) -> ErrorCode | None:
    try:
        check_group(group)
    except InvalidName:
        return ErrorCode.invalid_group_id
    return None


async def offset_commit(ctx: Context, req: Request) -> dict[str, Any]:
    """``OffsetCommit``: the group's checkpoints set to each offset - 1 (they may move backwards, as a
    Kafka commit may). A member of the group (generation >= 0) commits only in its own generation, outside
    a rebalance; a consumer that assigns its partitions itself (generation -1) commits freely."""
    body = req.body
    group = body.group_id
    bad = _group_error(group)
    generation = int(getattr(body, "generation_id_or_member_epoch", getattr(body, "generation_id", -1)))
    if bad is None and generation >= 0 and body.member_id:
        fenced = await check_member(ctx, group, body.member_id, generation)
        bad = None if fenced == ErrorCode.none else fenced
    topics = []
    for t in body.topics:
        record = None if bad else await topic_record(ctx, t.name)
        code = bad or (ErrorCode.unknown_topic_or_partition if record is None else None)
        cursors = {} if code else {int(p.partition_index): max(-1, int(p.committed_offset)) - 1
                                   for p in t.partitions
                                   if record is not None and 0 <= p.partition_index < record.partitions}
        if record is not None and cursors:
            try:
                await _seek(ctx, group, record, cursors)
            except PgStreamsError:
                code = ErrorCode.group_authorization_failed
        topics.append({"name": t.name, "partitions": [
            {"partition_index": p.partition_index,
             "error_code": code or (ErrorCode.none if int(p.partition_index) in cursors
                                    else ErrorCode.unknown_topic_or_partition)}
            for p in t.partitions]})
    return {"throttle_time": 0, "topics": topics}


async def _seek(ctx: Context, group: str, record: TopicRecord, cursors: dict[int, int]) -> None:
    # an offset of 0 (or a negative one) is "before every event": the origin cursor
    clean = {p: max(c, 0) for p, c in cursors.items()}

    async def go(conn: psycopg.AsyncConnection) -> None:
        await ctx.client.store.seek_checkpoints(conn, group, record.id, clean)

    await ctx.client.run(go)


async def offset_fetch(ctx: Context, req: Request) -> dict[str, Any]:
    """``OffsetFetch``: each checkpoint + 1; -1 where the group has none. With no topics named (v2+), every
    topic the group has checkpoints on."""
    body = req.body
    group = body.group_id
    bad = _group_error(group)
    if bad:
        return {"throttle_time": 0, "topics": [], "error_code": bad}
    asked = body.topics
    if asked is None:
        try:
            statuses = await ctx.client.describe_group(group)
        except GroupNotFound:
            statuses = []
        by_topic: dict[str, dict[int, int]] = {}
        for s in statuses:
            if s.checkpoint is not None:
                by_topic.setdefault(s.topic, {})[s.partition] = s.checkpoint
        topics = [{"name": name, "partitions": [
            {"partition_index": p, "committed_offset": c + 1, "metadata": "", "error_code": ErrorCode.none}
            for p, c in sorted(parts.items())]} for name, parts in sorted(by_topic.items())]
        return {"throttle_time": 0, "topics": topics, "error_code": ErrorCode.none}
    topics = []
    for t in asked:
        record = await topic_record(ctx, t.name)
        indexes = [int(i) for i in t.partition_indexes]
        if record is None:
            topics.append({"name": t.name, "partitions": [
                {"partition_index": i, "committed_offset": -1, "metadata": "",
                 "error_code": ErrorCode.unknown_topic_or_partition} for i in indexes]})
            continue
        valid = [i for i in indexes if 0 <= i < record.partitions]
        found = await _load(ctx, group, record, valid) if valid else {}
        topics.append({"name": t.name, "partitions": [
            {"partition_index": i, "committed_offset": found[i] + 1 if i in found else -1, "metadata": "",
             "error_code": ErrorCode.none if i in valid else ErrorCode.unknown_topic_or_partition}
            for i in indexes]})
    return {"throttle_time": 0, "topics": topics, "error_code": ErrorCode.none}


async def _load(ctx: Context, group: str, record: TopicRecord, partitions: list[int]) -> dict[int, int]:
    async def go(conn: psycopg.AsyncConnection) -> dict[int, int]:
        return await ctx.client.store.load_checkpoints(conn, group, record.id, partitions)

    return await ctx.client.run(go)
