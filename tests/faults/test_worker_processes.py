"""Worker processes: sharing partitions, rebalancing, crashes (SIGKILL), pauses (SIGSTOP) and graceful
shutdown (SIGTERM, SIGINT), with exactly-once effects in transactional mode.

Workers run ``tests/workers_app.py`` in real subprocesses with a 0.2 s heartbeat and a 1.5 s session
timeout. Producers publish from threads of the test process meanwhile.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import psycopg
import pytest

import pgstreams
from workers_app import create_tables  # tests/ is on sys.path

pytestmark = pytest.mark.slow

APP = Path(__file__).resolve().parents[1] / "workers_app.py"
HB, SESSION = 0.2, 1.5


def until(cond: Callable[[], bool], timeout: float, what: str, alive: Iterable[Proc] = ()) -> float:
    """Wait for ``cond``; return the monotonic time it became true. Fails at once, with its log, if one
    of the ``alive`` workers exits meanwhile."""
    deadline = time.monotonic() + timeout
    while True:
        if cond():
            return time.monotonic()
        for p in alive:
            if p.popen.poll() is not None:
                raise AssertionError(f"worker {p.name} exited ({p.popen.returncode}) while waiting for "
                                     f"{what}:\n{p.log()[-3000:]}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.02)


class Proc:
    """A worker subprocess; its log goes to a file."""

    def __init__(self, name: str, dsn: str, tmp: Path, *args: str, sleep: float = 0.0) -> None:
        self.name = name
        self.log_path = tmp / f"{name}.log"
        env = dict(os.environ, WORKERS_APP_NAME=name, WORKERS_APP_SLEEP=str(sleep), PYTHONUNBUFFERED="1")
        self._log = open(self.log_path, "wb")
        self.popen = subprocess.Popen(
            [sys.executable, str(APP), "--dsn", dsn, "--topic", "t", "--group", "g", "--heartbeat", str(HB),
             "--session", str(SESSION), *args],
            env=env, stdout=subprocess.DEVNULL, stderr=self._log)

    def signal(self, sig: int) -> None:
        self.popen.send_signal(sig)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def close(self) -> None:
        if self.popen.poll() is None:
            try:
                self.popen.send_signal(signal.SIGCONT)
            except ProcessLookupError:
                pass
            self.popen.kill()
            self.popen.wait(10)
        self._log.close()


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[dict[str, Proc]]:
    started: dict[str, Proc] = {}
    yield started
    for p in started.values():
        p.close()


def owners(client: pgstreams.Client) -> dict[int, str | None]:
    return {s.partition: s.owner for s in pgstreams.group_status(client, "g")}


def shares(client: pgstreams.Client) -> dict[str, int]:
    out: dict[str, int] = {}
    for o in owners(client).values():
        if o is not None:
            out[o] = out.get(o, 0) + 1
    return out


def count(client: pgstreams.Client, sql: str) -> int:
    with client.connection() as conn:
        row = conn.execute(sql).fetchone()
    assert row is not None
    return int(row[0])


class Producers:
    """Threads publishing batches of events with random keys until stopped."""

    def __init__(self, dsn: str, threads: int = 2, batch: int = 10) -> None:
        self.dsn = dsn
        self.batch = batch
        self.stop = threading.Event()
        self.published = 0
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(threads)]
        self.errors: list[BaseException] = []

    def _run(self, seed: int) -> None:
        rnd = random.Random(seed)
        try:
            with pgstreams.connect(self.dsn, pool_size=2) as client:
                while not self.stop.is_set():
                    n = client.publish_many("t", [{"value": rnd.random(), "key": f"k{rnd.randrange(1000)}"}
                                                  for _ in range(self.batch)])
                    with self._lock:
                        self.published += n
                    self.stop.wait(0.01)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.errors.append(exc)

    def __enter__(self) -> Producers:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self._threads:
            t.join(10)


def test_workers_share_rebalance_survive_kills_and_handle_every_event_once(
        dsn: str, tmp_path: Path, procs: dict[str, Proc]) -> None:
    create_tables(dsn)
    rnd = random.Random()
    with pgstreams.connect(dsn) as client:
        client.create_topic("t", 12)
        args = ("--handler", "record_tx", "--mode", "transactional", "--max-events", "50")
        with Producers(dsn) as producers:
            for i in range(1, 5):
                procs[f"w{i}"] = Proc(f"w{i}", dsn, tmp_path, *args)
            until(lambda: sorted(shares(client).values()) == [3, 3, 3, 3], 30, "4 workers x 3 partitions",
                  procs.values())
            until(lambda: count(client, "SELECT count(*) FROM handled") > 0, 10, "events handled")

            for i in (5, 6):
                procs[f"w{i}"] = Proc(f"w{i}", dsn, tmp_path, *args)
            until(lambda: sorted(shares(client).values()) == [2] * 6, 30, "6 workers x 2 partitions",
                  procs.values())

            victims = rnd.sample(sorted(procs), 2)
            killed_at: dict[str, float] = {}
            for name in victims:
                time.sleep(rnd.uniform(0.1, 0.8))  # a random moment, while events flow
                procs[name].signal(signal.SIGKILL)
                killed_at[name] = time.monotonic()
                procs[name].popen.wait(5)
            survivors = [n for n in procs if n not in victims]

            # the partitions of the dead stay theirs until their session times out, then move
            for name in victims:
                taken = until(lambda n=name: not any(o == n for o in owners(client).values()), 20,
                              f"the partitions of {name} to be taken over")
                assert taken - killed_at[name] >= SESSION - HB - 0.15, "taken over before the session timeout"
            until(lambda: sorted(shares(client).values()) == [3] * 4
                  and set(shares(client)) == set(survivors), 30, "4 survivors x 3 partitions",
                  [procs[n] for n in survivors])
            time.sleep(0.5)  # keep publishing a little while the survivors run
        assert not producers.errors
        total = producers.published
        until(lambda: count(client, "SELECT count(*) FROM handled") >= total, 60, "every event handled")
        until(lambda: all(s.lag == 0 for s in pgstreams.group_status(client, "g")), 30, "no lag")

        # exactly once: one row per published event (the unique constraint would have failed a second
        # attempt, sending it to the dead-letter topic, which was never created)
        assert count(client, "SELECT count(*) FROM handled") == total
        assert count(client, "SELECT count(DISTINCT position) FROM handled") == total
        with pytest.raises(pgstreams.TopicNotFound):
            client.describe_topic("t.dlt")
        for name in procs:  # the killed ones too: none handled an event another had handled
            assert "UniqueViolation" not in procs[name].log(), name
        # within a partition the events were handled in read order (position), whoever handled them
        with client.connection() as conn:
            bad = conn.execute("""
                SELECT count(*) FROM (
                  SELECT at < lag(at) OVER (PARTITION BY partition ORDER BY position) AS back
                    FROM handled
                ) s WHERE back""").fetchone()
            members = {r[0] for r in conn.execute("SELECT DISTINCT member FROM handled").fetchall()}
        assert bad == (0,)
        assert members >= set(survivors)

        for name in survivors:
            procs[name].signal(signal.SIGTERM)
        for name in survivors:
            assert procs[name].popen.wait(20) == 0, procs[name].log()[-2000:]
        assert all(o is None for o in owners(client).values())
        assert not pgstreams.group_members(client, "g")


def test_a_paused_worker_cannot_commit_after_its_lease_expired(
        dsn: str, tmp_path: Path, procs: dict[str, Proc]) -> None:
    create_tables(dsn)
    with pgstreams.connect(dsn) as client:
        client.create_topic("t", 4)
        args = ("--handler", "record", "--max-events", "20")
        procs["a"] = Proc("a", dsn, tmp_path, *args)
        until(lambda: shares(client) == {"a": 4}, 20, "a owns everything")
        procs["b"] = Proc("b", dsn, tmp_path, *args)
        until(lambda: shares(client) == {"a": 2, "b": 2}, 20, "2 + 2")
        a_parts = sorted(p for p, o in owners(client).items() if o == "a")
        p = a_parts[0]
        # a batch on one of a's partitions: 5 events, then one a takes 3 s over, then 5 more
        client.publish_many("t", [{"value": {"i": i, "block": i == 5}, "partition": p} for i in range(11)])
        last = client.describe_topic("t").partition_info[p].head
        assert last is not None
        marker = last - 5

        def delivered_marker() -> bool:
            with client.connection() as conn:
                return conn.execute("SELECT count(*) FROM deliveries WHERE member = 'a' AND position = %s",
                                    (marker,)).fetchone() == (1,)

        until(delivered_marker, 20, "a to be inside its handler")

        procs["a"].signal(signal.SIGSTOP)  # paused in the middle of its batch
        stopped = time.monotonic()
        until(lambda: shares(client) == {"b": 4}, 20, "b to take over a's partitions")
        assert time.monotonic() - stopped >= SESSION - HB - 0.15
        until(lambda: all(s.lag == 0 for s in pgstreams.group_status(client, "g")), 20, "b to catch up")
        checkpoint = {s.partition: s.checkpoint for s in pgstreams.group_status(client, "g")}
        procs["a"].signal(signal.SIGCONT)

        until(lambda: "fenced" in procs["a"].log(), 20, "a's commit to be fenced")
        assert {s.partition: s.checkpoint for s in pgstreams.group_status(client, "g")} == checkpoint, \
            "the fenced commit stored nothing"
        with client.connection() as conn:
            by = dict(conn.execute("SELECT member, count(*) FROM deliveries WHERE partition = %s"
                                   " AND position > %s GROUP BY 1", (p, last - 11)).fetchall())
        # a handled the first events of the batch and the marker, but could not commit them: b, which
        # took the partition over at the last checkpoint, handled the whole batch again
        assert by["a"] == 6 and by["b"] == 11
        for name in ("a", "b"):
            procs[name].signal(signal.SIGTERM)
        for name in ("a", "b"):
            assert procs[name].popen.wait(20) == 0
        assert all(s.lag == 0 for s in pgstreams.group_status(client, "g"))


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_sigterm_or_sigint_during_a_batch_commits_it_and_releases_every_lease(
        dsn: str, tmp_path: Path, procs: dict[str, Proc], sig: signal.Signals) -> None:
    create_tables(dsn)
    with pgstreams.connect(dsn) as client:
        client.create_topic("t", 2)
        client.publish_many("t", [{"value": i} for i in range(100)])
        procs["w"] = Proc("w", dsn, tmp_path, "--handler", "slow_batch_tx", "--mode", "transactional",
                          "--batch", "--min-events", "10", "--max-events", "10", sleep=1.0)
        until(lambda: count(client, "SELECT count(*) FROM batches_started") >= 1, 20, "a batch in hand")
        with client.connection() as conn:
            row = conn.execute("SELECT clock_timestamp()").fetchone()
        assert row is not None
        signalled = row[0]
        procs["w"].signal(sig)
        assert procs["w"].popen.wait(20) == 0, procs["w"].log()[-2000:]
        started = count(client, "SELECT coalesce(sum(n), 0) FROM batches_started")
        handled = count(client, "SELECT count(*) FROM handled")
        assert handled == started >= 10, "every batch started was finished and committed"
        with client.connection() as conn:
            after = conn.execute("SELECT (SELECT count(*) FROM handled WHERE at > %(t)s),"
                                 " (SELECT count(*) FROM batches_started WHERE at > %(t)s)",
                                 {"t": signalled}).fetchone()
        # the handler wrote its rows 1 s after the batch began: the batch in hand when the signal came was
        # finished after it, and no batch began after it
        assert after == (10, 0), after
        status = pgstreams.group_status(client, "g")
        assert sum(s.lag for s in status) == 100 - handled, "its checkpoint was stored"
        assert all(s.owner is None and s.pending_owner is None for s in status), "no lease held"
        assert not pgstreams.group_members(client, "g")
        with psycopg.connect(dsn) as conn:
            held = conn.execute("SELECT count(*) FROM pgstreams.leases WHERE owner IS NOT NULL").fetchone()
        assert held == (0,)
        assert "left group g" in procs["w"].log()
