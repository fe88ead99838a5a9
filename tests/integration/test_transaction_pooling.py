"""``connect(pooler="transaction")`` straight to the server: what a client behind a transaction pooler does,
seen where every server session can be inspected (tests/faults/test_pooler.py runs it behind PgBouncer).

In transaction mode a client keeps nothing in a server session between transactions: no named prepared
statement, no session setting, no session advisory lock. The maintenance leader holds a lease that another
service takes over once it runs out; a maintenance pass holds the schema's lock for one transaction kept
open on a connection of its own (the SQL function ``maintain()`` still sees it); settings a connection of
pgstreams' own needs (lock timeouts, asynchronous commits) are those of each transaction.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import ExitStack

import psycopg
import pytest
from psycopg import sql

import pgstreams
from _core_helpers import Background, wait_until
from pgstreams.maintenance import MaintenanceService

#: What a server session keeps of what ran in it: the settings it changed (with pgstreams' own, which
#: pg_settings does not list), its named prepared statements, its temporary tables.
SESSION_STATE = ("SELECT array(SELECT lower(name) FROM pg_settings WHERE source = 'session'"
                 "       UNION ALL SELECT n FROM unnest(ARRAY['pgstreams.poll_fences',"
                 "       'pgstreams.poll_fences_clean']) AS n"
                 "        WHERE current_setting(n, true) <> '' ORDER BY 1),"
                 " array(SELECT name FROM pg_prepared_statements ORDER BY 1),"
                 " array(SELECT relname::text FROM pg_class"
                 "  WHERE relnamespace = pg_my_temp_schema() ORDER BY 1)")


@pytest.fixture
def pooled_client(dsn: str) -> Iterator[pgstreams.Client]:
    """A client in transaction mode (two pooled connections), straight to the server."""
    client = pgstreams.connect(dsn, pooler="transaction", pool_size=2)
    yield client
    client.close()


def _advisory_locks(dsn: str) -> list[tuple[int, bool]]:
    """The advisory locks of the database of ``dsn``: (backend, granted)."""
    with psycopg.connect(dsn, autocommit=True) as c:
        return [(int(p), bool(g)) for p, g in c.execute(
            "SELECT pid, granted FROM pg_locks WHERE locktype = 'advisory'"
            " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())").fetchall()]


def _work(client: pgstreams.Client) -> None:
    """Publish one by one and in a batch, read and commit as a group, share, and maintain."""
    client.create_topic("t", 2)
    for i in range(30):  # more than psycopg's prepare threshold: each statement would be prepared
        client.publish("t", i, key=str(i))
    client.publish_many("t", [{"value": i} for i in range(30)])
    # with event ids: through a staging table
    client.publish_many("t", [{"value": i, "event_id": f"e{i}"} for i in range(30)])
    consumer = client.consumer("t", "g")
    got = 0
    while events := consumer.poll(max_events=20, timeout=0.2):
        got += len(events)
        consumer.commit()
    assert got == 90
    share = client.share_consumer("t", "s")
    while events := share.poll(max_events=20, timeout=0.2):
        share.ack(events)
    client.maintain()


def _sessions_of(client: pgstreams.Client, count: int) -> list[tuple[list[str], list[str], list[str]]]:
    """:data:`SESSION_STATE` of ``count`` pooled connections of ``client`` (all borrowed at once)."""
    with ExitStack() as stack:
        conns = [stack.enter_context(client.connection()) for _ in range(count)]
        return [tuple(c.execute(SESSION_STATE).fetchone()) for c in conns]  # type: ignore[misc]


def test_a_client_in_transaction_mode_keeps_nothing_in_its_server_sessions(dsn: str) -> None:
    """After publishing, reading, sharing and maintaining, the client's pooled sessions hold no named
    prepared statement, no setting and no temporary table of their own, and no advisory lock is held; in
    session mode the same work leaves all three (the check sees them)."""
    with pgstreams.connect(dsn, pooler="transaction", pool_size=2) as client:
        _work(client)
        assert _sessions_of(client, 2) == [([], [], []), ([], [], [])]
        assert _advisory_locks(dsn) == []
    with pgstreams.connect(dsn, pool_size=2) as client:  # session mode: what the check would find
        client.delete_topic("t")
        _work(client)
        kept = _sessions_of(client, 2)
        assert all("jit" in settings for settings, _, _ in kept)
        assert any("pgstreams.poll_fences" in settings for settings, _, _ in kept)
        assert any(prepared for _, prepared, _ in kept)
        assert any(temporary for _, _, temporary in kept)


def test_the_maintenance_leader_holds_a_lease_that_another_service_takes_over_once_it_runs_out(
        dsn: str, pooled_client: pgstreams.Client) -> None:
    """Two maintenance services in transaction mode: the first leads by a lease (no advisory lock held),
    the second does not while the lease runs; once the first stops renewing it (as a dead process), the
    second takes over after the lease ran out; a service that stops resigns at once."""
    first = MaintenanceService(pooled_client, 2.0)  # a lease of 6 s
    second = MaintenanceService(pooled_client, 2.0)
    try:
        first.step()
        second.step()
        assert (first.leader, second.leader) == (True, False)
        assert first.passes == 1 and second.passes == 0
        assert pooled_client.store.operations.maintenance_leader() == first.holder
        assert _advisory_locks(dsn) == []
        renewed = time.monotonic()
        first.step()  # renews its lease
        assert first.leader and first.passes == 2

        def took_over() -> bool:
            second.step()
            return second.leader
        wait_until(took_over, 60, "the second service to take over the lease", every=0.2)
        assert time.monotonic() - renewed >= first.lease - 1.0  # not before the first one's lease ran out
        assert pooled_client.store.operations.maintenance_leader() == second.holder
        first.step()
        assert not first.leader  # its lease ran out and is another's
        second.finish()  # resigns
        assert pooled_client.store.operations.maintenance_leader() is None
        first.step()
        assert first.leader
    finally:
        first.finish()
        second.finish()


def test_a_pass_holds_the_maintenance_lock_for_one_transaction_which_the_sql_function_sees(
        dsn: str, pooled_client: pgstreams.Client) -> None:
    """In transaction mode a pass's lock is the schema's maintenance lock taken by a transaction held open
    on a connection of its own: the SQL function ``maintain()`` (pg_cron's) skips while it is held, and once
    released no advisory lock is left."""
    ops = pooled_client.store.operations
    with pooled_client.raw_connection() as conn:
        release = ops.lock_pass(conn)
        try:
            held = _advisory_locks(dsn)
            assert len(held) == 1 and held[0][1]
            assert ops.maintain_sql() == {"skipped": True}
        finally:
            release()
    assert _advisory_locks(dsn) == []
    assert ops.maintain_sql().get("skipped") is not True
    with pooled_client.raw_connection() as conn:  # the purge's lock likewise, tried
        release_purge = ops.try_purge_lock(conn)
        assert release_purge is not None
        assert ops.try_purge_lock(conn) is None  # held: a second purge does not run
        release_purge()
    assert _advisory_locks(dsn) == []


def test_settings_of_a_connection_of_its_own_are_those_of_each_transaction(
        dsn: str, pooled_client: pgstreams.Client) -> None:
    """A setting given to a connection of pgstreams' own (a member's lock timeout) reaches every statement
    the executor runs on it, and never its session: a statement waiting for a lock gives up after the
    timeout, while the session's own lock_timeout stays the server's."""
    pooled_client.create_topic("locked", 1)
    table = sql.Identifier("pgstreams", f"topic_{pooled_client.topic_record('locked').id}")
    ex = pooled_client.store.executor
    with pooled_client.raw_connection() as conn, psycopg.connect(dsn) as holder:
        pooled_client.store.groups.prepare_member_connection(conn, 0.3)
        assert conn.execute("SHOW lock_timeout").fetchone() == ("0",)  # the session keeps none
        holder.execute(sql.SQL("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE").format(table))
        began = time.monotonic()
        with pytest.raises(psycopg.errors.LockNotAvailable):
            ex.execute(conn, sql.SQL("SELECT count(*) FROM {}").format(table))
        assert time.monotonic() - began < 30
        assert conn.execute("SHOW lock_timeout").fetchone() == ("0",)


def test_a_detach_waiting_longer_than_the_lock_timeout_is_cancelled_in_transaction_mode(
        dsn: str, pooled_client: pgstreams.Client) -> None:
    """``DETACH PARTITION ... CONCURRENTLY`` runs outside a transaction, where no setting of one
    transaction reaches it: in transaction mode it is cancelled once it waited longer than the pass's lock
    timeout, and raised as a lock timeout (the next pass finishes it); the segment stays attached."""
    pooled_client.create_topic("d", 1)
    topic_id = pooled_client.topic_record("d").id
    with psycopg.connect(dsn, autocommit=True) as c:
        (segment,) = c.execute("SELECT max(segment) FROM pgstreams.segments WHERE topic_id = %s",
                               (topic_id,)).fetchone()  # type: ignore[misc]
    table = sql.Identifier("pgstreams", f"topic_{topic_id}")
    ops = pooled_client.store.operations
    with pooled_client.raw_connection() as conn, psycopg.connect(dsn) as holder:
        pooled_client.store.groups.prepare_member_connection(conn, 0.5)
        holder.execute(sql.SQL("LOCK TABLE {} IN SHARE UPDATE EXCLUSIVE MODE").format(table))
        began = time.monotonic()
        with pytest.raises(psycopg.errors.LockNotAvailable, match="lock timeout"):
            ops.detach_segment(conn, topic_id, segment)
        assert time.monotonic() - began < 30
        holder.rollback()
        attached = conn.execute(
            "SELECT count(*) FROM pg_inherits WHERE inhparent = %s::regclass",
            (f"pgstreams.topic_{topic_id}",)).fetchone()
        assert attached is not None and attached[0] >= 1
        still = conn.execute("SELECT 1 FROM pg_inherits WHERE inhrelid = to_regclass(%s)",
                             (f"pgstreams.topic_{topic_id}_s{segment}",)).fetchone()
        assert still == (1,)
        assert conn.execute("SELECT 1").fetchone() == (1,)  # the connection goes on


def _listening(dsn: str) -> int:
    """How many sessions of the database of ``dsn`` are LISTENing (their last statement a LISTEN)."""
    with psycopg.connect(dsn, autocommit=True) as c:
        row = c.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                        " AND query ILIKE 'LISTEN %%'").fetchone()
    return int(row[0]) if row else 0


def test_without_a_listen_dsn_a_client_in_transaction_mode_listens_to_nothing_and_its_consumers_poll(
        dsn: str) -> None:
    """Behind a transaction pooler a LISTEN would stay with a server session that serves other clients:
    without ``listen_dsn`` the client listens to nothing, marks no topic as waited for, and its waiting
    consumer finds an event published meanwhile by polling (within its poll interval)."""
    with pgstreams.connect(dsn, pooler="transaction", poll_interval=0.3) as client, \
            pgstreams.connect(dsn) as publisher:
        client.create_topic("p", 1)
        topic_id = client.topic_record("p").id
        consumer = client.consumer("p", "g")
        assert consumer.poll(timeout=0.5) == []  # it waited: with a listener it would have listened
        assert not client.listener.enabled and not client.listener.alive
        assert _listening(dsn) == 0
        with psycopg.connect(dsn, autocommit=True) as c:
            assert c.execute("SELECT count(*) FROM pgstreams.topic_waiters").fetchone() == (0,)
        waiting = Background(consumer.poll, 10, 60.0)
        publisher.publish("p", "polled")
        began = time.monotonic()
        events = waiting.result(90, "the waiting consumer's poll")
        assert [e.value for e in events] == ["polled"]
        assert time.monotonic() - began < 30  # found by a poll, long before the poll's timeout
        assert client.listener.generation(topic_id) == 0  # no notification ever came


def test_with_a_listen_dsn_a_client_in_transaction_mode_is_woken_by_notifications(dsn: str) -> None:
    """With ``listen_dsn`` the client LISTENs on a connection to it: a consumer waiting with a poll interval
    of a minute gets an event published by another client within seconds, by the notification (the
    listener counts it)."""
    with pgstreams.connect(dsn, pooler="transaction", listen_dsn=dsn, poll_interval=60) as client:
        client.create_topic("n", 1)
        topic_id = client.topic_record("n").id
        consumer = client.consumer("n", "g")
        assert client.listener.enabled
        waiting = Background(consumer.poll, 10, 50.0)
        assert client.listener.connected.wait(30), "the listener did not connect to listen_dsn"
        marked = "SELECT count(*) FROM pgstreams.topic_waiters WHERE topic_id = %s"
        with psycopg.connect(dsn, autocommit=True) as c:  # the consumer marked the topic: publishers notify
            wait_until(lambda: c.execute(marked, (topic_id,)).fetchone() == (1,), 30,
                       "the topic marked as waited for")
        assert _listening(dsn) == 1
        with pgstreams.connect(dsn) as publisher:
            publisher.publish("n", "notified")
            began = time.monotonic()
            events = waiting.result(90, "the waiting consumer's poll")
        assert [e.value for e in events] == ["notified"]
        assert time.monotonic() - began < 30
        assert client.listener.generation(topic_id) >= 1  # the notification reached the listener


def test_the_spark_sources_connections_in_transaction_mode_prepare_nothing_and_set_nothing(dsn: str) -> None:
    """The Spark data source's connections with ``option("pooler", "transaction")`` prepare no statement
    and leave no session setting (the bulk reads' JIT and parallel-worker settings are then the role's);
    in session mode they set both."""
    from pgstreams.spark import _db

    with _db.connect(dsn, pooler="transaction") as conn:
        assert conn.prepare_threshold is None
        assert conn.execute(SESSION_STATE).fetchone() == ([], [], [])
    with _db.connect(dsn) as conn:
        settings, _, _ = conn.execute(SESSION_STATE).fetchone()  # type: ignore[misc]
        assert {"jit", "max_parallel_workers_per_gather"} <= set(settings)
