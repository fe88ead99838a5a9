"""Handler failures: retries with backoff, dead-letter topics with headers, the group moving on, and
retrying forever (and saying so in the group status) when there is no dead-letter topic."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import psycopg
import pytest

import pgstreams
from _core_helpers import FakeClock, running, until
from pgstreams import EventFailed, InvalidArgument, RetryPolicy, Worker
from pgstreams import worker as W

FAST = RetryPolicy(max_attempts=3, backoff=0.01, multiplier=2, max_backoff=0.05, jitter=0)


def caught_up(client: pgstreams.Client, group: str = "g", topic: str = "t") -> bool:
    rows = pgstreams.group_status(client, group, topic)
    return bool(rows) and all(r.lag == 0 for r in rows)


def dead_letters(client: pgstreams.Client, topic: str = "t.dlt") -> list[pgstreams.Event]:
    c = pgstreams.Consumer(client, topic, "dlt-reader")
    out: list[pgstreams.Event] = []
    while True:
        got = c.poll(100, timeout=0.5)
        if not got:
            return out
        out.extend(got)


def publish_numbers(client: pgstreams.Client, n: int, partitions: int = 2) -> None:
    client.create_topic("t", partitions)
    client.publish_many("t", [{"value": i, "key": f"k{i}", "headers": {"origin": "test"},
                               "event_type": "number", "correlation_id": f"c{i}"} for i in range(n)])


POISON = {3, 11, 17}


@pytest.mark.parametrize("mode", ["at-least-once", "transactional"])
def test_failing_events_go_to_the_dead_letter_topic_and_the_group_moves_on(
        client: pgstreams.Client, mode: str) -> None:
    publish_numbers(client, 24)
    with client.connection() as conn:
        conn.execute("CREATE TABLE effects (v integer PRIMARY KEY)")
    calls: Counter[int] = Counter()
    handled: list[int] = []

    def handle(ev: pgstreams.Event, conn: psycopg.Connection | None = None) -> None:
        calls[ev.value] += 1
        if conn is not None:
            conn.execute("INSERT INTO effects VALUES (%s)", (ev.value,))
        if ev.value in POISON:
            raise ValueError(f"cannot handle {ev.value}")
        handled.append(ev.value)

    worker = Worker(client, install_signal_handlers=False)
    worker.subscribe("t", "g", handle, mode=mode, retry=FAST, heartbeat_interval=0.2, session_timeout=1.5)
    with running(worker):
        until(lambda: caught_up(client), what="the group to catch up")
    assert sorted(handled) == sorted(set(range(24)) - POISON)
    assert len(handled) == len(set(handled)), "no event handled twice"
    assert {v: calls[v] for v in POISON} == dict.fromkeys(POISON, 3), "tried max_attempts times each"
    dlt = dead_letters(client)
    assert sorted(e.value for e in dlt) == sorted(POISON)
    for e in dlt:
        h = e.headers
        assert h[W.DLT_GROUP] == "g" and h[W.DLT_TOPIC] == "t"
        assert h[W.DLT_ERROR_TYPE] == "ValueError"
        assert h[W.DLT_ERROR_MESSAGE] == f"cannot handle {e.value}"
        assert h[W.DLT_ATTEMPTS] == "3"
        assert h["origin"] == "test", "the original headers are kept"
        assert (e.key, e.event_type, e.correlation_id) == (f"k{e.value}", "number", f"c{e.value}")
        src = pgstreams.partition_for_key(f"k{e.value}", 2)
        assert e.partition == src == int(h[W.DLT_PARTITION])
    assert client.describe_topic("t.dlt").topic.partitions == 2
    if mode == "transactional":
        with client.connection() as conn:
            rows = {r[0] for r in conn.execute("SELECT v FROM effects").fetchall()}
        assert rows == set(range(24)) - POISON, "the failed attempts' writes were rolled back"
    assert all(r.retry_state is None for r in pgstreams.group_status(client, "g"))
    assert worker.stats.dead_lettered == 3


def test_attempts_on_a_failing_event_carry_over_to_the_next_owner(client: pgstreams.Client) -> None:
    """A member that fails an event twice and leaves hands its partition over with the attempts so far:
    the next owner spends only the remaining ones before dead-lettering it."""
    client.create_topic("t", 1)
    client.publish_many("t", [{"value": v} for v in (0, 1, 2)])
    calls: Counter[int] = Counter()

    def handle(ev: pgstreams.Event) -> None:
        calls[ev.value] += 1
        if ev.value == 1:
            raise ValueError("always")

    def attempts() -> int | None:
        rows = pgstreams.group_status(client, "g", "t")
        return rows[0].retry_attempts if rows else None

    # the first member retries at once, then waits a minute: it leaves after two attempts
    slow = RetryPolicy(max_attempts=4, backoff=0.01, multiplier=6000, max_backoff=60, jitter=0)
    first = Worker(client, install_signal_handlers=False)
    first.subscribe("t", "g", handle, retry=slow, heartbeat_interval=0.2, session_timeout=1.5)
    with running(first):
        until(lambda: attempts() == 2, what="two attempts by the first member")
    assert calls[1] == 2
    second = Worker(client, install_signal_handlers=False)
    second.subscribe("t", "g", handle, retry=RetryPolicy(max_attempts=4, backoff=0.01, jitter=0),
                     heartbeat_interval=0.2, session_timeout=1.5)
    with running(second):
        until(lambda: caught_up(client), what="the group to move on")
    assert calls == Counter({0: 1, 1: 4, 2: 1}), "four attempts in all, not four more"
    dlt = dead_letters(client)
    assert [e.value for e in dlt] == [1] and dlt[0].headers[W.DLT_ATTEMPTS] == "4"


def test_a_failing_event_pauses_only_its_partition(client: pgstreams.Client) -> None:
    client.create_topic("t", 2)
    client.publish_many("t", [{"value": i, "partition": i % 2} for i in range(20)])
    order: list[int] = []
    policy = RetryPolicy(max_attempts=2, backoff=1.0, multiplier=1, jitter=0)

    def handle(ev: pgstreams.Event) -> None:
        if ev.value == 2:
            raise RuntimeError("two")
        order.append(ev.value)

    worker = Worker(client, install_signal_handlers=False)
    worker.subscribe("t", "g", handle, retry=policy, max_events=4, heartbeat_interval=0.2,
                     session_timeout=1.5)
    with running(worker):
        until(lambda: set(range(1, 20, 2)) <= set(order), what="partition 1")
        # while event 2 backs off, partition 1 is done, partition 0 waits behind event 2
        assert [v for v in order if v % 2 == 0] == [0]
        until(lambda: caught_up(client), what="the group to catch up")
    assert [v for v in order if v % 2 == 0] == [0, *range(4, 20, 2)], "partition order kept"
    assert [e.value for e in dead_letters(client)] == [2]


def test_without_a_dead_letter_topic_the_group_retries_forever_and_says_so(client: pgstreams.Client) -> None:
    client.create_topic("t", 2)
    client.publish_many("t", [{"value": i, "partition": i % 2} for i in range(10)])
    broken = {"on": True}
    handled: list[int] = []

    def handle(ev: pgstreams.Event) -> None:
        if ev.value == 4 and broken["on"]:
            raise KeyError("missing reference data")
        handled.append(ev.value)

    pgstreams.configure_group(client, "g", dead_letter=False)
    worker = Worker(client, install_signal_handlers=False)
    worker.subscribe("t", "g", handle, retry=FAST, heartbeat_interval=0.2, session_timeout=1.5)
    with running(worker):
        def blocked() -> bool:
            rows = {r.partition: r for r in pgstreams.group_status(client, "g")}
            return rows[0].retry_state == "blocked" and (rows[0].retry_attempts or 0) >= 5
        until(blocked, what="the blocked status")
        rows = {r.partition: r for r in pgstreams.group_status(client, "g")}
        stuck = rows[0]
        assert stuck.lag == 3 and stuck.retry_position is not None
        assert stuck.last_error == "KeyError: 'missing reference data'"
        assert rows[1].lag == 0 and rows[1].retry_state is None
        assert sorted(handled) == [0, 1, 2, 3, 5, 7, 9]
        broken["on"] = False  # the cause is fixed: the next attempt passes and the group moves on
        until(lambda: caught_up(client), what="the group to catch up")
        # the state is cleared right after that commit (a separate statement: poll for it)
        until(lambda: all(r.retry_state is None and r.retry_attempts is None
                          for r in pgstreams.group_status(client, "g")), what="the blocked state to clear")
    assert sorted(handled) == list(range(10))
    with pytest.raises(pgstreams.TopicNotFound):
        client.describe_topic("t.dlt")


def test_batch_handler_naming_the_failed_event(client: pgstreams.Client) -> None:
    publish_numbers(client, 30, partitions=1)
    handled: list[int] = []

    def handle(events: Sequence[pgstreams.Event]) -> None:
        for ev in events:
            if ev.value in POISON:
                raise EventFailed(ev, ValueError(f"bad {ev.value}"))
            handled.append(ev.value)

    worker = Worker(client, install_signal_handlers=False)
    worker.subscribe("t", "g", handle, batch=True, max_events=10, retry=FAST, dead_letter="t.errors",
                     heartbeat_interval=0.2, session_timeout=1.5)
    with running(worker):
        until(lambda: caught_up(client), what="the group to catch up")
    assert sorted(handled) == sorted(set(range(30)) - POISON)
    assert len(handled) == len(set(handled))
    dlt = dead_letters(client, "t.errors")
    assert sorted(e.value for e in dlt) == sorted(POISON)
    assert {e.headers[W.DLT_ERROR_MESSAGE] for e in dlt} == {f"bad {v}" for v in POISON}


@pytest.mark.parametrize("mode", ["at-least-once", "transactional"])
def test_batch_failing_as_a_whole_is_narrowed_down_to_its_failing_events(
        client: pgstreams.Client, mode: str) -> None:
    publish_numbers(client, 20, partitions=1)
    committed: list[int] = []

    def handle(events: Sequence[pgstreams.Event], conn: psycopg.Connection | None = None) -> None:
        if any(e.value in POISON for e in events):
            raise ValueError("somewhere in this batch")
        committed.extend(e.value for e in events)

    worker = Worker(client, install_signal_handlers=False)
    worker.subscribe("t", "g", handle, batch=True, max_events=20, retry=FAST, mode=mode,
                     heartbeat_interval=0.2, session_timeout=1.5)
    with running(worker):
        until(lambda: caught_up(client), what="the group to catch up")
    assert sorted(committed) == sorted(set(range(20)) - POISON)
    assert sorted(e.value for e in dead_letters(client)) == sorted(POISON)


def test_retries_wait_the_backoff_and_go_to_the_groups_dead_letter_topic(dsn: str) -> None:
    """Attempt n + 1 starts only once the clock has moved by the n-th backoff (10 s, then 20 s), checked
    after the worker has polled several times; the spent event goes to the dead-letter topic configured
    for the group (not ``t.dlt``) with its attempt count."""
    with pgstreams.connect(dsn, poll_interval=0.05) as client:
        client.create_topic("t", 2)
        client.publish_many("t", [{"value": v, "partition": 0} for v in (0, 1, 2)])
        pgstreams.configure_group(client, "g", dead_letter="g.errors")
        clock = FakeClock()
        attempts: list[float] = []
        handled: list[int] = []

        def handle(ev: pgstreams.Event) -> None:
            if ev.value == 1:
                attempts.append(clock())
                raise ValueError("always")
            handled.append(ev.value)

        def polled_a_few_times() -> None:
            polls = worker.stats.polls
            until(lambda: worker.stats.polls >= polls + 3, what="three more polls")

        policy = RetryPolicy(max_attempts=3, backoff=10, multiplier=2, max_backoff=100, jitter=0)
        worker = Worker(client, clock=clock, install_signal_handlers=False)
        worker.subscribe("t", "g", handle, retry=policy, heartbeat_interval=0.2, session_timeout=1.5)
        with running(worker):
            until(lambda: len(attempts) == 1, what="the first attempt")
            for n, wait in ((1, 10), (2, 20)):
                polled_a_few_times()
                clock.advance(wait - 0.5)
                polled_a_few_times()
                assert len(attempts) == n and handled == [0], f"retried before the {wait} s backoff passed"
                clock.advance(0.5)
                until(lambda n=n: len(attempts) == n + 1, what=f"attempt {n + 1}")
            until(lambda: caught_up(client), what="the group to move on")
        assert [t - attempts[0] for t in attempts] == [0, 10, 30]
        assert handled == [0, 2]
        assert not any(t.name == "t.dlt" for t in client.list_topics())
        dlt = dead_letters(client, "g.errors")
        assert [e.value for e in dlt] == [1]
        assert dlt[0].headers[W.DLT_ATTEMPTS] == "3" and dlt[0].headers[W.DLT_GROUP] == "g"


def test_retry_policy_backoff() -> None:
    p = RetryPolicy(max_attempts=4, backoff=0.1, multiplier=2, max_backoff=0.3, jitter=0)
    assert [p.delay(n) for n in (1, 2, 3, 4, 50)] == pytest.approx([0.1, 0.2, 0.3, 0.3, 0.3])
    j = RetryPolicy(backoff=1.0, jitter=0.1)
    assert all(0.9 <= j.delay(1) <= 1.1 for _ in range(50))
    for kwargs in ({"max_attempts": 0}, {"backoff": -1}, {"multiplier": 0.5}, {"jitter": 2},
                   {"max_backoff": float("nan")}):
        with pytest.raises(InvalidArgument):
            RetryPolicy(**kwargs)  # type: ignore[arg-type]
