"""The read-fence benchmark: does an unrelated open transaction slow readers down?

    python -m bench.fence [--dsn DSN] [--hold 60] [--rate 300] [--readers consumer,worker,spark]
                          [--backlog 200000] [--rounds 3] [--quick] [--markdown]

A transaction that published nothing (here an application's ``UPDATE accounts ...`` left open, as a batch
job would) must hold back no reader: readers wait only for open transactions that published to the
partitions they read (the per-partition read fence, docs/design.md). Two measurements:

* **latency**: one paced producer process publishes ``--rate`` events/s (100-byte values carrying the
  wall-clock time and a sequence number, short keys, a topic of 4 partitions) for the whole run; three
  kinds of readers read the topic at once, each as its own group, each in processes of its own: a
  ``Consumer`` (``poll(1000, timeout=0.25)`` woken by notifications, ``commit()`` after each poll), a
  worker group (``--workers`` processes running :class:`pgstreams.Worker`, a single-event handler,
  at-least-once) and a Spark structured stream (``spark.readStream.format("pgstreams")`` with option
  ``group``, ``foreachBatch`` collecting each micro-batch, ``processingTime`` trigger ``--trigger``,
  ``local[*]``). A reader's latency of an event is the time it had the event in hand (the poll returned,
  the handler was called, the micro-batch's rows were collected) minus the event's stamp. Once every
  reader receives events (and ``SETTLE`` s more), the run goes through four phases of ``--hold`` seconds:
  (1) no other transaction; (2) an ``UPDATE`` of a row of the table ``accounts`` of the same database held
  open (it has a transaction id, so it also holds the database's snapshot horizon back); (3) the same in
  another database of the server (``--no-other-db`` skips it); (4) no other transaction again. Each
  event belongs to the phase in which it was stamped. Per reader and phase: p50, p99 and max. Per reader:
  p50 / p99 of the phases without (1 and 4 together; their two p99s side by side show the noise between
  two phases that differ in nothing), with the transaction open, the difference of the p99s, and the bar:
  ``p99 open <= p99 without + 50 ms``, and every event published received exactly once (by distinct
  sequence numbers, over the whole run).
* **poll throughput**: a backlog of ``--backlog`` events (published with ``publish_many``, VACUUM
  ANALYZEd) drained by a new group each time with ``poll_batch(1000)`` + ``commit()``, as ``bench.peers``
  does in workload C: with no other transaction, with the ``UPDATE`` open in the same database, and in
  another database; beside a binary COPY-out of the same rows from a plain table in read order into
  Python tuples (the raw PostgreSQL limit of the run). ``--rounds`` rounds, the order rotating; best and
  median. The bar: with the transaction open, the best round at least 0.9 x the best without it (single
  drains of this machine vary by more than that; every round is printed).

The 1-minute load average of the machine is recorded at the start of every measurement. The benchmark
creates its own databases on the server (``--dsn``, else ``$PGSTREAMS_DSN``, else the embedded server; this
machine only) and drops them at the end, on Ctrl-C and SIGTERM too. Every wait has a deadline.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass

import psycopg
from rich.console import Console

import pgstreams

from ._common import (
    BATCH,
    Job,
    RawTarget,
    checkpoint,
    create_raw_table,
    interrupt_on_sigterm,
    machine,
    make_console,
    raw_copy_in,
    raw_copy_out,
    run_jobs,
    scratch_database,
    server_dsn,
)
from ._fence.processes import HEARTBEAT, TRIGGER, ProducerArgs, ReaderArgs, fleet
from ._fence.report import (
    BAR_MS,
    NONE,
    OTHER,
    RAW,
    SAME,
    THROUGHPUT_FLOOR,
    Hold,
    Phase,
    ReaderResult,
    Series,
    analyse,
    latency_table,
    markdown_table,
    print_table,
    throughput_ok,
    throughput_table,
    verdict_table,
)
from .core import TopicTarget, consume_op, publish_many_op
from .workers import shares

HOLD = 60.0  #: seconds of each latency phase
RATE = 300.0  #: events per second of the producer
PARTITIONS = 4
WORKERS = 2  #: processes of the worker group
BACKLOG = 200_000  #: events of the poll-throughput backlog
ROUNDS = 3
SETTLE = 30.0  #: seconds between every reader receiving events and the first phase (warm-up: Spark's JIT)
GAP = 2.0  #: seconds between phases (events stamped then belong to no phase)
START_TIMEOUT = 240.0  #: seconds for the readers to start (a SparkSession on a loaded machine is slow)
DRAIN_TIMEOUT = 90.0  #: seconds for the readers to receive the last events after the producer stops
DRAIN_LIMIT = 300.0  #: seconds one drain of the backlog may take
READERS = ("consumer", "worker", "spark")
QUICK = {"hold": 5.0, "backlog": 20_000, "rounds": 1, "settle": 1.0, "gap": 0.5}
TOPIC = "live"
BACKLOG_TOPIC = "backlog"
RAW_BACKLOG = "raw_backlog"
WORKER_GROUP = "fence-worker"

PHASES = {NONE: "no other transaction", SAME: "UPDATE of accounts open, same database",
          OTHER: "UPDATE of accounts open, other database"}
NAMES = {"consumer": "Consumer", "worker": "worker group", "spark": "Spark stream"}
HOW = {"consumer": "client.consumer(topic, group).poll(1000, timeout=0.25), woken by NOTIFY; commit() after "
                   "each poll",
       "worker": "{workers} processes of pgstreams.Worker in one group (heartbeat {hb:g} s), a single-event "
                 "handler, at-least-once",
       "spark": "spark.readStream.format(\"pgstreams\") with option group, foreachBatch collecting each "
                "micro-batch, trigger(processingTime=\"{trigger}\"), local[*]"}


@dataclass(frozen=True)
class Plan:
    """What to run, and how long."""

    hold: float = HOLD
    rate: float = RATE
    partitions: int = PARTITIONS
    readers: Sequence[str] = READERS
    workers: int = WORKERS
    trigger: str = TRIGGER
    backlog: int = BACKLOG
    rounds: int = ROUNDS
    other_db: bool = True
    settle: float = SETTLE
    gap: float = GAP
    latency: bool = True
    throughput: bool = True


# --------------------------------------------------------------------------------------------------------
# the unrelated transaction

_ACCOUNTS = ("CREATE TABLE accounts (id int PRIMARY KEY, balance bigint NOT NULL)",
             "INSERT INTO accounts SELECT i, 1000 FROM generate_series(1, 100) AS i")


def create_accounts(dsn: str) -> None:
    """The application table ``accounts`` (100 rows) that the unrelated transaction updates."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        for stmt in _ACCOUNTS:
            conn.execute(stmt)


