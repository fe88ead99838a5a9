"""The core benchmark: publish (batch and single), consume, and publish-to-poll latency, each beside the raw
PostgreSQL figure measured in the same run.

    python -m bench.core [--dsn DSN] [--duration SECONDS] [--rounds N] [--quick] [--only NAMES] [--markdown]

Events carry 100-byte values and short keys (1,000 distinct, ``k0`` .. ``k999``) on topics of 4
partitions. Every measurement runs in fresh processes (spawned, set up, then started together; only their
timed loops count); throughput pairs alternate raw and pgstreams for ``--rounds`` rounds (default 3) and
keep the best of each, after a CHECKPOINT.

* ``publish_many`` of 1,000-event batches, vs raw COPY of 1,000-row batches (one binary COPY statement on
  an autocommit connection, i.e. one transaction each) into a plain table with the same columns and read
  index as a topic's storage;
* single-event ``publish`` from 1 and from 8 producer processes, vs single-row INSERT transactions
  (prepared, autocommit) from as many processes with the same driver (psycopg);
* consume of one group (``poll(1000)`` then ``commit()``) of everything ``publish_many`` stored, vs a
  binary COPY-out of the raw table's rows in read order into Python tuples;
* publish-to-poll latency at a steady 2,000 events/s: one paced producer process (the events due are sent
  together: ``publish`` for one, ``publish_many`` for more) stamps each value with the time; one consumer
  process records now minus that stamp as it polls; ~10 s. Raw: INSERT + NOTIFY in one transaction,
  LISTEN + keyset SELECT by position. Measured again with the consumer committing after every poll
  (each commit waits for its WAL flush, during which new events wait too).

It creates its own database on the server (``--dsn``, else ``$PGSTREAMS_DSN``, else the embedded server;
this machine only) and drops it at the end.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from rich.console import Console

import pgstreams

from ._common import (
    BATCH,
    DONE,
    Job,
    LatencyArgs,
    LatencySink,
    Measurement,
    Paced,
    RawTarget,
    checkpoint,
    create_raw_table,
    key,
    machine,
    make_console,
    markdown,
    percentile,
    print_results,
    raw_copy_in,
    raw_copy_out,
    raw_insert,
    raw_latency_consumer,
    raw_latency_producer,
    run_jobs,
    run_parallel,
    scratch_database,
    server_dsn,
    stamped_value,
    value,
)

PRODUCERS = 8
LATENCY_RATE = 2000.0


@dataclass(frozen=True)
class TopicTarget:
    """A topic in the benchmark database."""

    dsn: str
    topic: str
    batch: int = BATCH
    group: str = "bench"
    expected: int = 0  # events a reader stops after
    fast: bool = False  # consume with poll_batch (an EventBatch) instead of poll (Event objects)
    idempotent: bool = True  # publish with producer tags (connect(idempotent=...))


def _messages(n: int, start: int = 0) -> list[pgstreams.Message]:
    return [pgstreams.Message(value(i), key=key(i)) for i in range(start, start + n)]


@contextmanager
def publish_many_op(t: TopicTarget) -> Iterator[Callable[[], int]]:
    """Operation: ``publish_many`` of one batch of events."""
    events = _messages(t.batch)
    with pgstreams.connect(t.dsn, migrate=False, pool_size=2, idempotent=t.idempotent) as client:
        yield lambda: client.publish_many(t.topic, events)


@contextmanager
def publish_op(t: TopicTarget) -> Iterator[Callable[[], int]]:
    """Operation: one single-event ``publish``."""
    import os

    events = _messages(t.batch, start=os.getpid())
    with pgstreams.connect(t.dsn, migrate=False, pool_size=2, idempotent=t.idempotent) as client:
        i = 0

        def op() -> int:
            nonlocal i
            m = events[i % len(events)]
            client.publish(t.topic, m.value, key=m.key)
            i += 1
            return 1

        yield op


@contextmanager
def consume_op(t: TopicTarget) -> Iterator[Callable[[], int]]:
    """Operation: one poll of up to 1,000 events and a commit, until ``t.expected`` events were read."""
    with pgstreams.connect(t.dsn, migrate=False, pool_size=2) as client:
        consumer = client.consumer(t.topic, t.group)
        seen = 0

        def op() -> int:
            nonlocal seen
            if seen >= t.expected:
                return DONE
            poll = consumer.poll_batch if t.fast else consumer.poll
            events = poll(t.batch, timeout=1.0)
            if events:
                consumer.commit()
            seen += len(events)
            return len(events)

        yield op


@contextmanager
def latency_producer(args: LatencyArgs) -> Iterator[Callable[[], int]]:
    """Operation: at a steady pace, publish the events due (``publish`` for one, ``publish_many`` for more),
    each stamped with the current time."""
    with pgstreams.connect(args.dsn, migrate=False, pool_size=2) as client:
        def send(n: int) -> None:
            if n == 1:
                client.publish(args.target, stamped_value(), key=key(n))
            else:
                client.publish_many(args.target, [pgstreams.Message(stamped_value(), key=key(i))
                                                  for i in range(n)])

        yield Paced(args.rate, send)


@contextmanager
def latency_consumer(args: LatencyArgs) -> Iterator[Callable[[], int]]:
    """Operation: poll (waking on notifications), record each event's latency; commit if
    ``args.commit``."""
    with pgstreams.connect(args.dsn, migrate=False, pool_size=2) as client:
        consumer = client.consumer(args.target, f"latency-{os.getpid()}", start="latest")
        sink = LatencySink(args.skip)

        def op() -> int:
            events = consumer.poll(BATCH, timeout=0.25)
            for ev in events:
                sink.add(ev.value)
            if events and args.commit:
                consumer.commit(durable=args.durable)
            return len(events)

        op.extra = sink.extra  # type: ignore[attr-defined]
        yield op


def _events_in(client: pgstreams.Client, topic: str) -> int:
    return client.describe_topic(topic).events


def _latency(producer: Callable, consumer: Callable, args: LatencyArgs, duration: float) -> tuple[
        float, float, float, float]:
    """(p50 ms, p99 ms, achieved events/s, events per transaction) of one paced producer and one
    consumer."""
    prod, cons = run_jobs([Job(producer, args, duration), Job(consumer, args, duration + 1.0)])
    lat = cons.extra or []
    return percentile(lat, 50) * 1000, percentile(lat, 99) * 1000, prod.rate, prod.extra["per_call"]


MEASUREMENTS = ("publish_many", "publish", "consume", "latency")


def _fill(db: str, partitions: int, n: int) -> None:
    """Untimed: ``n`` events into topic ``batch`` and rows into ``raw_batch`` (for ``--only consume``)."""
    with publish_many_op(TopicTarget(db, "batch")) as ours, raw_copy_in(RawTarget(db, "raw_batch",
                                                                                  partitions)) as raw:
        done = 0
        while done < n:
            done += ours()
            raw()


def run(dsn: str | None, duration: float, latency_duration: float, rounds: int, partitions: int,
        console: Console, only: Sequence[str] = MEASUREMENTS) -> list[Measurement]:
    """Run the measurements named in ``only`` (default all) and return the result rows."""
    server = server_dsn(dsn)
    out: list[Measurement] = []
    with scratch_database(server) as db:
        with pgstreams.connect(db) as client:
            for name in ("batch", "single1", "single8", "latency", "latency_commit"):
                client.create_topic(name, partitions=partitions)
        for name in ("raw_batch", "raw_single1", "raw_single8", "raw_latency"):
            create_raw_table(db, name)

        def pair(label: str, raw: Callable[[], float], ours: Callable[[], float]) -> tuple[float, float]:
            best_raw = best_ours = 0.0
            for r in range(rounds):
                checkpoint(db)
                best_raw = max(best_raw, raw())
                checkpoint(db)
                best_ours = max(best_ours, ours())
                console.log(f"{label} round {r + 1}: raw {best_raw:,.0f}/s, pgstreams {best_ours:,.0f}/s")
            return best_ours, best_raw

        def rt(table: str) -> RawTarget:
            return RawTarget(db, table, partitions)

        if "publish_many" in only:
            many, copy = pair(
                "publish_many",
                lambda: run_parallel(raw_copy_in, rt("raw_batch"), 1, duration, warmup=2),
                lambda: run_parallel(publish_many_op, TopicTarget(db, "batch"), 1, duration, warmup=2))
            out.append(Measurement("publish_many, 1,000-event batches", many, "events/s", copy,
                                   "COPY, 1,000-row transactions", ">= 80,000/s and >= 0.6 x raw",
                                   many >= 80_000 and many >= 0.6 * copy))
        if "publish" in only:
            one, ins1 = pair(
                "publish x1",
                lambda: run_parallel(raw_insert, rt("raw_single1"), 1, duration, warmup=20),
                lambda: run_parallel(publish_op, TopicTarget(db, "single1"), 1, duration, warmup=20))
            eight, ins8 = pair(
                f"publish x{PRODUCERS}",
                lambda: run_parallel(raw_insert, rt("raw_single8"), PRODUCERS, duration, warmup=20),
                lambda: run_parallel(publish_op, TopicTarget(db, "single8"), PRODUCERS, duration, warmup=20))
            out.append(Measurement("publish, 1 producer", one, "events/s", ins1,
                                   "single-row INSERT, 1 process"))
            out.append(Measurement(f"publish, {PRODUCERS} producer processes", eight, "events/s", ins8,
                                   f"single-row INSERT, {PRODUCERS} processes", ">= 0.7 x raw",
                                   eight >= 0.7 * ins8))
        if "consume" in only:
            if "publish_many" not in only:
                _fill(db, partitions, int(100_000 * duration))
            with pgstreams.connect(db, migrate=False) as client:
                total = _events_in(client, "batch")
            groups = iter(range(rounds))
            consume, copy_out = pair(
                f"consume {total:,} events",
                lambda: run_parallel(raw_copy_out, rt("raw_batch"), 1, 120),
                lambda: run_parallel(consume_op, TopicTarget(db, "batch", group=f"g{next(groups)}",
                                                             expected=total), 1, 120))
            out.append(Measurement("consume, 1 group, polls of 1,000 + commit", consume, "events/s",
                                   copy_out, "COPY-out of the same rows", ">= 150,000/s", consume >= 150_000))
        if "latency" in only:
            checkpoint(db)
            p50, p99, achieved, per_tx = _latency(latency_producer, latency_consumer,
                                                  LatencyArgs(db, "latency", LATENCY_RATE), latency_duration)
            console.log(f"latency: p50 {p50:.1f} ms, p99 {p99:.1f} ms at {achieved:,.0f} events/s, "
                        f"{per_tx:.1f} events per transaction")
            raw50, raw99, raw_rate, raw_per_tx = _latency(raw_latency_producer, raw_latency_consumer,
                                                          LatencyArgs(db, "raw_latency", LATENCY_RATE),
                                                          latency_duration)
            console.log(f"raw latency: p50 {raw50:.1f} ms, p99 {raw99:.1f} ms at {raw_rate:,.0f} events/s, "
                        f"{raw_per_tx:.1f} events per transaction")
            committing = LatencyArgs(db, "latency_commit", LATENCY_RATE, commit=True)
            c50, c99, c_rate, c_per_tx = _latency(latency_producer, latency_consumer, committing,
                                                  latency_duration)
            console.log(f"latency, committing every poll: p50 {c50:.1f} ms, p99 {c99:.1f} ms at "
                        f"{c_rate:,.0f} events/s, {c_per_tx:.1f} events per transaction")
            out.append(Measurement(f"latency p50 at {achieved:,.0f} events/s", p50, "ms", raw50,
                                   "INSERT+NOTIFY, LISTEN+SELECT", higher_is_better=False))
            out.append(Measurement(f"latency p99 at {achieved:,.0f} events/s", p99, "ms", raw99,
                                   "INSERT+NOTIFY, LISTEN+SELECT", "<= 50 ms", p99 <= 50,
                                   higher_is_better=False))
            out.append(Measurement(f"latency p50, committing every poll, at {c_rate:,.0f} events/s", c50,
                                   "ms", higher_is_better=False))
            out.append(Measurement(f"latency p99, committing every poll, at {c_rate:,.0f} events/s", c99,
                                   "ms", higher_is_better=False))
    return out


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m bench.core``."""
    ap = argparse.ArgumentParser(prog="python -m bench.core", description=__doc__.split("\n\n")[0])
    ap.add_argument("--dsn", help="server to use (default $PGSTREAMS_DSN, else the embedded server); "
                    "a database is created on it and dropped afterwards")
    ap.add_argument("--duration", type=float, default=4.0,
                    help="seconds per throughput measurement and round (default 4)")
    ap.add_argument("--latency-duration", type=float, default=10.0,
                    help="seconds of the latency measurement (default 10)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds per throughput pair, best kept (default 3)")
    ap.add_argument("--partitions", type=int, default=4, help="partitions per topic (default 4)")
    ap.add_argument("--quick", action="store_true",
                    help="short run: 1.5 s measurements, 1 round, 4 s of latency")
    ap.add_argument("--only", default=",".join(MEASUREMENTS),
                    help=f"comma-separated subset of {','.join(MEASUREMENTS)} (default all)")
    ap.add_argument("--markdown", action="store_true", help="also print the table in Markdown")
    args = ap.parse_args(argv)
    if args.quick:
        args.duration, args.rounds, args.latency_duration = 1.5, 1, 4.0
    if args.duration <= 0 or args.latency_duration <= 0 or args.rounds < 1 or args.partitions < 1:
        ap.error("durations, rounds and partitions must be positive")
    only = [m.strip() for m in args.only.split(",") if m.strip()]
    if not only or set(only) - set(MEASUREMENTS):
        ap.error(f"--only takes names among {', '.join(MEASUREMENTS)}")
    console = make_console()
    started = time.monotonic()
    target = server_dsn(args.dsn)
    info = machine(target)
    rows = run(target, args.duration, args.latency_duration, args.rounds, args.partitions, console, only)
    print_results("pgstreams core benchmark", rows, console)
    console.print(f"{info['cpu']}, {info['cores']} cores, {info['ram']} RAM; "
                  f"PostgreSQL {info['postgresql']}; "
                  f"Python {info['python']}, psycopg {info['psycopg']}; load before run {info['load']}; "
                  f"took {time.monotonic() - started:.0f} s")
    console.print(f"settings: {info['settings']}")
    if args.markdown:
        console.print(markdown(rows), markup=False, highlight=False, soft_wrap=True)
    return 0 if all(m.ok is not False for m in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
