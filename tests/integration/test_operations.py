"""Operations against a real PostgreSQL: topic configuration, retention by whole segments, readers behind
retention, lag from segment statistics, group reset and delete, dead-letter replay."""

from __future__ import annotations

import logging
import subprocess
import sys
import threading
import time
from datetime import datetime, timedelta, timezone

import psycopg
import pytest
from psycopg.conninfo import make_conninfo
from psycopg.types.json import Jsonb

import pgstreams
from _core_helpers import take, until
from pgstreams.maintenance import Maintenance
from pgstreams.topicconfig import TOPIC_CONFIG_DEFAULTS

SEG = 1000  # the smallest segment: tests fill a few


def _segments(client: pgstreams.Client, topic: str) -> list[int]:
    tid = client.topic_record(topic, refresh=True).id
    with client.connection() as conn:
        rows = conn.execute(
            "SELECT segment FROM pgstreams.segments WHERE topic_id = %s AND removing_at IS NULL"
            " ORDER BY segment",
            (tid,),
        ).fetchall()
    return [r[0] for r in rows]


def _positions(client: pgstreams.Client, topic: str) -> list[int]:
    tid = client.topic_record(topic).id
    with client.connection() as conn:
        return [r[0] for r in conn.execute(f"SELECT position FROM pgstreams.topic_{tid} ORDER BY position")]


def _fill(client: pgstreams.Client, topic: str, n: int, **extra: object) -> None:
    client.publish_many(topic, [{"value": i, "key": f"k{i % 17}", **extra} for i in range(n)])


# -- configuration -----------------------------------------------------------------------------------
def test_every_config_key_can_be_set_altered_and_described(client: pgstreams.Client) -> None:
    client.create_topic(
        "cfg",
        1,
        config={
            "retention.ms": 3_600_000,
            "retention.events": "5000",
            "retention.bytes": 10_000_000,
            "max.message.bytes": 2048,
            "segment.events": 2000,
            "cleanup.policy": "compact,delete",
            "min.compaction.lag.ms": 1000,
            "max.compaction.lag.ms": 2000,
            "delete.retention.ms": 3000,
            "min.cleanable.dirty.ratio": 0.2,
        },
    )
    desc = client.describe_topic("cfg")
    assert desc.config == {
        "retention.ms": 3_600_000,
        "retention.events": 5000,
        "retention.bytes": 10_000_000,
        "max.message.bytes": 2048,
        "segment.events": 2000,
        "cleanup.policy": "compact,delete",
        "min.compaction.lag.ms": 1000,
        "max.compaction.lag.ms": 2000,
        "delete.retention.ms": 3000,
        "min.cleanable.dirty.ratio": 0.2,
    }
    assert desc.topic.segment_size == 2000
    assert not any(e.is_default for e in desc.config_entries)
    desc = client.alter_topic(
        "cfg",
        {"retention.ms": 60_000, "max.message.bytes": 4096},
        delete_config=["retention.bytes", "retention.events"],
    )
    assert desc.config["retention.ms"] == 60_000 and desc.config["max.message.bytes"] == 4096
    defaults = {e.name for e in desc.config_entries if e.is_default}
    assert {"retention.bytes", "retention.events"} <= defaults
    assert desc.config["retention.bytes"] == TOPIC_CONFIG_DEFAULTS["retention.bytes"]


@pytest.mark.parametrize(
    "config, key",
    [
        ({"retention.ms": "soon"}, "retention.ms"),
        ({"retention.ms": 0}, "retention.ms"),
        ({"retention.events": -5}, "retention.events"),
        ({"retention.bytes": True}, "retention.bytes"),
        ({"max.message.bytes": 0}, "max.message.bytes"),
        ({"segment.events": 10}, "segment.events"),
        ({"cleanup.policy": "compact,keep"}, "cleanup.policy"),
        ({"cleanup.policy": "keep"}, "cleanup.policy"),
        ({"min.compaction.lag.ms": -1}, "min.compaction.lag.ms"),
        ({"max.compaction.lag.ms": 0}, "max.compaction.lag.ms"),
        ({"delete.retention.ms": "a day"}, "delete.retention.ms"),
        ({"min.cleanable.dirty.ratio": 1.5}, "min.cleanable.dirty.ratio"),
        ({"min.cleanable.dirty.ratio": "half"}, "min.cleanable.dirty.ratio"),
        ({"min.compaction.lag.ms": 10, "max.compaction.lag.ms": 5}, "max.compaction.lag.ms"),
        ({"retention.hours": 1}, "retention.hours"),
    ],
)
def test_bad_config_is_refused_naming_the_key_and_changes_nothing(
    client: pgstreams.Client, config: dict, key: str
) -> None:
    with pytest.raises(pgstreams.InvalidConfig, match=key.replace(".", r"\.")):
        client.create_topic("bad", 1, config=config)
    assert [t.name for t in client.list_topics()] == []
    client.create_topic("good", 1, config={"retention.ms": 1000})
    with pytest.raises(pgstreams.InvalidConfig, match=key.replace(".", r"\.")):
        client.alter_topic("good", config)
    assert client.describe_topic("good").topic.config == {"retention.ms": 1000}


