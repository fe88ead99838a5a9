"""``pgstreams worker``: run a handler as a member of a stream group or a share group (see
``docs/workers.md`` and ``docs/shares.md``)."""

from __future__ import annotations

import logging
import os
import sys
from typing import Annotated

import typer

from pgstreams.cdc import DEFAULT_MAX_RETAINED
from pgstreams.groups import DEFAULT_HEARTBEAT_INTERVAL, DEFAULT_SESSION_TIMEOUT
from pgstreams.maintenance import DEFAULT_MAINTENANCE_INTERVAL
from pgstreams.metrics.defaults import DEFAULT_METRICS_HOST
from pgstreams.names import check_group, check_topic
from pgstreams.shares import DEFAULT_LOCK_TIMEOUT
from pgstreams.worker import RetryPolicy, SubscriptionOptions, Worker, load_handler

from .common import (
    DEFAULT_SCHEMA,
    TERMINATING,
    DsnOption,
    ListenDsnOption,
    PoolerOption,
    SchemaOption,
    open_client,
    parse_start,
    usage_error,
)
from .output import err_console
from .serving import check_port, load_extra

# The defaults of the subscription and retry options are those of the worker's own configuration values.
_OPTIONS = SubscriptionOptions()
_RETRY = RetryPolicy()


def worker_command(
    handler: Annotated[str, typer.Argument(
        metavar="MODULE:FUNCTION", help="The handler, e.g. myapp.handlers:on_order (MODULE is imported with "
        "the current directory on the path).", show_default=False)],
    topic: Annotated[str, typer.Option("--topic", "-t", help="Topic to consume.", show_default=False)],
    group: Annotated[str | None, typer.Option(
        "--group", "-g", help="Stream group to join (or --share-group).", show_default=False)] = None,
    share_group: Annotated[str | None, typer.Option(
        "--share-group", help="Share group to consume in (instead of --group): every worker reads every "
        "partition, events are acquired one by one.", show_default=False)] = None,
    concurrency: Annotated[int, typer.Option(
        "--concurrency", help="Handlers running at once in this process (share groups only).")
    ] = _OPTIONS.concurrency,
    lock_timeout: Annotated[float | None, typer.Option(
        "--lock-timeout", help="Seconds each event stays locked to this worker (share groups only). Default: "
        f"{DEFAULT_LOCK_TIMEOUT:g}.", show_default=False)] = _OPTIONS.lock_timeout,
    batch: Annotated[bool, typer.Option("--batch", help="Call the handler with a list of events.")] = False,
    min_events: Annotated[int, typer.Option("--min-events", help="Deliver a batch once this many events "
                                            "are at hand.")] = _OPTIONS.min_events,
    max_events: Annotated[int, typer.Option("--max-events", help="Largest batch.")] = _OPTIONS.max_events,
    max_wait: Annotated[float, typer.Option("--max-wait", help="Seconds after which a batch smaller than "
                                            "--min-events is delivered anyway.")] = _OPTIONS.max_wait,
    mode: Annotated[str, typer.Option(
        "--mode", help="at-least-once (commit after the handler) or transactional (the handler gets the "
        "transaction's connection as second argument).", metavar="at-least-once|transactional")
    ] = _OPTIONS.mode,
    max_attempts: Annotated[int, typer.Option("--max-attempts", help="Deliveries of a failing event before "
                                              "it goes to the dead-letter topic.")] = _RETRY.max_attempts,
    backoff: Annotated[float, typer.Option("--backoff", help="Seconds before the first retry (doubling).")
                       ] = _RETRY.backoff,
    max_backoff: Annotated[float, typer.Option("--max-backoff", help="Longest wait between retries.")
                           ] = _RETRY.max_backoff,
    dead_letter: Annotated[str | None, typer.Option(
        "--dead-letter", help="Dead-letter topic. Default: the group's configuration (TOPIC.dlt).",
        show_default=False)] = None,
    no_dead_letter: Annotated[bool, typer.Option(
        "--no-dead-letter", help="No dead-letter topic: retry a failing event forever.")] = False,
    start: Annotated[str, typer.Option(
        "--from", help="Where the group starts on partitions without a checkpoint: earliest, latest or an "
        "ISO 8601 time with a zone.", metavar="earliest|latest|TIME")] = str(_OPTIONS.start),
    heartbeat_interval: Annotated[float | None, typer.Option(
        "--heartbeat-interval", help="Seconds between heartbeats. Default: the group's configuration "
        f"({DEFAULT_HEARTBEAT_INTERVAL:g}).",
        show_default=False)] = None,
    session_timeout: Annotated[float | None, typer.Option(
        "--session-timeout", help="Seconds without heartbeat before this member's partitions move. Default: "
        f"the group's configuration ({DEFAULT_SESSION_TIMEOUT:g}).", show_default=False)] = None,
    maintenance_interval: Annotated[float, typer.Option(
        "--maintenance-interval", help="Seconds between maintenance passes when this worker leads the "
        "database's maintenance (one worker of all leads; the others try to take over as often).")
    ] = DEFAULT_MAINTENANCE_INTERVAL,
    no_maintenance: Annotated[bool, typer.Option(
        "--no-maintenance", help="Run no maintenance service in this worker (pg_cron or another process "
        "maintains the database).")] = False,
    cdc: Annotated[list[str] | None, typer.Option(
        "--cdc", help="Also run this change data capture (repeatable): one worker captures it at a time, "
        "another takes over when it dies; the worker then also runs the slot guard every minute.",
        show_default=False)] = None,
    cdc_max_retained: Annotated[int, typer.Option(
        "--cdc-max-retained", help="With --cdc: bytes of WAL a capture's slot may keep before the slot guard "
        "warns.")] = DEFAULT_MAX_RETAINED,
    cdc_drop: Annotated[bool, typer.Option(
        "--cdc-drop", help="With --cdc: the slot guard drops a slot over the limit that no process captures, "
        "rather than fill the disk.")] = False,
    member_id: Annotated[str | None, typer.Option(
        "--member-id", help="Name of this member. Default: host:pid:random.", show_default=False)] = None,
    log_level: Annotated[str, typer.Option("--log-level", help="debug, info, warning or error.")] = "info",
    metrics_port: Annotated[int | None, typer.Option(
        "--metrics-port", help="Export this worker's Prometheus metrics at http://HOST:PORT/metrics (0: any "
        "free port; needs the 'metrics' extra).", show_default=False)] = None,
    metrics_host: Annotated[str, typer.Option("--metrics-host", help="Address of the metrics endpoint.")
                            ] = DEFAULT_METRICS_HOST,
    dsn: DsnOption = None,
    pooler: PoolerOption = None,
    listen_dsn: ListenDsnOption = None,
    schema: SchemaOption = DEFAULT_SCHEMA,
) -> None:
    """Run a handler as a member of a group until SIGINT/SIGTERM: it gets its share of the partitions,
    retries failing events and sends them to the dead-letter topic, and on a signal finishes its batch,
    commits, gives its partitions back and exits 0. With --share-group it consumes in a share group
    instead: it competes for single events of every partition with the group's other consumers, running
    --concurrency handlers at once, each event locked to it for --lock-timeout seconds; a failing event is
    released with the backoff and, after --max-attempts deliveries, goes to the dead-letter topic."""
    check_topic(topic)
    if (group is None) == (share_group is None):
        raise usage_error("give exactly one of --group (a stream group) and --share-group (a share group)")
    name = group if group is not None else share_group
    assert name is not None
    check_group(name)
    if share_group is None and concurrency != _OPTIONS.concurrency:
        raise usage_error("--concurrency needs --share-group")
    if share_group is None and lock_timeout is not None:
        raise usage_error("--lock-timeout needs --share-group")
    begin = parse_start(start)
    level = getattr(logging, log_level.upper(), None)
    if log_level.lower() not in ("debug", "info", "warning", "error") or not isinstance(level, int):
        raise usage_error(f"--log-level must be debug, info, warning or error, not {log_level!r}")
    if no_dead_letter and dead_letter:
        raise usage_error("--dead-letter and --no-dead-letter exclude each other")
    if metrics_port is not None:
        check_port("--metrics-port", metrics_port)
    if not maintenance_interval > 0:
        raise usage_error(
            f"--maintenance-interval must be a positive number of seconds, got {maintenance_interval}")
    for name in cdc or []:
        check_topic(name)
    if cdc_max_retained < 0:
        raise usage_error(f"--cdc-max-retained must be a number of bytes >= 0, got {cdc_max_retained}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    fn = load_handler(handler)
    retry = RetryPolicy(max_attempts=max_attempts, backoff=backoff, max_backoff=max_backoff)
    logging.basicConfig(level=level, stream=sys.stderr, format="%(asctime)s %(levelname)s %(message)s")
    # the embedded server's start-up and shut-down lines only with --log-level debug
    logging.getLogger("pgserver").setLevel(logging.DEBUG if level <= logging.DEBUG else logging.WARNING)
    with open_client(dsn, schema, pooler=pooler, listen_dsn=listen_dsn) as client:
        worker = Worker(client, member_id=member_id,
                        maintenance=None if no_maintenance else maintenance_interval, captures=cdc or (),
                        slot_max_retained=cdc_max_retained, slot_drop=cdc_drop)
        worker.add_subscription(topic, name, fn, SubscriptionOptions(
            batch=batch, min_events=min_events, max_events=max_events, max_wait=max_wait,
            mode=mode,  # type: ignore[arg-type]  # checked when the subscription is made
            retry=retry, dead_letter=False if no_dead_letter else dead_letter, start=begin,
            heartbeat_interval=heartbeat_interval, session_timeout=session_timeout,
            share=share_group is not None, concurrency=concurrency, lock_timeout=lock_timeout))
        server = None
        if metrics_port is not None:
            metrics = load_extra("pgstreams.metrics", "metrics")
            from prometheus_client import CollectorRegistry

            registry = CollectorRegistry()
            registry.register(metrics.WorkerCollector(worker))
            server = metrics.serve(registry, host=metrics_host, port=metrics_port)
            err_console().print(f"serving metrics at {server.url}", soft_wrap=True)
        try:
            worker.run(until=TERMINATING)  # a SIGTERM whose exception was lost before run() took over
        finally:
            if server is not None:
                server.close()
        err_console().print(f"worker {worker.member_id} stopped: {worker.stats.snapshot()}")


def register(app: typer.Typer) -> None:
    """Add ``worker`` to ``app``."""
    app.command("worker")(worker_command)
