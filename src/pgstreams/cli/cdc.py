"""``pgstreams cdc add|list|describe|snapshot|remove|run|guard``: change data capture (see docs/cdc.md)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Annotated, Any

import typer
from rich.table import Table

from pgstreams.cdc import (
    DEFAULT_CAPTURE_INTERVAL,
    DEFAULT_CDC_PARTITIONS,
    DEFAULT_CHUNK_SIZE,
    DEFAULT_MAX_RETAINED,
    DEFAULT_SNAPSHOT,
    DEFAULT_TOPIC_PREFIX,
    CaptureInfo,
    SnapshotStatus,
)
from pgstreams.cdc.snapshots import check_chunk_size
from pgstreams.models import to_json
from pgstreams.names import check_partitions, check_topic
from pgstreams.services import Service, Supervisor

from .common import (
    DEFAULT_SCHEMA,
    CliError,
    DsnOption,
    JsonOption,
    SchemaOption,
    check_terminated,
    open_client,
    usage_error,
)
from .output import cell, out_console, print_json, print_listing
from .serving import wait_for_signal

cdc_app = typer.Typer(help="Change data capture: table changes as events.", no_args_is_help=True)

NameArgument = Annotated[str, typer.Argument(metavar="NAME", help="The capture (its topic prefix).",
                                             show_default=False)]


def capture_json(info: CaptureInfo) -> dict[str, Any]:
    """A capture as JSON: every field of :class:`pgstreams.cdc.CaptureInfo`."""
    out: dict[str, Any] = to_json(info)
    return out


def captures_table(captures: Sequence[CaptureInfo]) -> Table:
    """Captures: name, tables, confirmed position, counts, the slot's state."""
    table = Table(title="captures")
    for col in ("name", "tables", "confirmed", "transactions", "changes", "slot active", "lag bytes",
                "wal status"):
        table.add_column(col)
    for c in captures:
        table.add_row(c.name, ", ".join(c.tables), c.confirmed_lsn, str(c.transactions), str(c.changes),
                      cell(c.slot_active), cell(c.lag_bytes), cell(c.wal_status))
    return table


@cdc_app.command("add")
def cdc_add(
    tables: Annotated[list[str], typer.Argument(metavar="TABLE...", help="Tables (SCHEMA.TABLE or TABLE: "
                                                "schema public).", show_default=False)],
    topic_prefix: Annotated[str, typer.Option(
        "--topic-prefix", help="Topics are PREFIX.schema.table; names the capture.")] = DEFAULT_TOPIC_PREFIX,
    partitions: Annotated[int, typer.Option(
        "--partitions", help="Partitions of the new topics.")] = DEFAULT_CDC_PARTITIONS,
    snapshot: Annotated[str, typer.Option(
        "--snapshot", help="initial: first store the existing rows (op r; tables added to an existing "
        "capture: by an incremental snapshot); never: changes only.")] = DEFAULT_SNAPSHOT,
    tombstones: Annotated[bool, typer.Option(
        "--tombstones", help="Follow each delete with a tombstone (the key, a null value).")] = False,
    as_json: JsonOption = False,
    dsn: DsnOption = None,
    schema: SchemaOption = DEFAULT_SCHEMA,
) -> None:
    """Capture the changes of TABLEs into topics PREFIX.schema.table: creates the capture (a publication
    and a logical replication slot) or adds the tables to it. Checks wal_level, the REPLICATION right and
    each table's key first, and changes nothing when one is missing."""
    check_topic(topic_prefix)
    check_partitions(partitions)
    if snapshot not in ("initial", "never"):
        raise usage_error(f"--snapshot must be initial or never, not {snapshot!r}")
    with open_client(dsn, schema) as client:
        info = client.cdc.add(tables, topic_prefix=topic_prefix, partitions=partitions,
                              snapshot="initial" if snapshot == "initial" else "never", tombstones=tombstones)
    if as_json:
        print_json(capture_json(info))
        return
    out_console().print(f"capture {info.name}: {', '.join(info.tables)} -> {', '.join(info.topics)} "
                        f"(slot {info.slot}, from {info.confirmed_lsn}; {info.changes} snapshot row(s))")


@cdc_app.command("list")
def cdc_list(as_json: JsonOption = False, dsn: DsnOption = None, schema: SchemaOption = DEFAULT_SCHEMA
             ) -> None:
    """List the captures and their slots' state."""
    with open_client(dsn, schema) as client:
        captures = client.cdc.list()
    print_listing(captures, as_json, capture_json, captures_table, "no captures")


@cdc_app.command("describe")
def cdc_describe(name: NameArgument, as_json: JsonOption = False, dsn: DsnOption = None,
                 schema: SchemaOption = DEFAULT_SCHEMA) -> None:
    """A capture: its tables and topics, confirmed position, and its slot (lag in bytes, wal_status,
    safe_wal_size)."""
    check_topic(name)
    with open_client(dsn, schema) as client:
        info = client.cdc.describe(name)
    if as_json:
        print_json(capture_json(info))
        return
    table = Table(title=f"capture {info.name}", show_header=False)
    for key, value in capture_json(info).items():
        if key == "snapshots":
            value = [snapshot_line(s) for s in info.snapshots]
        table.add_row(key, cell(", ".join(value) if isinstance(value, list) else value))
    out_console().print(table)


def snapshot_line(s: SnapshotStatus) -> str:
    """An incremental snapshot in a few words: table, rows and chunks stored, finished or not."""
    state = "finished" if s.finished else "running"
    return f"{s.table}: {s.rows} row(s) in {s.chunks} chunk(s), {state}"


