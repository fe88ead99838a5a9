"""The fault benchmark: restarts and killed connections, with counts.

    python -m bench.faults [--duration 30] [--quick] [--only restart,kill] [--json]

Every scenario runs on a PostgreSQL of its own (``pgstreams.embedded.restartable_server``: fsync off,
synchronous commit on, so an immediate shutdown loses nothing committed), never the machine's server. The
workload, in one process: a single-event producer and a batch producer (``publish_many`` of 10) on a topic
of 4 partitions, a stream-group consumer (poll + commit, at-least-once), a worker group of two members
in transactional mode writing each event to a table of handled events, and a worker group of two members
in at-least-once mode (the default) counting the events it is handed. Each client has
``retry_timeout=60``; the members heartbeat every 0.5 s with a session timeout of 3 s.

* ``restart``: a fast shutdown at a third of ``--duration`` (default 30 s) and an immediate one at two
  thirds, each down for 1 s. Recovery: from the server accepting connections again to the first event
  published, consumed and handled after it.
* ``kill``: ``pg_terminate_backend`` of a random session of the database every 200 ms for ``--duration``.
  Recovery: from the last kill to the first event published, consumed and handled by both worker groups
  after it.

Counts per scenario: events published (acknowledged), stored (distinct), duplicated (stored more than
once), lost (acknowledged but not stored), consumed (distinct), handled by the transactional group
(distinct; ``handled_twice``: more than once, which exactly-once forbids) and by the at-least-once group
(distinct; ``redelivered``: handed again, which at-least-once allows), calls that raised, services that
failed (a worker's supervisor gave up) and whether a thread of the workload died. The held-snapshot run is
``python -m bench.snapshot``.
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

import pgstreams
from pgstreams.embedded import TemporaryServer, restartable_server

#: Seconds each restart or kill scenario runs.
DURATION = 30.0
#: ``--quick``: seconds per scenario.
QUICK_DURATION = 8.0
SCENARIOS = ("restart", "kill")


@dataclass
class Counts:
    """What a scenario did."""

    scenario: str
    seconds: float = 0.0
    published: int = 0
    stored: int = 0
    duplicated: int = 0
    lost: int = 0
    consumed: int = 0
    handled: int = 0
    handled_twice: int = 0
    handled_at_least_once: int = 0
    redelivered: int = 0
    lost_by_at_least_once: int = 0
    raised: int = 0
    failed_services: int = 0
    recovery_s: list[float] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)


class Workload:
    """Producers, a consumer and a transactional worker group on topic ``t`` of database ``dsn``."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.stop = threading.Event()  # producers stop
        self.drained = threading.Event()  # the consumer stops
        self.errors: list[str] = []
        self.acked: list[int] = []
        self.consumed: Counter[int] = Counter()
        self.delivered: Counter[int] = Counter()  # by the at-least-once group
        self.last_ok = {"publish": 0.0, "consume": 0.0, "at_least_once": 0.0}
        self._next = iter(range(10**9))
        self._lock = threading.Lock()
        with pgstreams.connect(dsn) as c:
            c.create_topic("t", 4)
            with c.connection() as conn:
                conn.execute("CREATE TABLE IF NOT EXISTS handled (value bigint)")
        self.clients = [pgstreams.connect(dsn, retry_timeout=60) for _ in range(3)]
        self.workers = []
        for _ in range(2):
            w = pgstreams.Worker(pgstreams.connect(dsn, retry_timeout=60))
            w.subscribe("t", "workers", self._handle, mode="transactional", heartbeat_interval=0.5,
                        session_timeout=3.0)
            self.workers.append(w)
        for _ in range(2):
            w = pgstreams.Worker(pgstreams.connect(dsn, retry_timeout=60))
            w.subscribe("t", "deliveries", self._deliver, heartbeat_interval=0.5, session_timeout=3.0)
            self.workers.append(w)
        self.threads = [threading.Thread(target=self._guard(f, until), daemon=True) for f, until in
                        ((self._single, self.stop), (self._batch, self.stop), (self._consume, self.drained))]

    @staticmethod
    def _handle(event: pgstreams.Event, conn: psycopg.Connection) -> None:
        conn.execute("INSERT INTO handled VALUES (%s)", (event.value,))

    def _deliver(self, event: pgstreams.Event) -> None:
        with self._lock:
            self.delivered[event.value] += 1
        self.last_ok["at_least_once"] = time.monotonic()

    def _values(self, n: int) -> list[int]:
        with self._lock:
            return [next(self._next) for _ in range(n)]

    def _guard(self, fn: Callable[[], None], until: threading.Event) -> Callable[[], None]:
        def run() -> None:
            while not until.is_set():
                try:
                    fn()
                except Exception as exc:  # noqa: BLE001 - counted
                    self.errors.append(f"{type(exc).__name__}: {exc}")
                    time.sleep(0.1)
        return run

    def _single(self) -> None:
        (v,) = self._values(1)
        self.clients[0].publish("t", v, key=str(v % 100))
        self.acked.append(v)
        self.last_ok["publish"] = time.monotonic()

    def _batch(self) -> None:
        vs = self._values(10)
        self.clients[1].publish_many("t", [{"value": v} for v in vs])
        self.acked.extend(vs)

    _consumer: pgstreams.Consumer | None = None

    def _consume(self) -> None:
        if self._consumer is None:
            self._consumer = self.clients[2].consumer("t", "readers")
        got = self._consumer.poll(max_events=200, timeout=0.2)
        if got:
            self.consumed.update(e.value for e in got)
            self._consumer.commit(got)
            self.last_ok["consume"] = time.monotonic()

    def start(self) -> None:
        for w in self.workers:
            w.start()
        for t in self.threads:
            t.start()

    def handled(self) -> Counter[int]:
        with psycopg.connect(self.dsn) as conn:
            return Counter(r[0] for r in conn.execute("SELECT value FROM handled"))

    def finish(self, counts: Counts, drain: float = 180.0) -> Counts:
        """Stop producing, let the consumers drain, stop everything and count."""
        self.stop.set()
        for t in self.threads[:2]:
            t.join(60)
        target = set(self.acked)
        deadline = time.monotonic() + drain
        while time.monotonic() < deadline:
            with self._lock:
                delivered = set(self.delivered)
            if target <= set(self.consumed) and target <= delivered and target <= set(self.handled()):
                break
            time.sleep(0.2)
        self.drained.set()
        self.threads[2].join(10)
        for w in self.workers:
            w.stop(10)
        counts.failed_services = sum(w.failure is not None for w in self.workers)
        with pgstreams.connect(self.dsn) as c:
            reader = c.consumer("t", f"count-{uuid.uuid4().hex[:6]}")
            stored: Counter[int] = Counter()
            while got := reader.poll(max_events=5000, timeout=0.2):
                stored.update(e.value for e in got)
                reader.commit(got)
        handled = self.handled()
        counts.published = len(target)
        counts.stored = len(stored)
        counts.duplicated = sum(n - 1 for n in stored.values() if n > 1)
        counts.lost = len(target - set(stored))
        counts.consumed = len(set(self.consumed) & target)
        counts.handled = len(set(handled) & target)
        counts.handled_twice = sum(n - 1 for n in handled.values() if n > 1)
        counts.handled_at_least_once = len(set(self.delivered) & target)
        counts.redelivered = sum(n - 1 for n in self.delivered.values() if n > 1)
        counts.lost_by_at_least_once = len(target - set(self.delivered))
        counts.raised = len(self.errors)
        if self.errors:
            counts.extra["errors"] = self.errors[:5]
        for c in self.clients:
            c.close()
        for w in self.workers:
            w.client.close()  # type: ignore[attr-defined]  # a Client (the worker's port types it narrower)
        return counts


