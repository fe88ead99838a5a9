"""Exactly-once effects with Consumer.transaction(): crashes anywhere leave exactly one row per event."""

from __future__ import annotations

import random
import threading
import time

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

import pgstreams
from _core_helpers import SPAWN, exactly_once_worker, kill, wait_until


class Crash(Exception):
    """A handler failure injected by the test."""


def _setup(client: pgstreams.Client, dsn: str, total: int, partitions: int) -> None:
    client.create_topic("t", partitions)
    client.publish_many("t", [{"value": i, "key": f"k{i % 13}"} for i in range(total)])
    with psycopg.connect(dsn, autocommit=True) as conn:
        # no unique constraint: a second write for an event would be stored and counted
        conn.execute("CREATE TABLE effects (position bigint NOT NULL, pid integer)")


def _check_exactly_once(dsn: str, total: int) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute("SELECT position, count(*) FROM effects GROUP BY position").fetchall()
        positions = conn.execute("SELECT position FROM pgstreams.topic_1").fetchall()
    counts = dict(rows)
    dup = {p: n for p, n in counts.items() if n != 1}
    assert not dup, f"events handled more than once: {sorted(dup.items())[:5]}"
    assert set(counts) == {p for (p,) in positions}
    assert len(counts) == total


def test_transaction_commits_effects_and_checkpoint_together(client: pgstreams.Client, dsn: str) -> None:
    _setup(client, dsn, 10, 1)
    c = client.consumer("t", "g")
    with pytest.raises(Crash):
        with c.transaction() as tx:
            for e in tx.poll(max_events=5, timeout=5):
                tx.connection.execute("INSERT INTO effects VALUES (%s, 0)", (e.position,))
            raise Crash
    with c.transaction() as tx:
        got = tx.poll(max_events=5, timeout=5)
        assert [e.value for e in got] == [0, 1, 2, 3, 4]  # read again after the rollback
        for e in got:
            tx.connection.execute("INSERT INTO effects VALUES (%s, 0)", (e.position,))
    assert tx.outcome is pgstreams.CommitOutcome.STORED
    assert [e.value for e in client.consumer("t", "g").poll(max_events=5, timeout=5)] == [5, 6, 7, 8, 9]
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SELECT count(*) FROM effects").fetchone() == (5,)
    # a member that falls behind another cannot commit its writes
    stale = client.consumer("t", "g")
    with c.transaction() as tx:
        got = tx.poll(max_events=5, timeout=5)
        for e in got:
            tx.connection.execute("INSERT INTO effects VALUES (%s, 0)", (e.position,))
    with stale.transaction() as tx2:
        again = tx2.poll(max_events=5, timeout=5)
        assert [e.position for e in again] == [e.position for e in got]
        for e in again:
            tx2.connection.execute("INSERT INTO effects VALUES (%s, 1)", (e.position,))
    assert tx2.outcome is pgstreams.CommitOutcome.IGNORED or not tx2.outcome.ok
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SELECT count(*) FROM effects WHERE pid = 1").fetchone() == (0,)


@pytest.mark.slow
def test_random_exceptions_inside_transactions_leave_one_row_per_event(client: pgstreams.Client,
                                                                        dsn: str) -> None:
    total = 400
    _setup(client, dsn, total, 3)
    errors: list[BaseException] = []
    crashes = {"n": 0}
    done = threading.Event()

    def count() -> int:
        with psycopg.connect(dsn, autocommit=True) as conn:
            row = conn.execute("SELECT count(DISTINCT position) FROM effects").fetchone()
            return int(row[0]) if row else 0

    def member(seed: int) -> None:
        rng = random.Random(seed)

        def maybe_crash(where: str) -> None:
            if rng.random() < 0.06:
                crashes["n"] += 1
                raise Crash(where)

        consumer = client.consumer("t", "g")
        deadline = time.monotonic() + 90
        try:
            while not done.is_set() and time.monotonic() < deadline:
                try:
                    with consumer.transaction() as tx:
                        maybe_crash("before poll")
                        events = tx.poll(max_events=rng.randint(1, 25), timeout=0.1)
                        for e in events:
                            maybe_crash("before a write")
                            tx.connection.execute("INSERT INTO effects VALUES (%s, %s)", (e.position, seed))
                            maybe_crash("after a write")
                        if events and rng.random() < 0.04:
                            tx.connection.execute("SELECT 1 / 0")  # a failing statement in the handler
                        maybe_crash("at the end of the block")
                    if tx.outcome is not None and not tx.outcome.ok:
                        consumer = client.consumer("t", "g")  # another member moved on: restart
                    maybe_crash("after the commit")
                    if not events and count() >= total:
                        done.set()
                except (Crash, psycopg.errors.DivisionByZero):
                    if rng.random() < 0.5:
                        consumer = client.consumer("t", "g")  # a restarted process
        except BaseException as exc:  # noqa: BLE001 - reported by the test thread
            errors.append(exc)
            done.set()

    threads = [threading.Thread(target=member, args=(s,)) for s in (1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    assert done.is_set(), "the members did not finish before their deadline"
    assert crashes["n"] >= 5
    _check_exactly_once(dsn, total)
    assert sum(s.lag for s in client.describe_group("g")) == 0


@pytest.mark.slow
def test_sigkilled_consumer_processes_leave_one_row_per_event(client: pgstreams.Client, dsn: str) -> None:
    total = 400
    _setup(client, dsn, total, 2)
    rng = random.Random(5)
    procs: dict[str, object] = {}
    seq = 0

    def start() -> str:
        nonlocal seq
        seq += 1
        name = f"eo-worker-{seq}"
        p = SPAWN.Process(target=exactly_once_worker,
                          args=(make_conninfo(dsn, application_name=name), "t", "g", total, seq, 0.08))
        p.start()
        procs[name] = p
        return name

    def in_transaction() -> str | None:
        """The name of a live worker that has written rows in its open transaction, if any."""
        with psycopg.connect(dsn, autocommit=True) as conn:
            rows = conn.execute("SELECT application_name FROM pg_stat_activity"
                                " WHERE application_name LIKE 'eo-worker-%' AND backend_xid IS NOT NULL"
                                ).fetchall()
        alive = [r[0] for r in rows if r[0] in procs and procs[r[0]].is_alive()]  # type: ignore[attr-defined]
        return rng.choice(alive) if alive else None

    def all_done() -> bool:
        return not any(p.is_alive() for p in procs.values())  # type: ignore[attr-defined]

    kills = 0
    try:
        for _ in range(2):
            start()
        deadline = time.monotonic() + 90
        while kills < 5 and time.monotonic() < deadline and not all_done():
            # kill a worker while it has written rows in an open transaction
            victim = wait_until(lambda: in_transaction() or all_done(), 20, "a worker inside a transaction",
                                0.005)
            if victim is True:
                break  # the work is done
            kill(procs[victim])  # type: ignore[index]
            kills += 1
            start()
        assert kills >= 3, "too few workers were killed inside a transaction"
        for p in procs.values():
            p.join(max(1.0, deadline - time.monotonic()))  # type: ignore[attr-defined]
        assert all(not p.is_alive() for p in procs.values()), "workers did not finish"  # type: ignore[attr-defined]
    finally:
        for p in procs.values():
            kill(p)
    _check_exactly_once(dsn, total)
    assert sum(s.lag for s in client.describe_group("g")) == 0
