"""Share groups and queues: acquiring, acks, releases, rejects, renewals, lock expiry, delivery limits and
dead letters, ordering by key, publish delays, backfill starts, exactly-once transactions and status."""

from __future__ import annotations

import logging
import threading
import time
from datetime import datetime, timezone

import psycopg
import pytest

import pgstreams
from _core_helpers import db_state, until, wait_until
from pgstreams import ShareOutcome


def positions(events: list[pgstreams.Event]) -> list[int]:
    return [e.position for e in events]


def state_rows(client: pgstreams.Client, group: str, topic: str) -> int:
    return client.store.shares.state_rows(group, client.topic_record(topic).id)


def take(share: pgstreams.ShareConsumer, n: int, timeout: float = 10.0) -> list[pgstreams.Event]:
    got: list[pgstreams.Event] = []
    deadline = time.monotonic() + timeout
    while len(got) < n and time.monotonic() < deadline:
        got += share.poll(n - len(got), 0.5)
    return got


def test_consumers_of_a_share_group_split_the_events_and_each_is_acked_once(client: pgstreams.Client) -> None:
    client.create_topic("t", 1)
    client.publish_many("t", [{"value": i} for i in range(20)])
    a = client.share_consumer("t", "g")
    b = client.share_consumer("t", "g")
    got_a = a.poll(10, 1)
    got_b = b.poll(100, 1)
    assert len(got_a) == 10 and len(got_b) == 10
    assert not set(positions(got_a)) & set(positions(got_b))
    assert all(e.delivery_count == 1 for e in got_a + got_b)
    assert a.ack(got_a).ok and b.ack(got_b).ok
    assert a.poll(10, 0.2) == [] and b.poll(10, 0.2) == []
    assert state_rows(client, "g", "t") == 0
    # another share group sees every event again, independently
    c = client.share_consumer("t", "other")
    assert sorted(positions(take(c, 20))) == sorted(positions(got_a + got_b))


def test_share_consumers_share_every_partition(client: pgstreams.Client) -> None:
    client.create_topic("t", 4)
    client.publish_many("t", [{"value": i, "partition": i % 4} for i in range(40)])
    a = client.share_consumer("t", "g")
    got = take(a, 40)
    assert sorted(e.value for e in got) == list(range(40))
    assert {e.partition for e in got} == {0, 1, 2, 3}
    assert a.ack(got).ok


def test_acking_after_the_lock_expired_says_so_and_never_acks_twice(client: pgstreams.Client) -> None:
    client.create_topic("t")
    client.publish("t", "x")
    a = client.share_consumer("t", "g", lock_timeout=0.2)
    b = client.share_consumer("t", "g", lock_timeout=30)
    [ev] = a.poll(1, 1)
    # lock expired, nobody took it yet: EXPIRED
    until(lambda: _expired(client), 10, "the lock to expire")
    assert a.ack([ev]).outcome(ev) is ShareOutcome.EXPIRED
    [again] = wait_until(lambda: b.poll(1, 0.2), 10, "the event delivered again")
    assert again.position == ev.position and again.delivery_count == 2
    # the first consumer no longer holds it: acking it again is refused as not held
    with pytest.raises(pgstreams.InvalidArgument, match="not held"):
        a.ack([ev])
    assert b.ack([again]).outcome(again) is ShareOutcome.DONE
    with pytest.raises(pgstreams.InvalidArgument, match="not held"):
        b.ack([again])
    assert state_rows(client, "g", "t") == 0


def _expired(client: pgstreams.Client) -> bool:
    with client.connection() as conn:
        row = conn.execute(
            "SELECT bool_and(until <= clock_timestamp()) FROM pgstreams.share_events").fetchone()
    return bool(row and row[0])


def test_acking_an_event_another_consumer_took_over_is_lost(client: pgstreams.Client) -> None:
    client.create_topic("t")
    client.publish("t", "x")
    a = client.share_consumer("t", "g", lock_timeout=0.1)
    b = client.share_consumer("t", "g")
    [ev] = a.poll(1, 1)
    [again] = wait_until(lambda: b.poll(1, 0.2), 10, "b to take the expired event")
    assert again.delivery_count == 2
    assert a.ack([ev]).outcome(ev) is ShareOutcome.LOST
    assert b.ack([again]).ok


