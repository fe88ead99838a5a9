"""Compacted topics against a real PostgreSQL: settings, tombstones, keyless events refused, segment rewrites
that keep positions and leave no dead tuples, the lag and tombstone rules, the pass's budget, pg_cron's
maintain(), the figures shown, and readers (a stream group, a share group, a worker) reading while
compaction rewrites segments: nothing lost, nothing repeated."""

from __future__ import annotations

import threading
from datetime import datetime, timedelta, timezone

import psycopg
import pytest
from prometheus_client import CollectorRegistry, generate_latest

import pgstreams
from _core_helpers import drain_group, drain_share
from _obs_helpers import value
from pgstreams.maintenance import Maintenance
from pgstreams.metrics import StatusCollector

SEG = 1000
COMPACT = {"cleanup.policy": "compact", "min.cleanable.dirty.ratio": 0.0}


def _table(client: pgstreams.Client, topic: str) -> str:
    return f"pgstreams.topic_{client.topic_record(topic, refresh=True).id}"


def _rows(client: pgstreams.Client, topic: str) -> list[tuple[int, str | None, bytes | None]]:
    with client.connection() as conn:
        return conn.execute(f"SELECT position, key, value FROM {_table(client, topic)}"
                            " ORDER BY position").fetchall()


def _read(client: pgstreams.Client, topic: str, group: str) -> list[pgstreams.Event]:
    consumer = client.consumer(topic, group)
    out: list[pgstreams.Event] = []
    while batch := consumer.poll(max_events=2000, timeout=0):
        out += batch
        consumer.commit()
    return out


def test_compaction_settings_are_stored_described_and_altered(client: pgstreams.Client) -> None:
    client.create_topic("c", 1, config={"cleanup.policy": "delete,compact", "min.compaction.lag.ms": "0",
                                        "max.compaction.lag.ms": 60_000, "delete.retention.ms": 1000,
                                        "min.cleanable.dirty.ratio": "0.25"})
    config = client.describe_topic("c").config
    assert config["cleanup.policy"] == "compact,delete"
    assert (config["min.compaction.lag.ms"], config["max.compaction.lag.ms"]) == (0, 60_000)
    assert (config["delete.retention.ms"], config["min.cleanable.dirty.ratio"]) == (1000, 0.25)
    desc = client.alter_topic("c", {"cleanup.policy": "compact"}, delete_config=["min.cleanable.dirty.ratio"])
    assert desc.config["cleanup.policy"] == "compact" and desc.config["min.cleanable.dirty.ratio"] == 0.5
    with pytest.raises(pgstreams.InvalidConfig, match=r"min\.compaction\.lag\.ms \(70000\) must not exceed"):
        client.alter_topic("c", {"min.compaction.lag.ms": 70_000})
    assert client.describe_topic("c").config["min.compaction.lag.ms"] == 0


def test_keyless_events_on_a_compacted_topic_are_refused_and_nothing_is_stored(client: pgstreams.Client,
                                                                                 dsn: str) -> None:
    client.create_topic("c", 2, config={"cleanup.policy": "compact"})
    client.publish("c", "kept", key="k")
    with pytest.raises(pgstreams.KeyRequired, match=r"topic 'c' is compacted .* every event needs a key"):
        client.publish("c", "no key")
    with pytest.raises(pgstreams.KeyRequired, match=r"event 1: topic 'c' is compacted"):
        client.publish_many("c", [{"value": 1, "key": "a"}, {"value": 2}, {"value": 3, "key": "b"}])
    with pytest.raises(pgstreams.KeyRequired):
        client.publish_many("c", [pgstreams.Message(i, partition=0) for i in range(3)])
    with psycopg.connect(dsn, autocommit=True) as conn, \
            pytest.raises(psycopg.errors.NullValueNotAllowed, match="every event needs a key"):
        conn.execute("SELECT pgstreams.publish('c', 'x'::text)")
    assert [r[1] for r in _rows(client, "c")] == ["k"]
    client.alter_topic("c", {"cleanup.policy": "delete"})  # a topic that is not compacted takes them again
    client.publish("c", "no key")
    assert len(_rows(client, "c")) == 2


def test_a_tombstone_has_a_key_and_no_value_wherever_it_comes_from(client: pgstreams.Client,
                                                                    dsn: str) -> None:
    client.create_topic("c", 1, config={"cleanup.policy": "compact"})
    client.publish("c", None, key="a")
    client.publish_many("c", [{"value": None, "key": "b"}, pgstreams.Message(None, key="c")])
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pgstreams.publish('c', NULL::bytea, key => 'd')")
        conn.execute("SELECT pgstreams.publish('c', NULL::jsonb, key => 'e')")
    assert [(k, v) for _, k, v in _rows(client, "c")] == [(k, None) for k in "abcde"]
    events = _read(client, "c", "g")
    assert [(e.key, e.value) for e in events] == [(k, None) for k in "abcde"]
    batch = client.consumer("c", "g2").poll_batch(max_events=10, timeout=0)
    assert list(batch.values) == [None] * 5
    # a value None without a key stays a JSON null on a topic that is not compacted
    client.create_topic("d", 1)
    client.publish("d", None)
    assert _rows(client, "d")[0][2] == b"null" and _read(client, "d", "g")[0].value is None


