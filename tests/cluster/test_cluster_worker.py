"""Cluster workers: a group of worker processes leases (shard, partition) pairs on every shard; SIGKILLed
members' pairs go to the others; every event is handled exactly once (transactional mode), each key's
events in order; while a shard is down the other shards' workers go on, and its worker starts again once
it is back."""

from __future__ import annotations

import os
import signal
import threading
from collections import Counter

import psycopg
import pytest

import pgstreams
from _cluster_helpers import (
    KeyedRead,
    assert_events_in_key_order,
    assert_key_order,
    cluster,
    first_reads,
    keyed,
    reads_of,
    run_cluster_worker,
)
from _core_helpers import SPAWN, until
from pgstreams.cluster import ClusterWorker, shard_for_key
from pgstreams.embedded import TemporaryServer

pytestmark = pytest.mark.timeout(600)

TABLE = "handled"


def _handled(dsns: list[str]) -> list[tuple[int, int, str, int, str, int]]:
    """The rows the workers' handlers stored, shard by shard, each shard's in the order it stored them."""
    out = []
    for dsn in dsns:
        with psycopg.connect(dsn) as conn:
            out += conn.execute(f"SELECT shard, partition, k, n, member, position FROM {TABLE} ORDER BY id"
                                ).fetchall()
    return out


def test_a_worker_group_with_sigkills_handles_every_event_once_in_key_order(cluster_dsns: list[str]) -> None:
    keys = [f"key-{i}" for i in range(30)]
    rounds = 20
    for dsn in cluster_dsns:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f"CREATE TABLE {TABLE} (id bigserial PRIMARY KEY, shard int, partition int, k text, "
                         "n int, member text, position bigint)")
    with cluster(cluster_dsns) as client:
        client.create_topic("work", 2)
        client.publish_many("work", keyed(keys, rounds // 2))
        procs = []
        for m in range(3):
            ready = SPAWN.Event()
            p = SPAWN.Process(target=run_cluster_worker,
                              args=(cluster_dsns, "work", "g", TABLE, ready, f"m{m}"), daemon=True)
            p.start()
            procs.append((p, ready))
        try:
            for _, ready in procs:
                assert ready.wait(120), "a worker did not start"
            until(lambda: len(_handled(cluster_dsns)) >= len(keys) * 3, 120, "the first events handled")
            os.kill(procs[0][0].pid, signal.SIGKILL)
            client.publish_many("work", keyed(keys, rounds - rounds // 2, first=rounds // 2))
            until(lambda: len(_handled(cluster_dsns)) >= len(keys) * rounds, 180, "every event handled")
            os.kill(procs[1][0].pid, signal.SIGKILL)
            # the last member holds every (shard, partition) once the killed members' sessions expire
            with pgstreams.connect(cluster_dsns[0]) as one:
                until(lambda: {s.owner for s in one.describe_group("g", "work")} <= {"m2"}, 120,
                      "the survivor leasing shard 0's partitions")
        finally:
            for p, _ in procs:
                if p.is_alive():
                    os.kill(p.pid, signal.SIGKILL)
                p.join(10)
    rows = _handled(cluster_dsns)
    counts = Counter((k, n) for _, _, k, n, _, _ in rows)
    assert len(counts) == len(keys) * rounds and max(counts.values()) == 1, counts.most_common(3)
    # each key's events handled once each, in publish order (in the order each shard stored them)
    assert_key_order([KeyedRead(k, shard, partition, 0, n) for shard, partition, k, n, _, _ in rows], rounds)
    assert {shard for shard, *_ in rows} == {0, 1, 2}


def test_cluster_worker_assignment_covers_every_shard_and_partition(cluster_dsns: list[str]) -> None:
    keys = [f"k{i}" for i in range(30)]
    with cluster(cluster_dsns) as client:
        client.create_topic("assign", 2)
        handled: list[pgstreams.Event] = []
        worker = ClusterWorker(client, member_id="solo", install_signal_handlers=False, maintenance=None)
        worker.subscribe("assign", "g", handled.append)
        with pytest.raises(pgstreams.InvalidArgument):
            worker.subscribe("assign", "g", handled.append, max_events=0)
        worker.start()
        try:
            until(lambda: set(worker.assignment().get(("g", "assign"), ())) == {
                (s, p) for s in range(3) for p in range(2)}, 60, "every pair leased")
            client.publish_many("assign", keyed(keys, 3))
            until(lambda: len(handled) >= 90, 60, "every event handled")
        finally:
            worker.stop(10)
        assert len(handled) == 90
        assert_events_in_key_order(handled, rounds=3)  # each key's events once, in publish order
        assert {(e.shard, e.partition) for e in handled} == {(s, p) for s in range(3) for p in range(2)}


def test_the_other_shards_workers_go_on_while_a_shard_is_down(
        cluster_dsns: list[str], shard_servers: list[TemporaryServer]) -> None:
    keys = [f"k{i}" for i in range(60)]
    with cluster(cluster_dsns, retry_timeout=1.0) as client:
        client.create_topic("down", 2)
        down_keys = {k for k in keys if shard_for_key(k, 2, 3) == 2}
        handled: list[pgstreams.Event] = []
        lock = threading.Lock()

        def handle(event: pgstreams.Event) -> None:
            with lock:
                handled.append(event)

        worker = ClusterWorker(client, member_id="solo", install_signal_handlers=False, maintenance=None)
        worker.subscribe("down", "g", handle, heartbeat_interval=0.3, session_timeout=3.0)
        worker.start()
        try:
            until(lambda: len(worker.assignment().get(("g", "down"), ())) == 6, 60, "every pair leased")
            client.publish_many("down", keyed(keys, 1))
            until(lambda: len(handled) >= len(keys), 60, "the first events handled")
            shard_servers[2].stop("immediate")
            try:
                up = [k for k in keys if k not in down_keys]
                client.publish_many("down", keyed(up, 2, first=1))
                until(lambda: len(handled) >= len(keys) + 2 * len(up), 60,
                      "the events of the shards that are up, handled while shard 2 is down")
            finally:
                shard_servers[2].start()
            client.publish_many("down", keyed(sorted(down_keys), 2, first=1))
            until(lambda: len({(e.key, e.value["n"]) for e in handled}) >= 3 * len(keys), 120,
                  "shard 2's events once it is back")
        finally:
            worker.stop(10)
    counts = Counter((e.value["k"], e.value["n"]) for e in handled)
    assert set(counts) == {(k, n) for k in keys for n in (0, 1, 2)}
    # every key's events in publish order (at-least-once: an event whose commit the shard's stop cut off
    # may be handled again, after the first time)
    assert_key_order(first_reads(reads_of(handled)), rounds=3)
