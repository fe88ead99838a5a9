"""Least-privilege roles: real LOGIN roles connect with their own credentials; every forbidden action fails
with PermissionDenied naming the object, every allowed one works (enforced by PostgreSQL)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlencode

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

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


def test_a_password_never_appears_in_the_status_views_or_client_status(
        dsn: str, client: pgstreams.Client, roles: dict[str, str]) -> None:
    """An admin role connects to the test server with its password in the DSN (keyword and URI forms), and
    publishes, reads, commits, acquires from a share group, registers a group member and reads the
    retention state: no row of the status views, nothing of ``client.status()`` and no session's
    ``application_name`` holds the password. (Under trust authentication the server never asks for it:
    then this checks that pgstreams itself never writes it anywhere the server keeps.)"""
    from pgstreams.groups.members import GroupMember

    role = roles["admin_role"]
    secret = f"pw-{role}"
    client.grant(role, admin=True)
    info = conninfo_to_dict(dsn)
    # the test server's own host (a loopback address or the embedded server's socket directory)
    where = urlencode({"host": info.get("host") or "127.0.0.1", "port": info.get("port") or "5432"})
    uri = f"postgresql://{role}:{secret}@/{info['dbname']}?{where}"
    for n, role_dsn in enumerate((roles["admin"], uri)):
        with pgstreams.connect(role_dsn, migrate=False) as admin:
            topic = f"orders{n}"
            admin.create_topic(topic, 2)
            admin.publish_many(topic, [{"value": i, "key": str(i)} for i in range(6)])
            admin.publish(topic, {"one": 1})
            consumer = admin.consumer(topic, "billing")
            consumer.commit(consumer.poll(max_events=3, timeout=5))
            shares = admin.share_consumer(topic, "crunch", lock_timeout=600)
            got = shares.poll(max_events=2, timeout=5)
            assert got
            shares.ack(got[:1])
            member = GroupMember(admin, topic, "billing")
            try:
                member.balance()
                snapshot = admin.status()
                assert snapshot.groups and snapshot.partitions
                assert secret not in repr(snapshot)
                assert secret not in repr(admin.retention_status()) + repr(admin.describe_group("billing"))
                assert secret not in repr(admin.describe_share_group("crunch"))
                with psycopg.connect(dsn, autocommit=True) as conn:
                    for view in ("consumer_group_status", "share_group_status", "retention_status",
                                 "members"):
                        rows = conn.execute(psycopg.sql.SQL("SELECT t::text FROM pgstreams.{} t").format(
                            psycopg.sql.Identifier(view))).fetchall()
                        assert rows, view
                        assert not [r for r in rows if secret in r[0]], view
                    apps = conn.execute("SELECT coalesce(application_name, '') || ' ' || coalesce(query, '') "
                                        "FROM pg_stat_activity WHERE usename = %s", (role,)).fetchall()
                    assert apps and not [a for a in apps if secret in a[0]]
            finally:
                member.close()


def test_cli_reads_the_dsn_from_a_service_file_and_a_password_file_and_never_prints_the_password(
        dsn: str, client: pgstreams.Client, roles: dict[str, str], tmp_path: Path) -> None:
    """Without ``--dsn`` or ``PGSTREAMS_DSN``, the CLI connects through libpq's own sources: a service file
    (``PGSERVICEFILE``, ``PGSERVICE``) with the password in it, or in a password file (``PGPASSFILE``). The
    commands work as the admin role (on the test server), and no output, succeeding or failing (an unknown
    topic, an unreachable server), shows the password."""
    role = roles["admin_role"]
    secret = f"pw-{role}"
    client.grant(role, admin=True)
    info = conninfo_to_dict(dsn)
    port, dbname = info.get("port") or "5432", info["dbname"]
    host = info.get("host") or "127.0.0.1"  # the test server's own (an address or a socket directory)
    services = tmp_path / "pg_service.conf"
    services.write_text(
        f"[with_password]\nhost={host}\nport={port}\ndbname={dbname}\nuser={role}\npassword={secret}\n\n"
        f"[with_passfile]\nhost={host}\nport={port}\ndbname={dbname}\nuser={role}\n\n"
        f"[unreachable]\nhost=127.0.0.1\nport=1\ndbname={dbname}\nuser={role}\npassword={secret}\n")
    passfile = tmp_path / "pgpass"
    passfile.write_text(f"*:{port}:{dbname}:{role}:{secret}\n")  # any host: a socket's is "localhost"
    passfile.chmod(0o600)

    def cli(service: str, *args: str) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        env |= {"PGSERVICEFILE": str(services), "PGSERVICE": service, "PGPASSFILE": str(passfile)}
        done = subprocess.run([sys.executable, "-m", "pgstreams.cli", *args], capture_output=True, text=True,
                              timeout=120, env=env)
        assert secret not in done.stdout + done.stderr, args
        assert "Traceback" not in done.stderr
        return done

    for n, service in enumerate(("with_password", "with_passfile")):
        topic = f"from_service_{n}"
        done = cli(service, "topics", "create", topic, "--partitions", "2")
        assert done.returncode == 0, done.stderr
        done = cli(service, "topics", "list")
        assert done.returncode == 0 and topic in done.stdout, done.stderr
        assert cli(service, "topics", "describe", topic, "--json").returncode == 0
        assert cli(service, "retention").returncode == 0
        missing = cli(service, "topics", "describe", "no_such_topic")
        assert missing.returncode != 0 and "no_such_topic" in missing.stderr
    with psycopg.connect(dsn, autocommit=True) as conn:
        made = conn.execute("SELECT count(*) FROM pgstreams.topics WHERE name LIKE %s",
                            ("from_service_%",)).fetchone()
    assert made == (2,)
    unreachable = cli("unreachable", "topics", "list")
    assert unreachable.returncode == 1 and unreachable.stderr.startswith("error:")
