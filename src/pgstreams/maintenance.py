"""Maintenance: the pass that keeps a schema healthy, the service that runs it on workers, and pg_cron jobs.

One pass (:class:`Maintenance`, :meth:`pgstreams.Client.maintain`, ``pgstreams maintain``), for every
topic whose state moved since the last pass checked it (new events, another configuration, segments left
to seal or detach, retention by age due; idle topics cost one sequence read each): create segments ahead
of the publishers (two empty ones, so no publish pays a ``CREATE TABLE``), give the segment being filled
column statistics, seal the segments every read fence has passed (their per-partition figures, which
keep lag and counts off the log), apply retention by removing whole segments (see
:mod:`pgstreams.topicconfig`), then expire group members that missed their session timeout. One pass of
a schema runs at a time (an advisory lock; the SQL function ``maintain()`` takes the same one; behind a
transaction pooler the same lock for one transaction, held open for the pass on a connection of its own).

Retention detaches a segment with ``DETACH PARTITION ... CONCURRENTLY`` (a ``SHARE UPDATE EXCLUSIVE``
lock: publishers and readers go on); its events were marked as removed first, so readers behind
retention notice the loss. Its events are gone from the topic once it is detached. Dropping the detached
tables, which frees their disk space and costs what the file system needs to delete their files (far
more than the detach), is the *purge* that follows the pass, outside the pass's lock (one purge of a
schema at a time): as Kafka deletes a removed segment's files after a delay. The SQL function
``maintain()``, which pg_cron runs inside one transaction where ``CONCURRENTLY`` is not allowed, drops
segments (detached ones first) with a short lock timeout instead.

Compaction (topics with ``cleanup.policy`` ``compact`` or ``compact,delete``, see docs/operations.md) is a
step of the pass too, after retention: the topic's newly sealed segments are mapped into its key map (the
latest position of each key), then the sealed segments due (dirty ratio past ``min.cleanable.dirty.ratio``,
oldest event past ``max.compaction.lag.ms``, tombstones past ``delete.retention.ms``; never a segment whose
newest event is younger than ``min.compaction.lag.ms``, never the open segment) are rewritten, oldest first:
their survivors copied into a fresh table without locking the topic, which then replaces the segment in
one short transaction (waiting at most :data:`COMPACTION_LOCK_TIMEOUT` for the topic table's lock). Rewrites
start only while the pass is younger than its compaction budget (:data:`DEFAULT_COMPACTION_BUDGET`); the
segments left are rewritten by the next passes.

Where pg_cron is loaded, :func:`schedule_maintenance` registers a job running ``maintain()`` in the
database (``pgstreams maintain --schedule``); elsewhere :class:`MaintenanceService` runs the pass on
workers: every worker starts one, and exactly one of them per database (the holder of an advisory lock,
or behind a transaction pooler of a lease that it renews) runs passes, every
:data:`DEFAULT_MAINTENANCE_INTERVAL` seconds.

Retention does not wait for share groups either: marking segments for removal counts, per share group
and partition, the events past its frontier and its released or waiting events in them as lost (moving
the frontier past them), and logs a warning (``share_retention_loss()``, migration 0013). Share groups
need no other maintenance: their locks are times, found expired by the consumers' own polls.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import logging
import os
import re
import socket
import threading
import time
import uuid
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

from .errors import ConfigurationError, ConnectionLost, InvalidArgument, PermissionDenied
from .models import MaintenanceReport
from .services import Service
from .storage.operations import TopicToCheck
from .topicconfig import compacts

if TYPE_CHECKING:
    from .ports import HasSession, SessionPort

log = logging.getLogger("pgstreams.maintenance")
T = TypeVar("T")

#: Seconds between two passes of the maintenance service (and between a follower's tries to lead).
DEFAULT_MAINTENANCE_INTERVAL = 60.0
#: Behind a transaction pooler, a leader's lease lasts this many of its service's intervals unless renewed
#: (at every tick): a pass may take longer than an interval, and a leader that died is replaced within
#: this many intervals and one more.
LEADER_LEASE_INTERVALS = 3
#: How often a pg_cron job runs the pass unless ``every`` says otherwise.
DEFAULT_SCHEDULE_EVERY = "1m"
#: Longest wait of a segment's detach for its lock, in seconds (it is retried at the next pass).
DETACH_LOCK_TIMEOUT = 30.0
#: Connections a purge drops detached segments on at once (it waits on the disk more than on a core).
PURGE_CONNECTIONS = 4
#: Seconds after the start of a maintenance call past which its purge starts no further drop (the drops
#: under way finish; the segments left are dropped by the next call). Keeps one call near this bound
#: however many segments retention detached at once.
DEFAULT_PURGE_BUDGET = 0.5

#: Seconds after the start of a pass past which it starts no further compaction rewrite (the first one of
#: each topic in a pass always runs; the segments left wait for the next pass).
DEFAULT_COMPACTION_BUDGET = 30.0
#: The share of a pass's time compaction works (1.0: it never pauses). Below 1, compaction pauses after each
#: step (mapping a segment, rewriting one) for as long as the step took times ``(1 - duty) / duty``,
#: leaving the cores to publishers and consumers (as Kafka's cleaner throttle does), and takes that much
#: longer. Half by default: working without pauses, compaction's backend takes about 40 % of the
#: publishers' and consumers' rates on 2 busy cores while it runs, at half the time about none
#: (docs/benchmarks.md, Compaction).
DEFAULT_COMPACTION_DUTY = 0.5
#: Longest wait of a compaction's swap for the topic table's lock, in seconds (tried again a few times,
#: then at the next pass).
COMPACTION_LOCK_TIMEOUT = 0.5
#: Tries of a compaction's swap in one pass.
COMPACTION_SWAP_TRIES = 3

_EVERY_RE = re.compile(r"(\d+)\s*([smhd])")


def _report(summary: dict[str, Any], seconds: float) -> MaintenanceReport:
    if summary.get("skipped"):
        return MaintenanceReport(duration=seconds, skipped=True)
    return MaintenanceReport(
        int(summary.get("segments_created", 0)),
        int(summary.get("segments_sealed", 0)),
        int(summary.get("segments_removed", 0)),
        int(summary.get("events_removed", 0)),
        int(summary.get("members_expired", 0)),
        seconds,
        topics_checked=int(summary.get("topics_checked", 0)),
        segments_mapped=int(summary.get("segments_mapped", 0)),
        segments_compacted=int(summary.get("segments_compacted", 0)),
        events_compacted=int(summary.get("events_compacted", 0)),
        segments_to_compact=int(summary.get("segments_to_compact", 0)),
    )


class Maintenance:
    """Runs maintenance passes of the schema of ``client`` (a :class:`pgstreams.Client` or its session; see
    the module docstring). ``clock`` (default :func:`time.monotonic`) times them; ``wall_clock`` (default
    ``None``: the server's time) is the time compaction compares events' ages with (aware datetimes)."""

    def __init__(self, client: HasSession, *, clock: Callable[[], float] = time.monotonic,
                 wall_clock: Callable[[], datetime] | None = None) -> None:
        #: the session the passes run on
        self.session = session = client.session
        self._ops = session.store.operations
        self._groups = session.store.groups
        self._compaction = session.store.compaction
        self._clock = clock
        self._wall_clock = wall_clock
        self._compact_until: float | None = None
        self._duty = DEFAULT_COMPACTION_DUTY
        #: how compaction pauses (seconds; see ``compaction_duty``)
        self.sleep: Callable[[float], None] = time.sleep

    def run(
        self, *, purge: bool = True, purge_budget: float | None = DEFAULT_PURGE_BUDGET,
        compaction_budget: float | None = DEFAULT_COMPACTION_BUDGET,
        compaction_duty: float = DEFAULT_COMPACTION_DUTY,
    ) -> MaintenanceReport:
        """One pass; waits for a pass of the schema running elsewhere to end first. Then, unless ``purge``
        is false, drops the segments retention detached (:meth:`purge`), after the pass's lock is released,
        starting drops only while the call is younger than ``purge_budget`` seconds (default
        :data:`DEFAULT_PURGE_BUDGET`; at least one drop per call; ``None``: drop them all): the segments
        left wait for the next call, detached (nothing reads them). The report's ``duration`` is the
        pass's, ``purge_duration``, ``segments_dropped`` and ``segments_to_purge`` the purge's.
        Compaction starts segment rewrites only while the pass is younger than ``compaction_budget``
        seconds (default :data:`DEFAULT_COMPACTION_BUDGET`; at least one per topic; ``None``: every segment
        due); ``segments_to_compact`` counts those left for the next pass. ``compaction_duty`` (default
        :data:`DEFAULT_COMPACTION_DUTY`; more than 0, at most 1) is the share of its time compaction works,
        pausing between its steps otherwise."""
        for name, budget in (("purge_budget", purge_budget), ("compaction_budget", compaction_budget)):
            if budget is not None and (
                isinstance(budget, bool) or not isinstance(budget, (int, float)) or budget < 0
            ):
                raise InvalidArgument(f"{name} must be a number of seconds >= 0 or None, got {budget!r}")
        if isinstance(compaction_duty, bool) or not isinstance(compaction_duty, (int, float)) \
                or not 0 < compaction_duty <= 1:
            raise InvalidArgument(f"compaction_duty must be a number more than 0 and at most 1, got "
                                  f"{compaction_duty!r}")
        self._duty = float(compaction_duty)
        start = self._clock()
        self._compact_until = None if compaction_budget is None else start + compaction_budget
        totals = {
            "segments_created": 0,
            "segments_sealed": 0,
            "segments_removed": 0,
            "events_removed": 0,
            "members_expired": 0,
            "topics_checked": 0,
            "segments_mapped": 0,
            "segments_compacted": 0,
            "events_compacted": 0,
            "segments_to_compact": 0,
        }
        ops = self._ops
        with self.session.raw_connection() as conn:
            self._groups.prepare_member_connection(conn, DETACH_LOCK_TIMEOUT)
            ops.prepare_pass(conn)
            unlock = ops.lock_pass(conn)
            try:
                for topic in ops.topics_to_check(conn):
                    totals["topics_checked"] += 1
                    try:
                        self._topic(conn, topic, totals)
                    except (psycopg.errors.UndefinedTable, psycopg.errors.ForeignKeyViolation):
                        log.info("topic id %s was deleted during maintenance", topic.topic_id)
                    except psycopg.errors.LockNotAvailable as exc:
                        log.warning(
                            "maintenance of topic id %s waits for a lock: %s (next pass)",
                            topic.topic_id,
                            str(exc).strip(),
                        )
                totals["members_expired"] = ops.expire_members(conn)
                seconds = self._clock() - start
                ops.record_pass(conn, seconds, "python", totals)
            finally:
                unlock()
            report = _report(totals, self._clock() - start)
            if purge:
                begun = self._clock()
                deadline = None if purge_budget is None else start + purge_budget
                dropped, left = self._purge(conn, deadline)
                report = dataclasses.replace(
                    report, segments_dropped=dropped, purge_duration=self._clock() - begun,
                    segments_to_purge=left,
                )
        if report.segments_removed:
            log.info(
                "maintenance removed %d segment(s), %d event(s)",
                report.segments_removed,
                report.events_removed,
            )
        if report.segments_to_purge:
            log.info("maintenance: %d detached segment(s) left to drop at the next pass",
                     report.segments_to_purge)
        return report

    def purge(self) -> int:
        """Drop every segment retention detached and not dropped yet (of every topic; one purge of a schema
        at a time: returns 0 at once while another runs). Returns how many were dropped."""
        with self.session.raw_connection() as conn:
            self._groups.prepare_member_connection(conn, DETACH_LOCK_TIMEOUT)
            self._ops.prepare_pass(conn)
            return self._purge(conn, None)[0]

    def _purge(self, conn: psycopg.Connection, deadline: float | None) -> tuple[int, int]:
        """Drop detached segments, oldest first, on up to :data:`PURGE_CONNECTIONS` connections, starting
        a drop only before ``deadline`` (a time of the clock; the first drop always starts). Returns the
        segments dropped and those left."""
        ops = self._ops
        unlock = ops.try_purge_lock(conn)
        if unlock is None:
            return 0, 0
        try:
            todo = collections.deque(ops.detached_segments(conn))
            total = len(todo)
            if not todo:
                return 0, 0
            guard = threading.Lock()
            started = [0]

            def take() -> tuple[int, int] | None:
                with guard:
                    if not todo or (started[0] and deadline is not None and self._clock() >= deadline):
                        return None
                    started[0] += 1
                    return todo.popleft()

            # deleting files waits on the disk more than on a core: a few connections at once free the
            # space sooner (measured in docs/benchmarks.md)
            workers = min(PURGE_CONNECTIONS, total)
            results: list[int | BaseException] = [0] * workers

            def drop_some(i: int) -> None:
                try:
                    if i == 0:
                        results[i] = self._drop(conn, take)
                        return
                    if not todo:
                        return
                    with self.session.raw_connection() as extra:
                        self._groups.prepare_member_connection(extra, DETACH_LOCK_TIMEOUT)
                        ops.prepare_pass(extra)
                        results[i] = self._drop(extra, take)
                except BaseException as exc:  # noqa: BLE001 - raised below, in the caller's thread
                    results[i] = exc

            threads = [threading.Thread(target=drop_some, args=(i,), name=f"pgstreams-purge-{i}")
                       for i in range(1, workers)]
            for t in threads:
                t.start()
            drop_some(0)
            for t in threads:
                t.join()
            for r in results:
                if isinstance(r, BaseException):
                    raise r
            dropped = sum(r for r in results if isinstance(r, int))
            return dropped, total - dropped
        finally:
            unlock()

    def _drop(self, conn: psycopg.Connection, take: Callable[[], tuple[int, int] | None]) -> int:
        dropped = 0
        while (item := take()) is not None:
            topic_id, segment = item
            try:
                self._ops.drop_detached(conn, topic_id, segment)
                dropped += 1
            except psycopg.errors.LockNotAvailable as exc:
                log.warning("dropping segment %s of topic id %s waits for a lock: %s (next purge)",
                            segment, topic_id, str(exc).strip())
        return dropped

    def _topic(self, conn: psycopg.Connection, topic: TopicToCheck, totals: dict[str, int]) -> None:
        ops = self._ops
        topic_id = topic.topic_id
        totals["segments_created"] += ops.prepare_segments(conn, topic_id)
        totals["segments_sealed"] += ops.seal_segments(conn, topic_id)
        plan = ops.retention_plan(conn, topic_id)
        if plan:
            # marked (and committed) before anything is detached: readers learn of the loss from the marks
            share_lost = ops.mark_removing(
                conn,
                topic_id,
                [s for s, _, _ in plan],
                sum(e for _, e, _ in plan),
                sum(b for _, _, b in plan),
            )
            totals["events_removed"] += sum(e for _, e, _ in plan)
            if share_lost:
                log.warning(
                    "retention removed %d event(s) of topic id %s that share groups had not acquired or "
                    "settled (lost: share_group_status.lost)",
                    share_lost,
                    topic_id,
                )
        for segment in ops.removing_segments(conn, topic_id):
            ops.detach_segment(conn, topic_id, segment)
            totals["segments_removed"] += 1
        if compacts(topic.config):
            self._compact(conn, topic_id, totals)
        ops.topic_checked(conn, topic)

    def _compact(self, conn: psycopg.Connection, topic_id: int, totals: dict[str, int]) -> None:
        """Compaction of one topic (see the module docstring): map, plan, then rewrite the segments due
        while the pass's compaction budget lasts."""
        store = self._compaction
        store.leftovers(conn, topic_id)
        if self._duty >= 1:
            totals["segments_mapped"] += store.map_segments(conn, topic_id)
        else:  # a segment at a time, pausing in between
            while self._paced(lambda: store.map_segments(conn, topic_id, 1)):
                totals["segments_mapped"] += 1
        now = None if self._wall_clock is None else self._wall_clock()
        plan = store.plan(conn, topic_id, now)
        for i, (segment, _reason) in enumerate(plan):
            # the first rewrite of each topic runs whatever the budget: no topic waits for another's
            if i and self._compact_until is not None and self._clock() >= self._compact_until:
                totals["segments_to_compact"] += len(plan) - i
                break
            rewrite = self._paced(functools.partial(store.build, conn, topic_id, segment, now))
            if not rewrite.removed:
                continue
            for _ in range(COMPACTION_SWAP_TRIES):
                if store.swap(conn, topic_id, segment, rewrite, round(COMPACTION_LOCK_TIMEOUT * 1000)):
                    totals["segments_compacted"] += 1
                    totals["events_compacted"] += rewrite.removed
                    break
            else:
                log.warning("compaction of segment %s of topic id %s waits for the topic's lock (next pass)",
                            segment, topic_id)
                totals["segments_to_compact"] += 1
        store.ran(conn, topic_id)

    def _paced(self, step: Callable[[], T]) -> T:
        """Run a compaction step, then pause as ``compaction_duty`` says."""
        began = self._clock()
        out = step()
        if self._duty < 1:
            self.sleep((self._clock() - began) * (1 - self._duty) / self._duty)
        return out


class MaintenanceService(Service):
    """Runs a maintenance pass every ``interval`` seconds (default :data:`DEFAULT_MAINTENANCE_INTERVAL`)
    while it leads its schema: of all the services of a database, only the one holding the schema's
    leader lock (a session advisory lock on a connection of its own) runs passes; the others try to take
    it over every ``interval`` seconds, and do once the leader stops or its connection dies. Behind a
    transaction pooler (``connect(pooler="transaction")``) the leader holds a lease instead (a row it
    renews at every tick, for :data:`LEADER_LEASE_INTERVALS` intervals): once it stops, the others take
    over at their next tick, and once it dies, after its lease ran out. Database errors of a pass are
    logged and the pass retried at the next tick (with a new connection). ``client``: a
    :class:`pgstreams.Client` or its session. :attr:`holder` names it as a leader (host, process and a
    random part)."""

    def __init__(
        self, client: HasSession, interval: float = DEFAULT_MAINTENANCE_INTERVAL, *, name: str = "maintenance"
    ) -> None:
        if isinstance(interval, bool) or not isinstance(interval, (int, float)) or not interval > 0:
            raise InvalidArgument(
                f"maintenance interval must be a positive number of seconds, got {interval!r}"
            )
        super().__init__(name, interval=float(interval))
        #: the session the passes run on
        self.session = session = client.session
        self.maintenance = Maintenance(session)
        self.leader = False
        self.passes = 0
        self.last_report: MaintenanceReport | None = None
        #: the name of this service as a leader
        self.holder = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:12]}"
        #: seconds a lease of this service lasts when not renewed (behind a transaction pooler)
        self.lease = LEADER_LEASE_INTERVALS * float(interval)
        self._conn: psycopg.Connection | None = None

    def step(self) -> None:
        """Lead if possible (or still lead), then run a pass."""
        try:
            if self._conn is None or self._conn.closed:
                self.leader = False
                self._conn = self.session.raw_connection()
            ops = self.session.store.operations
            if not self.leader:
                self.leader = ops.try_lead(self._conn, self.holder, self.lease)
                if self.leader:
                    log.info("maintenance: this process leads schema %s", self.session.schema)
            elif not ops.still_leads(self._conn, self.holder, self.lease):
                self.leader = False
                log.warning("maintenance: this process no longer leads schema %s (its lease ran out)",
                            self.session.schema)
            if self.leader:
                self.last_report = self.maintenance.run()
                self.passes += 1
        except (psycopg.OperationalError, ConnectionLost, PermissionDenied) as exc:
            # a role without the admin grant cannot maintain: the leader lock goes to one that can
            log.warning("maintenance pass failed (retried at the next tick): %s", str(exc).strip())
            self._drop_connection()
        except psycopg.errors.InsufficientPrivilege as exc:
            log.warning("maintenance needs the admin grant (pgstreams grant ROLE --admin): %s",
                        str(exc).strip())
            self._drop_connection()

    def _drop_connection(self) -> None:
        self.leader = False
        if self._conn is not None:
            try:
                self._conn.close()
            except psycopg.Error:  # pragma: no cover - already broken
                pass
        self._conn = None

    def finish(self) -> None:
        """Give up the leadership (resigning; closing the connection releases a session lock anyway), so
        that another service takes over at its next tick."""
        if self.leader and self._conn is not None and not self._conn.closed:
            try:
                self.session.store.operations.resign(self._conn, self.holder)
            except psycopg.Error as exc:  # a lease then runs out by itself
                log.warning("maintenance: could not resign the leadership of schema %s: %s",
                            self.session.schema, str(exc).strip())
        self._drop_connection()


