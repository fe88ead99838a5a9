"""What the idempotent producer costs: publishing with producer tags against the same code without them.

    python -m bench.idempotence [--dsn DSN] [--duration 3] [--rounds 8] [--quick] [--markdown]

``connect(idempotent=True)`` (the default) tags every publish with the client's producer id and number;
``connect(idempotent=False)`` runs the same code without the tag (and without drawing a producer id). Each
round measures, in fresh processes and in turn: the raw PostgreSQL figure (single-row INSERT, prepared,
autocommit; binary COPY of 1,000-row transactions), then the idempotent client, then the plain one, in
alternating order from round to round so that neither always runs after the other. Single-event
``publish`` from one process and ``publish_many`` of 1,000-event batches, on topics of 4 partitions.
Reported: the best and the median of the rounds of each, the ratio idempotent / plain of both (the bars:
>= 0.9 for ``publish``, >= 0.95 for ``publish_many``) and each against raw, and the ratio of the two
measurements of each round (taken one after the other) with its median.

Without ``--dsn`` it starts a PostgreSQL of its own with ``fsync`` and ``synchronous_commit`` off, so that
what the statements cost shows rather than the wait for the WAL flush (which is the same for both and
dominates a single publish on a disk); with ``--dsn`` (this machine only) it creates a database there and
drops it at the end.
"""

from __future__ import annotations

import argparse
import os
import statistics
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pgstreams

from ._common import (
    Measurement,
    RawTarget,
    checkpoint,
    create_raw_table,
    make_console,
    markdown,
    print_results,
    raw_copy_in,
    raw_insert,
    run_parallel,
    scratch_database,
    server_dsn,
)
from .core import TopicTarget, publish_many_op, publish_op


@contextmanager
def _server(dsn: str | None) -> Iterator[str]:
    """``dsn`` (checked), else a throw-away server without fsync and synchronous commit."""
    if dsn:
        yield server_dsn(dsn)
        return
    from pgstreams.embedded import temporary_server

    with temporary_server({"fsync": "off", "synchronous_commit": "off"}) as own:
        yield own


#: The bars of the issue: idempotent / plain.
SINGLE_BAR = 0.9
BATCH_BAR = 0.95