def test_release_makes_events_available_again_after_the_delay(client: pgstreams.Client) -> None:
    client.create_topic("t")
    client.publish_many("t", [{"value": i} for i in range(3)])
    a = client.share_consumer("t", "g")
    got = a.poll(3, 1)
    assert a.release(got[:1]).ok
    [again] = a.poll(3, 1)
    assert again.position == got[0].position and again.delivery_count == 2
    t0 = time.monotonic()
    assert a.release([again], delay=0.5).ok
    back = take(a, 1)
    assert time.monotonic() - t0 >= 0.5
    assert back[0].position == got[0].position and back[0].delivery_count == 3
    assert a.ack(back + got[1:]).ok


def test_renew_extends_the_lock(client: pgstreams.Client) -> None:
    client.create_topic("t")
    client.publish("t", "x")
    a = client.share_consumer("t", "g", lock_timeout=0.4)
    b = client.share_consumer("t", "g")
    [ev] = a.poll(1, 1)
    until_lock = time.monotonic() + 0.4
    for _ in range(4):
        assert a.renew([ev]).ok
        assert b.poll(1, 0.15) == []
    assert time.monotonic() > until_lock  # past the first lock: the renewals held it
    assert a.ack([ev]).ok


def test_an_event_delivered_max_deliveries_times_goes_to_the_dead_letter_topic_once(
        client: pgstreams.Client) -> None:
    client.create_topic("t", 2)
    client.publish("t", {"bad": True}, key="k", headers={"h": "1"})
    a = client.share_consumer("t", "g", lock_timeout=0.1, max_deliveries=2)
    b = client.share_consumer("t", "g", lock_timeout=0.1, max_deliveries=2)
    seen = []
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        seen += a.poll(1, 0.1) + b.poll(1, 0.1)
        if sum(s.dead_lettered for s in client.describe_share_group("g")):
            break
    assert sorted(e.delivery_count for e in seen) == [1, 2]
    assert state_rows(client, "g", "t") == 0
    dlt = pgstreams.Consumer(client, "t.dlt", "x")
    [copy] = dlt.poll(10, 2)
    assert dlt.poll(10, 0.3) == []
    assert copy.value == {"bad": True} and copy.key == "k" and copy.partition == seen[0].partition
    assert copy.headers["h"] == "1" and copy.headers["dlt.deliveries"] == "2"
    assert copy.headers["dlt.group"] == "g" and copy.headers["dlt.topic"] == "t"
    assert copy.headers["dlt.position"] == str(seen[0].position)
    assert copy.headers["dlt.error_type"] == "DeliveryLimit"
    total = client.describe_share_group("g")
    assert sum(s.removed_too_often for s in total) == 1 and sum(s.dead_lettered for s in total) == 1


def test_releasing_an_event_at_its_delivery_limit_dead_letters_it(client: pgstreams.Client) -> None:
    client.create_topic("t")
    client.publish("t", "x")
    a = client.share_consumer("t", "g", max_deliveries=1)
    [ev] = a.poll(1, 1)
    s = a.release([ev], error=ValueError("boom"))
    assert s.outcome(ev) is ShareOutcome.DEAD_LETTERED
    [copy] = pgstreams.Consumer(client, "t.dlt", "x").poll(10, 2)
    assert copy.headers["dlt.error_type"] == "ValueError" and copy.headers["dlt.error_message"] == "boom"
    assert a.poll(1, 0.2) == []


def test_without_a_dead_letter_topic_events_delivered_too_often_are_dropped(client: pgstreams.Client) -> None:
    client.create_topic("t")
    client.publish("t", "x")
    a = client.share_consumer("t", "g", max_deliveries=1, dead_letter=False)
    [ev] = a.poll(1, 1)
    assert a.release([ev]).outcome(ev) is ShareOutcome.DEAD_LETTERED
    assert a.poll(1, 0.2) == []
    [st] = client.describe_share_group("g")
    assert st.removed_too_often == 1 and st.dead_lettered == 0 and st.dead_letter is None
    with pytest.raises(pgstreams.TopicNotFound):
        client.topic_record("t.dlt")