@contextmanager
def unrelated_transaction(dsn: str, label: str) -> Iterator[Hold]:
    """A transaction on ``dsn`` that updates a row of ``accounts`` and stays open (idle, holding a
    transaction id) until the block ends; then it is rolled back. Raises if it did not stay open."""
    with psycopg.connect(dsn) as conn:
        conn.execute("UPDATE accounts SET balance = balance + 1 WHERE id = %s", (1,))
        row = conn.execute("SELECT pg_current_xact_id()::text").fetchone()
        assert row is not None
        hold = Hold(label, int(row[0]), time.time())
        yield hold
        try:
            still = conn.execute("SELECT pg_current_xact_id_if_assigned()::text").fetchone()
        except psycopg.Error as exc:
            raise RuntimeError(f"the unrelated transaction ({label}) ended before its time: {exc}") from exc
        if still is None or still[0] is None or int(still[0]) != hold.xid:
            raise RuntimeError(f"the unrelated transaction ({label}) did not stay open")
        hold.closed = time.time()
        conn.rollback()


def load() -> float:
    """The 1-minute load average of the machine."""
    return os.getloadavg()[0]


# --------------------------------------------------------------------------------------------------------
# latency


def _schedule(db: str, other_db: str | None) -> list[tuple[str, str, str | None]]:
    """The phases: (name, kind, database of the open transaction or None)."""
    out: list[tuple[str, str, str | None]] = [(f"{PHASES[NONE]} (1)", NONE, None), (PHASES[SAME], SAME, db)]
    if other_db is not None:
        out.append((PHASES[OTHER], OTHER, other_db))
    out.append((f"{PHASES[NONE]} ({len(out) + 1})", NONE, None))
    return out


