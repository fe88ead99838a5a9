"""Stream groups: independence, start positions, seeking, and racing commits."""

from __future__ import annotations

import random
import threading
from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import psycopg
import pytest

import pgstreams
from _core_helpers import checkpoints
from pgstreams import CommitOutcome


def _drain(consumer: pgstreams.Consumer, expect: int | None = None, timeout: float = 5.0) -> list:
    """Poll (and commit) until ``expect`` events arrived, or until a short poll returns nothing."""
    out: list = []
    while expect is None or len(out) < expect:
        got = consumer.poll(max_events=500, timeout=timeout if expect is not None else 0.3)
        if not got:
            break
        consumer.commit(got)
        out.extend(got)
    return out


def test_groups_are_independent(client: pgstreams.Client) -> None:
    client.create_topic("t", 2)
    for i in range(20):
        client.publish("t", i, key=str(i))
    a = client.consumer("t", "a")
    b = client.consumer("t", "b")
    got_a = _drain(a, 20)
    assert sorted(e.value for e in got_a) == list(range(20))
    # b is not affected by a's progress
    got_b = b.poll(max_events=5, timeout=5)
    assert len(got_b) == 5
    b.commit(got_b)
    assert {s.partition: s.lag for s in client.describe_group("a")} == {0: 0, 1: 0}
    assert sum(s.lag for s in client.describe_group("b")) == 15
    assert sorted(e.value for e in got_b + _drain(b, 15)) == list(range(20))
    assert sorted(g.group for g in client.list_groups()) == ["a", "b"]


def test_late_group_with_earliest_replays_everything(client: pgstreams.Client) -> None:
    client.create_topic("t", 3)
    client.publish_many("t", [{"value": i, "key": f"k{i % 7}"} for i in range(300)])
    first = _drain(client.consumer("t", "early"), 300)
    client.publish_many("t", [{"value": i, "key": f"k{i % 7}"} for i in range(300, 400)])
    late = _drain(client.consumer("t", "late", start="earliest"), 400)
    assert sorted(e.value for e in late) == list(range(400))
    # the replay keeps each partition's order of the first read
    for p in range(3):
        early_p = [e.position for e in first if e.partition == p]
        assert [e.position for e in late if e.partition == p][: len(early_p)] == early_p


def test_latest_sees_only_events_published_after_it_was_created(client: pgstreams.Client) -> None:
    client.create_topic("t", 2)
    for i in range(10):
        client.publish("t", f"old{i}", key=str(i))
    consumer = client.consumer("t", "g", start="latest")
    assert consumer.poll(timeout=0.3) == []
    for i in range(6):
        client.publish("t", f"new{i}", key=str(i))
    assert sorted(e.value for e in _drain(consumer, 6)) == [f"new{i}" for i in range(6)]
    # the start only applies to a group without checkpoints: a restart continues where it was
    client.publish("t", "newer")
    assert [e.value for e in _drain(client.consumer("t", "g", start="latest"), 1)] == ["newer"]


def test_latest_on_empty_partitions_sees_the_first_events(client: pgstreams.Client) -> None:
    client.create_topic("t", 2)
    consumer = client.consumer("t", "g", start="latest")
    client.publish("t", "a", partition=0)
    client.publish("t", "b", partition=1)
    assert sorted(e.value for e in _drain(consumer, 2)) == ["a", "b"]


def test_latest_does_not_skip_a_transaction_open_when_the_group_was_created(
    client: pgstreams.Client, dsn: str
) -> None:
    client.create_topic("t", 1)
    with psycopg.connect(dsn) as open_tx:
        client.publish("t", "in-flight", conn=open_tx)  # earlier transaction, still open
        client.publish("t", "committed-before")
        consumer = client.consumer("t", "g", start="latest")
        open_tx.commit()  # committed after the group was created
    client.publish("t", "after")
    got = [e.value for e in _drain(consumer)]
    assert "in-flight" in got and "after" in got
    assert got.count("in-flight") == 1


