"""Idempotent publishing: the rules the sync producer and the asyncio client share, written once.

- :class:`ProducerTags`: a client's producer id (drawn once, at its first publish) and the numbering of
  its publishes, the *producer tag* ``(producer id << 32) | (number mod 2^32)`` each publish stores in
  its rows. The asyncio client built over a sync client publishes with that client's tags.
- :class:`Interrupted`, :func:`backend_pid`: a publish whose connection broke (a retriable error) on a
  server session, known by the server's own process id (never the one a connection pooler gives at
  login: see :mod:`pgstreams.storage.identity`); its outcome is unknown.
- :func:`reusable`: whether a producer's own connection may publish again after an attempt.
- :func:`publish_again` and :func:`copy_again`: what a publish does after its outcome was lost, as
  procedures. Each waits until the sessions of the lost attempts ended (their transactions committed or
  rolled back for good), then looks for the tag above the position the client knew before the attempt,
  and stores the events again only if they are absent: stored once. An attempt on a connection whose
  server session is not known is never repeated (:class:`Unsettled`).

The procedures are sans-IO: generators that yield what to do (:data:`Step`: a
:class:`~pgstreams.storage.calls.Call` to run, a :class:`Pause` to wait, :data:`SESSION`, which server
process the connection is, or :data:`REPUBLISH`, store the events again) and are sent each one's
result; :func:`run_steps` runs one with a sync executor and :func:`run_steps_async` with the asyncio
store's. So a change of the rule is one change, tested without a server
(``tests/unit/test_publish_rules.py``), and the two clients keep their own I/O.

Why not generate one client from the other (as ``unasync`` does)? They differ on purpose where it pays:
the sync producer reads the topic's row in a publish's own round trip, streams ``publish_many``'s rows
into the COPY and guards its connection with a thread lock; the asyncio client checks the topic in a task
of its own, draws the producer id in a worker thread and guards its connection with an asyncio lock. A
generated twin would have to give these up. What must agree are decisions, and they are written here.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections.abc import Awaitable, Callable, Generator, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, TypeVar, Union

import psycopg
from psycopg import pq

from ..errors import ConnectionLost
from ..storage import Executor, StoredAt
from ..storage.calls import Call, perform
from ..storage.events import count_produced_call, produced_call, session_busy_call
from ..storage.identity import server_pid

if TYPE_CHECKING:
    from ..storage.asyncstore import AsyncExecutor

T = TypeVar("T")

#: The session of a publish on a connection whose server process is not known (not set up by pgstreams, or
#: behind a transaction pooler, where each transaction may run in another server process):
#: its outcome can never be settled, so it is never published again (see :func:`settled`).
UNIDENTIFIED: Final = 0
#: The low bits of a producer tag: the publish's number mod 2^32.
NUMBER_MASK: Final = 0xFFFFFFFF
#: The producer id's bits (it lies in the tag's high 31 bits: tags are positive bigints).
PRODUCER_ID_MASK: Final = 0x7FFFFFFF


class ProducerTags:
    """The producer tags of one client: its producer id in the high bits, drawn with ``draw`` (a round
    trip) at the first tag (a client that never publishes draws none), and the number of each publish
    (from 1, mod 2^32) in the low ones. Thread-safe."""

    __slots__ = ("_base", "_draw", "_lock", "_numbers")

    def __init__(self, draw: Callable[[], int]) -> None:
        self._draw = draw
        self._base: int | None = None
        self._lock = threading.Lock()
        self._numbers = itertools.count(1)  # thread-safe in CPython (one C call)

    @property
    def drawn(self) -> bool:
        """Whether the producer id was drawn already (then :meth:`next_tag` makes no round trip)."""
        return self._base is not None

    @property
    def base(self) -> int:
        """The producer id in the tags' high bits, drawn now if it was not yet."""
        base = self._base
        if base is None:
            with self._lock:
                if self._base is None:
                    self._base = (self._draw() & PRODUCER_ID_MASK) << 32
                base = self._base
        return base

    def draw(self) -> int:
        """The producer id, drawn now if it was not yet."""
        return self.base >> 32

    def next_tag(self) -> int:
        """The producer tag of the next publish."""
        base = self._base
        if base is None:
            base = self.base
        return base | (next(self._numbers) & NUMBER_MASK)


