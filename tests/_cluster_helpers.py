"""Helpers of the cluster tests: subprocess producers and workers (importable by ``spawn`` children), and
reading a whole cluster topic."""

from __future__ import annotations

import threading
from typing import Any

import psycopg

import pgstreams
from pgstreams.cluster import ClusterClient


def cluster(dsns: list[str], **options: Any) -> ClusterClient:
    """A :class:`ClusterClient` of ``dsns`` (typed)."""
    client = pgstreams.connect(dsns, **options)
    assert isinstance(client, ClusterClient)
    return client


def produce_keyed(dsns: list[str], topic: str, producer: int, keys: list[str], rounds: int, batch: bool
                  ) -> int:
    """Publish ``rounds`` events per key (value ``{"p", "k", "n"}``, ``n`` counting per key from 0) with
    event ids, in ``publish_many`` batches of one event per key or one by one. Returns the count."""
    with cluster(dsns, pool_size=2) as client:
        for n in range(rounds):
            events = [{"value": {"p": producer, "k": k, "n": n}, "key": k, "event_id": f"{producer}-{k}-{n}"}
                      for k in keys]
            if batch:
                client.publish_many(topic, events)
            else:
                for e in events:
                    client.publish(topic, e["value"], key=e["key"], event_id=e["event_id"])
    return rounds * len(keys)


def read_all(client: ClusterClient, topic: str, group: str, expected: int, timeout: float = 60.0
             ) -> list[pgstreams.Event]:
    """Poll and commit ``group`` on ``topic`` until ``expected`` events arrived (fails after ``timeout``)."""
    import time

    consumer = client.consumer(topic, group)
    out: list[pgstreams.Event] = []
    deadline = time.monotonic() + timeout
    while len(out) < expected:
        assert time.monotonic() < deadline, f"read {len(out)} of {expected} events"
        got = consumer.poll(500, 0.5)
        out += got
        if got:
            assert consumer.commit(got).ok
    return out


def run_cluster_worker(dsns: list[str], topic: str, group: str, table: str, ready: Any, member: str) -> None:
    """A process running a :class:`pgstreams.ClusterWorker` on ``topic`` in ``group``, transactional: the
    handler inserts each event (shard, key, n, member) into ``table`` on the event's shard, in the
    transaction that stores the checkpoint. Runs until killed."""
    with cluster(dsns, pool_size=4, retry_timeout=5) as client:
        worker = pgstreams.ClusterWorker(client, member_id=member, install_signal_handlers=True,
                                         maintenance=None)

        def handle(events: list[pgstreams.Event], conn: psycopg.Connection) -> None:
            with conn.cursor() as cur:
                cur.executemany(f"INSERT INTO {table} (shard, k, n, member, position) "
                                "VALUES (%s, %s, %s, %s, %s)",
                                [(e.shard, e.value["k"], e.value["n"], member, e.position) for e in events])

        worker.subscribe(topic, group, handle, batch=True, mode="transactional", max_events=20,
                         max_wait=0.05, heartbeat_interval=0.3, session_timeout=3.0)
        ready.set()
        worker.run(until=threading.Event())