def measure_latency(db: str, other_db: str | None, plan: Plan, console: Console) -> tuple[
        list[ReaderResult], list[Phase]]:
    """Run the producer and the readers through the phases; return each kind of reader's figures."""
    with fleet() as f:
        members: list[str] = []
        for kind in plan.readers:
            if kind == "worker":
                for i in range(plan.workers):
                    members.append(f"worker-{i + 1}")
                    f.start_reader(ReaderArgs(kind, members[-1], db, TOPIC, WORKER_GROUP))
            else:
                f.start_reader(ReaderArgs(kind, kind, db, TOPIC, f"fence-{kind}", trigger=plan.trigger))
        t0 = time.monotonic()
        f.wait("the readers to start", lambda: all(c.started.is_set() for c in f.readers), START_TIMEOUT)
        if members:
            with pgstreams.connect(db, migrate=False, pool_size=1) as client:
                def shared() -> bool:
                    got = shares(client, WORKER_GROUP)
                    return set(got) == set(members) and sum(got.values()) == plan.partitions

                f.wait("the worker group to share the partitions", shared, 60, every=0.2)
        console.log(f"readers started in {time.monotonic() - t0:.1f} s: "
                    f"{', '.join(c.name for c in f.readers)}")
        f.start_producer(ProducerArgs(db, TOPIC, plan.rate))
        t0 = time.monotonic()
        f.wait("every reader to receive events", lambda: all(c.flowing.is_set() for c in f.readers),
               START_TIMEOUT)
        console.log(f"every reader received events {time.monotonic() - t0:.1f} s after the producer started")
        f.sleep(plan.settle)
        phases: list[Phase] = []
        for i, (name, kind, target) in enumerate(_schedule(db, other_db)):
            if i:
                f.sleep(plan.gap)
            with ExitStack() as stack:
                at = load()
                hold = stack.enter_context(unrelated_transaction(target, name)) if target else None
                start = time.time()
                f.sleep(plan.hold)
                end = time.time()
            phases.append(Phase(name, kind, start, end, at, hold))
            held = f" (transaction {hold.xid} open {hold.closed - hold.opened:.1f} s)" if hold else ""
            console.log(f"phase {i + 1}: {name}{held}; load {at:.2f}")
        stamps = f.finish_producer()
        published = len(stamps)

        def received(kind: str) -> int:
            return sum(c.counter.value for c in f.readers if c.kind == kind)

        try:
            f.wait("every reader to receive every event",
                   lambda: all(received(k) >= published for k in plan.readers), DRAIN_TIMEOUT)
        except RuntimeError as exc:  # reported in the tables as events missing
            console.log(f"{exc}: " + ", ".join(f"{k} {received(k):,} of {published:,}" for k in plan.readers))
        records = f.finish_readers()
    out = []
    for kind in plan.readers:
        mine = [r for c in f.readers if c.kind == kind for r in records[c.name]]
        name = NAMES[kind] + (f" ({plan.workers} processes)" if kind == "worker" else "")
        how = HOW[kind].format(workers=plan.workers, hb=HEARTBEAT, trigger=plan.trigger)
        out.append(analyse(name, how, mine, stamps, phases))
    return out, phases


# --------------------------------------------------------------------------------------------------------
# poll throughput


def fill_backlog(db: str, plan: Plan, console: Console) -> None:
    """The backlog topic and the raw table, ``plan.backlog`` events each; VACUUM ANALYZE."""
    t0 = time.monotonic()
    with publish_many_op(TopicTarget(db, BACKLOG_TOPIC)) as ours, \
            raw_copy_in(RawTarget(db, RAW_BACKLOG, plan.partitions)) as raw:
        done = 0
        while done < plan.backlog:
            done += ours()
            raw()
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE")
    console.log(f"backlogs of {plan.backlog:,} events written in {time.monotonic() - t0:.1f} s")


