"""The processes of the read-fence benchmark's latency run: the paced producer and the readers (a
``Consumer``, members of a worker group, a Spark stream), each spawned on its own, and the parent's handle
on them (:class:`Fleet`).

Every event carries its wall-clock publishing time and a sequence number (:func:`stamped`); a reader notes
for each event it gets (sequence number, stamp, now minus stamp), and reports its notes when it stops.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import struct
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pgstreams

from .._common import BATCH, VALUE_SIZE, Paced, key

TRIGGER = "100 milliseconds"  #: default processingTime trigger of the Spark stream
HEARTBEAT = 0.5  #: heartbeat interval of the worker group, seconds
SESSION = 5.0  #: session timeout of the worker group, seconds

_STAMP = struct.Struct("<dq")  # wall-clock time of publishing, sequence number

Record = tuple[int, float, float]
"""What a reader noted of one event: (sequence number, stamp, latency in seconds)."""


def stamped(seq: int) -> bytes:
    """A 100-byte value carrying the current wall-clock time and ``seq``."""
    return _STAMP.pack(time.time(), seq).ljust(VALUE_SIZE, b"\0")


def unstamp(payload: bytes) -> tuple[int, float]:
    """(sequence number, stamp) of a value made by :func:`stamped`."""
    stamp, seq = _STAMP.unpack_from(payload)
    return int(seq), float(stamp)


@dataclass(frozen=True)
class ReaderArgs:
    """One reader process: a consumer, a member of the worker group, or the Spark stream."""

    kind: str
    name: str
    dsn: str
    topic: str
    group: str
    trigger: str = TRIGGER
    heartbeat: float = HEARTBEAT
    session: float = SESSION


class Tally:
    """The records of one reader process, and the shared counter and flags the parent watches."""

    def __init__(self, received: Any, flowing: Any) -> None:
        self.records: list[Record] = []
        self.received = received
        self.flowing = flowing
        self._lock = threading.Lock()

    def add(self, payloads: Sequence[bytes], now: float) -> None:
        """Note events that reached the reader at ``now``."""
        if not payloads:
            return
        got = []
        for p in payloads:
            seq, stamp = unstamp(p)
            got.append((seq, stamp, now - stamp))
        with self._lock:
            self.records.extend(got)
        with self.received.get_lock():
            self.received.value += len(got)
        self.flowing.set()


def _consumer(args: ReaderArgs, tally: Tally, started: Any, stop: Any) -> None:
    """A stream-group ``Consumer``: poll (woken by notifications), note, commit."""
    with pgstreams.connect(args.dsn, migrate=False, pool_size=2) as client:
        consumer = client.consumer(args.topic, args.group)
        started.set()
        while not stop.is_set():
            events = consumer.poll(BATCH, timeout=0.25)
            if events:
                tally.add([e.value for e in events], time.time())
                consumer.commit()


def _worker(args: ReaderArgs, tally: Tally, started: Any, stop: Any) -> None:
    """A member of the worker group: :class:`pgstreams.Worker`, a single-event handler that notes."""

    def handle(event: pgstreams.Event) -> None:
        tally.add([event.value], time.time())

    with pgstreams.connect(args.dsn, migrate=False, pool_size=3) as client:
        worker = pgstreams.Worker(client, member_id=args.name, install_signal_handlers=False,
                                  shutdown_timeout=30)
        worker.subscribe(args.topic, args.group, handle, heartbeat_interval=args.heartbeat,
                         session_timeout=args.session)
        worker.start()
        try:
            started.set()
            while not stop.wait(0.2):
                if worker.failure is not None:
                    raise worker.failure
        finally:
            worker.stop()


def _spark(args: ReaderArgs, tally: Tally, started: Any, stop: Any) -> None:
    """A Spark structured stream of the topic into ``foreachBatch``, which collects each micro-batch's
    values and notes them."""
    os.environ["PYSPARK_PYTHON"] = sys.executable  # Spark's Python workers run this interpreter
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    import pgstreams.spark
    from pgstreams_ml.sparkutil import QUERY_RESTARTS, is_transient

    from ..spark import spark_session

    spark = spark_session(app="pgstreams-bench-fence")
    try:
        pgstreams.spark.register(spark)

        def on_batch(df: Any, batch_id: int) -> None:
            rows = df.select("value").collect()
            tally.add([bytes(r[0]) for r in rows], time.time())

        with tempfile.TemporaryDirectory(prefix="pgstreams-bench-fence-") as ck:
            def start() -> Any:
                stream = (spark.readStream.format("pgstreams").option("dsn", args.dsn)
                          .option("topic", args.topic).option("group", args.group).load())
                return (stream.writeStream.foreachBatch(on_batch).option("checkpointLocation", ck)
                        .trigger(processingTime=args.trigger).start())

            q = start()
            restarts = 0
            try:
                started.set()
                while not stop.wait(0.2):
                    if not q.isActive:
                        exc = q.exception()
                        # Spark gives its Python processes 10 s to connect back, which a loaded machine can
                        # miss: the query goes on from its checkpoint, as pgstreams_ml's queries do
                        if restarts < QUERY_RESTARTS and is_transient(exc):
                            restarts += 1
                            q = start()
                            continue
                        raise RuntimeError(f"the streaming query stopped: {exc}")
            finally:
                q.stop()
    finally:
        spark.stop()


_READERS: dict[str, Callable[[ReaderArgs, Tally, Any, Any], None]] = {
    "consumer": _consumer, "worker": _worker, "spark": _spark}


def _reader_main(args: ReaderArgs, received: Any, started: Any, flowing: Any, stop: Any,
                 results: Any) -> None:
    tally = Tally(received, flowing)
    try:
        _READERS[args.kind](args, tally, started, stop)
        results.put((args.name, tally.records, None))
    except BaseException as exc:  # noqa: BLE001 - report every failure to the parent
        results.put((args.name, [], f"{args.name}: {type(exc).__name__}: {exc}"))


@dataclass(frozen=True)
class ProducerArgs:
    """The paced producer."""

    dsn: str
    topic: str
    rate: float


def _producer_main(args: ProducerArgs, sent: Any, stop: Any, results: Any) -> None:
    """Publish stamped events at ``args.rate`` until ``stop``; report every event's stamp (index = its
    sequence number)."""
    stamps: list[float] = []
    try:
        with pgstreams.connect(args.dsn, migrate=False, pool_size=2) as client:
            def send(n: int) -> None:
                first = len(stamps)
                values = [stamped(first + i) for i in range(n)]
                if n == 1:
                    client.publish(args.topic, values[0], key=key(first))
                else:
                    client.publish_many(args.topic, [pgstreams.Message(v, key=key(first + i))
                                                     for i, v in enumerate(values)])
                stamps.extend(unstamp(v)[1] for v in values)
                sent.value = len(stamps)

            paced = Paced(args.rate, send)
            while not stop.is_set():
                paced()
        results.put(("producer", stamps, None))
    except BaseException as exc:  # noqa: BLE001
        results.put(("producer", stamps, f"producer: {type(exc).__name__}: {exc}"))


@dataclass
class Child:
    """A process of the latency run and what the parent shares with it."""

    name: str
    kind: str
    proc: Any
    counter: Any
    started: Any = None
    flowing: Any = None


class Fleet:
    """The producer and reader processes of the latency run (spawned), their results, and clean-up."""

    def __init__(self) -> None:
        self.ctx = mp.get_context("spawn")
        self.results = self.ctx.Queue()
        self.stop_readers = self.ctx.Event()
        self.stop_producer = self.ctx.Event()
        self.readers: list[Child] = []
        self.producer: Child | None = None
        self.got: dict[str, Any] = {}
        self.errors: list[str] = []

    def start_reader(self, args: ReaderArgs) -> None:
        """Spawn a reader process."""
        counter, started, flowing = self.ctx.Value("q", 0), self.ctx.Event(), self.ctx.Event()
        proc = self.ctx.Process(target=_reader_main, args=(args, counter, started, flowing,
                                                            self.stop_readers, self.results),
                                name=args.name, daemon=True)
        proc.start()
        self.readers.append(Child(args.name, args.kind, proc, counter, started, flowing))

    def start_producer(self, args: ProducerArgs) -> None:
        """Spawn the producer process."""
        counter = self.ctx.Value("q", 0)
        proc = self.ctx.Process(target=_producer_main, args=(args, counter, self.stop_producer, self.results),
                                name="producer", daemon=True)
        proc.start()
        self.producer = Child("producer", "producer", proc, counter)

    def _collect(self, timeout: float) -> None:
        try:
            name, data, err = self.results.get(timeout=timeout)
        except queue.Empty:
            return
        self.got[name] = data
        if err:
            self.errors.append(err)

    def check(self) -> None:
        """Raise if a process failed or ended unasked."""
        while True:
            try:
                name, data, err = self.results.get_nowait()
            except queue.Empty:
                break
            self.got[name] = data
            if err:
                self.errors.append(err)
        if self.errors:
            raise RuntimeError("; ".join(self.errors))
        for c in [*self.readers, *([self.producer] if self.producer else [])]:
            if c.proc.exitcode is not None and c.name not in self.got:
                raise RuntimeError(f"{c.name} ended (exit code {c.proc.exitcode}) without reporting")

    def wait(self, what: str, cond: Callable[[], bool], timeout: float, every: float = 0.05) -> None:
        """Wait for ``cond`` (checking the processes meanwhile); raise after ``timeout`` s."""
        deadline = time.monotonic() + timeout
        while not cond():
            self.check()
            if time.monotonic() > deadline:
                raise RuntimeError(f"timed out after {timeout:g} s waiting for {what}")
            time.sleep(every)

    def sleep(self, seconds: float) -> None:
        """Sleep, checking the processes every second."""
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            self.check()
            time.sleep(min(1.0, left))

    def finish_producer(self) -> list[float]:
        """Stop the producer; the stamp of every event it published (index = sequence number)."""
        assert self.producer is not None
        self.stop_producer.set()
        self.wait("the producer's report", lambda: "producer" in self.got, 60)
        return list(self.got["producer"])

    def finish_readers(self) -> dict[str, list[Record]]:
        """Stop the readers; each one's records, by process name."""
        self.stop_readers.set()
        deadline = time.monotonic() + 120
        while any(c.name not in self.got for c in self.readers) and time.monotonic() < deadline:
            self._collect(1.0)
            if any(c.proc.exitcode is not None and c.name not in self.got for c in self.readers):
                self._collect(2.0)
                break
        self.check()
        missing = [c.name for c in self.readers if c.name not in self.got]
        if missing:
            raise RuntimeError(f"no report from {', '.join(missing)}")
        return {c.name: self.got[c.name] for c in self.readers}

    def close(self) -> None:
        """Stop every process (terminate those that do not end within 30 s)."""
        self.stop_producer.set()
        self.stop_readers.set()
        for c in [*([self.producer] if self.producer else []), *self.readers]:
            c.proc.join(timeout=30)
            if c.proc.is_alive():
                c.proc.terminate()
                c.proc.join(10)


@contextmanager
def fleet() -> Iterator[Fleet]:
    """A :class:`Fleet` whose processes are stopped (or terminated) when the block ends."""
    f = Fleet()
    try:
        yield f
    finally:
        f.close()
