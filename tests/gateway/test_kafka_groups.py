"""Kafka consumer groups through the gateway (librdkafka's ``subscribe()``): members join one generation
even when they are connected to different gateways over the same database, partitions are shared and
handed over when a member leaves, every event is consumed once and the commits are the pgstreams group's
checkpoints."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer

import pgstreams
from _core_helpers import until
from _gateway_helpers import RawConnection, running_gateway


@pytest.fixture
def gateways(client: pgstreams.Client, dsn: str) -> Iterator[tuple[str, str]]:
    with running_gateway(dsn) as first, running_gateway(dsn) as second:
        yield first, second


class Member:
    """A librdkafka consumer in group ``g`` subscribed to ``t``, polling in a thread of its own."""

    def __init__(self, bootstrap: str, name: str) -> None:
        self.name = name
        self.assigned: set[int] = set()
        self.records: list[tuple[int, int]] = []
        self.errors: list[object] = []
        self._stop = threading.Event()
        self._consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "g", "client.id": name,
                                   "auto.offset.reset": "earliest", "session.timeout.ms": 10000,
                                   "heartbeat.interval.ms": 300, "auto.commit.interval.ms": 200})
        self._consumer.subscribe(["t"], on_assign=self._on_assign, on_revoke=self._on_revoke)
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _on_assign(self, consumer: Consumer, partitions: list) -> None:
        self.assigned = {p.partition for p in partitions}

    def _on_revoke(self, consumer: Consumer, partitions: list) -> None:
        self.assigned = set()

    def _run(self) -> None:
        while not self._stop.is_set():
            m = self._consumer.poll(0.1)
            if m is None:
                continue
            if m.error():
                self.errors.append(m.error())
            else:
                self.records.append((m.partition(), m.offset()))
        self._consumer.close()  # commits what was read and leaves the group

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(60)
        assert not self._thread.is_alive()


def test_members_on_two_gateways_share_the_partitions_and_consume_each_event_once(
        client: pgstreams.Client, gateways: tuple[str, str]) -> None:
    client.create_topic("t", partitions=4)
    client.publish_many("t", [{"value": f"{i}", "key": f"k{i}"} for i in range(100)])
    a = Member(gateways[0], "a")
    b = Member(gateways[1], "b")
    try:
        # one generation over both gateways: the partitions split between the members, none twice
        until(lambda: a.assigned and b.assigned and a.assigned | b.assigned == {0, 1, 2, 3}
              and not a.assigned & b.assigned, 60, "both members to get partitions")
        until(lambda: len({*a.records, *b.records}) == 100, 60, "the first 100 events")
    finally:
        b.stop()
    # b left: a takes every partition and reads what is published next
    until(lambda: a.assigned == {0, 1, 2, 3}, 60, "a to take b's partitions")
    client.publish_many("t", [{"value": f"{i}", "key": f"k{i}"} for i in range(100, 150)])
    until(lambda: len({*a.records, *b.records}) == 150, 60, "the next 50 events")
    a.stop()
    assert not a.errors and not b.errors, (a.errors, b.errors)
    every = a.records + b.records
    assert len(set(every)) == 150
    # the group's commits are its pgstreams checkpoints: nothing left to read
    status = client.describe_group("g", "t")
    assert len(status) == 4 and all(s.lag == 0 for s in status), status
    # (a member that restarts resumes there: the group's committed offsets are its checkpoints)
    c = Member(gateways[1], "c")
    try:
        until(lambda: c.assigned == {0, 1, 2, 3}, 60, "the restarted member to join")
        client.publish("t", "after", key="k1")
        until(lambda: len(c.records) == 1, 60, "the one new event")
    finally:
        c.stop()
    assert len(c.records) == 1  # what was committed before is not read again


def _offset_commit(bootstrap: str, group: str, member: str, generation: int, offset: int) -> int:
    """The error code of a raw OffsetCommit v2 of ``offset`` on partition 0 of ``t``."""
    from datetime import timedelta

    from kio.schema.offset_commit.v2.request import (
        OffsetCommitRequest,
        OffsetCommitRequestPartition,
        OffsetCommitRequestTopic,
    )
    from kio.schema.offset_commit.v2.response import OffsetCommitResponse
    from kio.static.primitive import i32, i64, i64Timedelta

    partition = OffsetCommitRequestPartition(partition_index=i32(0), committed_offset=i64(offset),
                                             committed_metadata="")
    request = OffsetCommitRequest(
        group_id=group, generation_id_or_member_epoch=i32(generation), member_id=member,
        retention_time=i64Timedelta.parse(timedelta(milliseconds=-1)),
        topics=(OffsetCommitRequestTopic(name="t", partitions=(partition,)),))
    with RawConnection(bootstrap, timeout=30) as conn:
        response = conn.call(8, 2, request, OffsetCommitResponse)
    return int(response.topics[0].partitions[0].error_code)


def test_a_commit_from_another_generation_or_no_member_is_refused_and_moves_nothing(
        client: pgstreams.Client, gateways: tuple[str, str]) -> None:
    client.create_topic("t", partitions=1)
    client.publish("t", "x")
    member = Member(gateways[0], "a")
    try:
        until(lambda: member.assigned == {0}, 60, "the member to join")
        # the member read the event and committed it: it commits nothing more (nothing changes)
        until(lambda: len(member.records) == 1 and client.list_groups() != [] and
              client.describe_group("g", "t")[0].checkpoint == member.records[0][1], 60, "its commit")
        member_id, generation = client.run(lambda c: c.execute(
            "SELECT m.member_id, g.generation FROM pgstreams.kafka_members m "
            "JOIN pgstreams.kafka_groups g USING (group_id) WHERE group_id = 'g'").fetchone())
        before = {s.partition: s.checkpoint for s in client.describe_group("g", "t")}
        assert _offset_commit(gateways[1], "g", "nobody", generation, 1000) == 25  # UNKNOWN_MEMBER_ID
        assert _offset_commit(gateways[1], "g", member_id, generation - 1, 1000) == 22  # ILLEGAL_GENERATION
        assert {s.partition: s.checkpoint for s in client.describe_group("g", "t")} == before
        # the member of the current generation, and a consumer outside the group protocol, commit
        assert _offset_commit(gateways[1], "g", member_id, generation, 1000) == 0
        assert client.describe_group("g", "t")[0].checkpoint == 999
        assert _offset_commit(gateways[1], "g", "", -1, 1001) == 0
        assert client.describe_group("g", "t")[0].checkpoint == 1000
    finally:
        member.stop()


class _Raw(RawConnection):
    """A raw connection that joins group ``g`` and heartbeats in it."""

    def join(self, member_id: str, session_ms: int) -> Any:
        from datetime import timedelta

        from kio.schema.join_group.v2.request import JoinGroupRequest, JoinGroupRequestProtocol
        from kio.schema.join_group.v2.response import JoinGroupResponse
        from kio.static.primitive import i32Timedelta

        return self.call(11, 2, JoinGroupRequest(
            group_id="g", session_timeout=i32Timedelta.parse(timedelta(milliseconds=session_ms)),
            rebalance_timeout=i32Timedelta.parse(timedelta(seconds=60)), member_id=member_id,
            protocol_type="consumer", protocols=(JoinGroupRequestProtocol(name="range", metadata=b"m"),)),
            JoinGroupResponse)

    def sync(self, member_id: str, generation: int) -> int:
        """The error code of a ``SyncGroup`` as the leader, assigning itself nothing in particular."""
        from kio.schema.sync_group.v0.request import SyncGroupRequest, SyncGroupRequestAssignment
        from kio.schema.sync_group.v0.response import SyncGroupResponse
        from kio.static.primitive import i32

        mine = SyncGroupRequestAssignment(member_id=member_id, assignment=b"a")
        request = SyncGroupRequest(group_id="g", generation_id=i32(generation), member_id=member_id,
                                   assignments=(mine,))
        return int(self.call(14, 0, request, SyncGroupResponse).error_code)

    def heartbeat(self, member_id: str, generation: int) -> int:
        from kio.schema.heartbeat.v0.request import HeartbeatRequest
        from kio.schema.heartbeat.v0.response import HeartbeatResponse
        from kio.static.primitive import i32

        request = HeartbeatRequest(group_id="g", generation_id=i32(generation), member_id=member_id)
        out = self.call(12, 0, request, HeartbeatResponse)
        return int(out.error_code)


def test_a_member_waiting_in_join_group_longer_than_its_session_timeout_stays_a_member(
        client: pgstreams.Client, gateways: tuple[str, str]) -> None:
    """A rebalance round waits for a member that is slow to join again (here 8 s) while the member that
    started the round waits in ``JoinGroup`` with a 3 s session timeout: as in Kafka, a pending join keeps
    the waiting member's session, so the round ends with both members, not with the waiter removed."""
    import time
    from concurrent.futures import ThreadPoolExecutor

    client.create_topic("t", partitions=2)
    slow, waiter = _Raw(gateways[0]), _Raw(gateways[1])
    try:
        first = slow.join("", 30_000)
        assert int(first.error_code) == 0 and int(first.generation_id) == 1, first
        slow_id = first.member_id
        with ThreadPoolExecutor(1) as pool:
            pending = pool.submit(waiter.join, "", 3_000)  # starts round 2, waits for the slow member
            deadline = time.monotonic() + 8
            while time.monotonic() < deadline:  # the slow member stays alive but does not join yet
                assert slow.heartbeat(slow_id, 1) in (0, 27)  # none, or REBALANCE_IN_PROGRESS
                time.sleep(0.5)
            assert not pending.done()
            again = slow.join(slow_id, 30_000)
            joined = pending.result(60)
        assert int(joined.error_code) == 0, joined  # not UNKNOWN_MEMBER_ID (25): still a member
        assert int(again.error_code) == 0 and int(again.generation_id) == int(joined.generation_id) == 2
        assert len(again.members if again.leader == slow_id else joined.members) == 2
    finally:
        slow.close()
        waiter.close()


