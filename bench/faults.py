"""The fault benchmark: restarts, killed connections and a held snapshot, with counts.

    python -m bench.faults [--duration 30] [--snapshot 600] [--quick] [--only restart,kill,snapshot]
                           [--json]

Every scenario runs on a PostgreSQL of its own (``pgstreams.embedded.restartable_server``: fsync off,
synchronous commit on, so an immediate shutdown loses nothing committed), never the machine's server. The
workload, in one process: a single-event producer and a batch producer (``publish_many`` of 10) on a topic
of 4 partitions, a stream-group consumer (poll + commit, at-least-once) and a worker group of two members
in transactional mode writing each event to a table of handled events. Each client has
``retry_timeout=60``.

* ``restart``: a fast shutdown at a third of ``--duration`` (default 30 s) and an immediate one at two
  thirds, each down for 1 s. Recovery: from the server accepting connections again to the first event
  published, consumed and handled after it.
* ``kill``: ``pg_terminate_backend`` of a random session of the database every 200 ms for ``--duration``.
* ``snapshot``: the workload for ``--snapshot`` s (default 600) while a REPEATABLE READ transaction holds
  its snapshot (and so the xmin horizon), after the same run without it; the raw PostgreSQL figure of the
  same machine: single-row INSERT + UPDATE of a one-row offset table per event, in the same conditions.
  Reported: throughput ratio (events published / s, held / not held), and the dead tuples of pgstreams'
  frequently updated tables (checkpoints, leases, members) at the end of the held run.

Counts per scenario: events published (acknowledged), stored (distinct), duplicated (stored more than
once), lost (acknowledged but not stored), consumed (distinct) and handled (distinct, duplicated: the
transactional group must handle each exactly once), calls that raised, processes or services that failed.
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
#: Seconds the held-snapshot run lasts (and the run without it).
SNAPSHOT_DURATION = 600.0
#: ``--quick``: seconds per scenario and of each snapshot run.
QUICK_DURATION = 8.0
#: The tables whose dead tuples the held-snapshot scenario reports.
HOT_TABLES = ("checkpoints", "leases", "members")
SCENARIOS = ("restart", "kill", "snapshot")


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
        self.last_ok = {"publish": 0.0, "consume": 0.0}
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
        self.threads = [threading.Thread(target=self._guard(f, until), daemon=True) for f, until in
                        ((self._single, self.stop), (self._batch, self.stop), (self._consume, self.drained))]

    @staticmethod
    def _handle(event: pgstreams.Event, conn: psycopg.Connection) -> None:
        conn.execute("INSERT INTO handled VALUES (%s)", (event.value,))

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
            if target <= set(self.consumed) and target <= set(self.handled()):
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
        counts.raised = len(self.errors)
        if self.errors:
            counts.extra["errors"] = self.errors[:5]
        for c in self.clients:
            c.close()
        for w in self.workers:
            w.client.close()
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
        if w.last_ok["publish"] > back and w.last_ok["consume"] > back and len(w.handled()) > base:
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
    return w.finish(counts)


def _raw_rate(dsn: str, seconds: float) -> float:
    """Raw PostgreSQL: single-row INSERT + UPDATE of a one-row offset per event (autocommit), per second."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS raw_events (id bigserial, v bytea)")
        conn.execute("CREATE TABLE IF NOT EXISTS raw_offset (id int PRIMARY KEY, pos bigint)")
        conn.execute("INSERT INTO raw_offset VALUES (1, 0) ON CONFLICT DO NOTHING")
        n = 0
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            conn.execute("INSERT INTO raw_events (v) VALUES (%s)", (b"x" * 100,))
            conn.execute("UPDATE raw_offset SET pos = pos + 1 WHERE id = 1")
            n += 1
        return n / seconds


def _dead_tuples(dsn: str) -> dict[str, int]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute("SELECT relname, n_dead_tup FROM pg_stat_user_tables "
                            "WHERE schemaname = 'pgstreams' AND relname = ANY(%s)",
                            (list(HOT_TABLES),)).fetchall()
    return {r[0]: int(r[1]) for r in rows}


