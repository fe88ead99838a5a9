"""The database-wide status (``Client.status``) and the Prometheus collectors registered in an
application's own registry."""

from __future__ import annotations

import os
import threading

import psycopg
import pytest
from prometheus_client import CollectorRegistry, generate_latest

import pgstreams
from _obs_helpers import samples, value
from pgstreams.metrics import StatusCollector, WorkerCollector

#: Each status test also runs with its read split over two connections (the path of a read with many
#: topics to read again: sizes and lag sent first on a second connection).
SPLIT = pytest.mark.parametrize("split", [False, True], ids=["one-connection", "two-connections"])


def _split(client: pgstreams.Client, split: bool) -> None:
    client.store.status.split_from = 1 if split else 1_000_000


def _setup(client: pgstreams.Client) -> None:
    client.create_topic("orders", 3)
    client.publish_many("orders", [{"value": i, "key": f"k{i}", "partition": i % 3} for i in range(30)])
    consumer = client.consumer("orders", "billing")
    got = consumer.poll(max_events=4, timeout=5)
    assert got
    consumer.commit()
    client.create_topic("orders.dlt", 1)
    client.publish("orders.dlt", {"dead": 1})


@SPLIT
def test_status_reports_every_partition_group_and_dead_letter_topic(dsn: str, split: bool) -> None:
    with pgstreams.connect(dsn) as client:
        _split(client, split)
        _setup(client)
        snap = client.status()
        assert {t.topic: (t.partitions, t.dead_letter) for t in snap.topics} == {
            "orders": (3, False), "orders.dlt": (1, True)}
        assert all(t.bytes > 0 for t in snap.topics)
        parts = {(p.topic, p.partition): p for p in snap.partitions}
        assert [parts[("orders", p)].events for p in range(3)] == [10, 10, 10]
        assert all(p.published == p.events for p in snap.partitions)
        desc = {p.partition: p.head for p in client.describe_topic("orders").partition_info}
        assert {p: parts[("orders", p)].head for p in range(3)} == desc
        lags = {g.partition: g for g in snap.groups if g.group == "billing"}
        described = {s.partition: s.lag for s in client.describe_group("billing")}
        assert {p: g.lag for p, g in lags.items()} == described
        assert sum(g.lag for g in lags.values()) == 30 - 4
        assert all(g.lag_seconds >= 0 for g in lags.values())
        assert all((g.lag_seconds > 0) == (g.lag > 0) for g in lags.values())
        assert snap.taken_at.tzinfo is not None and snap.duration > 0


def test_collector_in_an_application_registry_exports_the_status(dsn: str) -> None:
    with pgstreams.connect(dsn) as client:
        _setup(client)
        registry = CollectorRegistry()
        registry.register(StatusCollector(client, min_interval=0))
        text = generate_latest(registry).decode()
        assert value(text, "pgstreams_up") == 1
        assert value(text, "pgstreams_topic_partitions", topic="orders") == 3
        assert value(text, "pgstreams_partition_events", topic="orders", partition="1") == 10
        assert value(text, "pgstreams_partition_events_published_total", topic="orders", partition="1") == 10
        assert value(text, "pgstreams_dead_letters", topic="orders.dlt") == 1
        assert value(text, "pgstreams_dead_letters", topic="orders") is None
        lag = sum(v for (n, labels), v in samples(text).items() if n == "pgstreams_group_lag_events"
                  and ("group", "billing") in labels)
        assert lag == 26
        # a topic's size shared among its partitions by stored events (equal here: 10 each)
        size = value(text, "pgstreams_topic_size_bytes", topic="orders")
        shares = [value(text, "pgstreams_partition_estimated_size_bytes", topic="orders", partition=str(p))
                  for p in range(3)]
        assert size > 0 and sum(shares) == pytest.approx(size)
        assert shares == pytest.approx([size / 3] * 3)
        # counters grow with publishing
        client.publish("orders", 1, partition=1)
        text = generate_latest(registry).decode()
        assert value(text, "pgstreams_partition_events_published_total", topic="orders", partition="1") == 11
        size = value(text, "pgstreams_topic_size_bytes", topic="orders")
        shares = [value(text, "pgstreams_partition_estimated_size_bytes", topic="orders", partition=str(p))
                  for p in range(3)]
        assert shares == pytest.approx([size * 10 / 31, size * 11 / 31, size * 10 / 31])
        client.create_topic("empty", 2)  # no events yet: its size (indexes) shared evenly
        text = generate_latest(registry).decode()
        size = value(text, "pgstreams_topic_size_bytes", topic="empty")
        assert [value(text, "pgstreams_partition_estimated_size_bytes", topic="empty", partition=str(p))
                for p in range(2)] == pytest.approx([size / 2] * 2)


