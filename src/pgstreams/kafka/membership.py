"""Kafka's classic consumer group protocol (``JoinGroup``, ``SyncGroup``, ``Heartbeat``, ``LeaveGroup``),
its state in PostgreSQL (``0028_kafka_groups.sql``), so that members connected to different gateways over
one database join one generation and any gateway can restart.

Every step is a transaction that locks the group's row. A rebalance is a round: it starts when a member
joins (or leaves, or times out) a group that is not already rebalancing, and ends when every member has
joined it or its deadline (the members' longest rebalance timeout) passes; members that did not rejoin
leave. The generation then counts up, the leader (kept from the previous generation when still a member)
gets every member's subscription, and its ``SyncGroup`` hands each member its assignment. The assignors
are the clients' own, as in Kafka. Waiting requests read the group again every :data:`RECHECK` seconds; a
gateway that closes ends them with ``NOT_COORDINATOR`` (the client finds the coordinator again and joins
there), so that its close does not wait for a round, and a request whose client closed its connection stops
waiting (its member then stays only until its session runs out).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

import psycopg
from kio.schema.errors import ErrorCode

from ..errors import InvalidName
from ..names import check_group
from .codec import Request
from .handlers import Context, client_gone

T = TypeVar("T")

log = logging.getLogger("pgstreams.kafka.groups")

#: Seconds between two reads of the group by a request that waits for a rebalance to end.
RECHECK = 0.05

EMPTY, JOINING, SYNCING, STABLE = "empty", "joining", "syncing", "stable"


@dataclass
class Group:
    """A group's row."""

    generation: int
    state: str
    round: int
    deadline_passed: bool
    protocol_type: str | None
    protocol: str | None
    leader: str | None


@dataclass
class Member:
    """A member's row."""

    member_id: str
    client_id: str
    client_host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocol_type: str
    protocol_names: list[str]
    protocol_metadata: list[bytes]
    join_round: int
    generation: int | None
    assignment: bytes | None


def _ms(value: Any) -> int:
    return int(value.total_seconds() * 1000) if isinstance(value, timedelta) else int(value)


class _Tx:
    """One transaction on a group: its row locked, its timed-out members removed."""

    def __init__(self, ctx: Context, conn: psycopg.AsyncConnection, group_id: str) -> None:
        self.ex = ctx.client.store.ex
        self.conn = conn
        self.group_id = group_id
        self.group: Group
        self.members: dict[str, Member] = {}

    async def load(self, waiting: str | None = None) -> None:
        """Lock and read the group; expire the members whose session timed out, except ``waiting``: a
        member whose ``JoinGroup`` or ``SyncGroup`` waits for the round is alive (as in Kafka, where a
        pending join keeps the member's session), and is marked seen first."""
        gid, conn = self.group_id, self.conn
        await self.ex.one("kafka_group_lock", (gid,), conn=conn)
        row = await self.ex.one("kafka_group_row", (gid,), conn=conn)
        self.group = Group(int(row[0]), row[1], int(row[2]), bool(row[3]), row[4], row[5], row[6])
        if waiting:
            await self.ex.one("kafka_member_seen", (gid, waiting), conn=conn)
        expired = await self.ex.all("kafka_expire_members", (gid,), conn=conn)
        await self.read_members()
        if expired:
            log.info("group %s: the session of %s ran out", gid, ", ".join(r[0] for r in expired))
        if expired and self.group.state != JOINING:
            await self.start_round("members' sessions ran out") if self.members else await self.save(EMPTY)

    async def read_members(self) -> None:
        """Read the group's members again."""
        rows = await self.ex.all("kafka_members", (self.group_id,), conn=self.conn)
        self.members = {r[0]: Member(r[0], r[1], r[2], int(r[3]), int(r[4]), r[5], list(r[6]),
                                     [bytes(m) for m in r[7]], int(r[8]), r[9],
                                     None if r[10] is None else bytes(r[10])) for r in rows}

    async def save(self, state: str, deadline_s: float | None = None) -> None:
        """Store the group's row with ``state`` (and a round deadline ``deadline_s`` seconds from now)."""
        g = self.group
        g.state = state
        await self.ex.run("kafka_group_update", (g.generation, state, g.round, deadline_s, g.protocol_type,
                                                 g.protocol, g.leader, self.group_id), conn=self.conn)

    async def join(self, m: Member) -> None:
        """Store member ``m`` as joining the group's current round (added, or its subscription replaced)."""
        m.join_round = self.group.round
        await self.ex.run("kafka_member_upsert", (
            self.group_id, m.member_id, m.client_id, m.client_host, m.session_timeout_ms,
            m.rebalance_timeout_ms, m.protocol_type, m.protocol_names, m.protocol_metadata, m.join_round),
            conn=self.conn)

    async def start_round(self, reason: str) -> None:
        """A rebalance starts (``reason``: why, logged): every member must join it again."""
        self.group.round += 1
        log.debug("group %s: round %d starts (%s)", self.group_id, self.group.round, reason)
        longest = max((m.rebalance_timeout_ms for m in self.members.values()), default=0)
        await self.save(JOINING, longest / 1000)

    async def try_complete(self) -> None:
        """End the round when every member has joined it or its deadline passed: form the generation."""
        g = self.group
        if g.state != JOINING:
            return
        joined = [m for m in self.members.values() if m.join_round == g.round]
        if len(joined) < len(self.members) and not g.deadline_passed:
            return
        await self.ex.run("kafka_members_drop_stale", (self.group_id, g.round), conn=self.conn)
        self.members = {m.member_id: m for m in joined}
        if not joined:
            g.leader = None
            await self.save(EMPTY)
            return
        g.generation += 1
        g.protocol_type = joined[0].protocol_type
        g.protocol = _common_protocol(joined)
        if g.leader not in self.members:
            g.leader = joined[0].member_id
        await self.ex.run("kafka_members_generation", (g.generation, self.group_id), conn=self.conn)
        log.debug("group %s: generation %d of %s (leader %s)", self.group_id, g.generation,
                  ", ".join(self.members), g.leader)
        for m in joined:
            m.generation, m.assignment = g.generation, None
        await self.save(SYNCING)


