"""The observability and asyncio benchmark: the async client against the sync one, and a metrics scrape.

    python -m bench.obs [--dsn DSN] [--events 100000] [--rounds 3] [--topics 1000] [--groups 100]
                        [--quick] [--markdown]

* **async vs sync**, in the same run, on the same server, one process each: single publishes (one event
  per call, sequential), ``publish_many`` batches of 1,000 (COPY) and draining a backlog with
  ``poll(1000)`` + ``commit()``; ``--events`` events per measurement (a tenth for single publishes),
  ``--rounds`` rounds, each measuring the sync client then the async one (alternated, so that a change of
  the machine's load falls on both), best round per client. The bar: async >= 0.8 x sync. As throughput
  depends on what else runs on the machine, the client CPU per call (``time.process_time()``) of single
  publishes and of polls of 10 events with a commit is measured too, both clients in the same process.
* **a metrics scrape** at ``--topics`` topics (1 partition each, 10 events each) and ``--groups`` groups
  (each with a checkpoint on one topic): one status read (``Client.status``) and a scrape, an HTTP GET of
  the endpoint ``pgstreams metrics serve`` runs (:func:`pgstreams.metrics.serve`) for a
  :class:`pgstreams.metrics.StatusCollector` (``min_interval=0``), median of ``--rounds`` x 3 scrapes
  (and, apart, ``prometheus_client.generate_latest`` of the same registry: an application's own
  registry exported by prometheus_client's own code);
  the first status read (no figures kept yet: every topic is read; the collector makes it when created)
  is shown apart; then scrapes after every topic received an event since the last one (median of
  ``--rounds``). The bar: < 200 ms, for both kinds of scrape.
  The cost is O(topics + partitions + groups) in a constant number of statements, never O(events).

The benchmark creates its own database (``--dsn``, else ``$PGSTREAMS_DSN``, else the embedded server; this
machine only) and drops it at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
import urllib.request
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from rich.console import Console
from rich.table import Table

import pgstreams
from pgstreams import aio
from pgstreams.metrics import StatusCollector, serve

from ._common import BATCH, scratch_database, server_dsn, value


def _load() -> str:
    return f"{os.getloadavg()[0]:.1f}"


async def _rates(dsn: str, events: int, rounds: int) -> tuple[dict[str, float], dict[str, float]]:
    """Events/s of the sync and the async client, best of ``rounds``; each round runs one measurement of
    the sync client, then the same of the async client (alternated, so that a change of the machine's load
    during the run falls on both)."""
    sync_out: dict[str, float] = {}
    async_out: dict[str, float] = {}
    singles = max(100, events // 10)
    rows = [{"value": value(i), "key": str(i % 100)} for i in range(BATCH)]
    with pgstreams.connect(dsn) as sc:
        async with await aio.connect(dsn) as ac:
            sc.create_topic("sync", 4)
            await ac.create_topic("async", 4)

            def sync_single() -> float:
                t = time.perf_counter()
                for i in range(singles):
                    sc.publish("sync", value(i), key=str(i % 100))
                return singles / (time.perf_counter() - t)

            async def async_single() -> float:
                t = time.perf_counter()
                for i in range(singles):
                    await ac.publish("async", value(i), key=str(i % 100))
                return singles / (time.perf_counter() - t)

            def sync_batches() -> float:
                t = time.perf_counter()
                for _ in range(events // BATCH):
                    sc.publish_many("sync", rows)
                return (events // BATCH) * BATCH / (time.perf_counter() - t)

            async def async_batches() -> float:
                t = time.perf_counter()
                for _ in range(events // BATCH):
                    await ac.publish_many("async", rows)
                return (events // BATCH) * BATCH / (time.perf_counter() - t)

            def sync_drain(group: str) -> float:
                consumer = sc.consumer("sync", group)
                n = 0
                t = time.perf_counter()
                while batch := consumer.poll(BATCH, timeout=0):
                    n += len(batch)
                    consumer.commit()
                return n / (time.perf_counter() - t)

            async def async_drain(group: str) -> float:
                consumer = await ac.consumer("async", group)
                n = 0
                t = time.perf_counter()
                while batch := await consumer.poll(BATCH, timeout=0):
                    n += len(batch)
                    await consumer.commit()
                return n / (time.perf_counter() - t)

            def keep(out: dict[str, float], name: str, rate: float) -> None:
                out[name] = max(out.get(name, 0.0), rate)

            for _ in range(rounds):
                keep(sync_out, "single publish", sync_single())
                keep(async_out, "single publish", await async_single())
            for _ in range(rounds):
                keep(sync_out, "publish_many", sync_batches())
                keep(async_out, "publish_many", await async_batches())
            for r in range(rounds):
                keep(sync_out, "poll + commit", sync_drain(f"g{r}"))
                keep(async_out, "poll + commit", await async_drain(f"g{r}"))
    return sync_out, async_out


def _cpu_per_call(dsn: str, calls: int) -> dict[str, tuple[float, float]]:
    """Client CPU time (``time.process_time``) per call of the sync and the async client, in this one
    process: ``calls`` single publishes, then polls of 10 events each followed by a commit."""
    out: dict[str, tuple[float, float]] = {}
    with pgstreams.connect(dsn) as client:
        client.create_topic("cpu_sync", 4)
        t = time.process_time()
        for i in range(calls):
            client.publish("cpu_sync", value(i), key=str(i % 100))
        pub = (time.process_time() - t) / calls
        consumer = client.consumer("cpu_sync", "cpu")
        n, t = 0, time.process_time()
        while consumer.poll(10, timeout=0):
            consumer.commit()
            n += 1
        out["sync"] = (pub, (time.process_time() - t) / max(n, 1))

    async def run() -> tuple[float, float]:
        async with await aio.connect(dsn) as client:
            await client.create_topic("cpu_async", 4)
            t = time.process_time()
            for i in range(calls):
                await client.publish("cpu_async", value(i), key=str(i % 100))
            pub = (time.process_time() - t) / calls
            consumer = await client.consumer("cpu_async", "cpu")
            n, t = 0, time.process_time()
            while await consumer.poll(10, timeout=0):
                await consumer.commit()
                n += 1
            return pub, (time.process_time() - t) / max(n, 1)

    out["async"] = asyncio.run(run())
    return out


def _scrape_cost(dsn: str, topics: int, groups: int, rounds: int) -> dict[str, Any]:
    with pgstreams.connect(dsn) as client:
        t = time.perf_counter()
        for i in range(topics):
            name = f"m{i:05d}"
            client.create_topic(name, 1)
            client.publish_many(name, [{"value": value(j)} for j in range(10)])
        for g in range(groups):
            consumer = client.consumer(f"m{g % topics:05d}", f"group{g:04d}")
            if consumer.poll(5, timeout=0):
                consumer.commit()
        setup = time.perf_counter() - t
        registry = CollectorRegistry()
        t = time.perf_counter()
        registry.register(StatusCollector(client, min_interval=0))  # its first read, when created
        first = time.perf_counter() - t
        server = serve(registry, host="127.0.0.1", port=0)  # what `pgstreams metrics serve` runs
        try:
            def scrape() -> bytes:
                with urllib.request.urlopen(server.url, timeout=60) as response:
                    return bytes(response.read())

            reads, scrapes, app = [], [], []
            for _ in range(rounds * 3):
                t = time.perf_counter()
                client.status()
                reads.append(time.perf_counter() - t)
                t = time.perf_counter()
                text = scrape()
                scrapes.append(time.perf_counter() - t)
                t = time.perf_counter()
                same = generate_latest(registry)
                app.append(time.perf_counter() - t)
            if same.count(b"\n") != text.count(b"\n"):
                raise AssertionError("the endpoint's text and generate_latest's differ in their lines")
            changed = []
            for r in range(rounds):  # every topic got an event since the last scrape
                for i in range(topics):
                    client.publish(f"m{i:05d}", value(r))
                t = time.perf_counter()
                scrape()
                changed.append(time.perf_counter() - t)
        finally:
            server.close()
        return {"setup": setup, "first": first, "read": statistics.median(reads),
                "scrape": statistics.median(scrapes), "changed": statistics.median(changed),
                "app": statistics.median(app), "bytes": len(text)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.obs", description=__doc__.split("\n\n")[0])
    ap.add_argument("--dsn", help="server to benchmark (loopback only)")
    ap.add_argument("--events", type=int, default=100_000, help="events per throughput measurement")
    ap.add_argument("--rounds", type=int, default=3, help="rounds per measurement")
    ap.add_argument("--topics", type=int, default=1000, help="topics of the scrape measurement")
    ap.add_argument("--groups", type=int, default=100, help="groups of the scrape measurement")
    ap.add_argument("--quick", action="store_true",
                    help="a tiny run (2,000 events, 20 topics, 5 groups, 1 round)")
    ap.add_argument("--markdown", action="store_true", help="also print the tables in Markdown")
    args = ap.parse_args(argv)
    if args.events < BATCH:
        ap.error(f"--events must be at least {BATCH:,} (one publish_many batch), not {args.events}")
    for name in ("rounds", "topics", "groups"):
        if getattr(args, name) < 1:
            ap.error(f"--{name} must be at least 1, not {getattr(args, name)}")
    if args.quick:
        args.events, args.topics, args.groups, args.rounds = 2000, 20, 5, 1
    console = Console()
    dsn = server_dsn(args.dsn)
    lines: list[str] = []
    with scratch_database(dsn, "pgstreams_bench_obs") as db:
        load = _load()
        sync, asyn = asyncio.run(_rates(db, args.events, args.rounds))
        table = Table(title=f"async vs sync client (events/s, best of {args.rounds}; load {load})")
        for col in ("measurement", "sync", "async", "async / sync", "bar >= 0.8"):
            table.add_column(col)
        lines += ["**async vs sync client**", "",
                  "| measurement | sync | async | async / sync | bar >= 0.8 |",
                  "| --- | ---: | ---: | ---: | --- |"]
        for name, s in sync.items():
            a = asyn[name]
            cells = (name, f"{s:,.0f}", f"{a:,.0f}", f"{a / s:.2f}", "met" if a / s >= 0.8 else "MISSED")
            table.add_row(*cells)
            lines.append("| " + " | ".join(cells) + " |")
        console.print(table)
        load = _load()
        cpu = _cpu_per_call(db, max(500, args.events // 10))
        table = Table(title=f"client CPU per call (us; load {load})")
        for col in ("call", "sync", "async", "async / sync"):
            table.add_column(col)
        lines += ["", "**client CPU per call (us)**", "", "| call | sync | async | async / sync |",
                  "| --- | ---: | ---: | ---: |"]
        for i, name in enumerate(("single publish", "poll(10) + commit")):
            sc, ac = cpu["sync"][i], cpu["async"][i]
            row = (name, f"{sc * 1e6:.0f}", f"{ac * 1e6:.0f}", f"{ac / sc:.2f}")
            table.add_row(*row)
            lines.append("| " + " | ".join(row) + " |")
        console.print(table)
        load = _load()
        cost = _scrape_cost(db, args.topics, args.groups, args.rounds)
        table = Table(title=f"metrics scrape at {args.topics} topics and {args.groups} groups "
                            f"(median; load {load})")
        for col in ("first status read", "status read", "scrape (HTTP: read + text)",
                    "scrape, every topic changed", "bar < 200 ms", "generate_latest (read + text)",
                    "text size", "setup"):
            table.add_column(col)
        scrape = (f"{cost['first'] * 1000:.0f} ms", f"{cost['read'] * 1000:.0f} ms",
                  f"{cost['scrape'] * 1000:.0f} ms", f"{cost['changed'] * 1000:.0f} ms",
                  "met" if max(cost["scrape"], cost["changed"]) < 0.2 else "MISSED",
                  f"{cost['app'] * 1000:.0f} ms", f"{cost['bytes']:,} B", f"{cost['setup']:.0f} s")
        table.add_row(*scrape)
        console.print(table)
        lines += ["", f"**metrics scrape at {args.topics} topics and {args.groups} groups**", "",
                  "| first status read | status read | scrape (HTTP: read + text) "
                  "| scrape, every topic changed | bar < 200 ms | generate_latest (read + text) | text size "
                  "| setup |",
                  "| ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: |",
                  "| " + " | ".join(scrape) + " |"]
    if args.markdown:
        console.print("\n".join(lines), markup=False, highlight=False, soft_wrap=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
