"""The cost of the data-loss check of a poll: CPU time of the client process and of the server backend per
idle poll, for the read alone, the read with the check as a third statement of the pipeline (as first
built) and the read with the check as its trailer row (as now).

    python -m bench.pollcheck [--dsn DSN] [--rounds 15] [--polls 2000] [--partitions 4]

Idle polls (cursors at the head, up to 500 events) of one topic, on one connection, the three variants in
alternating rounds; each figure is the best of the rounds (CPU time, which other load on the machine only
ever raises). Server CPU comes from the backend's ``/proc/<pid>/stat`` (so the server must run on this
machine), in clock ticks: a round of ``--polls`` polls resolves ``10 ms / polls``. It creates its own
database on the server (``--dsn``, else ``$PGSTREAMS_DSN``, else the embedded server) and drops it.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from typing import Any

import pgstreams

from ._common import make_console, scratch_database, server_dsn

ROUNDS = 15
POLLS = 2000
PARTITIONS = 4
TICK = os.sysconf("SC_CLK_TCK")


def backend_cpu(pid: int) -> float:
    """CPU seconds (user + system) a process used so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m bench.pollcheck``."""
    ap = argparse.ArgumentParser(prog="python -m bench.pollcheck", description=__doc__.split("\n\n")[0])
    ap.add_argument("--dsn", help="server to use (default $PGSTREAMS_DSN, else the embedded server)")
    ap.add_argument("--rounds", type=int, default=ROUNDS, help=f"rounds, best kept (default {ROUNDS})")
    ap.add_argument("--polls", type=int, default=POLLS, help=f"polls per round and variant (default {POLLS})")
    ap.add_argument("--partitions", type=int, default=PARTITIONS, help=f"partitions (default {PARTITIONS})")
    args = ap.parse_args(argv)
    if args.rounds < 1 or args.polls < 1 or args.partitions < 1:
        ap.error("rounds, polls and partitions must be positive")
    console = make_console()
    with scratch_database(server_dsn(args.dsn)) as db, pgstreams.connect(db) as client:
        client.create_topic("t", args.partitions)
        client.publish_many("t", [{"value": b"x" * 100, "key": f"k{i}"} for i in range(4000)])
        tid = client.topic_record("t").id
        events = client.store.events
        variants: dict[str, Callable[..., Any]] = {
            "read alone": events.poll,
            "check as a third statement": lambda conn, t, params: events._poll(
                conn, t, params, ("load_fences", "poll", "removed_after_cursors")),
            "check as the read's trailer row": events.poll_checked,
        }
        parts = list(range(args.partitions))
        params = {"partitions": parts, "positions": [10**12] * len(parts), "limit": 500, "total": 501}
        best: dict[str, tuple[float, float]] = {}
        with client.raw_connection() as conn:
            pid = conn.info.backend_pid
            for fn in variants.values():
                for _ in range(20):
                    fn(conn, tid, dict(params))
            for _ in range(args.rounds):
                for name, fn in variants.items():
                    c0, s0 = time.process_time(), backend_cpu(pid)
                    for _ in range(args.polls):
                        fn(conn, tid, dict(params))
                    got = ((time.process_time() - c0) / args.polls * 1e6,
                           (backend_cpu(pid) - s0) / args.polls * 1e6)
                    old = best.get(name, (float("inf"), float("inf")))
                    best[name] = (min(old[0], got[0]), min(old[1], got[1]))
    for name, (client_us, server_us) in best.items():
        console.print(f"{name:32s} client {client_us:6.1f} us  server {server_us:6.1f} us per idle poll")
    console.print(f"best of {args.rounds} rounds of {args.polls} polls, {args.partitions} partitions; "
                  f"load {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