def test_reject_sends_the_event_to_the_dead_letter_topic_in_one_transaction(client: pgstreams.Client) -> None:
    client.create_topic("t")
    client.publish_many("t", [{"value": i} for i in range(2)])
    a = client.share_consumer("t", "g", dead_letter="bad-events")
    got = a.poll(2, 1)
    s = a.reject(got[:1], reason="not for us")
    assert s.ok
    [copy] = pgstreams.Consumer(client, "bad-events", "x").poll(10, 2)
    assert copy.headers["dlt.error_type"] == "Rejected" and copy.headers["dlt.error_message"] == "not for us"
    assert copy.headers["dlt.deliveries"] == "1"
    assert a.ack(got[1:]).ok
    [st] = client.describe_share_group("g")
    assert st.rejected == 1 and st.dead_lettered == 1


def test_ordering_by_key_never_has_two_events_of_a_key_in_flight_and_keeps_their_order(
        client: pgstreams.Client) -> None:
    client.create_topic("t", 1)
    client.publish_many("t", [{"value": f"{k}{i}", "key": k} for i in range(3) for k in ("a", "b")]
                        + [{"value": "n"}])
    a = client.share_consumer("t", "g", ordering="key")
    b = client.share_consumer("t", "g", ordering="key")
    first = a.poll(10, 1)
    assert sorted(e.value for e in first) == ["a0", "b0", "n"]
    assert b.poll(10, 0.2) == []  # a1 and b1 wait for a0 and b0
    assert a.ack([e for e in first if e.value == "a0"]).ok
    [a1] = wait_until(lambda: b.poll(10, 0.2), 10, "a1")
    assert a1.value == "a1"
    # a released event keeps its place: b1 waits for b0 again
    assert a.release([e for e in first if e.value == "b0"]).ok
    [b0] = wait_until(lambda: b.poll(10, 0.2), 10, "b0 again")
    assert b0.value == "b0" and b0.delivery_count == 2
    assert b.ack([a1, b0]).ok
    rest = take(a, 3)
    assert sorted(e.value for e in rest) in (["a2", "b1"], ["a2", "b1", "b2"])
    values: list[str] = [e.value for e in rest]
    a.ack(rest)
    values += [e.value for e in take(a, 4 - len(values), timeout=3)]
    assert sorted(values) == ["a2", "b1", "b2"]
    assert values.index("b1") < values.index("b2")


def test_a_delayed_publish_is_not_acquired_before_its_delay_but_stream_groups_see_it_at_once(
        client: pgstreams.Client) -> None:
    client.create_topic("t")
    share = client.share_consumer("t", "g")
    t0 = time.monotonic()
    client.publish("t", "later", delay=0.6)
    client.publish("t", "now")
    [now] = share.poll(10, 1)
    assert now.value == "now"
    assert [e.value for e in pgstreams.Consumer(client, "t", "stream").poll(10, 1)] == ["later", "now"]
    [later] = take(share, 1)
    assert later.value == "later" and time.monotonic() - t0 >= 0.6
    assert share.ack([now, later]).ok
    with pytest.raises(pgstreams.InvalidArgument, match="delay"):
        client.publish("t", "x", delay=-1)


@pytest.mark.parametrize("start", ["earliest", "latest", "time"])
def test_a_share_group_created_later_starts_at_earliest_latest_or_a_time(
        client: pgstreams.Client, start: str) -> None:
    client.create_topic("t", 2)
    client.publish_many("t", [{"value": i} for i in range(4)])
    with client.connection() as conn:
        row = conn.execute("SELECT clock_timestamp()").fetchone()
    assert row is not None
    middle: datetime = row[0]
    client.publish_many("t", [{"value": i} for i in range(4, 6)])
    share = client.share_consumer("t", "g", start=middle if start == "time" else start)  # type: ignore[arg-type]
    client.publish_many("t", [{"value": i} for i in range(6, 8)])
    want = {"earliest": list(range(8)), "latest": [6, 7], "time": [4, 5, 6, 7]}[start]
    got = take(share, len(want))
    assert sorted(e.value for e in got) == want
    assert share.poll(10, 0.2) == []
    # a consumer created later keeps the group's frontier
    assert client.share_consumer("t", "g", start="earliest").poll(10, 0.2) == []


