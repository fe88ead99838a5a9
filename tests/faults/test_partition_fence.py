"""The read fence per partition: a transaction holds back the reading of a partition only while it is
open and has published to that partition. Every case keeps the gap-free guarantee: no committed event is
ever skipped, and nothing rolled back is ever delivered."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

import pgstreams
from _core_helpers import running, take, until
from pgstreams.embedded import temporary_server
from pgstreams.storage import core_query
from pgstreams.storage.events import single_key


def _values(events: list[pgstreams.Event]) -> list[object]:
    return [e.value for e in events]


def _by_partition(events: list[pgstreams.Event]) -> dict[int, list[object]]:
    out: dict[int, list[object]] = {}
    for e in events:
        out.setdefault(e.partition, []).append(e.value)
    return out


def test_an_unrelated_open_transaction_in_the_same_database_holds_back_nobody(client: pgstreams.Client,
                                                                             dsn: str) -> None:
    client.create_topic("t", 2)
    client.create_topic("u", 1)
    c = client.consumer("t", "g")
    latest = client.consumer("u", "g", start="latest")
    with psycopg.connect(dsn) as app:
        app.execute("CREATE TABLE accounts (id int PRIMARY KEY, balance int)")
        app.commit()
        app.execute("INSERT INTO accounts VALUES (1, 100)")  # an open write transaction with an xid
        app.execute("UPDATE accounts SET balance = balance - 1 WHERE id = 1")
        assert app.execute("SELECT pg_current_xact_id_if_assigned() IS NOT NULL").fetchone() == (True,)
        for i in range(6):
            client.publish("t", i, partition=i % 2)
        client.publish_many("u", [{"value": "a"}, {"value": "b"}])
        got = take(c, 6, commit=True)
        assert _by_partition(got) == {0: [0, 2, 4], 1: [1, 3, 5]}
        assert _values(take(latest, 2)) == ["a", "b"]
        # a start at "latest" or at a time while the transaction is open starts at the head, not before
        late = client.consumer("t", "late", start="latest")
        client.publish("t", "after")
        assert _values(take(late, 1)) == ["after"]
        assert app.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
        app.rollback()


def test_an_open_transaction_in_another_database_holds_back_nobody(client: pgstreams.Client,
                                                                  server_dsn: str) -> None:
    client.create_topic("t", 1)
    c = client.consumer("t", "g")
    with psycopg.connect(server_dsn) as other:
        other.execute("CREATE TEMP TABLE x (i int)")
        other.execute("INSERT INTO x VALUES (1)")
        assert other.execute("SELECT pg_current_xact_id_if_assigned() IS NOT NULL").fetchone() == (True,)
        client.publish("t", "flows")
        assert _values(take(c, 1)) == ["flows"]
        other.rollback()


def test_a_long_publisher_holds_back_only_its_partition(client: pgstreams.Client, dsn: str) -> None:
    client.create_topic("t", 2)
    client.create_topic("other", 1)
    c = client.consumer("t", "g")
    o = client.consumer("other", "g")
    with psycopg.connect(dsn) as long:
        held = client.publish("t", "held", partition=0, conn=long)
        client.publish("t", "p0-after", partition=0)
        client.publish("t", "p1", partition=1)
        client.publish("other", "o")
        # partition 1 and the other topic flow; partition 0 stops before the open transaction's event
        assert _by_partition(take(c, 1, commit=True)) == {1: ["p1"]}
        assert _values(take(o, 1)) == ["o"]
        # a group starting at "latest" now does not skip the held event either
        late = client.consumer("t", "late", start="latest")
        assert late.poll(timeout=0.2) == []
        long.commit()
    got = take(c, 2, commit=True)
    assert _values(got) == ["held", "p0-after"]  # position order, none skipped
    assert got[0].position == held.position
    assert _values(take(late, 2)) == ["held", "p0-after"]


@pytest.mark.parametrize("query", ["insert_event_own", "insert_event_own_lean"])
def test_a_single_key_registration_holds_back_only_its_partition(client: pgstreams.Client, dsn: str,
                                                                 query: str) -> None:
    """An autocommit publish registers with one key (insert_event_own, or insert_event_own_lean for an
    event without headers, type, correlation or causation id); while its statement runs, its transaction
    holds back its partition only. Held open here by running the statement in a transaction, beside a
    transaction that registered the usual two keys on another partition of the same topic."""
    client.create_topic("t", 3)
    c = client.consumer("t", "g")
    tid = client.topic_state("t").id
    own = core_query(query, "pgstreams", tid)
    # the row, then the single key's high bits (partition 2)
    row: tuple[object, ...] = (
        (2, "b", None, b"own", None, None, None, None, None, None, single_key(tid, 2))
        if query == "insert_event_own" else (2, "b", None, b"own", None, single_key(tid, 2)))
    with psycopg.connect(dsn) as single, psycopg.connect(dsn) as double:
        single.execute(own, row)
        client.publish("t", "two-keys", partition=1, conn=double)
        client.publish("t", "p2-after", partition=2)
        client.publish("t", "p1-after", partition=1)
        client.publish("t", "p0", partition=0)
        assert _by_partition(take(c, 1, commit=True)) == {0: ["p0"]}
        assert c.poll(10, timeout=0.2) == []
        double.commit()
        assert _by_partition(take(c, 2, commit=True)) == {1: ["two-keys", "p1-after"]}
        assert c.poll(10, timeout=0.2) == []
        single.commit()
        assert _by_partition(take(c, 2, commit=True)) == {2: [b"own", "p2-after"]}


def test_a_rolled_back_savepoint_releases_its_partition_and_delivers_nothing(client: pgstreams.Client,
                                                                            dsn: str) -> None:
    client.create_topic("t", 2)
    c = client.consumer("t", "g")
    with psycopg.connect(dsn) as tx:
        client.publish("t", "kept-before", partition=0, conn=tx)
        with pytest.raises(RuntimeError):
            with tx.transaction():  # a savepoint
                client.publish("t", "gone", partition=1, conn=tx)
                client.publish("t", "gone-too", partition=0, conn=tx)
                raise RuntimeError("roll the savepoint back")
        # the savepoint's registration of partition 1 went with it: partition 1 flows again
        client.publish("t", "p1-after", partition=1)
        assert _values(take(c, 1, commit=True)) == ["p1-after"]
        # partition 0 stays held: the transaction registered it before the savepoint
        client.publish("t", "p0-after", partition=0)
        assert c.poll(timeout=0.2) == []
        # publishing again to partition 1 after the rollback registers it again
        client.publish("t", "kept-after", partition=1, conn=tx)
        client.publish("t", "p1-later", partition=1)
        assert c.poll(timeout=0.2) == []
        tx.commit()
    got = take(c, 4, commit=True)
    assert _by_partition(got) == {0: ["kept-before", "p0-after"], 1: ["kept-after", "p1-later"]}


@pytest.fixture(scope="module")
def prepared_server() -> Iterator[str]:
    """A server of this module's own that allows prepared transactions (two-phase commit)."""
    with temporary_server({"max_prepared_transactions": "4", "fsync": "off"}) as dsn:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("CREATE DATABASE fence")
        yield make_conninfo(dsn, dbname="fence")