def test_compaction_keeps_the_latest_event_of_each_key_at_its_position_and_leaves_no_dead_tuples(
        client: pgstreams.Client) -> None:
    client.create_topic("c", 2, segment_size=SEG, config=COMPACT)
    client.publish_many("c", [{"value": i, "key": f"k{i % 40}"} for i in range(3 * SEG + 10)])
    before = {k: (p, v) for p, k, v in _rows(client, "c")}  # the last position and value of each key
    report = Maintenance(client).run()
    assert report.segments_mapped == 3 and report.segments_compacted == 3
    assert report.events_compacted == 3 * SEG - 1 - 40  # positions start at 1: segment 0 holds 999
    rows = _rows(client, "c")
    assert {k: (p, v) for p, k, v in rows} == before  # the latest of every key, where it was
    assert [p for p, _, _ in rows if p >= 3 * SEG] == list(range(3 * SEG, 3 * SEG + 11))  # the head
    tid = client.topic_record("c").id
    with client.connection() as conn:
        conn.execute("SELECT pg_stat_force_next_flush()")
        dead = conn.execute(
            "SELECT coalesce(sum(n_dead_tup), 0), coalesce(sum(n_tup_del + n_tup_upd), 0)"
            "  FROM pg_stat_user_tables WHERE schemaname = 'pgstreams' AND relname LIKE %s",
            (f"topic\\_{tid}\\_s%",)).fetchone()
        leftovers = conn.execute("SELECT count(*) FROM pg_class WHERE relname ~ %s",
                                 (f"^topic_{tid}_s[0-9]+_[cx]$",)).fetchone()[0]
    assert dead == (0, 0) and leftovers == 0
    again = Maintenance(client).run()
    assert again.segments_compacted == 0 and _rows(client, "c") == rows
    client.delete_topic("c")  # and its key map
    with client.connection() as conn:
        assert conn.execute("SELECT count(*) FROM pgstreams.compaction_keys").fetchone() == (0,)


def test_the_lag_and_tombstone_rules_follow_the_clock(client: pgstreams.Client) -> None:
    client.create_topic("c", 1, segment_size=SEG, config={
        **COMPACT, "min.compaction.lag.ms": 60_000, "delete.retention.ms": 120_000})
    client.publish_many("c", [{"value": i, "key": f"k{i % 10}"} for i in range(SEG)])
    client.publish_many("c", [{"value": None, "key": "k0"}])
    client.publish_many("c", [{"value": i, "key": "h"} for i in range(SEG)])  # seal segment 1 too
    start = datetime.now(timezone.utc)

    def at(seconds: int) -> Maintenance:
        return Maintenance(client, wall_clock=lambda: start + timedelta(seconds=seconds))

    assert at(0).run().events_compacted == 0  # nothing is older than min.compaction.lag.ms
    assert len(_rows(client, "c")) == 2 * SEG + 1
    assert at(61).run().events_compacted > 0
    keys = [k for _, k, _ in _rows(client, "c") if k != "h"]
    assert sorted(keys) == sorted(f"k{i}" for i in range(10))  # k0's tombstone is still there
    assert (None in [v for _, k, v in _rows(client, "c") if k == "k0"])
    at(121).run()
    assert "k0" not in {k for _, k, _ in _rows(client, "c")}  # the tombstone expired: k0 is gone
    status = client.retention_status("c")[0]
    assert status.tombstones_removed == 1 and status.events_compacted > 0 and status.compacted_at is not None


def test_max_compaction_lag_compacts_a_segment_below_the_dirty_ratio_once_its_oldest_event_passed_it(
        client: pgstreams.Client) -> None:
    client.create_topic("c", 1, segment_size=SEG, config={
        "cleanup.policy": "compact", "min.cleanable.dirty.ratio": 0.9, "max.compaction.lag.ms": 60_000})
    client.publish_many("c", [{"value": i, "key": f"k{i % 500}"} for i in range(SEG + 1)])  # 499 of 999
    start = datetime.now(timezone.utc)
    assert Maintenance(client, wall_clock=lambda: start).run().segments_compacted == 0
    later = start + timedelta(seconds=61)
    assert Maintenance(client, wall_clock=lambda: later).run().events_compacted == 499