def test_queues(client: pgstreams.Client) -> None:
    info = client.create_queue("jobs", 2, lock_timeout=5, max_deliveries=3)
    assert info.name == "jobs" and info.partitions == 2
    q = client.queue("jobs")
    assert q.lock_timeout == 5 and q.max_deliveries == 3 and q.dead_letter == "jobs.dlt"
    client.publish("jobs", {"job": 1})
    [ev] = q.poll(10, 1)
    assert q.ack([ev]).ok
    [st, _] = client.describe_share_group("jobs")
    assert st.queue
    client.create_topic("plain")
    with pytest.raises(pgstreams.GroupNotFound, match="not a queue"):
        client.queue("plain")
    with pytest.raises(pgstreams.TopicNotFound):
        client.queue("nothing")


def test_transaction_commits_the_writes_and_the_acks_together(client: pgstreams.Client) -> None:
    client.create_topic("t")
    with client.connection() as conn:
        conn.execute("CREATE TABLE out (position bigint PRIMARY KEY)")
    client.publish_many("t", [{"value": i} for i in range(5)])
    share = client.share_consumer("t", "g")
    with pytest.raises(RuntimeError):
        with share.transaction() as tx:
            for ev in tx.poll(2, 1):
                tx.connection.execute("INSERT INTO out VALUES (%s)", (ev.position,))
            raise RuntimeError("handler failed")
    # rolled back, and the events were released at once
    with share.transaction() as tx:
        evs = tx.poll(10, 1)
        for ev in evs:
            tx.connection.execute("INSERT INTO out VALUES (%s)", (ev.position,))
    assert tx.committed and len(evs) == 5
    assert sorted(e.delivery_count for e in evs) == [1, 1, 1, 2, 2]
    with client.connection() as conn:
        assert conn.execute("SELECT count(*) FROM out").fetchone() == (5,)
    assert state_rows(client, "g", "t") == 0


def test_transaction_rolls_back_when_a_lock_was_lost(client: pgstreams.Client) -> None:
    client.create_topic("t")
    with client.connection() as conn:
        conn.execute("CREATE TABLE out (position bigint)")
    client.publish("t", "x")
    a = client.share_consumer("t", "g", lock_timeout=0.1)
    b = client.share_consumer("t", "g")
    with a.transaction() as tx:
        [ev] = tx.poll(1, 1)
        tx.connection.execute("INSERT INTO out VALUES (%s)", (ev.position,))
        wait_until(lambda: b.poll(1, 0.1), 10, "b to take the event over")
    assert not tx.committed and tx.settlement is not None
    assert tx.settlement.outcome(ev) is ShareOutcome.LOST
    with client.connection() as conn:
        assert conn.execute("SELECT count(*) FROM out").fetchone() == (0,)


def test_transaction_without_writes_acks_all_or_nothing(client: pgstreams.Client) -> None:
    """A block that never used ``.connection`` acks as a transaction of its own: when one lock was lost,
    no event is acked, not even those still held, which are delivered again."""
    client.create_topic("t", 2)
    client.publish("t", "x", partition=0)
    a = client.share_consumer("t", "g", lock_timeout=5)
    b = client.share_consumer("t", "g")
    with a.transaction() as tx:
        [x] = tx.poll(1, 1)
        [taken] = wait_until(lambda: b.poll(1, 0.2), 30, "b to take x over once its lock expired")
        client.publish("t", "y", partition=1)
        [y] = tx.poll(1, 5)
    assert (taken.position, taken.delivery_count) == (x.position, 2)
    assert not tx.began and not tx.committed and tx.settlement is not None
    assert tx.settlement.outcome(x) is ShareOutcome.LOST
    assert tx.settlement.outcome(y) is ShareOutcome.DONE  # its ack took effect, and was rolled back
    assert not a.holds(x) and not a.holds(y)
    [again] = wait_until(lambda: b.poll(1, 0.2), 30, "y given back")
    assert (again.value, again.delivery_count) == ("y", 2)
    assert b.ack([taken, again]).ok
    assert state_rows(client, "g", "t") == 0


