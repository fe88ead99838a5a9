"""Change data capture under faults, with real processes: a capturer killed (SIGKILL) before its events are
stored, between storing them and advancing the slot, and after, under concurrent writers; and another
``pgstreams cdc run`` taking over when the capturing one dies. Each time the topic holds exactly one event
per committed change, in commit order per key, and nothing of a rolled-back transaction."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

import pgstreams
from _cdc_helpers import WriterThreads, all_events
from _core_helpers import wait_until

HELPER = Path(__file__).resolve().parents[1] / "_cdc_helpers.py"
KEYS = 40


class Writers(WriterThreads):
    """Threads that commit counter increments of :data:`KEYS` rows (``n`` counts a row's commits, from 1)
    in one- and two-row transactions, and roll back inserts of negative ids."""

    def write(self, conn: psycopg.Connection, rnd: random.Random) -> None:
        keys = sorted(rnd.sample(range(1, KEYS + 1), rnd.choice((1, 2))))
        for k in keys:
            conn.execute("INSERT INTO c VALUES (%s, 1) ON CONFLICT (id) DO UPDATE SET n = c.n + 1", (k,))
        conn.commit()
        if rnd.random() < 0.1:
            conn.execute("INSERT INTO c VALUES (%s, 1)", (-rnd.randint(1, 10**6),))
            conn.rollback()


def committed(dsn: str) -> dict[str, int]:
    with psycopg.connect(dsn) as conn:
        return {f'{{"id":{k}}}': n for k, n in conn.execute("SELECT id, n FROM c")}


def assert_exactly_once(client: pgstreams.Client, dsn: str) -> None:
    """One event per committed change: per key, ``n`` runs 1, 2, 3, ... to the row's value, in order."""
    seen: dict[str, list[int]] = {}
    for ev in sorted(all_events(client, "cdc.public.c"), key=lambda e: (e.partition, e.position)):
        assert ev.key is not None and not ev.key.startswith('{"id":-'), "a rolled-back insert was captured"
        seen.setdefault(ev.key, []).append(ev.value["after"]["n"])
    expected = committed(dsn)
    assert set(seen) == set(expected)
    for key, values in seen.items():
        assert values == list(range(1, expected[key] + 1)), key


def capture_all(client: pgstreams.Client) -> None:
    """Capture to the end once the killed capturer's session is gone (its lock released)."""
    capturer = client.cdc.capturer("cdc")
    wait_until(capturer.acquire, 15, "the capture's lock, released by the killed capturer's session")
    try:
        capturer.run_until_idle()
    finally:
        capturer.release()


@pytest.mark.parametrize("point", ["peeked", "stored", "advanced"])
def test_a_capturer_killed_at_any_point_loses_and_repeats_nothing(cdc_dsn: str, cdc_client: pgstreams.Client,
                                                                  tmp_path: Path, point: str) -> None:
    with psycopg.connect(cdc_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE c (id int PRIMARY KEY, n int NOT NULL)")
    cdc_client.cdc.add(["c"], partitions=2)
    writers = Writers(cdc_dsn)
    try:
        wait_until(lambda: committed(cdc_dsn), 10, "the writers' first commits")
        marker = tmp_path / "at"
        proc = subprocess.Popen([sys.executable, str(HELPER), cdc_dsn, "cdc", point, "3", str(marker)])
        try:
            wait_until(marker.exists, 30, f"the capturer at {point!r}", every=0.005)
            os.kill(proc.pid, signal.SIGKILL)
        finally:
            proc.kill()
            proc.wait(10)
        stored = cdc_client.cdc.describe("cdc").changes
        assert stored > 0 or point == "peeked"
    finally:
        writers.finish()
    capture_all(cdc_client)
    assert_exactly_once(cdc_client, cdc_dsn)


def test_another_process_takes_over_when_the_capturing_one_dies(cdc_dsn: str, cdc_client: pgstreams.Client
                                                                ) -> None:
    with psycopg.connect(cdc_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE c (id int PRIMARY KEY, n int NOT NULL)")
    cdc_client.cdc.add(["c"])
    env = {k: v for k, v in os.environ.items() if not k.startswith("PGSTREAMS_")}
    cmd = [sys.executable, "-m", "pgstreams.cli", "cdc", "run", "--dsn", cdc_dsn]
    first = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    second: subprocess.Popen[bytes] | None = None
    writers = Writers(cdc_dsn, count=2)
    try:
        wait_until(lambda: cdc_client.cdc.describe("cdc").changes > 20, 30, "the first process capturing")
        second = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        wait_until(lambda: cdc_client.cdc.describe("cdc").changes > 60, 30, "more changes captured")
        first.kill()  # SIGKILL: its session ends, the second takes the capture over
        first.wait(10)
        before = cdc_client.cdc.describe("cdc").changes
        wait_until(lambda: cdc_client.cdc.describe("cdc").changes > before + 20, 30, "the second capturing")
    finally:
        writers.finish()
    total = sum(committed(cdc_dsn).values())
    wait_until(lambda: cdc_client.cdc.describe("cdc").changes == total, 30, "every committed change captured")
    assert second is not None
    second.send_signal(signal.SIGTERM)
    _, err = second.communicate(timeout=30)
    assert second.returncode == 0, err.decode()  # stopped cleanly
    assert b"Traceback" not in err
    assert_exactly_once(cdc_client, cdc_dsn)