def test_start_at_an_aware_datetime(client: pgstreams.Client) -> None:
    client.create_topic("t", 2)
    for i in range(5):
        client.publish("t", f"before{i}", key=str(i))
    after = [client.publish("t", f"after{i}", key=str(i)) for i in range(5)]
    boundary = _created_at(client, "t", after[0].position)
    probe = _drain(client.consumer("t", "probe"), 10)
    before_times = [e.created_at for e in probe if e.value.startswith("b")]
    assert max(before_times) < boundary
    # the same instant written in another zone selects the same events
    for when in (boundary, boundary.astimezone(ZoneInfo("Asia/Kolkata")),
                 boundary.astimezone(timezone(timedelta(hours=-7)))):
        group = f"g{when.utcoffset()}".replace(":", "").replace(" ", "").replace(",", "")
        got = _drain(client.consumer("t", group.replace("-", "m"), start=when), 5)
        assert sorted(e.value for e in got) == [f"after{i}" for i in range(5)]
    # a time after every event: only new events
    late = client.consumer("t", "future", start=datetime.now(timezone.utc) + timedelta(days=1))
    assert late.poll(timeout=0.2) == []
    client.publish("t", "newest")
    assert [e.value for e in _drain(late, 1)] == ["newest"]


def _created_at(client: pgstreams.Client, topic: str, position: int) -> datetime:
    c = client.consumer(topic, f"lookup{position}")
    for e in _drain(c):
        if e.position == position:
            return e.created_at
    raise AssertionError(f"position {position} not found")


def test_seek_methods(client: pgstreams.Client) -> None:
    client.create_topic("t", 1)
    results = [client.publish("t", i) for i in range(10)]
    c = client.consumer("t", "g")
    assert [e.value for e in _drain(c, 10)] == list(range(10))
    c.seek(0, results[4].position)
    assert [e.value for e in _drain(c, 6)] == list(range(4, 10))
    c.seek_to_beginning()
    assert [e.value for e in _drain(c, 10)] == list(range(10))
    c.seek(0, 0)
    assert [e.value for e in _drain(c, 10)] == list(range(10))
    c.seek(0, results[-1].position + 100)  # beyond the end: to the end
    assert c.poll(timeout=0.2) == []
    c.seek_to_beginning()
    c.seek_to_end()
    assert c.poll(timeout=0.2) == []
    client.publish("t", "x")
    assert [e.value for e in _drain(c, 1)] == ["x"]
    c.seek_to_time(_created_at(client, "t", results[7].position))
    assert [e.value for e in _drain(c, 4)] == [7, 8, 9, "x"]


def test_seek_to_a_position_delivers_every_event_at_or_after_it(client: pgstreams.Client, dsn: str) -> None:
    """Read order is the position, whatever order the publishers committed in; a seek to position P
    delivers every event from P on, and a seek beyond the head waits for new events."""
    client.create_topic("t", 1)
    with psycopg.connect(dsn) as early:
        p1 = client.publish("t", "p1", conn=early)
        p2 = client.publish("t", "p2")  # commits first
        early.commit()
    assert p1.position < p2.position
    c = client.consumer("t", "g")
    assert [e.value for e in _drain(c, 2)] == ["p1", "p2"]  # position order, not commit order
    c.seek(0, p2.position)
    assert [e.value for e in _drain(c)] == ["p2"]
    c.seek(0, p1.position)
    assert [e.value for e in _drain(c)] == ["p1", "p2"]
    c.seek(0, p2.position + 100)  # beyond the head: the next event is read
    p3 = client.publish("t", "p3")
    assert [e.value for e in _drain(c)] == ["p3"]
    assert p3.position > p2.position + 100 or p3.position == p2.position + 1


def test_two_consumers_racing_get_further_or_ignored_and_checkpoint_never_moves_back(
    client: pgstreams.Client, dsn: str
) -> None:
    client.create_topic("t", 1)
    client.publish_many("t", [{"value": i} for i in range(40)])
    # deterministic cases first
    c1 = client.consumer("t", "g")
    c2 = client.consumer("t", "g")
    e1 = c1.poll(max_events=10, timeout=5)
    e2 = c2.poll(max_events=10, timeout=5)
    assert [e.position for e in e1] == [e.position for e in e2]
    assert c1.commit() is CommitOutcome.STORED
    assert c2.commit() is CommitOutcome.IGNORED  # the same position is already stored
    assert checkpoints(dsn, "g", "t")[0] == e1[-1].position
    c3 = client.consumer("t", "g")
    ahead = c3.poll(max_events=3, timeout=5)
    assert c1.commit(c1.poll(max_events=5, timeout=5)) is CommitOutcome.STORED
    # c3 polled from the old checkpoint; committing now would move the checkpoint back
    assert c3.commit(ahead) is CommitOutcome.FURTHER
    assert checkpoints(dsn, "g", "t")[0] == e1[-1].position + 5
    # OLDER: another member seeks back; c1 still expects its own (later) checkpoint
    c2.seek_to_beginning()
    assert checkpoints(dsn, "g", "t")[0] == 0
    assert c1.commit(c1.poll(max_events=5, timeout=5)) is CommitOutcome.OLDER
    assert checkpoints(dsn, "g", "t")[0] == 0


