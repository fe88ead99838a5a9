"""Command line of the ML application: ``pgstreams demo`` and ``pgstreams sim`` (added to the core command
line by :func:`add_commands`, the package's ``pgstreams.commands`` entry point), and every part on its own
with ``python -m pgstreams_ml PART``:

``sim``, ``enrich`` and ``score`` (worker groups; start several ``score`` processes to share the
partitions), ``clean``, ``join`` and ``monitor`` (Spark queries; ``--trigger availableNow`` processes what is
there and stops), ``train`` (one training run over given time ranges) and ``demo`` (all of it).

The ``pgstreams.commands`` entry point imports this module at every start of the core ``pgstreams`` command
line, so each command imports the modules that do its work (the simulator, the Spark pipelines, the demo,
rich) when it runs: imported here they would add about a quarter (0.14 s or more) to that start.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import sys
import threading
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Annotated, Any

import typer

import pgstreams
from pgstreams.cli import run_app
from pgstreams.errors import ConfigurationError, InvalidArgument

from ._util import parse_duration
from .config import Topology, setup
from .events import parse_ts

app = typer.Typer(
    name="pgstreams",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    help="The ML reference application of pgstreams.",
)

DsnOption = Annotated[
    str | None,
    typer.Option(
        "--dsn",
        help="PostgreSQL DSN. Default: $PGSTREAMS_DSN, else the embedded PostgreSQL.",
        show_default=False,
    ),
]
PartitionsOption = Annotated[int, typer.Option("--partitions", min=1, help="Partitions of each topic.")]
TriggerOption = Annotated[
    str,
    typer.Option("--trigger", help="Spark trigger: availableNow, once, or an interval such as '2 seconds'."),
]
CheckpointOption = Annotated[
    Path, typer.Option("--checkpoint", help="Spark checkpoint directory of the query.")
]


def _need(*modules: str) -> None:
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        raise ConfigurationError(
            f"missing {', '.join(missing)}: install the ML extra (pip install 'pgstreams[ml]')"
        )


def _topology(partitions: int) -> Topology:
    return Topology(partitions=partitions)


ExitWithParentOption = Annotated[
    bool,
    typer.Option(
        "--exit-with-parent",
        help="Stop (cleanly) when the process that started this one ends (as the demo's serving "
        "processes do).",
    ),
]


def _until_signal(exit_with_parent: bool = False) -> threading.Event:
    """An event set on SIGINT or SIGTERM and, with ``exit_with_parent``, when the parent process ends."""
    stop = threading.Event()
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
    if exit_with_parent:
        parent = os.getppid()

        def watch() -> None:
            while not stop.wait(0.5):
                if os.getppid() != parent:
                    stop.set()

        threading.Thread(target=watch, name="pgstreams-ml-parent-watch", daemon=True).start()
    return stop


@app.command("demo")
def demo_command(
    dsn: DsnOption = None,
    reports: Annotated[
        Path, typer.Option("--reports", help="Folder for summary.json and the PNG plots.")
    ] = Path("reports"),
    seed: Annotated[int, typer.Option("--seed", help="Random seed of the simulator.")] = 7,
    duration: Annotated[str, typer.Option("--duration", help="Simulated duration (e.g. 4h, 90m).")] = "4h",
    rate: Annotated[float, typer.Option("--rate", min=0.01, help="Impressions per simulated second.")] = 4.0,
    speed: Annotated[
        float,
        typer.Option("--speed", min=0.0, help="Simulated seconds per wall second (0: as fast as possible)."),
    ] = 240.0,
    drift: Annotated[
        bool, typer.Option("--drift/--no-drift", help="Change the ground truth at half time.")
    ] = True,
    users: Annotated[int, typer.Option("--users", min=1, help="Simulated users.")] = 2000,
    ads: Annotated[int, typer.Option("--ads", min=1, help="Simulated ads.")] = 200,
    partitions: PartitionsOption = 2,
    scorers: Annotated[int, typer.Option("--scorers", min=1, help="Scoring workers (group members).")] = 1,
    window: Annotated[
        str | None,
        typer.Option(
            "--window", help="Monitoring window, e.g. '15 minutes' (default: a sixteenth of the duration)."
        ),
    ] = None,
    trigger: Annotated[
        str, typer.Option("--trigger", help="Spark trigger interval of the join and monitor queries.")
    ] = "2 seconds",
    clean_trigger: Annotated[
        str,
        typer.Option(
            "--clean-trigger",
            help="Spark trigger interval of the clean query (on the serving path; 0 seconds: each "
            "micro-batch starts as soon as the previous one ended).",
        ),
    ] = "0 seconds",
    master: Annotated[
        str | None,
        typer.Option("--master", help="Spark master URL, e.g. spark://HOST:7077 (default local[2])."),
    ] = None,
    checkpoints: Annotated[
        str | None,
        typer.Option(
            "--checkpoints",
            help="Where the Spark queries keep their checkpoints (default: a temporary folder); on a "
            "cluster of several machines, a location every executor reaches (hdfs://..., a shared mount).",
        ),
    ] = None,
    max_events: Annotated[
        int, typer.Option("--max-events-per-trigger", min=1, help="Spark admission control per micro-batch.")
    ] = 20000,
    serving: Annotated[
        str,
        typer.Option(
            "--serving",
            help="Where the serving path (clean query, scorers) runs: 'processes' (processes of its own, "
            "the other parts at lower CPU priority), 'session' (the demo's Spark session) or 'auto' "
            "(processes with a local master, else session).",
        ),
    ] = "auto",
    background_nice: Annotated[
        int,
        typer.Option(
            "--background-nice",
            min=0,
            max=19,
            help="With the serving path in processes of its own: how much to lower the CPU priority of "
            "the other parts (0: not at all).",
        ),
    ] = 10,
    timeout: Annotated[
        float, typer.Option("--timeout", min=1, help="Give up after this many seconds.")
    ] = 900.0,
    progress: Annotated[bool, typer.Option("--progress/--no-progress", help="Show progress bars.")] = True,
    strict: Annotated[
        bool, typer.Option("--strict", help="Exit with code 3 when a quality bar fails.")
    ] = False,
) -> None:
    """Run the whole ML system: simulator, enrichment, clean/join/monitor Spark pipelines, training, model
    registry, online scoring; print the summary and write plots to the reports folder."""
    _need("pyspark", "pyarrow", "numpy", "matplotlib")
    from .demo import CLEAN_TRIGGER, DemoOptions, run_demo

    opts = DemoOptions(
        dsn=dsn,
        reports=reports,
        seed=seed,
        duration=parse_duration(duration, "--duration"),
        rate=rate,
        speed=speed,
        drift=drift,
        users=users,
        ads=ads,
        partitions=partitions,
        scorers=scorers,
        window=window,
        trigger=trigger,
        clean_trigger=clean_trigger or CLEAN_TRIGGER,
        master=master,
        checkpoints=checkpoints,
        max_events_per_trigger=max_events,
        serving=serving,
        background_nice=background_nice,
        timeout=timeout,
        progress=progress,
    )
    from rich.console import Console

    console = Console(highlight=False)
    if not console.is_terminal:
        console = Console(highlight=False, width=140)
    summary = run_demo(opts, console)
    if strict and not all(q["ok"] for q in summary["quality"].values()):
        raise typer.Exit(3)


@app.command("sim")
def sim_command(
    dsn: DsnOption = None,
    seed: Annotated[int, typer.Option("--seed", help="Random seed.")] = 7,
    duration: Annotated[str, typer.Option("--duration", help="Simulated duration (e.g. 4h, 90m).")] = "1h",
    rate: Annotated[float, typer.Option("--rate", min=0.01, help="Impressions per simulated second.")] = 4.0,
    speed: Annotated[
        float,
        typer.Option("--speed", min=0.0, help="Simulated seconds per wall second (0: as fast as possible)."),
    ] = 1.0,
    drift_at: Annotated[
        str | None,
        typer.Option("--drift-at", help="Switch the ground truth this long after the start (e.g. 30m)."),
    ] = None,
    users: Annotated[int, typer.Option("--users", min=1)] = 2000,
    ads: Annotated[int, typer.Option("--ads", min=1)] = 200,
    malformed: Annotated[
        float, typer.Option("--malformed", min=0, max=1, help="Share of malformed records.")
    ] = 0.01,
    duplicates: Annotated[float, typer.Option("--duplicates", min=0, max=1, help="Share sent twice.")] = 0.02,
    late: Annotated[float, typer.Option("--late", min=0, max=1, help="Share published late.")] = 0.03,
    start: Annotated[
        str | None,
        typer.Option("--start", help="Simulated start, ISO 8601 with a zone (default 2025-03-09T06:00Z)."),
    ] = None,
    partitions: PartitionsOption = 4,
    reset: Annotated[
        bool, typer.Option("--reset", help="Delete the application's topics and tables first.")
    ] = False,
) -> None:
    """Run the event simulator: impressions, clicks and conversions (with malformed records, duplicates, late
    events and Chicago-clock timestamps) to ml.raw, profile and catalogue updates to ml.updates."""
    from .simulator import DEFAULT_START, SimConfig, Simulator

    t0 = DEFAULT_START
    if start:
        parsed = parse_ts(start) or _parse_iso(start)
        if parsed is None:
            raise InvalidArgument(f"--start must be an ISO 8601 time with a zone, got {start!r}")
        t0 = parsed
    cfg = SimConfig(
        seed=seed,
        duration=parse_duration(duration, "--duration"),
        rate=rate,
        speed=speed,
        drift_at=None if drift_at is None else parse_duration(drift_at, "--drift-at"),
        users=users,
        ads=ads,
        malformed_rate=malformed,
        duplicate_rate=duplicates,
        late_rate=late,
        start=t0,
    )
    from rich.console import Console

    topo = _topology(partitions)
    console = Console(stderr=True, highlight=False)
    with pgstreams.connect(dsn) as client:
        setup(client, topo, reset=reset)
        sim = Simulator(client, cfg, topo)
        stop = _until_signal()

        def stopper() -> None:
            stop.wait()
            sim.stop()

        threading.Thread(target=stopper, daemon=True).start()
        last = [0.0]

        def on_tick(s: Any) -> None:
            if s.sim_seconds - last[0] >= 600 or s.done:
                last[0] = s.sim_seconds
                console.print(
                    f"simulated {timedelta(seconds=int(s.sim_seconds))}: {s.impressions:,} impressions, "
                    f"{s.clicks:,} clicks, {s.raw_records:,} raw records, {s.updates:,} updates"
                )

        stats = sim.run(on_tick=on_tick)
        stop.set()
    sys.stdout.write(
        json.dumps(
            {
                "impressions": stats.impressions,
                "clicks": stats.clicks,
                "conversions": stats.conversions,
                "raw_records": stats.raw_records,
                "updates": stats.updates,
                "malformed": stats.malformed,
                "duplicates": stats.duplicates,
                "late": stats.late,
            }
        )
        + "\n"
    )


def _parse_iso(text: str) -> datetime | None:
    try:
        t = datetime.fromisoformat(text)
    except ValueError:
        return None
    return t.astimezone(timezone.utc) if t.tzinfo else None


@app.command("enrich")
def enrich_command(dsn: DsnOption = None, partitions: PartitionsOption = 4) -> None:
    """Run an enrichment worker (group ml-enrichment) until SIGINT/SIGTERM."""
    from .enrichment import run_enrichment

    topo = _topology(partitions)
    with pgstreams.connect(dsn) as client:
        setup(client, topo)
        counts = run_enrichment(client, topo, _until_signal())
    sys.stdout.write(json.dumps(dict(counts)) + "\n")


@app.command("score")
def score_command(
    dsn: DsnOption = None, partitions: PartitionsOption = 4, exit_with_parent: ExitWithParentOption = False
) -> None:
    """Run a scoring worker (group ml-scorer) until SIGINT/SIGTERM; start several to share the partitions.
    Prints the scorer's counts as JSON when it stops."""
    from .scoring import run_scorer

    topo = _topology(partitions)
    with pgstreams.connect(dsn) as client:
        setup(client, topo)
        scorer = run_scorer(client, topo, _until_signal(exit_with_parent))
    sys.stdout.write(json.dumps(dict(scorer.counts)) + "\n")