def test_collector_reads_the_database_at_most_once_per_interval_however_many_scrapers(dsn: str) -> None:
    now = [100.0]
    with pgstreams.connect(dsn) as client:
        _setup(client)
        calls = []

        def status() -> pgstreams.StatusSnapshot:
            calls.append(1)
            return client.status()

        collector = StatusCollector(status=status, min_interval=15, clock=lambda: now[0])
        registry = CollectorRegistry()
        registry.register(collector)
        outs: list[str] = []
        threads = [threading.Thread(target=lambda: outs.append(generate_latest(registry).decode()))
                   for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(calls) == 1 and collector.reads == 1
        assert all(value(o, "pgstreams_topic_partitions", topic="orders") == 3 for o in outs)
        now[0] += 14.9
        generate_latest(registry)
        assert len(calls) == 1
        now[0] += 0.2
        generate_latest(registry)
        assert len(calls) == 2


def test_collector_reads_when_created_so_that_no_scrape_pays_the_first_read(dsn: str) -> None:
    now = [100.0]
    with pgstreams.connect(dsn) as client:
        _setup(client)
        calls: list[pgstreams.StatusSnapshot] = []

        def status() -> pgstreams.StatusSnapshot:
            calls.append(client.status())
            return calls[-1]

        collector = StatusCollector(status=status, clock=lambda: now[0])
        assert len(calls) == 1 and collector.reads == 1, "read once when created, before any scrape"
        registry = CollectorRegistry()
        registry.register(collector)
        text = generate_latest(registry).decode()
        assert len(calls) == 1, "the first scrape (within min_interval) used the read made at creation"
        assert value(text, "pgstreams_up") == 1
        assert value(text, "pgstreams_partition_events", topic="orders", partition="2") == 10
        now[0] += collector.min_interval
        generate_latest(registry)
        assert len(calls) == 2, "a scrape after min_interval reads again"

        # the client itself: its first read (every topic) is made when the collector is created
        own = StatusCollector(client, clock=lambda: now[0])
        assert own.reads == 1 and own.failures == 0
        registry = CollectorRegistry()
        registry.register(own)
        text = generate_latest(registry).decode()
        assert own.reads == 1 and value(text, "pgstreams_topic_partitions", topic="orders") == 3

        # read_now=False: the first scrape reads
        calls.clear()
        lazy = StatusCollector(status=status, clock=lambda: now[0], read_now=False)
        assert calls == [] and lazy.reads == 0
        registry = CollectorRegistry()
        registry.register(lazy)
        generate_latest(registry)
        assert len(calls) == 1

        # a failed read at creation is logged; the first scrape reads again instead of reporting it
        answers: list[Exception | None] = [OSError("connection refused"), None]

        def flaky() -> pgstreams.StatusSnapshot:
            answer = answers.pop(0)
            if answer is not None:
                raise answer
            return client.status()

        retried = StatusCollector(status=flaky, clock=lambda: now[0])
        assert (retried.reads, retried.failures) == (1, 1)
        registry = CollectorRegistry()
        registry.register(retried)
        text = generate_latest(registry).decode()
        assert value(text, "pgstreams_up") == 1 and retried.reads == 2 and answers == []
    with pytest.raises(ValueError, match="read_now"):
        StatusCollector(status=lambda: None, read_now="yes")  # type: ignore[arg-type,return-value]


def test_collector_reports_a_failed_read_as_down_and_keeps_serving() -> None:
    def status() -> pgstreams.StatusSnapshot:
        raise OSError("connection refused")

    registry = CollectorRegistry()
    registry.register(StatusCollector(status=status, min_interval=0))
    text = generate_latest(registry).decode()
    assert value(text, "pgstreams_up") == 0


def test_collector_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="min_interval"):
        StatusCollector(status=lambda: None, min_interval=-1)  # type: ignore[arg-type,return-value]
    with pytest.raises(ValueError, match="either a client or a status"):
        StatusCollector()


