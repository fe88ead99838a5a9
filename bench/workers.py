"""The workers benchmark: failover time, time to a fair share, and throughput of 4 workers versus one.

    python -m bench.workers [--dsn DSN] [--heartbeat 0.2] [--session 1.5] [--events 6000] [--repeat 3]

Every worker is a real process (``python -m bench.workers child``) running :class:`pgstreams.Worker` on a
12-partition topic with a handler that does 1 ms of I/O-bound work per event (``time.sleep(0.001)``), in
at-least-once mode, ``max_events=20``. Measurements:

* **failover**: 4 workers while a producer publishes ~500 events/s; one is killed (SIGKILL) at a random
  moment; time from the kill to the first commit of one of its partitions by another member (the first
  event consumed by the new owner is handled just before), and to the last of its partitions being
  consumed again. Acceptance: <= session timeout + 2 heartbeat intervals.
* **fair share**: 3 balanced workers (4 partitions each); a 4th starts; time from its registration to
  its owning its fair share (3 leases), from the database's clock. Acceptance: <= 2 heartbeat intervals.
* **throughput**: a backlog of ``--events`` events drained by 1 worker, then by 4; beside it the raw
  PostgreSQL figure of the same work done by hand-written psycopg loops (same handler, same partitions,
  a keyset SELECT of 20 rows and an offset UPSERT per batch) with 1 and 4 processes. Acceptance: 4 workers
  >= 1.5 x one worker.

It creates its own database on the server (``--dsn``, else ``$PGSTREAMS_DSN``, else the embedded server;
this machine only) and drops it at the end.
"""

from __future__ import annotations

import argparse
import functools
import os
import random
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import psycopg
from psycopg import sql
from rich.console import Console

import pgstreams

from ._common import (
    DONE,
    Job,
    Measurement,
    RawTarget,
    create_raw_table,
    machine,
    make_console,
    markdown,
    print_results,
    raw_copy_in,
    run_jobs,
    scratch_database,
    server_dsn,
)

PARTITIONS = 12
WORK = 0.001  # seconds of I/O-bound work per event
MAX_EVENTS = 20
ROOT = Path(__file__).resolve().parent.parent


# -- the worker process ------------------------------------------------------------------------------------
def child(argv: list[str]) -> int:
    """``python -m bench.workers child``: one worker process (the 1 ms handler) until SIGTERM."""
    ap = argparse.ArgumentParser(prog="python -m bench.workers child")
    ap.add_argument("--dsn", required=True)
    ap.add_argument("--topic", required=True)
    ap.add_argument("--group", required=True)
    ap.add_argument("--member", required=True)
    ap.add_argument("--heartbeat", type=float, required=True)
    ap.add_argument("--session", type=float, required=True)
    args = ap.parse_args(argv)

    def handle(event: pgstreams.Event) -> None:
        time.sleep(WORK)

    with pgstreams.connect(args.dsn, pool_size=3, migrate=False) as client:
        worker = pgstreams.Worker(client, member_id=args.member)
        worker.subscribe(args.topic, args.group, handle, max_events=MAX_EVENTS,
                         heartbeat_interval=args.heartbeat, session_timeout=args.session)
        worker.run()
    return 0


class Fleet:
    """Worker processes of one group."""

    def __init__(self, db: str, topic: str, group: str, heartbeat: float, session: float) -> None:
        self.db, self.topic, self.group, self.hb, self.session = db, topic, group, heartbeat, session
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self._n = 0

    def start(self) -> str:
        self._n += 1
        name = f"{self.group}-w{self._n}"
        self.procs[name] = subprocess.Popen(
            [sys.executable, "-m", "bench.workers", "child", "--dsn", self.db, "--topic", self.topic,
             "--group", self.group, "--member", name, "--heartbeat", str(self.hb), "--session",
             str(self.session)], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return name

    def kill(self, name: str) -> None:
        proc = self.procs.pop(name)
        proc.kill()
        proc.wait(10)

    def stop(self, name: str) -> None:
        proc = self.procs.pop(name)
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)

    def close(self) -> None:
        for name in list(self.procs):
            self.stop(name)


@contextmanager
def fleet(db: str, topic: str, group: str, heartbeat: float, session: float) -> Iterator[Fleet]:
    f = Fleet(db, topic, group, heartbeat, session)
    try:
        yield f
    finally:
        f.close()


def until(cond: Callable[[], bool], timeout: float, what: str, every: float = 0.01) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(every)


