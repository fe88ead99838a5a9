"""``ListOffsets`` and ``Fetch``: Kafka offsets are event positions.

A partition's high watermark and last stable offset are both its read fence: every event below the fence
is committed or rolled back for good (``pgstreams.storage.EventStore.fences``), so no event can later
appear below an offset a client has read, and what a read-committed consumer sees is what every
pgstreams reader sees (an open transaction's events are held back, a rolled-back one's never appear).
Offsets inside a partition have gaps (positions are numbered per topic), as in a compacted Kafka topic.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from kio.schema.errors import ErrorCode

from ..errors import PermissionDenied
from ..storage import TopicRecord
from .codec import Request
from .handlers import Context, topic_record
from .records import write_batch

#: ListOffsets' special timestamps.
LATEST, EARLIEST = -1, -2

#: The longest wait of a fetch's thread for a notification before the fetch reads again: a gateway that
#: closes ends its waits this fast.
WAIT_SLICE = 0.25

#: Events read per partition and statement by a fetch (then cut to the partition's byte budget).
FETCH_ROWS = 1000

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


async def list_offsets(ctx: Context, req: Request) -> dict[str, Any]:
    """``ListOffsets``: latest (-1) is the read fence, earliest (-2) the first retained event (the fence
    when there is none), a timestamp the first event created at or after it (-1 when there is none)."""
    topics = []
    for t in req.body.topics:
        record = await topic_record(ctx, t.name)
        if record is None:
            topics.append({"name": t.name, "partitions": [
                {"partition_index": p.partition_index, "error_code": ErrorCode.unknown_topic_or_partition,
                 "timestamp": -1, "offset": -1} for p in t.partitions]})
            continue
        wanted = [p for p in t.partitions if 0 <= p.partition_index < record.partitions]
        parts = sorted({int(p.partition_index) for p in wanted})
        answers = await _offsets_of(ctx, record, parts, wanted) if parts else {}
        topics.append({"name": t.name, "partitions": [
            answers.get(int(p.partition_index), {
                "partition_index": p.partition_index, "error_code": ErrorCode.unknown_topic_or_partition,
                "timestamp": -1, "offset": -1})
            for p in t.partitions]})
    return {"throttle_time": 0, "topics": topics}


async def _offsets_of(ctx: Context, record: TopicRecord, parts: list[int], wanted: Sequence[Any]
                      ) -> dict[int, dict[str, Any]]:
    return await ctx.client.run(lambda conn: _offsets(ctx, conn, record, parts, wanted))


async def _offsets(ctx: Context, conn: psycopg.AsyncConnection, record: TopicRecord, parts: list[int],
                   wanted: Sequence[Any]) -> dict[int, dict[str, Any]]:
    store = ctx.client.store
    fences = await store.fences(conn, record.id, parts)
    out: dict[int, dict[str, Any]] = {}
    for p in wanted:
        part, ts = int(p.partition_index), int(p.timestamp)
        fence = fences[part]
        if ts == LATEST:
            offset, found_ts = fence, -1
        else:
            at = _EPOCH if ts == EARLIEST or ts < 0 else _EPOCH + timedelta(milliseconds=ts)
            cursor = (await store.time_cursors(conn, record.id, {part: fence}, at))[part]
            offset = cursor + 1
            found_ts = -1
            if ts >= 0:
                if offset >= fence:
                    offset = -1  # no event at or after the time (Kafka's answer)
                else:
                    found_ts = ts
        out[part] = {"partition_index": part, "error_code": ErrorCode.none, "timestamp": found_ts,
                     "offset": offset, "leader_epoch": 0}
    return out


async def fetch(ctx: Context, req: Request) -> dict[str, Any]:
    """``Fetch``: per partition, the events from ``fetch_offset`` below the read fence, as one record batch
    (at least one event, however large, then up to the partition's byte budget and the request's); waits
    up to ``max_wait`` for ``min_bytes``, woken by the publishers' notifications."""
    body = req.body
    deadline = time.monotonic() + _millis(body.max_wait) / 1000
    listener = ctx.client.sync.session.listener
    ids: list[int] = []
    recheck = 0.0
    while True:
        generations = listener.generations(ids)  # counted before the read: a later one ends the wait
        responses, size, ids = await _fetch_once(ctx, body)
        left = deadline - time.monotonic()
        if size >= max(1, int(body.min_bytes)) or left <= 0 or _has_error(responses) or not ids \
                or ctx.stopping.is_set():
            return {"throttle_time": 0, "error_code": ErrorCode.none, "session_id": 0,
                    "responses": responses}
        if set(generations) != set(ids):
            generations = listener.generations(ids)
        recheck = await asyncio.get_running_loop().run_in_executor(
            ctx.waits, listener.wait_for_events, generations, min(left, WAIT_SLICE), recheck)