def test_status_counts_acquired_available_and_waiting(client: pgstreams.Client) -> None:
    client.create_topic("t")
    client.publish_many("t", [{"value": i} for i in range(10)])
    a = client.share_consumer("t", "g")
    got = a.poll(4, 1)
    a.release(got[:1], delay=60)
    [st] = client.describe_share_group("g", "t")
    assert (st.acquired, st.available, st.waiting, st.frontier, st.head) == (3, 6, 1, 4, 10)
    assert st.oldest_lock is not None and st.oldest_lock.tzinfo is not None
    assert st.as_dict()["group"] == "g"
    with pytest.raises(pgstreams.GroupNotFound):
        client.describe_share_group("nope")


def test_status_shows_the_start_and_events_delivered_too_often_until_they_are_dead_lettered(
        client: pgstreams.Client) -> None:
    """A group created at latest shows where it started; an event whose lock expired at its last allowed
    delivery counts as delivered too often until the next acquisition dead-letters it."""
    client.create_topic("t")
    client.publish_many("t", [{"value": i} for i in range(3)])
    late = client.share_consumer("t", "late", start="latest")
    [st] = client.describe_share_group("late", "t")
    assert (st.start, st.head) == (3, 3)
    a = client.share_consumer("t", "g", lock_timeout=0.05, max_deliveries=1)
    [first] = a.poll(1, 1)
    assert first.delivery_count == 1
    until(lambda: _expired(client), 10, "the lock to expire")
    [st] = client.describe_share_group("g", "t")
    assert (st.start, st.delivered_too_often, st.acquired, st.dead_lettered) == (None, 1, 0, 0)
    got = a.poll(2, 1)  # dead-letters the first event, then acquires others
    assert got and first.position not in [e.position for e in got]
    [st] = client.describe_share_group("g", "t")
    # the new locks may expire meanwhile, but nothing is dead-lettered before the next acquisition
    assert (st.removed_too_often, st.dead_lettered) == (1, 1)
    assert [e.value for e in client.consumer("t.dlt", "check").poll(10, 1)] == [first.value]
    assert late.poll(1, 0.1) == []


def test_bad_input_raises_a_clear_error_and_changes_nothing(client: pgstreams.Client, dsn: str) -> None:
    client.create_topic("t")
    client.create_topic("u")
    client.publish("t", "x")
    client.publish("u", "y")
    a = client.share_consumer("t", "g")
    other_group = client.share_consumer("t", "h")
    u = client.share_consumer("u", "g")
    [ev] = a.poll(1, 1)
    [ev_h] = other_group.poll(1, 1)
    [ev_u] = u.poll(1, 1)
    before = db_state(dsn)
    bad = [
        (lambda: client.share_consumer("missing", "g"), pgstreams.TopicNotFound, "missing"),
        (lambda: client.share_consumer("t", "bad group!"), pgstreams.InvalidName, "group"),
        (lambda: client.share_consumer("t", "g", lock_timeout=-1), pgstreams.InvalidArgument, "lock_timeout"),
        (lambda: client.share_consumer("t", "g", lock_timeout=0), pgstreams.InvalidArgument, "lock_timeout"),
        (lambda: client.share_consumer("t", "g", max_deliveries=0), pgstreams.InvalidArgument,
         "max_deliveries"),
        (lambda: client.share_consumer("t", "g", dead_letter="t"), pgstreams.InvalidArgument, "itself"),
        (lambda: client.share_consumer("t", "g", dead_letter=3), pgstreams.InvalidArgument, "dead_letter"),
        (lambda: client.share_consumer("t", "g", ordering="time"), pgstreams.InvalidArgument, "ordering"),
        (lambda: client.share_consumer("t", "g", start="soon"), pgstreams.InvalidArgument, "start"),
        (lambda: client.create_queue("bad name!"), pgstreams.InvalidName, "name"),
        (lambda: client.create_queue("q", lock_timeout=-5), pgstreams.InvalidArgument, "lock_timeout"),
        (lambda: a.poll(0, 1), pgstreams.InvalidArgument, "max_events"),
        (lambda: a.poll(1, -1), pgstreams.InvalidArgument, "timeout"),
        (lambda: a.release([ev], delay=-1), pgstreams.InvalidArgument, "delay"),
        (lambda: a.ack([ev_u]), pgstreams.InvalidArgument, "topic 'u'"),
        (lambda: a.ack([ev_h]), pgstreams.InvalidArgument, "not held"),
        (lambda: a.ack([ev, ev_h]), pgstreams.InvalidArgument, "not held"),
        (lambda: a.reject([ev_u]), pgstreams.InvalidArgument, "topic 'u'"),
        (lambda: a.ack(["x"]), pgstreams.InvalidArgument, "Event"),  # type: ignore[list-item]
        (lambda: a.reject([ev], reason=3), pgstreams.InvalidArgument, "reason"),  # type: ignore[arg-type]
    ]
    for call, exc, words in bad:
        with pytest.raises(exc, match=words):
            call()
    assert db_state(dsn) == before
    assert a.ack([ev]).ok