# -- pg_cron -------------------------------------------------------------------------------------------
def cron_schedule(every: str) -> str:
    """The pg_cron schedule of ``every``: ``Ns`` (1 to 59 seconds), ``Nm``, ``Nh`` or ``1d``; raises
    :class:`InvalidArgument` for anything else."""
    m = _EVERY_RE.fullmatch(str(every).strip().lower())
    if not m or int(m.group(1)) < 1:
        raise InvalidArgument(f"invalid --every {every!r}: expected e.g. 30s, 1m, 5m, 1h or 1d")
    n, unit = int(m.group(1)), m.group(2)
    if unit == "s" and n < 60:
        return f"{n} seconds"
    if unit == "s" and n % 60 == 0:
        n, unit = n // 60, "m"
    if unit == "m" and n < 60:
        return "* * * * *" if n == 1 else f"*/{n} * * * *"
    if unit == "m" and n % 60 == 0:
        n, unit = n // 60, "h"
    if unit == "h" and n < 24:
        return "0 * * * *" if n == 1 else f"0 */{n} * * *"
    if (unit == "h" and n == 24) or (unit == "d" and n == 1):
        return "0 0 * * *"
    raise InvalidArgument(
        f"invalid --every {every!r}: pg_cron runs at most daily and in whole units "
        "below a day (e.g. 30s, 5m, 2h, 1d)"
    )


