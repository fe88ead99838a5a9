"""Helpers of the core correctness tests: database snapshots, deadlines and subprocess workers.

Worker functions live here (not in test modules) so that ``multiprocessing`` spawn children can import
them by name.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import random
import signal
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any, TypeVar

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

import pgstreams
from pgstreams import migrate as _migrate

T = TypeVar("T")

SPAWN = multiprocessing.get_context("spawn")


def run_async(fn: Callable[..., Awaitable[T]], *args: Any) -> T:
    """``asyncio.run(fn(*args))`` in a thread of its own: a test run before in the same process may have left
    an event loop marked running in the main thread (a browser driver's, for one), where asyncio.run()
    refuses to start."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, fn(*args)).result()  # type: ignore[arg-type]


def wait_until(pred: Callable[[], T], timeout: float, what: str, every: float = 0.02) -> T:
    """Return the first truthy ``pred()``; fail with ``what`` when ``timeout`` seconds pass first."""
    deadline = time.monotonic() + timeout
    while True:
        got = pred()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(every)


def until(cond: Callable[[], bool], timeout: float = 15.0, what: str = "condition") -> None:
    """Return once ``cond()`` is true; fail with ``what`` when ``timeout`` seconds pass first."""
    wait_until(cond, timeout, what)


class Background:
    """``fn(*args)`` run in a daemon thread of its own, started at once; :attr:`outcome` gets what it
    returned, or the exception it raised (for the test to assert on)."""

    def __init__(self, fn: Callable[..., Any], *args: Any) -> None:
        self.outcome: list[Any] = []
        self.thread = threading.Thread(target=self._run, args=(fn, args), daemon=True)
        self.thread.start()

    def _run(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        try:
            self.outcome.append(fn(*args))
        except BaseException as exc:  # noqa: BLE001 - the test asserts on it
            self.outcome.append(exc)

    def result(self, timeout: float, what: str) -> Any:
        """What ``fn`` returned or raised, once it ended; fails with ``what`` if it runs ``timeout`` seconds
        more."""
        self.thread.join(timeout)
        assert not self.thread.is_alive(), f"{what} still runs after {timeout:g} s"
        assert len(self.outcome) == 1, self.outcome
        return self.outcome[0]


def drain_group(dsn: str, topic: str, group: str, seen: list[tuple[int, int]], done: threading.Event) -> None:
    """Read ``topic`` as stream group ``group`` (polls of 300, each committed), adding each event's
    ``(partition, position)`` to ``seen``, until ``done`` is set and three polls in a row found nothing."""
    with pgstreams.connect(dsn) as reader:
        consumer = reader.consumer(topic, group)
        idle = 0
        while idle < 3:
            batch = consumer.poll(max_events=300, timeout=0.2)
            seen.extend((e.partition, e.position) for e in batch)
            consumer.commit()
            idle = idle + 1 if not batch and done.is_set() else 0


def drain_share(dsn: str, topic: str, group: str, seen: list[tuple[int, int]], done: threading.Event) -> None:
    """Take ``topic``'s events as share group ``group`` from the earliest (polls of 200, each acked),
    adding each event's ``(partition, position)`` to ``seen``, until ``done`` is set and three polls in a
    row found nothing."""
    with pgstreams.connect(dsn) as reader:
        sc = reader.share_consumer(topic, group, start="earliest", lock_timeout=60)
        idle = 0
        while idle < 3:
            batch = sc.poll(max_events=200, timeout=0.2)
            seen.extend((e.partition, e.position) for e in batch)
            if batch:
                sc.ack(batch)
            idle = idle + 1 if not batch and done.is_set() else 0


@contextmanager
def running(worker: pgstreams.Worker) -> Iterator[pgstreams.Worker]:
    """Start ``worker`` for the block; stop it (waiting up to 10 s) afterwards."""
    worker.start()
    try:
        yield worker
    finally:
        worker.stop(10)


class FakeClock:
    """A monotonic clock that moves only when told to (a worker's ``clock=``); thread-safe."""

    def __init__(self) -> None:
        self.now = 1000.0
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            return self.now

    def advance(self, seconds: float) -> None:
        """Move the clock forward by ``seconds``."""
        with self._lock:
            self.now += seconds


def db_state(dsn: str) -> dict[str, Any]:
    """Everything a pgstreams call could change: every relation of every non-system schema with its rows
    (a count and a digest; sequences with their last value, except identity sequences), and every
    schema's name."""
    out: dict[str, Any] = {}
    with psycopg.connect(dsn, autocommit=True) as conn:
        schemas = [r[0] for r in conn.execute(
            "SELECT nspname FROM pg_namespace"
            " WHERE nspname NOT LIKE 'pg\\_%' AND nspname <> 'information_schema'"
            " ORDER BY 1").fetchall()]
        out["schemas"] = schemas
        rels = conn.execute(
            "SELECT n.nspname, c.relname, c.relkind FROM pg_class c"
            " JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE n.nspname = ANY(%s) AND c.relkind IN ('r', 'p', 'S', 'i', 'I', 'v', 'f')"
            " ORDER BY 1, 2", (schemas,)).fetchall()
        identity = set(conn.execute(
            "SELECT n.nspname, c.relname FROM pg_depend d JOIN pg_class c ON c.oid = d.objid"
            " JOIN pg_namespace n ON n.oid = c.relnamespace WHERE d.deptype = 'i' AND c.relkind = 'S'"
        ).fetchall())
        for nsp, rel, kind in rels:
            ident = sql.Identifier(nsp, rel)
            if kind == "r":
                out[f"{nsp}.{rel}"] = conn.execute(
                    sql.SQL("SELECT count(*), md5(coalesce(string_agg(t::text, '|' ORDER BY t::text), ''))"
                            " FROM {} t").format(ident)).fetchone()
            elif kind == "S" and (nsp, rel) not in identity:  # identity gaps are not state
                out[f"{nsp}.{rel}"] = conn.execute(
                    sql.SQL("SELECT last_value, is_called FROM {}").format(ident)).fetchone()
            else:
                out[f"{nsp}.{rel}"] = kind
    return out


def checkpoints(dsn: str, group: str, topic: str, schema: str = "pgstreams") -> dict[int, int]:
    """The stored checkpoint (a position) per partition of ``group`` on ``topic``."""
    q = sql.SQL(
        "SELECT k.partition, k.position FROM {}.checkpoints k"
        " JOIN {}.topics t ON t.id = k.topic_id WHERE k.group_name = %s AND t.name = %s"
    ).format(sql.Identifier(schema), sql.Identifier(schema))
    with psycopg.connect(dsn, autocommit=True) as conn:
        return {int(p): int(pos) for p, pos in conn.execute(q, (group, topic)).fetchall()}


def new_database(server_dsn: str, prefix: str, **options: str) -> str:
    """Create an empty database named ``prefix`` + a random suffix on the server of ``server_dsn`` (with
    libpq ``options``, e.g. ``options="-c synchronous_commit=local"``, for the creating connection); its
    DSN."""
    name = f"{prefix}{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server_dsn, autocommit=True, **options) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    return make_conninfo(server_dsn, dbname=name)


# -- subprocess workers ----------------------------------------------------------------------------------


def produce_worker(dsn: str, topic: str, producer: int, n_tx: int, keys: list[str], seed: int,
                   rollback_rate: float, hold_max: float) -> list[dict[str, Any]]:
    """Publish ``n_tx`` transactions of 1 to 3 events each with ``publish(conn=...)``, holding each
    transaction open for a random time; some roll back. Returns one record per transaction."""
    rng = random.Random(seed)
    out: list[dict[str, Any]] = []
    counters: dict[str, int] = {}
    with pgstreams.connect(dsn, migrate=False, pool_size=2) as client, psycopg.connect(dsn) as conn:
        for t in range(n_tx):
            commit = rng.random() >= rollback_rate
            events = []
            begun = time.monotonic()
            with conn.transaction(force_rollback=not commit):
                for _ in range(rng.randint(1, 3)):
                    key = rng.choice(keys)
                    seq = counters.get(key, 0)
                    if commit:
                        counters[key] = seq + 1
                    value = {"p": producer, "t": t, "i": len(events), "k": key, "n": seq, "c": commit}
                    client.publish(topic, value, key=key, conn=conn)
                    events.append(value)
                    time.sleep(rng.random() * hold_max / 3)
                time.sleep(rng.random() * hold_max)
            out.append({"commit": commit, "events": events, "begun": begun, "done": time.monotonic()})
    return out


def publish_many_worker(dsn: str, topic: str, writer: int, batches: int, size: int, keys: list[str]) -> int:
    """Publish ``batches`` batches of ``size`` events ``[writer, batch, i]`` with ``publish_many`` (random
    keys of ``keys``); return how many were stored."""
    rng = random.Random(writer)
    stored = 0
    with pgstreams.connect(dsn, migrate=False, pool_size=2) as client:
        for b in range(batches):
            stored += client.publish_many(topic, [{"value": [writer, b, i], "key": rng.choice(keys)}
                                                  for i in range(size)])
    return stored


def publish_same_ids(dsn: str, topic: str, ids: list[str], tag: str,
                     start_at: float) -> list[tuple[int, int]]:
    """Publish one event per id (in order) once ``time.time()`` reaches ``start_at``; return results."""
    with pgstreams.connect(dsn, migrate=False, pool_size=2) as client:
        while time.time() < start_at:
            time.sleep(0.001)
        return [(r.partition, r.position) for r in
                (client.publish(topic, {"by": tag, "id": i}, event_id=i, key=i) for i in ids)]


def connect_worker(dsn: str, schema: str, start_at: float) -> list[int]:
    """Connect (migrating) once ``time.time()`` reaches ``start_at``; return the applied versions seen."""
    while time.time() < start_at:
        time.sleep(0.001)
    with pgstreams.connect(dsn, schema=schema, pool_size=1) as client, client.connection() as conn:
        return sorted(_migrate.applied_versions(conn, schema))


def exactly_once_worker(dsn: str, topic: str, group: str, total: int, seed: int, hold_max: float) -> None:
    """Consume ``topic`` in ``group`` writing one row per event into ``effects`` inside
    :meth:`Consumer.transaction`, holding each transaction open for a random time (so that a SIGKILL
    from the parent lands mid-transaction). Returns once ``effects`` covers ``total`` positions."""
    rng = random.Random(seed)
    with pgstreams.connect(dsn, migrate=False, pool_size=2) as client, \
            psycopg.connect(dsn, autocommit=True) as probe:
        consumer = client.consumer(topic, group)
        while True:
            with consumer.transaction() as tx:
                events = tx.poll(rng.randint(1, 20), timeout=0.2)
                for ev in events:
                    tx.connection.execute("INSERT INTO effects (position, pid) VALUES (%s, %s)",
                                          (ev.position, os.getpid()))
                    if rng.random() < 0.3:
                        time.sleep(rng.random() * hold_max)
            if tx.outcome is not None and not tx.outcome.ok:
                consumer = client.consumer(topic, group)
            if not events:
                row = probe.execute("SELECT count(DISTINCT position) FROM effects").fetchone()
                if row and row[0] >= total:
                    return


def kill(proc: Any) -> None:
    """SIGKILL a multiprocessing process and reap it."""
    if proc.is_alive():
        os.kill(proc.pid, signal.SIGKILL)
    proc.join(10)


def take(consumer: pgstreams.Consumer, n: int, timeout: float = 10.0, commit: bool = False) -> list[Any]:
    """Poll ``consumer`` until ``n`` events arrived (fail at the deadline); then check that nothing more
    is ready right now. With ``commit``, commit every poll."""
    deadline = time.monotonic() + timeout
    out: list[Any] = []
    while len(out) < n:
        remaining = deadline - time.monotonic()
        assert remaining > 0, f"only {len(out)} of {n} events arrived within {timeout}s"
        got = consumer.poll(max_events=max(1, min(1000, n - len(out))), timeout=min(remaining, 1.0))
        if got and commit:
            consumer.commit(got)
        out.extend(got)
    extra = consumer.poll(max_events=1000, timeout=0.05)
    assert not extra, f"{len(extra)} more events than the {n} expected: {[e.value for e in extra][:5]}"
    return out


def share_exactly_once_worker(dsn: str, topic: str, group: str, seed: int, hold_max: float,
                              lock_timeout: float, stop_file: str) -> None:
    """Consume ``topic`` in share group ``group`` writing one row per event into ``effects`` inside
    :meth:`ShareConsumer.transaction`, rejecting the events whose value has ``"i": 2`` in it; now and then
    hold a transaction open past ``lock_timeout`` (its acks are then refused and everything rolls back)
    or for a random time (so that a SIGKILL from the parent lands mid-transaction). Returns once
    ``stop_file`` exists."""
    rng = random.Random(seed)
    with pgstreams.connect(dsn, migrate=False, pool_size=3) as client:
        share = client.share_consumer(topic, group, lock_timeout=lock_timeout, max_deliveries=1000)
        while not os.path.exists(stop_file):
            with share.transaction() as tx:
                events = tx.poll(rng.randint(1, 20), timeout=0.2)
                bad = [e for e in events if e.value.get("i") == 2]
                if bad:
                    tx.reject(bad, "i is 2")
                for ev in tx.events:
                    tx.connection.execute("INSERT INTO effects (position, pid) VALUES (%s, %s)",
                                          (ev.position, os.getpid()))
                r = rng.random()
                if events and r < 0.05:
                    time.sleep(lock_timeout * 1.5)  # past the lock: the acks are refused
                elif r < 0.3:
                    time.sleep(rng.random() * hold_max)