def test_eight_consumers_drain_100000_events_with_state_bounded_by_the_events_in_flight(
        dsn: str) -> None:
    n, consumers, batch = 100_000, 8, 100
    with pgstreams.connect(dsn, pool_size=consumers + 4) as client:
        client.create_topic("big", 2)
        client.publish_many("big", [{"value": i, "partition": i % 2} for i in range(n)])
        share = [client.share_consumer("big", "g") for _ in range(consumers)]
        topic_id = client.topic_record("big").id
        acked = [0] * consumers
        errors: list[BaseException] = []
        done = threading.Event()

        def run(i: int) -> None:
            try:
                while not done.is_set():
                    got = share[i].poll(batch, 0.2)
                    if got:
                        assert share[i].ack(got).ok
                        acked[i] += len(got)
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)
                done.set()

        threads = [threading.Thread(target=run, args=(i,)) for i in range(consumers)]
        for t in threads:
            t.start()
        peak = 0
        try:
            while sum(acked) < n and not errors:
                peak = max(peak, client.store.shares.state_rows("g", topic_id))
                time.sleep(0.05)  # sampling interval of the measurement, not synchronisation
        finally:
            done.set()
            for t in threads:
                t.join(30)
        assert not errors, errors
        assert sum(acked) == n
        # in flight: at most a batch per consumer, and a poll adds at most one batch beyond a window
        assert peak <= consumers * batch + 2 * batch
        assert client.store.shares.state_rows("g", topic_id) == 0
        with client.connection() as conn:
            assert conn.execute("SELECT count(*) FROM pgstreams.share_partitions").fetchone() == (2,)


def test_acking_inside_a_callers_transaction(client: pgstreams.Client) -> None:
    client.create_topic("t")
    client.publish("t", "x")
    a = client.share_consumer("t", "g")
    [ev] = a.poll(1, 1)
    with client.connection() as conn:
        with conn.transaction():
            assert a.ack([ev], conn=conn).ok
            raise_rollback(conn)
    assert state_rows(client, "g", "t") == 1


def raise_rollback(conn: psycopg.Connection) -> None:
    conn.execute("SELECT 1")
    raise psycopg.Rollback()


def test_event_times_are_utc(client: pgstreams.Client) -> None:
    client.create_topic("t")
    client.publish("t", "x")
    [ev] = client.share_consumer("t", "g").poll(1, 1)
    assert ev.created_at.tzinfo == timezone.utc


def test_events_of_one_poll_can_be_settled_one_by_one_or_expire(client: pgstreams.Client) -> None:
    client.create_topic("t")
    client.publish_many("t", [{"value": i} for i in range(10)])
    a = client.share_consumer("t", "g", lock_timeout=0.5)
    b = client.share_consumer("t", "g")
    got = a.poll(10, 1)
    assert [e.value for e in got] == list(range(10))
    assert a.ack(got[:5]).ok  # part of the poll
    assert a.release(got[5:7]).ok
    released = wait_until(lambda: b.poll(10, 0.2), 10, "the released events")
    assert [(e.value, e.delivery_count) for e in released] == [(5, 2), (6, 2)]
    expired = take(b, 3)  # a's lock on the rest expires
    assert sorted((e.value, e.delivery_count) for e in expired) == [(7, 2), (8, 2), (9, 2)]
    assert a.ack(got[7:]).failed() == [(e.partition, e.position) for e in got[7:]]
    assert b.ack(released + expired).ok
    assert state_rows(client, "g", "t") == 0


