"""Everything the command line prints: the consoles, JSON on stdout, and for each model its JSON form and
its rich table.

JSON forms are built from the models' fields by :func:`to_json` (times as ISO 8601 in UTC with
``+00:00``); tables show times in UTC to the second and ``-`` for what is missing.
"""

from __future__ import annotations

import base64
import json
import os
import sys
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from pgstreams.models import to_json

if TYPE_CHECKING:  # rich is imported by the functions that print with it: startup stays light
    from rich.console import Console
    from rich.table import Table

    import pgstreams
    from pgstreams.migrate import MigrationStatus

#: The fields of a group's progress on a partition (:class:`pgstreams.GroupPartitionStatus`) that
#: ``groups describe --json`` prints first.
PROGRESS_FIELDS = ("group", "topic", "partition", "checkpoint", "head", "lag", "updated_at")
#: The membership fields of the same status that ``groups describe --json`` adds to each partition.
MEMBERSHIP_FIELDS = ("owner", "pending_owner", "last_heartbeat", "stale", "retry_state", "retry_position",
                     "retry_attempts", "last_error")


# -- consoles and stdout -----------------------------------------------------------------------------
def out_console() -> Console:
    """The rich console for tables on stdout (160 columns wide when stdout is not a terminal and
    ``$COLUMNS`` is unset, so piped tables do not wrap)."""
    from rich.console import Console

    console = Console(highlight=False)
    if not console.is_terminal and not os.environ.get("COLUMNS"):
        console = Console(highlight=False, width=160)
    return console


def err_console() -> Console:
    """The rich console for progress and notes on stderr."""
    from rich.console import Console

    return Console(stderr=True, highlight=False)


def write_stdout(text: str) -> None:
    """Write ``text`` to stdout as UTF-8 (whatever the locale) and flush."""
    sys.stdout.flush()
    out = getattr(sys.stdout, "buffer", None)
    if out is None:  # pragma: no cover - stdout replaced by a text-only stream
        sys.stdout.write(text)
    else:
        out.write(text.encode("utf-8"))
        out.flush()


def print_json(obj: object) -> None:
    """Print ``obj`` as indented JSON (UTF-8) on stdout."""
    write_stdout(json.dumps(obj, indent=2, ensure_ascii=False) + "\n")


def json_line(obj: object) -> str:
    """``obj`` as compact JSON on one line (UTF-8 text, ending with a newline)."""
    return json.dumps(obj, ensure_ascii=False) + "\n"


# -- values ------------------------------------------------------------------------------------------
def iso(dt: datetime | None) -> str | None:
    """An aware datetime as ISO 8601 in UTC (``None`` stays ``None``)."""
    return None if dt is None else dt.astimezone(timezone.utc).isoformat()


def short_time(dt: datetime | None) -> str:
    """A datetime for a table: UTC, to the second (``-`` for ``None``)."""
    return "-" if dt is None else dt.astimezone(timezone.utc).isoformat(sep=" ", timespec="seconds")


def cell(value: object) -> str:
    """A table cell: ``str(value)``, or ``-`` for ``None``."""
    return "-" if value is None else str(value)


def plural(count: int, noun: str) -> str:
    """``"1 partition"``, ``"3 partitions"``."""
    return f"{count} {noun}{'s' * (count != 1)}"


# -- JSON forms --------------------------------------------------------------------------------------
def print_listing(items: Sequence[Any], as_json: bool, json_form: Callable[[Any], Any],
                  table: Callable[[Sequence[Any]], Table], empty: str) -> None:
    """Print a listing command's result: JSON (an array of ``json_form`` of each item), ``empty`` when
    there is nothing, else ``table`` of the items."""
    if as_json:
        print_json([json_form(item) for item in items])
    elif not items:
        out_console().print(empty)
    else:
        out_console().print(table(items))


def migration_json(status: MigrationStatus) -> dict[str, Any]:
    """A migration's status: ``{"version", "name", "applied_at", "known"}``."""
    out: dict[str, Any] = to_json(status)
    return out


def migrate_json(schema: str, applied: Sequence[int], version: int, unknown: Sequence[int]) -> dict[str, Any]:
    """What ``migrate`` did: ``{"schema", "applied", "version", "unknown"}``."""
    return {"schema": schema, "applied": list(applied), "version": version, "unknown": list(unknown)}


