"""Wake-up notifications only where a consumer waits (``0027_topic_waiters.sql``): publishers that read no
waiter with the topic's row send none, a consumer that starts waiting marks the topic, and events published
before the publishers have seen that mark still reach it promptly."""

from __future__ import annotations

import threading
import time
from functools import partial
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


def _marked(conn: psycopg.Connection, topic: str) -> bool:
    """Whether a consumer's mark that it waits for ``topic`` is stored."""
    return conn.execute("SELECT 1 FROM pgstreams.topic_waiters w JOIN pgstreams.topics t ON t.id = w.topic_id"
                        " WHERE t.name = %s", (topic,)).fetchone() is not None


def test_a_consumer_that_starts_waiting_is_woken_promptly_by_publishers_that_had_gone_quiet(dsn: str) -> None:
    """A publisher that went quiet (its last reading of the topic's row found no waiter) sends no
    notification until it reads the row again, :data:`TOPIC_CHECK_INTERVAL` later; a consumer that starts
    waiting meanwhile rechecks fast instead (``MARK_WINDOW``). An event published in that gap reaches the
    consumer at once, not at the end of its 30 s wait (its fallback poll is a minute). The gap is short: an
    attempt whose publish came after the publisher read the row again (which then notifies: another case)
    is made again on a new topic, so that the case is certain, however busy the machine."""
    with pgstreams.connect(dsn) as publisher, pgstreams.connect(dsn, poll_interval=60) as reader:
        for attempt in range(30):
            topic = f"t{attempt}"
            publisher.create_topic(topic, 1)
            _publish_until_quiet(publisher, topic)
            c = reader.consumer(topic, "g", start="latest")
            assert c.poll(timeout=0) == []
            got: list[Any] = []
            received: list[float] = []

            def wait(c: Any = c, got: list[Any] = got, received: list[float] = received) -> None:
                got.extend(c.poll(timeout=30))
                received.append(time.monotonic())

            waiter = threading.Thread(target=wait)
            waiter.start()
            try:
                with psycopg.connect(dsn, autocommit=True) as conn:
                    wait_until(partial(_marked, conn, topic), 30, "the waiting consumer's mark", every=0.0)
                sent = time.monotonic()
                publisher.publish(topic, "e")
                unnotified = publisher.topic_state(topic).quiet  # it did not read the row again: no notice
            finally:
                waiter.join(60)
            if not unnotified:
                continue
            assert [e.value for e in got] == ["e"], "the event did not reach the consumer in its 30 s wait"
            delay = received[0] - sent
            assert delay < 5.0, f"the event reached the waiting consumer {delay:.2f} s late"
            return
        raise AssertionError("no attempt published before the publisher read the topic's row again")