def run(dsn: str | None, duration: float, rounds: int) -> tuple[list[Measurement], dict[str, list[float]]]:
    """The rounds; the result rows and every round's figure per series."""
    console = make_console()
    series: dict[str, list[float]] = {k: [] for k in (
        "raw insert", "publish idempotent", "publish plain", "raw copy", "publish_many idempotent",
        "publish_many plain")}
    with _server(dsn) as server, scratch_database(server) as db:
        with pgstreams.connect(db) as client:
            for name in ("one_tagged", "one_plain", "many_tagged", "many_plain"):
                client.create_topic(name, partitions=4)
        for name in ("raw_one", "raw_many"):
            create_raw_table(db, name)
        raw_one, raw_many = RawTarget(db, "raw_one", 4), RawTarget(db, "raw_many", 4)
        for r in range(rounds):
            steps: list[tuple[str, Callable[[], float]]] = [
                ("raw insert", lambda: run_parallel(raw_insert, raw_one, 1, duration, warmup=20)),
                ("publish idempotent", lambda: run_parallel(publish_op, TopicTarget(db, "one_tagged"), 1,
                                                            duration, warmup=20)),
                ("publish plain", lambda: run_parallel(
                    publish_op, TopicTarget(db, "one_plain", idempotent=False), 1, duration, warmup=20)),
                ("raw copy", lambda: run_parallel(raw_copy_in, raw_many, 1, duration, warmup=2)),
                ("publish_many idempotent", lambda: run_parallel(
                    publish_many_op, TopicTarget(db, "many_tagged"), 1, duration, warmup=2)),
                ("publish_many plain", lambda: run_parallel(
                    publish_many_op, TopicTarget(db, "many_plain", idempotent=False), 1, duration, warmup=2)),
            ]
            if r % 2:  # plain first in odd rounds
                steps[1], steps[2] = steps[2], steps[1]
                steps[4], steps[5] = steps[5], steps[4]
            for name, measure in steps:
                checkpoint(db)
                series[name].append(measure())
            console.log(f"round {r + 1}: " + ", ".join(f"{k} {v[-1]:,.0f}/s" for k, v in series.items()))
    best = {k: max(v) for k, v in series.items()}
    med = {k: statistics.median(v) for k, v in series.items()}
    rows = []
    for label, tagged, plain, raw, raw_label, bar in (
            ("publish, 1 producer", "publish idempotent", "publish plain", "raw insert",
             "single-row INSERT, 1 process", SINGLE_BAR),
            ("publish_many, 1,000-event batches", "publish_many idempotent", "publish_many plain", "raw copy",
             "COPY, 1,000-row transactions", BATCH_BAR)):
        rows.append(Measurement(f"{label}, idempotent (best)", best[tagged], "events/s", best[raw], raw_label,
                                f">= {bar} x plain", best[tagged] >= bar * best[plain]))
        rows.append(Measurement(f"{label}, plain (best)", best[plain], "events/s", best[raw], raw_label))
        rows.append(Measurement(f"{label}, idempotent (median)", med[tagged], "events/s", med[raw], raw_label,
                                f">= {bar} x plain", med[tagged] >= bar * med[plain]))
        rows.append(Measurement(f"{label}, plain (median)", med[plain], "events/s", med[raw], raw_label))
    return rows, series


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m bench.idempotence``."""
    ap = argparse.ArgumentParser(prog="python -m bench.idempotence", description=__doc__.split("\n\n")[0])
    ap.add_argument("--dsn", help="server to use (default: a server of its own, fsync and synchronous "
                    "commit off); a database is created on it and dropped afterwards")
    ap.add_argument("--duration", type=float, default=3.0, help="seconds per measurement (default 3)")
    ap.add_argument("--rounds", type=int, default=8, help="rounds (default 8)")
    ap.add_argument("--quick", action="store_true", help="1 s measurements, 2 rounds")
    ap.add_argument("--markdown", action="store_true", help="also print the table as Markdown")
    args = ap.parse_args(argv)
    if args.duration <= 0 or args.rounds < 1:
        ap.error("--duration must be positive and --rounds at least 1")
    duration, rounds = (1.0, 2) if args.quick else (args.duration, args.rounds)
    load = os.getloadavg()
    rows, series = run(args.dsn, duration, rounds)
    print_results("idempotent producer: with and without producer tags", rows)
    tagged1, plain1 = series["publish idempotent"], series["publish plain"]
    tagged_n, plain_n = series["publish_many idempotent"], series["publish_many plain"]
    print(f"idempotent / plain: publish best {max(tagged1) / max(plain1):.3f}, median "
          f"{statistics.median(tagged1) / statistics.median(plain1):.3f}; publish_many best "
          f"{max(tagged_n) / max(plain_n):.3f}, median "
          f"{statistics.median(tagged_n) / statistics.median(plain_n):.3f}")
    # the two of a round ran one after the other: their ratio is less exposed to the load's swings
    pairs1 = [t / p for t, p in zip(tagged1, plain1, strict=True) if p]
    pairs_n = [t / p for t, p in zip(tagged_n, plain_n, strict=True) if p]
    print("idempotent / plain per round: publish " + ", ".join(f"{r:.2f}" for r in pairs1)
          + f" (median {statistics.median(pairs1):.3f}); publish_many "
          + ", ".join(f"{r:.2f}" for r in pairs_n)
          + f" (median {statistics.median(pairs_n):.3f})")
    print(f"load average: {' '.join(f'{x:.2f}' for x in load)} at the start, "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())} at the end")
    if args.markdown:
        print(markdown(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
