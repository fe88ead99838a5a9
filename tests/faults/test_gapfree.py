"""Gap-free order under concurrent producers whose transactions stay open for random times."""

from __future__ import annotations

import random
import time
from collections import defaultdict
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor
from typing import Any

import psycopg
import pytest

import pgstreams
from _core_helpers import SPAWN, produce_worker, publish_many_worker, until
from pgstreams import CommitOutcome

PRODUCERS = 8
TX_PER_PRODUCER = 30
KEYS = [f"k{i}" for i in range(16)]


def _ident(v: dict[str, Any]) -> tuple[int, int, int]:
    return (v["p"], v["t"], v["i"])


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["threads", "processes"])
def test_concurrent_open_transactions_every_committed_event_seen_exactly_once(dsn: str, mode: str) -> None:
    client = pgstreams.connect(dsn)
    client.create_topic("gapfree", partitions=4)
    rng = random.Random(7)
    pool: Executor = (ThreadPoolExecutor(PRODUCERS) if mode == "threads"
                      else ProcessPoolExecutor(PRODUCERS, mp_context=SPAWN))
    deadline = time.monotonic() + 120
    with pool:
        futures = [pool.submit(produce_worker, dsn, "gapfree", p, TX_PER_PRODUCER, KEYS, 1000 + p, 0.15, 0.04)
                   for p in range(PRODUCERS)]
        consumer = client.consumer("gapfree", "g")
        seen: list[tuple[dict[str, Any], int]] = []  # (value, partition) in delivery order
        polls = 0
        while True:
            producers_done = all(f.done() for f in futures)
            events = consumer.poll(max_events=rng.randint(1, 50), timeout=0.1)
            polls += 1
            seen.extend((e.value, e.partition) for e in events)
            if events:
                assert consumer.commit() is CommitOutcome.STORED
            if polls % 15 == 0:  # a restart: a new consumer continues from the stored checkpoints
                consumer = client.consumer("gapfree", "g")
            if producers_done and not events:
                break
            assert time.monotonic() < deadline, "consumer did not keep up before the deadline"
        records = [r for f in futures for r in f.result()]
    # producers are done and their transactions ended: one more poll must find nothing new
    assert consumer.poll(max_events=500, timeout=0.5) == []

    committed = [v for r in records if r["commit"] for v in r["events"]]
    rolled_back = {_ident(v) for r in records if not r["commit"] for v in r["events"]}
    assert rolled_back, "the workload should include rolled-back transactions"
    assert any(len(r["events"]) > 1 for r in records if r["commit"])
    seen_ids = [_ident(v) for v, _ in seen]
    assert not rolled_back & set(seen_ids), "an event of a rolled-back transaction was delivered"
    dups = {i for i in seen_ids if seen_ids.count(i) > 1}
    assert not dups, f"delivered more than once: {sorted(dups)[:5]}"
    missing = {_ident(v) for v in committed} - set(seen_ids)
    assert not missing, f"committed but never delivered: {sorted(missing)[:5]}"
    assert len(seen_ids) == len(committed)

    # per key, each producer's events arrive in the order it published them
    per_key: dict[tuple[str, int], list[int]] = defaultdict(list)
    for v, _ in seen:
        per_key[(v["k"], v["p"])].append(v["n"])
    for (key, producer), ns in per_key.items():
        assert ns == list(range(len(ns))), f"key {key} of producer {producer} out of order: {ns}"

    # a transaction that committed before another began is read before it on their shared partitions
    order = {_ident(v): i for i, (v, _) in enumerate(seen)}
    part_of = {_ident(v): p for v, p in seen}
    txs = [r for r in records if r["commit"]]
    for a in txs:
        for b in txs:
            if a["done"] < b["begun"]:
                for va in a["events"]:
                    for vb in b["events"]:
                        if part_of[_ident(va)] == part_of[_ident(vb)]:
                            assert order[_ident(va)] < order[_ident(vb)], (va, vb)

    # a replay by a new group sees each partition in exactly the same order
    replay = client.consumer("gapfree", "replay")
    again: list[tuple[dict[str, Any], int]] = []
    while len(again) < len(seen):
        got = replay.poll(max_events=1000, timeout=5)
        assert got, "replay stopped early"
        again.extend((e.value, e.partition) for e in got)
    for p in range(4):
        assert [_ident(v) for v, q in again if q == p] == [_ident(v) for v, q in seen if q == p]
    assert sum(s.lag for s in client.describe_group("g")) == 0
    client.close()


def test_racing_publish_many_batches_every_event_seen_exactly_once_in_partition_order(dsn: str) -> None:
    """Batches stored by COPY from several processes at once interleave their positions and commit in any
    order; a consumer reading meanwhile sees every event once, in position order per partition."""
    writers, batches, size = 4, 12, 1000
    total = writers * batches * size
    with pgstreams.connect(dsn) as client:
        client.create_topic("batches", partitions=3)
        consumer = client.consumer("batches", "g")
        seen: list[tuple[tuple[int, int, int], int, int]] = []
        with ProcessPoolExecutor(writers, mp_context=SPAWN) as pool:
            futures = [pool.submit(publish_many_worker, dsn, "batches", w, batches, size, KEYS)
                       for w in range(writers)]
            deadline = time.monotonic() + 180
            while len(seen) < total and time.monotonic() < deadline:
                got = consumer.poll(max_events=50, timeout=0.5)
                seen.extend((tuple(e.value), e.partition, e.position) for e in got)
                if got:
                    assert consumer.commit(got) is CommitOutcome.STORED
            assert [f.result(timeout=60) for f in futures] == [batches * size] * writers
        assert consumer.poll(max_events=10, timeout=0.2) == []
    idents = [v for v, _, _ in seen]
    assert len(idents) == len(set(idents)) == total  # every event, once
    for p in range(3):
        positions = [pos for _, q, pos in seen if q == p]
        assert positions == sorted(positions)
        for w in range(writers):  # per writer and partition, in publishing order
            mine = [v for v, q, _ in seen if q == p and v[0] == w]
            assert mine == sorted(mine)