def test_segment_events_cannot_change_and_partitions_cannot_decrease(client: pgstreams.Client) -> None:
    client.create_topic("t", 2, config={"segment.events": 5000})
    with pytest.raises(pgstreams.InvalidConfig, match=r"segment\.events"):
        client.alter_topic("t", {"segment.events": 6000})
    with pytest.raises(pgstreams.InvalidArgument, match="partitions"):
        client.alter_topic("t", partitions=1)
    assert client.describe_topic("t").topic.partitions == 2


def test_publishing_beyond_max_message_bytes_fails_and_stores_nothing(client: pgstreams.Client) -> None:
    client.create_topic("small", 1, config={"max.message.bytes": 100})
    with pytest.raises(pgstreams.MessageTooLarge, match=r"max\.message\.bytes"):
        client.publish("small", b"x" * 101)
    with pytest.raises(pgstreams.MessageTooLarge, match="event 1"):
        client.publish_many("small", [{"value": b"ok"}, {"value": b"v", "headers": {"h": "y" * 100}}])
    client.publish("small", b"x" * 90, key="k")
    assert client.describe_topic("small").events == 1


def test_adding_partitions_keeps_events_and_groups_read_the_new_ones(client: pgstreams.Client) -> None:
    client.create_topic("grow", 2)
    keys = [f"key-{i}" for i in range(20)]
    for k in keys:
        client.publish("grow", k, key=k)
    before = {k: pgstreams.partition_for_key(k, 2) for k in keys}
    early = client.consumer("grow", "g")
    got = take(early, 20, commit=True)
    assert {e.value: e.partition for e in got} == before
    client.alter_topic("grow", partitions=4)
    for k in keys:
        client.publish("grow", k + "-after", key=k)
    c = client.consumer("grow", "g")  # created again: sees 4 partitions, new ones from their start
    after = take(c, 20, commit=True)
    assert {e.value: e.partition for e in after} == {
        k + "-after": pgstreams.partition_for_key(k, 4) for k in keys
    }
    assert sorted(s.partition for s in client.describe_group("g")) == [0, 1, 2, 3]
    # the events published before stay where they were
    assert {
        e.key: e.partition
        for e in pgstreams.Consumer(client, "grow", "replay").poll(100, 1)
        if not e.value.endswith("-after")
    } == before


# A publisher in a process of its own: publishes key KEY once with the topic's count as it first read it,
# then, for each line read from stdin, publishes again (single or publish_many) and prints the partition.
_PUBLISHER = """
import sys
import pgstreams
dsn, topic, key, how = sys.argv[1:5]
with pgstreams.connect(dsn) as client:
    print(client.publish(topic, "first", key=key).partition, flush=True)
    for line in sys.stdin:
        if how == "single":
            print(client.publish(topic, line.strip(), key=key).partition, flush=True)
        else:
            client.publish_many(topic, [{"value": line.strip(), "key": key}])
            print("stored", flush=True)
"""


