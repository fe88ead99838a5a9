"""Consuming: polling, committing, at-least-once redelivery, partition subsets, and the wait path."""

from __future__ import annotations

import threading
import time

import psycopg
import pytest
from psycopg import sql

import pgstreams
from _core_helpers import take, wait_until
from pgstreams import CommitOutcome


def test_commit_stores_the_position_after_the_last_poll(client: pgstreams.Client) -> None:
    client.create_topic("t", 2)
    for i in range(6):
        client.publish("t", i, partition=i % 2)
    c = client.consumer("t", "g")
    assert c.committed() == {0: None, 1: None}
    got = take(c, 6)
    assert c.commit(got) is CommitOutcome.STORED
    assert c.committed() == {p: max(e.position for e in got if e.partition == p) for p in (0, 1)}
    assert c.commit(got) is CommitOutcome.IGNORED  # the same events again: already stored
    assert c.poll(timeout=0) == []
    assert c.commit() is CommitOutcome.IGNORED  # an empty poll commits nothing
    assert c.commit([]) is CommitOutcome.IGNORED
    # without arguments, commit() stores the position after the last poll's events
    last = client.publish("t", "last", partition=1)
    c2 = client.consumer("t", "g")
    polled = c2.poll(max_events=10, timeout=5)
    assert [e.position for e in polled] == [last.position]
    assert c2.commit() is CommitOutcome.STORED
    assert c2.committed()[1] == last.position
    status = {s.partition: s for s in client.describe_group("g")}
    assert all(s.lag == 0 and s.checkpoint == c2.committed()[p] for p, s in status.items())


def test_uncommitted_events_are_delivered_again(client: pgstreams.Client) -> None:
    client.create_topic("t", 1)
    for i in range(10):
        client.publish("t", i)
    c = client.consumer("t", "g")
    first = c.poll(max_events=4, timeout=5)
    c.commit(first[:2])
    assert [e.value for e in c.poll(max_events=2, timeout=5)] == [4, 5]  # the consumer moves on
    again = take(client.consumer("t", "g"), 8)  # a restart resumes after the checkpoint
    assert [e.value for e in again] == list(range(2, 10))


def test_max_events_and_no_partition_starves(client: pgstreams.Client) -> None:
    client.create_topic("t", 3)
    client.publish_many("t", [{"value": i, "partition": i % 3} for i in range(300)])
    c = client.consumer("t", "g")
    seen_parts: list[set[int]] = []
    for _ in range(6):
        got = c.poll(max_events=10, timeout=5)
        assert 1 <= len(got) <= 10
        seen_parts.append({e.partition for e in got})
        c.commit()
    assert set().union(*seen_parts[:3]) == {0, 1, 2}
    rest = take(c, 300 - 60, commit=True)
    for p in range(3):
        values = [e.value for e in rest if e.partition == p]
        assert values == sorted(values)


def test_consumer_of_a_partition_subset(client: pgstreams.Client) -> None:
    client.create_topic("t", 4)
    client.publish_many("t", [{"value": i, "partition": i % 4} for i in range(40)])
    c = pgstreams.Consumer(client, "t", "g", partitions=[1, 3])
    got = take(c, 20, commit=True)
    assert {e.partition for e in got} == {1, 3}
    lags = {s.partition: s.lag for s in client.describe_group("g")}
    assert lags == {1: 0, 3: 0}


def test_events_published_right_after_a_notification_wake_the_consumer_too(dsn: str) -> None:
    # the first publish after a pause sends the notification itself; those right after it (within the
    # notifier's interval) are announced by the notifier a moment later: none may wait for the fallback
    client = pgstreams.connect(dsn, poll_interval=60)
    client.create_topic("t", 1)
    c = client.consumer("t", "g")
    assert c.poll(timeout=0) == []
    with psycopg.connect(dsn, autocommit=True) as probe:
        wait_until(lambda: probe.execute(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE datname = current_database() AND query LIKE 'LISTEN %'"
        ).fetchone() == (1,), 10, "the listener")
    timeout = 10.0
    for round_ in range(3):
        started = threading.Event()

        def publish(n: int = round_, started: threading.Event = started) -> None:
            started.wait(10)
            time.sleep(0.2)  # workload: publish while the consumer is waiting
            for i in range(3):
                client.publish("t", [n, i])

        t = threading.Thread(target=publish)
        t.start()
        t0 = time.monotonic()
        started.set()
        got: list[object] = []
        while len(got) < 3 and time.monotonic() - t0 < timeout:
            batch = c.poll(timeout=timeout)
            got += [e.value for e in batch]
            c.commit()
        elapsed = time.monotonic() - t0
        t.join()
        assert got == [[round_, 0], [round_, 1], [round_, 2]]
        assert elapsed < timeout * 0.5, f"{elapsed:.2f}s to see three events published while waiting"
    client.close()


