"""Workers on share groups: concurrency, at-least-once and transactional modes, retries by release with
backoff, dead letters after max_attempts deliveries, and the source protocol."""

from __future__ import annotations

import threading
import time

import psycopg
import pytest

import pgstreams
from _core_helpers import running, until
from pgstreams.worker.shares import ShareSource


def handled_count(client: pgstreams.Client) -> int:
    with client.connection() as conn:
        row = conn.execute("SELECT count(*) FROM out").fetchone()
    return int(row[0]) if row else 0


@pytest.mark.parametrize("mode", ["at-least-once", "transactional"])
def test_a_share_worker_runs_concurrent_handlers_on_one_partition(client: pgstreams.Client,
                                                                  mode: str) -> None:
    client.create_topic("t", 1)
    with client.connection() as conn:
        conn.execute("CREATE TABLE out (position bigint PRIMARY KEY)")
    client.publish_many("t", [{"value": i} for i in range(200)])
    running_now = {"n": 0, "peak": 0}
    gate = threading.Lock()
    peak_reached = threading.Event()

    def handle(ev: pgstreams.Event, conn: psycopg.Connection | None = None) -> None:
        with gate:
            running_now["n"] += 1
            running_now["peak"] = max(running_now["peak"], running_now["n"])
            if running_now["peak"] >= 3:
                peak_reached.set()
        peak_reached.wait(0.05)  # let the other handlers start (the test is about them running at once)
        if conn is not None:
            conn.execute("INSERT INTO out VALUES (%s)", (ev.position,))
        else:
            with client.connection() as c:
                c.execute("INSERT INTO out VALUES (%s) ON CONFLICT DO NOTHING", (ev.position,))
        with gate:
            running_now["n"] -= 1

    handler = handle if mode == "transactional" else (lambda ev: handle(ev))
    worker = pgstreams.Worker(client, install_signal_handlers=False)
    worker.subscribe("t", "g", handler, share=True, concurrency=4, mode=mode,  # type: ignore[arg-type]
                     max_events=10)
    with running(worker):
        until(lambda: handled_count(client) == 200, 60, "200 events handled")
    assert running_now["peak"] >= 3
    [st] = client.describe_share_group("g")
    assert (st.acquired, st.available) == (0, 0)
    assert client.store.shares.state_rows("g", client.topic_record("t").id) == 0


def test_async_handlers_of_a_share_subscription_run_concurrently_and_handle_each_event_once(
        client: pgstreams.Client) -> None:
    import asyncio
    from collections import Counter

    concurrency, rounds = 4, 5
    client.create_topic("t", 2)
    client.publish_many("t", [{"value": i, "partition": i % 2} for i in range(concurrency * rounds)])
    # every handler waits until ``concurrency`` of them are waiting together: run one at a time (or on a
    # blocked event loop), the first would wait for the others until its deadline and fail
    barrier = asyncio.Barrier(concurrency)
    handled: Counter[int] = Counter()
    met: list[int] = []
    timeouts: list[int] = []
    threads: set[str] = set()
    inside = {"now": 0, "peak": 0}

    async def handle(ev: pgstreams.Event) -> None:
        threads.add(threading.current_thread().name)
        inside["now"] += 1
        inside["peak"] = max(inside["peak"], inside["now"])
        try:
            async with asyncio.timeout(30):
                met.append(await barrier.wait())
        except TimeoutError:
            timeouts.append(ev.value)
            raise
        finally:
            inside["now"] -= 1
        await asyncio.sleep(0)
        handled[ev.value] += 1

    worker = pgstreams.Worker(client, install_signal_handlers=False, maintenance=None)
    worker.subscribe("t", "g", handle, share=True, concurrency=concurrency, max_events=1,
                     retry=pgstreams.RetryPolicy(max_attempts=1))
    with running(worker):
        until(lambda: sum(handled.values()) == concurrency * rounds or bool(timeouts), 120,
              "every event handled")
        until(lambda: worker.stats.commits == concurrency * rounds or bool(timeouts), 30, "every event acked")
    assert timeouts == [], "handlers waited alone at the barrier: they did not run concurrently"
    assert sorted(met) == sorted(list(range(concurrency)) * rounds), "each round met all handlers at once"
    assert inside["peak"] == concurrency
    assert threads == {"pgstreams-async-handlers"}, "the coroutines ran on the handlers' event loop"
    assert handled == Counter(range(concurrency * rounds)), "each event handled exactly once"
    assert worker.stats.failures == 0 and worker.stats.dead_lettered == 0
    shares = client.describe_share_group("g")
    assert sum(s.acquired + s.available + s.waiting for s in shares) == 0


