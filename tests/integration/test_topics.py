"""Topics: create (idempotent), list, describe (counts and heads), delete (with checkpoints and ids)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import psycopg
import pytest

import pgstreams
from _core_helpers import checkpoints, take
from pgstreams import GroupNotFound, TopicConflict, TopicNotFound


def test_create_is_idempotent_and_conflicts_are_refused(client: pgstreams.Client) -> None:
    before = datetime.now(timezone.utc) - timedelta(seconds=5)
    info = client.create_topic("orders", 3)
    assert (info.name, info.partitions, info.segment_size) == ("orders", 3, pgstreams.DEFAULT_SEGMENT_SIZE)
    assert before <= info.created_at <= datetime.now(timezone.utc) + timedelta(seconds=5)
    assert info.created_at.utcoffset() == timedelta(0)
    assert client.create_topic("orders", 3) == info
    with pytest.raises(TopicConflict, match="'orders' exists with 3 partitions"):
        client.create_topic("orders", 4)
    with pytest.raises(TopicConflict, match="segment"):
        client.create_topic("orders", 3, segment_size=5000)
    assert client.list_topics() == [info]
    assert client.create_topic("small", 1, segment_size=1000).segment_size == 1000
    assert client.create_topic("small", 1, segment_size=1000).segment_size == 1000


def test_list_topics_by_name(client: pgstreams.Client) -> None:
    assert client.list_topics() == []
    for name in ["b", "a", "c.d", "A"]:
        client.create_topic(name)
    assert [t.name for t in client.list_topics()] == sorted(["b", "a", "c.d", "A"])


def test_describe_counts_events_and_heads_per_partition(client: pgstreams.Client, dsn: str) -> None:
    client.create_topic("t", 3)
    desc = client.describe_topic("t")
    assert [(p.partition, p.events, p.head) for p in desc.partition_info] == [(0, 0, None), (1, 0, None),
                                                                              (2, 0, None)]
    last: dict[int, int] = {}
    for i in range(10):
        r = client.publish("t", i, partition=i % 2)
        last[r.partition] = r.position
    desc = client.describe_topic("t")
    assert desc.name == "t" and desc.events == 10 and desc.topic.partitions == 3
    assert [(p.partition, p.events, p.head) for p in desc.partition_info] == [
        (0, 5, last[0]), (1, 5, last[1]), (2, 0, None)]
    # an uncommitted event is not counted
    with psycopg.connect(dsn) as conn:
        client.publish("t", "pending", partition=2, conn=conn)
        assert client.describe_topic("t").partition_info[2].events == 0
        conn.rollback()


def test_delete_removes_events_checkpoints_and_event_ids(client: pgstreams.Client, dsn: str) -> None:
    client.create_topic("t", 2)
    client.create_topic("keep", 1)
    client.publish("t", "x", event_id="e1")
    client.publish("keep", "y")
    for topic in ("t", "keep"):
        c = client.consumer(topic, "g")
        c.commit(take(c, 1))
    assert checkpoints(dsn, "g", "t")
    client.delete_topic("t")
    assert [t.name for t in client.list_topics()] == ["keep"]
    assert checkpoints(dsn, "g", "t") == {}
    assert checkpoints(dsn, "g", "keep")  # other topics keep theirs
    with pytest.raises(GroupNotFound):
        client.describe_group("g", topic="t")
    with psycopg.connect(dsn) as conn:
        left = conn.execute("SELECT relname FROM pg_class WHERE relname LIKE 'topic\\_1%'").fetchall()
        ids = conn.execute("SELECT count(*) FROM pgstreams.event_ids").fetchone()
        segs = conn.execute("SELECT count(*) FROM pgstreams.segments WHERE topic_id = 1").fetchone()
    assert left == [] and ids == (0,) and segs == (0,)
    with pytest.raises(TopicNotFound):
        client.delete_topic("t")
    # the name can be used again, from scratch
    client.create_topic("t", 4)
    assert not client.publish("t", "x again", event_id="e1").duplicate
    got = take(client.consumer("t", "g"), 1)
    assert [e.value for e in got] == ["x again"]


def test_another_client_sees_a_deleted_and_recreated_topic(client: pgstreams.Client, dsn: str) -> None:
    client.create_topic("t", 2)
    with pgstreams.connect(dsn) as other:
        other.publish("t", 1)  # caches the topic
        client.delete_topic("t")
        with pytest.raises(TopicNotFound):
            other.publish("t", 2)
        with pytest.raises(TopicNotFound):
            other.publish_many("t", [{"value": 2}])
        client.create_topic("t", 3)
        assert other.publish("t", 3, partition=2).partition == 2
        assert other.publish_many("t", [{"value": 4, "partition": 2}]) == 1
    assert sorted(e.value for e in take(client.consumer("t", "g"), 2)) == [3, 4]


def test_consumers_of_a_deleted_topic_get_topic_not_found(client: pgstreams.Client, dsn: str) -> None:
    client.create_topic("t", 2)
    client.publish("t", 1)
    c = client.consumer("t", "g")
    polled = take(c, 1)
    with pgstreams.connect(dsn) as other:
        cached = other.consumer("t", "h")  # the other client caches the topic
        client.delete_topic("t")
        for call in (lambda: c.poll(timeout=0), lambda: c.commit(polled), lambda: c.seek(0, 0),
                     c.seek_to_beginning, c.seek_to_end,
                     lambda: c.seek_to_time(datetime.now(timezone.utc)), lambda: cached.poll(timeout=0),
                     lambda: other.consumer("t", "h2"), lambda: other.consumer("t", "h3", start="latest")):
            with pytest.raises(TopicNotFound, match="'t'"):
                call()
        with pytest.raises(TopicNotFound, match="'t'"):
            with c.transaction() as tx:
                tx.poll(timeout=0)
        # recreated under the same name: a new consumer of the other client reads the new topic
        client.create_topic("t", 3)
        client.publish("t", "new", partition=2)
        assert [e.value for e in take(other.consumer("t", "h"), 1)] == ["new"]


def test_read_events_newest_first_before_a_position_and_a_bounded_search_by_key(
        client: pgstreams.Client) -> None:
    client.create_topic("t", 2)
    client.publish_many("t", [{"value": i, "key": f"k{i % 5}", "partition": i % 2} for i in range(40)])
    ascending = client.read_events("t", 0, limit=1000)
    positions = [e.position for e in ascending]
    assert len(positions) == 20 and positions == sorted(positions)
    # newest first, a page before a position: the events just below it, in descending order
    page = client.read_events("t", 0, before=positions[10], limit=4)
    assert [e.position for e in page] == positions[6:10][::-1]
    assert client.read_events("t", 0, before=positions[0]) == []
    with pytest.raises(pgstreams.InvalidArgument, match="not several"):
        client.read_events("t", 0, before=5, position=3)
    with pytest.raises(pgstreams.InvalidArgument, match="before must be"):
        client.read_events("t", 0, before=-1)

    # the key k0 is on partition 0 at values 0, 10, 20, 30 (and 5 .. 35 on 1); the walk is bounded by scan
    found = client.search_events("t", 0, "k0")
    assert [e.value for e in found.events] == [30, 20, 10, 0] and found.lowest_position is None
    short = client.search_events("t", 0, "k0", scan=6)  # the 6 newest events of the partition: 28 .. 38
    assert [e.value for e in short.events] == [30] and short.lowest_position == positions[14]
    further = client.search_events("t", 0, "k0", before=short.lowest_position, scan=6)
    assert [e.value for e in further.events] == [20]
    cut = client.search_events("t", 0, "k0", limit=2)  # the list is cut: go on before the last one found
    assert [e.value for e in cut.events] == [30, 20] and cut.lowest_position == cut.events[-1].position
    rest = client.search_events("t", 0, "k0", before=cut.lowest_position)
    assert [e.value for e in rest.events] == [10, 0] and rest.lowest_position is None
    assert [e.value for e in client.search_events("t", 1, "k0").events] == [35, 25, 15, 5]
    assert client.search_events("t", 1, "nope") == pgstreams.KeySearch([], 10_000, None)
    with pytest.raises(pgstreams.InvalidArgument, match="scan must be"):
        client.search_events("t", 0, "k0", scan=0)
