"""Shared benchmark plumbing: target database, process runner, raw PostgreSQL baselines, result tables.

Every benchmark measures pgstreams and the raw PostgreSQL limit of the same machine in the same run, so
figures are read as ratios. Measurements run in fresh processes (``spawn``) that set up first, then
start together and time only their own loop.
"""

from __future__ import annotations

import ipaddress
import multiprocessing as mp
import os
import platform
import queue
import signal
import struct
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from rich.console import Console
from rich.table import Table

VALUE_SIZE = 100  #: bytes per event value in every benchmark
BATCH = 1000  #: events per COPY transaction / per poll

# --------------------------------------------------------------------------------------------------------
# target database


def check_loopback(dsn: str) -> None:
    """Refuse DSNs whose host is not this machine (a Unix socket, ``localhost`` or a loopback address)."""
    info = conninfo_to_dict(dsn)
    hosts = [h for h in str(info.get("hostaddr") or info.get("host") or "").split(",") if h]
    for host in hosts or [""]:
        if host == "" or host.startswith("/") or host.startswith("@") or host == "localhost":
            continue
        try:
            if ipaddress.ip_address(host).is_loopback:
                continue
        except ValueError:
            pass
        raise SystemExit(f"benchmarks run only against this machine; refusing host {host!r}")


def server_dsn(dsn: str | None) -> str:
    """The server to benchmark: ``dsn``, else ``$PGSTREAMS_DSN``, else the embedded server. Loopback only."""
    target = dsn or os.environ.get("PGSTREAMS_DSN")
    if not target:
        from pgstreams.embedded import embedded_dsn

        target = embedded_dsn()
    check_loopback(target)
    return target


@contextmanager
def temporary_tcp_server() -> Iterator[str]:
    """A throw-away PostgreSQL listening on 127.0.0.1, for benchmarks whose baseline connects over TCP
    only (the embedded server listens on a Unix socket); see :func:`pgstreams.embedded.temporary_server`."""
    from pgstreams.embedded import temporary_server

    with temporary_server() as dsn:
        yield dsn


@contextmanager
def scratch_database(dsn: str, prefix: str = "pgstreams_bench") -> Iterator[str]:
    """Create a fresh database on ``dsn``'s server, yield its DSN, drop it afterwards."""
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield make_conninfo(dsn, dbname=name)
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def checkpoint(dsn: str) -> None:
    """Run CHECKPOINT (when permitted) so each measurement starts with the WAL in the same state."""
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("CHECKPOINT")
    except psycopg.Error:
        pass