def measure_throughput(db: str, other_db: str | None, plan: Plan, console: Console) -> list[Series]:
    """Drain the backlog with a new group each time, with and without the unrelated transaction, beside
    the raw COPY-out; ``plan.rounds`` rounds, the order rotating."""
    fill_backlog(db, plan, console)
    n = plan.backlog
    drain = f"poll_batch({BATCH:,}) + commit() until drained"
    series = [Series(RAW, "raw PostgreSQL: binary COPY-out of the same rows in read order into Python"),
              Series(NONE, f"pgstreams, {drain}; {PHASES[NONE]}"),
              Series(SAME, f"pgstreams, {drain}; {PHASES[SAME]}")]
    targets: dict[str, str | None] = {RAW: None, NONE: None, SAME: db}
    if other_db is not None:
        series.append(Series(OTHER, f"pgstreams, {drain}; {PHASES[OTHER]}"))
        targets[OTHER] = other_db
    for r in range(plan.rounds):
        k = r % len(series)
        for s in series[k:] + series[:k]:
            checkpoint(db)
            with ExitStack() as stack:
                s.loads.append(load())
                target = targets[s.name]
                if target is not None:
                    stack.enter_context(unrelated_transaction(target, s.name))
                if s.name == RAW:
                    job = Job(raw_copy_out, RawTarget(db, RAW_BACKLOG, plan.partitions), DRAIN_LIMIT)
                else:
                    group = f"drain-{s.name}-{r}"
                    job = Job(consume_op, TopicTarget(db, BACKLOG_TOPIC, group=group, expected=n, fast=True),
                              DRAIN_LIMIT)
                (res,) = run_jobs([job])
            s.rates.append(res.rate)
            if res.count < n:
                s.short.append(f"round {r + 1}: {res.count:,} of {n:,} in {res.seconds:.0f} s")
            console.log(f"throughput round {r + 1}: {s.name}: {res.rate:,.0f} events/s "
                        f"({res.count:,} in {res.seconds:.2f} s; load {s.loads[-1]:.2f})")
    return series


# --------------------------------------------------------------------------------------------------------
# main


def prepare(db: str, other_db: str | None, plan: Plan) -> None:
    """Topics of the run, the raw table, and the ``accounts`` table of each database."""
    with pgstreams.connect(db) as client:
        client.create_topic(TOPIC, partitions=plan.partitions)
        client.create_topic(BACKLOG_TOPIC, partitions=plan.partitions)
    create_raw_table(db, RAW_BACKLOG)
    create_accounts(db)
    if other_db is not None:
        create_accounts(other_db)


def run(server: str, plan: Plan, console: Console) -> tuple[list[ReaderResult], list[Phase], list[Series]]:
    """Create the databases, run the measurements, drop the databases."""
    results: list[ReaderResult] = []
    phases: list[Phase] = []
    series: list[Series] = []
    with ExitStack() as stack:
        db = stack.enter_context(scratch_database(server, "pgstreams_bench_fence"))
        other = (stack.enter_context(scratch_database(server, "pgstreams_bench_fence_other"))
                 if plan.other_db else None)
        prepare(db, other, plan)
        if plan.throughput:
            series = measure_throughput(db, other, plan, console)
        if plan.latency:
            results, phases = measure_latency(db, other, plan, console)
    return results, phases, series


