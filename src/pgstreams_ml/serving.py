"""The serving path (impression -> clean -> prediction) in processes of its own.

An impression's prediction waits for the Spark clean query and then for a scoring worker. When those share
the CPU with the rest of the system (the join and monitor queries, training, the simulator), the clean
micro-batches stretch whenever the others are busy, and the prediction latency with them. So the demo runs
the serving path apart, as a production system would run it on resources of its own:

- the clean query in a Spark application of its own (``python -m pgstreams_ml clean --status FILE``, a
  driver and a local master in a process of its own: :func:`run_clean_service`);
- each scoring worker in a process of its own (``python -m pgstreams_ml score``);

and lowers the CPU priority (raises the nice value) of everything else it runs: its own process (the
simulator, the enrichment worker, the orchestration) and its Spark application (join, monitor, training)
with their Python workers (:func:`lower_priority`). The serving processes keep the priority they were
started with, so on a machine with few cores the serving path gets the CPU first and the other parts use
what is left.

:class:`ServingPath` starts, watches and stops those processes for the demo; the clean process reports its
progress in a JSON status file (:class:`CleanStatus`).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pgstreams.errors import PgStreamsError

from .clean import build_clean_query
from .sparkutil import QUERY_RESTARTS, executor_client, is_transient

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming import StreamingQuery

    from .config import Topology

log = logging.getLogger(__name__)

#: How much the demo lowers the CPU priority of its other parts when the serving path runs in processes of
#: its own (the nice value added; 0 leaves the priorities alone).
BACKGROUND_NICE = 10
#: ``--serving`` modes: ``processes`` (the serving path in processes of its own, the rest at lower
#: priority), ``session`` (everything in the demo's Spark session: one application, e.g. on a cluster whose
#: cores one application should get) and ``auto`` (``processes`` with a local master, else ``session``).
SERVING_MODES = ("auto", "processes", "session")


#: Spark settings of the clean query's own application: its micro-batches are small (hundreds of rows), so
#: generating and compiling Java code for the projection costs more than evaluating the expressions
#: directly; whole-stage code generation and expression code generation are off.
SERVING_SPARK_CONF = {
    "spark.sql.codegen.wholeStage": "false",
    "spark.sql.codegen.factoryMode": "NO_CODEGEN",
    # the status loop reads the recent progress reports every POLL seconds: a short list is enough
    "spark.sql.streaming.numRecentProgressUpdates": "50",
}
#: How often the clean process reads its query's progress (seconds).
POLL = 0.25


class ServingError(PgStreamsError):
    """A serving process failed or did not start."""


def resolve_mode(mode: str, master: str | None) -> str:
    """The serving mode ``mode`` (:data:`SERVING_MODES`) stands for with Spark master ``master``."""
    if mode not in SERVING_MODES:
        raise ValueError(f"serving mode must be one of {', '.join(SERVING_MODES)}, got {mode!r}")
    if mode != "auto":
        return mode
    chosen = master or os.environ.get("SPARK_MASTER", "local[2]")
    return "processes" if chosen.startswith("local") else "session"


def lower_priority(pid: int, increment: int) -> int:
    """Raise the nice value of every thread of process ``pid`` by ``increment`` (lower its CPU priority);
    threads and processes it starts later inherit the new value. Returns how many threads were changed.
    On Linux the nice value is a thread's, so each thread (``/proc/PID/task``) is changed; elsewhere the
    process's. Raising a nice value needs no privilege."""
    if increment <= 0:
        return 0
    tasks = Path(f"/proc/{pid}/task")
    tids = [int(t.name) for t in tasks.iterdir()] if tasks.is_dir() else [pid]
    changed = 0
    for tid in tids:
        try:
            now = os.getpriority(os.PRIO_PROCESS, tid)
            os.setpriority(os.PRIO_PROCESS, tid, min(19, now + increment))
            changed += 1
        except ProcessLookupError:
            continue  # the thread ended meanwhile
    return changed


def thread_nice_values(pid: int) -> dict[int, int]:
    """The nice value of every thread of process ``pid`` (Linux: from ``/proc/PID/task``)."""
    tasks = Path(f"/proc/{pid}/task")
    out: dict[int, int] = {}
    for t in tasks.iterdir() if tasks.is_dir() else ():
        try:
            out[int(t.name)] = os.getpriority(os.PRIO_PROCESS, int(t.name))
        except ProcessLookupError:
            continue
    return out or {pid: os.getpriority(os.PRIO_PROCESS, pid)}


# -- the clean query's process --------------------------------------------------------------------------
#: Micro-batches a clean process keeps in its status (:attr:`CleanStatus.batch_log`): a demo's run has a few
#: hundred.
BATCH_LOG = 5000


def batch_entry(progress: Any) -> list[float]:
    """A micro-batch's entry of :attr:`CleanStatus.batch_log`, from its Spark progress report."""
    ms = {k: float(v) for k, v in progress.get("durationMs", {}).items()}
    start = datetime.fromisoformat(str(progress.get("timestamp"))).timestamp()
    return [start, ms.get("triggerExecution", 0.0),
            ms.get("latestOffset", 0.0) + ms.get("getBatch", 0.0) + ms.get("queryPlanning", 0.0),
            ms.get("addBatch", 0.0), ms.get("walCommit", 0.0) + ms.get("commitOffsets", 0.0)]