def test_poll_wakes_promptly_when_an_event_is_published(dsn: str) -> None:
    # fallback polling only every 60 s: an early return within the 10 s timeout proves the notification
    client = pgstreams.connect(dsn, poll_interval=60)
    client.create_topic("t", 1)
    c = client.consumer("t", "g")
    assert c.poll(timeout=0) == []
    with psycopg.connect(dsn, autocommit=True) as probe:
        wait_until(lambda: probe.execute(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE datname = current_database() AND query LIKE 'LISTEN %'"
        ).fetchone() == (1,), 10, "the listener")
    timeout = 10.0
    for round_ in range(3):
        started = threading.Event()

        def publish(n: int = round_, started: threading.Event = started) -> None:
            started.wait(10)
            time.sleep(0.2)  # workload: publish while the consumer is waiting
            client.publish("t", n)

        t = threading.Thread(target=publish)
        t.start()
        t0 = time.monotonic()
        started.set()
        got = c.poll(timeout=timeout)
        elapsed = time.monotonic() - t0
        t.join()
        assert [e.value for e in got] == [round_]
        assert elapsed < timeout * 0.5, f"poll took {elapsed:.2f}s to see an event published while waiting"
        c.commit()
    client.close()


def test_poll_falls_back_to_polling_without_notifications(dsn: str) -> None:
    with pgstreams.connect(dsn, poll_interval=0.1) as client:
        client.create_topic("t", 1)
        c = client.consumer("t", "g")
        timeout = 10.0
        with psycopg.connect(dsn, autocommit=True) as other:
            def insert() -> None:
                time.sleep(0.2)  # workload: write while the consumer is waiting
                # a writer that does not notify (a plain INSERT)
                other.execute(sql.SQL("INSERT INTO {} (partition, kind, value) VALUES (0, 's', 'raw')")
                              .format(sql.Identifier("pgstreams", "topic_1")))

            t = threading.Thread(target=insert)
            t0 = time.monotonic()
            t.start()
            got = c.poll(timeout=timeout)
            elapsed = time.monotonic() - t0
            t.join()
        assert [e.value for e in got] == ["raw"]
        assert elapsed < timeout * 0.5


def test_poll_sees_events_released_by_the_fence_holder_ending(client: pgstreams.Client,
                                                              dsn: str) -> None:
    """A notification may arrive while the event is still behind the fence (an earlier publisher of the
    partition is still open); the consumer must still return soon after that transaction ends, without a
    new notification."""
    client.create_topic("t", 1)
    c = client.consumer("t", "g")
    timeout = 10.0
    with psycopg.connect(dsn) as holder:
        client.publish("t", "holding the fence", conn=holder, notify=False)
        client.publish("t", "waiting")
        assert c.poll(timeout=0.3) == []

        def release() -> None:
            time.sleep(0.2)  # workload
            holder.commit()

        t = threading.Thread(target=release)
        t0 = time.monotonic()
        t.start()
        got = c.poll(timeout=timeout)
        elapsed = time.monotonic() - t0
        t.join()
    assert [e.value for e in got] == ["holding the fence", "waiting"]
    assert elapsed < timeout * 0.5


def test_poll_returns_empty_after_its_timeout(client: pgstreams.Client) -> None:
    client.create_topic("t", 1)
    c = client.consumer("t", "g")
    t0 = time.monotonic()
    assert c.poll(timeout=0.3) == []
    assert 0.3 <= time.monotonic() - t0 < 5  # it waited for the whole timeout, and not much longer


