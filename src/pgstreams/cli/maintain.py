"""``pgstreams maintain [--loop] [--schedule [--every 1m] | --unschedule]`` and ``pgstreams retention``."""

from __future__ import annotations

import threading
from typing import Annotated

import typer

import pgstreams
from pgstreams.maintenance import (
    DEFAULT_MAINTENANCE_INTERVAL,
    DEFAULT_SCHEDULE_EVERY,
    MaintenanceService,
    cron_schedule,
    schedule_maintenance,
    unschedule_maintenance,
)
from pgstreams.models import to_json
from pgstreams.names import check_topic

from .common import (
    DEFAULT_SCHEMA,
    DsnOption,
    JsonOption,
    PoolerOption,
    SchemaOption,
    open_client,
    usage_error,
)
from .output import out_console, print_json, print_listing, retention_table


def _print_report(report: pgstreams.MaintenanceReport, as_json: bool) -> None:
    if as_json:
        print_json(to_json(report))
    elif report.skipped:
        out_console().print("another maintenance pass of this schema is running: skipped")
    else:
        out_console().print(
            f"maintenance: {report.segments_created} segment(s) created, {report.segments_sealed} sealed, "
            f"{report.segments_removed} removed ({report.events_removed} events), "
            f"{report.members_expired} stale member(s) expired, {report.duration:.3f} s; "
            f"{report.segments_dropped} detached segment(s) dropped in {report.purge_duration:.3f} s"
            + (f", {report.segments_to_purge} left for the next pass" if report.segments_to_purge else "")
            + _compaction_line(report))


def _compaction_line(report: pgstreams.MaintenanceReport) -> str:
    if not (report.segments_mapped or report.segments_compacted or report.segments_to_compact):
        return ""
    left = report.segments_to_compact
    return (f"; compaction: {report.segments_mapped} segment(s) mapped, {report.segments_compacted} "
            f"rewritten ({report.events_compacted} events removed)"
            + (f", {left} left for the next pass" if left else ""))


def maintain_command(
    loop: Annotated[bool, typer.Option(
        "--loop", help="Keep running passes (one leader per database) until interrupted.")] = False,
    interval: Annotated[float, typer.Option(
        "--interval", help="Seconds between passes with --loop.")] = DEFAULT_MAINTENANCE_INTERVAL,
    schedule: Annotated[bool, typer.Option(
        "--schedule", help="Register a pg_cron job running maintain() in the database.")] = False,
    every: Annotated[str, typer.Option(
        "--every", help="How often the pg_cron job runs (30s, 1m, 5m, 1h, 1d).")] = DEFAULT_SCHEDULE_EVERY,
    unschedule: Annotated[bool, typer.Option("--unschedule", help="Remove the pg_cron job.")] = False,
    purge_all: Annotated[bool, typer.Option(
        "--purge-all", help="Drop every detached segment, not only those the pass's time budget allows.")
    ] = False,
    as_json: JsonOption = False,
    dsn: DsnOption = None,
    pooler: PoolerOption = None,
    schema: SchemaOption = DEFAULT_SCHEMA,
) -> None:
    """Run one maintenance pass: segments ahead of publishers and their statistics, retention (whole
    segments; the detached segments are dropped within a time budget, the rest by the next pass, unless
    --purge-all), compaction of compacted topics (segment rewrites within a time budget, the rest by the
    next pass), expiry of stale group members. --loop keeps running; --schedule / --unschedule manage a
    pg_cron job that runs it inside PostgreSQL."""
    if sum((loop, schedule, unschedule)) > 1:
        raise usage_error("give at most one of --loop, --schedule, --unschedule")
    if schedule:
        cron_schedule(every)  # a bad --every is a usage error before connecting
    if not interval > 0:
        raise usage_error(f"--interval must be a positive number of seconds, got {interval}")
    with open_client(dsn, schema, pooler=pooler) as client:
        if schedule:
            job = schedule_maintenance(client, every)
            out_console().print(f"scheduled pg_cron job {job}: {schema}.maintain() every {every}")
            return
        if unschedule:
            if unschedule_maintenance(client):
                out_console().print("removed the pg_cron maintenance job")
            else:
                out_console().print("there was no pg_cron maintenance job")
            return
        if not loop:
            _print_report(client.maintain(purge_budget=None) if purge_all else client.maintain(), as_json)
            return
        service = MaintenanceService(client, interval)
        stop = threading.Event()
        service.start()
        try:
            while not stop.wait(0.5):
                if service.died:
                    raise service.error or RuntimeError("the maintenance service stopped")
        except KeyboardInterrupt:
            pass
        finally:
            service.stop(30)


def retention_command(
    topic: Annotated[str | None, typer.Argument(metavar="[TOPIC]", help="Only this topic.",
                                                show_default=False)] = None,
    as_json: JsonOption = False,
    dsn: DsnOption = None,
    pooler: PoolerOption = None,
    schema: SchemaOption = DEFAULT_SCHEMA,
) -> None:
    """Retention per topic: policy, oldest retained event, size on disk, segments, when it last ran."""
    if topic is not None:
        check_topic(topic)
    with open_client(dsn, schema, pooler=pooler) as client:
        rows = client.retention_status(topic)
    print_listing(rows, as_json, to_json, retention_table, "no topics")


def register(app: typer.Typer) -> None:
    """Add ``maintain`` and ``retention`` to ``app``."""
    app.command("maintain")(maintain_command)
    app.command("retention")(retention_command)