def _common_protocol(members: list[Member]) -> str | None:
    """The first protocol of the first member's preference that every member supports."""
    for name in members[0].protocol_names:
        if all(name in m.protocol_names for m in members):
            return name
    return None


async def _in_tx(ctx: Context, group_id: str, fn: Callable[[_Tx], Awaitable[T]],
                 waiting: str | None = None) -> T:
    """``fn`` in a transaction that locked and read the group (``waiting``: see :meth:`_Tx.load`)."""
    async with ctx.client.connection() as conn:
        async with conn.transaction():
            tx = _Tx(ctx, conn, group_id)
            await tx.load(waiting)
            return await fn(tx)


async def _wait_for_round(ctx: Context, group_id: str, member_id: str,
                          result: Callable[[_Tx], Awaitable[dict[str, Any] | None]], deadline: float,
                          fail: dict[str, Any]) -> dict[str, Any]:
    """The first reply ``result`` gives (None: the round goes on), read again every :data:`RECHECK` s with
    ``member_id`` kept seen; ``fail`` with ``REBALANCE_IN_PROGRESS`` once ``deadline`` (``time.monotonic``)
    passes. A closing gateway ends the wait (``NOT_COORDINATOR``: the member asks the coordinator again);
    so does a client that went away, which gets no answer, its member no longer kept seen: its session
    runs out."""
    while True:
        if ctx.stopping.is_set() or client_gone():
            return {**fail, "error_code": ErrorCode.not_coordinator}
        out = await _in_tx(ctx, group_id, result, waiting=member_id)
        if out is not None:
            return out
        if time.monotonic() > deadline:
            return {**fail, "error_code": ErrorCode.rebalance_in_progress}
        await asyncio.sleep(RECHECK)


def _bad_group(group_id: str) -> bool:
    try:
        check_group(group_id)
    except InvalidName:
        return True
    return False


