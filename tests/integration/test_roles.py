"""Least-privilege roles: real LOGIN roles connect with their own credentials; every forbidden action fails
with PermissionDenied naming the object, every allowed one works (enforced by PostgreSQL)."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

import pgstreams
from _core_helpers import running, until


@pytest.fixture
def roles(dsn: str) -> Iterator[dict[str, str]]:
    """Three LOGIN roles with passwords (unique names, dropped afterwards): their DSNs by kind."""
    suffix = uuid.uuid4().hex[:8]
    names = {kind: f"pgs_{kind}_{suffix}" for kind in ("producer", "consumer", "admin", "nobody")}
    with psycopg.connect(dsn, autocommit=True) as conn:
        for name in names.values():
            conn.execute(psycopg.sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
                psycopg.sql.Identifier(name), psycopg.sql.Literal(f"pw-{name}")))
    try:
        yield {kind: make_conninfo(dsn, user=name, password=f"pw-{name}") for kind, name in names.items()} | {
            f"{kind}_role": name for kind, name in names.items()}
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            for name in names.values():
                ident = psycopg.sql.Identifier(name)
                conn.execute(psycopg.sql.SQL("DROP OWNED BY {}").format(ident))
                conn.execute(psycopg.sql.SQL("DROP ROLE {}").format(ident))


def test_producer_consumer_and_admin_roles(client: pgstreams.Client, roles: dict[str, str]) -> None:
    client.create_topic("orders", 2)
    client.create_topic("secret", 1)
    client.publish("secret", "hidden")
    client.grant(roles["producer_role"], produce=["orders"])
    client.grant(roles["consumer_role"], consume="billing", topics=["orders"])
    client.grant(roles["admin_role"], admin=True)

    with pgstreams.connect(roles["producer"], migrate=False) as producer:
        assert producer.publish("orders", {"n": 1}, key="a").position > 0
        assert producer.publish_many("orders", [{"value": i} for i in range(5)]) == 5
        assert producer.publish("orders", "x", event_id="e1").duplicate is False
        for action in (lambda: producer.publish("secret", "no"),
                       lambda: producer.publish_many("secret", [{"value": 1}])):
            with pytest.raises(pgstreams.PermissionDenied, match="secret"):
                action()
        with pytest.raises(pgstreams.PermissionDenied, match="create topic 'new'"):
            producer.create_topic("new", 1)
        with pytest.raises(pgstreams.PermissionDenied, match="delete topic 'orders'"):
            producer.delete_topic("orders")
        with pytest.raises(pgstreams.PermissionDenied, match="orders"):
            producer.consumer("orders", "billing")

    with pgstreams.connect(roles["consumer"], migrate=False) as consumer_client:
        c = consumer_client.consumer("orders", "billing")
        got = []
        while len(got) < 7:
            batch = c.poll(max_events=100, timeout=2.0)
            assert batch
            got.extend(batch)
            assert c.commit(batch) is pgstreams.CommitOutcome.STORED
        with pytest.raises(pgstreams.PermissionDenied, match="other"):
            consumer_client.consumer("orders", "other")  # another group
        with pytest.raises(pgstreams.PermissionDenied, match="secret"):
            consumer_client.consumer("secret", "billing")  # another topic
        with pytest.raises(pgstreams.PermissionDenied, match="orders"):
            consumer_client.publish("orders", "no")
        with pytest.raises(pgstreams.PermissionDenied, match="billing"):
            c.seek_to_beginning()  # moving a checkpoint back is a reset
        with pytest.raises(pgstreams.PermissionDenied, match="billing"):
            consumer_client.reset_group("billing", "orders", to_earliest=True)
        with pytest.raises(pgstreams.PermissionDenied, match="billing"):
            consumer_client.delete_group("billing")
        with pytest.raises(pgstreams.PermissionDenied, match="alter topic 'orders'"):
            consumer_client.alter_topic("orders", {"retention.ms": 1000})

    with pytest.raises(pgstreams.PermissionDenied, match="schema 'pgstreams'"):
        pgstreams.connect(roles["nobody"], migrate=False)  # a role without any grant

    with pgstreams.connect(roles["admin"], migrate=False) as admin:
        admin.create_topic("new", 1)
        admin.reset_group("billing", "orders", to_earliest=True)
        admin.delete_topic("new")

    with psycopg.connect(roles["producer"], autocommit=True) as conn:  # an idempotent SQL publish
        pid = conn.execute("SELECT pgstreams.new_producer_id()").fetchone()[0]  # type: ignore[index]
        call = "SELECT duplicate FROM pgstreams.publish('orders', 'sql'::text, producer => %s, sequence => 1)"
        assert [conn.execute(call, (pid,)).fetchone() for _ in range(2)] == [(False,), (True,)]

    assert client.revoke(roles["producer_role"], produce=["orders"]) == 1
    with pgstreams.connect(roles["producer"], migrate=False) as producer:
        with pytest.raises(pgstreams.PermissionDenied, match="orders"):
            producer.publish("orders", "after revoke")


def test_grant_refuses_bad_input_and_changes_nothing(client: pgstreams.Client) -> None:
    client.create_topic("t", 1)
    with pytest.raises(pgstreams.InvalidArgument, match="nothing to grant"):
        client.grant("postgres")
    with pytest.raises(pgstreams.InvalidArgument, match="topics"):
        client.grant("postgres", consume="g")
    with pytest.raises(pgstreams.InvalidName):
        client.grant("postgres", produce=["bad name"])
    with pytest.raises(pgstreams.PgStreamsError, match="does not exist"):
        client.grant(f"no_such_role_{uuid.uuid4().hex[:6]}", produce=["t"])


def test_cli_grant_and_revoke(dsn: str, client: pgstreams.Client, roles: dict[str, str]) -> None:
    client.create_topic("a", 1)
    client.create_topic("b", 1)
    role = roles["producer_role"]

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "pgstreams.cli", *args, "--dsn", dsn],
                              capture_output=True, text=True, timeout=120)

    done = cli("grant", role, "--produce", "a", "--produce", "b")
    assert done.returncode == 0, done.stderr
    done = cli("grant", role, "--consume", "g", "--topic", "a,b")
    assert done.returncode == 0, done.stderr
    with pgstreams.connect(roles["producer"], migrate=False) as producer:
        producer.publish("b", "ok")
        producer.consumer("a", "g")
    done = cli("revoke", role, "--produce", "b")
    assert done.returncode == 0 and "revoked 1" in done.stdout
    bad = cli("grant", role)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    with pgstreams.connect(roles["producer"], migrate=False) as producer:
        with pytest.raises(pgstreams.PermissionDenied):
            producer.publish("b", "no")
    # the DSN's password never reaches the output of a failing command
    secret_dsn = roles["producer"]
    failing = subprocess.run([sys.executable, "-m", "pgstreams.cli", "topics", "create", "zzz",
                              "--dsn", secret_dsn], capture_output=True, text=True, timeout=120)
    assert failing.returncode == 1 and "Traceback" not in failing.stderr
    assert f"pw-{role}" not in failing.stderr + failing.stdout


def test_share_group_roles(dsn: str, client: pgstreams.Client, roles: dict[str, str]) -> None:
    """A consumer role acquires, acks, releases, rejects and renews on its share groups of its topics only;
    other share groups, topics and queues fail with PermissionDenied naming them."""
    client.create_topic("jobs", 2)
    client.create_topic("jobs.dlt", 2)
    client.create_topic("secret", 1)
    client.create_queue("tasks")
    client.create_queue("hidden")
    client.publish_many("jobs", [{"value": i, "key": str(i)} for i in range(6)])
    client.publish_many("tasks", [{"value": i} for i in range(3)])
    client.publish_many("hidden", [{"value": 1}])
    client.share_consumer("jobs", "other").poll(max_events=1, timeout=5.0)  # a group the role may not use
    role = roles["consumer_role"]
    client.grant(role, consume="workers", topics=["jobs"])
    done = subprocess.run([sys.executable, "-m", "pgstreams.cli", "grant", role, "--consume", "tasks",
                           "--topic", "tasks", "--dsn", dsn], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    client.grant(role, produce=["jobs.dlt"])  # where its rejected events go

    with pgstreams.connect(roles["consumer"], migrate=False) as c:
        w = c.share_consumer("jobs", "workers", lock_timeout=30.0)
        got: list[pgstreams.Event] = []
        deadline = time.monotonic() + 60
        while len(got) < 6 and time.monotonic() < deadline:
            got.extend(w.poll(max_events=10, timeout=2.0))
        assert sorted(e.value for e in got) == list(range(6))
        assert w.renew(got[:1]).ok
        assert w.release(got[1:2]).ok
        assert w.reject(got[2:3], reason="bad").ok
        assert w.ack(got[3:]).ok
        again: list[pgstreams.Event] = []
        while not again and time.monotonic() < deadline:
            again = w.poll(max_events=10, timeout=2.0)
        assert [e.value for e in again] == [got[1].value] and w.ack(again).ok
        assert w.ack(got[:1]).ok
        q = c.queue("tasks")
        done: list[pgstreams.Event] = []
        while len(done) < 3 and time.monotonic() < deadline:
            batch = q.poll(max_events=10, timeout=2.0)
            assert q.ack(batch).ok
            done.extend(batch)
        assert sorted(e.value for e in done) == [0, 1, 2]

        with pytest.raises(pgstreams.PermissionDenied, match="'other'"):
            c.share_consumer("jobs", "other", dead_letter=False)  # another share group of its topic
        with pytest.raises(pgstreams.PermissionDenied, match="'secret'"):
            c.share_consumer("secret", "workers", dead_letter=False)  # another topic
        with pytest.raises(pgstreams.PermissionDenied, match="'hidden'"):
            c.queue("hidden")  # a queue without a grant
        with pytest.raises(pgstreams.PermissionDenied, match="'jobs'"):
            c.publish("jobs", "no")
    assert client.revoke(role, consume="workers") == 1
    with pgstreams.connect(roles["consumer"], migrate=False) as c:
        with pytest.raises(pgstreams.PermissionDenied, match="'workers'"):
            c.share_consumer("jobs", "workers")
    # nothing of the other group was touched, nothing of the granted groups is left in flight
    assert sum(s.acquired for s in client.describe_share_group("other", "jobs")) == 1
    assert sum(s.acquired + s.available for s in client.describe_share_group("workers", "jobs")) == 0
    assert [e.value for p in (0, 1) for e in client.read_events("jobs.dlt", p)] == [got[2].value]


def test_a_share_worker_runs_as_a_consumer_role(client: pgstreams.Client, roles: dict[str, str]) -> None:
    """A worker subscribed to a share group, connected as a role with the consume grant (and produce on the
    dead-letter topic), handles every event and dead-letters the one that keeps failing."""
    client.create_topic("jobs", 2)
    client.create_topic("jobs.dlt", 2)
    client.publish_many("jobs", [{"value": i, "key": str(i)} for i in range(30)])
    role = roles["consumer_role"]
    client.grant(role, consume="workers", topics=["jobs"])
    client.grant(role, produce=["jobs.dlt"])
    done: set[int] = set()

    def handle(ev: pgstreams.Event) -> None:
        if ev.value == 7:
            raise ValueError("seven")
        done.add(ev.value)

    with pgstreams.connect(roles["consumer"], migrate=False) as c:
        worker = pgstreams.Worker(c, install_signal_handlers=False)
        worker.subscribe("jobs", "workers", handle, share=True, concurrency=2,
                         retry=pgstreams.RetryPolicy(max_attempts=2, backoff=0.05))
        with running(worker):
            until(lambda: len(done) == 29, 60, "the other events handled")
            until(lambda: sum(s.dead_lettered for s in client.describe_share_group("workers")) == 1, 60,
                  "the failing event dead-lettered")
    assert [e.value for p in (0, 1) for e in client.read_events("jobs.dlt", p)] == [7]