@contextmanager
def interrupt_on_sigterm() -> Iterator[None]:
    """SIGTERM ends the run as Ctrl-C does (so that the clean-up runs)."""
    def handler(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


# --------------------------------------------------------------------------------------------------------
# machine


def machine(dsn: str) -> dict[str, str]:
    """A description of the machine and PostgreSQL server the benchmark ran on."""
    cpu = platform.processor() or "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    ram = "unknown"
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal"):
                    ram = f"{int(line.split()[1]) / 1024 / 1024:.1f} GiB"
                    break
    except OSError:
        pass
    settings = ("shared_buffers", "synchronous_commit", "fsync", "wal_level", "max_wal_size",
                "checkpoint_timeout", "commit_delay")
    with psycopg.connect(dsn, autocommit=True) as conn:
        version = conn.execute("SHOW server_version").fetchone()[0]  # type: ignore[index]
        rows = conn.execute("SELECT name, current_setting(name) FROM pg_settings WHERE name = ANY(%s)"
                            " ORDER BY name", (list(settings),)).fetchall()
    pg = ", ".join(f"{n}={v}" for n, v in rows)
    try:
        load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        load = "unknown"
    return {"cpu": cpu, "cores": str(os.cpu_count()), "ram": ram, "python": platform.python_version(),
            "psycopg": psycopg.__version__, "postgresql": version, "settings": pg, "load": load}


# --------------------------------------------------------------------------------------------------------
# process runner

Factory = Callable[[Any], AbstractContextManager[Callable[[], int]]]
"""Builds, in the child process, an operation that does one unit of work and returns how many events it
handled; returning :data:`DONE` ends the child's run early (e.g. a reader that has drained its input)."""

DONE = -1


@dataclass
class ChildResult:
    """What one child process measured: events handled, seconds of its timed loop, and any extra data
    its operation exposed as ``op.extra``."""

    count: int
    seconds: float
    extra: Any = None

    @property
    def rate(self) -> float:
        return self.count / self.seconds if self.seconds > 0 else 0.0


@dataclass
class Job:
    """A process to run: ``factory(arg)`` builds its operation, which is repeated for ``duration`` s."""

    factory: Factory
    arg: Any
    duration: float
    warmup: int = 0


def _child(job: Job, ready: Any, go: Any, results: Any, index: int) -> None:
    try:
        with job.factory(job.arg) as op:
            for _ in range(job.warmup):
                op()
            ready.wait(timeout=120)
            go.wait(timeout=120)
            n = 0
            t0 = time.perf_counter()
            end = t0 + job.duration
            while True:
                got = op()
                if got == DONE:
                    break
                n += got
                if time.perf_counter() >= end:
                    break
            elapsed = time.perf_counter() - t0
            results.put((index, ChildResult(n, elapsed, getattr(op, "extra", None)), None))
    except BaseException as exc:  # noqa: BLE001 - report every failure to the parent
        try:
            ready.abort()
        except Exception:  # noqa: BLE001
            pass
        results.put((index, None, f"{type(exc).__name__}: {exc}"))


def run_jobs(jobs: Sequence[Job]) -> list[ChildResult]:
    """Run each job in its own fresh process; all start their timed loops together."""
    ctx = mp.get_context("spawn")
    ready = ctx.Barrier(len(jobs) + 1)
    go = ctx.Event()
    results = ctx.Queue()
    procs = [ctx.Process(target=_child, args=(job, ready, go, results, i), daemon=True)
             for i, job in enumerate(jobs)]
    for p in procs:
        p.start()
    out: list[ChildResult | None] = [None] * len(jobs)
    errors: list[str] = []
    try:
        try:
            ready.wait(timeout=120)
        except Exception:  # noqa: BLE001 - a child failed during set-up; its error is in the queue
            pass
        go.set()
        deadline = time.monotonic() + max(j.duration for j in jobs) + 120
        for _ in jobs:
            try:
                i, res, err = results.get(timeout=max(1.0, deadline - time.monotonic()))
            except queue.Empty:
                errors.append("a benchmark process did not report in time")
                break
            if err:
                errors.append(err)
            else:
                out[i] = res
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.terminate()
                p.join()
    if errors:
        raise RuntimeError("; ".join(errors))
    return [r for r in out if r is not None]


def run_parallel(factory: Factory, arg: Any, processes: int, duration: float, warmup: int = 0) -> float:
    """Run ``processes`` copies of an operation for ``duration`` s; return the total events per second."""
    return sum(r.rate for r in run_jobs([Job(factory, arg, duration, warmup)] * processes))


def best_of(rounds: int, measure: Callable[[], float]) -> float:
    """The best of ``rounds`` measurements (other load on the machine only ever lowers a rate)."""
    return max(measure() for _ in range(max(1, rounds)))


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) of ``values`` by nearest rank."""
    if not values:
        return float("nan")
    s = sorted(values)
    k = max(0, min(len(s) - 1, round(q / 100 * len(s) + 0.5) - 1))
    return s[k]


# --------------------------------------------------------------------------------------------------------
# payloads


def value(i: int, size: int = VALUE_SIZE) -> bytes:
    """A ``size``-byte value, distinct per ``i``."""
    head = i.to_bytes(8, "little")
    return head + bytes((i + j) & 0xFF for j in range(size - len(head)))


def key(i: int, distinct: int = 1000) -> str:
    """A short key (``k0`` .. ``k<distinct-1>``)."""
    return f"k{i % distinct}"


def stamped_value(size: int = VALUE_SIZE) -> bytes:
    """A ``size``-byte value that starts with the current wall-clock time (for latency)."""
    return struct.pack("<d", time.time()).ljust(size, b"\0")


def stamp_of(payload: bytes) -> float:
    """The time written by :func:`stamped_value`."""
    return float(struct.unpack_from("<d", payload)[0])


# --------------------------------------------------------------------------------------------------------
# raw PostgreSQL baselines: a plain (unpartitioned) table with the columns and read index of a topic table

_RAW_TABLE = sql.SQL("""
CREATE TABLE {t} (
    partition      integer     NOT NULL,
    position       bigint      GENERATED ALWAYS AS IDENTITY (CACHE 1),
    xid            xid8        NOT NULL DEFAULT pg_current_xact_id(),
    created_at     timestamptz NOT NULL DEFAULT statement_timestamp(),
    kind           "char"      NOT NULL,
    key            text,
    value          bytea       NOT NULL,
    headers        jsonb,
    event_type     text,
    event_id       text,
    correlation_id text,
    causation_id   text
)""")
_RAW_INDEX = sql.SQL("CREATE INDEX ON {t} (partition, xid, position)")
_RAW_COPY_IN = sql.SQL("COPY {t} (partition, kind, key, value) FROM STDIN (FORMAT BINARY)")
_RAW_COPY_IN_TYPES = ("int4", "text", "text", "bytea")  # "char" in binary is its one byte, as text writes it
_RAW_INSERT = sql.SQL(
    "INSERT INTO {t} (partition, kind, key, value) VALUES (%s, %s, %s, %s) RETURNING position")
_RAW_COPY_OUT = sql.SQL(
    "COPY (SELECT partition, position, xid::text::bigint, created_at, kind, key, value, headers, event_type,"
    " event_id, correlation_id, causation_id FROM {t} ORDER BY partition, xid, position) TO STDOUT"
    " (FORMAT BINARY)")
_RAW_COPY_OUT_TYPES = ("int4", "int8", "int8", "timestamptz", "text", "text", "bytea", "jsonb",
                       "text", "text", "text", "text")
_RAW_POLL = sql.SQL("SELECT position, value FROM {t} WHERE position > %s ORDER BY position LIMIT %s")
_RAW_NOTIFY = sql.SQL("NOTIFY {c}")
_RAW_LISTEN = sql.SQL("LISTEN {c}")


@dataclass(frozen=True)
class RawTarget:
    """A raw table in a benchmark database, and the shape of the rows written to it."""

    dsn: str
    table: str
    partitions: int = 1
    batch: int = BATCH


def create_raw_table(dsn: str, table: str) -> None:
    """Create the raw baseline table ``table`` (same columns and read index as a topic's events)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(_RAW_TABLE.format(t=sql.Identifier(table)))
        conn.execute(_RAW_INDEX.format(t=sql.Identifier(table)))


def raw_rows(n: int, partitions: int, start: int = 0) -> list[tuple[int, str, str, bytes]]:
    """``n`` rows ``(partition, kind, key, value)`` as a raw COPY writes them."""
    from pgstreams.partitioner import partition_for_key

    return [(partition_for_key(key(i), partitions), "b", key(i), value(i)) for i in range(start, start + n)]


def _bytes_cursor(conn: psycopg.Connection) -> psycopg.Cursor:
    # by oid, bytea would get the (Python) dumper of psycopg.Binary: use the C one for bytes
    from psycopg.types.string import BytesBinaryDumper

    cur = conn.cursor()
    cur.adapters.register_dumper(None, BytesBinaryDumper)
    return cur


@contextmanager
def raw_copy_in(target: RawTarget) -> Iterator[Callable[[], int]]:
    """Operation: one binary COPY statement of ``target.batch`` rows into the raw table, on an autocommit
    connection (so one transaction per batch)."""
    rows = raw_rows(target.batch, target.partitions)
    stmt = _RAW_COPY_IN.format(t=sql.Identifier(target.table))
    with psycopg.connect(target.dsn, autocommit=True) as conn:
        def op() -> int:
            with _bytes_cursor(conn).copy(stmt) as cp:
                cp.set_types(_RAW_COPY_IN_TYPES)
                for r in rows:
                    cp.write_row(r)
            return len(rows)

        yield op


@contextmanager
def raw_insert(target: RawTarget) -> Iterator[Callable[[], int]]:
    """Operation: one autocommit single-row INSERT (prepared) into the raw table."""
    rows = raw_rows(target.batch, target.partitions, start=os.getpid())
    stmt = _RAW_INSERT.format(t=sql.Identifier(target.table))
    with psycopg.connect(target.dsn, autocommit=True) as conn:
        cur = conn.cursor()
        i = 0

        def op() -> int:
            nonlocal i
            cur.execute(stmt, rows[i % len(rows)], prepare=True)
            cur.fetchone()
            i += 1
            return 1

        yield op


@contextmanager
def raw_copy_out(target: RawTarget) -> Iterator[Callable[[], int]]:
    """Operation: read every row of the raw table in read order with a binary COPY TO, as Python tuples;
    once."""
    stmt = _RAW_COPY_OUT.format(t=sql.Identifier(target.table))
    with psycopg.connect(target.dsn, autocommit=True) as conn:
        done = False

        def op() -> int:
            nonlocal done
            if done:
                return DONE
            n = 0
            with conn.cursor().copy(stmt) as cp:
                cp.set_types(_RAW_COPY_OUT_TYPES)
                for _ in cp.rows():
                    n += 1
            done = True
            return n

        yield op


@dataclass
class LatencyArgs:
    """Arguments of a paced latency producer or of its consumer."""

    dsn: str
    target: str  # a topic, or a raw table
    rate: float = 2000.0  # events per second
    skip: float = 0.5  # seconds of samples discarded at the start (connections and plans warming up)
    commit: bool = False  # whether the consumer commits (stores its position) after every poll
    durable: bool = True  # whether those commits wait for their flush to disk (Consumer.commit's durable)


class Paced:
    """Publishes at a steady ``rate`` of events per second: each call sends, with ``send(n)``, the ``n``
    events due by now (one when the producer keeps up; more, in one transaction, when a commit takes
    longer than the interval between events)."""

    def __init__(self, rate: float, send: Callable[[int], None]) -> None:
        self.rate = rate
        self.send = send
        self.t0: float | None = None
        self.sent = 0
        self.calls = 0
        self.extra: dict[str, float] = {}

    def __call__(self) -> int:
        now = time.perf_counter()
        if self.t0 is None:
            self.t0 = now
        wait = self.t0 + self.sent / self.rate - now
        if wait > 0:
            time.sleep(wait)
            now += wait
        due = max(1, int((now - self.t0) * self.rate) + 1 - self.sent)
        self.send(due)
        self.sent += due
        self.calls += 1
        self.extra["per_call"] = self.sent / self.calls
        return due


class LatencySink:
    """Collects publish-to-read latencies (seconds) of stamped values, skipping the first ``skip`` s."""

    def __init__(self, skip: float) -> None:
        self.skip_until = time.time() + skip
        self.extra: list[float] = []

    def add(self, payload: bytes) -> None:
        now = time.time()
        stamp = stamp_of(payload)
        if stamp >= self.skip_until:
            self.extra.append(now - stamp)


@contextmanager
def raw_latency_producer(args: LatencyArgs) -> Iterator[Callable[[], int]]:
    """Operation: at a steady pace, one transaction that INSERTs the stamped rows due and NOTIFYs."""
    insert = _RAW_INSERT.format(t=sql.Identifier(args.target))
    notify = _RAW_NOTIFY.format(c=sql.Identifier(args.target))
    with psycopg.connect(args.dsn, autocommit=True) as conn:
        def send(n: int) -> None:
            with conn.transaction():
                cur = conn.cursor()
                cur.executemany(insert, [(0, "b", "k", stamped_value()) for _ in range(n)])
                cur.execute(notify)

        yield Paced(args.rate, send)


@contextmanager
def raw_latency_consumer(args: LatencyArgs) -> Iterator[Callable[[], int]]:
    """Operation: wait for a notification (at most 0.25 s), then read new rows by position."""
    poll = _RAW_POLL.format(t=sql.Identifier(args.target))
    with psycopg.connect(args.dsn, autocommit=True) as listen, \
            psycopg.connect(args.dsn, autocommit=True) as conn:
        listen.execute(_RAW_LISTEN.format(c=sql.Identifier(args.target)))
        sink = LatencySink(args.skip)
        last = 0

        def op() -> int:
            nonlocal last
            for _ in listen.notifies(timeout=0.25, stop_after=1):
                pass
            n = 0
            while True:
                rows = conn.execute(poll, (last, BATCH), prepare=True).fetchall()
                for _pos, payload in rows:
                    sink.add(payload)
                n += len(rows)
                if rows:
                    last = rows[-1][0]
                if len(rows) < BATCH:
                    return n

        op.extra = sink.extra  # type: ignore[attr-defined]
        yield op


# --------------------------------------------------------------------------------------------------------
# results


@dataclass
class Measurement:
    """One row of a result table: the pgstreams figure, the raw figure beside it, and the floor."""

    name: str
    value: float
    unit: str
    raw: float | None = None
    raw_label: str = ""
    floor: str = ""
    ok: bool | None = None
    higher_is_better: bool = True

    @property
    def ratio(self) -> float | None:
        if self.raw is None or not self.raw or not self.value:
            return None
        return self.value / self.raw if self.higher_is_better else self.raw / self.value


def _fmt(v: float | None, unit: str) -> str:
    if v is None:
        return "-"
    if unit == "ms":
        return f"{v:,.1f} ms"
    return f"{v:,.0f} {unit}"


def make_console() -> Console:
    """A rich console; 150 columns wide when the output is not a terminal (files, pipes, CI logs)."""
    import sys

    return Console() if sys.stdout.isatty() else Console(width=150)


def print_results(title: str, rows: Sequence[Measurement], console: Console | None = None) -> None:
    """Print a result table with rich."""
    console = console or make_console()
    table = Table(title=title)
    table.add_column("measurement")
    table.add_column("pgstreams", justify="right")
    table.add_column("raw PostgreSQL", justify="right")
    table.add_column("raw baseline")
    table.add_column("ratio", justify="right")
    table.add_column("floor")
    table.add_column("", justify="center")
    for m in rows:
        ratio = m.ratio
        mark = "" if m.ok is None else ("[green]ok[/green]" if m.ok else "[red]BELOW[/red]")
        table.add_row(m.name, _fmt(m.value, m.unit), _fmt(m.raw, m.unit), m.raw_label,
                      "-" if ratio is None else f"{ratio:.2f}", m.floor, mark)
    console.print(table)


def markdown(rows: Sequence[Measurement]) -> str:
    """The same table in Markdown (for docs/benchmarks.md)."""
    out = ["| measurement | pgstreams | raw PostgreSQL | raw baseline | ratio | floor | |",
           "|---|---:|---:|---|---:|---|---|"]
    for m in rows:
        ratio = m.ratio
        mark = "" if m.ok is None else ("ok" if m.ok else "BELOW")
        out.append(f"| {m.name} | {_fmt(m.value, m.unit)} | {_fmt(m.raw, m.unit)} | {m.raw_label} | "
                   f"{'-' if ratio is None else f'{ratio:.2f}'} | {m.floor} | {mark} |")
    return "\n".join(out)
