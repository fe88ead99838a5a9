"""The demo's orchestration (:class:`Demo`): the simulator, the workers and the Spark queries started and
watched, the gates of the story (train, deploy, drift, retrain), and the drain before the summary."""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from rich.console import Console

import pgstreams

from .. import _sql, audit, report
from ..clean import build_clean_query
from ..config import Topology, setup
from ..enrichment import enrichment_worker
from ..join import build_join_query
from ..monitor import build_monitor_query
from ..scoring import scorer_worker
from ..serving import ServingPath, lower_priority, warm_python_workers
from ..simulator import SimConfig, Simulator
from ..sparkutil import QUERY_RESTARTS, checkpoint_conf, is_transient, spark_session
from ..train import train_and_register
from .options import SERVING_POOL, DemoError, DemoOptions
from .progress import DemoProgress
from .summary import summarise

log = logging.getLogger(__name__)


@dataclass
class DemoState:
    """What a run has done so far: its phase, the models trained (and deployed when), the window the
    monitor flagged, the retrain's range, and the failure of a background part."""

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
        self.state = DemoState()
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

    def scalar(self, name: str, *args: Any) -> Any:
        """The one value of the application's named query ``name`` with ``args`` (``None`` without a row)."""
        with self.client.connection() as conn:
            row = conn.execute(_sql.q(name, self.topo.schema), args).fetchone()
        return None if row is None else row[0]

    def examples_final_through(self, t: datetime) -> bool:
        """Whether the join pipeline has emitted every example before ``t`` (an unclicked impression at or
        after ``t`` was emitted, and those are emitted in event-time order by the watermark)."""
        last = self.scalar("max_negative_ts")
        return last is not None and last >= t

    def lag(self, group: str) -> int | None:
        """The events committed to ``group``'s topics that it has not processed (``None``: no such group)."""
        try:
            return sum(s.lag for s in self.client.describe_group(group))
        except pgstreams.GroupNotFound:
            return None

    # -- training ----------------------------------------------------------------------------------------
    def _train(
        self, label: str, train_from: datetime, train_to: datetime, hold_to: datetime
    ) -> dict[str, Any]:
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
                final = self.scalar("max_negative_ts")
                if offset > 0.2 * d and (final is None or final < now - ahead):
                    return False
                if st.deployments and now > st.deployments[0][0] + 2 * ahead:
                    horizon = self.scalar("max_partial_ts")
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
        progress = DemoProgress(self)
        tick = progress.tick

        with progress.bars:
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
                first = self.scalar("first_degraded", watch_from - win)
                if first is not None:
                    self.state.flagged_window = first
                    return True
                horizon = self.scalar("max_partial_ts")
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
        return summarise(self)

    def _drain(self, tick: Callable[[], None]) -> None:
        """Wait until every group (the workers' and the Spark queries' mirrored progress) has no lag and every
        query saw no new data three polls in a row. The lag counts every committed event, so a query whose
        source has not yet been let past an event (the visibility fence) still counts as busy."""
        groups = self.topo.groups
        quiet = [0]

        def drained() -> bool:
            busy = any(self.lag(g) not in (0, None) for g in groups)
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