@cdc_app.command("snapshot")
def cdc_snapshot(
    tables: Annotated[list[str], typer.Argument(metavar="TABLE...", help="Captured tables (SCHEMA.TABLE or "
                                                "TABLE: schema public).", show_default=False)],
    capture: Annotated[str, typer.Option(
        "--capture", help="The capture of the tables.")] = DEFAULT_TOPIC_PREFIX,
    chunk_size: Annotated[int, typer.Option(
        "--chunk-size", help="Rows read at a time (by key).")] = DEFAULT_CHUNK_SIZE,
    as_json: JsonOption = False,
    dsn: DsnOption = None,
    schema: SchemaOption = DEFAULT_SCHEMA,
) -> None:
    """Read captured TABLEs again while the capture streams (an incremental snapshot): their rows become
    events (op r) in chunks by key, without losing or reordering a change. The capturing process (cdc run,
    or a worker with --cdc) does the work; cdc describe shows the progress. A table snapshotted again
    starts over."""
    check_topic(capture)
    check_chunk_size(chunk_size)
    with open_client(dsn, schema) as client:
        requested = client.cdc.snapshot(tables, capture=capture, chunk_size=chunk_size)
    if as_json:
        print_json(to_json(requested))
        return
    for s in requested:
        out_console().print(f"incremental snapshot of {s.table} requested in capture {s.capture} (chunks of "
                            f"{s.chunk_size} rows; the capturing process reads them)")


@cdc_app.command("remove")
def cdc_remove(name: NameArgument, dsn: DsnOption = None, schema: SchemaOption = DEFAULT_SCHEMA) -> None:
    """Stop capturing NAME: drop its slot and publication (its topics and events stay)."""
    check_topic(name)
    with open_client(dsn, schema) as client:
        info = client.cdc.remove(name)
    out_console().print(f"removed capture {info.name} (slot {info.slot} dropped; topics kept)")


MaxRetainedOption = Annotated[int, typer.Option(
    "--max-retained", help="Bytes of WAL a capture's slot may keep before the slot guard warns.")]
DropOption = Annotated[bool, typer.Option(
    "--drop", help="Drop a slot over the limit that no process reads, rather than fill the disk.")]


@cdc_app.command("guard")
def cdc_guard(max_retained: MaxRetainedOption = DEFAULT_MAX_RETAINED, drop: DropOption = False,
              as_json: JsonOption = False, dsn: DsnOption = None, schema: SchemaOption = DEFAULT_SCHEMA
              ) -> None:
    """Check every capture's slot once: warn about those keeping more than --max-retained bytes of WAL
    (or that lost WAL they needed), and with --drop drop those no process reads. Exit code 1 when one
    was found."""
    if max_retained < 0:
        raise usage_error(f"--max-retained must be a number of bytes >= 0, got {max_retained}")
    with open_client(dsn, schema) as client:
        alarms = client.cdc.guard(max_retained, drop=drop)
    if as_json:
        print_json(to_json(alarms))
    for a in [] if as_json else alarms:
        out_console().print(f"capture {a.capture}: slot {a.slot} keeps {a.retained_bytes} bytes of WAL "
                            f"(wal_status {a.wal_status}){': DROPPED' if a.dropped else ''}")
    if alarms:
        raise typer.Exit(1)


@cdc_app.command("run")
def cdc_run(
    names: Annotated[list[str] | None, typer.Argument(
        metavar="[NAME]...", help="Captures to run (default: every capture).", show_default=False)] = None,
    interval: Annotated[float, typer.Option(
        "--interval", help="Seconds between rounds when a slot has nothing new.")] = DEFAULT_CAPTURE_INTERVAL,
    max_retained: MaxRetainedOption = DEFAULT_MAX_RETAINED,
    drop: DropOption = False,
    dsn: DsnOption = None,
    schema: SchemaOption = DEFAULT_SCHEMA,
) -> None:
    """Capture until stopped (SIGINT/SIGTERM): each capture in one process at a time; the others wait
    and take it over when its process dies. Every minute the slot guard checks every capture's slot
    (see pgstreams cdc guard)."""
    for n in names or []:
        check_topic(n)
    if not interval > 0:
        raise usage_error(f"--interval must be a positive number of seconds, got {interval}")
    if max_retained < 0:
        raise usage_error(f"--max-retained must be a number of bytes >= 0, got {max_retained}")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    with open_client(dsn, schema) as client:
        chosen = names or [c.name for c in client.cdc.list()]
        if not chosen:
            raise CliError("no captures to run (add one with pgstreams cdc add)")
        for n in chosen:
            client.cdc.describe(n)  # CaptureNotFound before anything starts
        services: list[Service] = [client.cdc.service(n, interval=interval) for n in chosen]
        services.append(client.cdc.guard_service(max_retained, drop=drop, spare=chosen))
        failed: list[BaseException] = []
        supervisor = Supervisor(services, lambda f: failed.append(f))
        for s in services:
            s.start()
        supervisor.start()
        try:
            out_console().print(f"capturing {', '.join(chosen)} (stop with Ctrl-C)")
            wait_for_signal(lambda: bool(failed))
            check_terminated()
        finally:
            supervisor.stop()
            for s in services:
                s.stop(10)
        if failed:
            raise CliError(str(failed[0]))


def register(app: typer.Typer) -> None:
    """Add the ``cdc`` commands to ``app``."""
    app.add_typer(cdc_app, name="cdc")
