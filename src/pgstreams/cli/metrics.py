"""``pgstreams metrics serve``: the database-wide Prometheus metrics over HTTP (see ``docs/metrics.md``)."""

from __future__ import annotations

from typing import Annotated

import typer

from pgstreams.metrics.defaults import DEFAULT_METRICS_HOST, DEFAULT_METRICS_PORT, DEFAULT_MIN_INTERVAL

from .common import DEFAULT_SCHEMA, DsnOption, PoolerOption, SchemaOption, open_client, usage_error
from .output import err_console
from .serving import check_port, listening, load_extra, wait_for_signal

metrics_app = typer.Typer(help="Prometheus metrics.", no_args_is_help=True)


@metrics_app.command("serve")
def metrics_serve(
    host: Annotated[str, typer.Option("--host", help="Address to listen on.")] = DEFAULT_METRICS_HOST,
    port: Annotated[int, typer.Option("--port", help="Port to listen on (0: any free port).")
                    ] = DEFAULT_METRICS_PORT,
    min_interval: Annotated[float, typer.Option(
        "--min-interval", help="Seconds a status read serves further scrapes: the database is read at most "
        "once per interval however many scrapers ask.")] = DEFAULT_MIN_INTERVAL,
    dsn: DsnOption = None,
    pooler: PoolerOption = None,
    schema: SchemaOption = DEFAULT_SCHEMA,
) -> None:
    """Export the database-wide metrics (topics, partitions, group lag, members, dead letters, change data
    captures' slots) at
    http://HOST:PORT/metrics until SIGINT/SIGTERM."""
    check_port("--port", port)
    if min_interval < 0:
        raise usage_error(f"--min-interval must be >= 0 seconds, not {min_interval}")
    metrics = load_extra("pgstreams.metrics", "metrics")
    from prometheus_client import CollectorRegistry

    with open_client(dsn, schema, pooler=pooler) as client:
        registry = CollectorRegistry()
        # the collector reads once when created, before serving (read_now): that first read of every
        # topic is paid by no scrape; a failure there is the first scrape's to report
        registry.register(metrics.StatusCollector(client, min_interval=min_interval))
        registry.register(metrics.CaptureCollector(client, min_interval=min_interval))
        with listening(host, port):
            server = metrics.serve(registry, host=host, port=port)
        # one line on stderr that scripts (and tests) can read the bound address from
        err_console().print(f"serving metrics at {server.url}", soft_wrap=True)
        try:
            wait_for_signal()
        finally:
            server.close()


def register(app: typer.Typer) -> None:
    """Add the ``metrics`` commands to ``app``."""
    app.add_typer(metrics_app, name="metrics")