def topic_json(info: pgstreams.TopicInfo) -> dict[str, Any]:
    """A topic: ``{"name", "partitions", "created_at", "segment_size", "config"}``."""
    out: dict[str, Any] = to_json(info)
    return out


def topic_description_json(desc: pgstreams.TopicDescription) -> dict[str, Any]:
    """A described topic: its :func:`topic_json` with ``"events"``,
    ``"partition_info": [{"partition", "events", "head"}]``, ``"config_entries"`` and ``"compaction"``
    (see :class:`pgstreams.CompactionStatus`; ``null`` when not read)."""
    return {**topic_json(desc.topic), "events": desc.events, "partition_info": to_json(desc.partition_info),
            "config_entries": to_json(desc.config_entries),
            "compaction": None if desc.compaction is None else to_json(desc.compaction)}


def group_json(group: pgstreams.GroupInfo) -> dict[str, Any]:
    """A group: ``{"group", "topics", "lag"}``."""
    out: dict[str, Any] = to_json(group)
    return out


def group_partition_json(status: pgstreams.GroupPartitionStatus) -> dict[str, Any]:
    """A group's partition for ``groups describe --json``: ``{"group", "topic", "partition", "checkpoint",
    "head", "lag", "updated_at"}``, the :data:`MEMBERSHIP_FIELDS` and ``"state"`` (one of
    :data:`pgstreams.PARTITION_STATES`)."""
    full = to_json(status)
    return {**{name: full[name] for name in (*PROGRESS_FIELDS, *MEMBERSHIP_FIELDS)}, "state": status.state}


def share_partition_json(status: pgstreams.ShareGroupStatus) -> dict[str, Any]:
    """A share group's partition for ``groups describe --json``: every field of
    :class:`pgstreams.ShareGroupStatus` and ``"type": "share"``."""
    out: dict[str, Any] = {"type": "share", **to_json(status)}
    return out


def share_table(statuses: Sequence[pgstreams.ShareGroupStatus], title: str | None = None) -> Table:
    """A rich table of share-group statuses: per topic and partition the group's start, frontier, head,
    acquired, available, waiting and delivered-too-often counts, the oldest lock, the dead-letter
    counters, and the events lost to retention."""
    from rich.table import Table

    table = Table(title=title)
    for name, right in (("share group", False), ("topic", False), ("partition", True), ("start", True),
                        ("frontier", True), ("head", True), ("acquired", True), ("available", True),
                        ("waiting", True), ("too often", True), ("oldest lock", False), ("rejected", True),
                        ("DLT", True), ("lost", True)):
        table.add_column(name, justify="right" if right else "left", overflow="fold")
    for s in statuses:
        table.add_row(s.group, s.topic, str(s.partition), cell(s.start), str(s.frontier), cell(s.head),
                      str(s.acquired), str(s.available), str(s.waiting),
                      f"[bold yellow]{s.delivered_too_often}[/]" if s.delivered_too_often else "0",
                      short_time(s.oldest_lock), str(s.rejected), str(s.dead_lettered),
                      f"[bold red]{s.lost_events}[/]" if s.lost_events else "0")
    return table


def event_json(ev: pgstreams.Event) -> dict[str, Any]:
    """An event as the JSON object ``consume`` prints.

    ``value_type`` says how ``value`` was published: ``"json"`` (``value`` is that JSON value),
    ``"text"`` (a JSON string) or ``"bytes"`` (``value`` is the bytes in standard base64).
    """
    value: Any = ev.value
    if isinstance(value, (bytes, bytearray, memoryview)):
        value_type = "bytes"
        value = base64.b64encode(bytes(value)).decode("ascii")
    elif isinstance(value, str):
        value_type = "text"
    else:
        value_type = "json"
    return {
        "topic": ev.topic, "partition": ev.partition, "position": ev.position, "txid": ev.txid,
        "key": ev.key, "value_type": value_type, "value": value, "headers": dict(ev.headers),
        "event_type": ev.event_type, "event_id": ev.event_id, "correlation_id": ev.correlation_id,
        "causation_id": ev.causation_id, "created_at": iso(ev.created_at),
    }