def test_a_failing_event_is_retried_with_backoff_then_dead_lettered_while_others_go_on(
        client: pgstreams.Client) -> None:
    client.create_topic("t", 1)
    client.publish_many("t", [{"value": i} for i in range(20)])
    seen: list[tuple[int, int]] = []
    done: set[int] = set()

    def handle(ev: pgstreams.Event) -> None:
        seen.append((ev.value, ev.delivery_count))
        if ev.value == 3:
            raise ValueError("three")
        done.add(ev.value)

    worker = pgstreams.Worker(client, install_signal_handlers=False)
    worker.subscribe("t", "g", handle, share=True, retry=pgstreams.RetryPolicy(max_attempts=3, backoff=0.05))
    with running(worker):
        until(lambda: len(done) == 19, 30, "the other events handled")
        until(lambda: sum(s.dead_lettered for s in client.describe_share_group("g")) == 1, 30,
              "the failing event dead-lettered")
    assert [d for v, d in seen if v == 3] == [1, 2, 3]
    [copy] = pgstreams.Consumer(client, "t.dlt", "x").poll(10, 2)
    assert copy.value == 3 and copy.headers["dlt.deliveries"] == "3"
    assert copy.headers["dlt.error_type"] == "ValueError" and copy.headers["dlt.error_message"] == "three"
    assert worker.stats.dead_lettered == 1


def test_share_subscription_options_are_checked(client: pgstreams.Client) -> None:
    client.create_topic("t")
    worker = pgstreams.Worker(client, install_signal_handlers=False)
    with pytest.raises(pgstreams.InvalidArgument, match="concurrency"):
        worker.subscribe("t", "g", print, concurrency=2)
    with pytest.raises(pgstreams.InvalidArgument, match="concurrency"):
        worker.subscribe("t", "g", print, share=True, concurrency=0)
    with pytest.raises(pgstreams.InvalidArgument, match="partitions"):
        worker.subscribe("t", "g", print, share=True, partitions=[0])
    with pytest.raises(pgstreams.InvalidArgument, match="share"):
        worker.subscribe("t", "g", print, share="yes")  # type: ignore[arg-type]


def test_a_share_subscriptions_lock_timeout_returns_events_its_handler_holds_too_long(
        client: pgstreams.Client) -> None:
    client.create_topic("t", 1)
    client.publish_many("t", [{"value": i} for i in range(5)])
    seen: list[tuple[int, int]] = []
    again = threading.Event()

    def handle(ev: pgstreams.Event) -> None:
        seen.append((ev.value, ev.delivery_count))
        if ev.value == 0 and ev.delivery_count == 1:
            again.wait(30)  # held past the lock timeout: delivered again meanwhile
        elif ev.value == 0:
            again.set()

    worker = pgstreams.Worker(client, install_signal_handlers=False)
    worker.subscribe("t", "g", handle, share=True, concurrency=2, lock_timeout=0.5, max_events=1)
    with running(worker):
        until(lambda: again.is_set(), 20, "event 0 delivered again after the 0.5 s lock timeout")
        until(lambda: client.describe_share_group("g")[0].acquired == 0, 20, "every event settled")
    [st] = client.describe_share_group("g")
    assert st.lock_timeout == 0.5 and st.available == 0
    assert (0, 2) in seen and sorted(v for v, d in seen if d == 1) == [0, 1, 2, 3, 4]


@pytest.mark.parametrize(("value", "words"), [
    (0, "lock_timeout must be more than 0"), (-1, "lock_timeout"), (0.001, "at least 0.01"),
    (86_401, "at most 86400"), ("5", "lock_timeout must be a number"), (float("nan"), "lock_timeout"),
])
def test_a_bad_lock_timeout_of_a_share_subscription_is_refused_and_changes_nothing(
        client: pgstreams.Client, value: object, words: str) -> None:
    client.create_topic("t")
    worker = pgstreams.Worker(client, install_signal_handlers=False)
    with pytest.raises(pgstreams.InvalidArgument, match=words):
        worker.subscribe("t", "g", print, share=True, lock_timeout=value)  # type: ignore[arg-type]
    with pytest.raises(pgstreams.InvalidArgument, match="lock_timeout needs share=True"):
        worker.subscribe("t", "g", print, lock_timeout=5.0)
    assert client.store.shares.groups() == []


def test_the_share_source_implements_the_source_protocol(client: pgstreams.Client) -> None:
    client.create_topic("t", 2)
    client.publish_many("t", [{"value": i} for i in range(4)])
    source = ShareSource(client.share_consumer("t", "g"))
    assert source.partitions == (0, 1) and source.sync() is None and not source.changed()
    assert source.owns({0, 1})
    got = source.fetch(10, {0, 1})  # new events of one partition per fetch (partitions rotate)
    got += source.fetch(10, {0, 1})
    assert sorted(e.value for e in got) == [0, 1, 2, 3]
    assert source.commit(got[:2]).ok
    with source.transaction() as tx:
        assert source.commit(got[2:3], tx).ok
    source.release(got[3:])
    again = source.fetch(10, {0, 1})
    assert [e.position for e in again] == [got[3].position] and again[0].delivery_count == 2
    t0 = time.monotonic()
    source.idle(lambda: False)
    assert time.monotonic() - t0 >= client.poll_interval * 0.9
