"""``pgstreams demo``: the whole ML system end to end, on the embedded PostgreSQL unless a DSN is given.

Timeline (simulated time, for a run of duration ``D``, drift at ``0.5 D``, monitoring windows ``W``):

1. the simulator starts; the enrichment worker, the scorer workers and the three Spark queries (clean, join,
   monitor) run concurrently from the start;
2. once the training examples are final up to ``0.375 D``, model v1 is trained on ``[0, 0.25 D)``,
   evaluated on ``[0.25 D, 0.375 D)`` and deployed (the simulator does not pass ``0.375 D`` + 12 minutes
   before, so that a model serves before the drift);
3. at ``0.5 D`` the ground truth changes; the monitor flags degraded windows;
4. the first degraded window triggers a retrain on the ``0.1875 D`` after its start, evaluated on the next
   ``0.083 D``; it is deployed if it beats the deployed model on that holdout (the simulator waits for the
   decision 12 minutes after that holdout, so the new model serves the rest of the run). Without a flag
   within 4 windows of the change, the retrain is scheduled from the drift (from ``0.5 D`` without drift);
5. when the simulator is done and every pipeline has drained, the summary is printed and written with the
   plots to the reports folder.

Besides those gates, a throttle keeps the simulator at most ``0.15 D`` ahead of the final training examples
and of the monitor, so the story holds on a slow machine (``--speed`` is then an upper bound).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn

import pgstreams
from pgstreams.errors import InvalidArgument, PgStreamsError

from . import _sql, audit, latency, report
from .config import Topology, setup
from .serving import BACKGROUND_NICE, ServingPath, lower_priority, resolve_mode, warm_python_workers
from .simulator import SimConfig, Simulator
from .sparkutil import QUERY_RESTARTS, checkpoint_conf, is_transient

log = logging.getLogger(__name__)


class DemoError(PgStreamsError):
    """The demo could not complete (a stage did not finish within the time limit, a worker died, ...)."""


#: The clean query's default trigger: the next micro-batch starts as soon as the previous one ended (the
#: clean query is on the serving path: impression -> clean -> prediction; see docs/ml-system.md).
CLEAN_TRIGGER = "0 seconds"
#: The Spark scheduler pool of the clean query (the session schedules pools fairly, so the clean query's
#: short jobs do not queue behind the join's, the monitor's and training's).
SERVING_POOL = "serving"


@dataclass(frozen=True)
class DemoOptions:
    """Options of :func:`run_demo` (the ``pgstreams demo`` options).

    ``dsn`` (default ``None``: ``$PGSTREAMS_DSN``, else the embedded server); ``reports`` folder (default
    ``reports``); ``seed`` (7); simulated ``duration`` (4 h), impression ``rate`` per simulated second (4),
    ``speed`` (simulated seconds per wall second, 240); ``drift`` (true: at half time); ``users`` (2000),
    ``ads`` (200); topic ``partitions`` (2, also Spark's shuffle partitions); ``scorers`` (1 worker);
    monitoring ``window`` (``None``: a sixteenth of the duration); Spark ``trigger`` interval of the join
    and monitor queries (``2 seconds``) and ``clean_trigger`` of the clean query, the one that feeds
    scoring (:data:`CLEAN_TRIGGER`), ``master`` (``local[2]``) and ``max_events_per_trigger`` (20000);
    ``checkpoints``, where the queries keep their checkpoints (``None``: a temporary folder of the driver;
    on a cluster of several machines a location every executor reaches, such as ``hdfs://...``);
    ``serving``: where the serving path (clean query, scorers) runs (:data:`serving.SERVING_MODES`; default
    ``auto``: in processes of its own with a local master, in the demo's Spark session otherwise);
    ``background_nice``: with the serving path in processes of its own, how much the demo lowers the CPU
    priority of its other parts (:data:`serving.BACKGROUND_NICE`, 10; 0 leaves it alone);
    ``timeout`` for the whole run (900 s); ``progress`` bars (true).
    """

    dsn: str | None = None
    reports: Path = Path("reports")
    seed: int = 7
    duration: float = 4 * 3600.0
    rate: float = 4.0
    speed: float = 240.0
    drift: bool = True
    users: int = 2000
    ads: int = 200
    partitions: int = 2
    scorers: int = 1
    window: str | None = None
    trigger: str = "2 seconds"
    clean_trigger: str = CLEAN_TRIGGER
    master: str | None = None
    checkpoints: str | None = None
    max_events_per_trigger: int = 20000
    serving: str = "auto"
    background_nice: int = BACKGROUND_NICE
    timeout: float = 900.0
    progress: bool = True

    def __post_init__(self) -> None:
        if self.duration < 1800:
            raise InvalidArgument(
                f"duration must be at least 30 minutes of simulated time, got {self.duration}s"
            )
        if not isinstance(self.scorers, int) or self.scorers < 1:
            raise InvalidArgument(f"scorers must be a positive integer, got {self.scorers!r}")
        if self.timeout <= 0:
            raise InvalidArgument(f"timeout must be positive, got {self.timeout!r}")
        try:
            resolve_mode(self.serving, self.master)
        except ValueError as exc:
            raise InvalidArgument(str(exc)) from None
        if not 0 <= self.background_nice <= 19:
            raise InvalidArgument(f"background_nice must be between 0 and 19, got {self.background_nice!r}")

    @property
    def serving_mode(self) -> str:
        """``processes`` or ``session`` (``serving`` resolved for ``master``)."""
        return resolve_mode(self.serving, self.master)

    @property
    def window_seconds(self) -> int:
        """The monitoring window in seconds."""
        if self.window:
            from .monitor import _interval_seconds

            return int(_interval_seconds(self.window))
        return max(60, int(self.duration / 16))


@dataclass
class _State:
    phase: str = "starting"
    models: list[dict[str, Any]] = field(default_factory=list)
    deployments: list[tuple[datetime, int]] = field(default_factory=list)
    flagged_window: datetime | None = None
    retrain_from: datetime | None = None
    retrain_hold_to: datetime | None = None
    error: BaseException | None = None


class Demo:
    """One demo run. Use :func:`run_demo`."""

    def __init__(self, opts: DemoOptions, console: Console | None = None) -> None:
        self.opts = opts
        self.console = console or Console()
        self.topo = Topology(partitions=opts.partitions)
        d = opts.duration
        self.sim_config = SimConfig(
            seed=opts.seed,
            users=opts.users,
            ads=opts.ads,
            rate=opts.rate,
            duration=d,
            speed=opts.speed,
            drift_at=0.5 * d if opts.drift else None,
        )
        self.start = self.sim_config.start
        self.state = _State()
        self.gate_v1 = threading.Event()
        self.gate_v2 = threading.Event()
        self.stop = threading.Event()
        self.queries: dict[str, Any] = {}
        self.builders: dict[str, Callable[[], Any]] = {}
        self.restarts: dict[str, int] = {}
        self.workers: list[Any] = []
        self.scorers: list[Any] = []
        self.serving: ServingPath | None = None
        self.enrich_counts: Any = None
        self.t0 = time.monotonic()

    def at(self, fraction: float) -> datetime:
        """The simulated time at ``fraction`` of the duration."""
        return self.start + timedelta(seconds=fraction * self.opts.duration)

    # -- helpers -----------------------------------------------------------------------------------------
    def _check(self) -> None:
        if self.state.error is not None:
            raise DemoError(f"a background part failed: {self.state.error}") from self.state.error
        for name, q in list(self.queries.items()):
            exc = q.exception()
            if exc is not None and not self._restart_if_transient(name, exc):
                raise DemoError(f"the {name} query failed: {exc}")
        for w in self.workers:
            if w.failure is not None:
                raise DemoError(f"a worker failed: {w.failure}")
        if self.serving is not None:
            self.serving.check()
        if time.monotonic() - self.t0 > self.opts.timeout:
            raise DemoError(
                f"the demo did not finish within {self.opts.timeout:.0f} s (phase: {self.state.phase})"
            )

    def _wait(self, what: str, cond: Callable[[], bool], tick: Callable[[], None]) -> None:
        self.state.phase = what
        while not cond():
            self._check()
            tick()
            time.sleep(0.5)

    def _scalar(self, name: str, *args: Any) -> Any:
        with self.client.connection() as conn:
            row = conn.execute(_sql.q(name, self.topo.schema), args).fetchone()
        return None if row is None else row[0]

    def examples_final_through(self, t: datetime) -> bool:
        """Whether the join pipeline has emitted every example before ``t`` (an unclicked impression at or
        after ``t`` was emitted, and those are emitted in event-time order by the watermark)."""
        last = self._scalar("max_negative_ts")
        return last is not None and last >= t

    def _lag(self, group: str) -> int | None:
        try:
            return sum(s.lag for s in self.client.describe_group(group))
        except pgstreams.GroupNotFound:
            return None

    # -- training ----------------------------------------------------------------------------------------
    def _train(
        self, label: str, train_from: datetime, train_to: datetime, hold_to: datetime
    ) -> dict[str, Any]:
        from .train import train_and_register

        self.state.phase = f"training {label}"
        res = train_and_register(self.spark, self.client, self.topo, train_from, train_to, train_to, hold_to)
        oracle = audit.oracle_auc(self.client, self.topo, train_to, hold_to)
        auc = res.metrics.get("auc")
        entry = {
            "label": label,
            "model_id": res.model_id,
            "promoted": res.promoted,
            "decision": res.decision,
            "train_range": f"{_hm(self.start, train_from)}-{_hm(self.start, train_to)}",
            "holdout_range": f"{_hm(self.start, train_to)}-{_hm(self.start, hold_to)}",
            "auc": auc,
            "oracle_auc": oracle["auc"],
            "gap": None if auc is None or oracle["auc"] is None else oracle["auc"] - auc,
            "log_loss": res.metrics.get("log_loss"),
            "calibration": res.metrics.get("calibration"),
            "reliability": res.metrics.get("reliability"),
            "deployed_auc_on_holdout": (res.deployed_metrics or {}).get("auc"),
            "rows": res.metrics.get("rows"),
            "seconds": res.seconds,
        }
        self.state.models.append(entry)
        if res.promoted:
            self.state.deployments.append((self._sim_now(), res.model_id))
        return entry

    def _sim_now(self) -> datetime:
        return self.start + timedelta(seconds=self.sim.stats.sim_seconds)

    # -- running -----------------------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        """Run the demo; return the summary (also written to ``<reports>/summary.json``)."""
        from .sparkutil import spark_session

        opts = self.opts
        self.console.print(
            "[bold]pgstreams demo[/bold]: connecting to PostgreSQL"
            + (" (embedded server)" if not opts.dsn else "")
        )
        self.client = pgstreams.connect(opts.dsn)
        self.tmp = Path(tempfile.mkdtemp(prefix="pgstreams-demo-"))
        try:
            setup(self.client, self.topo, reset=True)
            self.sim = Simulator(self.client, self.sim_config, self.topo)
            if opts.serving_mode == "processes":
                self._start_serving()
            self.console.print("starting Spark ...")
            self.spark = spark_session(
                opts.master,
                shuffle_partitions=opts.partitions,
                conf={
                    "spark.sql.streaming.numRecentProgressUpdates": "100000",
                    "spark.scheduler.mode": "FAIR",
                    **checkpoint_conf(self._checkpoints()),
                },
            )
            return self._run()
        finally:
            self.stop.set()
            self.sim_stop()
            for q in self.queries.values():
                try:
                    q.stop()
                except Exception:
                    log.exception("stopping a query")
            for w in self.workers:
                w.stop(10)
            if self.serving is not None:
                self.serving.stop()
            self.client.close()
            shutil.rmtree(self.tmp, ignore_errors=True)

    def _checkpoints(self) -> str:
        return self.opts.checkpoints.rstrip("/") if self.opts.checkpoints else str(self.tmp / "checkpoints")

    def _start_serving(self) -> None:
        """Start the serving path in processes of its own (:class:`serving.ServingPath`), then lower the CPU
        priority of this process's threads (the simulator, the enrichment worker and the Spark application
        started next inherit it), so that the serving path gets the CPU first."""
        opts = self.opts
        self.console.print("starting the serving path (clean query, scorers) in processes of its own ...")
        # its own local application, whatever the others' master
        master = opts.master if opts.master and opts.master.startswith("local") else "local[2]"
        self.serving = ServingPath(
            self.client.dsn,
            self.topo,
            self.tmp / "serving",
            checkpoint=f"{self._checkpoints()}/clean",
            scorers=opts.scorers,
            trigger=opts.clean_trigger,
            master=master,
            max_events_per_trigger=opts.max_events_per_trigger,
        )
        self.serving.start()
        lower_priority(os.getpid(), opts.background_nice)

    def sim_stop(self) -> None:
        """Stop the simulator (and release its gates)."""
        if hasattr(self, "sim"):
            self.sim.stop()
        self.gate_v1.set()
        self.gate_v2.set()

    def _start_parts(self) -> None:
        from .clean import build_clean_query
        from .enrichment import enrichment_worker
        from .join import build_join_query
        from .monitor import build_monitor_query
        from .scoring import scorer_worker

        opts, dsn, topo = self.opts, self.client.dsn, self.topo
        w, self.enrich_counts = enrichment_worker(self.client, topo)
        self.workers.append(w)
        for _ in range(opts.scorers if self.serving is None else 0):
            sw, sc = scorer_worker(self.client, topo)
            self.workers.append(sw)
            self.scorers.append(sc)
        for w in self.workers:
            w.start()
        ck = self._checkpoints()
        mept = opts.max_events_per_trigger
        spark = self.spark

        def clean() -> Any:
            context = spark.sparkContext
            # a query's jobs run in the scheduler pool set in the thread that starts it
            context.setLocalProperty("spark.scheduler.pool", SERVING_POOL)
            try:
                return build_clean_query(
                    spark, dsn, topo, f"{ck}/clean", trigger=opts.clean_trigger, max_events_per_trigger=mept
                )
            finally:
                context.setLocalProperty("spark.scheduler.pool", None)  # type: ignore[arg-type]

        self.builders = {
            "clean": clean,
            "join": lambda: build_join_query(
                spark, dsn, topo, f"{ck}/join", trigger=opts.trigger, max_events_per_trigger=mept
            ),
            "monitor": lambda: build_monitor_query(
                spark,
                dsn,
                topo,
                f"{ck}/monitor",
                trigger=opts.trigger,
                window=f"{opts.window_seconds} seconds",
                max_events_per_trigger=mept,
            ),
        }
        if self.serving is not None:
            del self.builders["clean"]  # it runs in the serving path's own process
            self.serving.wait_running(300)
        else:
            # the serving path's Python workers start before any impression arrives
            warm_python_workers(self.spark, dsn, topo.pgstreams_schema, pool=SERVING_POOL)
        for name in self.builders:
            self._start_query(name)

    def _start_query(self, name: str) -> None:
        """Start query ``name`` and wait until it is past initialising its sources, so that the queries'
        Python planner processes start one after the other (each must connect back to Spark within a
        fixed few seconds, which several starting at once on a loaded machine can miss); a transient
        failure restarts it (:meth:`_restart_if_transient`)."""
        self.queries[name] = self.builders[name]()
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            q = self.queries[name]
            exc = q.exception()
            if exc is not None:
                if not self._restart_if_transient(name, exc):
                    raise DemoError(f"the {name} query failed: {exc}")
                continue
            if q.lastProgress is not None or q.status.get("message") != "Initializing sources":
                return
            time.sleep(0.2)

    def _restart_if_transient(self, name: str, exc: Any) -> bool:
        """Restart query ``name`` (from its checkpoint) when it died of a transient Spark start-up failure
        (:data:`sparkutil.TRANSIENT_QUERY_FAILURES`), at most :data:`sparkutil.QUERY_RESTARTS` times; return
        whether it did."""
        text = str(exc)
        if self.restarts.get(name, 0) >= QUERY_RESTARTS or not is_transient(exc):
            return False
        self.restarts[name] = self.restarts.get(name, 0) + 1
        log.warning("restarting the %s query after: %s", name, text.splitlines()[0])
        self.queries[name].stop()
        self.queries[name] = self.builders[name]()
        return True

    def _run(self) -> dict[str, Any]:
        opts, d = self.opts, self.opts.duration
        drift_at = self.sim_config.drift_time
        watch_from = drift_at or self.at(0.5)
        win = timedelta(seconds=opts.window_seconds)
        # how far event time must pass a moment before all up to it is final in the join and the monitor
        settle = timedelta(minutes=12)
        ahead = timedelta(seconds=0.15 * d)
        v1_train_to, v1_hold_to = self.at(0.25), self.at(0.375)
        # the monitor gets 4 windows after the change to flag it; without a flag the retrain is scheduled
        give_up = watch_from + 4 * win + settle

        def throttle(offset: float) -> bool:
            """Whether simulated time may pass ``offset``: the story's gates, and at most 15% of the run ahead
            of the final examples and of the monitor."""
            now = self.start + timedelta(seconds=offset)
            st = self.state
            if not self.gate_v1.is_set() and now >= v1_hold_to + settle:
                return False  # model v1 serves before the drift
            if not self.gate_v2.is_set():
                if st.retrain_hold_to is not None and now >= st.retrain_hold_to + settle:
                    return False  # the retrained model is decided before the run ends
                if st.retrain_hold_to is None and now >= give_up + ahead:
                    return False  # the monitor decides (flag or not) first
            try:
                final = self._scalar("max_negative_ts")
                if offset > 0.2 * d and (final is None or final < now - ahead):
                    return False
                if st.deployments and now > st.deployments[0][0] + 2 * ahead:
                    horizon = self._scalar("max_partial_ts")
                    return horizon is not None and horizon >= now - ahead
            except Exception:
                log.exception("throttle")
            return True

        def sim_main() -> None:
            try:
                self.sim.run(throttle=throttle)
            except BaseException as exc:  # noqa: BLE001 - reported by the main loop
                self.state.error = exc

        self._start_parts()
        sim_thread = threading.Thread(target=sim_main, name="pgstreams-demo-sim", daemon=True)
        sim_thread.start()
        progress = Progress(
            TextColumn("{task.description:<34}"),
            BarColumn(),
            TaskProgressColumn(),
            TextColumn("{task.fields[info]}"),
            TimeElapsedColumn(),
            console=self.console,
            disable=not opts.progress,
            transient=False,
        )
        tasks = {
            "sim": progress.add_task("simulator (simulated time)", total=d, info=""),
            "clean": progress.add_task("clean pipeline (raw records)", total=1, info=""),
            "join": progress.add_task("join pipeline (examples)", total=1, info=""),
            "score": progress.add_task("scoring workers (impressions)", total=1, info=""),
            "monitor": progress.add_task(
                "monitoring (windows)", total=opts.duration / opts.window_seconds, info=""
            ),
            "phase": progress.add_task("phase", total=None, info=""),
        }

        def tick() -> None:
            self._update_progress(progress, tasks)

        with progress:
            # 1. model v1
            self._wait(
                "waiting for examples up to the v1 holdout end",
                lambda: self.examples_final_through(v1_hold_to) or self.sim.stats.done,
                tick,
            )
            self._train("v1", self.start, v1_train_to, v1_hold_to)
            self.gate_v1.set()

            # 2. drift, detection, retrain
            def flagged() -> bool:
                first = self._scalar("first_degraded", watch_from - win)
                if first is not None:
                    self.state.flagged_window = first
                    return True
                horizon = self._scalar("max_partial_ts")
                return (horizon is not None and horizon >= give_up) or self.sim.stats.done

            self._wait("watching the deployed model", flagged, tick)
            self.state.retrain_from = self.state.flagged_window or watch_from
            r_train_to = self.state.retrain_from + timedelta(seconds=0.1875 * d)
            self.state.retrain_hold_to = r_hold_to = r_train_to + timedelta(seconds=0.083 * d)
            self._wait(
                "waiting for post-change examples",
                lambda: self.examples_final_through(r_hold_to) or self.sim.stats.done,
                tick,
            )
            self._train("retrain", self.state.retrain_from, r_train_to, r_hold_to)
            self.gate_v2.set()
            # 3. finish
            self._wait("simulator finishing", lambda: self.sim.stats.done, tick)
            self._drain(tick)
            self.state.phase = "summary"
            tick()
        return self._summarise()

    def _drain(self, tick: Callable[[], None]) -> None:
        """Wait until every group (the workers' and the Spark queries' mirrored progress) has no lag and every
        query saw no new data three polls in a row. The lag counts every committed event, so a query whose
        source has not yet been let past an event (the visibility fence) still counts as busy."""
        groups = self.topo.groups
        quiet = [0]

        def drained() -> bool:
            busy = any(self._lag(g) not in (0, None) for g in groups)
            for q in self.queries.values():
                prog = q.lastProgress
                if prog is None or prog.get("numInputRows", 0) > 0 or q.status.get("isDataAvailable"):
                    busy = True
            if self.serving is not None:
                # the clean process: its group's lag (checked above) is 0 once every raw event was
                # processed and committed; and its source must see nothing more
                st = self.serving.status()
                if st is None or st.last_input_rows is None or st.data_available:
                    busy = True
            quiet[0] = 0 if busy else quiet[0] + 1
            return quiet[0] >= 3

        self._wait("draining the pipelines", drained, tick)

    def _update_progress(self, progress: Progress, tasks: dict[str, Any]) -> None:
        s = self.sim.stats
        progress.update(
            tasks["sim"],
            completed=s.sim_seconds,
            info=f"{s.raw_records:,} raw, {s.updates:,} updates" + (" [paused]" if s.paused else ""),
        )
        lag = self._lag(self.topo.clean_group)
        done = s.raw_records - lag if lag is not None else self._query_rows("clean")
        progress.update(
            tasks["clean"],
            total=max(1, s.raw_records),
            completed=min(done, s.raw_records),
            info=f"lag {lag if lag is not None else '?'}",
        )
        n_ex = self._scalar("count_examples") or 0
        progress.update(
            tasks["join"],
            total=max(1, s.impressions),
            completed=min(n_ex, s.impressions),
            info=f"{n_ex:,} examples",
        )
        if self.serving is None:
            scored = sum(sc.counts["scored"] for sc in self.scorers)
            skipped = sum(sc.counts["no_model"] for sc in self.scorers)
            progress.update(
                tasks["score"],
                total=max(1, s.impressions),
                completed=min(scored + skipped, s.impressions),
                info=f"{scored:,} scored, {skipped:,} before a model",
            )
        else:  # the scorers run in processes of their own: the predictions they published
            predicted = self.client.describe_topic(self.topo.predictions_topic).events
            progress.update(
                tasks["score"],
                total=max(1, s.impressions),
                completed=min(predicted, s.impressions),
                info=f"{predicted:,} predictions, lag {self._lag(self.topo.scorer_group)}",
            )
        wins = self._scalar("count_complete_windows") or 0
        flagged = self._scalar("count_degraded") or 0
        progress.update(tasks["monitor"], completed=wins, info=f"{flagged} flagged degraded")
        progress.update(
            tasks["phase"],
            description=f"phase: {self.state.phase}"[:34],
            info=", ".join(
                f"{m['label']}: model {m['model_id']} {'deployed' if m['promoted'] else 'rejected'}"
                for m in self.state.models
            ),
        )

    def _query_rows(self, name: str) -> int:
        q = self.queries.get(name)
        if q is None:
            st = self.serving.status() if self.serving is not None and name == "clean" else None
            return st.rows if st is not None else 0
        return sum(int(p.get("numInputRows", 0)) for p in q.recentProgress)

    # -- summary -----------------------------------------------------------------------------------------
    def _summarise(self) -> dict[str, Any]:
        from . import registry

        opts, topo, client = self.opts, self.topo, self.client
        summary: dict[str, Any] = {"options": {k: str(v) for k, v in asdict(opts).items()}}
        summary["events"] = {t: client.describe_topic(t).events for t in topo.topics}
        rec = audit.reconcile(client, topo)
        summary["reconciliation"] = asdict(rec) | {"ok": rec.ok}
        pipes: dict[str, Any] = {}
        st = self.serving.status() if self.serving is not None else None
        if st is not None:
            pipes["clean"] = {
                "kind": "Spark streaming (own process)",
                "rows": st.rows,
                "seconds": st.busy_seconds,
                "rows_per_s": st.rows / st.busy_seconds if st.busy_seconds else None,
                "lag": self._lag(topo.clean_group),
                "batches": st.batches,
            }
        for name, q in self.queries.items():
            progs = q.recentProgress
            rows = sum(int(p.get("numInputRows", 0)) for p in progs)
            secs = sum(float(p.get("durationMs", {}).get("triggerExecution", 0)) for p in progs) / 1000.0
            group = {"clean": topo.clean_group, "join": topo.join_group, "monitor": topo.monitor_group}[name]
            pipes[name] = {
                "kind": "Spark streaming",
                "rows": rows,
                "seconds": secs,
                "rows_per_s": rows / secs if secs else None,
                "lag": self._lag(group),
                "batches": len(progs),
            }
        wstats = [w.stats.snapshot() for w in self.workers]
        if self.serving is None:
            scored = sum(sc.counts["scored"] for sc in self.scorers)
            scorer_rows = sum(w.get("events", 0) for w in wstats[1:])
        else:  # the scorer processes: what their group committed, and what they published
            scored = summary["events"][topo.predictions_topic]
            scorer_rows = summary["events"][topo.clean_topic] - (self._lag(topo.scorer_group) or 0)
        pipes["enrichment"] = {
            "kind": "worker group",
            "rows": wstats[0].get("events", 0),
            "seconds": None,
            "rows_per_s": None,
            "lag": self._lag(topo.enrichment_group),
        }
        pipes["scoring"] = {
            "kind": f"worker group x{opts.scorers}" + (" (own processes)" if self.serving else ""),
            "rows": scorer_rows,
            "seconds": None,
            "rows_per_s": None,
            "lag": self._lag(topo.scorer_group),
            "predictions": scored,
        }
        summary["pipelines"] = pipes
        with client.connection() as conn:
            records = {r.model_id: r for r in registry.list_models(conn, topo.schema)}
        models = []
        for m in self.state.models:
            rec_m = records.get(m["model_id"])
            models.append(
                {k: v for k, v in m.items() if k != "reliability"}
                | {"status": rec_m.status if rec_m else "?"}
            )
        summary["models"] = models
        online = []
        drift_time = self.sim_config.drift_time
        for mid in sorted({m["model_id"] for m in self.state.models if m["promoted"]}):
            online.append({"model_id": mid, "period": "all"} | audit.online_vs_oracle(client, topo, mid))
            if drift_time is not None:
                for period, lo, hi in (("before drift", None, drift_time), ("after drift", drift_time, None)):
                    o = audit.online_vs_oracle(client, topo, mid, lo, hi)
                    if o["rows"]:
                        online.append({"model_id": mid, "period": period} | o)
        summary["online"] = online
        with client.connection() as conn:
            cur = conn.execute(_sql.q("online_metrics", topo.schema))
            cols = [c.name for c in cur.description or ()]
            metrics = [dict(zip(cols, r, strict=True)) for r in cur.fetchall()]
        drift_at = self.sim_config.drift_time
        win = timedelta(seconds=opts.window_seconds)
        false_alarms = sum(
            1
            for m in metrics
            if m["complete"] and m["degraded"] and (drift_at is None or m["window_end"] <= drift_at)
        )
        flagged = self.state.flagged_window
        after = None
        if flagged is not None and drift_at is not None:
            change_window = self.start + win * ((drift_at - self.start) // win)
            after = int((flagged - change_window) // win)
        summary["drift"] = {
            "injected_at": drift_at.isoformat() if drift_at else None,
            "detected": flagged is not None and drift_at is not None,
            "flagged_window": flagged.isoformat() if flagged else None,
            "windows_after_change": after,
            "false_alarms": false_alarms,
        }
        summary["serving"] = {
            "mode": opts.serving_mode,
            "background_nice": opts.background_nice if self.serving is not None else 0,
        }
        if st is not None and st.batches:
            summary["serving"]["clean_batch_ms"] = {
                k: round(v / st.batches, 1) for k, v in sorted(st.phases_ms.items())
            }
            summary["serving"]["clean_rows_per_batch"] = round(st.rows / st.batches, 1)
        summary["quality"] = self._quality(summary)
        lat = latency.measure(client, topo)
        summary["latency"] = lat.to_json()
        oracle = audit.oracle_by_window(client, topo)
        plots = [
            report.plot_online(
                metrics,
                oracle,
                self.start,
                drift_at,
                self.state.deployments,
                opts.reports / "online_metrics.png",
            ),
            report.plot_reliability(self.state.models, opts.reports / "calibration.png"),
            report.plot_latency(lat.samples, opts.reports / "latency.png"),
        ]
        summary["plots"] = [str(p) for p in plots]
        summary["windows"] = [
            {k: (v.isoformat() if isinstance(v, datetime) else v) for k, v in m.items()}
            | {"oracle_auc": oracle.get((m["window_start"], m["model_id"]))}
            for m in metrics
        ]
        summary["wall_seconds"] = time.monotonic() - self.t0
        opts.reports.mkdir(parents=True, exist_ok=True)
        (opts.reports / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
        return summary

    def _quality(self, summary: dict[str, Any]) -> dict[str, dict[str, Any]]:
        q: dict[str, dict[str, Any]] = {}
        rec = summary["reconciliation"]
        q["clean counts reconcile exactly"] = {
            "ok": rec["ok"],
            "value": "exact" if rec["ok"] else "; ".join(rec["problems"]),
        }
        first = self.state.models[0] if self.state.models else None
        gap1 = first["gap"] if first else None
        q["v1 holdout AUC within 0.03 of oracle"] = {
            "ok": gap1 is not None and abs(gap1) <= 0.03,
            "value": _gap_text(first),
        }
        if self.sim_config.drift_at is not None:
            after = summary["drift"]["windows_after_change"]
            q["drift flagged within 3 windows"] = {
                "ok": after is not None and 0 <= after <= 3,
                "value": "not flagged" if after is None else f"{after} window(s)",
            }
            re = self.state.models[-1] if len(self.state.models) > 1 else None
            q["retrained AUC within 0.03 of new oracle"] = {
                "ok": re is not None and re["gap"] is not None and abs(re["gap"]) <= 0.03 and re["promoted"],
                "value": _gap_text(re) + ("" if re is None or re["promoted"] else " (not deployed)"),
            }
        return q


def _gap_text(m: dict[str, Any] | None) -> str:
    if m is None or m.get("auc") is None or m.get("oracle_auc") is None:
        return "no model"
    return f"model {m['auc']:.3f} vs oracle {m['oracle_auc']:.3f}"


def _hm(start: datetime, t: datetime) -> str:
    s = int((t - start).total_seconds())
    return f"{s // 3600}h{(s % 3600) // 60:02d}"


def run_demo(opts: DemoOptions, console: Console | None = None) -> dict[str, Any]:
    """Run the demo with ``opts``, print the summary, and return it. With the serving path in processes of
    its own (``opts.serving_mode == "processes"``), the calling process's threads are left at a lower CPU
    priority (``opts.background_nice``): run it in a process of its own, as ``pgstreams demo`` does."""
    console = console or Console()
    demo = Demo(opts, console)
    summary = demo.run()
    report.print_summary(summary, console)
    return summary