def backend_pid(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> int | None:
    """The server process ``conn`` runs on, as the server said when pgstreams set the connection up
    (:mod:`pgstreams.storage.identity`; still known after the connection broke, and right behind a
    connection pooler, whose login process id names no server process); :data:`UNIDENTIFIED` for a
    connection pgstreams did not set up."""
    pid = server_pid(conn.pgconn)
    return UNIDENTIFIED if pid is None else pid


def reusable(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> bool:
    """Whether a producer's own connection may publish again after an attempt: it is open and idle (not
    broken, closed, or left in a transaction)."""
    pg = conn.pgconn
    return pg.status == pq.ConnStatus.OK and pg.transaction_status == pq.TransactionStatus.IDLE


class Interrupted(Exception):
    """A publish's connection broke (``error``, retriable) on session ``pid`` (``None`` if none was used):
    its outcome is unknown."""

    def __init__(self, pid: int | None, error: BaseException) -> None:
        super().__init__(str(error))
        self.pid = pid
        self.error = error


@dataclass(frozen=True)
class Unknown:
    """A publish whose outcome is unknown: its topic, the partitions of its events, ``floor`` the position
    the client knew before the attempt (its events were stored above it, if at all), ``pid`` the server
    process the attempt ran on (``None``: none was used; :data:`UNIDENTIFIED`: not known) and its producer
    ``tag`` (``None``: not idempotent). ``later`` gathers the server processes of the attempts that stored
    the events again and were lost too: each must have ended before the next looks for the events."""

    topic_id: int
    partitions: Sequence[int]
    floor: int
    pid: int | None
    tag: int | None
    later: list[int] = field(default_factory=list)

    def sessions(self) -> list[int]:
        """The server processes of the lost attempts, first to last."""
        return ([] if self.pid is None else [self.pid]) + self.later


@dataclass(frozen=True)
class Pause:
    """A step of a procedure: wait ``seconds`` (its result is ``None``)."""

    seconds: float


class Republish:
    """A step of a procedure: store the events again, as the first attempt meant to (its result is what
    that stored: a :class:`~pgstreams.storage.StoredAt` or a count)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "REPUBLISH"


#: The one :class:`Republish` step.
REPUBLISH: Final = Republish()


class Session:
    """A step of a procedure: which server process the connection it runs on is (its result: the
    process id, :data:`UNIDENTIFIED` if not known; no round trip)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "SESSION"


#: The one :class:`Session` step.
SESSION: Final = Session()

#: What a procedure yields.
Step = Union[Call[Any], Pause, Republish, Session]
#: A procedure: a generator yielding :data:`Step` values, sent each one's result, returning ``T``.
Procedure = Generator[Step, Any, T]


class Unsettled(ConnectionLost):
    """A lost publish ran on a connection whose server process is not known: whether it is still running
    cannot be told, so it is not published again (which could store it twice)."""


def settled(unknown: Unknown, waits: Callable[[int], Iterator[float]]) -> Procedure[StoredAt | None]:
    """Wait until the sessions of the lost attempts ended (``waits(pid)``: the pauses between checks, which
    raises once the retry window passed), then where the events tagged ``unknown.tag`` were stored: the
    lowest such event, ``None`` if the attempts stored nothing (or there is no tag to look for)."""
    for pid in unknown.sessions():
        if pid == UNIDENTIFIED:
            raise Unsettled("the outcome of a publish is unknown: its connection was lost, and the server "
                            "session it ran on is not known (a connection not set up by pgstreams, or one "
                            "behind a transaction pooler): it is not published again, which could store it "
                            "twice")
        pauses = waits(pid)
        while (yield session_busy_call(pid)):
            yield Pause(next(pauses))
    if unknown.tag is None:
        return None
    found: StoredAt | None = yield produced_call(unknown.topic_id, unknown.partitions, unknown.floor,
                                                 unknown.tag)
    return found


def store_again(unknown: Unknown) -> Procedure[Any]:
    """Store the events again (:data:`REPUBLISH`), first noting the server process this attempt runs on
    (:data:`SESSION`): if it is lost too, the next attempt waits for it to end."""
    pid: int = yield SESSION
    unknown.later.append(pid)
    stored = yield REPUBLISH
    return stored


def publish_again(unknown: Unknown, waits: Callable[[int], Iterator[float]]) -> Procedure[StoredAt]:
    """A single publish after its outcome was lost: where the lost attempt stored its event, else stored
    now (:func:`store_again`, without the consumers' wake-up: the caller announces the event after)."""
    found = yield from settled(unknown, waits)
    if found is not None:
        return found
    stored: StoredAt = yield from store_again(unknown)
    return stored


def copy_again(unknown: Unknown, count: int, has_ids: bool, waits: Callable[[int], Iterator[float]]
               ) -> Procedure[int]:
    """``publish_many`` of ``count`` events after its outcome was lost: the batch is stored once (all or
    none). Returns what was stored: by the lost attempt, ``count`` (with event ids, some of which the
    topic held already: the events found with the tag, at least one), else what storing it now
    (:data:`REPUBLISH`) stored."""
    found = yield from settled(unknown, waits)
    if found is None:
        stored: int = yield from store_again(unknown)
        return stored
    if not has_ids:
        return count
    assert unknown.tag is not None  # found by it
    tagged: int = yield count_produced_call(unknown.topic_id, unknown.partitions, unknown.floor, unknown.tag)
    return tagged


def run_steps(steps: Procedure[T], ex: Executor, conn: psycopg.Connection, republish: Callable[[], Any]) -> T:
    """Run the procedure ``steps`` on ``conn`` with the sync executor ``ex``; ``republish()`` stores the
    events again."""
    result: Any = None
    while True:
        try:
            step = steps.send(result)
        except StopIteration as done:
            return done.value
        if isinstance(step, Pause):
            time.sleep(step.seconds)
            result = None
        elif isinstance(step, Republish):
            result = republish()
        elif isinstance(step, Session):
            result = backend_pid(conn)
        else:
            result = perform(ex, step, conn)


async def run_steps_async(steps: Procedure[T], ex: AsyncExecutor, conn: psycopg.AsyncConnection[Any],
                          republish: Callable[[], Awaitable[Any]]) -> T:
    """:func:`run_steps` on an async connection with the asyncio store's executor; ``await republish()``
    stores the events again."""
    result: Any = None
    while True:
        try:
            step = steps.send(result)
        except StopIteration as done:
            return done.value
        if isinstance(step, Pause):
            await asyncio.sleep(step.seconds)
            result = None
        elif isinstance(step, Republish):
            result = await republish()
        elif isinstance(step, Session):
            result = backend_pid(conn)
        else:
            result = await ex.perform(step, conn)


__all__ = ["NUMBER_MASK", "PRODUCER_ID_MASK", "REPUBLISH", "SESSION", "UNIDENTIFIED", "Interrupted", "Pause",
           "Procedure", "ProducerTags", "Republish", "Session", "Step", "Unknown", "Unsettled", "backend_pid",
           "copy_again", "publish_again", "reusable", "run_steps", "run_steps_async", "settled",
           "store_again"]