def test_worker_collector_counts_handled_failed_retried_and_dead_lettered(dsn: str) -> None:
    from _core_helpers import running, until

    with pgstreams.connect(dsn) as client:
        client.create_topic("jobs", 1)
        client.publish_many("jobs", [{"value": i} for i in range(1, 11)])   # 5 and 10 fail
        worker = pgstreams.Worker(client, install_signal_handlers=False, maintenance=None)
        collector = WorkerCollector(worker)
        registry = CollectorRegistry()
        registry.register(collector)
        from obs_app import fail_fives

        worker.subscribe("jobs", "g", fail_fives, retry=pgstreams.RetryPolicy(max_attempts=2, backoff=0.01))
        member = worker.member_id
        with running(worker):
            until(lambda: worker.stats.dead_lettered == 2, 60, "two dead letters")
        text = generate_latest(registry).decode()
        assert value(text, "pgstreams_worker_events_handled_total", member=member) == 8
        assert value(text, "pgstreams_worker_events_failed_total", member=member) == 4
        assert value(text, "pgstreams_worker_events_retried_total", member=member) == 2
        assert value(text, "pgstreams_worker_events_dead_lettered_total", member=member) == 2
        handler_calls = value(text, "pgstreams_worker_handler_duration_seconds_count", member=member,
                              topic="jobs", group="g")
        assert handler_calls is not None and handler_calls >= 4  # a call per chunk delivered
        batches = value(text, "pgstreams_worker_batch_duration_seconds_count", member=member, topic="jobs",
                        group="g")
        assert batches is not None and batches >= 1


@SPLIT
def test_status_counts_match_the_group_status_across_sealed_and_removed_segments(dsn: str, split: bool
                                                                                ) -> None:
    with pgstreams.connect(dsn) as client:
        _split(client, split)
        client.create_topic("big", 2, segment_size=1000)
        for _ in range(5):
            client.publish_many("big", [{"value": i, "partition": i % 2} for i in range(500)])
        consumer = client.consumer("big", "slow")
        got = consumer.poll(max_events=300, timeout=5)
        consumer.commit()
        assert got
        client.maintain()  # seals the full segments: their counts come from statistics from now on
        snap = client.status()
        described = {s.partition: s for s in client.describe_group("slow")}
        lags = {g.partition: g.lag for g in snap.groups if g.group == "slow"}
        assert lags == {p: s.lag for p, s in described.items()}
        assert sum(lags.values()) == 2500 - len(got)
        figures = {p.partition: p.events for p in client.describe_topic("big").partition_info}
        assert {p.partition: p.events for p in snap.partitions} == figures == {0: 1250, 1: 1250}
        client.alter_topic("big", {"retention.events": 1000})
        client.maintain()  # removes the oldest sealed segments
        snap = client.status()
        parts = {p.partition: p for p in snap.partitions}
        assert sum(p.events for p in parts.values()) < 2500
        assert all(p.published == 1250 for p in parts.values())  # stored + removed: the counter never drops
        figures = {p.partition: p.events for p in client.describe_topic("big").partition_info}
        assert {p: s.events for p, s in parts.items()} == figures