@dataclass
class CleanStatus:
    """What the clean process reports in its status file (rewritten after every micro-batch and at least
    every second). ``state``: ``starting``, ``running``, ``stopped`` or ``failed``; ``batches``, ``rows``
    and ``busy_seconds`` add up the query's micro-batches (``rows``: raw records read); ``last_input_rows``
    and ``data_available`` are the latest batch's input and whether the source has more; ``restarts``
    counts transient restarts; ``error`` is the failure's text; ``phases_ms`` adds up the milliseconds of each
    phase Spark times per micro-batch (``latestOffset``, ``addBatch``, ``walCommit``, ...) over the batches
    that read rows, and ``batch_log`` keeps them per batch (what the demo attributes slow predictions
    to: :func:`pgstreams_ml.latency.tail_causes`)."""

    pid: int
    state: str = "starting"
    batches: int = 0
    rows: int = 0
    busy_seconds: float = 0.0
    last_input_rows: int | None = None
    data_available: bool = False
    restarts: int = 0
    error: str | None = None
    phases_ms: dict[str, float] = field(default_factory=dict)
    #: per micro-batch that read rows (the latest :data:`BATCH_LOG` of them): its start (epoch seconds), and
    #: milliseconds of the whole batch, of planning it (``latestOffset``, ``getBatch``, ``queryPlanning``),
    #: of reading and writing (``addBatch``) and of committing (``walCommit``, ``commitOffsets``)
    batch_log: list[list[float]] = field(default_factory=list)
    updated: float = 0.0

    def write(self, path: Path) -> None:
        """Write the status atomically (a reader never sees half a file)."""
        self.updated = time.time()
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(asdict(self)))
        os.replace(tmp, path)

    @classmethod
    def read(cls, path: Path) -> CleanStatus | None:
        """The status in ``path`` (``None`` while there is none)."""
        try:
            return cls(**json.loads(path.read_text()))
        except FileNotFoundError:
            return None


def _warm_worker(dsn: str, schema: str) -> list[int]:
    """In a Spark Python worker: make the worker's pgstreams client (the worker imported this module, and
    with it the clean pipeline, to run this)."""
    executor_client(dsn, schema)
    return [1]


def warm_python_workers(spark: SparkSession, dsn: str, schema: str, pool: str | None = None) -> None:
    """Start the serving path's Spark Python workers before any impression arrives: one task per executor
    core (in scheduler pool ``pool`` when given) imports the clean pipeline and makes the worker's pgstreams
    client (``sparkutil.executor_client``). Spark reuses those workers, so the first micro-batches do not
    pay for starting them (about a second on a quiet 2-core machine)."""
    context = spark.sparkContext
    slots = max(1, int(context.defaultParallelism))
    if pool is not None:
        context.setLocalProperty("spark.scheduler.pool", pool)
    try:
        rdd = context.parallelize(range(slots), slots)
        rdd.mapPartitions(lambda _rows: _warm_worker(dsn, schema)).collect()
    finally:
        if pool is not None:
            context.setLocalProperty("spark.scheduler.pool", None)  # type: ignore[arg-type]


def run_clean_service(
    spark: SparkSession,
    dsn: str,
    topo: Topology,
    checkpoint: str,
    *,
    trigger: str,
    max_events_per_trigger: int | None,
    status_path: Path | None,
    stop: threading.Event,
    warm_up: bool = True,
) -> CleanStatus:
    """Run the clean query until ``stop`` is set (or, with a trigger that ends, until it ends), restarting it
    from its checkpoint after a transient Spark start-up failure (:data:`sparkutil.TRANSIENT_QUERY_FAILURES`,
    at most :data:`sparkutil.QUERY_RESTARTS` times), and report its progress in ``status_path``
    (:class:`CleanStatus`). ``warm_up`` starts the Python workers first (:func:`warm_python_workers`).
    Raises :class:`ServingError` when the query fails otherwise."""
    status = CleanStatus(pid=os.getpid())
    if status_path is not None:
        status.write(status_path)
    if warm_up:
        warm_python_workers(spark, dsn, topo.pgstreams_schema)

    def start() -> StreamingQuery:
        return build_clean_query(
            spark, dsn, topo, checkpoint, trigger=trigger, max_events_per_trigger=max_events_per_trigger
        )

    query = start()
    seen: set[tuple[int, str]] = set()
    next_write = 0.0
    try:
        while True:
            exc = query.exception()
            if exc is not None:
                if status.restarts < QUERY_RESTARTS and is_transient(exc):
                    status.restarts += 1
                    log.warning("restarting the clean query after: %s", str(exc).splitlines()[0])
                    query.stop()
                    query = start()
                    continue
                status.state, status.error = "failed", str(exc)
                raise ServingError(f"the clean query failed: {exc}")
            changed = False
            window: set[tuple[int, str]] = set()
            for p in query.recentProgress:
                # an idle query reports progress with the id of the batch it will run next: the batch id
                # and the report's time together tell reports apart
                key = (int(p.get("batchId", -1)), str(p.get("timestamp")))
                window.add(key)
                if key in seen:
                    continue
                changed = True
                rows = int(p.get("numInputRows", 0))
                durations = p.get("durationMs", {})
                status.busy_seconds += float(durations.get("triggerExecution", 0)) / 1000.0
                if rows:
                    status.batches += 1
                    status.rows += rows
                    for phase, ms in durations.items():
                        status.phases_ms[phase] = status.phases_ms.get(phase, 0.0) + float(ms)
                    status.batch_log.append(batch_entry(p))
                    del status.batch_log[:-BATCH_LOG]
            seen = window  # a report that left the list of recent ones does not come back
            last, now_status = query.lastProgress, query.status
            if last is not None:
                status.last_input_rows = int(last.get("numInputRows", 0))
            if status.state == "starting" and (
                last is not None or now_status.get("message") != "Initializing sources"
            ):
                status.state, changed = "running", True
            status.data_available = bool(now_status.get("isDataAvailable"))
            now = time.monotonic()
            if status_path is not None and (changed or now >= next_write):
                status.write(status_path)
                next_write = now + 1.0
            if stop.is_set() or not query.isActive:
                break
            stop.wait(POLL)
        query.stop()
        status.state = "stopped"
        return status
    finally:
        if status.state not in ("stopped", "failed"):
            status.state = "failed"
        if query.isActive:
            query.stop()
        if status_path is not None:
            status.write(status_path)