def test_the_frontier_stops_at_the_window_of_waiting_events(client: pgstreams.Client) -> None:
    client.create_topic("t")
    for i in range(30):
        client.publish("t", i, delay=3600)
    a = client.share_consumer("t", "g")
    a.window = 5
    for _ in range(10):
        assert a.poll(3, 0) == []
    rows = state_rows(client, "g", "t")
    assert 5 <= rows <= 5 + 3  # the window, and at most one poll beyond it
    [st] = client.describe_share_group("g")
    assert st.waiting == rows and st.frontier == rows


# -- retention -----------------------------------------------------------------------------------------
SEG = 1000  # the smallest segment


def test_retention_wins_and_a_share_groups_loss_is_counted_and_visible(
    client: pgstreams.Client, caplog: pytest.LogCaptureFixture
) -> None:
    n = 3 * SEG + 100
    client.create_topic("t", 1, config={"segment.events": SEG, "retention.events": SEG})
    c1 = client.share_consumer("t", "g")
    c2 = client.share_consumer("t", "g", lock_timeout=0.3)
    client.publish_many("t", [{"value": i} for i in range(n)])
    assert c1.ack(take(c1, 10)).ok
    waiting = take(c1, 5)
    assert c1.release(waiting, delay=3600).ok  # released for later: a row no consumer holds
    expiring = take(c2, 5)  # c2's locks expire
    in_flight = take(c1, 5)
    until(lambda: sum(s.acquired for s in client.describe_share_group("g")) == 5, what="c2's locks to expire")
    with caplog.at_level(logging.WARNING, logger="pgstreams.maintenance"):
        report = client.maintain()
    assert report.segments_removed >= 1
    tid = client.topic_record("t").id
    with client.connection() as conn:
        oldest = conn.execute(f"SELECT min(position) FROM pgstreams.topic_{tid}").fetchone()[0]
    assert max(e.position for e in waiting + expiring + in_flight) < oldest
    # events past the frontier and the released ones are lost when their segments are marked
    [st] = client.describe_share_group("g")
    assert st.lost_events == (oldest - 1) - 10 - 5 - 5 and st.frontier == oldest - 1
    assert any("share groups had not acquired" in r.getMessage() for r in caplog.records)
    # an event acquired when its segment went is still acked by its consumer
    assert c1.ack(in_flight).ok
    # the expired ones are found removed by the next consumer to take them, which counts them
    c3 = client.share_consumer("t", "g")
    with caplog.at_level(logging.WARNING, logger="pgstreams.shares"):
        rest = take(c3, n - oldest + 1)
    assert sorted(e.position for e in rest) == list(range(oldest, n + 1))
    assert c3.ack(rest).ok and c3.poll(10, 0.2) == []
    until(lambda: c3.lost_events == 5, what="the expired events to be found removed")
    assert any("removed by retention" in r.getMessage() for r in caplog.records)
    [st] = client.describe_share_group("g")
    assert st.lost_events == oldest - 1 - 10 - 5  # every event before the oldest retained, less those acked
    assert 10 + 5 + len(rest) + st.lost_events == n and state_rows(client, "g", "t") == 0


def test_a_share_group_ahead_of_retention_loses_nothing_in_either_maintenance_path(
    client: pgstreams.Client, dsn: str
) -> None:
    for topic in ("py", "sql"):
        client.create_topic(topic, 2, config={"segment.events": SEG, "retention.events": SEG})
        share = client.share_consumer(topic, "fast")
        behind = client.share_consumer(topic, "slow")
        client.publish_many(topic, [{"value": i, "key": str(i)} for i in range(2 * SEG + 10)])
        got = take(share, 2 * SEG + 10)
        assert share.ack(got).ok
        assert behind.poll(1, 0)  # the slow group holds one event and has taken no other
    client.maintain()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pgstreams.maintain()")
    for topic in ("py", "sql"):
        assert client.retention_status(topic)[0].segments_removed >= 1
        assert sum(s.lost_events for s in client.describe_share_group("fast", topic)) == 0
        slow = client.describe_share_group("slow", topic)
        with client.connection() as conn:
            kept = conn.execute(
                f"SELECT count(*) FROM pgstreams.topic_{client.topic_record(topic).id}").fetchone()[0]
        # the slow group lost every removed event but the one it holds
        assert sum(s.lost_events for s in slow) == 2 * SEG + 10 - kept - 1