def report(plan: Plan, results: list[ReaderResult], phases: list[Phase], series: list[Series],
           console: Console) -> tuple[list[bool], list[str]]:
    """Print the tables; return the verdicts and the Markdown lines."""
    oks: list[bool] = []
    md: list[str] = []

    def table(title: str, head: list[str], rows: list[list[str]], notes: Sequence[str] = ()) -> None:
        print_table(title, head, rows, console)
        for note in notes:
            console.print(note, markup=False, highlight=False)
        md.extend([f"**{title}**", "", markdown_table(head, rows), "", *notes, *([""] if notes else [])])

    if results:
        hows = [f"* {r.name}: {r.how}" for r in results]
        table(f"publish-to-receive latency at {plan.rate:,.0f} events/s, phases of {plan.hold:g} s, topic of "
              f"{plan.partitions} partitions", *latency_table(results, phases), hows)
        table(f"the bar: p99 with the transaction open <= p99 without + {BAR_MS:g} ms, and every event "
              f"received once", *verdict_table(results, phases))
        oks += [ok is True for r in results for k in (SAME, OTHER) if (ok := r.verdict(k)) is not None]
    if series:
        notes = [f"* {s.name}: * stopped before the whole backlog: {'; '.join(s.short)}" for s in series
                 if s.short]
        notes.append(f"* PASS: the best round with the transaction open >= {THROUGHPUT_FLOOR:g} x the best "
                     "without it")
        table(f"poll throughput: a backlog of {plan.backlog:,} events, batches of {BATCH:,}, "
              f"{plan.rounds} round(s), a new group each", *throughput_table(series), notes)
        oks += list(throughput_ok(series).values())
    return oks, md


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m bench.fence``."""
    ap = argparse.ArgumentParser(prog="python -m bench.fence", description=__doc__.split("\n\n")[0])
    ap.add_argument("--dsn", help="server to use (default $PGSTREAMS_DSN, else the embedded server); "
                    "two databases are created on it and dropped afterwards")
    ap.add_argument("--hold", type=float, default=None,
                    help=f"seconds of each latency phase, i.e. how long the unrelated transaction stays "
                         f"open (default {HOLD:g}; {QUICK['hold']:g} with --quick)")
    ap.add_argument("--rate", type=float, default=RATE,
                    help=f"events per second published (default {RATE:g})")
    ap.add_argument("--partitions", type=int, default=PARTITIONS,
                    help=f"partitions of the topics (default {PARTITIONS})")
    ap.add_argument("--readers", default=",".join(READERS),
                    help=f"comma-separated subset of {','.join(READERS)} (default all)")
    ap.add_argument("--workers", type=int, default=WORKERS,
                    help=f"processes of the worker group (default {WORKERS})")
    ap.add_argument("--trigger", default=TRIGGER,
                    help=f"processingTime trigger of the Spark stream (default {TRIGGER!r})")
    ap.add_argument("--backlog", type=int, default=None,
                    help=f"events of the poll-throughput backlog (default {BACKLOG:,}; "
                         f"{QUICK['backlog']:,} with --quick)")
    ap.add_argument("--rounds", type=int, default=None,
                    help=f"rounds of the poll-throughput measurements (default {ROUNDS}; "
                         f"{QUICK['rounds']} with --quick)")
    ap.add_argument("--no-other-db", action="store_true",
                    help="skip the measurements with the transaction open in another database")
    ap.add_argument("--only", choices=("latency", "throughput"), help="run one of the two measurements")
    ap.add_argument("--quick", action="store_true",
                    help=f"short run: {QUICK['hold']:g} s phases (unless --hold), a "
                         f"{QUICK['backlog']:,}-event backlog, {QUICK['rounds']} round, "
                         f"{QUICK['settle']:g} s of warm-up")
    ap.add_argument("--markdown", action="store_true", help="also print the tables in Markdown")
    args = ap.parse_args(argv)
    quick: dict[str, float] = QUICK if args.quick else {}
    readers = [r.strip() for r in args.readers.split(",") if r.strip()]
    if not readers or set(readers) - set(READERS) or len(set(readers)) != len(readers):
        ap.error(f"--readers takes distinct names among {', '.join(READERS)}")
    plan = Plan(hold=args.hold if args.hold is not None else quick.get("hold", HOLD), rate=args.rate,
                partitions=args.partitions, readers=readers, workers=args.workers, trigger=args.trigger,
                backlog=args.backlog if args.backlog is not None else int(quick.get("backlog", BACKLOG)),
                rounds=args.rounds if args.rounds is not None else int(quick.get("rounds", ROUNDS)),
                other_db=not args.no_other_db, settle=quick.get("settle", SETTLE), gap=quick.get("gap", GAP),
                latency=args.only in (None, "latency"), throughput=args.only in (None, "throughput"))
    if not 0 < plan.hold <= 3600 or not 0 < plan.rate <= 5000 or plan.partitions < 1 or plan.workers < 1:
        ap.error("need 0 < --hold <= 3600, 0 < --rate <= 5000, --partitions >= 1, --workers >= 1")
    if plan.backlog < BATCH or plan.rounds < 1:
        ap.error(f"need --backlog >= {BATCH} and --rounds >= 1")
    console = make_console()
    started = time.monotonic()
    target = server_dsn(args.dsn)
    info = machine(target)
    with interrupt_on_sigterm():
        try:
            results, phases, series = run(target, plan, console)
        except RuntimeError as exc:  # a reader or the producer failed, or a wait timed out
            console.print(f"bench.fence failed: {exc}", markup=False, highlight=False)
            print(f"bench.fence failed: {exc}", file=sys.stderr)
            return 2
    oks, md = report(plan, results, phases, series, console)
    console.print(f"{info['cpu']}, {info['cores']} cores, {info['ram']} RAM; "
                  f"PostgreSQL {info['postgresql']}; "
                  f"Python {info['python']}, psycopg {info['psycopg']}; load before the run {info['load']}, "
                  f"after {' '.join(f'{x:.2f}' for x in os.getloadavg())}; "
                  f"took {time.monotonic() - started:.0f} s")
    console.print(f"settings: {info['settings']}")
    if args.markdown:
        console.print("\n".join(md), markup=False, highlight=False, soft_wrap=True)
    return 0 if all(oks) else 1


if __name__ == "__main__":
    raise SystemExit(main())