def _database(server: TemporaryServer) -> str:
    name = f"faults_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(server.dsn, autocommit=True) as conn:
        conn.execute(psycopg.sql.SQL("CREATE DATABASE {}").format(psycopg.sql.Identifier(name)))
    return make_conninfo(server.dsn, dbname=name)


def _recovery(w: Workload, back: float, timeout: float = 60.0) -> float:
    """Seconds from ``back`` until an event was published, consumed and handled after it."""
    base = len(w.handled())
    deadline = back + timeout
    while time.monotonic() < deadline:
        if (w.last_ok["publish"] > back and w.last_ok["consume"] > back and w.last_ok["at_least_once"] > back
                and len(w.handled()) > base):
            return time.monotonic() - back
        time.sleep(0.05)
    return float("inf")


def restart(server: TemporaryServer, duration: float) -> Counts:
    """Fast, then immediate restarts during the workload."""
    w = Workload(_database(server))
    counts = Counts("restart", duration)
    w.start()
    for mode in ("fast", "immediate"):
        time.sleep(duration / 3)
        server.restart(mode, down=1.0)
        counts.recovery_s.append(round(_recovery(w, time.monotonic()), 3))
    return w.finish(counts)


def kill(server: TemporaryServer, duration: float) -> Counts:
    """``pg_terminate_backend`` of a random session of the database every 200 ms."""
    w = Workload(_database(server))
    counts = Counts("kill", duration)
    dbname = conninfo_to_dict(w.dsn)["dbname"]
    w.start()
    killed = 0
    with psycopg.connect(server.dsn, autocommit=True) as admin:
        deadline = time.monotonic() + duration
        while time.monotonic() < deadline:
            row = admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s "
                                "AND pid <> pg_backend_pid() ORDER BY random() LIMIT 1", (dbname,)).fetchone()
            killed += bool(row and row[0])
            time.sleep(0.2)
    counts.extra["sessions_killed"] = killed
    counts.recovery_s.append(round(_recovery(w, time.monotonic()), 3))
    return w.finish(counts)