def test_a_frontier_moved_by_another_session_or_rolled_back_is_not_found_by_a_stale_row_hint(
        client: pgstreams.Client, dsn: str) -> None:
    """An acquisition finds a partition's frontier row where its session left the current version
    (migration 0023): a version another session replaced since, or one of a transaction that rolled back,
    must not be taken for it. Sessions taking turns on one partition acquire every event once, in order."""
    client.create_topic("t", 1)
    client.publish_many("t", [{"value": i} for i in range(40)])
    client.share_consumer("t", "g")  # creates the group's rows
    topic_id = client.topic_record("t").id
    store = client.store.shares

    def take(conn: psycopg.Connection, owner: str, n: int = 5) -> list[int]:
        rows = store.acquire(conn, "g", topic_id, [0], owner=owner, max_events=n, lock_timeout=600,
                             max_deliveries=5, dead_letter=False, ordered=False, window=1000, expired=False)
        return [int(r[1]) for r in rows]

    with psycopg.connect(dsn, autocommit=True) as a, psycopg.connect(dsn, autocommit=True) as b:
        taken = [take(a, "a"), take(a, "a")]  # a's hint follows its own updates
        taken.append(take(b, "b"))  # b replaces the version a's hint points at
        taken.append(take(a, "a"))  # a finds the current version by key
        with a.transaction():
            rolled_back = take(a, "a")  # the hint moves to a version that is rolled back
            raise psycopg.Rollback()
        taken.append(take(a, "a"))  # the same events again: the frontier and the hint went back
        assert taken[-1] == rolled_back
        taken.append(take(b, "b"))
        taken.append(take(a, "a"))
        taken.append(take(a, "a", 100))
    positions = [p for batch in taken for p in batch]
    assert positions == sorted(positions) and len(set(positions)) == 40 == len(positions)
    assert all(len(batch) == 5 for batch in taken[:-1])


def test_a_lock_that_expired_long_ago_is_found_by_a_full_search_not_by_a_windowed_one(
        client: pgstreams.Client, dsn: str) -> None:
    """The search for expired locks looks back ``expired_window`` seconds when given (migration 0026: the
    searches between full ones), and at every expired lock otherwise: a lock (of a batch and of a single
    event) that expired an hour ago is left by a windowed search and taken by a full one."""
    client.create_topic("t", 1)
    client.publish_many("t", [{"value": i} for i in range(6)])
    client.share_consumer("t", "g")  # creates the group's rows
    topic_id = client.topic_record("t").id
    store = client.store.shares

    def take(conn: psycopg.Connection, n: int, **kw: object) -> list[int]:
        rows = store.acquire(conn, "g", topic_id, [0], owner="o", max_events=n, lock_timeout=600,
                             max_deliveries=5, dead_letter=False, ordered=False, window=1000,
                             **kw)  # type: ignore[arg-type]
        return [int(r[1]) for r in rows]

    with psycopg.connect(dsn, autocommit=True) as conn:
        batch = take(conn, 3, expired=False)  # one batch row
        single = take(conn, 3, expired=False)
        assert len(batch) == 3 and len(single) == 3
        # the single events' batch becomes one row per event (a release makes it), then both kinds of row
        # are taken to have expired an hour ago
        store.settle(conn, "g", topic_id, "o", "l", [(0, single[0], 1, single[0])], delay=3600,
                     lock_timeout=600, max_deliveries=5)
        conn.execute("UPDATE pgstreams.share_events SET until = now() - interval '1 hour' "
                     "WHERE state IN ('a', 'b')")
        kinds = dict(conn.execute(
            "SELECT state, count(*) FROM pgstreams.share_events GROUP BY state").fetchall())
        assert kinds == {"b": 1, "a": 2, "r": 1}, kinds
        # windowed: nothing (the released one is delayed an hour)
        assert take(conn, 10, expired=True, expired_window=5.0) == []
        # full: both expired rows' events, each delivered again
        again = take(conn, 10, expired=True)
        assert sorted(again) == sorted(batch + single[1:])