def _millis(value: Any) -> float:
    return value.total_seconds() * 1000 if isinstance(value, timedelta) else float(value)


def _has_error(responses: list[dict[str, Any]]) -> bool:
    return any(p["error_code"] != ErrorCode.none for t in responses for p in t["partitions"])


async def _fetch_once(ctx: Context, body: Any) -> tuple[list[dict[str, Any]], int, list[int]]:
    budget = int(body.max_bytes) if int(body.max_bytes) > 0 else 2**31 - 1
    total = 0
    responses = []
    ids: list[int] = []
    for t in body.topics:
        record = await topic_record(ctx, t.topic)
        parts_out = []
        if record is None:
            for p in t.partitions:
                parts_out.append(_partition_error(p.partition, ErrorCode.unknown_topic_or_partition))
            responses.append({"topic": t.topic, "partitions": parts_out})
            continue
        ids.append(record.id)
        valid = [p for p in t.partitions if 0 <= p.partition < record.partitions]
        got: dict[int, tuple[int, list[tuple[Any, ...]]]] = {}
        if valid:
            try:
                got = await _read_of(ctx, record, valid)
            except PermissionDenied:  # the role may not read the topic
                denied = [_partition_error(p.partition, ErrorCode.topic_authorization_failed)
                          for p in t.partitions]
                responses.append({"topic": t.topic, "partitions": denied})
                continue
        for p in t.partitions:
            part = int(p.partition)
            if part not in got:
                parts_out.append(_partition_error(part, ErrorCode.unknown_topic_or_partition))
                continue
            fence, rows = got[part]
            records = write_batch(rows, min(int(p.partition_max_bytes), budget - total), first=total == 0)
            total += len(records)
            parts_out.append({"partition_index": part, "error_code": ErrorCode.none, "high_watermark": fence,
                              "last_stable_offset": fence, "log_start_offset": -1,
                              "aborted_transactions": [], "preferred_read_replica": -1,
                              "records": records})
        responses.append({"topic": t.topic, "partitions": parts_out})
    return responses, total, ids


def _partition_error(partition: int, error: ErrorCode) -> dict[str, Any]:
    return {"partition_index": partition, "error_code": error, "high_watermark": -1,
            "last_stable_offset": -1, "log_start_offset": -1, "aborted_transactions": None, "records": None}


async def _read_of(ctx: Context, record: TopicRecord, wanted: Sequence[Any]
                   ) -> dict[int, tuple[int, list[tuple[Any, ...]]]]:
    return await ctx.client.run(lambda conn: _read(ctx, conn, record, wanted))


async def _read(ctx: Context, conn: psycopg.AsyncConnection, record: TopicRecord, wanted: Sequence[Any]
                ) -> dict[int, tuple[int, list[tuple[Any, ...]]]]:
    store = ctx.client.store
    parts = [int(p.partition) for p in wanted]
    offsets = {int(p.partition): max(0, int(p.fetch_offset)) for p in wanted}
    params = {"partitions": parts, "positions": [offsets[p] - 1 for p in parts], "limit": FETCH_ROWS,
              "total": FETCH_ROWS * len(parts)}
    rows, fences = await store.poll_fenced(conn, record.id, params)  # below the fences: the high watermarks
    by_part: dict[int, list[tuple[Any, ...]]] = {p: [] for p in parts}
    for row in rows:
        by_part[row[0]].append(row)
    return {p: (fences[p], by_part[p]) for p in parts}
