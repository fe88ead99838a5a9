"""``pgstreams kafka serve``: the Kafka protocol gateway (see ``docs/kafka.md``)."""

from __future__ import annotations

import asyncio
import signal
from typing import Annotated, Any

import typer

from pgstreams.metrics.defaults import DEFAULT_METRICS_HOST
from pgstreams.names import is_loopback
from pgstreams.pooler import Pooler, check_listen_dsn, check_pooler

from .common import (
    DEFAULT_SCHEMA,
    TERMINATING,
    DsnOption,
    ListenDsnOption,
    PoolerOption,
    SchemaOption,
    resolve,
    usage_error,
)
from .output import err_console
from .serving import check_port, listening, load_extra

kafka_app = typer.Typer(help="The Kafka protocol gateway.", no_args_is_help=True)


@kafka_app.command("serve")
def kafka_serve(
    listen: Annotated[str, typer.Option("--listen", help="HOST:PORT to listen on (port 0: any free one).")
                      ] = "127.0.0.1:9092",
    advertise: Annotated[str | None, typer.Option(
        "--advertise", help="HOST:PORT that clients are told to connect to (default: the listening "
        "address).")] = None,
    node_id: Annotated[int, typer.Option("--node-id", help="This gateway's broker id.")] = 0,
    sasl: Annotated[list[str] | None, typer.Option(
        "--sasl", help="A SASL mechanism clients must authenticate with: PLAIN or SCRAM-SHA-256, a "
        "PostgreSQL role's name and password (the client then acts as that role). Repeatable.")] = None,
    allow_unauthenticated: Annotated[bool, typer.Option(
        "--allow-unauthenticated", help="Serve an address other than a loopback one without SASL "
        "(refused otherwise).")] = False,
    tls_cert: Annotated[str | None, typer.Option(
        "--tls-cert", help="A PEM certificate (chain): clients connect with TLS (SSL or SASL_SSL).",
        show_default=False)] = None,
    tls_key: Annotated[str | None, typer.Option(
        "--tls-key", help="The certificate's PEM private key (default: in the --tls-cert file).",
        show_default=False)] = None,
    tls_client_ca: Annotated[str | None, typer.Option(
        "--tls-client-ca", help="Require client certificates signed by this PEM CA (mutual TLS).",
        show_default=False)] = None,
    metrics_port: Annotated[int | None, typer.Option(
        "--metrics-port", help="Export the gateway's Prometheus metrics at http://HOST:PORT/metrics (0: any "
        "free port; needs the 'metrics' extra).", show_default=False)] = None,
    metrics_host: Annotated[str, typer.Option("--metrics-host", help="Address of the metrics endpoint.")
                            ] = DEFAULT_METRICS_HOST,
    dsn: DsnOption = None,
    pooler: PoolerOption = None,
    listen_dsn: ListenDsnOption = None,
    schema: SchemaOption = DEFAULT_SCHEMA,
) -> None:
    """Serve the Kafka protocol over the topics of one database until SIGINT/SIGTERM."""
    load_extra("pgstreams.kafka", "kafka")
    from pgstreams.kafka.auth import MECHANISMS
    from pgstreams.kafka.server import parse_address

    try:
        host, port = parse_address(listen, "--listen")
        if advertise is not None:
            parse_address(advertise, "--advertise")
    except ValueError as exc:
        raise usage_error(str(exc)) from None
    if not 0 <= node_id <= 2**31 - 1:
        raise usage_error(f"--node-id must be from 0 to {2**31 - 1}, not {node_id}")
    mechanisms = [m.upper() for m in sasl or ()]
    for m in mechanisms:
        if m not in MECHANISMS:
            raise usage_error(f"--sasl {m} is not served (served: {', '.join(MECHANISMS)})")
    if not mechanisms and not allow_unauthenticated and not is_loopback(host):
        raise usage_error(f"refusing to serve {host} without authentication: give --sasl PLAIN, or "
                          "--allow-unauthenticated")
    tls = None
    if tls_cert is not None:
        import ssl

        from pgstreams.kafka.server import tls_context

        try:
            tls = tls_context(tls_cert, tls_key, tls_client_ca)
        except (OSError, ssl.SSLError) as exc:
            raise usage_error(f"--tls-cert/--tls-key/--tls-client-ca: {exc}") from None
    elif tls_key is not None or tls_client_ca is not None:
        raise usage_error("--tls-key and --tls-client-ca need --tls-cert")
    if metrics_port is not None:
        check_port("--metrics-port", metrics_port)
        load_extra("pgstreams.metrics", "metrics")
    mode = check_pooler(pooler, "--pooler")
    listen_to = check_listen_dsn(listen_dsn, "--listen-dsn")
    server_dsn = resolve(dsn)
    with listening(host, port):
        asyncio.run(_serve(server_dsn, schema, listen, advertise, node_id, mechanisms, allow_unauthenticated,
                           (metrics_host, metrics_port) if metrics_port is not None else None, tls, mode,
                           listen_to))


async def _serve(dsn: str, schema: str, listen: str, advertise: str | None, node_id: int,
                 sasl: list[str], allow_unauthenticated: bool, metrics_at: tuple[str, int] | None,
                 tls: Any, pooler: Pooler, listen_dsn: str | None) -> None:
    import pgstreams.aio
    from pgstreams.kafka import Gateway

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for s in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(s, stop.set)
    if TERMINATING.is_set():  # a SIGTERM before the handlers, its exception lost on the way
        stop.set()
    async with await pgstreams.aio.connect(dsn, schema=schema, pooler=pooler,
                                           listen_dsn=listen_dsn) as client:
        async with Gateway(client, listen=listen, advertise=advertise, node_id=node_id, sasl=sasl,
                           allow_unauthenticated=allow_unauthenticated, tls=tls) as gateway:
            host, port = gateway.address
            shown = f"[{host}]" if ":" in host else host
            # one line on stderr that scripts (and tests) can read the bound address from
            err_console().print(f"serving the Kafka protocol at {shown}:{port}", soft_wrap=True)
            server = None
            if metrics_at is not None:
                from prometheus_client import CollectorRegistry

                import pgstreams.metrics as metrics

                registry = CollectorRegistry()
                registry.register(metrics.GatewayCollector(gateway))
                server = metrics.serve(registry, host=metrics_at[0], port=metrics_at[1])
                err_console().print(f"serving metrics at {server.url}", soft_wrap=True)
            try:
                await stop.wait()
            finally:
                if server is not None:
                    server.close()


def register(app: typer.Typer) -> None:
    """Add the ``kafka`` commands to ``app``."""
    app.add_typer(kafka_app, name="kafka")