def test_a_closing_gateway_ends_a_join_group_waiting_for_the_round_at_once(
        client: pgstreams.Client, dsn: str) -> None:
    """A ``JoinGroup`` waiting for a slow member is a wait, not work: the gateway it waits on closes without
    waiting for the round (its close would otherwise wait up to 30 s, and the other members' sessions run
    out meanwhile), and the member gets ``NOT_COORDINATOR`` (16), on which clients find the coordinator
    again."""
    import time
    from concurrent.futures import ThreadPoolExecutor

    client.create_topic("t", partitions=2)
    with running_gateway(dsn) as first:
        slow = _Raw(first)
        try:
            joined = slow.join("", 30_000)
            assert int(joined.error_code) == 0, joined
            with ThreadPoolExecutor(1) as pool:
                with running_gateway(dsn) as second:
                    waiter = _Raw(second)
                    pending = pool.submit(waiter.join, "", 30_000)  # waits for the slow member to join again
                    until(lambda: client.run(lambda c: c.execute(
                        "SELECT g.round = 2 AND count(*) = 2 FROM pgstreams.kafka_groups g JOIN"
                        " pgstreams.kafka_members m USING (group_id) WHERE group_id = 'g' GROUP BY g.round"
                        ).fetchone()) == (True,), 30, "the waiter to join round 2")
                    assert not pending.done()
                    closing = time.monotonic()
                closed = time.monotonic() - closing
                answer = pending.result(30)
                waiter.close()
            assert int(answer.error_code) == 16, answer  # NOT_COORDINATOR
            assert closed < 10, f"the gateway took {closed:.1f} s to close"
        finally:
            slow.close()


