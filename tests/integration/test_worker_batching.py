"""Batch configuration (min_events / max_events / max_wait, EventSQL's consumption config) and wake-ups.

The assembler is tested with an injected clock, step by step; the worker-level tests inject the same fake
clock and synchronise on the worker's poll counter, so "not yet delivered" is checked after the worker has
looked at the events several times, never after a sleep.
"""

from __future__ import annotations

import time

import pytest

import pgstreams
from _core_helpers import FakeClock, running, until
from pgstreams import BatchConfig, InvalidArgument, Worker
from pgstreams.worker import BatchAssembler


def _events(n: int) -> list[pgstreams.Event]:
    from datetime import datetime, timezone

    now = datetime.now(timezone.utc)
    return [pgstreams.Event("t", 0, i + 1, None, i, {}, None, None, None, None, now, 1) for i in range(n)]


# -- the assembler ------------------------------------------------------------------------------------------
def test_min_events_at_hand_is_delivered_at_once() -> None:
    clock = FakeClock()
    asm = BatchAssembler(BatchConfig(min_events=3, max_events=10, max_wait=5), clock)
    asm.start()
    asm.add(_events(2))
    assert not asm.ready()
    asm.add(_events(1))
    assert asm.ready() and len(asm.take()) == 3


def test_fewer_than_min_events_wait_for_max_wait() -> None:
    clock = FakeClock()
    asm = BatchAssembler(BatchConfig(min_events=5, max_events=10, max_wait=2), clock)
    asm.start()
    asm.add(_events(2))
    clock.advance(1.999)
    assert not asm.ready() and asm.remaining() == pytest.approx(0.001)
    clock.advance(0.001)
    assert asm.ready()
    assert [e.value for e in asm.take()] == [0, 1]
    assert asm.started is None and not asm.events


def test_max_wait_counts_from_the_previous_batch() -> None:
    """After a quiet spell longer than max_wait, a lone event goes out at once; the next batch is timed
    from the moment the previous one was handed over."""
    clock = FakeClock()
    asm = BatchAssembler(BatchConfig(min_events=5, max_events=10, max_wait=2), clock)
    asm.start()
    clock.advance(3)  # nothing arrived for longer than max_wait
    assert not asm.ready(), "an empty batch is never delivered"
    asm.add(_events(1))
    assert asm.ready()
    asm.take()
    asm.start()
    asm.add(_events(1))
    clock.advance(1)
    assert not asm.ready()
    clock.advance(1)
    assert asm.ready()


def test_max_events_caps_the_batch() -> None:
    clock = FakeClock()
    asm = BatchAssembler(BatchConfig(min_events=1, max_events=4, max_wait=1), clock)
    asm.start()
    assert asm.room() == 4
    asm.add(_events(3))
    assert asm.room() == 1
    asm.add(_events(3))
    assert len(asm.take()) == 4 and len(asm.events) == 2


@pytest.mark.parametrize("kwargs, fragment", [
    ({"min_events": 0}, "min_events"),
    ({"max_events": 0}, "max_events"),
    ({"min_events": 5, "max_events": 4}, "must not exceed"),
    ({"max_wait": -1}, "max_wait"),
    ({"max_wait": float("inf")}, "max_wait"),
    ({"min_events": True}, "min_events"),
])
def test_batch_config_rejects_bad_values(kwargs: dict, fragment: str) -> None:
    with pytest.raises(InvalidArgument, match=fragment):
        BatchConfig(**kwargs)