# -- the demo's side ----------------------------------------------------------------------------------
class ServingPath:
    """The serving path's processes, started by the demo: one clean process (a Spark application of its
    own, master ``master``) and ``scorers`` scoring-worker processes, with their output in ``workdir``.
    The processes get the demo's environment and ``dsn`` (their own connections); they start at the
    priority of the thread that calls :meth:`start`, so start them before lowering the demo's."""

    def __init__(
        self,
        dsn: str,
        topo: Topology,
        workdir: Path,
        *,
        checkpoint: str,
        scorers: int,
        trigger: str,
        master: str,
        max_events_per_trigger: int | None,
    ) -> None:
        self.dsn = dsn
        self.topo = topo
        self.workdir = workdir
        self.checkpoint = checkpoint
        self.scorers = scorers
        self.trigger = trigger
        self.master = master
        self.max_events_per_trigger = max_events_per_trigger
        self.status_path = workdir / "clean-status.json"
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.logs: dict[str, Path] = {}

    def _spawn(self, name: str, args: list[str]) -> None:
        log_path = self.workdir / f"{name}.log"
        self.logs[name] = log_path
        with log_path.open("wb") as out:
            self.procs[name] = subprocess.Popen(
                [sys.executable, "-m", "pgstreams_ml", *args],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )

    def start(self) -> None:
        """Start the clean process and the scorer processes."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        common = ["--dsn", self.dsn, "--partitions", str(self.topo.partitions)]
        clean = ["clean", *common, "--checkpoint", self.checkpoint, "--trigger", self.trigger,
                 "--master", self.master, "--status", str(self.status_path), "--warm-up",
                 "--exit-with-parent"]
        if self.max_events_per_trigger:
            clean += ["--max-events-per-trigger", str(self.max_events_per_trigger)]
        self._spawn("clean", clean)
        for i in range(self.scorers):
            self._spawn(f"scorer-{i}", ["score", *common, "--exit-with-parent"])

    def status(self) -> CleanStatus | None:
        """The clean process's latest status."""
        return CleanStatus.read(self.status_path)

    def _tail(self, name: str, lines: int = 15) -> str:
        try:
            text = self.logs[name].read_text(errors="replace")
        except (KeyError, FileNotFoundError):
            return ""
        return "\n".join(text.strip().splitlines()[-lines:])

    def check(self) -> None:
        """Raise :class:`ServingError` when a serving process ended or the clean query failed."""
        for name, p in self.procs.items():
            rc = p.poll()
            if rc is not None:
                raise ServingError(
                    f"the serving process {name} exited with code {rc}:\n{self._tail(name)}"
                )
        st = self.status()
        if st is not None and st.state == "failed":
            raise ServingError(f"the clean query failed: {st.error}")

    def wait_running(self, timeout: float) -> None:
        """Wait until the clean query is running (past its warm-up and its sources' initialisation)."""
        deadline = time.monotonic() + timeout
        while True:
            self.check()
            st = self.status()
            if st is not None and st.state == "running":
                return
            if time.monotonic() > deadline:
                raise ServingError(
                    f"the clean query did not start within {timeout:.0f} s:\n{self._tail('clean')}"
                )
            time.sleep(0.2)

    def stop(self, timeout: float = 60.0) -> None:
        """Stop every process (SIGTERM: each stops its query or worker cleanly), killing what outlives
        ``timeout``."""
        for p in self.procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for name, p in self.procs.items():
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("killing the serving process %s", name)
                p.kill()
                p.wait(30)
