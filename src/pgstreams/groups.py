"""Group membership: members, heartbeats, partition leases, group configuration and status.

Members of a stream group register per topic with a heartbeat interval and a session timeout (seed 001).
Partitions are spread over the live members by leases (seed 002), in the ``balance_leases`` SQL function
that every member runs once per heartbeat interval:

* a member whose last heartbeat is older than its session timeout is deleted, and its leases are expired
  (they go to the member waiting for them, else become unowned) with a new *epoch*;
* with ``N`` partitions and ``M`` live members, the fair share is ``ceil(N / M)``: a member claims unowned
  partitions up to it, and steals (asks for) partitions of members above it, or above ``floor(N / M)``
  while it holds fewer than that. Once balanced every member holds ``floor(N / M)`` or ``ceil(N / M)``;
* a stolen partition is not taken away: the thief is recorded as ``new_owner``, and the owner hands the
  lease over (``release_leases``) once the batch in hand is committed. Only the owner processes a
  partition, so two members never process one partition at the same time;
* fencing: each commit of a member names the lease epoch it processed under, and
  ``store_checkpoint_fenced`` refuses it (:attr:`CommitOutcome.FENCED`) once the lease has moved on. A
  member also stops starting batches when its last successful heartbeat is older than
  ``session_timeout - heartbeat_interval``, before anyone may expire it.

Time here is the real monotonic clock and PostgreSQL's ``now()``: leases are about real time.
"""

from __future__ import annotations

import logging
import math
import os
import socket
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg.rows import tuple_row

from ._names import check_group, check_topic
from .errors import InvalidArgument
from .services import Service

if TYPE_CHECKING:
    from .client import Client

log = logging.getLogger("pgstreams.groups")

#: Default seconds between two heartbeats of a member (and between two balancing runs).
DEFAULT_HEARTBEAT_INTERVAL = 3.0
#: Default seconds without a heartbeat after which a member is stale and loses its leases.
DEFAULT_SESSION_TIMEOUT = 30.0


def _utc(dt: datetime | None) -> datetime | None:
    return None if dt is None else dt.astimezone(timezone.utc)