@SPLIT
def test_status_figures_kept_between_reads_follow_every_change(dsn: str, split: bool) -> None:
    """A topic's figures are kept from one status read to the next only while nothing can have changed:
    an event published in a transaction still open at one read, new publishes, moved checkpoints and
    sealed segments all show in the next read."""
    with pgstreams.connect(dsn) as client:
        _split(client, split)
        client.create_topic("kept", 2, segment_size=1000)
        client.publish_many("kept", [{"value": i, "partition": i % 2} for i in range(10)])
        consumer = client.consumer("kept", "g")
        assert consumer.poll(max_events=3, timeout=5)
        consumer.commit()

        def figures() -> tuple[dict[int, tuple[int | None, int]], int, int]:
            snap = client.status()
            parts = {p.partition: (p.head, p.events) for p in snap.partitions if p.topic == "kept"}
            lag = sum(g.lag for g in snap.groups if g.group == "g")
            return parts, lag, next(t.bytes for t in snap.topics if t.topic == "kept")

        first = figures()
        assert sum(n for _, n in first[0].values()) == 10 and first[1] == 7
        assert figures() == first  # nothing changed: the same figures (kept)
        with psycopg.connect(dsn) as conn:  # a publish in a transaction open across a read
            client.publish("kept", {"late": 1}, partition=1, conn=conn)
            assert figures()[0] == first[0]  # not committed yet: not counted
            conn.commit()
        parts, lag, _ = figures()
        assert parts[1][1] == first[0][1][1] + 1 and parts[1][0] == max(
            p.head for p in client.describe_topic("kept").partition_info if p.partition == 1)
        assert lag == 8
        client.publish("kept", {"more": 1}, partition=0)
        parts, lag, _ = figures()
        assert sum(n for _, n in parts.values()) == 12 and lag == 9
        assert consumer.poll(max_events=5, timeout=5)
        consumer.commit()
        assert figures()[1] == sum(s.lag for s in client.describe_group("g"))
        client.publish_many("kept", [{"value": i, "partition": i % 2} for i in range(2000)])
        client.maintain()  # seals the full segments: their counts come from statistics from now on
        parts, lag, size = figures()
        described = {p.partition: (p.head, p.events) for p in client.describe_topic("kept").partition_info}
        assert parts == described and sum(n for _, n in parts.values()) == 2012
        assert lag == sum(s.lag for s in client.describe_group("g")) and size > first[2]


@SPLIT
def test_a_topics_size_is_read_again_after_its_max_age_or_when_its_segments_change(dsn: str, split: bool
                                                                                  ) -> None:
    with pgstreams.connect(dsn) as client:
        _split(client, split)
        client.create_topic("sized", 2, segment_size=1000)
        client.publish_many("sized", [{"value": "x" * 200} for _ in range(10)])
        status = client.store.status
        status.size_max_age = 3600.0
        before = {t.topic: t.bytes for t in client.status().topics}["sized"]
        # random bytes: nothing to compress
        client.publish_many("sized", [{"value": os.urandom(1500), "partition": i % 2} for i in range(500)])
        snap = client.status()
        # the events are counted at once; the size, read less than size_max_age ago, serves again
        assert sum(p.events for p in snap.partitions if p.topic == "sized") == 510
        assert {t.topic: t.bytes for t in snap.topics}["sized"] == before
        status.size_max_age = 0.0
        grown = {t.topic: t.bytes for t in client.status().topics}["sized"]
        assert grown > before + 500 * 1000
        # a new segment (positions past the first 1,000) makes the size read again, however young
        status.size_max_age = 3600.0
        client.publish_many("sized", [{"value": os.urandom(1500)} for _ in range(600)])
        snap = client.status()
        assert {t.topic: t.bytes for t in snap.topics}["sized"] > grown
