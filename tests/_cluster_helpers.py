"""Helpers of the cluster tests: subprocess producers and workers (importable by ``spawn`` children),
keyed events to publish, reading a whole cluster topic, and the per-key order check every read makes.

Keyed events of the cluster tests carry ``{"k": key, "n": index}`` (and ``"p": producer`` when several
producers publish the same keys): ``n`` counts each producer's events of a key from 0 in publish order,
so a read shows whether each key's events came back in the order they were published.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterable
from typing import Any, NamedTuple

import psycopg

import pgstreams
from pgstreams.cluster import ClusterClient


class KeyedRead(NamedTuple):
    """One keyed event as read: its key, where it was ((shard, partition)), who published it and its
    index among that producer's events of the key."""

    key: str
    shard: int
    partition: int
    producer: int
    n: int


def cluster(dsns: list[str], **options: Any) -> ClusterClient:
    """A :class:`ClusterClient` of ``dsns`` (typed)."""
    client = pgstreams.connect(dsns, **options)
    assert isinstance(client, ClusterClient)
    return client


def keyed(keys: Iterable[str], rounds: int, first: int = 0, producer: int | None = None
          ) -> list[dict[str, Any]]:
    """``publish_many`` events: ``rounds`` per key with ``n`` from ``first`` on, round by round (each
    key's events in ``n`` order); values carry ``"p": producer`` when ``producer`` is given."""
    tag = {} if producer is None else {"p": producer}
    return [{"value": {**tag, "k": k, "n": n}, "key": k} for n in range(first, first + rounds) for k in keys]


def reads_of(events: Iterable[pgstreams.Event]) -> list[KeyedRead]:
    """The keyed events among ``events`` (in their order) as :class:`KeyedRead`; each one's value (a JSON
    value, or JSON text as bytes, as Spark writes it) names its key."""
    out = []
    for e in events:
        if e.key is None:
            continue
        value = json.loads(e.value) if isinstance(e.value, (bytes, str)) else e.value
        assert value["k"] == e.key, f"event of key {e.key!r} holds {value!r}"
        out.append(KeyedRead(e.key, e.shard, e.partition, value.get("p", 0), value["n"]))
    return out


def assert_key_order(reads: Iterable[KeyedRead], rounds: int | None = None) -> None:
    """Each key's events were on one (shard, partition), and each producer's events of a key were read
    in the order it published them: ``n`` counting up by one, without gap or repeat (from 0 to
    ``rounds - 1`` when ``rounds`` is given, else from wherever the read began)."""
    where: dict[str, set[tuple[int, int]]] = {}
    seen: dict[tuple[int, str], list[int]] = {}
    for r in reads:
        where.setdefault(r.key, set()).add((r.shard, r.partition))
        got = seen.setdefault((r.producer, r.key), [])
        assert not got or r.n == got[-1] + 1, f"key {r.key!r}, producer {r.producer}: {r.n} after {got[-5:]}"
        got.append(r.n)
    assert seen, "no keyed event was read"
    split = {k: v for k, v in where.items() if len(v) > 1}
    assert not split, f"keys on several (shard, partition) pairs: {split}"
    if rounds is not None:
        short = {pk: ns for pk, ns in seen.items() if ns != list(range(rounds))}
        assert not short, f"keys whose events are not 0 to {rounds - 1}: {dict(list(short.items())[:3])}"


def first_reads(reads: Iterable[KeyedRead]) -> list[KeyedRead]:
    """The first read of each event (producer, key, n), in read order: what an at-least-once reader's
    order is judged by once the events it read again (after a failed commit) are set aside."""
    seen: set[tuple[int, str, int]] = set()
    out = []
    for r in reads:
        if (r.producer, r.key, r.n) not in seen:
            seen.add((r.producer, r.key, r.n))
            out.append(r)
    return out


def assert_events_in_key_order(events: Iterable[pgstreams.Event], rounds: int | None = None) -> None:
    """:func:`assert_key_order` of the keyed events among ``events``."""
    assert_key_order(reads_of(events), rounds)


def produce_keyed(dsns: list[str], topic: str, producer: int, keys: list[str], rounds: int, batch: bool
                  ) -> int:
    """Publish ``rounds`` events per key (value ``{"p", "k", "n"}``, ``n`` counting per key from 0) with
    event ids, in ``publish_many`` batches of one event per key or one by one. Returns the count."""
    with cluster(dsns, pool_size=2) as client:
        for n in range(rounds):
            events = [{**e, "event_id": f"{producer}-{e['key']}-{n}"}
                      for e in keyed(keys, 1, first=n, producer=producer)]
            if batch:
                client.publish_many(topic, events)
            else:
                for e in events:
                    client.publish(topic, e["value"], key=e["key"], event_id=e["event_id"])
    return rounds * len(keys)


def read_all(client: ClusterClient | pgstreams.Client, topic: str, group: str, expected: int,
             timeout: float = 60.0, rounds: int | None = None) -> list[pgstreams.Event]:
    """Poll and commit ``group`` on ``topic`` until ``expected`` events arrived (fails after ``timeout``),
    and check their per-key order (:func:`assert_events_in_key_order`, with ``rounds``)."""
    consumer = client.consumer(topic, group)
    out: list[pgstreams.Event] = []
    deadline = time.monotonic() + timeout
    while len(out) < expected:
        assert time.monotonic() < deadline, f"read {len(out)} of {expected} events"
        got = consumer.poll(500, 0.5)
        out += got
        if got:
            assert consumer.commit(got).ok
    assert_events_in_key_order(out, rounds)
    return out


def run_cluster_worker(dsns: list[str], topic: str, group: str, table: str, ready: Any, member: str) -> None:
    """A process running a :class:`pgstreams.ClusterWorker` on ``topic`` in ``group``, transactional: the
    handler inserts each event (shard, partition, key, n, member, position) into ``table`` on the event's
    shard, in the transaction that stores the checkpoint. Runs until killed."""
    with cluster(dsns, pool_size=4, retry_timeout=5) as client:
        worker = pgstreams.ClusterWorker(client, member_id=member, install_signal_handlers=True,
                                         maintenance=None)

        def handle(events: list[pgstreams.Event], conn: psycopg.Connection) -> None:
            with conn.cursor() as cur:
                cur.executemany(f"INSERT INTO {table} (shard, partition, k, n, member, position) "
                                "VALUES (%s, %s, %s, %s, %s, %s)",
                                [(e.shard, e.partition, e.value["k"], e.value["n"], member, e.position)
                                 for e in events])

        worker.subscribe(topic, group, handle, batch=True, mode="transactional", max_events=20,
                         max_wait=0.05, heartbeat_interval=0.3, session_timeout=3.0)
        ready.set()
        worker.run(until=threading.Event())