def _members(client: pgstreams.Client) -> int:
    return int(client.run(lambda c: c.execute(
        "SELECT count(*) FROM pgstreams.kafka_members WHERE group_id = 'g'").fetchone())[0])


def test_a_member_whose_client_went_away_during_its_join_group_leaves_when_its_session_runs_out(
        client: pgstreams.Client, gateways: tuple[str, str]) -> None:
    """A waiting ``JoinGroup`` keeps its member's session only while its client is connected: a client that
    closed its connection in the middle of the wait is no longer kept seen, so its member leaves once its
    session timeout (3 s) passes and the round ends without it."""
    import contextlib
    from concurrent.futures import ThreadPoolExecutor

    client.create_topic("t", partitions=2)
    slow = _Raw(gateways[0])
    try:
        first = slow.join("", 30_000)
        slow_id = first.member_id
        with ThreadPoolExecutor(1) as pool:
            gone = _Raw(gateways[1])
            pending = pool.submit(gone.join, "", 3_000)
            until(lambda: _members(client) == 2, 30, "the second member to join")
            gone.sock.shutdown(socket.SHUT_RDWR)  # its client goes away while the join waits
            with contextlib.suppress(Exception):
                pending.result(30)
            gone.close()
        # the slow member stays (heartbeats) and sees the other one leave when its session runs out
        until(lambda: slow.heartbeat(slow_id, 1) in (0, 27) and _members(client) == 1, 30,
              "the gone member's session to run out")
        again = slow.join(slow_id, 30_000)
        assert int(again.error_code) == 0 and again.leader == slow_id and len(again.members) == 1, again
    finally:
        slow.close()


