"""The :class:`~pgstreams.worker.source.Source` of a stream group: checkpoints per partition, read through
a :class:`~pgstreams.consumer.StreamReader`, on the partitions a group member holds leases on (or on a
fixed set of partitions)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING

import psycopg

from ..consumer import (
    CheckpointTransaction,
    LeaseClaim,
    Start,
    StreamReader,
    Wakeup,
    create_checkpoints,
    topic_wakeup,
)
from ..groups import GroupMember
from ..models import CommitOutcome, Event
from .source import Commit, Reassignment, Transaction

if TYPE_CHECKING:
    from ..ports import SessionPort

log = logging.getLogger("pgstreams.worker")

#: Longest uninterrupted wait while idle: stop requests and lease changes are seen this fast.
_SLICE = 0.05
#: Idle-in-transaction limit of handler transactions of a source that is not a group member.
_STATIC_SESSION_TIMEOUT = 60.0


class StreamSource:
    """Events of a stream group, committed as checkpoints. Use :meth:`leased` or :meth:`fixed`.

    As a group member it reads the partitions whose leases the member holds (not those it is handing
    over), while the member is alive and healthy; its commits are fenced by the lease epochs it read
    under; between batches (:meth:`sync`) it hands over the partitions other members wait for. With a
    fixed reader it reads that reader's partitions, unfenced.
    """

    def __init__(self, session: SessionPort, topic: str, group: str, topic_id: int, *,
                 reader: StreamReader | None = None, member: GroupMember | None = None,
                 start: Start = "earliest") -> None:
        self.topic = topic
        self.group = group
        self.topic_id = topic_id
        self.member = member
        self._session = session
        self._start = start
        self._reader = reader
        # partition -> lease epoch processed under (-1 without leases)
        self._current: Mapping[int, int] = dict.fromkeys(reader.partitions, -1) if reader is not None else {}
        self._partitions: tuple[int, ...] = tuple(sorted(self._current))
        self._lease: LeaseClaim | None = None
        self._reread = False
        self._never = threading.Event()  # what an idle source without membership waits on

    @classmethod
    def fixed(cls, reader: StreamReader) -> StreamSource:
        """The partitions of ``reader`` (positioned at its checkpoints), without membership or fencing."""
        return cls(reader.session, reader.topic, reader.group, reader.topic_id, reader=reader)

    @classmethod
    def leased(cls, group: StreamReader, member: GroupMember) -> StreamSource:
        """The partitions ``member`` holds leases on, of the topic and group of ``group`` (a reader of
        them, e.g. from :func:`pgstreams.consumer.create_checkpoints`, whose ``start`` gives partitions
        without a checkpoint theirs)."""
        return cls(group.session, group.topic, group.group, group.topic_id, member=member, start=group.start)

    @property
    def partitions(self) -> tuple[int, ...]:
        return self._partitions

    @property
    def session_timeout(self) -> float:
        """How long a handler transaction may stay idle: the member's session timeout (60 s without)."""
        return self.member.session_timeout if self.member is not None else _STATIC_SESSION_TIMEOUT

    # -- assignment ---------------------------------------------------------------------------------------
    def _desired(self) -> dict[int, int]:
        m = self.member
        assert m is not None
        leases = m.leases
        if not (leases.alive and m.healthy()):
            return {}
        return {p: e for p, e in leases.owned.items() if p not in leases.leaving}

    def sync(self) -> Reassignment | None:
        m = self.member
        if m is None:
            if not self._reread or self._reader is None:
                return None
            with self._session.connection() as conn:
                self._reader.load(conn)
            self._reread = False
            return Reassignment(self._partitions, rebalanced=False)
        m.changed.clear()
        leases = m.leases
        if leases.leaving and leases.alive and m.healthy():
            give = {p: leases.owned[p] for p in leases.leaving if p in leases.owned}
            released = m.release(give)
            if released:
                log.info("%s: handed over partitions %s of %s", m.member_id, released, self.topic)
        desired = self._desired()
        if desired == self._current and not self._reread:
            return None
        self._reread = False
        gained = tuple(sorted(set(desired) - set(self._current)))
        lost = tuple(sorted(set(self._current) - set(desired)))
        self._current = dict(desired)
        self._partitions = tuple(sorted(desired))
        self._reader = None
        self._lease = None
        if desired:
            self._reader = create_checkpoints(self._session, self.topic, self.group, start=self._start,
                                              partitions=self._partitions)
            self._lease = LeaseClaim(m.member_id, dict(desired))
        return Reassignment(self._partitions, gained, lost)

    def changed(self) -> bool:
        m = self.member
        if m is None:
            return False
        return m.changed.is_set() or (bool(self._current) and not m.healthy())

    def owns(self, partitions: Collection[int], *, leaving_ok: bool = False) -> bool:
        m = self.member
        if m is None:
            return True
        leases = m.leases
        if not (leases.alive and m.healthy()):
            return False
        current = self._current
        return all(leases.owned.get(p) == current.get(p) and (leaving_ok or p not in leases.leaving)
                   for p in partitions)

    def idle(self, interrupt: Callable[[], bool]) -> None:
        changed = self.member.changed if self.member is not None else self._never
        end = time.monotonic() + self._session.poll_interval
        while time.monotonic() < end and not interrupt():
            if changed.wait(_SLICE):
                return

    def lost(self, commit: Commit) -> None:
        if commit.outcome is CommitOutcome.FENCED and self.member is not None:
            try:
                self.member.refresh()
            except psycopg.Error:
                pass
        self._drop()

    def reset(self) -> None:
        self._drop()

    def _drop(self) -> None:
        self._reread = True
        if self.member is not None:  # rebuilt from the leases at the next sync
            self._current = {}
            self._partitions = ()
            self._reader = None
            self._lease = None

    # -- events -------------------------------------------------------------------------------------------
    def waiter(self, interrupt: Callable[[], bool]) -> Wakeup:
        return topic_wakeup(self._session, self.topic_id, interrupt=interrupt)

    def _require(self) -> StreamReader:
        if self._reader is None:
            raise RuntimeError("no partitions assigned")
        return self._reader

    def fetch(self, max_events: int, partitions: Collection[int]) -> list[Event]:
        reader = self._require()
        if len(partitions) == len(reader.partitions):
            return self._session.run(lambda conn: reader.fetch(conn, max_events))
        own = [p for p in reader.partitions if p in partitions]
        return self._session.run(lambda conn: reader.fetch(conn, max_events, own))

    @contextmanager
    def transaction(self, *, bounded: bool = False) -> Iterator[CheckpointTransaction]:
        reader = self._require()
        with self._session.connection() as conn:
            with reader.transaction(conn, lease=self._lease,
                                    idle_timeout=self.session_timeout if bounded else None) as tx:
                yield tx

    def commit(self, events: Sequence[Event], tx: Transaction | None = None) -> Commit:
        reader = self._require()
        if tx is None:
            targets = reader.targets(events)
            lease = self._lease
            outcome = self._session.run(lambda conn: reader.commit(conn, targets, lease))
        else:
            assert isinstance(tx, CheckpointTransaction)
            outcome = tx.store(events)
        return Commit(outcome, dict(reader.last_outcomes))

    def release(self, events: Sequence[Event]) -> None:
        # every cursor back to its checkpoint: only what was not committed is read again, and this costs
        # nothing per event
        if self._reader is not None:
            self._reader.rewind()