@pytest.mark.parametrize("outcome", ["COMMIT PREPARED", "ROLLBACK PREPARED"])
def test_a_prepared_transaction_holds_its_partition_until_it_is_finished(prepared_server: str,
                                                                        outcome: str) -> None:
    topic = "commit" if outcome.startswith("COMMIT") else "rollback"
    gid = f"pgstreams-{topic}"
    with pgstreams.connect(prepared_server) as client:
        client.create_topic(topic, 2)
        c = client.consumer(topic, "g")
        with psycopg.connect(prepared_server, autocommit=True) as tx:
            tx.execute("BEGIN")
            client.publish(topic, "2pc", partition=0, conn=tx, notify=False)
            tx.execute(psycopg.sql.SQL("PREPARE TRANSACTION {}").format(gid))
        # the session that prepared it is gone; the prepared transaction still holds partition 0
        client.publish(topic, "p0-after", partition=0)
        client.publish(topic, "p1", partition=1)
        assert _values(take(c, 1, commit=True)) == ["p1"]
        with psycopg.connect(prepared_server, autocommit=True) as admin:
            admin.execute(psycopg.sql.SQL(outcome + " {}").format(gid))  # outcome: one of two literals
        expected = ["2pc", "p0-after"] if outcome.startswith("COMMIT") else ["p0-after"]
        assert _values(take(c, len(expected), commit=True)) == expected


def test_a_publisher_whose_connection_dies_releases_its_partition(client: pgstreams.Client, dsn: str) -> None:
    client.create_topic("t", 1)
    c = client.consumer("t", "g")
    doomed = psycopg.connect(dsn)
    client.publish("t", "lost", conn=doomed, notify=False)
    client.publish("t", "after")
    assert c.poll(timeout=0.2) == []
    pid = doomed.info.backend_pid
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
        until(lambda: admin.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s",
                                    (pid,)).fetchone() == (0,), what="the publisher's backend to end")
    assert _values(take(c, 1, commit=True)) == ["after"]
    doomed.close()


def test_a_worker_group_keeps_flowing_beside_an_unrelated_open_transaction(client: pgstreams.Client,
                                                                         dsn: str) -> None:
    client.create_topic("t", 2)
    handled: list[object] = []
    lock = threading.Lock()

    def handler(event: pgstreams.Event) -> None:
        with lock:
            handled.append(event.value)

    worker = pgstreams.Worker(client)
    worker.subscribe("t", "g", handler)
    with psycopg.connect(dsn) as app, running(worker):
        app.execute("CREATE TABLE ledger (i int)")
        app.execute("INSERT INTO ledger VALUES (1)")  # open, with an xid, for the whole test
        for i in range(20):
            client.publish("t", i, key=f"k{i}")
        until(lambda: len(handled) == 20, what="the worker to handle every event")
        assert sorted(handled) == list(range(20))  # type: ignore[type-var]
        app.rollback()
