"""The worker runtime: run_consumer, named services and their supervisor, hand-over between workers,
graceful stop, and bad input."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import psycopg
import pytest

import pgstreams
from _core_helpers import until
from pgstreams import InvalidArgument, ServiceFailed, Worker
from pgstreams.services import Service, Supervisor
from pgstreams.worker import run_consumer


def test_run_consumer_handles_its_partitions_until_told_to_stop(client: pgstreams.Client) -> None:
    client.create_topic("t", 3)
    client.publish_many("t", [{"value": i, "partition": i % 3} for i in range(30)])
    consumer = client.consumer("t", "g")
    only = pgstreams.Consumer(client, "t", "g", partitions=[1])
    assert only.partitions == (1,)
    seen: list[int] = []
    done = threading.Event()

    def handle(ev: pgstreams.Event) -> None:
        seen.append(ev.value)
        if len(seen) == 10:
            done.set()

    worker = run_consumer(client, only, handle, until=done, install_signal_handlers=False)
    assert sorted(seen) == list(range(1, 30, 3))
    assert worker.stats.events == 10
    assert {s.partition: s.lag for s in pgstreams.group_status(client, "g")} == {0: 10, 1: 0, 2: 10}
    assert consumer.poll(100, timeout=1) and not pgstreams.group_members(client, "g")
    with pgstreams.connect(client.dsn, schema=client.schema) as other, pytest.raises(InvalidArgument):
        run_consumer(other, only, handle, install_signal_handlers=False)  # not other's consumer


def test_a_dead_service_stops_the_worker_loudly(client: pgstreams.Client,
                                                caplog: pytest.LogCaptureFixture) -> None:
    client.create_topic("t", 2)
    worker = Worker(client, install_signal_handlers=False)
    worker.subscribe("t", "g", lambda ev: None, heartbeat_interval=0.1, session_timeout=1.0)
    worker.start()
    member = worker.members[0]

    def broken() -> pgstreams.groups.Leases:
        raise RuntimeError("heartbeat bug")

    member.heartbeat = broken  # type: ignore[method-assign]
    assert worker.wait(10), "the worker stops when a service dies"
    assert isinstance(worker.failure, ServiceFailed)
    assert worker.failure.service == "heartbeat:g/t"
    assert "heartbeat bug" in str(worker.failure)
    assert any(r.levelname == "CRITICAL" and "heartbeat:g/t" in r.getMessage() for r in caplog.records)
    assert not pgstreams.group_members(client, "g"), "it left the group on the way out"
    assert all(s.owner is None for s in pgstreams.group_status(client, "g"))


class Boom(BaseException):
    """Not an Exception: escapes the handler error handling and kills the runner."""


def test_run_raises_service_failed_when_the_runner_dies(client: pgstreams.Client) -> None:
    client.create_topic("t", 1)
    client.publish("t", "x")

    def handle(ev: pgstreams.Event) -> None:
        raise Boom("handler escaped")

    worker = Worker(client, install_signal_handlers=False)
    worker.subscribe("t", "g", handle, heartbeat_interval=0.1, session_timeout=1.0)
    with pytest.raises(ServiceFailed, match="runner:g/t") as err:
        worker.run()
    assert isinstance(err.value.__cause__, Boom)


def test_service_and_supervisor_basics() -> None:
    ticks: list[int] = []
    svc = Service("ticker", lambda: ticks.append(1), interval=0.01)
    failures: list[ServiceFailed] = []
    sup = Supervisor([svc], failures.append, check_interval=0.01)
    svc.start()
    sup.start()
    until(lambda: len(ticks) >= 3, what="ticks")
    svc.stop(5)
    assert not svc.alive and not svc.died
    sup.stop()
    assert not failures

    def fail() -> None:
        raise ValueError("boom")

    bad = Service("bad", fail, interval=0.01)
    sup = Supervisor([bad], failures.append, check_interval=0.01)
    bad.start()
    sup.start()
    until(lambda: bool(failures), what="the supervisor to notice")
    assert failures[0].service == "bad" and isinstance(failures[0].__cause__, ValueError)
    with pytest.raises(ServiceFailed):
        sup.check()


def test_partitions_move_between_workers_and_none_is_handled_twice(dsn: str) -> None:
    """Two workers of one group in this process: the second takes its share by hand-over, the first's
    stop hands everything back; every event is handled exactly once (transactional)."""
    with pgstreams.connect(dsn) as a_client, pgstreams.connect(dsn) as b_client:
        a_client.create_topic("t", 6)
        with a_client.connection() as conn:
            conn.execute("CREATE TABLE handled (position bigint PRIMARY KEY, member text)")

        calls: list[tuple[int, float, float, str]] = []  # partition, start, end, member of each handler call
        calls_lock = threading.Lock()

        def handler(name: str) -> Callable[..., None]:
            def handle(ev: pgstreams.Event, conn: object) -> None:
                began = time.monotonic()
                conn.execute("INSERT INTO handled VALUES (%s, %s)", (ev.position, name))  # type: ignore[attr-defined]
                with calls_lock:
                    calls.append((ev.partition, began, time.monotonic(), name))
            return handle

        opts = {"mode": "transactional", "heartbeat_interval": 0.1, "session_timeout": 1.0}
        a = Worker(a_client, member_id="a", install_signal_handlers=False)
        a.subscribe("t", "g", handler("a"), **opts)  # type: ignore[arg-type]
        b = Worker(b_client, member_id="b", install_signal_handlers=False)
        b.subscribe("t", "g", handler("b"), **opts)  # type: ignore[arg-type]
        stop = threading.Event()
        published = [0]

        def produce() -> None:
            while not stop.is_set():
                a_client.publish_many("t", [{"value": i} for i in range(20)])
                published[0] += 20
                time.sleep(0.01)

        producer = threading.Thread(target=produce)
        a.start()
        producer.start()
        try:
            until(lambda: a.assignment()[("g", "t")] == tuple(range(6)), what="a owns everything")
            b.start()
            until(lambda: len(a.assignment()[("g", "t")]) == 3 and len(b.assignment()[("g", "t")]) == 3,
                  what="3 + 3")
            assert set(a.assignment()[("g", "t")]).isdisjoint(b.assignment()[("g", "t")])
            a.stop(10)
            until(lambda: b.assignment()[("g", "t")] == tuple(range(6)), what="b owns everything")
        finally:
            stop.set()
            producer.join()
        try:
            def done() -> bool:
                with a_client.connection() as conn:
                    return conn.execute("SELECT count(*) FROM handled").fetchone() == (published[0],)
            until(done, what="every event handled")
        finally:
            b.stop(10)
        with a_client.connection() as conn:
            by = dict(conn.execute("SELECT member, count(*) FROM handled GROUP BY 1").fetchall())
        assert set(by) == {"a", "b"} and sum(by.values()) == published[0]
        assert all(s.lag == 0 and s.owner is None for s in pgstreams.group_status(a_client, "g"))
        # a second handling of an event would have failed on the primary key and been retried or
        # dead-lettered: none of that happened
        for w in (a, b):
            assert (w.stats.failures, w.stats.dead_lettered, w.stats.fenced) == (0, 0, 0), w.stats
        # at no moment did both members run the handler on one partition
        last_end: dict[tuple[int, str], float] = {}
        moves = 0
        for partition, began, ended, name in sorted(calls, key=lambda c: c[1]):
            other = "b" if name == "a" else "a"
            assert last_end.get((partition, other), 0.0) <= began, f"a and b overlapped on {partition}"
            if (partition, other) in last_end and (partition, name) not in last_end:
                moves += 1
            last_end[(partition, name)] = max(last_end.get((partition, name), 0.0), ended)
        assert moves >= 3, "partitions moved from a to b while events flowed"


def test_one_worker_runs_several_subscriptions(client: pgstreams.Client) -> None:
    """One process, two subscriptions (two topics, two groups, two handler kinds): each handler gets
    exactly its events, the worker is a member of both groups, and stopping leaves both."""
    client.create_topic("orders", 2)
    client.create_topic("clicks", 3)
    client.publish_many("orders", [{"value": i} for i in range(20)])
    client.publish_many("clicks", [{"value": 100 + i} for i in range(30)])
    with client.connection() as conn:
        conn.execute("CREATE TABLE clicks_seen (v integer PRIMARY KEY)")
    orders: list[int] = []

    def on_clicks(events: list[pgstreams.Event], conn: object) -> None:
        for e in events:
            conn.execute("INSERT INTO clicks_seen VALUES (%s)", (e.value,))  # type: ignore[attr-defined]

    worker = Worker(client, member_id="w", install_signal_handlers=False)
    worker.subscribe("orders", "billing", lambda ev: orders.append(ev.value), heartbeat_interval=0.2,
                     session_timeout=1.5)
    worker.subscribe("clicks", "analytics", on_clicks, batch=True, mode="transactional", max_events=7,
                     heartbeat_interval=0.2, session_timeout=1.5)
    assert [(s.topic, s.group) for s in worker.subscriptions] == [("orders", "billing"),
                                                                   ("clicks", "analytics")]

    def caught_up(group: str) -> bool:
        rows = pgstreams.group_status(client, group)
        return bool(rows) and all(r.lag == 0 for r in rows)

    worker.start()
    try:
        until(lambda: caught_up("billing") and caught_up("analytics"), what="both groups to catch up")
        assert worker.assignment() == {("billing", "orders"): (0, 1), ("analytics", "clicks"): (0, 1, 2)}
        for group in ("billing", "analytics"):
            assert {s.owner for s in pgstreams.group_status(client, group)} == {"w"}
            assert [m.member_id for m in pgstreams.group_members(client, group)] == ["w"]
    finally:
        worker.stop(10)
    assert sorted(orders) == list(range(20))
    with client.connection() as conn:
        rows = conn.execute("SELECT v FROM clicks_seen ORDER BY v").fetchall()
    assert [r[0] for r in rows] == list(range(100, 130))
    for group in ("billing", "analytics"):
        assert all(s.owner is None for s in pgstreams.group_status(client, group))
        assert not pgstreams.group_members(client, group)


def test_a_worker_survives_its_database_connections_being_terminated(dsn: str) -> None:
    """Every connection of the worker is terminated by the server while it runs (as on a failover or a
    restart): it logs, reconnects, keeps its membership and handles what comes next, exactly once."""
    with pgstreams.connect(dsn, poll_interval=0.1) as client:
        client.create_topic("t", 3)
        with client.connection() as conn:
            conn.execute("CREATE TABLE handled (position bigint PRIMARY KEY)")

        def handle(ev: pgstreams.Event, conn: object) -> None:
            conn.execute("INSERT INTO handled VALUES (%s)", (ev.position,))  # type: ignore[attr-defined]

        def handled() -> int:
            with psycopg.connect(dsn) as conn:
                row = conn.execute("SELECT count(*) FROM handled").fetchone()
            return int(row[0]) if row else 0

        worker = Worker(client, member_id="w", install_signal_handlers=False)
        worker.subscribe("t", "g", handle, mode="transactional", heartbeat_interval=0.2, session_timeout=3.0)
        client.publish_many("t", [{"value": i} for i in range(30)])
        worker.start()
        try:
            until(lambda: handled() == 30, what="the first 30 events")
            with psycopg.connect(dsn, autocommit=True) as admin:
                killed = admin.execute(
                    "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                    " WHERE datname = current_database() AND pid <> pg_backend_pid()) k").fetchone()
            assert killed is not None and killed[0] >= 3  # pool, listener, heartbeat, balancer
            with pgstreams.connect(dsn) as producer:
                producer.publish_many("t", [{"value": i} for i in range(30, 60)])
            until(lambda: handled() == 60, what="the events published after the connections were cut")
            assert worker.failure is None and not any(s.died for s in worker._services)
            assert worker.stats.dead_lettered == 0 and worker.stats.fenced == 0
            assert {s.owner for s in pgstreams.group_status(client, "g")} == {"w"}
        finally:
            worker.stop(10)
        assert all(s.lag == 0 for s in pgstreams.group_status(client, "g"))


def test_a_failed_start_leaves_no_member_behind(client: pgstreams.Client) -> None:
    client.create_topic("t1", 2)
    client.create_topic("t2", 2)
    worker = Worker(client, install_signal_handlers=False)
    worker.subscribe("t1", "g", lambda ev: None, heartbeat_interval=0.2, session_timeout=1.5)
    worker.subscribe("t2", "g", lambda ev: None, heartbeat_interval=0.2, session_timeout=1.5)
    client.delete_topic("t2")  # the second topic disappears between subscribe and start
    with pytest.raises(pgstreams.TopicNotFound):
        worker.start()
    assert not pgstreams.group_members(client, "g"), "the member of t1 left again"
    assert all(s.owner is None for s in pgstreams.group_status(client, "g", "t1"))
    worker.stop(5)


def test_subscribe_rejects_bad_input(client: pgstreams.Client) -> None:
    client.create_topic("t", 2)
    w = Worker(client, install_signal_handlers=False)
    with pytest.raises(InvalidArgument, match="no subscriptions"):
        w.start()
    w = Worker(client, install_signal_handlers=False)

    def one_arg(event: pgstreams.Event) -> None: ...

    def two_args(event: pgstreams.Event, conn: object) -> None: ...

    async def coroutine(event: pgstreams.Event) -> None: ...

    bad: list[tuple[dict, type[Exception], str]] = [
        ({"handler": 3}, InvalidArgument, "callable"),
        ({"handler": coroutine, "mode": "transactional"}, InvalidArgument, r"handler\(event, conn\)"),
        ({"handler": one_arg, "mode": "transactional"}, InvalidArgument, r"handler\(event, conn\)"),
        ({"handler": one_arg, "mode": "transactional", "batch": True}, InvalidArgument,
         r"handler\(events, conn\)"),
        ({"handler": two_args}, InvalidArgument, r"handler\(event\)"),
        ({"max_events": -1}, InvalidArgument, "max_events"),
        ({"max_wait": -0.5}, InvalidArgument, "max_wait"),
        ({"session_timeout": -1}, InvalidArgument, "session_timeout"),
        ({"heartbeat_interval": 0}, InvalidArgument, "heartbeat_interval"),
        ({"heartbeat_interval": 2.0, "session_timeout": 3.0}, InvalidArgument, "at least twice"),
        ({"session_timeout": 4.0}, InvalidArgument, "at least twice"),  # the group's heartbeat: 3 s
        ({"mode": "exactly-twice"}, InvalidArgument, "mode"),
        ({"min_events": 5, "max_events": 2}, InvalidArgument, "must not exceed"),
        ({"retry": {"max_attempts": 3}}, InvalidArgument, "RetryPolicy"),
        ({"dead_letter": "t"}, InvalidArgument, "itself"),
        ({"dead_letter": "no good"}, pgstreams.InvalidName, "invalid topic name"),
        ({"dead_letter": 1.5}, InvalidArgument, "dead_letter"),
        ({"topic": "missing"}, pgstreams.TopicNotFound, "missing"),
        ({"group": "bad group"}, pgstreams.InvalidName, "group"),
        ({"start": "yesterday"}, InvalidArgument, "start"),
        ({"batch": "yes"}, InvalidArgument, "batch"),
        ({"partitions": [7]}, InvalidArgument, "partitions"),
    ]
    for override, exc, fragment in bad:
        kwargs = {"topic": "t", "group": "g", "handler": print, **override}
        with pytest.raises(exc, match=fragment):
            w.subscribe(kwargs.pop("topic"), kwargs.pop("group"), kwargs.pop("handler"), **kwargs)
    assert not w.subscriptions
    w.subscribe("t", "g", print)
    with pytest.raises(InvalidArgument, match="already subscribed"):
        w.subscribe("t", "g", print)
    with client.connection() as conn:
        assert conn.execute("SELECT count(*) FROM pgstreams.members").fetchone() == (0,)
    assert not client.list_groups(), "bad input changed nothing (no checkpoints either)"
    for kwargs, fragment in [({"member_id": ""}, "member_id"), ({"member_id": 7}, "member_id"),
                             ({"shutdown_timeout": -1}, "shutdown_timeout"), ({"clock": 3}, "clock")]:
        with pytest.raises(InvalidArgument, match=fragment):
            Worker(client, **kwargs)  # type: ignore[arg-type]


def test_load_handler() -> None:
    from pgstreams.worker import load_handler

    assert load_handler("os.path:join") is __import__("os").path.join
    for spec, fragment in [("os.path", "MODULE:FUNCTION"), ("no_such_module_x:f", "cannot import"),
                           ("os:nope", "no attribute"), ("os:sep", "not callable"), (":f", "MODULE")]:
        with pytest.raises(InvalidArgument, match=fragment):
            load_handler(spec)