@pytest.mark.parametrize("how", ["single", "many"])
def test_a_publisher_in_another_process_uses_the_new_partition_count(dsn: str, client: pgstreams.Client,
                                                                      how: str) -> None:
    client.create_topic("spread", 2)
    key = next(k for k in (f"k{i}" for i in range(1000))
               if pgstreams.partition_for_key(k, 8) >= 2)  # lands on a new partition once there are 8
    proc = subprocess.Popen([sys.executable, "-c", _PUBLISHER, dsn, "spread", key, how],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdin is not None and proc.stdout is not None
    try:
        assert int(proc.stdout.readline()) == pgstreams.partition_for_key(key, 2)  # its cached count: 2
        client.alter_topic("spread", partitions=8)
        # the publisher reads the topic's row again within TOPIC_CHECK_INTERVAL of publishing
        new = pgstreams.partition_for_key(key, 8)
        sent = 0

        def landed() -> bool:
            nonlocal sent
            sent += 1
            proc.stdin.write(f"after-{sent}\n")  # type: ignore[union-attr]
            proc.stdin.flush()  # type: ignore[union-attr]
            proc.stdout.readline()  # type: ignore[union-attr]
            return any(e.partition == new for e in _events(client, "spread") if e.value.startswith("after"))

        until(landed, 30, "the publisher in the other process to use 8 partitions")
        for _ in range(3):  # and it stays there
            landed()
        after = [e for e in _events(client, "spread") if e.value.startswith("after")]
        first_new = min(int(e.value.split("-")[1]) for e in after if e.partition == new)
        assert all(e.partition == new for e in after if int(e.value.split("-")[1]) >= first_new)
    finally:
        proc.stdin.close()
        proc.wait(30)
    assert proc.returncode == 0


def test_an_explicit_partition_past_the_cached_count_reads_the_topic_again(dsn: str,
                                                                          client: pgstreams.Client) -> None:
    client.create_topic("one", 2)
    client.create_topic("many", 2)
    with pgstreams.connect(dsn) as other:
        # cached with 2 partitions, just read: not read again before TOPIC_CHECK_INTERVAL
        assert other.topic_state("one").partitions == other.topic_state("many").partitions == 2
        client.alter_topic("one", partitions=4)
        client.alter_topic("many", partitions=4)
        assert other.publish("one", "single", partition=3).partition == 3
        assert other.publish_many("many", [{"value": "batch", "partition": 3}]) == 1
        with pytest.raises(pgstreams.InvalidArgument, match="partition 4 out of range"):
            other.publish("one", "no", partition=4)
    assert [e.value for e in _events(client, "one") if e.partition == 3] == ["single"]
    assert [e.value for e in _events(client, "many") if e.partition == 3] == ["batch"]


def test_a_publisher_notices_a_lower_max_message_bytes_set_elsewhere(dsn: str,
                                                                     client: pgstreams.Client) -> None:
    client.create_topic("limit", 1)
    with pgstreams.connect(dsn) as other:
        other.publish("limit", "x" * 200)  # caches the default limit
        client.alter_topic("limit", {"max.message.bytes": 100})
        refused: list[int] = []

        def refused_now() -> bool:
            try:
                other.publish("limit", "x" * 200)
            except pgstreams.MessageTooLarge as exc:
                refused.append(1)
                assert "max.message.bytes (100)" in str(exc)
            return bool(refused)

        until(refused_now, 30, "the other client to apply max.message.bytes 100")


def _events(client: pgstreams.Client, topic: str) -> list[pgstreams.Event]:
    return list(pgstreams.Consumer(client, topic, f"look-{time.monotonic_ns()}").poll(10_000, 1))


# -- retention ---------------------------------------------------------------------------------------
def test_retention_by_count_removes_only_whole_segments_past_the_policy(client: pgstreams.Client) -> None:
    client.create_topic("count", 2, config={"segment.events": SEG, "retention.events": 1500})
    _fill(client, "count", 5 * SEG + 300)
    report = client.maintain()
    positions = _positions(client, "count")
    assert report.segments_removed == 3 and report.events_removed == 3 * SEG - 1  # positions start at 1
    assert positions[0] == 3 * SEG  # whole segments: the first retained position starts one
    assert len(positions) >= 1500 and len(positions) - SEG < 1500  # one more segment would go below
    assert _segments(client, "count")[0] == 3
    assert client.maintain().segments_removed == 0  # nothing more past the policy


def test_retention_by_age_removes_segments_whose_newest_event_is_past_it(client: pgstreams.Client) -> None:
    client.create_topic("age", 1, config={"segment.events": SEG, "retention.ms": 3_600_000})
    _fill(client, "age", 3 * SEG + 10)
    tid = client.topic_record("age").id
    with client.connection() as conn:  # the first two segments' events were published two hours ago
        conn.execute(
            f"UPDATE pgstreams.topic_{tid} SET created_at = now() - interval '2 hours'"
            f" WHERE position < {2 * SEG}"
        )
        conn.execute(
            f"UPDATE pgstreams.topic_{tid} SET created_at = now() - interval '2 hours'"
            f" WHERE position >= {2 * SEG} AND position < {2 * SEG + 500}"
        )  # half of segment 2
    report = client.maintain()
    assert report.segments_removed == 2
    assert _positions(client, "age")[0] == 2 * SEG  # segment 2 stays: its newest event is recent
    status = client.retention_status("age")[0]
    assert status.retention_ms == 3_600_000 and status.oldest_position == 2 * SEG
    assert status.segments_removed == 2 and status.retention_ran_at is not None and status.bytes > 0


def test_retention_by_size_keeps_at_least_the_limit(client: pgstreams.Client) -> None:
    client.create_topic("size", 1, config={"segment.events": SEG})
    _fill(client, "size", 4 * SEG + 10, headers={"pad": "x" * 200})
    client.maintain()  # seal first to know the sizes
    total = client.retention_status("size")[0].bytes
    client.alter_topic("size", {"retention.bytes": total // 2})
    client.maintain()
    after = client.retention_status("size")[0]
    assert after.segments_removed >= 1 and after.bytes >= total // 2
    assert _positions(client, "size")[0] % SEG == 0


def test_a_consumer_behind_retention_continues_from_the_oldest_event_and_the_loss_is_visible(
    client: pgstreams.Client, caplog: pytest.LogCaptureFixture
) -> None:
    client.create_topic("lossy", 2, config={"segment.events": SEG, "retention.events": SEG})
    c = client.consumer("lossy", "slow")
    first = c.poll(10, timeout=0)
    assert first == []
    _fill(client, "lossy", 3 * SEG + 100)
    client.maintain()
    oldest = _positions(client, "lossy")[0]
    lost_before_reading = sum(s.lost_events for s in client.describe_group("slow"))
    assert lost_before_reading > 0
    with caplog.at_level(logging.WARNING, logger="pgstreams.consumer"):
        events = take(c, len(_positions(client, "lossy")), commit=True)
    assert min(e.position for e in events) == oldest
    assert c.lost_events == oldest - 1  # every event before the oldest retained one (positions from 1)
    assert any("lost" in r.getMessage() for r in caplog.records)
    statuses = client.describe_group("slow")
    assert sum(s.lost_events for s in statuses) == c.lost_events
    assert sum(s.lag for s in statuses) == 0
    # a second consumer of the group does not count the same loss again in the status
    client.consumer("lossy", "slow").poll(10, timeout=0)
    assert sum(s.lost_events for s in client.describe_group("slow")) == c.lost_events


def test_a_consumer_reading_ahead_of_retention_loses_nothing(client: pgstreams.Client) -> None:
    client.create_topic("ahead", 1, config={"segment.events": SEG, "retention.events": SEG})
    _fill(client, "ahead", 2 * SEG + 10)
    c = client.consumer("ahead", "fast")
    take(c, 2 * SEG + 10, commit=True)
    client.maintain()
    _fill(client, "ahead", 10)
    take(c, 10, commit=True)
    assert c.lost_events == 0 and sum(s.lost_events for s in client.describe_group("fast")) == 0


def _tables(client: pgstreams.Client, topic: str) -> set[str]:
    tid = client.topic_record(topic).id
    with client.connection() as conn:
        return {r[0] for r in conn.execute(
            "SELECT relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE n.nspname = 'pgstreams' AND relkind = 'r' AND relname LIKE %s", (f"topic\\_{tid}\\_s%",))}


def test_a_retention_pass_detaches_whole_segments_and_the_purge_drops_them(client: pgstreams.Client) -> None:
    client.create_topic("purged", 2, config={"segment.events": SEG, "retention.events": SEG})
    _fill(client, "purged", 4 * SEG + 10)
    tid = client.topic_record("purged").id
    report = Maintenance(client).run(purge=False)
    assert report.segments_removed == 3 and report.segments_dropped == 0
    # the events are gone from the topic at once, whole segments only; the tables wait for the purge
    assert _positions(client, "purged")[0] == 3 * SEG
    assert {f"topic_{tid}_s{s}" for s in range(3)} <= _tables(client, "purged")
    with client.connection() as conn:
        detached = conn.execute(
            "SELECT segment FROM pgstreams.segments WHERE topic_id = %s AND detached_at IS NOT NULL"
            " ORDER BY segment", (tid,)).fetchall()
        attached = conn.execute(
            "SELECT count(*) FROM pg_inherits WHERE inhparent = %s::regclass"
            " AND inhrelid::regclass::text LIKE %s", (f"pgstreams.topic_{tid}", "%\\_s0")).fetchone()
    assert [r[0] for r in detached] == [0, 1, 2] and attached == (0,)
    client.publish("purged", "still", key="k")  # publishers and readers go on
    assert client.consumer("purged", "late", start="latest").poll(10, 0.1) == []
    assert Maintenance(client).purge() == 3
    assert not {f"topic_{tid}_s{s}" for s in range(3)} & _tables(client, "purged")
    assert _segments(client, "purged")[0] == 3
    # run() purges after its pass by default (at least one segment, more while its time budget lasts)
    _fill(client, "purged", 2 * SEG)
    report = client.maintain()
    assert report.segments_dropped >= 1
    assert report.segments_removed == report.segments_dropped + report.segments_to_purge
    assert f"topic_{tid}_s3" not in _tables(client, "purged")  # oldest first


def test_a_purge_budget_leaves_detached_segments_for_the_next_pass_and_nothing_reads_them(
    client: pgstreams.Client, dsn: str
) -> None:
    client.create_topic("budget", 2, config={"segment.events": SEG, "retention.events": SEG})
    _fill(client, "budget", 5 * SEG + 10)
    tid = client.topic_record("budget").id
    c = client.consumer("budget", "g")
    c.commit(c.poll(10, timeout=1))  # a group behind retention
    report = client.maintain(purge_budget=0)  # no time left after the pass: the one drop every call makes
    assert report.segments_removed == 4
    assert (report.segments_dropped, report.segments_to_purge) == (1, 3)
    left = [s for s in range(4) if f"topic_{tid}_s{s}" in _tables(client, "budget")]
    assert left == [1, 2, 3]  # oldest first
    kept = _positions(client, "budget")
    assert kept[0] >= 4 * SEG
    # nothing reads the detached tables: they are locked against any access while the topic is read (a
    # reader touching one would fail on its lock timeout)
    with psycopg.connect(dsn, autocommit=True) as holder:
        holder.execute("BEGIN")
        for s in left:
            holder.execute(f"LOCK TABLE pgstreams.topic_{tid}_s{s} IN ACCESS EXCLUSIVE MODE")
        with pgstreams.connect(make_conninfo(dsn, options="-c lock_timeout=5000")) as reader:
            got = take(reader.consumer("budget", "late"), len(kept))
            assert sorted(e.position for e in got) == kept
            assert sum(s.lag for s in reader.describe_group("g")) == len(kept)
            assert sum(p.events for p in reader.describe_topic("budget").partition_info) == len(kept)
            assert reader.retention_status("budget")[0].segments_removed == 4
            behind = reader.consumer("budget", "g").poll(100, timeout=1)
            assert behind and behind[0].position == kept[0]  # the group behind continues from the oldest
        assert holder.execute(
            "SELECT count(*) FROM pg_inherits WHERE inhparent = %s::regclass"
            " AND inhrelid::regclass::text = ANY(%s)",
            (f"pgstreams.topic_{tid}", [f"pgstreams.topic_{tid}_s{s}" for s in left]),
        ).fetchone() == (0,)  # not partitions of the topic any more
        holder.execute("ROLLBACK")
    # the next passes drop the rest, one call at a time under the same budget
    assert client.maintain(purge_budget=0).segments_to_purge == 2
    report = client.maintain(purge_budget=None)
    assert (report.segments_dropped, report.segments_to_purge) == (2, 0)
    assert not {f"topic_{tid}_s{s}" for s in range(4)} & _tables(client, "budget")
    with pytest.raises(pgstreams.InvalidArgument, match="purge_budget"):
        client.maintain(purge_budget=-1)


def test_a_pass_checks_only_topics_whose_state_moved(client: pgstreams.Client) -> None:
    for i in range(6):
        client.create_topic(f"idle{i}", 4, config={"segment.events": SEG})
        _fill(client, f"idle{i}", SEG + 5)
    first = client.maintain()
    assert first.topics_checked == 6 and first.segments_sealed == 6
    assert client.maintain().topics_checked == 0  # nothing moved: every topic skipped
    status = client.retention_status()
    assert len(status) == 6 and all(s.retention_ran_at is not None for s in status)  # skipped = checked
    client.publish("idle3", "new")
    client.alter_topic("idle4", {"retention.events": 100_000})
    assert client.maintain().topics_checked == 2
    assert client.maintain().topics_checked == 0
    _fill(client, "idle5", SEG)  # fills segment 1: sealed by the next pass, which checks the topic
    report = client.maintain()
    assert report.topics_checked == 1 and report.segments_sealed == 1


def test_a_topic_is_checked_again_when_retention_by_age_comes_due(client: pgstreams.Client) -> None:
    client.create_topic("aging", 1, config={"segment.events": SEG, "retention.ms": 3000})
    _fill(client, "aging", 2 * SEG + 5)
    sealed_at = time.monotonic()
    assert client.maintain().segments_sealed == 2
    early = client.maintain()
    if time.monotonic() - sealed_at < 2.5:  # nothing can be due yet: skipped
        assert early.topics_checked == 0 and early.segments_removed == 0
    # no event arrives; the sealed segments' newest events pass 3 s of age and the topic is checked
    until(lambda: client.maintain().segments_removed == 2, 30, "retention by age without new events")
    assert _positions(client, "aging")[0] == 2 * SEG


def test_lag_and_counts_come_from_sealed_segments_and_stay_exact(client: pgstreams.Client) -> None:
    client.create_topic("lag", 3, config={"segment.events": SEG})
    c = client.consumer("lag", "g")
    _fill(client, "lag", 4 * SEG + 123)
    take(c, 1500, commit=True) if False else c.commit(c.poll(700, timeout=1))
    before = [(s.partition, s.lag) for s in client.describe_group("g")]
    counts = [p.events for p in client.describe_topic("lag").partition_info]
    assert client.maintain().segments_sealed == 4
    assert [(s.partition, s.lag) for s in client.describe_group("g")] == before
    assert [p.events for p in client.describe_topic("lag").partition_info] == counts
    assert sum(counts) == 4 * SEG + 123


def test_lag_of_a_checkpoint_in_a_sealed_segment_counts_at_most_one_bucket(client: pgstreams.Client) -> None:
    seg = 5000  # buckets of 5 positions (1,024 at most per segment)
    client.create_topic("buckets", 3, config={"segment.events": seg})
    _fill(client, "buckets", 2 * seg + 37)
    assert client.maintain().segments_sealed == 2
    tid = client.topic_record("buckets").id
    checkpoints = [0, 1, 2, 4, 5, 6, 9, 10, 11, 2499, 2500, 4994, 4995, 4998, 4999, 5000, 5001, 7777, 9999,
                   10000, 10010, 10037, 10040]
    with client.connection() as conn:
        index = conn.execute(
            "SELECT indexrelid FROM pg_index WHERE indrelid = %s::regclass",
            (f"pgstreams.topic_{tid}_s0",),
        ).fetchone()[0]
        for cp in checkpoints:
            for p in range(3):
                read_before = conn.execute(
                    "SELECT pg_stat_get_xact_tuples_returned(%s)", (index,)).fetchone()[0]
                lag = conn.execute("SELECT lag FROM pgstreams.partition_progress(%s, %s, %s)",
                                   (tid, p, cp)).fetchone()[0]
                read = conn.execute("SELECT pg_stat_get_xact_tuples_returned(%s)", (index,)).fetchone()[0]
                raw = conn.execute(f"SELECT count(*) FROM pgstreams.topic_{tid} WHERE partition = %s"
                                   " AND position > %s", (p, cp)).fetchone()[0]
                assert lag == raw, (cp, p)
                if cp < seg:  # the segment holding the checkpoint: one bucket of its rows at most
                    assert read - read_before <= 5, (cp, p, read - read_before)
        # a segment sealed before its buckets were recorded is counted, exactly
        conn.execute("UPDATE pgstreams.segment_partitions SET bucket_width = NULL, buckets = NULL,"
                     " bucket_events = NULL WHERE topic_id = %s AND segment = 0", (tid,))
        for cp in (0, 7, 2500, 4999):
            for p in range(3):
                lag = conn.execute("SELECT lag FROM pgstreams.partition_progress(%s, %s, %s)",
                                   (tid, p, cp)).fetchone()[0]
                raw = conn.execute(f"SELECT count(*) FROM pgstreams.topic_{tid} WHERE partition = %s"
                                   " AND position > %s", (p, cp)).fetchone()[0]
                assert lag == raw, (cp, p)
        conn.rollback()
    c = client.consumer("buckets", "g")
    for p in c.partitions:
        c.seek(p, 2501)
    assert [s.lag for s in client.describe_group("g")] == [
        n for n in _raw_lags(client, "buckets", 2500)
    ]
    assert sum(p.events for p in client.describe_topic("buckets").partition_info) == 2 * seg + 37


def _raw_lags(client: pgstreams.Client, topic: str, after: int) -> list[int]:
    tid = client.topic_record(topic).id
    with client.connection() as conn:
        return [conn.execute(f"SELECT count(*) FROM pgstreams.topic_{tid} WHERE partition = %s"
                             " AND position > %s", (p, after)).fetchone()[0]
                for p in range(client.topic_record(topic).partitions)]


def test_publish_and_poll_go_on_while_retention_runs_in_another_process(
    client: pgstreams.Client, dsn: str
) -> None:
    client.create_topic("busy", 2, config={"segment.events": SEG, "retention.events": 2 * SEG})
    c = client.consumer("busy", "g")
    stop = threading.Event()
    errors: list[BaseException] = []
    published = [0]
    received: list[tuple[int, int]] = []

    def publish() -> None:
        try:
            while not stop.is_set():
                _fill(client, "busy", 200)
                published[0] += 200
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    def consume() -> None:
        try:
            while not stop.is_set():
                got = c.poll(500, timeout=0.2)
                received.extend((e.partition, e.position) for e in got)
                c.commit(got)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=publish), threading.Thread(target=consume)]
    for t in threads:
        t.start()
    try:
        removed = 0
        deadline = time.monotonic() + 60
        while removed < 3 and time.monotonic() < deadline:
            proc = subprocess.run(
                [sys.executable, "-m", "pgstreams.cli", "maintain", "--json", "--dsn", dsn],
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert proc.returncode == 0, proc.stderr
            removed += int(__import__("json").loads(proc.stdout)["segments_removed"])
        mark = published[0]
        until(lambda: published[0] > mark + 1000, 30, "publishing goes on after retention")
        mark_rx = len(received)
        until(lambda: len(received) > mark_rx + 500, 30, "consuming goes on after retention")
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    assert not errors, errors
    assert removed >= 3
    for p in (0, 1):  # every partition read in order, each event once
        mine = [pos for part, pos in received if part == p]
        assert mine == sorted(set(mine))
    tid = client.topic_record("busy").id
    with client.connection() as conn:  # segments are dropped, never emptied row by row: no dead tuples
        conn.execute("SELECT pg_stat_force_next_flush()")
        dead = conn.execute(
            "SELECT coalesce(sum(n_dead_tup), 0) FROM pg_stat_user_tables WHERE relname LIKE %s",
            (f"topic_{tid}_s%",),
        ).fetchone()
    assert dead is not None and dead[0] == 0


# -- administration ------------------------------------------------------------------------------------
def test_reset_group_targets_and_dry_run(client: pgstreams.Client) -> None:
    client.create_topic("r", 1)
    for i in range(10):
        client.publish("r", i)
    c = client.consumer("r", "g")
    take(c, 10, commit=True)
    dry = client.reset_group("g", "r", to_earliest=True, dry_run=True)
    assert dry[0].previous == 10 and dry[0].checkpoint == 0
    assert client.describe_group("g")[0].checkpoint == 10  # dry run: nothing changed
    assert client.reset_group("g", "r", shift_by=-3)[0].checkpoint == 7
    assert client.reset_group("g", "r", shift_by=2)[0].checkpoint == 9
    assert client.reset_group("g", "r", to_position=4)[0].checkpoint == 3
    assert client.reset_group("g", "r", to_latest=True)[0].checkpoint == 10
    future = datetime.now(timezone.utc) + timedelta(hours=1)
    assert client.reset_group("g", "r", to_datetime=future)[0].checkpoint == 10
    assert client.reset_group("g", "r", to_earliest=True)[0].checkpoint == 0
    assert [e.value for e in take(client.consumer("r", "g"), 10)] == list(range(10))
    with pytest.raises(pgstreams.InvalidArgument, match="exactly one"):
        client.reset_group("g", "r", to_earliest=True, to_latest=True)


def test_reset_and_delete_are_refused_while_the_group_has_live_members(client: pgstreams.Client) -> None:
    client.create_topic("live", 1)
    client.publish("live", 1)
    seen = threading.Event()
    worker = pgstreams.Worker(client, install_signal_handlers=False, maintenance=None)
    worker.subscribe("live", "g", lambda e: seen.set())
    with worker:
        until(seen.is_set, 30, "the worker handled the event")
        with pytest.raises(pgstreams.GroupActive):
            client.reset_group("g", "live", to_earliest=True)
        with pytest.raises(pgstreams.GroupActive):
            client.delete_group("g")
    client.delete_group("g")
    with pytest.raises(pgstreams.GroupNotFound):
        client.describe_group("g")


def test_dead_letters_are_replayed_once_with_their_original_key_value_and_headers(
    client: pgstreams.Client,
) -> None:
    client.create_topic("orders", 1)
    client.create_topic("orders.dlt", 1)
    for i in range(5):
        client.publish(
            "orders.dlt",
            {"n": i},
            key=f"k{i}",
            headers={
                "trace": str(i),
                "dlt.topic": "orders",
                "dlt.error_type": "ValueError" if i % 2 else "KeyError",
            },
        )
    dry = client.replay_dead_letters("orders.dlt", dry_run=True)
    assert dry.replayed == 5 and client.describe_topic("orders").events == 0
    only = client.replay_dead_letters("orders.dlt", where_error_type="ValueError", group="values")
    assert only.replayed == 2 and only.skipped == 3
    result = client.replay_dead_letters("orders.dlt")
    assert result.replayed == 5
    again = client.replay_dead_letters("orders.dlt")  # run again: nothing more
    assert again.replayed == 0
    # the two replayed under another group before are not published twice (same replay event ids)
    got = take(client.consumer("orders", "check"), 5)
    mine = [e for e in got if e.headers.get("dlt.replayed_from", "").startswith("orders.dlt/")]
    assert len(mine) == 5
    assert {(e.key, e.value["n"], e.headers["trace"]) for e in mine} == {
        (f"k{i}", i, str(i)) for i in range(5)
    }
    assert not any(k in e.headers for e in mine for k in ("dlt.topic", "dlt.error_type"))


def test_an_interrupted_replay_run_again_replays_each_dead_letter_once(client: pgstreams.Client) -> None:
    client.create_topic("src", 1)
    client.create_topic("src.dlt", 1)
    client.publish_many("src.dlt", [{"value": i, "headers": {"dlt.topic": "src"}} for i in range(30)])
    first = client.replay_dead_letters("src.dlt", max_events=12)  # interrupted after 12
    assert first.replayed == 12
    rest = client.replay_dead_letters("src.dlt")
    assert rest.replayed == 18
    values = sorted(e.value for e in take(client.consumer("src", "check"), 30))
    assert values == list(range(30))


def test_sql_maintain_applies_retention_in_one_transaction(client: pgstreams.Client, dsn: str) -> None:
    client.create_topic("sqlret", 1, config={"segment.events": SEG, "retention.events": SEG})
    _fill(client, "sqlret", 3 * SEG + 5)
    with psycopg.connect(dsn, autocommit=True) as conn:
        summary = conn.execute("SELECT pgstreams.maintain()").fetchone()
    assert summary is not None and summary[0]["segments_removed"] == 2
    assert _positions(client, "sqlret")[0] == 2 * SEG
    with psycopg.connect(dsn, autocommit=True) as conn:  # nothing moved since: the topic is skipped
        again = conn.execute("SELECT pgstreams.maintain()").fetchone()
    assert again is not None and again[0]["topics_checked"] == 0


def test_sql_publish_enforces_max_message_bytes_and_stores_nothing(client: pgstreams.Client) -> None:
    client.create_topic("small_sql", 1, config={"max.message.bytes": 100})
    client.create_topic("default_sql", 1)
    with client.connection() as conn:
        (limit,) = conn.execute("SELECT pgstreams.max_message_bytes('{}'::jsonb)").fetchone()
        assert limit == TOPIC_CONFIG_DEFAULTS["max.message.bytes"]  # the SQL default is the Python one
        too_large = [
            ("'small_sql', %s::bytea", (b"x" * 101,)),
            ("'small_sql', 'v'::text, key => %s", ("k" * 100,)),
            ("'small_sql', 'v'::text, headers => %s::jsonb", ('{"h": "%s"}' % ("y" * 99),)),
            ("'default_sql', %s::bytea", (b"x" * (limit + 1),)),
        ]
        for args, params in too_large:
            with pytest.raises(psycopg.errors.ProgramLimitExceeded, match=r"max\.message\.bytes \(\d+\)"):
                conn.execute(f"SELECT pgstreams.publish({args})", params)
            conn.rollback()
        conn.execute("SELECT pgstreams.publish('small_sql', 'v'::text, key => 'k', headers => %s)",
                     (Jsonb({"h": "x"}),))
        conn.execute("SELECT pgstreams.publish('default_sql', %s::bytea)", (b"x" * limit,))
        conn.commit()
    assert client.describe_topic("small_sql").events == 1 and client.describe_topic("default_sql").events == 1
    client.alter_topic("small_sql", {"max.message.bytes": 1000})  # a new limit applies at once
    with client.connection() as conn:
        conn.execute("SELECT pgstreams.publish('small_sql', %s::bytea)", (b"x" * 500,))
        conn.commit()
    assert client.describe_topic("small_sql").events == 2


def test_a_running_consumer_of_every_partition_reads_partitions_added_meanwhile(
    client: pgstreams.Client,
) -> None:
    client.create_topic("widen", 2)
    consumer = client.consumer("widen", "g")  # created before the topic grows, kept running
    fixed = pgstreams.Consumer(client, "widen", "fixed", partitions=[0])
    assert consumer.poll(10, timeout=0) == []
    client.alter_topic("widen", partitions=5)
    client.publish_many("widen", [{"value": p, "partition": p} for p in range(5)])
    got: dict[int, int] = {}

    def all_partitions() -> bool:
        for e in consumer.poll(10, timeout=0.5):
            got[e.partition] = e.value
        consumer.commit()
        return sorted(got) == [0, 1, 2, 3, 4]

    until(all_partitions, timeout=10, what="the running consumer reads the new partitions")
    assert consumer.partitions == (0, 1, 2, 3, 4) and got == {p: p for p in range(5)}
    assert sorted(s.partition for s in client.describe_group("g") if s.lag == 0) == [0, 1, 2, 3, 4]
    assert fixed.poll(10, timeout=1)[0].partition == 0 and fixed.partitions == (0,)  # given partitions stay


def test_a_running_worker_group_rebalances_partitions_added_meanwhile(
    client: pgstreams.Client, dsn: str
) -> None:
    client.create_topic("wide", 2)
    handled: set[int] = set()
    lock = threading.Lock()

    def handle(ev: pgstreams.Event) -> None:
        with lock:
            handled.add(ev.value)

    opts = {"heartbeat_interval": 0.1, "session_timeout": 1.0}
    with pgstreams.connect(dsn) as other:
        a = pgstreams.Worker(client, member_id="a", install_signal_handlers=False)
        a.subscribe("wide", "g", handle, **opts)  # type: ignore[arg-type]
        b = pgstreams.Worker(other, member_id="b", install_signal_handlers=False)
        b.subscribe("wide", "g", handle, **opts)  # type: ignore[arg-type]
        a.start()
        b.start()
        try:
            def shares(n: int) -> bool:
                mine = [set(w.assignment()[("g", "wide")]) for w in (a, b)]
                return mine[0].isdisjoint(mine[1]) and sorted(mine[0] | mine[1]) == list(range(n)) and all(
                    len(m) in (n // 2, (n + 1) // 2) for m in mine)

            until(lambda: shares(2), what="1 + 1 partitions")
            client.alter_topic("wide", partitions=6)
            until(lambda: shares(6), what="3 + 3 partitions after growing to 6")
            client.publish_many("wide", [{"value": p, "partition": p} for p in range(6)])
            until(lambda: handled == set(range(6)), what="events of every partition handled")
        finally:
            a.stop(10)
            b.stop(10)


def test_a_worker_group_behind_retention_continues_from_the_oldest_event_and_the_loss_is_visible(
    client: pgstreams.Client, caplog: pytest.LogCaptureFixture
) -> None:
    client.create_topic("lossy_w", 2, config={"segment.events": SEG, "retention.events": SEG})
    client.consumer("lossy_w", "workers").poll(10, timeout=0)  # the group's checkpoints: before everything
    _fill(client, "lossy_w", 3 * SEG + 100)
    client.maintain()
    retained = _positions(client, "lossy_w")
    handled: list[int] = []
    lock = threading.Lock()

    def handle(ev: pgstreams.Event) -> None:
        with lock:
            handled.append(ev.position)

    worker = pgstreams.Worker(client, install_signal_handlers=False, maintenance=None)
    worker.subscribe("lossy_w", "workers", handle)
    with caplog.at_level(logging.WARNING, logger="pgstreams.consumer"), worker:
        until(lambda: len(handled) >= len(retained), 30, "the worker handled every retained event")
    assert sorted(handled) == retained  # from the oldest retained event on, each once
    assert sum(s.lost_events for s in client.describe_group("workers")) == retained[0] - 1
    assert any("lost" in r.getMessage() for r in caplog.records)


def test_the_prepared_poll_keeps_one_generic_plan(client: pgstreams.Client) -> None:
    """The poll (read, loss check and partition count in one statement) is planned once per connection
    (PostgreSQL keeps its generic plan), not at every poll."""
    client.create_topic("plans", 4)
    client.publish_many("plans", [{"value": i, "key": f"k{i}"} for i in range(200)])
    with client.connection() as conn:
        consumer = client.consumer("plans", "g")
        reader = consumer.reader
        for _ in range(20):  # reading, then idle polls at the head, as a consumer does
            reader.fetch(conn, 500)
        rows = conn.execute(
            "SELECT generic_plans, custom_plans FROM pg_prepared_statements"
            " WHERE statement LIKE '%%UNION ALL%%' AND statement LIKE '%%loaded_fences%%'"
        ).fetchall()
    assert len(rows) == 1
    generic, custom = rows[0]
    assert custom <= 5 and generic >= 15  # PostgreSQL tries custom plans for the first 5 executions only