# -- tables ------------------------------------------------------------------------------------------
def migrations_table(rows: Sequence[MigrationStatus], schema: str) -> Table:
    """Migrations of ``schema``: version, name (flagged when not shipped with this pgstreams) and when it
    was applied (``pending`` when not)."""
    from rich.table import Table

    table = Table(title=f"migrations in schema {schema!r}")
    table.add_column("version", justify="right")
    table.add_column("name")
    table.add_column("applied at")
    for r in rows:
        table.add_row(str(r.version), r.name if r.known else f"{r.name} [red](not shipped with this "
                      "pgstreams: applied by a newer one)[/]",
                      short_time(r.applied_at) if r.applied_at else "[yellow]pending[/]")
    return table


def topics_table(topics: Sequence[pgstreams.TopicInfo]) -> Table:
    """Topics: name, partition count, creation time."""
    from rich.table import Table

    table = Table()
    table.add_column("topic", overflow="fold")
    table.add_column("partitions", justify="right")
    table.add_column("created at")
    for t in topics:
        table.add_row(t.name, str(t.partitions), short_time(t.created_at))
    return table


def topic_heading(desc: pgstreams.TopicDescription) -> str:
    """The line above a described topic's table: partitions, events, creation time."""
    info = desc.topic
    line = (f"topic {info.name!r}: {plural(info.partitions, 'partition')}, {desc.events} events, "
            f"created {short_time(info.created_at)}")
    c = desc.compaction
    if c is not None and "compact" in str(desc.config.get("cleanup.policy", "")):
        ratio = "-" if c.dirty_ratio is None else f"{c.dirty_ratio:.3f}"
        line += (f"; compaction: dirty ratio {ratio}, last {short_time(c.compacted_at)}, "
                 f"{c.events_removed} events ({c.tombstones_removed} tombstones) removed")
    return line


def partitions_table(desc: pgstreams.TopicDescription) -> Table:
    """A described topic's partitions: events stored and head."""
    from rich.table import Table

    table = Table()
    table.add_column("partition", justify="right")
    table.add_column("events", justify="right")
    table.add_column("head", justify="right")
    for p in desc.partition_info:
        table.add_row(str(p.partition), str(p.events), cell(p.head))
    return table


def config_table(desc: pgstreams.TopicDescription) -> Table:
    """A described topic's configuration: every key, its value, and whether it is the default."""
    from rich.table import Table

    table = Table(title="config")
    table.add_column("key")
    table.add_column("value", justify="right")
    table.add_column("source")
    for e in desc.config_entries:
        table.add_row(e.name, str(e.value), "default" if e.is_default else "set")
    return table


def retention_table(rows: Sequence[pgstreams.RetentionStatus]) -> Table:
    """Retention per topic: policy, oldest retained event, size, segments, last run, removed so far, and
    compaction's dirty ratio, last rewrite and removed events."""
    from rich.table import Table

    table = Table()
    # bytes: every fork (pg_total_relation_size), the free-space and visibility maps included, which the
    # status's size (the console, the metrics) leaves out
    for name in ("topic", "cleanup.policy", "retention.ms", "retention.events", "retention.bytes", "oldest",
                 "bytes (all forks)", "segments", "retention ran", "removed events", "dirty ratio",
                 "compacted", "compacted events"):
        table.add_column(name, overflow="fold")
    for r in rows:
        table.add_row(r.topic, r.cleanup_policy, cell(r.retention_ms), cell(r.retention_events),
                      cell(r.retention_bytes), f"{cell(r.oldest_position)} ({short_time(r.oldest_at)})",
                      str(r.bytes), str(r.segments), short_time(r.retention_ran_at), str(r.events_removed),
                      "-" if r.dirty_ratio is None else f"{r.dirty_ratio:.3f}", short_time(r.compacted_at),
                      str(r.events_compacted))
    return table


def resets_table(rows: Sequence[pgstreams.CheckpointReset], dry_run: bool) -> Table:
    """A group reset: per partition, the checkpoint before and after."""
    from rich.table import Table

    table = Table(title="dry run: nothing changed" if dry_run else None)
    for name in ("group", "topic", "partition", "checkpoint before", "checkpoint after"):
        table.add_column(name, overflow="fold")
    for r in rows:
        table.add_row(r.group, r.topic, str(r.partition), cell(r.previous), str(r.checkpoint))
    return table