async def join_group(ctx: Context, req: Request) -> dict[str, Any]:
    """``JoinGroup``: join (or rejoin) and wait for the round to end; the leader gets the subscriptions."""
    body = req.body
    gid = body.group_id
    member_id = body.member_id or ""
    fail: dict[str, Any] = {"throttle_time": 0, "generation_id": -1, "protocol_type": None,
                            "protocol_name": None, "leader": "", "member_id": member_id, "members": []}
    if _bad_group(gid):
        return {**fail, "error_code": ErrorCode.invalid_group_id}
    if not member_id:
        member_id = f"{req.client_id or 'member'}-{uuid.uuid4()}"
        if req.api_version >= 4:  # the client joins again with this id (Kafka's KIP-394)
            return {**fail, "error_code": ErrorCode.member_id_required, "member_id": member_id}
    session_ms = _ms(body.session_timeout)
    rebalance_ms = _ms(getattr(body, "rebalance_timeout", body.session_timeout))
    names = [p.name for p in body.protocols]
    metadata = [bytes(p.metadata) for p in body.protocols]

    async def register(tx: _Tx) -> ErrorCode:
        others = [m for m in tx.members.values() if m.member_id != member_id]
        if others and others[0].protocol_type != body.protocol_type:
            return ErrorCode.inconsistent_group_protocol
        if others and not any(all(n in m.protocol_names for m in others) for n in names):
            return ErrorCode.inconsistent_group_protocol
        if tx.group.state != JOINING:
            await tx.start_round(f"{member_id} joins")
        await tx.join(Member(member_id, req.client_id or "", "", session_ms, rebalance_ms, body.protocol_type,
                             names, metadata, tx.group.round, None, None))
        await tx.read_members()
        await tx.try_complete()
        return ErrorCode.none

    error = await _in_tx(ctx, gid, register)
    if error != ErrorCode.none:
        return {**fail, "error_code": error, "member_id": member_id}
    deadline = time.monotonic() + rebalance_ms / 1000 + 5

    async def result(tx: _Tx) -> dict[str, Any] | None:
        await tx.try_complete()
        me = tx.members.get(member_id)
        g = tx.group
        if me is None:
            return {**fail, "error_code": ErrorCode.unknown_member_id, "member_id": member_id}
        if g.state == JOINING:
            if me.join_round < g.round:  # another round started while this member waited: it joins it
                await tx.join(me)
            return None
        if me.generation != g.generation:
            return None
        members = []
        if member_id == g.leader:
            for m in tx.members.values():
                idx = m.protocol_names.index(g.protocol) if g.protocol in m.protocol_names else 0
                members.append({"member_id": m.member_id, "group_instance_id": None,
                                "metadata": m.protocol_metadata[idx]})
        return {"throttle_time": 0, "error_code": ErrorCode.none, "generation_id": g.generation,
                "protocol_type": g.protocol_type, "protocol_name": g.protocol, "leader": g.leader or "",
                "skip_assignment": False, "member_id": member_id, "members": members}

    return await _wait_for_round(ctx, gid, member_id, result, deadline, {**fail, "member_id": member_id})


async def sync_group(ctx: Context, req: Request) -> dict[str, Any]:
    """``SyncGroup``: the leader's assignments are stored; every member waits for its own."""
    body = req.body
    gid, member_id, generation = body.group_id, body.member_id, int(body.generation_id)
    fail: dict[str, Any] = {"throttle_time": 0, "protocol_type": None, "protocol_name": None,
                            "assignment": b""}
    if _bad_group(gid):
        return {**fail, "error_code": ErrorCode.invalid_group_id}

    def check(tx: _Tx) -> ErrorCode | None:
        me = tx.members.get(member_id)
        if me is None:
            return ErrorCode.unknown_member_id
        if tx.group.state == JOINING:
            return ErrorCode.rebalance_in_progress
        if generation != tx.group.generation:
            return ErrorCode.illegal_generation
        return None

    async def submit(tx: _Tx) -> ErrorCode | None:
        error = check(tx)
        if error is None and member_id == tx.group.leader and tx.group.state == SYNCING:
            given = [(a.member_id, bytes(a.assignment)) for a in body.assignments]
            await tx.ex.run("kafka_member_assign", ([m for m, _ in given], [a for _, a in given], gid),
                            conn=tx.conn)
            await tx.save(STABLE)
        return error

    error = await _in_tx(ctx, gid, submit, waiting=member_id)
    if error is not None:
        return {**fail, "error_code": error}
    deadline = time.monotonic() + 300

    async def result(tx: _Tx) -> dict[str, Any] | None:
        error = check(tx)
        if error is not None:
            return {**fail, "error_code": error}
        if tx.group.state != STABLE:
            return None
        me = tx.members[member_id]
        return {"throttle_time": 0, "error_code": ErrorCode.none, "protocol_type": tx.group.protocol_type,
                "protocol_name": tx.group.protocol, "assignment": me.assignment or b""}

    return await _wait_for_round(ctx, gid, member_id, result, deadline, fail)