def test_transaction_handle(client: pgstreams.Client, dsn: str) -> None:
    client.create_topic("t", 1)
    for i in range(5):
        client.publish("t", i)
    c = client.consumer("t", "g")
    with c.transaction() as tx:
        assert tx.connection.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
        a = tx.poll(max_events=2, timeout=5)
        b = tx.poll(max_events=2, timeout=5)
        assert [e.value for e in a + b] == [0, 1, 2, 3]
        assert tx.events == a + b
    assert tx.outcome is CommitOutcome.STORED
    assert c.committed()[0] == b[-1].position
    with c.transaction() as tx:
        pass
    assert tx.outcome is CommitOutcome.IGNORED
    assert [e.value for e in take(client.consumer("t", "g"), 1)] == [4]


def test_poll_batch_holds_the_same_events_as_poll_and_commits_like_them(client: pgstreams.Client) -> None:
    client.create_topic("t", 2)
    client.publish_many("t", [{"value": {"n": i}, "key": f"k{i}"} for i in range(30)]
                        + [{"value": b"raw", "key": "b"}, {"value": "text", "key": "s"}])
    events = client.consumer("t", "a").poll(max_events=100, timeout=5)
    c = client.consumer("t", "b")
    batch = c.poll_batch(max_events=100, timeout=5)
    assert isinstance(batch, pgstreams.EventBatch) and len(batch) == len(events) == 32
    assert list(batch) == events
    assert batch.values == [e.value for e in events]
    assert batch.positions == [e.position for e in events]
    assert batch.partitions == [e.partition for e in events]
    assert batch.keys == [e.key for e in events]
    assert batch.created_at == [e.created_at for e in events]
    assert batch.ends == {p: max(e.position for e in events if e.partition == p) for p in (0, 1)}
    assert c.commit() is CommitOutcome.STORED
    assert c.committed() == batch.ends
    assert not c.poll_batch(timeout=0)
    d = client.consumer("t", "d")
    assert d.commit(d.poll_batch(max_events=5, timeout=5)) is CommitOutcome.STORED
    with pytest.raises(pgstreams.InvalidArgument, match=r"partitions \[3\]"):
        client.consumer("t", "e").commit(pgstreams.EventBatch("t", [], {3: 1}))


def test_draining_a_backlog_in_batches_with_seeks_between_skips_and_repeats_nothing(
        client: pgstreams.Client) -> None:
    """Polls of full batches read the next batch ahead; a seek in between must not use it."""
    client.create_topic("t", 3)
    client.publish_many("t", [{"value": i, "key": f"k{i}"} for i in range(300)])
    c = client.consumer("t", "g")
    seen: list[int] = []
    first = c.poll_batch(max_events=50, timeout=5)
    seen.extend(first.values)
    c.commit()
    c.seek_to_beginning()  # the batch read ahead is now useless
    seen.clear()
    while batch := c.poll_batch(max_events=50, timeout=0):
        seen.extend(batch.values)
        c.commit(batch)
    assert sorted(seen) == list(range(300))


def test_a_checkpoint_stored_by_another_session_or_rolled_back_is_not_found_by_a_stale_row_hint(
        client: pgstreams.Client, dsn: str) -> None:
    """store_checkpoint() looks first where the session left the row's current version (0019): a version
    another session replaced, or one of a transaction that rolled back, must not be taken for it."""
    client.create_topic("t", 1)
    with psycopg.connect(dsn, autocommit=True) as a, psycopg.connect(dsn, autocommit=True) as b:
        (topic_id,) = a.execute("SELECT id FROM pgstreams.topics WHERE name = 't'").fetchone() or (None,)

        def store(conn: psycopg.Connection, position: int, expected: int) -> int:
            row = conn.execute("SELECT pgstreams.store_checkpoint('g', %s, 0, %s, %s)",
                               (topic_id, position, expected)).fetchone()
            assert row is not None
            return int(row[0])

        assert store(a, 10, 0) == 1  # created: a's hint points at it
        assert store(a, 12, 10) == 1
        assert store(b, 20, 12) == 1  # b replaces the version a's hint points at
        assert store(a, 30, 12) == 2  # a sees b's 20: further than it expected
        assert store(a, 30, 20) == 1
        with a.transaction():
            assert store(a, 40, 30) == 1  # the hint moves to a version that is rolled back
            raise psycopg.Rollback()
        assert store(b, 45, 40) == 3  # still 30: older than b expected
        assert store(a, 40, 30) == 1  # a's hint is back on 30's version
        assert store(b, 45, 40) == 1
        assert store(a, 50, 40) == 2
        row = a.execute("SELECT position FROM pgstreams.checkpoints WHERE group_name = 'g'").fetchall()
        assert row == [(45,)]