def snapshot(server: TemporaryServer, duration: float) -> Counts:
    """The workload without, then with, a held REPEATABLE READ snapshot; throughput ratio, dead tuples."""
    counts = Counts("snapshot", duration)
    rates: dict[str, float] = {}
    raws: dict[str, float] = {}
    for held in (False, True):
        dsn = _database(server)
        holder = None
        if held:
            holder = psycopg.connect(dsn)
            holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
            holder.execute("SELECT count(*) FROM pg_class").fetchone()  # takes the snapshot
        w = Workload(dsn)
        w.start()
        time.sleep(duration)
        part = w.finish(Counts("snapshot"))
        rates["held" if held else "free"] = part.published / duration
        raws["held" if held else "free"] = _raw_rate(dsn, min(5.0, duration))
        for k in ("published", "stored", "duplicated", "lost", "consumed", "handled", "handled_twice",
                  "raised", "failed_services"):
            setattr(counts, k, getattr(counts, k) + getattr(part, k))
        if held:
            time.sleep(1.5)  # statistics are flushed at most once a second
            counts.extra["dead_tuples"] = _dead_tuples(dsn)
            assert holder is not None
            holder.rollback()
            holder.close()
    counts.extra["events_per_s"] = {k: round(v, 1) for k, v in rates.items()}
    counts.extra["ratio"] = round(rates["held"] / rates["free"], 3) if rates["free"] else None
    counts.extra["raw_per_s"] = {k: round(v, 1) for k, v in raws.items()}
    counts.extra["raw_ratio"] = round(raws["held"] / raws["free"], 3) if raws["free"] else None
    return counts


def main(argv: list[str] | None = None) -> list[Counts]:
    ap = argparse.ArgumentParser(prog="python -m bench.faults", description=__doc__.split("\n\n")[0])
    ap.add_argument("--duration", type=float, default=DURATION,
                    help=f"seconds of each restart / kill scenario (default {DURATION:g})")
    ap.add_argument("--snapshot", type=float, default=SNAPSHOT_DURATION,
                    help=f"seconds of each held-snapshot run (default {SNAPSHOT_DURATION:g})")
    ap.add_argument("--quick", action="store_true", help=f"{QUICK_DURATION:g} s for everything")
    ap.add_argument("--only", default=",".join(SCENARIOS), help="scenarios to run (comma separated)")
    ap.add_argument("--json", action="store_true", help="print the counts as JSON")
    args = ap.parse_args(argv)
    only = [s.strip() for s in args.only.split(",") if s.strip()]
    bad = set(only) - set(SCENARIOS)
    if bad:
        ap.error(f"unknown scenario(s) {sorted(bad)}; choose from {', '.join(SCENARIOS)}")
    duration = QUICK_DURATION if args.quick else args.duration
    held = QUICK_DURATION if args.quick else args.snapshot
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    out = []
    with restartable_server({"fsync": "off"}) as server:
        for name in only:
            fn = {"restart": restart, "kill": kill, "snapshot": snapshot}[name]
            counts = fn(server, held if name == "snapshot" else duration)
            out.append(counts)
            print(json.dumps(asdict(counts)) if args.json else _line(counts), flush=True)
    print(f"load average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    return out


def _line(c: Counts) -> str:
    return (f"{c.scenario}: {c.seconds:g} s, published {c.published}, stored {c.stored}, duplicated "
            f"{c.duplicated}, lost {c.lost}, consumed {c.consumed}, handled {c.handled} (twice: "
            f"{c.handled_twice}), calls raised {c.raised}, failed services {c.failed_services}"
            + (f", recovery {c.recovery_s} s" if c.recovery_s else "")
            + (f", {json.dumps(c.extra)}" if c.extra else ""))


if __name__ == "__main__":
    main()
