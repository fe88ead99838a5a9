"""Group membership: registration, fair share by leases, hand-over, expiry, fencing, configuration, status.

Members are driven step by step from the test (no background threads), so each property is checked at a
known point of the protocol.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterator

import psycopg
import pytest

import pgstreams
from _core_helpers import until
from pgstreams import CommitOutcome, InvalidArgument
from pgstreams.consumer import LeaseClaim, StreamReader, create_checkpoints
from pgstreams.groups import GroupMember

_members: list[GroupMember] = []


@pytest.fixture(autouse=True)
def _close_members() -> Iterator[None]:
    yield
    while _members:
        _members.pop().close()


def member(client: pgstreams.Client, name: str, topic: str = "t", group: str = "g", *,
           hb: float = 1.0, session: float = 60.0) -> GroupMember:
    """A member driven step by step by the test (it heartbeats only when told to: tests of expiry pass a
    short session timeout, the others a long one)."""
    m = GroupMember(client, topic, group, member_id=name, heartbeat_interval=hb, session_timeout=session)
    _members.append(m)
    return m


def settle(members: list[GroupMember], rounds: int = 5) -> None:
    """Balancing rounds in which every member also hands over what others wait for."""
    for _ in range(rounds):
        for m in members:
            leases = m.balance()
            if leases.leaving:
                m.release({p: leases.owned[p] for p in leases.leaving})
        for m in members:
            m.refresh()


def fenced_commit(client: pgstreams.Client, reader: StreamReader, events: list[pgstreams.Event],
                  lease: LeaseClaim) -> CommitOutcome:
    """Commit ``events`` as a member holding ``lease`` does."""
    with client.connection() as conn:
        return reader.commit(conn, reader.targets(events), lease)


def owners(client: pgstreams.Client, group: str = "g") -> dict[int, str | None]:
    return {s.partition: s.owner for s in pgstreams.group_status(client, group)}


def test_a_lone_member_claims_every_partition(client: pgstreams.Client) -> None:
    client.create_topic("t", 12)
    client.consumer("t", "g")  # checkpoints
    a = member(client, "a")
    leases = a.register()
    assert leases.alive and sorted(leases.owned) == list(range(12))
    assert set(owners(client).values()) == {"a"}


@pytest.mark.parametrize("n_members", [2, 3, 4, 5, 6, 7, 12, 14])
def test_fair_share_every_member_holds_floor_or_ceil(client: pgstreams.Client, n_members: int) -> None:
    client.create_topic("t", 12)
    client.consumer("t", "g")
    ms = [member(client, f"m{i}") for i in range(n_members)]
    for m in ms:
        m.register()
    settle(ms)
    counts = [len(m.leases.owned) for m in ms]
    lo, hi = 12 // n_members, math.ceil(12 / n_members)
    assert sum(counts) == 12
    assert all(lo <= c <= hi for c in counts), counts
    assert all(not m.leases.leaving and not m.leases.incoming for m in ms)
    # every partition has exactly one owner, known to the owner itself
    mine = sorted(p for m in ms for p in m.leases.owned)
    assert mine == list(range(12))


def test_a_stolen_partition_stays_with_its_owner_until_released(client: pgstreams.Client) -> None:
    client.create_topic("t", 4)
    client.consumer("t", "g")
    a, b = member(client, "a"), member(client, "b")
    a.register()
    got = b.register()
    assert not got.owned and len(got.incoming) == 2  # b waits for two of a's partitions
    before = owners(client)
    assert set(before.values()) == {"a"}, "stealing must not move the lease by itself"
    leases = a.heartbeat()
    assert leases.leaving == got.incoming
    released = a.release({p: leases.owned[p] for p in leases.leaving})
    assert sorted(released) == sorted(got.incoming)
    after = b.refresh()
    assert set(after.owned) == set(got.incoming) and not after.incoming
    assert set(a.leases.owned).isdisjoint(after.owned)


def test_stale_member_expires_and_its_partitions_are_taken_over(client: pgstreams.Client) -> None:
    client.create_topic("t", 6)
    client.consumer("t", "g")
    a, b = member(client, "a", session=0.5, hb=0.1), member(client, "b", session=0.5, hb=0.1)
    a.register()
    b.register()
    settle([a, b])
    a_parts = dict(a.leases.owned)
    assert len(a_parts) == 3
    started = time.monotonic()
    a.heartbeat()  # a's last heartbeat
    # b keeps heartbeating, a does not: after a's session timeout, b's balancing round expires a
    until(lambda: (b.heartbeat(), b.balance())[1].owned.keys() >= a_parts.keys(), 5, "takeover")
    assert time.monotonic() - started >= 0.5 - 0.1 - 0.05
    assert len(b.leases.owned) == 6
    assert all(b.leases.owned[p] > a_parts[p] for p in a_parts), "a takeover must bump the epoch"
    members = pgstreams.group_members(client, "g")
    assert [m.member_id for m in members] == ["b"]
    # a notices on its next heartbeat and registers again, with nothing until it balances
    leases = a.heartbeat()
    assert leases.alive
    assert {m.member_id for m in pgstreams.group_members(client, "g")} == {"a", "b"}


def test_fenced_commit_does_not_move_the_checkpoint(client: pgstreams.Client) -> None:
    client.create_topic("t", 2)
    for i in range(6):
        client.publish("t", i, partition=0)
    a, b = member(client, "a", session=0.4, hb=0.1), member(client, "b", session=0.4, hb=0.1)
    a.register()
    consumer = create_checkpoints(client, "t", "g", partitions=[0])
    lease = LeaseClaim("a", {0: a.leases.owned[0]})
    events = consumer.poll(3, timeout=2)
    assert fenced_commit(client, consumer, events, lease) is CommitOutcome.STORED
    events = consumer.poll(3, timeout=2)
    assert len(events) == 3
    b.register()
    # a stops heartbeating; b expires it and takes partition 0
    until(lambda: (b.heartbeat(), 0 in b.balance().owned)[1], 5, "b owns partition 0")
    before = {s.partition: s.checkpoint for s in pgstreams.group_status(client, "g")}
    assert fenced_commit(client, consumer, events, lease) is CommitOutcome.FENCED
    assert consumer.last_outcomes == {0: CommitOutcome.FENCED}
    after = {s.partition: s.checkpoint for s in pgstreams.group_status(client, "g")}
    assert after == before
    # b, the owner, commits fine; a consumer that is not a member is not fenced at all
    cb = create_checkpoints(client, "t", "g", partitions=[0])
    lease_b = LeaseClaim("b", {0: b.leases.owned[0]})
    assert fenced_commit(client, cb, cb.poll(3, timeout=2), lease_b) is CommitOutcome.STORED
    client.publish("t", "more", partition=0)
    plain = pgstreams.Consumer(client, "t", "g", partitions=[0])
    assert plain.commit(plain.poll(10, timeout=2)) is CommitOutcome.STORED


def test_fenced_commit_in_a_transaction_rolls_back_the_handler_writes(client: pgstreams.Client) -> None:
    client.create_topic("t", 1)
    client.publish("t", "x")
    with client.connection() as conn:
        conn.execute("CREATE TABLE effects (v text)")
    a = member(client, "a")
    a.register()
    reader = create_checkpoints(client, "t", "g")
    lease = LeaseClaim("a", {0: a.leases.owned[0] - 1})  # an epoch a no longer holds
    with client.connection() as conn, reader.transaction(conn, lease=lease, keep_ignored=False) as tx:
        events = reader.poll(10, timeout=2, conn=conn)
        for ev in events:
            conn.execute("INSERT INTO effects VALUES (%s)", (ev.value,))
        tx.store(events)
    assert tx.outcome is CommitOutcome.FENCED
    with client.connection() as conn:
        assert conn.execute("SELECT count(*) FROM effects").fetchone() == (0,)
    assert pgstreams.group_status(client, "g")[0].checkpoint is None


def test_an_in_flight_commit_holds_the_lease_until_it_ends(client: pgstreams.Client) -> None:
    """The lease row is share-locked by a fenced commit: expiry waits for it, so the next owner reads
    the checkpoint after that commit (never an older one)."""
    client.create_topic("t", 1)
    client.publish("t", "x")
    a, b = member(client, "a", session=0.3, hb=0.1), member(client, "b", session=0.3, hb=0.1)
    a.register()
    b.register()
    reader = create_checkpoints(client, "t", "g")
    lease = LeaseClaim("a", dict(a.leases.owned))
    events = reader.poll(10, timeout=2)
    took: list[pgstreams.groups.Leases] = []
    with client.connection() as conn, conn.transaction():
        assert reader.store(conn, reader.targets(events), lease) is CommitOutcome.STORED
        until(lambda: any(m.stale for m in pgstreams.group_members(client, "g") if m.member_id == "a"),
              5, "a stale")
        t = threading.Thread(target=lambda: (b.heartbeat(), took.append(b.balance())))
        t.start()
        with client.connection() as watcher:
            until(lambda: watcher.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                " AND wait_event_type = 'Lock'").fetchone() == (1,), 5, "the expiry waiting for the lease")
        assert t.is_alive() and not took, "the expiry must wait for the in-flight commit"
    t.join(5)
    assert 0 in took[0].owned
    assert pgstreams.group_status(client, "g")[0].checkpoint == events[-1].position


def test_leave_hands_leases_to_waiting_members(client: pgstreams.Client) -> None:
    client.create_topic("t", 4)
    client.consumer("t", "g")
    a, b = member(client, "a"), member(client, "b")
    a.register()
    waiting = b.register().incoming
    assert waiting
    assert a.leave() == 4
    assert set(b.refresh().owned) == set(waiting)
    assert not pgstreams.group_members(client, "g", "t")[0].stale
    assert [m.member_id for m in pgstreams.group_members(client, "g")] == ["b"]
    # the rest is unowned until b balances
    assert set(b.balance().owned) == {0, 1, 2, 3}


def test_status_view_shows_owner_heartbeat_stale_and_lag(client: pgstreams.Client) -> None:
    client.create_topic("t", 2)
    for i in range(5):
        client.publish("t", i, partition=1)
    client.consumer("t", "g")
    a = member(client, "a", session=0.3, hb=0.1)
    a.register()
    rows = pgstreams.group_status(client, "g")
    assert [(r.partition, r.owner, r.lag, r.checkpoint, r.stale) for r in rows] == [
        (0, "a", 0, None, False), (1, "a", 5, None, False)]
    assert rows[1].head is not None and rows[0].head is None
    assert rows[0].last_heartbeat is not None and rows[0].last_heartbeat.utcoffset() is not None
    until(lambda: all(r.stale for r in pgstreams.group_status(client, "g")), 5, "stale flag")
    assert pgstreams.group_members(client, "g")[0].stale
    with client.connection() as conn:
        cols = [d.name for d in conn.execute("SELECT * FROM pgstreams.consumer_group_status").description]
    for col in ("group_name", "topic", "partition", "owner", "checkpoint", "head", "lag", "last_heartbeat",
                "stale"):
        assert col in cols


def test_group_config_defaults_and_changes(client: pgstreams.Client) -> None:
    cfg = pgstreams.get_group_config(client, "g")
    assert (cfg.heartbeat_interval, cfg.session_timeout) == (pgstreams.DEFAULT_HEARTBEAT_INTERVAL,
                                                             pgstreams.DEFAULT_SESSION_TIMEOUT)
    assert cfg.dead_letter_for("orders") == "orders.dlt"
    cfg = pgstreams.configure_group(client, "g", heartbeat_interval=0.5, session_timeout=4)
    assert (cfg.heartbeat_interval, cfg.session_timeout) == (0.5, 4.0)
    assert pgstreams.configure_group(client, "g", dead_letter="errors").dead_letter_for("orders") == "errors"
    cfg = pgstreams.configure_group(client, "g", dead_letter=False)
    assert cfg.dead_letter_for("orders") is None and cfg.heartbeat_interval == 0.5
    client.create_topic("t", 1)
    m = GroupMember(client, "t", "g")
    assert (m.heartbeat_interval, m.session_timeout) == (0.5, 4.0)


@pytest.mark.parametrize("kwargs, fragment", [
    ({"heartbeat_interval": 2.0, "session_timeout": 3.0}, "at least twice"),
    ({"heartbeat_interval": 0}, "heartbeat_interval"),
    ({"session_timeout": -1}, "session_timeout"),
    ({"session_timeout": float("nan")}, "session_timeout"),
    ({"heartbeat_interval": True}, "heartbeat_interval"),
    ({"dead_letter": 3}, "dead_letter"),
    ({"dead_letter": "bad name!"}, "invalid topic name"),
])
def test_group_config_rejects_bad_values_and_changes_nothing(client: pgstreams.Client, kwargs: dict,
                                                             fragment: str) -> None:
    pgstreams.configure_group(client, "g", heartbeat_interval=1, session_timeout=10)
    with pytest.raises(pgstreams.PgStreamsError, match=fragment):
        pgstreams.configure_group(client, "g", **kwargs)
    cfg = pgstreams.get_group_config(client, "g")
    assert (cfg.heartbeat_interval, cfg.session_timeout, cfg.dead_letter) == (1.0, 10.0, True)


def test_member_rejects_bad_arguments(client: pgstreams.Client) -> None:
    client.create_topic("t", 1)
    with pytest.raises(InvalidArgument, match="member_id"):
        GroupMember(client, "t", "g", member_id="x" * 201)
    with pytest.raises(pgstreams.InvalidName):
        GroupMember(client, "t", "bad group")
    with pytest.raises(pgstreams.TopicNotFound):
        GroupMember(client, "nope", "g")
    with pytest.raises(InvalidArgument, match="at least twice"):
        GroupMember(client, "t", "g", heartbeat_interval=1, session_timeout=1.5)
    with client.connection() as conn:
        assert conn.execute("SELECT count(*) FROM pgstreams.members").fetchone() == (0,)


def test_deleting_a_topic_removes_its_members_and_leases(client: pgstreams.Client) -> None:
    client.create_topic("t", 3)
    member(client, "a").register()
    client.delete_topic("t")
    with client.connection() as conn:
        for table in ("members", "leases"):
            n = conn.execute(psycopg.sql.SQL("SELECT count(*) FROM pgstreams.{}").format(
                psycopg.sql.Identifier(table))).fetchone()
            assert n == (0,)


def test_group_states_are_one_vocabulary_in_describe_group_status_and_metrics(
        client: pgstreams.Client) -> None:
    """Empty (no member), Rebalancing (a member holds some partitions, another waits), Stable; per partition
    unassigned / handing over / assigned: the same words from describe_group, the status and the metrics."""
    from pgstreams.metrics import StatusCollector

    client.create_topic("t", 2)
    client.consumer("t", "g").commit()  # a plain consumer's checkpoints: no member
    rows = client.describe_group("g", "t")
    assert [r.state for r in rows] == ["unassigned", "unassigned"]
    assert pgstreams.group_state(rows) == "Empty" and pgstreams.group_state(client.status().groups) == "Empty"

    a = member(client, "a")
    settle([a])
    rows = client.describe_group("g", "t")
    assert [r.state for r in rows] == ["assigned", "assigned"] and pgstreams.group_state(rows) == "Stable"

    b = member(client, "b")
    b.heartbeat()
    b.balance()  # b waits for its share, a has not handed it over yet
    rows = client.describe_group("g", "t")
    assert sorted(r.state for r in rows) == ["assigned", "handing over"]
    assert pgstreams.group_state(rows) == "Rebalancing"
    settle([a, b])
    rows = client.describe_group("g", "t")
    assert [r.state for r in rows] == ["assigned", "assigned"] and pgstreams.group_state(rows) == "Stable"
    assert {r.state for r in client.status().groups} == {"assigned"}

    wanted = ("pgstreams_group_state", "pgstreams_group_partition_state")
    current = [(s.name, dict(s.labels)) for family in StatusCollector(client).collect()
               for s in family.samples if family.name in wanted and s.value == 1.0]
    assert ("pgstreams_group_state", {"group": "g", "topic": "t", "state": "Stable"}) in current
    states = [labels["state"] for name, labels in current if name == "pgstreams_group_partition_state"]
    assert states == ["assigned", "assigned"]
    for st in rows:
        assert st.state in pgstreams.PARTITION_STATES