def _checkpoint(client: pgstreams.Client) -> int | None:
    """Group ``g``'s checkpoint on partition 0 of ``t`` (None: none yet)."""
    try:
        return client.describe_group("g", "t")[0].checkpoint
    except pgstreams.errors.GroupNotFound:
        return None


def test_a_member_commits_while_a_round_waits_for_it_to_join_again(
        client: pgstreams.Client, gateways: tuple[str, str]) -> None:
    """As Kafka's coordinator does: while a rebalance waits for the members to join again, the generation
    that holds the partitions is still current and its members' commits are stored (a client commits what
    it read when told to rejoin, before it does: refused, those events would be read again by the member
    that gets the partition); between the round's end and the leader's assignments, a commit is refused
    with ``REBALANCE_IN_PROGRESS`` (27), and moves nothing."""
    from concurrent.futures import ThreadPoolExecutor

    client.create_topic("t", partitions=1)
    member, newcomer = _Raw(gateways[0]), _Raw(gateways[1])
    try:
        joined = member.join("", 30_000)
        member_id = joined.member_id
        assert int(joined.error_code) == 0 and int(joined.generation_id) == 1, joined
        # the round ended, the leader has not assigned yet
        assert _offset_commit(gateways[0], "g", member_id, 1, 5) == 27
        assert _checkpoint(client) is None
        assert member.sync(member_id, 1) == 0
        assert _offset_commit(gateways[0], "g", member_id, 1, 5) == 0
        assert _checkpoint(client) == 4
        with ThreadPoolExecutor(1) as pool:
            pending = pool.submit(newcomer.join, "", 30_000)  # a round starts, and waits for the member
            until(lambda: member.heartbeat(member_id, 1) == 27, 30, "the round to start")
            assert _offset_commit(gateways[1], "g", member_id, 1, 9) == 0
            assert _checkpoint(client) == 8
            assert _offset_commit(gateways[1], "g", member_id, 0, 12) == 22  # not its generation
            assert not pending.done()
            again = member.join(member_id, 30_000)
            assert int(again.error_code) == 0 and int(pending.result(60).error_code) == 0
        assert _checkpoint(client) == 8
    finally:
        member.close()
        newcomer.close()
