"""``pgstreams server status|start|stop``: the embedded PostgreSQL that commands use when no DSN is given."""

from __future__ import annotations

import typer

from pgstreams.embedded import EmbeddedStatus, server_status, start_server, stop_server

from .common import JsonOption
from .output import out_console, print_json

server_app = typer.Typer(
    name="server", no_args_is_help=True,
    help="The embedded PostgreSQL (used when no DSN is given): its state, start it, stop it.")


def _as_json(status: EmbeddedStatus) -> dict[str, object]:
    return {"pgdata": str(status.pgdata), "running": status.running, "pid": status.pid, "dsn": status.dsn,
            "users": list(status.users)}


def _show(status: EmbeddedStatus, as_json: bool) -> None:
    if as_json:
        print_json(_as_json(status))
        return
    con = out_console()
    con.print(f"data folder: {status.pgdata}", soft_wrap=True)
    if not status.running:
        con.print("state: stopped")
        return
    con.print(f"state: running (postmaster pid {status.pid})")
    con.print(f"dsn: {status.dsn}", soft_wrap=True)
    users = ", ".join(str(p) for p in status.users)
    con.print(f"used by: {users}" if users else
              "used by: no process (kept running by `pgstreams server start`)")


@server_app.command("status")
def server_status_command(as_json: JsonOption = False) -> None:
    """Show the embedded server's data folder, whether it runs, its DSN and the processes using it (it
    stops when the last one exits, unless `pgstreams server start` started it). Starts nothing."""
    _show(server_status(), as_json)


@server_app.command("start")
def server_start_command(as_json: JsonOption = False) -> None:
    """Start the embedded server unless it runs, and keep it running after this command (for psql, other
    programs, or commands run one after another) until `pgstreams server stop`; print its DSN."""
    start_server()
    _show(server_status(), as_json)


@server_app.command("stop")
def server_stop_command(as_json: JsonOption = False) -> None:
    """Stop the embedded server (a fast shutdown: the connections of processes still using it end)."""
    before = stop_server()
    if as_json:
        print_json({**_as_json(server_status()), "was_running": before.running,
                    "stopped_users": list(before.users)})
        return
    con = out_console()
    if not before.running:
        con.print(f"the embedded server in {before.pgdata} is not running", soft_wrap=True)
        return
    users = f" (it was used by: {', '.join(str(p) for p in before.users)})" if before.users else ""
    con.print(f"stopped the embedded server in {before.pgdata}{users}", soft_wrap=True)


def register(app: typer.Typer) -> None:
    """Add ``server`` to ``app``."""
    app.add_typer(server_app)
