"""Group membership: members, heartbeats, partition leases and balancing.

Members of a stream group register per topic with a heartbeat interval and a session timeout.
Partitions are spread over the live members by leases, in the ``balance_leases`` SQL function that every
member runs once per heartbeat interval:

* a member whose last heartbeat is older than its session timeout is deleted, and its leases are expired
  (they go to the member waiting for them, else become unowned) with a new *epoch*;
* with ``N`` partitions and ``M`` live members, the fair share is ``ceil(N / M)``: a member claims unowned
  partitions up to it, and steals (asks for) partitions of members above it, or above ``floor(N / M)``
  while it holds fewer than that. Once balanced every member holds ``floor(N / M)`` or ``ceil(N / M)``;
* a stolen partition is not taken away: the thief is recorded as ``new_owner``, and the owner hands the
  lease over (``release_leases``) once the batch in hand is committed. Only the owner processes a
  partition, so two members never process one partition at the same time;
* lease epochs: each commit of a member names the lease epoch it processed under, and
  ``store_checkpoint_fenced`` refuses it (:attr:`CommitOutcome.FENCED`) once the lease has moved on. A
  member also stops starting batches when its last successful heartbeat is older than
  ``session_timeout - heartbeat_interval``, before anyone may expire it.

Time here is the real monotonic clock and PostgreSQL's ``now()``: leases are about real time.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

import psycopg

from ..errors import InvalidArgument
from ..names import check_group
from ..storage import GroupStore, LeaseRow
from .config import check_timing, get_group_config

if TYPE_CHECKING:
    from ..ports import HasSession

log = logging.getLogger("pgstreams.groups")

#: Which connection a membership call runs on: a pooled one, or one of the member's own (heartbeats and
#: balancing never wait behind handlers for a pooled connection, nor behind each other).
ConnectionRole = Literal["pool", "heartbeat", "balance"]


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
    def from_row(cls, row: LeaseRow) -> Leases:
        """The leases of a membership function's result row."""
        alive, owned, epochs, leaving, incoming = row
        return cls(bool(alive), dict(zip(owned or (), epochs or (), strict=True)), frozenset(leaving or ()),
                   frozenset(incoming or ()))


class GroupMember:
    """One member of ``group`` on ``topic``: registers, heartbeats, balances and releases leases.

    Thread-safe. :attr:`changed` is set whenever the leases change (the runtime clears it when it reads
    them). ``heartbeat_interval`` and ``session_timeout`` default to the group's configuration.
    ``client``: a :class:`pgstreams.Client` (or its session).
    """

    def __init__(self, client: HasSession, topic: str, group: str, *, member_id: str | None = None,
                 heartbeat_interval: float | None = None, session_timeout: float | None = None) -> None:
        session = client.session
        self._session = session
        self._store: GroupStore = session.store.groups
        self.group = check_group(group)
        record = session.topic_record(topic)
        self.topic = record.name
        self.topic_id = record.id
        self.partitions = record.partitions
        self.member_id = member_id or new_member_id()
        if not isinstance(self.member_id, str) or not 0 < len(self.member_id) <= 200:
            raise InvalidArgument(f"member_id must be a string of 1 to 200 characters, got {member_id!r}")
        cfg = get_group_config(session, self.group)
        self.config = cfg
        self.heartbeat_interval, self.session_timeout = check_timing(
            cfg.heartbeat_interval if heartbeat_interval is None else heartbeat_interval,
            cfg.session_timeout if session_timeout is None else session_timeout)
        self._lock = threading.Lock()
        self._register_lock = threading.Lock()
        self._conns: dict[ConnectionRole, psycopg.Connection] = {}
        self._conn_locks: dict[ConnectionRole, threading.Lock] = {
            "heartbeat": threading.Lock(), "balance": threading.Lock()}
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

    def _leases_call(self, name: str, role: ConnectionRole) -> LeaseRow | None:
        with self._connection(role) as conn:
            return self._store.leases(name, conn, self.group, self.topic_id, self.member_id)

    def _update(self, row: LeaseRow | None, sent: float | None = None) -> Leases:
        leases = Leases.from_row(row) if row is not None else Leases()
        with self._lock:
            if sent is not None and leases.alive:
                self._last_ok = sent
            if leases != self._leases:
                self._leases = leases
                self.changed.set()
        return leases

    @contextmanager
    def _connection(self, role: ConnectionRole) -> Iterator[psycopg.Connection]:
        if role == "pool":
            with self._session.connection() as conn:
                yield conn
            return
        with self._conn_locks[role]:
            own = self._conns.get(role)
            if own is None or own.closed or own.broken:
                own = self._session.raw_connection()
                self._store.prepare_member_connection(own, self.session_timeout)
                self._conns[role] = own
            try:
                yield own
            except psycopg.OperationalError:
                own.close()
                raise

    def close(self) -> None:
        """Close the member's own connections (after :meth:`leave`)."""
        for role, lock in self._conn_locks.items():
            with lock:
                conn = self._conns.pop(role, None)
                if conn is not None:
                    conn.close()

    # -- operations -------------------------------------------------------------------------------------
    def register(self) -> Leases:
        """Register (or re-register) and run a balancing round at once."""
        sent = time.monotonic()
        with self._connection("heartbeat") as conn:
            self._store.register(conn, self.group, self.topic_id, self.member_id, socket.gethostname(),
                                 os.getpid(), self.heartbeat_interval, self.session_timeout)
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
        return self._ensure_alive(self._update(self._leases_call("member_heartbeat", "heartbeat"), sent))

    def refresh(self) -> Leases:
        """Read the leases (no heartbeat)."""
        return self._update(self._leases_call("member_leases", "heartbeat"))

    def balance(self) -> Leases:
        """Run a balancing round: expire stale members, claim and steal up to the fair share."""
        return self._ensure_alive(self._update(self._leases_call("balance_leases", "balance")))

    def release(self, partitions: Mapping[int, int]) -> list[int]:
        """Hand over ``partitions`` (partition -> epoch owned under); returns those released."""
        if not partitions:
            return []
        with self._connection("pool") as conn:
            released = self._store.release(conn, self.group, self.topic_id, self.member_id, partitions)
        self.refresh()
        return released

    def leave(self) -> int:
        """Leave the group: release every lease and unregister. Returns the number of leases released."""
        with self._register_lock:  # never interleaved with a re-registration in flight
            with self._lock:
                self._left = True
            with self._connection("pool") as conn:
                released = self._store.leave(conn, self.group, self.topic_id, self.member_id)
        self._update(None)
        return released