def shares(client: pgstreams.Client, group: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for s in pgstreams.group_status(client, group):
        if s.owner is not None and s.pending_owner is None:
            out[s.owner] = out.get(s.owner, 0) + 1
    return out


def balanced(client: pgstreams.Client, group: str, members: set[str]) -> bool:
    got = shares(client, group)
    if set(got) != members or sum(got.values()) != PARTITIONS:
        return False
    return max(got.values()) - min(got.values()) <= 1


def db_now(client: pgstreams.Client) -> datetime:
    with client.connection() as conn:
        row = conn.execute("SELECT clock_timestamp()").fetchone()
    assert row is not None
    return row[0]


class Producer:
    """Publishes ~``rate`` events/s (batches of 10) to the topic from a thread until stopped."""

    def __init__(self, db: str, topic: str, rate: float = 500.0) -> None:
        self.db, self.topic, self.rate = db, topic, rate
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        rnd = random.Random(1)
        with pgstreams.connect(self.db, pool_size=2, migrate=False) as client:
            while not self.stop.wait(10 / self.rate):
                client.publish_many(self.topic, [{"value": b"x" * 100, "key": f"k{rnd.randrange(10_000)}"}
                                                 for _ in range(10)])

    def __enter__(self) -> Producer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(10)


# -- measurements -----------------------------------------------------------------------------------------
_CHECKPOINTS = ("SELECT partition, position, updated_at FROM pgstreams.checkpoints"
                " WHERE group_name = 'fo' AND topic_id = %s AND partition = ANY(%s)")


def _advanced(watch: psycopg.Connection, tid: int, owned: list[int], before: dict[int, int],
              moved: dict[int, datetime]) -> bool:
    """Note the first commit time of each partition whose checkpoint moved; True once all did."""
    for p, pos, at in watch.execute(_CHECKPOINTS, (tid, owned)).fetchall():
        if p not in moved and pos != before[p]:
            moved[p] = at
    return len(moved) == len(owned)


def measure_failover(client: pgstreams.Client, db: str, hb: float, session: float, repeat: int,
                     console: Console) -> tuple[list[float], list[float]]:
    """Seconds from a SIGKILL to the first / the last of the dead member's partitions consumed again."""
    firsts: list[float] = []
    lasts: list[float] = []
    tid = client.topic_record("fo").id
    rnd = random.Random()
    with fleet(db, "fo", "fo", hb, session) as f, Producer(db, "fo"):
        for _ in range(4):
            f.start()
        for r in range(repeat):
            until(lambda: balanced(client, "fo", set(f.procs)), 60, "4 balanced workers")
            time.sleep(rnd.uniform(0.3, 1.0))  # a random moment
            victim = rnd.choice(sorted(f.procs))
            owned = sorted(s.partition for s in pgstreams.group_status(client, "fo") if s.owner == victim)
            f.kill(victim)
            killed = db_now(client)
            with client.connection() as conn:
                before = {p: pos for p, pos, _at in conn.execute(_CHECKPOINTS, (tid, owned)).fetchall()}
            moved: dict[int, datetime] = {}
            with psycopg.connect(db, autocommit=True) as watch:
                until(functools.partial(_advanced, watch, tid, owned, before, moved), session + 30,
                      "the dead member's partitions to be consumed again", every=0.005)
            first = (min(moved.values()) - killed).total_seconds()
            last = (max(moved.values()) - killed).total_seconds()
            firsts.append(first)
            lasts.append(last)
            console.log(f"failover {r + 1}: killed {victim} (partitions {owned}); first consumed again after "
                        f"{first:.3f} s, all {len(owned)} after {last:.3f} s")
            f.start()
    return firsts, lasts


def measure_fair_share(client: pgstreams.Client, db: str, hb: float, session: float, repeat: int,
                       console: Console) -> list[float]:
    """Seconds from a new member's registration to its owning ceil(12 / 4) = 3 leases (database clock)."""
    out: list[float] = []
    tid = client.topic_record("fs").id
    with fleet(db, "fs", "fs", hb, session) as f, Producer(db, "fs"):
        for _ in range(3):
            f.start()
        for r in range(repeat):
            until(lambda: balanced(client, "fs", set(f.procs)), 60, "3 balanced workers")
            time.sleep(0.5)
            spawned = time.monotonic()
            name = f.start()
            until(functools.partial(lambda n: shares(client, "fs").get(n, 0) >= 3, name), 60,
                  "the new member's fair share")
            seen = time.monotonic()
            with client.connection() as conn:
                row = conn.execute(
                    "SELECT m.registered_at, (SELECT max(l.acquired_at) FROM pgstreams.leases l"
                    "  WHERE l.group_name = 'fs' AND l.topic_id = %s AND l.owner = m.member_id)"
                    " FROM pgstreams.members m WHERE m.group_name = 'fs' AND m.topic_id = %s"
                    " AND m.member_id = %s", (tid, tid, name)).fetchone()
            assert row is not None
            took = (row[1] - row[0]).total_seconds()
            out.append(took)
            console.log(f"fair share {r + 1}: {name} owned 3 of 12 partitions {took:.3f} s after registering "
                        f"({seen - spawned:.2f} s after its process was spawned)")
            f.stop(name)
    return out


def measure_throughput(client: pgstreams.Client, db: str, hb: float, session: float, workers: int,
                       events: int, console: Console) -> float:
    """Events per second of ``workers`` workers draining a backlog of ``events`` events."""
    topic = group = f"tp{workers}"
    client.create_topic(topic, PARTITIONS)
    with fleet(db, topic, group, hb, session) as f:
        for _ in range(workers):
            f.start()
        until(lambda: balanced(client, group, set(f.procs)), 60, f"{workers} balanced workers")
        client.publish_many(topic, [{"value": b"x" * 100, "key": f"k{i}"} for i in range(events)])
        published = db_now(client)
        until(lambda: all(s.lag == 0 for s in pgstreams.group_status(client, group)), 600,
              "the backlog drained", every=0.05)
        with client.connection() as conn:
            row = conn.execute("SELECT max(updated_at) FROM pgstreams.checkpoints WHERE group_name = %s",
                               (group,)).fetchone()
        assert row is not None
        seconds = (row[0] - published).total_seconds()
    rate = events / seconds
    console.log(f"throughput, {workers} worker(s): {events:,} events in {seconds:.2f} s = "
                f"{rate:,.0f} events/s")
    return rate


@dataclass(frozen=True)
class RawDrain:
    """A hand-written consumer process: the partitions ``p % procs == index`` of a raw table."""

    dsn: str
    table: str
    procs: int
    index: int


_RAW_POLL = sql.SQL(
    "SELECT e.partition, e.position FROM unnest(%s::int[], %s::bigint[]) AS c(p, pos)"
    " CROSS JOIN LATERAL (SELECT t.partition, t.position FROM {t} t WHERE t.partition = c.p"
    " AND t.position > c.pos ORDER BY t.position LIMIT %s) e LIMIT %s")
_RAW_OFFSETS = sql.SQL(
    "INSERT INTO {o} (consumer, partition, position) SELECT %s, p, pos FROM unnest(%s::int[], %s::bigint[])"
    " AS c(p, pos) ON CONFLICT (consumer, partition) DO UPDATE SET position = excluded.position")


@contextmanager
def raw_drain(arg: RawDrain) -> Iterator[Callable[[], int]]:
    """Operation: read up to 20 rows of its partitions, sleep 1 ms per row, store the offsets; DONE when
    nothing is left."""
    parts = [p for p in range(PARTITIONS) if p % arg.procs == arg.index]
    offsets = dict.fromkeys(parts, 0)
    poll = _RAW_POLL.format(t=sql.Identifier(arg.table))
    store = _RAW_OFFSETS.format(o=sql.Identifier(arg.table + "_offsets"))
    with psycopg.connect(arg.dsn, autocommit=True) as conn:
        def op() -> int:
            rows = conn.execute(poll, (parts, [offsets[p] for p in parts], MAX_EVENTS, MAX_EVENTS),
                                prepare=True).fetchall()
            if not rows:
                return DONE
            moved: dict[int, int] = {}
            for p, pos in rows:
                time.sleep(WORK)
                moved[p] = pos
            offsets.update(moved)
            ps = sorted(moved)
            conn.execute(store, (f"c{arg.index}", ps, [moved[p] for p in ps]), prepare=True)
            return len(rows)

        yield op


def measure_raw(db: str, procs: int, events: int, console: Console) -> float:
    """Events per second of ``procs`` hand-written consumer processes draining ``events`` raw rows."""
    table = f"raw_work{procs}"
    create_raw_table(db, table)
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE TABLE {} (consumer text, partition int, position bigint,"
                             " PRIMARY KEY (consumer, partition))").format(
                                 sql.Identifier(table + "_offsets")))
    with raw_copy_in(RawTarget(db, table, PARTITIONS, batch=events)) as fill:
        fill()
    results = run_jobs([Job(raw_drain, RawDrain(db, table, procs, i), 600) for i in range(procs)])
    seconds = max(r.seconds for r in results)
    total = sum(r.count for r in results)
    rate = total / seconds
    console.log(f"raw, {procs} process(es): {total:,} rows in {seconds:.2f} s = {rate:,.0f} rows/s")
    return rate