def main(argv: list[str] | None = None) -> list[Counts]:
    ap = argparse.ArgumentParser(prog="python -m bench.faults", description=__doc__.split("\n\n")[0])
    ap.add_argument("--duration", type=float, default=DURATION,
                    help=f"seconds of each restart / kill scenario (default {DURATION:g})")
    ap.add_argument("--quick", action="store_true", help=f"{QUICK_DURATION:g} s for everything")
    ap.add_argument("--only", default=",".join(SCENARIOS), help="scenarios to run (comma separated)")
    ap.add_argument("--json", action="store_true", help="print the counts as JSON")
    args = ap.parse_args(argv)
    only = [s.strip() for s in args.only.split(",") if s.strip()]
    bad = set(only) - set(SCENARIOS)
    if bad:
        ap.error(f"unknown scenario(s) {sorted(bad)}; choose from {', '.join(SCENARIOS)}")
    duration = QUICK_DURATION if args.quick else args.duration
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    out = []
    with restartable_server({"fsync": "off"}) as server:
        for name in only:
            fn = {"restart": restart, "kill": kill}[name]
            counts = fn(server, duration)
            out.append(counts)
            print(json.dumps(asdict(counts)) if args.json else _line(counts), flush=True)
    print(f"load average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    return out


def _line(c: Counts) -> str:
    return (f"{c.scenario}: {c.seconds:g} s, published {c.published}, stored {c.stored}, duplicated "
            f"{c.duplicated}, lost {c.lost}, consumed {c.consumed}, handled {c.handled} (twice: "
            f"{c.handled_twice}), handled at least once {c.handled_at_least_once} (redelivered "
            f"{c.redelivered}, lost {c.lost_by_at_least_once}), calls raised {c.raised}, failed services "
            f"{c.failed_services}"
            + (f", recovery {c.recovery_s} s" if c.recovery_s else "")
            + (f", {json.dumps(c.extra)}" if c.extra else ""))


if __name__ == "__main__":
    main()
