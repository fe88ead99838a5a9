"""A primary with a synchronous streaming standby, killed and the standby promoted, under a publisher, a
consumer in a group and a worker group: every acknowledged event is stored once, and the consumer and the
worker see each one once, nothing skipped or repeated.

Both servers are the test's own (:func:`bench._servers.standby_pair`: the standby a ``pg_basebackup`` of
the primary, started with the same binaries); clients use a multi-host DSN with
``target_session_attrs=read-write``, as docs/operations.md says.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator

import psycopg
import pytest
from bench._servers import StandbyPair, standby_pair

import pgstreams
from _core_helpers import running, until

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def pair() -> Iterator[StandbyPair]:
    """A primary and its synchronous standby (:func:`bench._servers.standby_pair`), fsync off (the machine
    does not crash; an immediate stop loses nothing committed)."""
    with standby_pair({"fsync": "off"}) as p:
        yield p


class _Publisher(threading.Thread):
    """Publishes ``0, 1, 2, ...`` one event at a time until stopped; ``acked`` counts the calls that
    returned; records errors."""

    def __init__(self, client: pgstreams.Client, topic: str) -> None:
        super().__init__(daemon=True)
        self.client, self.topic = client, topic
        self.acked = 0
        self.times: list[float] = []  # when each call returned (monotonic)
        self.errors: list[BaseException] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                self.client.publish(self.topic, self.acked, key=str(self.acked % 7))
                self.acked += 1
                self.times.append(time.monotonic())
            except BaseException as exc:  # noqa: BLE001 - the test asserts there are none
                self.errors.append(exc)
                return
            time.sleep(0.002)


class _Reader(threading.Thread):
    """A consumer of group ``g`` that polls, notes and commits until stopped; records errors."""

    def __init__(self, client: pgstreams.Client, topic: str) -> None:
        super().__init__(daemon=True)
        self.consumer = client.consumer(topic, "g")
        self.seen: list[tuple[int, int, int]] = []  # (partition, position, value)
        self.errors: list[BaseException] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                got = self.consumer.poll(max_events=200, timeout=0.2)
                self.seen.extend((e.partition, e.position, e.value) for e in got)
                if got:
                    self.consumer.commit()
            except BaseException as exc:  # noqa: BLE001 - the test asserts there are none
                self.errors.append(exc)
                return


def test_a_synchronous_standby_promoted_under_load_keeps_every_acknowledged_event_exactly_once(
        pair: StandbyPair) -> None:
    dsn = pair.dsn
    with pgstreams.connect(dsn, retry_timeout=60) as client:
        client.create_topic("t", 2)
        with client.connection() as conn:
            conn.execute("CREATE TABLE handled (value int)")

        def handle(event: pgstreams.Event, conn: psycopg.Connection) -> None:
            conn.execute("INSERT INTO handled VALUES (%s)", (event.value,))

        def handled() -> list[int]:
            with psycopg.connect(dsn) as c:
                return [r[0] for r in c.execute("SELECT value FROM handled").fetchall()]

        with pgstreams.connect(dsn, retry_timeout=60) as wclient, \
                pgstreams.connect(dsn, retry_timeout=60) as rclient, \
                pgstreams.connect(dsn, retry_timeout=60) as pclient:
            worker = pgstreams.Worker(wclient)
            worker.subscribe("t", "w", handle, mode="transactional", heartbeat_interval=0.2,
                             session_timeout=5.0)
            publisher, reader = _Publisher(pclient, "t"), _Reader(rclient, "t")
            with running(worker):
                publisher.start()
                reader.start()
                try:
                    try:
                        until(lambda: len(handled()) >= 100 and len(reader.seen) >= 100, 60,
                              "events read before the failover")
                    except AssertionError as exc:
                        raise AssertionError(f"{exc} (published {publisher.acked}, handled {len(handled())}, "
                                             f"read {len(reader.seen)}; {publisher.errors} {reader.errors} "
                                             f"{worker.failure})") from None
                    pair.primary.stop("immediate")  # the primary dies: nothing flushed after this
                    killed = time.monotonic()
                    pair.promote()
                    promoted = time.monotonic() - killed
                    before = publisher.acked
                    until(lambda: publisher.acked >= before + 100 or bool(publisher.errors), 90,
                          "publishes acknowledged by the promoted standby")
                finally:
                    publisher.stop.set()
                    publisher.join(60)
                acked = publisher.acked
                assert publisher.errors == [], publisher.errors
                until(lambda: len(handled()) >= acked and len(reader.seen) >= acked, 90,
                      "every acknowledged event read after the failover")
                reader.stop.set()
                reader.join(60)
                assert reader.errors == [], reader.errors
                assert worker.failure is None, worker.failure

    # stored: every acknowledged event once (a publish cut by the kill was retried on the promoted standby)
    with pgstreams.connect(dsn) as c:
        consumer = c.consumer("t", "count")
        stored: Counter[int] = Counter()
        while got := consumer.poll(max_events=1000, timeout=0.2):
            stored.update(e.value for e in got)
    assert set(stored) == set(range(acked)) and set(stored.values()) == {1}, \
        (acked, sorted(v for v, n in stored.items() if n > 1), sorted(set(range(acked)) - set(stored)))
    # the consumer: each once, in each partition's order, nothing skipped
    values = [v for _p, _o, v in reader.seen]
    assert sorted(values) == list(range(acked)), Counter(values).most_common(3)
    for p in (0, 1):
        offsets = [o for q, o, _v in reader.seen if q == p]
        assert offsets == sorted(offsets)
    # the worker: each once (its handler's rows commit with its checkpoints)
    assert sorted(handled()) == list(range(acked))
    # the callers saw the failover as latency only: from the kill to the first publish acknowledged after it
    outage = min(t for t in publisher.times if t > killed) - killed
    print(f"promotion took {promoted:.2f} s; kill to the first acknowledged publish {outage:.2f} s")
    assert promoted < 60 and outage < 60