def test_a_pass_spends_its_budget_and_the_next_passes_resume(client: pgstreams.Client) -> None:
    client.create_topic("c", 1, segment_size=SEG, config=COMPACT)
    client.publish_many("c", [{"value": i, "key": f"k{i % 5}"} for i in range(4 * SEG + 1)])
    first = Maintenance(client).run(compaction_budget=0)
    assert first.segments_compacted == 1 and first.segments_to_compact == 3
    done = first.segments_compacted
    while done < 4:
        done += Maintenance(client).run(compaction_budget=0).segments_compacted
    assert Maintenance(client).run().segments_compacted == 0
    # the latest of each key in the sealed segments (positions 1 to 3999), and the head (4000, 4001)
    assert len(_rows(client, "c")) == 5 + 2
    # two topics with work: each gets its first rewrite in a pass whatever the budget
    client.create_topic("d", 1, segment_size=SEG, config=COMPACT)
    client.publish_many("c", [{"value": i, "key": f"k{i % 5}"} for i in range(2 * SEG)])
    client.publish_many("d", [{"value": i, "key": f"k{i % 5}"} for i in range(2 * SEG + 1)])
    report = Maintenance(client).run(compaction_budget=0)
    assert report.segments_compacted == 2 and report.segments_to_compact >= 2
    assert {s.topic: s.segments_compacted for s in client.retention_status()} == {"c": 5, "d": 1}
    assert Maintenance(client).run(compaction_budget=None).segments_to_compact == 0
    assert Maintenance(client).run().segments_compacted == 0


def test_a_pinned_segment_is_not_rewritten_until_its_pin_runs_out(client: pgstreams.Client) -> None:
    client.create_topic("c", 1, segment_size=SEG, config=COMPACT)
    client.publish_many("c", [{"value": i, "key": f"k{i % 5}"} for i in range(SEG + 1)])
    tid = client.topic_record("c").id
    with client.connection() as conn:  # what a reader of pages (Spark's batch reads) does first
        client.store.compaction.pin(conn, tid, None)
    before = _rows(client, "c")
    assert Maintenance(client).run().segments_compacted == 0 and _rows(client, "c") == before
    with client.connection() as conn:
        conn.execute("UPDATE pgstreams.segment_pins SET until = now() - interval '1 second'")
    assert Maintenance(client).run().segments_compacted == 1 and len(_rows(client, "c")) == 5 + 2


def test_a_compaction_duty_below_one_pauses_after_each_step(client: pgstreams.Client) -> None:
    client.create_topic("c", 1, segment_size=SEG, config=COMPACT)
    client.publish_many("c", [{"value": i, "key": f"k{i % 5}"} for i in range(2 * SEG + 1)])
    maintenance = Maintenance(client)
    pauses: list[float] = []
    maintenance.sleep = pauses.append
    report = maintenance.run(compaction_duty=0.5)
    assert report.segments_mapped == 2 and report.segments_compacted == 2
    # a pause after each step: two maps, the map that found none left, two rewrites
    assert len(pauses) == 5 and all(p > 0 for p in pauses)
    assert len(_rows(client, "c")) == 5 + 2
    with pytest.raises(pgstreams.InvalidArgument, match="compaction_duty"):
        maintenance.run(compaction_duty=0)


def test_sql_maintain_compacts_in_one_transaction(client: pgstreams.Client, dsn: str) -> None:
    client.create_topic("c", 1, segment_size=SEG, config=COMPACT)
    client.publish_many("c", [{"value": i, "key": f"k{i % 3}"} for i in range(2 * SEG + 1)])
    with psycopg.connect(dsn, autocommit=True) as conn:
        summary = conn.execute("SELECT pgstreams.maintain()").fetchone()[0]
    assert summary["events_compacted"] == 2 * SEG - 1 - 3
    assert len(_rows(client, "c")) == 3 + 2
    with client.connection() as conn:  # the replaced segments are dropped by the same call
        assert conn.execute("SELECT count(*) FROM pg_class WHERE relname ~ '^topic_[0-9]+_s[0-9]+_[cx]$'"
                            ).fetchone() == (0,)


