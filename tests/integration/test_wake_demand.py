"""Wake-up notifications only where a consumer waits (``0027_topic_waiters.sql``): publishers that read no
waiter with the topic's row send none, a consumer that starts waiting marks the topic, and events published
before the publishers have seen that mark still reach it promptly."""

from __future__ import annotations

import threading
import time
from typing import Any

import psycopg
from psycopg import sql

import pgstreams
from _core_helpers import wait_until
from pgstreams.producer import TOPIC_CHECK_INTERVAL
from pgstreams.storage import notification_channel
from pgstreams.storage.notifications import WAITING_TTL


def _listen(dsn: str) -> psycopg.Connection:
    probe = psycopg.connect(dsn, autocommit=True)
    probe.execute(sql.SQL("LISTEN {}").format(sql.Identifier(notification_channel("pgstreams"))))
    return probe


def _drain(client: pgstreams.Client, probe: psycopg.Connection) -> list[str]:
    """The notifications of ``client``'s topics sent so far: the client's notifier sends what it has
    pending, then the probe sends a marker; PostgreSQL delivers notifications in commit order, so what
    arrives before the marker is everything sent before it."""
    client.notifier.flush()
    marker = f"marker-{time.monotonic_ns()}"
    probe.execute("SELECT pg_notify(%s, %s)", (notification_channel("pgstreams"), marker))
    got: list[str] = []
    for n in probe.notifies(timeout=60):
        if n.payload == marker:
            return got
        got.append(n.payload)
    raise AssertionError(f"the marker notification did not arrive within 60 s (got {got})")


def _publish_until_quiet(client: pgstreams.Client, topic: str) -> None:
    """Publish until the client's reading of the topic's row found no waiter (within 10 s)."""
    n = iter(range(10**9))

    def quiet() -> bool:
        client.publish(topic, next(n))
        return client.topic_state(topic).quiet

    wait_until(quiet, 10, "a reading of the topic's row that finds no waiter", every=0.01)


def test_publishers_send_no_notification_while_no_consumer_waits(dsn: str) -> None:
    with pgstreams.connect(dsn) as client, _listen(dsn) as probe:
        client.create_topic("t", 2)
        _publish_until_quiet(client, "t")
        _drain(client, probe)  # what was sent before the reading (the notifier's trailing one included)
        for i in range(100):
            client.publish("t", i)
        client.publish_many("t", [pgstreams.Message(i) for i in range(100)])
        assert _drain(client, probe) == []
        assert client.topic_state("t").quiet


def test_publishers_notify_while_a_consumer_waits(dsn: str) -> None:
    with pgstreams.connect(dsn) as client, pgstreams.connect(dsn) as reader, _listen(dsn) as probe:
        client.create_topic("t", 1)
        c = reader.consumer("t", "g")

        def waiting_mark() -> tuple[Any, ...] | None:
            assert c.poll(timeout=0.05) == []  # waits: marks the topic (best effort: on a free connection)
            with psycopg.connect(dsn, autocommit=True) as conn:
                return conn.execute("SELECT until - now() FROM pgstreams.topic_waiters w JOIN"
                                    " pgstreams.topics t ON t.id = w.topic_id WHERE t.name = 't'").fetchone()

        row = wait_until(waiting_mark, 30, "a waiting consumer's mark on the topic", every=0.0)
        marked = time.monotonic()
        assert WAITING_TTL - 5 < row[0].total_seconds() <= WAITING_TTL
        # a publisher reads the mark with the topic's row and keeps notifying
        def read_after_mark() -> bool:
            client.publish("t", 0)
            state = client.topic_state("t")
            return state.check_at - TOPIC_CHECK_INTERVAL > marked  # the last reading began after the mark

        wait_until(read_after_mark, 10, "a reading of the topic's row after the mark", every=0.01)
        assert not client.topic_state("t").quiet
        _drain(client, probe)
        client.publish("t", 1)
        assert _drain(client, probe) == [str(client.topic_state("t").id)]


def test_a_consumer_that_starts_waiting_is_woken_promptly_by_publishers_that_had_gone_quiet(dsn: str) -> None:
    # the consumer's fallback poll is a minute, and the publisher reads the topic's row again 0.5 s after it
    # went quiet (right before the consumer's first wait): every event arriving within 0.25 s proves that
    # the consumer was woken or rechecked, before and after the publisher saw its mark
    with pgstreams.connect(dsn) as publisher, pgstreams.connect(dsn, poll_interval=60) as reader:
        publisher.create_topic("t", 1)
        _publish_until_quiet(publisher, "t")
        c = reader.consumer("t", "g", start="latest")
        assert c.poll(timeout=0) == []
        sent: dict[int, float] = {}
        done = threading.Event()

        def publish() -> None:
            i = 0
            end = time.monotonic() + 2.0  # workload: events at a steady pace across the publisher's readings
            while time.monotonic() < end:
                sent[i] = time.monotonic()
                publisher.publish("t", i)
                i += 1
                time.sleep(0.02)
            done.set()

        t = threading.Thread(target=publish)
        late: list[tuple[int, float]] = []
        got: list[int] = []
        t.start()
        try:
            while not (done.is_set() and len(got) == len(sent)):
                for e in c.poll(timeout=5):
                    got.append(e.value)
                    delay = time.monotonic() - sent[e.value]
                    if delay > 0.25:
                        late.append((e.value, delay))
                c.commit()
        finally:
            t.join()
        assert got == list(range(len(sent)))
        assert late == [], f"events that reached the waiting consumer late: {late}"
        assert not publisher.topic_state("t").quiet  # it saw the mark: it notifies now
