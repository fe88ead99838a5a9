"""The cluster layout and topics over shards: init, the check at connect, adding a shard, topics created,
altered and deleted on every shard (idempotent after a half-done run), bad input changing nothing.

Each test over a cluster also publishes several events per key and reads them back in publish order
(``read_all``): what it does to the layout keeps every key's events on one (shard, partition), in order."""

from __future__ import annotations

import uuid

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

import pgstreams
from _cluster_helpers import keyed, read_all
from _core_helpers import db_state, new_database
from pgstreams.cluster import ClusterClient, describe_cluster, init_cluster, shard_for_key, split_dsns
from pgstreams.embedded import TemporaryServer


def _ids(dsns: list[str], topic: str) -> list[tuple[int, int, int | None]]:
    """Per shard: the topic's id, partitions and span as stored there."""
    out = []
    for dsn in dsns:
        with psycopg.connect(dsn) as conn:
            row = conn.execute("SELECT t.id, t.partitions, c.shards FROM pgstreams.topics t LEFT JOIN "
                               "pgstreams.cluster_topics c ON c.topic_id = t.id WHERE t.name = %s",
                               (topic,)).fetchone()
            out.append(row)
    return out


def test_split_dsns_keeps_multi_host_dsns_whole() -> None:
    assert split_dsns("postgresql://a/db,postgresql://b/db") == ["postgresql://a/db", "postgresql://b/db"]
    assert split_dsns("host=a,b port=1,2 dbname=x, host=c dbname=y") == [
        "host=a,b port=1,2 dbname=x", "host=c dbname=y"]
    assert split_dsns("postgresql://h1,h2/db") == ["postgresql://h1,h2/db"]


def test_init_records_the_layout_on_every_shard_and_is_idempotent(shard_dsns: list[str]) -> None:
    done = init_cluster(shard_dsns)
    assert done.action == "created" and len(done.layout.shards) == 3
    again = init_cluster(shard_dsns)
    assert again.action == "unchanged" and again.layout == done.layout
    description = describe_cluster(shard_dsns)
    assert description.layout.cluster_id == done.layout.cluster_id
    keys = [f"k{i}" for i in range(20)]
    with pgstreams.connect(shard_dsns) as cluster:
        assert isinstance(cluster, ClusterClient)
        cluster.create_topic("kept", 2)
        cluster.publish_many("kept", keyed(keys, 3))
    assert init_cluster(shard_dsns).action == "unchanged"  # and the topic's events stay where they were
    for i, dsn in enumerate(shard_dsns):
        with psycopg.connect(dsn) as conn:
            cid, shard = conn.execute("SELECT cluster_id, shard FROM pgstreams.cluster").fetchone()
        assert (str(cid), shard) == (done.layout.cluster_id, i)
    with pgstreams.connect(shard_dsns) as cluster:
        assert isinstance(cluster, ClusterClient) and cluster.cluster_id == done.layout.cluster_id
        assert len(cluster.shards) == 3
        cluster.publish_many("kept", keyed(keys, 3, first=3))
        read_all(cluster, "kept", "g", 6 * len(keys), rounds=6)