def _seconds(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or value <= 0:
        raise InvalidArgument(f"{name} must be a positive number of seconds, got {value!r}")
    if value < 0.01 or value > 86400:
        raise InvalidArgument(f"{name} must be between 0.01 and 86400 seconds, got {value!r}")
    return float(value)


def check_timing(heartbeat_interval: object, session_timeout: object) -> tuple[float, float]:
    """Validate a heartbeat interval and session timeout (seconds); the timeout must be at least twice
    the interval, so a member heartbeats at least once before it stops trusting its leases."""
    hb = _seconds("heartbeat_interval", heartbeat_interval)
    st = _seconds("session_timeout", session_timeout)
    if st < 2 * hb:
        raise InvalidArgument(
            f"session_timeout ({st:g} s) must be at least twice heartbeat_interval ({hb:g} s)")
    return hb, st


# -- configuration --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class GroupConfig:
    """Settings of a group shared by its members (table ``group_config``).

    ``heartbeat_interval`` (default :data:`DEFAULT_HEARTBEAT_INTERVAL`, 3 s) and ``session_timeout``
    (default :data:`DEFAULT_SESSION_TIMEOUT`, 30 s) apply to members that do not set their own.
    ``dead_letter`` (default true) says whether events whose retries are spent go to a dead-letter topic:
    ``dead_letter_topic``, or ``"<topic>.dlt"`` when that is ``None`` (the default). With
    ``dead_letter=False`` the group retries a failing event forever.
    """

    group: str
    heartbeat_interval: float = DEFAULT_HEARTBEAT_INTERVAL
    session_timeout: float = DEFAULT_SESSION_TIMEOUT
    dead_letter: bool = True
    dead_letter_topic: str | None = None
    updated_at: datetime | None = None

    def dead_letter_for(self, topic: str) -> str | None:
        """The dead-letter topic of ``topic`` for this group, ``None`` when disabled."""
        if not self.dead_letter:
            return None
        return self.dead_letter_topic or f"{topic}.dlt"


def get_group_config(client: Client, group: str) -> GroupConfig:
    """The configuration of ``group`` (the defaults when it was never configured)."""
    check_group(group)
    with client.connection() as conn:
        row = conn.cursor(row_factory=tuple_row).execute(client._q("get_group_config"), (group,)).fetchone()
    if row is None:
        return GroupConfig(group)
    hb_ms, st_ms, dl, dlt, updated = row
    return GroupConfig(
        group,
        hb_ms / 1000 if hb_ms is not None else DEFAULT_HEARTBEAT_INTERVAL,
        st_ms / 1000 if st_ms is not None else DEFAULT_SESSION_TIMEOUT,
        bool(dl), dlt, _utc(updated),
    )


def configure_group(client: Client, group: str, *, heartbeat_interval: float | None = None,
                    session_timeout: float | None = None,
                    dead_letter: str | bool | None = None) -> GroupConfig:
    """Change the configuration of ``group``; arguments left ``None`` keep their current value.

    ``dead_letter``: ``True`` for the default dead-letter topic ``"<topic>.dlt"``, a topic name for that
    topic, ``False`` for none (failing events are retried forever). Members read the configuration when
    they start. Returns the new configuration.
    """
    check_group(group)
    cur = get_group_config(client, group)
    hb = cur.heartbeat_interval if heartbeat_interval is None else heartbeat_interval
    st = cur.session_timeout if session_timeout is None else session_timeout
    hb, st = check_timing(hb, st)
    dl, dlt = cur.dead_letter, cur.dead_letter_topic
    if dead_letter is True:
        dl, dlt = True, None
    elif dead_letter is False:
        dl, dlt = False, None
    elif isinstance(dead_letter, str):
        dl, dlt = True, check_topic(dead_letter)
    elif dead_letter is not None:
        raise InvalidArgument(f"dead_letter must be a topic name, True or False, not {dead_letter!r}")
    with client.connection() as conn:
        conn.execute(client._q("put_group_config"), (group, round(hb * 1000), round(st * 1000), dl, dlt))
    return get_group_config(client, group)


# -- status ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PartitionStatus:
    """One row of the ``consumer_group_status`` view: a group's partition of a topic.

    ``owner`` is the member holding the lease (``None``: unowned) and ``pending_owner`` the member waiting
    for it; ``last_heartbeat`` is the owner's; ``stale`` is true when the owner missed its session timeout
    (or is gone) and the lease is about to expire. ``checkpoint`` is the last committed position (``None``
    before any), ``head`` the last event's position, ``lag`` the events after the checkpoint.
    ``retry_state`` is ``"retrying"`` while the owner retries the event at ``retry_position`` (after
    ``retry_attempts`` failures, the last one ``last_error``), ``"blocked"`` when its retries are spent and
    no dead-letter topic takes it (the group retries it forever), else ``None``.
    """

    group: str
    topic: str
    partition: int
    owner: str | None
    pending_owner: str | None
    epoch: int | None
    acquired_at: datetime | None
    last_heartbeat: datetime | None
    stale: bool
    checkpoint: int | None
    head: int | None
    lag: int
    checkpoint_at: datetime | None
    retry_state: str | None = None
    retry_position: int | None = None
    retry_attempts: int | None = None
    last_error: str | None = None
    error_at: datetime | None = None

    def as_dict(self) -> dict[str, Any]:
        """A JSON-friendly dict (datetimes as ISO 8601 strings)."""
        out: dict[str, Any] = {}
        for k, v in self.__dict__.items():
            out[k] = v.isoformat() if isinstance(v, datetime) else v
        return out


@dataclass(frozen=True)
class MemberInfo:
    """A registered member of a group on a topic, with the partitions it owns."""

    group: str
    topic: str
    member_id: str
    host: str | None
    pid: int | None
    registered_at: datetime
    last_heartbeat: datetime
    heartbeat_interval: float
    session_timeout: float
    stale: bool
    partitions: tuple[int, ...]

    def as_dict(self) -> dict[str, Any]:
        """A JSON-friendly dict (datetimes as ISO 8601 strings)."""
        out: dict[str, Any] = {}
        for k, v in self.__dict__.items():
            out[k] = v.isoformat() if isinstance(v, datetime) else (list(v) if isinstance(v, tuple) else v)
        return out


def group_status(client: Client, group: str, topic: str | None = None) -> list[PartitionStatus]:
    """The ``consumer_group_status`` rows of ``group`` (of one ``topic`` if given), by topic and partition.
    Empty when the group has no checkpoints. Counting the lag is proportional to it."""
    check_group(group)
    if topic is not None:
        check_topic(topic)
    with client.connection() as conn:
        rows = conn.cursor(row_factory=tuple_row).execute(
            client._q("consumer_group_status"), (group, topic, topic)).fetchall()
    out = []
    for r in rows:
        (g, t, p, owner, pending, epoch, acquired, hb, stale, ckpt, head, lag, ckpt_at, rstate, rpos,
         rattempts, err, err_at) = r
        out.append(PartitionStatus(g, t, p, owner, pending, epoch, _utc(acquired), _utc(hb), bool(stale),
                                   ckpt, head, int(lag or 0), _utc(ckpt_at), rstate, rpos, rattempts, err,
                                   _utc(err_at)))
    return out


def group_members(client: Client, group: str, topic: str | None = None) -> list[MemberInfo]:
    """The registered members of ``group`` (on one ``topic`` if given), stale ones included."""
    check_group(group)
    if topic is not None:
        check_topic(topic)
    with client.connection() as conn:
        rows = conn.cursor(row_factory=tuple_row).execute(
            client._q("group_members"), (group, topic, topic)).fetchall()
    return [MemberInfo(group, t, mid, host, pid, _utc(reg) or reg, _utc(hb) or hb, hb_ms / 1000, st_ms / 1000,
                       bool(stale), tuple(parts or ()))
            for t, mid, host, pid, reg, hb, hb_ms, st_ms, stale, parts in rows]


# -- a member -------------------------------------------------------------------------------------------
def new_member_id() -> str:
    """A member id unique to this process: ``host:pid:random``."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


@dataclass(frozen=True)
class Leases:
    """What a member holds: ``owned`` partitions with their lease epochs, the owned ones another member
    waits for (``leaving``: hand them over after the batch in hand), and those it waits for
    (``incoming``). ``alive`` is false when the member is not registered (it was expired)."""

    alive: bool = False
    owned: Mapping[int, int] = field(default_factory=dict)
    leaving: frozenset[int] = frozenset()
    incoming: frozenset[int] = frozenset()

    @classmethod
    def from_row(cls, row: tuple[Any, ...]) -> Leases:
        alive, owned, epochs, leaving, incoming = row
        return cls(bool(alive), dict(zip(owned or (), epochs or (), strict=True)), frozenset(leaving or ()),
                   frozenset(incoming or ()))


class GroupMember:
    """One member of ``group`` on ``topic``: registers, heartbeats, balances and releases leases.

    Thread-safe. :attr:`changed` is set whenever the leases change (the runtime clears it when it reads
    them). ``heartbeat_interval`` and ``session_timeout`` default to the group's configuration.
    """

    def __init__(self, client: Client, topic: str, group: str, *, member_id: str | None = None,
                 heartbeat_interval: float | None = None, session_timeout: float | None = None) -> None:
        self._client = client
        self.group = check_group(group)
        self._meta = client._topic(topic)
        self.topic = self._meta.name
        self.partitions = self._meta.partitions
        self.member_id = member_id or new_member_id()
        if not isinstance(self.member_id, str) or not 0 < len(self.member_id) <= 200:
            raise InvalidArgument(f"member_id must be a string of 1 to 200 characters, got {member_id!r}")
        cfg = get_group_config(client, self.group)
        self.config = cfg
        self.heartbeat_interval, self.session_timeout = check_timing(
            cfg.heartbeat_interval if heartbeat_interval is None else heartbeat_interval,
            cfg.session_timeout if session_timeout is None else session_timeout)
        self._lock = threading.Lock()
        self._register_lock = threading.Lock()
        self._conns: dict[str, psycopg.Connection] = {}
        self._conn_locks = {"heartbeat": threading.Lock(), "balance": threading.Lock()}
        self._leases = Leases()
        self._last_ok: float | None = None
        self._registered = False
        self._left = False
        self.changed = threading.Event()

    def __repr__(self) -> str:
        return f"<pgstreams.GroupMember {self.member_id!r} group={self.group!r} topic={self.topic!r}>"

    # -- state ------------------------------------------------------------------------------------------
    @property
    def leases(self) -> Leases:
        """The leases as last seen."""
        with self._lock:
            return self._leases

    def healthy(self) -> bool:
        """True while the last successful heartbeat is recent enough to trust the leases: younger than
        ``session_timeout - heartbeat_interval``."""
        last = self._last_ok
        return last is not None and time.monotonic() - last < self.session_timeout - self.heartbeat_interval

    def _update(self, row: tuple[Any, ...] | None, sent: float | None = None) -> Leases:
        leases = Leases.from_row(row) if row is not None else Leases()
        with self._lock:
            if sent is not None and leases.alive:
                self._last_ok = sent
            if leases != self._leases:
                self._leases = leases
                self.changed.set()
        return leases

    def _call(self, name: str, params: tuple[Any, ...], channel: str = "pool") -> tuple[Any, ...] | None:
        if channel == "pool":
            with self._client.connection() as conn:
                return conn.cursor(row_factory=tuple_row).execute(self._client._q(name), params).fetchone()
        # heartbeats and balancing have connections of their own: they never wait behind handlers for a
        # pooled connection, nor behind each other (a balancing round may wait for lease locks)
        with self._conn_locks[channel]:
            own = self._conns.get(channel)
            if own is None or own.closed or own.broken:
                own = self._client._raw_connect()
                own.execute("SELECT set_config('lock_timeout', %s, false)",
                            (str(round(self.session_timeout * 1000)),))
                self._conns[channel] = own
            try:
                return own.cursor(row_factory=tuple_row).execute(self._client._q(name), params).fetchone()
            except psycopg.OperationalError:
                own.close()
                raise

    def close(self) -> None:
        """Close the member's own connections (after :meth:`leave`)."""
        for channel, lock in self._conn_locks.items():
            with lock:
                conn = self._conns.pop(channel, None)
                if conn is not None:
                    conn.close()

    # -- operations -------------------------------------------------------------------------------------
    def register(self) -> Leases:
        """Register (or re-register) and run a balancing round at once."""
        sent = time.monotonic()
        self._call("register_member", (self.group, self._meta.id, self.member_id, socket.gethostname(),
                                       os.getpid(), round(self.heartbeat_interval * 1000),
                                       round(self.session_timeout * 1000)), "heartbeat")
        with self._lock:
            self._last_ok = sent
            self._registered = True
            self._left = False
        return self.balance()

    def _ensure_alive(self, leases: Leases) -> Leases:
        if leases.alive or self._left:
            return leases
        with self._register_lock:  # the heartbeat and the balancer may both notice
            current = self.refresh()
            if current.alive or self._left:
                return current
            log.warning("member %s of group %s on %s was expired (missed its session timeout); registering "
                        "again", self.member_id, self.group, self.topic)
            return self.register()

    def heartbeat(self) -> Leases:
        """Refresh the heartbeat and read the leases; re-register if this member was expired."""
        sent = time.monotonic()
        row = self._call("member_heartbeat", (self.group, self._meta.id, self.member_id), "heartbeat")
        return self._ensure_alive(self._update(row, sent))

    def refresh(self) -> Leases:
        """Read the leases (no heartbeat)."""
        return self._update(self._call("member_leases", (self.group, self._meta.id, self.member_id),
                                       "heartbeat"))

    def balance(self) -> Leases:
        """Run a balancing round: expire stale members, claim and steal up to the fair share."""
        row = self._call("balance_leases", (self.group, self._meta.id, self.member_id), "balance")
        return self._ensure_alive(self._update(row))

    def release(self, partitions: Mapping[int, int]) -> list[int]:
        """Hand over ``partitions`` (partition -> epoch owned under); returns those released."""
        if not partitions:
            return []
        ps = sorted(partitions)
        row = self._call("release_leases",
                         (self.group, self._meta.id, self.member_id, ps, [partitions[p] for p in ps]))
        released = list(row[0]) if row and row[0] else []
        self.refresh()
        return released

    def leave(self) -> int:
        """Leave the group: release every lease and unregister. Returns the number of leases released."""
        with self._register_lock:  # never interleaved with a re-registration in flight
            with self._lock:
                self._left = True
            row = self._call("leave_group", (self.group, self._meta.id, self.member_id))
        self._update(None)
        return int(row[0]) if row else 0


# -- the membership services ----------------------------------------------------------------------------
def _transient(exc: BaseException) -> bool:
    return isinstance(exc, (psycopg.OperationalError, psycopg.errors.DeadlockDetected,
                            psycopg.errors.SerializationFailure, psycopg.errors.LockNotAvailable))


class HeartbeatService(Service):
    """Heartbeats a member every ``heartbeat_interval``; while it waits for a hand-over it also reads its
    leases every fifth of the interval, so it starts on a partition soon after the owner released it.
    Connection errors are logged and retried at the next tick; anything else kills the service."""

    def __init__(self, member: GroupMember) -> None:
        super().__init__(f"heartbeat:{member.group}/{member.topic}")
        self.member = member
        self._next = 0.0

    def step(self) -> None:
        now = time.monotonic()
        try:
            if now >= self._next:
                self._next = now + self.member.heartbeat_interval
                self.member.heartbeat()
            elif self.member.leases.incoming:
                self.member.refresh()
        except Exception as exc:
            if not _transient(exc):
                raise
            log.warning("heartbeat of %s failed (will retry): %s", self.member.member_id, exc)

    def interval(self) -> float:
        until = max(0.0, self._next - time.monotonic())
        if self.member.leases.incoming:
            return min(until, self.member.heartbeat_interval / 5)
        return until


class BalancerService(Service):
    """Runs a balancing round for a member every ``heartbeat_interval`` (expire, claim, steal)."""

    def __init__(self, member: GroupMember) -> None:
        super().__init__(f"balancer:{member.group}/{member.topic}", interval=member.heartbeat_interval)
        self.member = member

    def step(self) -> None:
        try:
            self.member.balance()
        except Exception as exc:
            if not _transient(exc):
                raise
            log.warning("balancing of %s failed (will retry): %s", self.member.member_id, exc)