def test_a_batch_in_progress_holds_back_its_partitions_only(client: pgstreams.Client, dsn: str) -> None:
    """A ``publish_many`` whose COPY has drawn positions but not committed holds back the read fence of its
    partitions, not of the others. The COPY is stopped half-way by a lock on the topic's second segment,
    which its rows reach after filling the first."""
    client.create_topic("t", 3, config={"segment.events": "1000"})
    with psycopg.connect(dsn, autocommit=True) as c:
        row = c.execute("SELECT id, format('pgstreams.topic_%s_s1', id), format('pgstreams.topic_%s_seq', id)"
                        " FROM pgstreams.topics WHERE name = 't'").fetchone()
    assert row is not None
    topic_id, second, seq = row
    consumer = client.consumer("t", "g")
    first = client.publish("t", "before", partition=0)

    def fences() -> list[int]:
        with psycopg.connect(dsn, autocommit=True) as c:
            got = c.execute("SELECT pgstreams.partition_fences(%s, '{0,1,2}', %s::regclass)",
                            (topic_id, seq)).fetchone()
            assert got is not None
            return list(got[0])

    import threading

    with psycopg.connect(dsn) as locker:
        locker.execute(f"LOCK TABLE {second} IN SHARE MODE")  # stops writers, not readers
        batch = threading.Thread(target=client.publish_many, daemon=True,
                                 args=("t", [{"value": i, "partition": i % 2} for i in range(1500)]))
        batch.start()
        until(lambda: _waiting_on_lock(dsn), 60, "the batch's COPY waiting for the second segment")
        held = fences()
        # partitions 0 and 1 (the batch's) stop at the batch's first position; partition 2 is not held
        assert held[0] == held[1] == first.position + 1
        with psycopg.connect(dsn, autocommit=True) as c:
            last = c.execute("SELECT last_value FROM " + seq).fetchone()
        assert last is not None and last[0] >= 1000 and held[2] == last[0] + 1
        got = consumer.poll(max_events=100, timeout=0.5)
        assert [e.value for e in got] == ["before"]
        locker.rollback()
    batch.join(60)
    assert fences() == [fences()[0]] * 3  # nothing held back any more
    rest: list[pgstreams.Event] = []
    deadline = time.monotonic() + 30
    while len(rest) < 1500 and time.monotonic() < deadline:
        rest += consumer.poll(max_events=1000, timeout=0.5)
    assert sorted(e.value for e in rest) == list(range(1500))


def _waiting_on_lock(dsn: str) -> bool:
    with psycopg.connect(dsn, autocommit=True) as c:
        row = c.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                        " AND datname = current_database() AND query LIKE '%COPY%'").fetchone()
        return bool(row and row[0])


def test_event_of_transaction_opened_earlier_is_not_skipped(client: pgstreams.Client, dsn: str) -> None:
    """The seed-003 anomaly: a transaction takes an earlier position but commits after a later one was
    consumed and checkpointed. The earlier event must still be delivered."""
    client.create_topic("t", 1)
    consumer = client.consumer("t", "g")
    with psycopg.connect(dsn) as slow:
        first = client.publish("t", "slow", conn=slow)  # takes the earlier position, stays open
        second = client.publish("t", "fast")
        assert first.position < second.position
        # the fast event is held back while the slow transaction is open (no skip possible)
        assert consumer.poll(timeout=0.3) == []
        slow.commit()
    got = consumer.poll(timeout=5)
    got += consumer.poll(timeout=0.2)
    assert sorted(e.value for e in got) == ["fast", "slow"]
    assert consumer.commit(got) is CommitOutcome.STORED
    assert consumer.poll(timeout=0.2) == []


def test_a_transaction_open_in_another_database_holds_back_neither_polls_nor_a_latest_start(
    client: pgstreams.Client, dsn: str, empty_dsn: str
) -> None:
    """Transactions of another database on the same server cannot write this database's events: they hold
    the server-wide snapshot xmin back, but not the read fence of polls, nor the head a ``latest`` start
    is placed at."""
    client.create_topic("t", 1)
    client.publish("t", "old")
    with psycopg.connect(empty_dsn) as other:
        xid = int(other.execute("SELECT pg_current_xact_id()::text::bigint").fetchone()[0])
        latest = client.consumer("t", "from-latest", start="latest")
        client.publish("t", "new")
        with psycopg.connect(dsn, autocommit=True) as conn:
            xmin = int(conn.execute("SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint")
                       .fetchone()[0])
        assert xmin <= xid, "the other database's transaction does not hold the server-wide xmin back"
        # both events are polled while the other transaction is still open
        consumer = client.consumer("t", "from-earliest")
        got: list[str] = []
        deadline = time.monotonic() + 10
        while len(got) < 2 and time.monotonic() < deadline:
            got += [e.value for e in consumer.poll(timeout=0.5)]
        assert got == ["old", "new"]
        # the latest start was not capped at the other transaction: "old" is not delivered again
        assert [e.value for e in latest.poll(timeout=2)] == ["new"]
        other.rollback()