def _run_query(
    name: str, dsn: str | None, checkpoint: Path, trigger: str, partitions: int, master: str | None
) -> None:
    _need("pyspark", "pyarrow")
    from .sparkutil import spark_session

    topo = _topology(partitions)
    with pgstreams.connect(dsn) as client:
        setup(client, topo)
        spark = spark_session(master)
        from .clean import build_clean_query
        from .join import build_join_query
        from .monitor import build_monitor_query

        build: Any = {"clean": build_clean_query, "join": build_join_query, "monitor": build_monitor_query}[
            name
        ]
        query = build(spark, client.dsn, topo, str(checkpoint), trigger=trigger)
        stop = _until_signal()
        while query.isActive and not stop.is_set():
            query.awaitTermination(1)
        if query.isActive:
            query.stop()
        exc = query.exception()
        if exc is not None:
            raise pgstreams.PgStreamsError(f"the {name} query failed: {exc}")


@app.command("clean")
def clean_command(
    dsn: DsnOption = None,
    checkpoint: CheckpointOption = Path("checkpoints/clean"),
    trigger: TriggerOption = "availableNow",
    partitions: PartitionsOption = 4,
    master: Annotated[str | None, typer.Option("--master")] = None,
    status: Annotated[
        Path | None,
        typer.Option(
            "--status",
            help="Keep the query's progress in this JSON file (state, batches, rows, busy seconds), "
            "rewritten after every micro-batch.",
        ),
    ] = None,
    warm_up: Annotated[
        bool, typer.Option("--warm-up/--no-warm-up", help="Start Spark's Python workers before the query.")
    ] = False,
    max_events: Annotated[
        int | None,
        typer.Option("--max-events-per-trigger", min=1, help="Spark admission control per micro-batch."),
    ] = None,
    exit_with_parent: ExitWithParentOption = False,
) -> None:
    """Run the clean query (ml.raw -> ml.clean + ml.quarantine) until it ends (availableNow, once) or until
    SIGINT/SIGTERM; a transient Spark start-up failure restarts it from its checkpoint."""
    _need("pyspark", "pyarrow")
    from .serving import SERVING_SPARK_CONF, run_clean_service
    from .sparkutil import checkpoint_conf, spark_session

    topo = _topology(partitions)
    with pgstreams.connect(dsn) as client:
        setup(client, topo)
        spark = spark_session(
            master,
            app_name="pgstreams-ml-clean",
            shuffle_partitions=partitions,
            conf={**SERVING_SPARK_CONF, **checkpoint_conf(str(checkpoint))},
        )
        stop = _until_signal(exit_with_parent)
        try:
            st = run_clean_service(
                spark,
                client.dsn,
                topo,
                str(checkpoint),
                trigger=trigger,
                max_events_per_trigger=max_events,
                status_path=status,
                stop=stop,
                warm_up=warm_up,
            )
        finally:
            spark.stop()
    sys.stdout.write(json.dumps({"batches": st.batches, "rows": st.rows, "restarts": st.restarts}) + "\n")