async def heartbeat(ctx: Context, req: Request) -> dict[str, Any]:
    """``Heartbeat``: the member is alive; ``REBALANCE_IN_PROGRESS`` tells it to join again."""
    body = req.body
    gid, member_id, generation = body.group_id, body.member_id, int(body.generation_id)
    if _bad_group(gid):
        return {"throttle_time": 0, "error_code": ErrorCode.invalid_group_id}

    async def beat(tx: _Tx) -> ErrorCode:
        if member_id not in tx.members:
            return ErrorCode.unknown_member_id
        await tx.ex.one("kafka_member_seen", (gid, member_id), conn=tx.conn)
        if tx.group.state == JOINING:
            return ErrorCode.rebalance_in_progress
        if generation != tx.group.generation:
            return ErrorCode.illegal_generation
        return ErrorCode.none

    error = await _in_tx(ctx, gid, beat)
    if error != ErrorCode.none:
        log.debug("group %s: heartbeat of %s (generation %d): %s", gid, member_id, generation, error.name)
    return {"throttle_time": 0, "error_code": error}


async def leave_group(ctx: Context, req: Request) -> dict[str, Any]:
    """``LeaveGroup``: the members leave; those that stay rebalance."""
    body = req.body
    gid = body.group_id
    leaving = [m.member_id for m in body.members] if hasattr(body, "members") else [body.member_id]
    if _bad_group(gid):
        return {"throttle_time": 0, "error_code": ErrorCode.invalid_group_id, "members": []}

    async def leave(tx: _Tx) -> list[str]:
        gone = [r[0] for r in await tx.ex.all("kafka_member_delete", (gid, leaving), conn=tx.conn)]
        await tx.read_members()
        if gone:
            if tx.members:
                await tx.start_round(f"{', '.join(gone)} left")
            else:
                tx.group.leader = None
                await tx.save(EMPTY)
        return gone

    gone = await _in_tx(ctx, gid, leave)
    error = ErrorCode.none if gone or not leaving else ErrorCode.unknown_member_id
    return {"throttle_time": 0, "error_code": error if len(leaving) == 1 else ErrorCode.none,
            "members": [{"member_id": m, "group_instance_id": None,
                         "error_code": ErrorCode.none if m in gone else ErrorCode.unknown_member_id}
                        for m in leaving]}


async def check_member(ctx: Context, group_id: str, member_id: str, generation: int) -> ErrorCode:
    """Whether ``member_id`` of generation ``generation`` may commit offsets: ``NONE``, else
    ``UNKNOWN_MEMBER_ID``, ``ILLEGAL_GENERATION`` or ``REBALANCE_IN_PROGRESS``, as Kafka's coordinator
    decides. While a round waits for the members to join again, the generation that holds the partitions
    is still the current one and its members commit (Kafka's clients commit what they read when told to
    rejoin, before they do: refused, those offsets would be read again by whoever gets the partitions);
    between the round's end and the leader's assignments (Kafka's ``CompletingRebalance``) commits wait for
    the new generation's assignment: ``REBALANCE_IN_PROGRESS``."""

    async def check(tx: _Tx) -> ErrorCode:
        if member_id not in tx.members:
            return ErrorCode.unknown_member_id
        if generation != tx.group.generation:
            return ErrorCode.illegal_generation
        if tx.group.state == SYNCING:
            return ErrorCode.rebalance_in_progress
        return ErrorCode.none

    error = await _in_tx(ctx, group_id, check)
    if error != ErrorCode.none:
        log.debug("group %s: offsets of %s (generation %d) refused: %s", group_id, member_id, generation,
                  error.name)
    return error