def groups_table(groups: Sequence[pgstreams.GroupInfo]) -> Table:
    """Groups: name, the topics they read, total lag."""
    from rich.table import Table

    table = Table()
    table.add_column("group", overflow="fold")
    table.add_column("topics", overflow="fold")
    table.add_column("lag", justify="right")
    for g in groups:
        table.add_row(g.group, ", ".join(g.topics), str(g.lag))
    return table


def group_table(statuses: Sequence[pgstreams.GroupPartitionStatus], title: str | None = None,
                membership: bool = False) -> Table:
    """A rich table of group statuses: group, topic, partition, checkpoint, head, lag, updated at; with
    ``membership`` also the lease owner, its last heartbeat and the partition's state (stale owner,
    retrying or blocked on an event)."""
    from rich.table import Table

    table = Table(title=title)
    table.add_column("group", overflow="fold")
    table.add_column("topic", overflow="fold")
    table.add_column("partition", justify="right")
    table.add_column("checkpoint", justify="right")
    table.add_column("head", justify="right")
    table.add_column("lag", justify="right")
    table.add_column("updated at")
    lost = any(s.lost_events for s in statuses)
    if lost:  # only when retention removed events a group had not read
        table.add_column("lost", justify="right")
    if membership:
        table.add_column("owner", overflow="fold")
        table.add_column("last heartbeat")
        table.add_column("state")
    for s in statuses:
        lag = f"[bold yellow]{s.lag}[/]" if s.lag else "0"
        row = [s.group, s.topic, str(s.partition), cell(s.checkpoint), cell(s.head), lag,
               short_time(s.updated_at)]
        if lost:
            row.append(f"[bold red]{s.lost_events}[/]" if s.lost_events else "0")
        if membership:
            row += [cell(s.owner), short_time(s.last_heartbeat), partition_state(s)]
        table.add_row(*row)
    return table


def partition_state(m: pgstreams.GroupPartitionStatus) -> str:
    """The state column of :func:`group_table`: the partition's state (:data:`pgstreams.PARTITION_STATES`),
    with the retried event and its error, or the member waiting for the lease."""
    state = m.state
    if state == "blocked":
        return (f"[bold red]blocked[/] at {m.retry_position} after {m.retry_attempts} attempts: "
                f"{m.last_error}")
    if state == "retrying":
        return f"[yellow]retrying[/] {m.retry_position} ({m.retry_attempts} attempts): {m.last_error}"
    if state == "stale":
        return "[bold red]stale[/]"
    if state == "handing over":
        return f"handing over to {m.pending_owner}"
    return state


def member_line(m: pgstreams.MemberInfo) -> str:
    """One registered member of a group: its partitions and last heartbeat, flagged when stale."""
    parts = ", ".join(map(str, m.partitions)) or "none"
    return (f"member {m.member_id} on {m.topic}: partitions {parts}; last heartbeat "
            f"{short_time(m.last_heartbeat)}{' [bold red](stale)[/]' if m.stale else ''}")


def published_table(published: Sequence[tuple[pgstreams.Message, pgstreams.PublishResult]], title: str
                    ) -> Table:
    """Messages with where they were stored: key, value (as JSON), partition, position."""
    from rich.table import Table

    table = Table(title=title, title_justify="left")
    table.add_column("key")
    table.add_column("value")
    table.add_column("partition", justify="right")
    table.add_column("position", justify="right")
    for msg, res in published:
        table.add_row(str(msg.key), json.dumps(msg.value), str(res.partition), str(res.position))
    return table


def events_table(events: Sequence[pgstreams.Event], title: str) -> Table:
    """Events by partition and position: partition, position, key, value (as JSON)."""
    from rich.table import Table

    table = Table(title=title, title_justify="left")
    table.add_column("partition", justify="right")
    table.add_column("position", justify="right")
    table.add_column("key")
    table.add_column("value")
    for ev in sorted(events, key=lambda e: (e.partition, e.position)):
        table.add_row(str(ev.partition), str(ev.position), ev.key or "-", json.dumps(ev.value))
    return table