def cron_job_name(client: HasSession) -> str:
    """The name of a schema's pg_cron job: ``pgstreams-maintain:<database>:<schema>`` (``client``: a
    :class:`pgstreams.Client` or its session)."""
    session = client.session
    _, _, database = session.store.operations.pg_cron_settings()
    return f"pgstreams-maintain:{database}:{session.schema}"


def _cron_connection(session: SessionPort) -> tuple[psycopg.Connection, str]:
    loaded, cron_db, database = session.store.operations.pg_cron_settings()
    if not loaded or not cron_db:
        raise ConfigurationError(
            "pg_cron is not loaded on this server (shared_preload_libraries): run maintenance with "
            "workers (their maintenance service) or `pgstreams maintain --loop` instead"
        )
    try:
        conn = psycopg.connect(make_conninfo(session.dsn, dbname=cron_db), autocommit=True)
    except psycopg.Error as exc:
        raise ConfigurationError(f"cannot connect to pg_cron's database {cron_db!r}: {exc}") from exc
    return conn, database


def schedule_maintenance(client: HasSession, every: str = DEFAULT_SCHEDULE_EVERY) -> int:
    """Register (or replace) the pg_cron job that runs the SQL function ``maintain()`` of the client's
    schema in its database every ``every`` (default :data:`DEFAULT_SCHEDULE_EVERY`; see
    :func:`cron_schedule`); creates the pg_cron extension in pg_cron's database if needed. Returns the
    job id. Raises :class:`ConfigurationError` where pg_cron is not loaded."""
    session = client.session
    schedule = cron_schedule(every)
    name = cron_job_name(session)
    ex = session.store.executor
    conn, database = _cron_connection(session)
    with conn:
        ex.run("pg_cron_create", conn=conn)
        command = sql.SQL("SELECT {}.maintain()").format(sql.Identifier(session.schema)).as_string(conn)
        row = ex.one("pg_cron_schedule", (name, schedule, command, database), conn=conn)
    assert row is not None
    return int(row[0])


def unschedule_maintenance(client: HasSession) -> bool:
    """Remove the schema's pg_cron job; False when there was none."""
    session = client.session
    ex = session.store.executor
    conn, _ = _cron_connection(session)
    with conn:
        try:
            rows = ex.all("pg_cron_unschedule", (cron_job_name(session),), conn=conn)
        except psycopg.errors.UndefinedTable:  # the extension is not created: no job
            return False
    return bool(rows)


def scheduled_job(client: HasSession) -> dict[str, Any] | None:
    """The schema's pg_cron job (``jobid``, ``schedule``, ``command``, ``database``, ``active``), ``None``
    when there is none or pg_cron is not loaded."""
    session = client.session
    loaded, cron_db, _ = session.store.operations.pg_cron_settings()
    if not loaded or not cron_db:
        return None
    conn, _ = _cron_connection(session)
    with conn:
        try:
            row = session.store.executor.one("pg_cron_job", (cron_job_name(session),), conn=conn)
        except psycopg.errors.UndefinedTable:
            return None
    if row is None:
        return None
    return dict(zip(("jobid", "schedule", "command", "database", "active"), row, strict=True))