def run(dsn: str | None, hb: float, session: float, events: int, repeat: int,
        console: Console) -> list[Measurement]:
    """Run every measurement and return the result rows."""
    server = server_dsn(dsn)
    rows: list[Measurement] = []
    with scratch_database(server, "pgstreams_bench_workers") as db, pgstreams.connect(db) as client:
        for t in ("fo", "fs"):
            client.create_topic(t, PARTITIONS)
        firsts, lasts = measure_failover(client, db, hb, session, repeat, console)
        shares_ = measure_fair_share(client, db, hb, session, repeat, console)
        one = measure_throughput(client, db, hb, session, 1, events, console)
        four = measure_throughput(client, db, hb, session, 4, events, console)
        raw1 = measure_raw(db, 1, events, console)
        raw4 = measure_raw(db, 4, events, console)
    limit_fo = session + 2 * hb
    limit_fs = 2 * hb
    ms = 1000.0
    rows.append(Measurement(f"failover: kill to first event consumed again (max of {len(firsts)})",
                            max(firsts) * ms, "ms", floor=f"<= {limit_fo * ms:,.0f} ms (session + 2 hb)",
                            ok=max(firsts) <= limit_fo, higher_is_better=False))
    rows.append(Measurement(f"failover: kill to all its partitions consumed (max of {len(lasts)})",
                            max(lasts) * ms, "ms", floor=f"<= {limit_fo * ms:,.0f} ms",
                            ok=max(lasts) <= limit_fo, higher_is_better=False))
    rows.append(Measurement(f"failover: median, first / all ({statistics.median(firsts) * ms:,.0f} ms first)",
                            statistics.median(lasts) * ms, "ms", higher_is_better=False))
    rows.append(Measurement(f"fair share 3 of 12 for a new 4th member (max of {len(shares_)})",
                            max(shares_) * ms, "ms", floor=f"<= {limit_fs * ms:,.0f} ms (2 hb)",
                            ok=max(shares_) <= limit_fs, higher_is_better=False))
    rows.append(Measurement("throughput, 1 worker, 12 partitions, 1 ms per event", one, "events/s", raw1,
                            "psycopg loop, 1 process"))
    rows.append(Measurement("throughput, 4 workers, 12 partitions, 1 ms per event", four, "events/s", raw4,
                            "psycopg loops, 4 processes", f">= 1.5 x 1 worker (got {four / one:.2f} x)",
                            four >= 1.5 * one))
    return rows


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m bench.workers``."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["child"]:
        return child(argv[1:])
    ap = argparse.ArgumentParser(prog="python -m bench.workers", description=__doc__.split("\n\n")[0])
    ap.add_argument("--dsn", help="server to use (default $PGSTREAMS_DSN, else the embedded server); "
                    "a database is created on it and dropped afterwards")
    ap.add_argument("--heartbeat", type=float, default=0.2, help="heartbeat interval, seconds (default 0.2)")
    ap.add_argument("--session", type=float, default=1.5, help="session timeout, seconds (default 1.5)")
    ap.add_argument("--events", type=int, default=6000, help="backlog of the throughput runs (default 6000)")
    ap.add_argument("--repeat", type=int, default=3, help="kills and joins measured (default 3)")
    ap.add_argument("--markdown", action="store_true", help="also print the table in Markdown")
    args = ap.parse_args(argv)
    if args.heartbeat <= 0 or args.session < 2 * args.heartbeat or args.events < 100 or args.repeat < 1:
        ap.error("need heartbeat > 0, session >= 2 x heartbeat, events >= 100, repeat >= 1")
    console = make_console()
    started = time.monotonic()
    target = server_dsn(args.dsn)
    info = machine(target)
    rows = run(target, args.heartbeat, args.session, args.events, args.repeat, console)
    print_results(f"pgstreams workers benchmark (heartbeat {args.heartbeat:g} s, session timeout "
                  f"{args.session:g} s)", rows, console)
    console.print(f"{info['cpu']}, {info['cores']} cores, {info['ram']} RAM; "
                  f"PostgreSQL {info['postgresql']}; Python {info['python']}, psycopg {info['psycopg']}; "
                  f"load before run {info['load']}; "
                  f"took {time.monotonic() - started:.0f} s")
    if args.markdown:
        console.print(markdown(rows), markup=False, highlight=False, soft_wrap=True)
    return 0 if all(m.ok is not False for m in rows) else 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    raise SystemExit(main())