# -- a worker ---------------------------------------------------------------------------------------------
def test_worker_delivers_by_min_max_and_max_wait(client: pgstreams.Client) -> None:
    client.create_topic("t", 1)
    client.publish_many("t", [{"value": i} for i in range(3)])
    clock = FakeClock()
    batches: list[list[int]] = []
    worker = Worker(client, clock=clock, install_signal_handlers=False)
    worker.subscribe("t", "g", lambda evs: batches.append([e.value for e in evs]), batch=True,
                     min_events=5, max_events=8, max_wait=10, partitions=[0])
    with running(worker):
        until(lambda: worker.stats.polls >= 3, what="three polls")
        assert batches == [], "3 events < min_events: not before max_wait"
        clock.advance(10)
        until(lambda: len(batches) == 1, what="the max_wait batch")
        assert batches == [[0, 1, 2]]
        client.publish_many("t", [{"value": i} for i in range(3, 23)])  # one transaction: visible at once
        until(lambda: len(batches) == 3, what="two full batches")
        assert batches[1:] == [list(range(3, 11)), list(range(11, 19))]
        polls = worker.stats.polls
        until(lambda: worker.stats.polls >= polls + 3, what="three more polls")
        assert len(batches) == 3, "the remaining 4 < min_events wait for max_wait"
        clock.advance(10)
        until(lambda: len(batches) == 4, what="the remainder")
        assert batches[3] == list(range(19, 23))
    assert pgstreams.group_status(client, "g")[0].lag == 0


def test_single_event_handler_sees_each_event_once_in_partition_order(client: pgstreams.Client) -> None:
    client.create_topic("t", 3)
    client.publish_many("t", [{"value": i, "key": f"k{i % 5}"} for i in range(60)])
    seen: list[pgstreams.Event] = []
    worker = Worker(client, install_signal_handlers=False)
    worker.subscribe("t", "g", seen.append, max_events=7, heartbeat_interval=0.2, session_timeout=1.5)
    with running(worker):
        until(lambda: len(seen) == 60, what="60 events")
        assert worker.stats.batches >= 60 // 7
    assert sorted(e.value for e in seen) == list(range(60))
    for p in range(3):
        positions = [e.position for e in seen if e.partition == p]
        assert positions == sorted(positions)
    assert all(s.lag == 0 for s in pgstreams.group_status(client, "g"))


def test_max_wait_delivers_a_small_batch_in_real_time(client: pgstreams.Client) -> None:
    client.create_topic("t", 2)
    batches: list[tuple[float, int]] = []
    worker = Worker(client, install_signal_handlers=False)
    worker.subscribe("t", "g", lambda evs: batches.append((time.monotonic(), len(evs))), batch=True,
                     min_events=100, max_events=100, max_wait=0.4, heartbeat_interval=0.2,
                     session_timeout=1.5)
    with running(worker):
        until(lambda: worker.assignment()[("g", "t")] == (0, 1), what="the assignment")
        until(lambda: worker.stats.polls >= 1, what="a poll")
        started = time.monotonic()
        client.publish_many("t", [{"value": i} for i in range(3)])
        until(lambda: len(batches) == 1, what="the small batch")
        # the timer started when the worker began waiting, before the publish
        assert batches[0][1] == 3
        assert batches[0][0] - started <= 0.4 + 1.0


def test_notifications_wake_the_worker_before_the_poll_interval(dsn: str) -> None:
    with pgstreams.connect(dsn, poll_interval=30) as client:
        client.create_topic("t", 1)
        seen: list[float] = []
        worker = Worker(client, install_signal_handlers=False)
        worker.subscribe("t", "g", lambda ev: seen.append(time.monotonic()), partitions=[0])
        with running(worker):
            until(lambda: client.listener.connected.is_set() and worker.stats.polls >= 1, what="listening")
            sent = time.monotonic()
            client.publish("t", "x")
            until(lambda: bool(seen), timeout=5, what="the event")
            assert seen[0] - sent < 5, "woken by NOTIFY, not by the 30 s poll"


def test_polling_finds_events_that_sent_no_notification(dsn: str) -> None:
    with pgstreams.connect(dsn, poll_interval=0.2) as client:
        client.create_topic("t", 1)
        tid = client.topic_record("t").id
        seen: list[str] = []
        worker = Worker(client, install_signal_handlers=False)
        worker.subscribe("t", "g", lambda ev: seen.append(ev.value), partitions=[0])
        with running(worker):
            until(lambda: worker.stats.polls >= 1, what="a poll")
            with client.connection() as conn:  # a plain INSERT: no pg_notify
                quiet = (0, "s", None, b"quiet", None, None, None, None, None, None)
                client.store.events.insert(conn, tid, quiet)
            until(lambda: seen == ["quiet"], timeout=5, what="the polled event")