def test_one_dsn_is_the_single_server_client(cluster_dsns: list[str],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    with pgstreams.connect(cluster_dsns[0]) as one:
        assert type(one) is pgstreams.Client
    with pgstreams.connect(cluster_dsns[:1]) as one:
        assert type(one) is pgstreams.Client
    monkeypatch.setenv("PGSTREAMS_DSN", ",".join(cluster_dsns))
    keys = [f"k{i}" for i in range(30)]
    with pgstreams.connect() as cluster:
        assert isinstance(cluster, ClusterClient) and len(cluster.shards) == 3
        cluster.create_topic("t", 2)
        cluster.publish_many("t", keyed(keys, 4))
    # a shard's DSN alone is a single server holding its keys' events, each key's in publish order
    for s, dsn in enumerate(cluster_dsns):
        with pgstreams.connect(dsn) as one:
            assert type(one) is pgstreams.Client
            mine = [k for k in keys if shard_for_key(k, 2, 3) == s]
            events = read_all(one, "t", "g", 4 * len(mine), rounds=4)
            assert sorted({e.key or "" for e in events}) == sorted(mine)


def test_a_layout_mismatch_is_refused_naming_it(cluster_dsns: list[str], shard_servers: list[TemporaryServer]
                                              ) -> None:
    a, b, c = cluster_dsns
    keys = [f"k{i}" for i in range(20)]
    with pgstreams.connect(cluster_dsns) as cluster:
        cluster.create_topic("t", 2)
        cluster.publish_many("t", keyed(keys, 3))
    with pytest.raises(pgstreams.LayoutMismatch, match=r"is shard 1 of cluster .*, not shard 0"):
        pgstreams.connect([b, a, c])
    with pytest.raises(pgstreams.LayoutMismatch, match=r"has 3 shards .* but 2 were given"):
        pgstreams.connect([a, b])
    stranger = new_database(shard_servers[0].dsn, "stray_")
    with pytest.raises(pgstreams.LayoutMismatch, match=r"shard 2 \(.*stray_.*\) belongs to no cluster"):
        pgstreams.connect([a, b, stranger])
    other = [new_database(s.dsn, "other_") for s in shard_servers[:2]]
    init_cluster(other)
    with pytest.raises(pgstreams.LayoutMismatch, match=r"shard 1 .* belongs to cluster .*, but shard 0 to"):
        pgstreams.connect([a, other[1], c])
    with pytest.raises(pgstreams.LayoutMismatch):
        describe_cluster([b, a, c])
    with pgstreams.connect(cluster_dsns) as cluster:  # the refusals changed nothing
        assert isinstance(cluster, ClusterClient)
        read_all(cluster, "t", "g", 3 * len(keys), rounds=3)


def test_bad_input_changes_nothing(shard_dsns: list[str]) -> None:
    before = [db_state(d) for d in shard_dsns]
    with pytest.raises(pgstreams.InvalidArgument, match="same database as an earlier shard"):
        init_cluster([shard_dsns[0], shard_dsns[1], shard_dsns[0]])
    with pytest.raises(pgstreams.InvalidArgument, match="at least two shards"):
        init_cluster(shard_dsns[:1])
    with pytest.raises(pgstreams.InvalidArgument, match="shard 1: invalid DSN"):
        init_cluster([shard_dsns[0], "host=x port=notaport =oops"])
    with pytest.raises(pgstreams.InvalidArgument, match="shard 1: the DSN is empty"):
        pgstreams.connect([shard_dsns[0], ""])
    with pytest.raises(pgstreams.InvalidArgument, match="list of strings"):
        pgstreams.connect(42)  # type: ignore[call-overload]
    assert [db_state(d) for d in shard_dsns] == before
    # the same bad input against a cluster holding events changes nothing either
    init_cluster(shard_dsns)
    keys = [f"k{i}" for i in range(20)]
    with pgstreams.connect(shard_dsns) as cluster:
        cluster.create_topic("t", 2)
        cluster.publish_many("t", keyed(keys, 3))
    before = [db_state(d) for d in shard_dsns]
    with pytest.raises(pgstreams.InvalidArgument, match="same database as an earlier shard"):
        init_cluster([shard_dsns[0], shard_dsns[1], shard_dsns[0]])
    with pytest.raises(pgstreams.InvalidArgument, match="shard 2: invalid DSN"):
        init_cluster([*shard_dsns[:2], "host=x port=notaport =oops"])
    with pytest.raises(pgstreams.InvalidArgument, match="shard 1: the DSN is empty"):
        pgstreams.connect([shard_dsns[0], "", shard_dsns[2]])
    assert [db_state(d) for d in shard_dsns] == before
    with pgstreams.connect(shard_dsns) as cluster:
        assert isinstance(cluster, ClusterClient)
        read_all(cluster, "t", "g", 3 * len(keys), rounds=3)


def test_a_shard_that_cannot_be_reached_is_named_without_its_password(shard_dsns: list[str]) -> None:
    init_cluster(shard_dsns)
    keys = [f"k{i}" for i in range(20)]
    with pgstreams.connect(shard_dsns) as cluster:
        cluster.create_topic("t", 2)
        cluster.publish_many("t", keyed(keys, 3))
    dead = make_conninfo(shard_dsns[2], port=1, password="s3cret-pw")
    with pytest.raises(pgstreams.ShardUnavailable, match=r"shard 2 \(postgres@127.0.0.1:1/") as err:
        pgstreams.connect([shard_dsns[0], shard_dsns[1], dead])
    assert "s3cret-pw" not in str(err.value)
    assert isinstance(err.value, pgstreams.PgStreamsError)
    with pgstreams.connect(shard_dsns) as cluster:  # reachable again: every key's events, in order
        assert isinstance(cluster, ClusterClient)
        read_all(cluster, "t", "g", 3 * len(keys), rounds=3)


def test_topics_exist_on_every_shard_with_the_same_id(cluster_dsns: list[str]) -> None:
    with pgstreams.connect(cluster_dsns) as cluster:
        assert isinstance(cluster, ClusterClient)
        # a shard's own topic sequence moved ahead: the cluster still picks one id for every shard
        with psycopg.connect(cluster_dsns[1], autocommit=True) as conn:
            conn.execute("SELECT setval(pg_get_serial_sequence('pgstreams.topics', 'id'), 41)")
        info = cluster.create_topic("orders", 4, config={"retention.ms": 3_600_000})
        assert info.partitions == 4
        assert _ids(cluster_dsns, "orders") == [(42, 4, 3)] * 3
        assert cluster.create_topic("orders", 4).partitions == 4  # idempotent
        keys = [f"k{i}" for i in range(20)]
        cluster.publish_many("orders", keyed(keys, 3))
        events = read_all(cluster, "orders", "g", 3 * len(keys), rounds=3)
        assert {e.shard for e in events} == {0, 1, 2}
        with pytest.raises(pgstreams.TopicConflict, match="exists with 4 partitions, not 2"):
            cluster.create_topic("orders", 2)
        described = cluster.alter_topic("orders", {"retention.ms": 60_000}, partitions=6)
        assert described.span == 3 and all(d.topic.partitions == 6 for d in described.shards)
        for dsn in cluster_dsns:
            with pgstreams.connect(dsn) as one:
                assert one.describe_topic("orders").config["retention.ms"] == 60_000
        cluster.delete_topic("orders")
        assert _ids(cluster_dsns, "orders") == [None] * 3
        with pytest.raises(pgstreams.TopicNotFound):
            cluster.delete_topic("orders")


def test_a_half_done_topic_operation_completes_when_run_again(cluster_dsns: list[str]) -> None:
    with pgstreams.connect(cluster_dsns) as cluster:
        assert isinstance(cluster, ClusterClient)
        # creation that reached shard 0 only
        cluster.shards[0].store.cluster.create_topic(7, "half", 2, pgstreams.DEFAULT_SEGMENT_SIZE, {}, 3)
        cluster.create_topic("half", 2)
        assert _ids(cluster_dsns, "half") == [(7, 2, 3)] * 3
        keys = [f"k{i}" for i in range(20)]
        cluster.publish_many("half", keyed(keys, 3))
        read_all(cluster, "half", "g", 3 * len(keys), rounds=3)
        # deletion that reached shard 1 only
        cluster.shards[1].delete_topic("half")
        cluster.delete_topic("half")
        assert _ids(cluster_dsns, "half") == [None] * 3
        # alteration that reached shard 0 only
        cluster.create_topic("grow", 2)
        cluster.shards[0].alter_topic("grow", partitions=3)
        assert cluster.alter_topic("grow", partitions=3).shards[2].topic.partitions == 3
        cluster.publish_many("grow", keyed(keys, 3))
        read_all(cluster, "grow", "g", 3 * len(keys), rounds=3)


def test_adding_a_shard_never_moves_an_existing_topics_keys(cluster_dsns: list[str],
                                                            shard_servers: list[TemporaryServer]) -> None:
    keys = [f"k{i}" for i in range(200)]
    with pgstreams.connect(cluster_dsns) as cluster:
        assert isinstance(cluster, ClusterClient)
        cluster.create_topic("old", 4)
        cluster.publish_many("old", keyed(keys, 2))
        before = {k: cluster.publish("old", {"k": k, "n": 2}, key=k) for k in keys}
    fourth = new_database(shard_servers[0].dsn, "shard_added_")
    done = init_cluster([*cluster_dsns, fourth])
    assert done.action == "extended" and done.added == (3,)
    with pytest.raises(pgstreams.LayoutMismatch, match="has 4 shards"):
        pgstreams.connect(cluster_dsns)
    with pgstreams.connect([*cluster_dsns, fourth]) as cluster:
        assert isinstance(cluster, ClusterClient)
        assert cluster.topic("old").span == 3  # kept its shards; created, empty, on the new one
        assert _ids([fourth], "old")[0][2] == 3
        after = {k: cluster.publish("old", {"k": k, "n": 3}, key=k) for k in keys}
        assert {k: (r.shard, r.partition) for k, r in after.items()} == {
            k: (r.shard, r.partition) for k, r in before.items()}
        cluster.publish_many("old", keyed(keys, 2, first=4))
        # each key's events from before and after the new shard: one (shard, partition), in publish order
        events = read_all(cluster, "old", "g", 6 * len(keys), rounds=6)
        assert {e.shard for e in events} == {0, 1, 2}
        cluster.create_topic("new", 4)
        assert cluster.topic("new").span == 4
        shards = {cluster.publish("new", {"k": k, "n": 0}, key=k).shard for k in keys}
        assert shards == {0, 1, 2, 3}
        cluster.publish_many("new", keyed(keys, 2, first=1))
        assert {e.shard for e in read_all(cluster, "new", "g", 3 * len(keys), rounds=3)} == {0, 1, 2, 3}


def test_a_server_used_alone_becomes_shard_0_keeping_its_topics(shard_dsns: list[str]) -> None:
    keys = ["a", "b", "c", "d"]
    with pgstreams.connect(shard_dsns[0]) as alone:
        alone.create_topic("legacy", 3)
        alone.publish_many("legacy", keyed(keys, 2))
        placed = {k: alone.publish("legacy", {"k": k, "n": 2}, key=k).partition for k in keys}
    with pgstreams.connect(shard_dsns[1]) as other:
        other.create_topic("elsewhere")
    with pytest.raises(pgstreams.LayoutMismatch, match=r"shard 1 .* holds topics already"):
        init_cluster(shard_dsns)
    with pgstreams.connect(shard_dsns[1]) as other:
        other.delete_topic("elsewhere")
    init_cluster(shard_dsns)
    with pgstreams.connect(shard_dsns) as cluster:
        assert isinstance(cluster, ClusterClient)
        assert cluster.topic("legacy").span == 1
        for k, p in placed.items():
            r = cluster.publish("legacy", {"k": k, "n": 3}, key=k)
            assert (r.shard, r.partition) == (0, p)
        cluster.publish_many("legacy", keyed(keys, 2, first=4))
        # each key's events from before and after the server became a shard, in publish order
        events = read_all(cluster, "legacy", "g", 6 * len(keys), rounds=6)
        assert {e.shard for e in events} == {0}


def test_shard_for_key_with_the_partition_is_kafkas_partitioner_over_every_partition() -> None:
    for key in (f"key-{i}" for i in range(500)):
        shard = shard_for_key(key, 4, 3)
        partition = pgstreams.partition_for_key(key, 4)
        assert shard * 4 + partition == pgstreams.partition_for_key(key, 12)
    assert shard_for_key("x", 8, 1) == 0
    with pytest.raises(pgstreams.InvalidArgument):
        shard_for_key(3, 4, 3)  # type: ignore[arg-type]


def test_describe_names_each_shards_topics(cluster_dsns: list[str]) -> None:
    topic = f"t-{uuid.uuid4().hex[:6]}"
    keys = [f"k{i}" for i in range(20)]
    with pgstreams.connect(cluster_dsns) as cluster:
        cluster.create_topic(topic, 2)
        cluster.publish_many(topic, keyed(keys, 3))
    description = describe_cluster(cluster_dsns)
    assert [s.topics for s in description.shards] == [1, 1, 1]
    assert all(span == 3 for s in description.shards for _, span in s.spans)
    with pgstreams.connect(cluster_dsns) as cluster:
        assert isinstance(cluster, ClusterClient)
        read_all(cluster, topic, "g", 3 * len(keys), rounds=3)
