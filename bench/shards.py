"""The shards benchmark: publish_many and consume over one shard and over a cluster of three, beside the
raw PostgreSQL figure measured in the same run.

    python -m bench.shards [--dsn DSN] [--duration SECONDS] [--rounds N] [--events N] [--quick] [--markdown]

The three shards are three databases of the same server on this machine: they share its cores, so the
figure is the cluster layer's overhead, not scale (docs/shards.md says how throughput scales on separate
machines). Events carry 100-byte values and 1,000 distinct keys, on topics of 4 partitions per shard.

* ``publish_many`` of 1,000-event batches from one process: a single-server ``Client`` (one COPY per
  batch) vs a ``ClusterClient`` of three shards (the batch split by key, one COPY per shard, the shards
  at once), vs raw COPY of 1,000-row batches into a plain table with a topic's columns and read index;
* consume of one group (``poll(1000)`` then ``commit()``) of ``--events`` events: a ``Consumer`` of one
  shard vs a ``ClusterConsumer`` of the same number of events spread over three shards, vs a binary
  COPY-out of the raw table's rows in read order.

Bars: three shards >= 0.9 x one shard, for both. The table's ``ratio`` column is each figure against raw
PostgreSQL; a second table gives the ratio of three shards to one shard for each operation, with the bar
and whether it was met. Pairs alternate for ``--rounds`` rounds (default 3) and keep the best of each,
after a CHECKPOINT. The databases are created on the server (``--dsn``, else
``$PGSTREAMS_DSN``, else the embedded server; this machine only) and dropped at the end.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass

from rich.console import Console
from rich.table import Table

import pgstreams
from pgstreams.cluster import ClusterClient, init_cluster

from ._common import (
    BATCH,
    DONE,
    Measurement,
    RawTarget,
    checkpoint,
    create_raw_table,
    key,
    machine,
    make_console,
    markdown,
    print_results,
    raw_copy_in,
    raw_copy_out,
    run_parallel,
    scratch_database,
    server_dsn,
    value,
)

PARTITIONS = 4
SHARDS = 3
BAR = 0.9


@dataclass(frozen=True)
class Target:
    """A topic of one server (one DSN) or of a cluster (several)."""

    dsns: tuple[str, ...]
    topic: str
    group: str = "bench"
    expected: int = 0


@dataclass(frozen=True)
class ShardRatio:
    """Three shards against one shard for one operation: the bar is ``three / one >= BAR``."""

    operation: str
    one: float
    three: float

    @property
    def ratio(self) -> float:
        """Three shards' rate over one shard's (0 when one shard's is 0)."""
        return self.three / self.one if self.one else 0.0

    @property
    def met(self) -> bool:
        """Whether the ratio reaches :data:`BAR`."""
        return self.ratio >= BAR

    @property
    def verdict(self) -> str:
        """``"met"`` or ``"missed"``."""
        return "met" if self.met else "missed"


def print_ratios(ratios: list[ShardRatio], console: Console) -> None:
    """The table of three shards against one shard, per operation, with the bar and its verdict."""
    table = Table(title=f"{SHARDS} shards against 1 shard")
    table.add_column("operation")
    table.add_column("1 shard", justify="right")
    table.add_column(f"{SHARDS} shards", justify="right")
    table.add_column(f"{SHARDS} shards / 1 shard", justify="right")
    table.add_column("bar")
    table.add_column("", justify="center")
    for r in ratios:
        mark = "[green]met[/green]" if r.met else "[red]missed[/red]"
        table.add_row(r.operation, f"{r.one:,.0f} events/s", f"{r.three:,.0f} events/s", f"{r.ratio:.2f}",
                      f">= {BAR}", mark)
    console.print(table)


def ratios_markdown(ratios: list[ShardRatio]) -> str:
    """The same table in Markdown (rates without their unit: events/s)."""
    out = [f"| operation | 1 shard | {SHARDS} shards | {SHARDS} shards / 1 shard | bar | |",
           "|---|---:|---:|---:|---|---|"]
    out += [f"| {r.operation} | {r.one:,.0f} | {r.three:,.0f} | {r.ratio:.2f} | >= {BAR} | {r.verdict} |"
            for r in ratios]
    return "\n".join(out)


def _connect(t: Target) -> pgstreams.Client | ClusterClient:
    return pgstreams.connect(list(t.dsns), migrate=False, pool_size=4)


@contextmanager
def publish_many_op(t: Target) -> Iterator[Callable[[], int]]:
    """Operation: ``publish_many`` of one batch of 1,000 keyed events."""
    events = [pgstreams.Message(value(i), key=key(i)) for i in range(BATCH)]
    with _connect(t) as client:
        yield lambda: client.publish_many(t.topic, events)


@contextmanager
def consume_op(t: Target) -> Iterator[Callable[[], int]]:
    """Operation: one poll of up to 1,000 events and a commit, until ``t.expected`` events were read."""
    with _connect(t) as client:
        consumer = client.consumer(t.topic, t.group)
        seen = 0

        def op() -> int:
            nonlocal seen
            if seen >= t.expected:
                return DONE
            events = consumer.poll(BATCH, timeout=1.0)
            if events:
                consumer.commit()
            seen += len(events)
            return len(events)

        yield op


def _fill(t: Target, events: int) -> None:
    """Untimed: at least ``events`` events into ``t``."""
    with publish_many_op(t) as op:
        done = 0
        while done < events:
            done += op()


def run(dsn: str | None, duration: float, rounds: int, events: int, console: object
        ) -> tuple[list[Measurement], list[ShardRatio]]:
    """Run every measurement; return the result rows and the ratio of three shards to one for each
    operation."""
    log = getattr(console, "log", print)
    server = server_dsn(dsn)
    out: list[Measurement] = []
    with ExitStack() as stack:
        single = stack.enter_context(scratch_database(server, "pgstreams_bench_shards"))
        shards = tuple(stack.enter_context(scratch_database(server, "pgstreams_bench_shards"))
                       for _ in range(SHARDS))
        init_cluster(list(shards))
        with pgstreams.connect(single) as one, pgstreams.connect(list(shards)) as cluster:
            for name in ("batch", "fill"):
                one.create_topic(name, PARTITIONS)
                cluster.create_topic(name, PARTITIONS)
        create_raw_table(single, "raw_batch")
        raw = RawTarget(single, "raw_batch", PARTITIONS)

        def trio(label: str, measure_raw: Callable[[], float], measure_one: Callable[[], float],
                 measure_three: Callable[[], float]) -> tuple[float, float, float]:
            best = [0.0, 0.0, 0.0]
            for r in range(rounds):
                for i, measure in enumerate((measure_raw, measure_one, measure_three)):
                    checkpoint(single)
                    best[i] = max(best[i], measure())
                log(f"{label} round {r + 1}: raw {best[0]:,.0f}/s, 1 shard {best[1]:,.0f}/s, "
                    f"{SHARDS} shards {best[2]:,.0f}/s")
            return best[0], best[1], best[2]

        copy, many1, many3 = trio(
            "publish_many",
            lambda: run_parallel(raw_copy_in, raw, 1, duration, warmup=2),
            lambda: run_parallel(publish_many_op, Target((single,), "batch"), 1, duration, warmup=2),
            lambda: run_parallel(publish_many_op, Target(shards, "batch"), 1, duration, warmup=2))
        out.append(Measurement("publish_many, 1 shard, 1,000-event batches", many1, "events/s", copy,
                               "COPY, 1,000-row transactions"))
        out.append(Measurement(f"publish_many, {SHARDS} shards, 1,000-event batches", many3, "events/s",
                               copy, "COPY, 1,000-row transactions", f">= {BAR} x 1 shard",
                               many3 >= BAR * many1))

        _fill(Target((single,), "fill"), events)
        _fill(Target(shards, "fill"), events)
        with pgstreams.connect(single, migrate=False) as one:
            total1 = sum(p.events for p in one.describe_topic("fill").partition_info)
        with pgstreams.connect(list(shards), migrate=False) as cluster:
            assert isinstance(cluster, ClusterClient)
            total3 = cluster.describe_topic("fill").events
        with raw_copy_in(raw) as fill_raw:  # as many rows as one shard's topic holds
            for _ in range(-(-total1 // BATCH)):
                fill_raw()
        groups = iter(range(3 * rounds))
        copy_out, consume1, consume3 = trio(
            f"consume {total1:,} events",
            lambda: run_parallel(raw_copy_out, raw, 1, 120),
            lambda: run_parallel(consume_op, Target((single,), "fill", f"g{next(groups)}", total1), 1, 120),
            lambda: run_parallel(consume_op, Target(shards, "fill", f"g{next(groups)}", total3), 1, 120))
        out.append(Measurement("consume, 1 shard, polls of 1,000 + commit", consume1, "events/s", copy_out,
                               "COPY-out of the same rows"))
        out.append(Measurement(f"consume, {SHARDS} shards, polls of 1,000 + commit", consume3, "events/s",
                               copy_out, "COPY-out of the same rows",
                               f">= {BAR} x 1 shard", consume3 >= BAR * consume1))
    return out, [ShardRatio("publish_many", many1, many3), ShardRatio("consume", consume1, consume3)]


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m bench.shards``."""
    ap = argparse.ArgumentParser(prog="python -m bench.shards", description=__doc__.split("\n\n")[0])
    ap.add_argument("--dsn", help="server to use (default $PGSTREAMS_DSN, else the embedded server); "
                    "four databases are created on it and dropped afterwards")
    ap.add_argument("--duration", type=float, default=4.0,
                    help="seconds per publish measurement and round (default 4)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds per measurement, best kept (default 3)")
    ap.add_argument("--events", type=int, default=300_000,
                    help="events each consume drains (default 300,000)")
    ap.add_argument("--quick", action="store_true", help="short run: 1.5 s, 1 round, 60,000 events")
    ap.add_argument("--markdown", action="store_true", help="also print the table in Markdown")
    args = ap.parse_args(argv)
    if args.quick:
        args.duration, args.rounds, args.events = 1.5, 1, 60_000
    if args.duration <= 0 or args.rounds < 1 or args.events < 1:
        ap.error("--duration, --rounds and --events must be positive")
    console = make_console()
    started = time.monotonic()
    target = server_dsn(args.dsn)
    info = machine(target)
    rows, ratios = run(target, args.duration, args.rounds, args.events, console)
    print_results("pgstreams shards benchmark", rows, console)
    print_ratios(ratios, console)
    console.print(f"{info['cpu']}, {info['cores']} cores, {info['ram']} RAM; "
                  f"PostgreSQL {info['postgresql']}; "
                  f"Python {info['python']}, psycopg {info['psycopg']}; load before run {info['load']}; "
                  f"took {time.monotonic() - started:.0f} s")
    if args.markdown:
        console.print(markdown(rows), markup=False, highlight=False, soft_wrap=True)
        console.print()  # a blank line: two tables, not one
        console.print(ratios_markdown(ratios), markup=False, highlight=False, soft_wrap=True)
    return 0 if all(m.ok is not False for m in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