@app.command("join")
def join_command(
    dsn: DsnOption = None,
    checkpoint: CheckpointOption = Path("checkpoints/join"),
    trigger: TriggerOption = "availableNow",
    partitions: PartitionsOption = 4,
    master: Annotated[str | None, typer.Option("--master")] = None,
) -> None:
    """Run the join query (ml.clean -> training_examples)."""
    _run_query("join", dsn, checkpoint, trigger, partitions, master)


@app.command("monitor")
def monitor_command(
    dsn: DsnOption = None,
    checkpoint: CheckpointOption = Path("checkpoints/monitor"),
    trigger: TriggerOption = "availableNow",
    partitions: PartitionsOption = 4,
    master: Annotated[str | None, typer.Option("--master")] = None,
) -> None:
    """Run the monitoring query (ml.predictions + clicks -> online_metrics)."""
    _run_query("monitor", dsn, checkpoint, trigger, partitions, master)


@app.command("train")
def train_command(
    train_from: Annotated[
        str, typer.Option("--train-from", help="Offset from the simulated start, e.g. 0h.")
    ],
    train_to: Annotated[str, typer.Option("--train-to", help="End of the training range (offset).")],
    holdout_to: Annotated[str, typer.Option("--holdout-to", help="End of the holdout range (offset).")],
    dsn: DsnOption = None,
    partitions: PartitionsOption = 4,
    promote: Annotated[
        bool, typer.Option("--promote/--no-promote", help="Deploy if it beats the deployed model.")
    ] = True,
    master: Annotated[str | None, typer.Option("--master")] = None,
) -> None:
    """Train a model on [train-from, train-to), evaluate on [train-to, holdout-to) (offsets from the latest
    simulator run's start), register it and deploy it if it beats the deployed one."""
    _need("pyspark", "pyarrow", "numpy")
    from . import audit
    from .sparkutil import spark_session
    from .train import train_and_register

    topo = _topology(partitions)
    with pgstreams.connect(dsn) as client:
        run = audit.sim_run(client, topo)
        if run is None:
            raise ConfigurationError("no simulator run found: run 'pgstreams sim' first")
        s = run["sim_start"]
        t = [
            s + timedelta(seconds=parse_duration(x, name))
            for x, name in (
                (train_from, "--train-from"),
                (train_to, "--train-to"),
                (holdout_to, "--holdout-to"),
            )
        ]
        res = train_and_register(spark_session(master), client, topo, t[0], t[1], t[1], t[2], promote=promote)
    sys.stdout.write(
        json.dumps(
            {
                "model_id": res.model_id,
                "promoted": res.promoted,
                "decision": res.decision,
                "auc": res.metrics.get("auc"),
                "log_loss": res.metrics.get("log_loss"),
            }
        )
        + "\n"
    )


def add_commands(root: typer.Typer) -> None:
    """Add ``demo`` and ``sim`` to the core ``pgstreams`` command line (the ``pgstreams.commands`` entry
    point of this package). Their work imports Spark and the rest when it runs, so the core command line
    keeps starting without them."""
    root.command(
        "demo",
        short_help="Run the ML reference system end to end on the embedded PostgreSQL (or --dsn); see "
        "'pgstreams demo --help'. Needs the ml extra.",
    )(demo_command)
    root.command(
        "sim",
        short_help="Run the event simulator of the ML reference system; see 'pgstreams sim --help'. Needs "
        "the ml extra.",
    )(sim_command)


def main() -> None:
    """``python -m pgstreams_ml``: run with the core command line's error reporting and exit codes."""
    sys.exit(run_app(app, sys.argv[1:], "python -m pgstreams_ml"))
