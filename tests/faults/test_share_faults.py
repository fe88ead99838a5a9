"""Share groups under faults: racing producers with long transactions (the read fence), SIGKILLed
consumer processes and expiring locks leave every committed event acked, rejected or dead-lettered exactly
once; two consumers never hold one event's lock at once."""

from __future__ import annotations

import itertools
import json
import random
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import psycopg
import pytest

import pgstreams
from _core_helpers import SPAWN, kill, produce_worker, share_exactly_once_worker, wait_until

KEYS = [f"k{i}" for i in range(7)]


@pytest.mark.slow
def test_every_committed_event_is_acked_or_rejected_exactly_once_under_racing_producers_kills_and_expiry(
        client: pgstreams.Client, dsn: str, tmp_path: Path) -> None:
    client.create_topic("t", 3)
    with psycopg.connect(dsn, autocommit=True) as conn:
        # no unique constraint: a second write for an event would be stored and counted
        conn.execute("CREATE TABLE effects (position bigint NOT NULL, pid integer)")
    client.share_consumer("t", "g", max_deliveries=1000)  # the group exists before the first event
    stop = tmp_path / "stop"
    rng = random.Random(7)
    consumers: dict[int, Any] = {}
    seq = 0

    def start() -> None:
        nonlocal seq
        seq += 1
        p = SPAWN.Process(target=share_exactly_once_worker,
                          args=(dsn, "t", "g", seq, 0.3, 1.0, str(stop)), daemon=True)
        p.start()
        consumers[seq] = p

    for _ in range(3):
        start()
    kills = 0
    with ProcessPoolExecutor(3, mp_context=SPAWN) as pool:
        futures = [pool.submit(produce_worker, dsn, "t", p, 40, KEYS, 100 + p, 0.2, 0.4) for p in range(3)]
        while not all(f.done() for f in futures):
            time.sleep(0.3 + rng.random() * 0.5)  # the rhythm of the kills, not synchronisation
            victim = rng.choice(sorted(consumers))
            kill(consumers.pop(victim))
            kills += 1
            start()
        produced = [tx for f in futures for tx in f.result()]
    committed = [e for tx in produced if tx["commit"] for e in tx["events"]]
    assert committed and kills >= 3

    dlt = pgstreams.Consumer(client, "t.dlt", "check")
    rejected: list[pgstreams.Event] = []

    def settled() -> bool:
        rejected.extend(dlt.poll(1000, 0.1))
        with psycopg.connect(dsn, autocommit=True) as conn:
            row = conn.execute("SELECT count(DISTINCT position) FROM effects").fetchone()
        return row is not None and row[0] + len(rejected) >= len(committed)

    wait_until(settled, 120, "every committed event settled")
    stop.touch()
    for p in consumers.values():
        p.join(30)
        if p.is_alive():
            kill(p)
    rejected.extend(dlt.poll(1000, 0.3))
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute("SELECT position, count(*) FROM effects GROUP BY position").fetchall()
        stored = conn.execute("SELECT position, value FROM pgstreams.topic_1").fetchall()
        left = conn.execute("SELECT count(*) FROM pgstreams.share_events").fetchone()
    handled = dict(rows)
    dup = {p: n for p, n in handled.items() if n != 1}
    assert not dup, f"events handled more than once: {sorted(dup.items())[:5]}"
    dead = [int(e.headers["dlt.position"]) for e in rejected]
    assert len(dead) == len(set(dead)), "an event was dead-lettered twice"
    assert not set(dead) & set(handled), "an event was both handled and rejected"
    values = {pos: json.loads(bytes(v)) for pos, v in stored}
    assert set(handled) | set(dead) == set(values), "a committed event was skipped"
    assert all(values[p]["i"] == 2 for p in dead) and all(values[p]["i"] != 2 for p in handled)
    assert sorted((v["p"], v["t"], v["i"]) for v in values.values()) == sorted(
        (e["p"], e["t"], e["i"]) for e in committed)
    assert left == (0,)


def test_two_consumers_never_hold_the_same_events_lock_at_once(client: pgstreams.Client) -> None:
    lock = 0.3
    client.create_topic("t", 2)
    client.publish_many("t", [{"value": i} for i in range(30)])
    # (event, delivery count) -> (consumer, before its poll, after its poll): monotonic times of one process
    acquisitions: dict[tuple[int, int], list[tuple[int, int, float, float]]] = {}
    guard = threading.Lock()
    errors: list[BaseException] = []
    deadline = time.monotonic() + 2.5

    def run(i: int) -> None:
        share = client.share_consumer("t", "g", lock_timeout=lock, max_deliveries=1000, dead_letter=False)
        try:
            while time.monotonic() < deadline:
                before = time.monotonic()
                got = share.poll(random.randint(1, 10), 0.05)
                after = time.monotonic()
                with guard:
                    for e in got:
                        acquisitions.setdefault((e.partition, e.position), []).append(
                            (e.delivery_count, i, before, after))
                # never settled: every lock expires and the event is taken again
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors, errors
    assert len(acquisitions) == 30
    retaken = 0
    for key, acqs in acquisitions.items():
        acqs.sort()
        counts = [a[0] for a in acqs]
        assert counts == list(range(1, len(acqs) + 1)), f"{key}: delivery counts {counts}"
        for (_, _, start_prev, _), (_, _, _, end_next) in itertools.pairwise(acqs):
            # the next acquisition came after the previous lock expired: it was taken at the earliest when
            # the previous poll started, and held at least lock seconds
            assert end_next - start_prev >= lock, f"{key} was acquired again while locked"
            retaken += 1
    assert retaken >= 30
