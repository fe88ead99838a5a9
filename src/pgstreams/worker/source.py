"""What the runtime reads from: the :class:`Source` protocol and the values it returns.

A source hands out events of the partitions assigned to this process and takes back what became of them:
:meth:`Source.commit` (events handled, optionally inside a transaction the source opened for the
handler) or :meth:`Source.release` (events fetched but not committed: they are delivered again). It also
says which partitions are assigned and when that changed, so the runner stops starting work on
partitions it lost. Everything is by event: a stream group commits the position after the events of each
partition, while a source with per-event acknowledgements (share groups) can ack exactly those events.

:class:`pgstreams.worker.streams.StreamSource` implements it for stream groups.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Protocol

import psycopg

from ..models import CommitOutcome, Event


@dataclass(frozen=True)
class Commit:
    """What committing events did: the most severe ``outcome`` and the outcome per partition."""

    outcome: CommitOutcome
    outcomes: Mapping[int, CommitOutcome] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """``STORED`` or ``IGNORED``: the source's view of what was handled is current."""
        return self.outcome.ok

    def refused(self) -> list[int]:
        """The partitions whose commit was refused (sorted)."""
        return sorted(p for p, o in self.outcomes.items() if not o.ok)


@dataclass(frozen=True)
class Reassignment:
    """The assigned partitions changed (``partitions`` now; ``gained`` and ``lost`` since the last one),
    or, with ``rebalanced`` false, the same partitions are read again from their checkpoints. Either
    way, events fetched before are delivered again."""

    partitions: tuple[int, ...]
    gained: tuple[int, ...] = ()
    lost: tuple[int, ...] = ()
    rebalanced: bool = True


class Transaction(Protocol):
    """A transaction a source opened for a handler: the handler writes on :attr:`connection`."""

    @property
    def connection(self) -> psycopg.Connection: ...


class Waiter(Protocol):
    """Waits for new events (see :class:`pgstreams.consumer.Wakeup`): :meth:`restart` when collecting
    starts, :meth:`mark` before every fetch, :meth:`wait` after one that found too little."""

    def restart(self) -> None: ...

    def mark(self) -> None: ...

    def wait(self, limit: float = math.inf) -> bool: ...


class Source(Protocol):
    """Where a runner's events come from and where their outcomes go. Used from one thread."""

    #: the topic and group, for logs and dead-letter headers
    topic: str
    group: str

    @property
    def partitions(self) -> tuple[int, ...]:
        """The partitions assigned now, sorted (empty: nothing to do)."""
        ...

    # -- assignment --------------------------------------------------------------------------------------
    def sync(self) -> Reassignment | None:
        """Between batches: follow assignment changes (hand over what others wait for, take what was
        given). Returns what changed, or ``None``."""
        ...

    def changed(self) -> bool:
        """The assignment changed (or can no longer be trusted) since :meth:`sync`: finish the batch in
        hand and sync."""
        ...

    def owns(self, partitions: Collection[int], *, leaving_ok: bool = False) -> bool:
        """Still allowed to process these partitions; ``leaving_ok``: also those promised to another
        member once the batch in hand is done."""
        ...

    def idle(self, interrupt: Callable[[], bool]) -> None:
        """Nothing is assigned: wait a while (at most a poll interval) for that to change, returning early
        when ``interrupt()`` is true."""
        ...

    def lost(self, commit: Commit) -> None:
        """A commit was refused (fenced, or another consumer moved the checkpoint): stop processing its
        partitions; the next :meth:`sync` reads again from the checkpoints."""
        ...

    def reset(self) -> None:
        """After a database error: drop what was fetched; the next :meth:`sync` starts afresh."""
        ...

    # -- events ------------------------------------------------------------------------------------------
    def waiter(self, interrupt: Callable[[], bool]) -> Waiter:
        """A :class:`Waiter` for this source's events whose waits end early once ``interrupt()``."""
        ...

    def fetch(self, max_events: int, partitions: Collection[int]) -> list[Event]:
        """Up to ``max_events`` new events of ``partitions`` (assigned ones not paused); no waiting. An
        event is not fetched again until released."""
        ...

    def transaction(self, *, bounded: bool = False) -> AbstractContextManager[Transaction]:
        """A transaction for a handler's writes and a :meth:`commit` in it; it commits at the end if the
        commit in it was accepted (or none happened), else rolls back; an exception rolls it back.
        ``bounded``: the server ends it if its holder stays idle in it past the source's session timeout."""
        ...

    def commit(self, events: Sequence[Event], tx: Transaction | None = None) -> Commit:
        """Mark ``events`` handled: at once, or as part of ``tx`` (taking effect when it commits)."""
        ...

    def release(self, events: Sequence[Event]) -> None:
        """Those of ``events`` not committed are delivered again (fetched again)."""
        ...
