"""``pgstreams console``: the web console (see ``docs/console.md``)."""

from __future__ import annotations

import logging
import socket
from typing import Annotated

import typer

from pgstreams.console.defaults import (
    DEFAULT_CONSOLE_HOST,
    DEFAULT_CONSOLE_PORT,
    DEFAULT_REFRESH,
    PASSWORD_ENV,
    TOKEN_ENV,
    USER_ENV,
)

from .common import DEFAULT_SCHEMA, CliError, DsnOption, PoolerOption, SchemaOption, open_client, usage_error
from .output import err_console
from .serving import check_port, listening, load_extra


def console_command(
    host: Annotated[str, typer.Option("--host", help=f"Address to listen on. Anything but loopback needs "
                                      f"{TOKEN_ENV}, or {USER_ENV} and {PASSWORD_ENV}, in the environment.")
                    ] = DEFAULT_CONSOLE_HOST,
    port: Annotated[int, typer.Option("--port", help="Port to listen on (0: any free port).")
                    ] = DEFAULT_CONSOLE_PORT,
    refresh: Annotated[float, typer.Option("--refresh", help="Seconds between the pages' live updates.")
                       ] = DEFAULT_REFRESH,
    dsn: DsnOption = None,
    pooler: PoolerOption = None,
    schema: SchemaOption = DEFAULT_SCHEMA,
) -> None:
    """Serve the web console (topics, events, groups, dead letters and their replay) at
    http://HOST:PORT/ until SIGINT/SIGTERM."""
    check_port("--port", port)
    if refresh <= 0:
        raise usage_error(f"--refresh must be a positive number of seconds, not {refresh}")
    console = load_extra("pgstreams.console", "console")
    uvicorn = load_extra("uvicorn", "console")
    credentials = console.Credentials.from_env()
    console.check_binding(host, credentials)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        with listening(host, port):
            sock.bind((host, port))
            sock.listen(128)  # connections wait in the backlog until the server takes them
    except CliError:
        sock.close()
        raise
    with sock, open_client(dsn, schema, pooler=pooler) as client:
        app = console.create_app(client, credentials=credentials, refresh=refresh)
        bound = sock.getsockname()[1]
        shown = f"[{host}]" if ":" in host else host
        logging.getLogger("uvicorn.error").setLevel(logging.WARNING)
        err_console().print(f"serving the console at http://{shown}:{bound}/", soft_wrap=True)
        server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on"))
        server.run(sockets=[sock])


def register(app: typer.Typer) -> None:
    """Add ``console`` to ``app``."""
    app.command("console")(console_command)