def test_describe_status_and_metrics_show_the_dirty_ratio_and_what_compaction_removed(
        client: pgstreams.Client) -> None:
    client.create_topic("c", 1, segment_size=SEG, config={**COMPACT, "min.cleanable.dirty.ratio": 0.9})
    client.publish_many("c", [{"value": i, "key": f"k{i % 400}"} for i in range(SEG + 1)])
    Maintenance(client).run()  # mapped: 599 of 999 superseded, below 0.9
    desc = client.describe_topic("c")
    assert desc.compaction is not None and desc.compaction.dirty_ratio == pytest.approx(599 / 999)
    assert desc.compaction.compacted_at is None and desc.compaction.events_removed == 0
    client.alter_topic("c", {"min.cleanable.dirty.ratio": 0.5})
    Maintenance(client).run()
    desc = client.describe_topic("c")
    assert desc.compaction is not None and desc.compaction.dirty_ratio == 0.0
    assert desc.compaction.events_removed == 599 and desc.compaction.compacted_at is not None
    assert desc.events == 400 + 2  # and the head
    topic = next(t for t in client.status().topics if t.topic == "c")
    assert topic.dirty_ratio == 0.0 and topic.events_compacted == 599 and topic.bytes_compacted > 0
    published = sum(p.published for p in client.status().partitions if p.topic == "c")
    assert published == SEG + 1  # stored and compacted away: the publish count never goes down
    registry = CollectorRegistry()
    registry.register(StatusCollector(client, min_interval=0))
    text = generate_latest(registry).decode()
    assert value(text, "pgstreams_topic_dirty_ratio", topic="c") == 0.0
    assert value(text, "pgstreams_topic_compacted_events_total", topic="c") == 599
    assert (value(text, "pgstreams_topic_compacted_bytes_total", topic="c") or 0) > 0
    assert (value(text, "pgstreams_topic_last_compaction_timestamp_seconds", topic="c") or 0) > 0
    assert value(text, "pgstreams_partition_events_published_total", topic="c", partition="0") == SEG + 1


def test_compact_delete_applies_retention_too(client: pgstreams.Client) -> None:
    client.create_topic("c", 1, segment_size=SEG, config={
        "cleanup.policy": "compact,delete", "retention.events": SEG, "min.cleanable.dirty.ratio": 0.0})
    client.publish_many("c", [{"value": i, "key": f"k{i}"} for i in range(3 * SEG + 1)])  # distinct keys
    report = Maintenance(client).run()
    assert report.segments_removed >= 1 and report.events_compacted == 0  # nothing superseded
    assert client.retention_status("c")[0].oldest_position >= SEG


def test_a_group_whose_checkpoint_points_at_a_removed_event_goes_on_from_the_next_survivor(
        client: pgstreams.Client) -> None:
    client.create_topic("c", 1, segment_size=SEG, config=COMPACT)
    client.publish_many("c", [{"value": i, "key": f"k{i % 10}"} for i in range(SEG)])
    consumer = client.consumer("c", "g")
    first = consumer.poll(max_events=5, timeout=0)
    consumer.commit()  # at position 5: superseded, removed below
    client.publish_many("c", [{"value": i, "key": f"k{i % 10}"} for i in range(SEG, 2 * SEG + 1)])
    Maintenance(client).run()
    assert first[-1].position not in {p for p, _, _ in _rows(client, "c")}
    rest = _read(client, "c", "g")
    survivors = [p for p, _, _ in _rows(client, "c")]
    assert [e.position for e in rest] == [p for p in survivors if p > first[-1].position]


def test_readers_lose_and_repeat_nothing_while_compaction_rewrites_segments(client: pgstreams.Client,
                                                                              dsn: str) -> None:
    client.create_topic("c", 2, segment_size=SEG, config=COMPACT)
    rounds, per_round = 8, SEG // 2
    done = threading.Event()
    errors: list[BaseException] = []
    stream_seen: list[tuple[int, int]] = []
    share_seen: list[tuple[int, int]] = []

    def produce() -> None:
        with pgstreams.connect(dsn) as producer:
            for r in range(rounds):
                producer.publish_many("c", [{"value": r * per_round + i, "key": f"k{i % 50}"}
                                            for i in range(per_round)])
        done.set()

    def compact() -> None:
        with pgstreams.connect(dsn) as maintainer:
            while not done.is_set():
                Maintenance(maintainer).run()
            Maintenance(maintainer).run()

    def stream() -> None:
        drain_group(dsn, "c", "g", stream_seen, done)

    def share() -> None:
        drain_share(dsn, "c", "sg", share_seen, done)

    def guard(fn: object) -> threading.Thread:
        def run() -> None:
            try:
                fn()  # type: ignore[operator]
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)
                done.set()
        t = threading.Thread(target=run)
        t.start()
        return t

    threads = [guard(f) for f in (produce, compact, stream, share)]
    for t in threads:
        t.join(120)
    assert not errors, errors
    report = Maintenance(client).run()
    assert client.retention_status("c")[0].segments_compacted > 0 or report.segments_compacted > 0
    survivors = {p for p, _, _ in _rows(client, "c")}
    for seen in (stream_seen, share_seen):
        assert len(seen) == len(set(seen))  # nothing twice
        assert survivors <= {p for _, p in seen}  # no survivor skipped
