"""Server restarts and killed connections: publishes, polls, commits and a worker group ride through them.

Each test runs against a PostgreSQL of this module's own (``restartable_server``), restarted by the test
(fast and immediate shutdowns) or whose pgstreams sessions it terminates. Every test ends by counting
what was stored and handled: every event exactly once (no duplicate stored by a retried publish), and no
call raised while the outage lasted less than the client's ``retry_timeout``.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

import pgstreams
from _core_helpers import new_database, running, until
from pgstreams.embedded import TemporaryServer, restartable_server

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def server() -> Iterator[TemporaryServer]:
    # fsync off (the machine does not crash), synchronous commit on: an immediate shutdown loses nothing
    # committed
    with restartable_server({"fsync": "off"}) as srv:
        yield srv


@pytest.fixture
def db(server: TemporaryServer) -> Iterator[str]:
    yield new_database(server.dsn, "r_")


def _stored(dsn: str, topic: str) -> Counter[object]:
    """How many times each value is stored in ``topic``."""
    with pgstreams.connect(dsn) as c:
        consumer = c.consumer(topic, f"count-{uuid.uuid4().hex[:6]}")
        out: Counter[object] = Counter()
        while got := consumer.poll(max_events=1000, timeout=0.2):
            out.update(e.value for e in got)
            consumer.commit(got)
        return out


class _Publisher(threading.Thread):
    """Publishes ``0, 1, 2, ...`` (single events, or batches of 10) until stopped; records errors."""

    def __init__(self, client: pgstreams.Client, topic: str, batch: bool = False) -> None:
        super().__init__(daemon=True)
        self.client, self.topic, self.batch = client, topic, batch
        self.sent = 0
        self.errors: list[BaseException] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                if self.batch:
                    self.client.publish_many(self.topic, [{"value": self.sent + i} for i in range(10)])
                    self.sent += 10
                else:
                    self.client.publish(self.topic, self.sent, key=str(self.sent % 7))
                    self.sent += 1
            except BaseException as exc:  # noqa: BLE001 - the test asserts there are none
                self.errors.append(exc)
                return


@pytest.mark.parametrize("mode", ["fast", "immediate"])
@pytest.mark.parametrize("batch", [False, True], ids=["publish", "publish_many"])
def test_publishes_ride_through_a_restart_and_store_each_event_once(server: TemporaryServer, db: str,
                                                                    mode: str, batch: bool) -> None:
    with pgstreams.connect(db, retry_timeout=60) as client:
        client.create_topic("t", 3)
        pub = _Publisher(client, "t", batch)
        pub.start()
        until(lambda: pub.sent >= 50, 30, "publishes before the restart")
        server.restart(mode, down=0.5)
        at = pub.sent
        until(lambda: pub.sent >= at + 50 or bool(pub.errors), 120, "publishes after the restart")
        pub.stop.set()
        pub.join(60)
        assert pub.errors == []
    stored = _stored(db, "t")
    assert sorted(stored) == list(range(pub.sent))  # none lost
    assert max(stored.values()) == 1  # none duplicated


def test_polls_and_commits_ride_through_a_restart(server: TemporaryServer, db: str) -> None:
    with pgstreams.connect(db, retry_timeout=60) as client:
        client.create_topic("t", 2)
        client.publish_many("t", [{"value": i} for i in range(400)])
        consumer = client.consumer("t", "g")
        seen: list[int] = []
        restarted = False
        while len(set(seen)) < 400:
            got = consumer.poll(max_events=20, timeout=1.0)
            seen.extend(e.value for e in got)
            if len(seen) >= 100 and not restarted:
                server.restart("immediate", down=0.5)  # the next poll and commit meet a dead pool
                restarted = True
            consumer.commit(got)
        assert sorted(set(seen)) == list(range(400))
        assert consumer.poll(max_events=10, timeout=0.1) == []
        status = client.describe_group("g", "t")
        assert sum(s.lag for s in status) == 0


def test_connection_lost_after_retry_timeout_names_the_server_without_its_password(
        server: TemporaryServer, db: str) -> None:
    secret = "s3cr3t-pw"
    dsn = make_conninfo(db, password=secret)  # trust authentication ignores it
    with pgstreams.connect(dsn, retry_timeout=1.0) as client:
        client.create_topic("t", 1)
        client.publish("t", "before")
        server.stop("fast")
        try:
            started = time.monotonic()
            with pytest.raises(pgstreams.ConnectionLost) as info:
                client.publish("t", "during")
            assert time.monotonic() - started < 30
            assert isinstance(info.value, pgstreams.PgStreamsError)
            message = str(info.value)
            assert "127.0.0.1" in message and secret not in message
            assert secret not in repr(client)
            with pytest.raises(pgstreams.ConnectionLost):
                client.consumer("t", "g").poll(timeout=0.1)
        finally:
            server.start()
        assert client.publish("t", "after").position > 0  # the same client works again
    assert set(_stored(db, "t")) <= {"before", "during", "after"}


def test_killed_connections_under_load_lose_and_duplicate_nothing(server: TemporaryServer, db: str) -> None:
    """pg_terminate_backend of random pgstreams sessions every 200 ms while two producers (single and
    batch) and a group consumer run."""
    with pgstreams.connect(db, retry_timeout=60) as client:
        client.create_topic("t", 3)
        single, batch = _Publisher(client, "t"), _Publisher(client, "t", batch=True)
        # the batch publisher's values must differ from the single one's
        batch.sent = 10_000_000
        consumer = client.consumer("t", "g")
        seen: Counter[object] = Counter()
        stop = threading.Event()
        errors: list[BaseException] = []

        def consume() -> None:
            try:
                while not stop.is_set():
                    got = consumer.poll(max_events=100, timeout=0.2)
                    seen.update(e.value for e in got)
                    if got:
                        consumer.commit(got)
            except BaseException as exc:  # noqa: BLE001 - asserted below
                errors.append(exc)

        reader = threading.Thread(target=consume, daemon=True)
        for t in (single, batch, reader):
            t.start()
        killed = 0
        with psycopg.connect(server.dsn, autocommit=True) as admin:
            deadline = time.monotonic() + 6.0
            while time.monotonic() < deadline:
                row = admin.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s "
                    "AND pid <> pg_backend_pid() ORDER BY random() LIMIT 1",
                    (conninfo_to_dict(db)["dbname"],)).fetchone()
                killed += bool(row and row[0])
                time.sleep(0.2)
        single.stop.set()
        batch.stop.set()
        single.join(60)
        batch.join(60)
        assert single.errors == [] and batch.errors == []
        until(lambda: sum(seen.values()) >= single.sent + batch.sent - 10_000_000 or bool(errors), 60,
              "the consumer to catch up")
        stop.set()
        reader.join(30)
        assert errors == []
        assert killed > 5
    stored = _stored(db, "t")
    expected = set(range(single.sent)) | set(range(10_000_000, batch.sent))
    assert set(stored) == expected and max(stored.values()) == 1
    assert expected <= set(seen)  # at least once


def test_a_retried_publish_whose_first_attempt_committed_is_not_stored_again(db: str) -> None:
    """The retry path after an unknown outcome: the event of the first attempt is found by its producer tag
    above the position known before it, and returned instead of being stored again."""
    with pgstreams.connect(db) as client:
        client.create_topic("t", 2)
        producer = client._producer
        state = client.topic_state("t")
        floor = state.known
        first = client.publish("t", "once", key="k")
        tag_row = client.store.executor.one(
            "produced", {"partitions": [first.partition], "floor": floor,
                         "producer": producer._base | 1}, topic_id=state.id)
        assert tag_row is not None and int(tag_row[1]) == first.position
        row = (first.partition, "s", "k", b"once", None, None, None, None, None, producer._base | 1)
        again = producer._again("t", state, row, floor, None, psycopg.OperationalError("lost"))
        assert (again.partition, again.position) == (first.partition, first.position)
        # a tag that was never stored is published
        fresh = (first.partition, "s", "k", b"new", None, None, None, None, None, producer.tag())
        stored = producer._again("t", state, fresh, floor, None, psycopg.OperationalError("lost"))
        assert stored.position > first.position
    assert _stored(db, "t") == Counter({"once": 1, "new": 1})


def test_a_transactional_worker_group_rides_through_a_restart_exactly_once(server: TemporaryServer,
                                                                           db: str) -> None:
    total = 300
    with pgstreams.connect(db, retry_timeout=60) as client:
        client.create_topic("t", 4)
        with client.connection() as conn:
            conn.execute("CREATE TABLE handled (value int)")
        client.publish_many("t", [{"value": i} for i in range(total // 2)])

        def handle(event: pgstreams.Event, conn: psycopg.Connection) -> None:
            conn.execute("INSERT INTO handled VALUES (%s)", (event.value,))

        def handled() -> list[int]:
            with psycopg.connect(db) as c:
                return [r[0] for r in c.execute("SELECT value FROM handled").fetchall()]

        workers = []
        clients = [pgstreams.connect(db, retry_timeout=60) for _ in range(2)]
        for c in clients:
            w = pgstreams.Worker(c)
            w.subscribe("t", "g", handle, mode="transactional", heartbeat_interval=0.2, session_timeout=2.0)
            workers.append(w)
        with clients[0], clients[1], running(workers[0]), running(workers[1]):
            until(lambda: len(handled()) >= 50, 60, "events handled before the restart")
            server.restart("immediate", down=1.0)
            back = time.monotonic()
            client.publish_many("t", [{"value": i} for i in range(total // 2, total)])
            until(lambda: len(handled()) >= total, 60, "every event handled after the restart")
            recovered = time.monotonic() - back
            assert [w.failure for w in workers] == [None, None]  # no ServiceFailed
        values = handled()
        assert sorted(values) == list(range(total))  # exactly once
        assert recovered < 60


def test_debug_logs_never_show_the_password_over_a_restart_and_connection_lost(
        server: TemporaryServer, db: str, caplog: pytest.LogCaptureFixture) -> None:
    """Every logger (pgstreams', psycopg's, its pool's) at DEBUG over the retries of a restart, the pool's
    reconnections and a :class:`pgstreams.ConnectionLost`: the DSN's password appears in no record, no
    formatted traceback."""
    secret = "L0g-s3cr3t-pw"
    info = conninfo_to_dict(db)
    dsn = (f"postgresql://{info.get('user') or 'postgres'}:{secret}@{info.get('host')}:{info.get('port')}/"
           f"{info['dbname']}")  # the URI form (trust authentication ignores the password)
    caplog.set_level("DEBUG")
    with pgstreams.connect(dsn, retry_timeout=30) as client:
        client.create_topic("t", 2)
        client.publish("t", "before")
        consumer = client.consumer("t", "g")
        consumer.commit(consumer.poll(max_events=10, timeout=5))
        server.restart("immediate", down=0.5)
        client.publish("t", "during")  # retried on fresh connections
        client.publish_many("t", [{"value": i} for i in range(5)])
        got = consumer.poll(max_events=10, timeout=5)
        consumer.commit(got)
    with pgstreams.connect(dsn, retry_timeout=1) as brief:
        brief.publish("t", "brief")
        server.stop("fast")
        try:
            with pytest.raises(pgstreams.ConnectionLost) as lost:
                brief.publish("t", "lost")
            assert secret not in str(lost.value)
        finally:
            server.start()
    assert caplog.records, "nothing was logged"
    assert any(r.name.startswith("pgstreams") for r in caplog.records)
    for record in caplog.records:
        assert secret not in record.getMessage(), record.name
    assert secret not in caplog.text  # the formatted records, tracebacks included


def test_after_an_outage_longer_than_retry_timeout_the_next_calls_do_not_wait_on_the_pools_backoff(
        server: TemporaryServer, db: str) -> None:
    """An outage longer than ``retry_timeout``: the call during it raises ConnectionLost once; once the
    server is back, the next publish and the next poll complete at once (psycopg's pool would wait out its
    doubling reconnection delay, 4 s and more, before trying the server again)."""
    with pgstreams.connect(db, retry_timeout=4) as client:
        client.create_topic("t", 2)
        client.publish_many("t", [{"value": i} for i in range(10)])
        consumer = client.consumer("t", "g")
        assert len(consumer.poll(max_events=100, timeout=2)) == 10
        consumer.commit()
        server.stop()
        try:
            with pytest.raises(pgstreams.ConnectionLost):
                consumer.poll(timeout=1)
            time.sleep(4)  # the outage goes on past retry_timeout: the pool's own delay grows to 4 s and more
        finally:
            server.start()
        started = time.monotonic()
        client.publish("t", "after", partition=0)
        got = consumer.poll(timeout=5)
        took = time.monotonic() - started
        assert [e.value for e in got] == ["after"]
        # well under retry_timeout: no call waited for a connection the pool was not trying to make
        assert took < 3.0, f"the first calls after the outage took {took:.2f} s"