@pytest.mark.slow
def test_racing_consumers_checkpoint_is_monotonic(client: pgstreams.Client, dsn: str) -> None:
    total = 600
    client.create_topic("t", 2)
    client.publish_many("t", [{"value": i, "key": str(i)} for i in range(total)])
    lock = threading.Lock()
    last: dict[int, int] = {}
    outcomes: list[CommitOutcome] = []
    errors: list[BaseException] = []
    observe = psycopg.connect(dsn, autocommit=True)

    def check() -> None:
        with lock:  # reads are serialised, so their order is real-time order
            rows = observe.execute(
                "SELECT partition, position FROM pgstreams.checkpoints WHERE group_name = 'g'").fetchall()
            for p, pos in rows:
                assert pos >= last.get(p, 0), f"partition {p} moved back to {pos}"
                last[p] = pos

    barrier = threading.Barrier(2)

    def member(seed: int) -> None:
        rng = random.Random(seed)
        try:
            c = client.consumer("t", "g")
            barrier.wait(30)  # both start from the same checkpoint
            for _ in range(400):
                got = c.poll(max_events=rng.randint(1, 30), timeout=0.05)
                if not got:
                    if sum(s.lag for s in client.describe_group("g")) == 0:
                        return
                    c = client.consumer("t", "g")
                    continue
                outcome = c.commit(got)
                with lock:
                    outcomes.append(outcome)
                check()
                if not outcome.ok:
                    c = client.consumer("t", "g")  # a competing member moved on: restart from the checkpoint
        except BaseException as exc:  # noqa: BLE001 - reported by the test thread
            errors.append(exc)

    threads = [threading.Thread(target=member, args=(s,)) for s in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    observe.close()
    assert not errors, errors
    assert CommitOutcome.OLDER not in outcomes
    assert set(outcomes) - {CommitOutcome.STORED} <= {CommitOutcome.FURTHER, CommitOutcome.IGNORED}
    assert {CommitOutcome.FURTHER, CommitOutcome.IGNORED} & set(outcomes), "the consumers never raced"
    assert sum(s.lag for s in client.describe_group("g")) == 0


def test_start_time_does_not_skip_a_transaction_in_progress(client: pgstreams.Client, dsn: str) -> None:
    client.create_topic("t", 1)
    client.publish("t", "before")
    with psycopg.connect(dsn, autocommit=True) as clock:
        row = clock.execute("SELECT clock_timestamp()").fetchone()
        assert row is not None
        when = row[0]
    with psycopg.connect(dsn) as early:
        early.execute("SELECT pg_current_xact_id()")  # the older transaction id
        client.publish("t", "in-flight", conn=early)  # created after `when`, not yet committed
        client.publish("t", "visible")  # created after `when`, committed, newer transaction id
        consumer = client.consumer("t", "g", start=when)
        seeker = client.consumer("t", "s")
        seeker.seek_to_time(when)
        early.commit()
    for c in (consumer, seeker):
        got = [e.value for e in _drain(c)]
        assert sorted(got) == ["in-flight", "visible"], got


def test_latest_is_exact_while_another_database_has_a_transaction_open(client: pgstreams.Client,
                                                                      server_dsn: str) -> None:
    client.create_topic("t", 1)
    with psycopg.connect(server_dsn) as elsewhere:
        elsewhere.execute("SELECT pg_current_xact_id()")  # an open write transaction in another database
        for i in range(3):
            client.publish("t", f"old{i}")  # committed with newer transaction ids
        consumer = client.consumer("t", "g", start="latest")
        client.publish("t", "new")
        assert [e.value for e in _drain(consumer)] == ["new"]
        elsewhere.rollback()
