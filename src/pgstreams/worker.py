"""Workers: long-running consumers that run handlers on the partitions their group gives them.

A :class:`Worker` runs one or more subscriptions (topic, group, handler) in a process. For each one it
joins the group as a member (see :mod:`pgstreams.groups`): it registers, heartbeats, takes its fair share
of the partitions by leases and hands partitions over when others join or leave. Only the owner of a
partition's lease processes it, and its commits are fenced by the lease epoch.

Handlers take one event (``batch=False``, the default) or a list of events (``batch=True``); in
``"transactional"`` mode they also get the psycopg connection of the transaction that stores the
checkpoint. Batches follow EventSQL's consumption config: a batch is delivered once ``min_events`` events
are at hand (at most ``max_events``), or, with fewer, once ``max_wait`` seconds have passed since the
previous batch was handed over. New events wake the worker through LISTEN/NOTIFY; it also polls every
``poll_interval`` of the client.

A handler exception is retried with the :class:`RetryPolicy` backoff; the partition of the failing event
pauses meanwhile (its later events wait, other partitions go on). When the attempts are spent the event
goes to the group's dead-letter topic with headers saying why, and the partition moves on; with no
dead-letter topic the event is retried forever and the group status says ``blocked``.

On SIGINT/SIGTERM (:meth:`Worker.run`) or :meth:`Worker.stop` the worker finishes and commits the batch in
hand, gives back its leases and returns.
"""

from __future__ import annotations

import importlib
import inspect
import logging
import math
import random
import signal
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from types import FrameType
from typing import TYPE_CHECKING, Any, Literal

import psycopg

from ._names import check_topic
from .consumer import Consumer, Start, _check_start
from .errors import InvalidArgument, TopicConflict, TopicNotFound
from .groups import (
    BalancerService,
    GroupMember,
    HeartbeatService,
    check_timing,
    get_group_config,
    new_member_id,
)
from .models import CommitOutcome, Event
from .services import Service, ServiceFailed, Supervisor

if TYPE_CHECKING:
    from .client import Client, _TopicMeta

log = logging.getLogger("pgstreams.worker")

#: A monotonic clock in seconds (``time.monotonic`` by default); inject another one in tests.
Clock = Callable[[], float]
#: Processing modes: ``"at-least-once"`` (commit after the handler) or ``"transactional"``.
Mode = Literal["at-least-once", "transactional"]
MODES: tuple[str, ...] = ("at-least-once", "transactional")

#: Headers added to an event sent to a dead-letter topic (the original headers are kept).
DLT_GROUP = "dlt.group"
DLT_TOPIC = "dlt.topic"
DLT_PARTITION = "dlt.partition"
DLT_POSITION = "dlt.position"
DLT_EVENT_ID = "dlt.event_id"
DLT_ERROR_TYPE = "dlt.error_type"
DLT_ERROR_MESSAGE = "dlt.error_message"
DLT_ATTEMPTS = "dlt.attempts"
DLT_MEMBER = "dlt.member"
DLT_FAILED_AT = "dlt.failed_at"
_MAX_MESSAGE = 2000
_SLICE = 0.05  # longest uninterrupted wait: stop requests and lease changes are seen this fast


def _number(name: str, value: object, *, low: float = 0.0, allow_low: bool = True) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or (
            value < low if allow_low else value <= low):
        raise InvalidArgument(f"{name} must be a number {'>=' if allow_low else '>'} {low:g}, got {value!r}")
    return float(value)


def _int(name: str, value: object, low: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise InvalidArgument(f"{name} must be an integer >= {low}, got {value!r}")
    return value


# -- configuration values -------------------------------------------------------------------------------
@dataclass(frozen=True)
class BatchConfig:
    """When a batch is handed to the handler (EventSQL's consumption config).

    ``min_events`` (default 1): deliver as soon as this many events are at hand. ``max_events`` (default
    100): never more in one batch (also the read size of single-event handlers). ``max_wait`` (default
    1.0 s): with fewer than ``min_events`` (but at least one) at hand, deliver anyway once this long has
    passed since the previous batch was handed over (or since the start). An empty batch is never
    delivered.
    """

    min_events: int = 1
    max_events: int = 100
    max_wait: float = 1.0

    def __post_init__(self) -> None:
        _int("min_events", self.min_events)
        _int("max_events", self.max_events)
        if self.min_events > self.max_events:
            raise InvalidArgument(
                f"min_events ({self.min_events}) must not exceed max_events ({self.max_events})")
        _number("max_wait", self.max_wait)


@dataclass(frozen=True)
class RetryPolicy:
    """How a failing handler is retried.

    An event is delivered at most ``max_attempts`` times (default 5) before it goes to the dead-letter
    topic (or, without one, is retried forever). Before attempt ``n + 1`` the worker waits
    ``min(max_backoff, backoff * multiplier ** (n - 1))`` seconds (defaults 0.5 s, 2.0, 30 s), varied by up
    to ``jitter`` (default 0.1, i.e. +-10 %).
    """

    max_attempts: int = 5
    backoff: float = 0.5
    multiplier: float = 2.0
    max_backoff: float = 30.0
    jitter: float = 0.1

    def __post_init__(self) -> None:
        _int("max_attempts", self.max_attempts)
        _number("backoff", self.backoff)
        _number("multiplier", self.multiplier, low=1.0)
        _number("max_backoff", self.max_backoff)
        _number("jitter", self.jitter)
        if self.jitter > 1:
            raise InvalidArgument(f"jitter must be between 0 and 1, got {self.jitter!r}")

    def delay(self, failures: int) -> float:
        """Seconds to wait after the ``failures``-th failed attempt."""
        base = min(self.max_backoff, self.backoff * self.multiplier ** max(0, min(failures - 1, 200)))
        if self.jitter:
            base *= 1 + self.jitter * (2 * random.random() - 1)
        return max(0.0, base)


class EventFailed(Exception):
    """Raise from a batch handler to say which event of the batch failed (``cause``: why).

    The events before it count as handled (committed in at-least-once mode; delivered again without the
    failing one in transactional mode, where the whole batch rolled back); only ``event`` is retried and,
    when its attempts are spent, dead-lettered. Any other exception fails the batch as a whole: it is
    retried, and when its attempts are spent its events are delivered one by one to find the failing ones.
    """

    def __init__(self, event: Event, cause: BaseException | None = None) -> None:
        super().__init__(f"event {event.topic}[{event.partition}]@{event.position} failed"
                         + (f": {type(cause).__name__}: {cause}" if cause else ""))
        self.event = event
        self.cause = cause


@dataclass
class WorkerStats:
    """Counters of a worker since it started."""

    polls: int = 0
    batches: int = 0
    events: int = 0
    commits: int = 0
    fenced: int = 0
    failures: int = 0
    dead_lettered: int = 0
    rebalances: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, **counts: int) -> None:
        """Add to counters."""
        with self._lock:
            for k, v in counts.items():
                setattr(self, k, getattr(self, k) + v)

    def snapshot(self) -> dict[str, int]:
        """The counters as a dict."""
        with self._lock:
            return {k: v for k, v in self.__dict__.items() if not k.startswith("_")}


# -- batch assembly -------------------------------------------------------------------------------------
class BatchAssembler:
    """Collects events into batches by a :class:`BatchConfig`, timed by an injected clock.

    :meth:`start` starts the ``max_wait`` timer unless it runs; :meth:`take` hands the batch over and
    stops it, so the next :meth:`start` times the next batch from then.
    """

    def __init__(self, config: BatchConfig, clock: Clock = time.monotonic) -> None:
        self.config = config
        self.clock = clock
        self.events: list[Event] = []
        self.started: float | None = None

    def start(self) -> None:
        """Start timing a batch (no-op if already timing one)."""
        if self.started is None:
            self.started = self.clock()

    def room(self) -> int:
        """How many more events fit."""
        return self.config.max_events - len(self.events)

    def add(self, events: Sequence[Event]) -> None:
        """Add events (at most :meth:`room` are expected)."""
        self.events.extend(events)

    def remaining(self) -> float:
        """Seconds until ``max_wait`` has passed (0 if it has)."""
        if self.started is None:
            return self.config.max_wait
        return max(0.0, self.started + self.config.max_wait - self.clock())

    def ready(self) -> bool:
        """True when a batch is due: ``min_events`` at hand, or at least one and ``max_wait`` passed."""
        n = len(self.events)
        return n >= self.config.min_events or (n > 0 and self.remaining() <= 0)

    def take(self) -> list[Event]:
        """Hand over the batch (at most ``max_events``) and stop timing."""
        out = self.events[:self.config.max_events]
        self.events = self.events[self.config.max_events:]
        self.started = None
        return out

    def clear(self) -> None:
        """Drop what is at hand and stop timing."""
        self.events = []
        self.started = None


# -- subscriptions ----------------------------------------------------------------------------------------
Handler = Callable[..., Any]


@dataclass(frozen=True)
class Subscription:
    """What a worker runs: ``handler`` on ``topic`` for ``group`` (see :meth:`Worker.subscribe`)."""

    topic: str
    group: str
    handler: Handler
    batch: bool
    config: BatchConfig
    mode: str
    retry: RetryPolicy
    dead_letter: str | None
    start: Start
    heartbeat_interval: float | None = None
    session_timeout: float | None = None


def _dead_letter_name(client: Client, group: str, topic: str, dead_letter: object) -> str | None:
    if dead_letter is None:
        name = get_group_config(client, group).dead_letter_for(topic)
    elif dead_letter is True:
        name = f"{topic}.dlt"
    elif dead_letter is False:
        name = None
    elif isinstance(dead_letter, str):
        name = dead_letter
    else:
        raise InvalidArgument(f"dead_letter must be a topic name, True, False or None, not {dead_letter!r}")
    if name is not None:
        check_topic(name)
        if name == topic:
            raise InvalidArgument(f"the dead-letter topic of {topic!r} cannot be the topic itself")
    return name


def _check_handler(handler: object, batch: bool, mode: str) -> None:
    """Refuse a handler that cannot be called the way ``batch`` and ``mode`` call it: every call would
    fail (and every event end in the dead-letter topic) or, for an ``async def`` function, do nothing."""
    if not callable(handler):
        raise InvalidArgument(f"handler must be callable, not {type(handler).__name__}")
    name = getattr(handler, "__qualname__", None) or type(handler).__name__
    call = type(handler).__call__ if not inspect.isroutine(handler) else None  # a callable object
    if inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(call):
        raise InvalidArgument(f"handler {name} is an async function: handlers must be plain functions "
                              "(async handlers are not supported)")
    args = ("events" if batch else "event",) + (("conn",) if mode == "transactional" else ())
    try:
        sig = inspect.signature(handler)
    except (TypeError, ValueError):  # no signature to check (some builtins): calls will tell
        return
    try:
        sig.bind(*args)
    except TypeError:
        bare = sig.replace(parameters=[p.replace(annotation=p.empty) for p in sig.parameters.values()],
                           return_annotation=sig.empty)
        raise InvalidArgument(
            f"handler {name}{bare} cannot be called as handler({', '.join(args)}), as "
            f"batch={batch} and mode={mode!r} call it") from None


def _make_subscription(client: Client, topic: str, group: str, handler: object, *, batch: bool,
                       min_events: int, max_events: int, max_wait: float, mode: str,
                       retry: RetryPolicy | None, dead_letter: str | bool | None, start: Start,
                       heartbeat_interval: float | None, session_timeout: float | None,
                       member: bool = True) -> Subscription:
    if not callable(handler):
        raise InvalidArgument(f"handler must be callable, not {type(handler).__name__}")
    if not isinstance(batch, bool):
        raise InvalidArgument(f"batch must be true or false, not {batch!r}")
    if mode not in MODES:
        raise InvalidArgument(f"mode must be one of {', '.join(MODES)}, not {mode!r}")
    _check_handler(handler, batch, mode)
    if retry is None:
        retry = RetryPolicy()
    elif not isinstance(retry, RetryPolicy):
        raise InvalidArgument(f"retry must be a RetryPolicy, not {type(retry).__name__}")
    config = BatchConfig(min_events, max_events, max_wait)
    meta = client._topic(topic)
    from ._names import check_group

    check_group(group)
    if member and (heartbeat_interval is not None or session_timeout is not None):
        cfg = get_group_config(client, group)  # the timings as the member will use them, checked now
        check_timing(cfg.heartbeat_interval if heartbeat_interval is None else heartbeat_interval,
                     cfg.session_timeout if session_timeout is None else session_timeout)
    return Subscription(meta.name, group, handler, batch, config, mode, retry,
                        _dead_letter_name(client, group, meta.name, dead_letter), _check_start(start),
                        heartbeat_interval, session_timeout)


def load_handler(spec: str) -> Handler:
    """Import a handler named ``"package.module:function"`` (the function may be a dotted attribute path)."""
    if not isinstance(spec, str) or spec.count(":") != 1:
        raise InvalidArgument(f"handler must be written MODULE:FUNCTION, got {spec!r}")
    mod_name, attr = spec.split(":")
    if not mod_name or not attr:
        raise InvalidArgument(f"handler must be written MODULE:FUNCTION, got {spec!r}")
    try:
        obj: Any = importlib.import_module(mod_name)
    except ImportError as exc:
        raise InvalidArgument(f"cannot import handler module {mod_name!r}: {exc}") from exc
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise InvalidArgument(f"module {mod_name!r} has no attribute {attr!r}") from None
    if not callable(obj):
        raise InvalidArgument(f"handler {spec!r} is not callable")
    return obj


# -- the runner: one subscription's processing loop ---------------------------------------------------------
@dataclass
class _Result:
    done: int  # events of the chunk handled and committed
    index: int | None  # chunk index of the failing event (None: no failure, or a batch failed as a whole)
    error: BaseException | None
    outcome: CommitOutcome | None
    interrupted: bool = False


def _error_text(exc: BaseException) -> tuple[str, str]:
    kind = type(exc)
    name = kind.__qualname__
    if kind.__module__ not in ("builtins", "__main__"):
        name = f"{kind.__module__}.{name}"
    msg = str(exc) or "".join(traceback.format_exception_only(kind, exc)).strip()
    return name, msg[:_MAX_MESSAGE]


class _Runner(Service):
    """The processing loop of one subscription (a service: one step delivers at most one batch)."""

    def __init__(self, worker: Worker, sub: Subscription, member: GroupMember | None,
                 fixed: Consumer | None) -> None:
        super().__init__(f"runner:{sub.group}/{sub.topic}", interval=0)
        self.worker = worker
        self.client = worker.client
        self.clock = worker.clock
        self.stats = worker.stats
        self.sub = sub
        self.member = member
        self.meta: _TopicMeta = self.client._topic(sub.topic)
        self.consumer: Consumer | None = fixed
        self.current: dict[int, int] = dict.fromkeys(fixed.partitions, -1) if fixed is not None else {}
        self.asm = BatchAssembler(sub.config, self.clock)
        self.fails: dict[tuple[int, int], int] = {}
        self.errors: dict[tuple[int, int], BaseException] = {}
        self.paused: dict[int, float] = {}
        self.flagged: set[int] = set()
        self._dlt_meta: _TopicMeta | None = None
        self._reload_needed = False

    # -- assignment ---------------------------------------------------------------------------------------
    def _desired(self) -> dict[int, int]:
        m = self.member
        assert m is not None
        leases = m.leases
        if not (leases.alive and m.healthy()):
            return {}
        return {p: e for p, e in leases.owned.items() if p not in leases.leaving}

    def _sync(self) -> None:
        """Between batches: hand over partitions others wait for, follow lease changes."""
        if self.member is None:
            if self._reload_needed and self.consumer is not None:
                with self.client.connection() as conn:
                    self.consumer._reload(conn)
                self.asm.clear()
                self._reload_needed = False
            return
        m = self.member
        m.changed.clear()
        leases = m.leases
        if leases.leaving and leases.alive and m.healthy():
            give = {p: leases.owned[p] for p in leases.leaving if p in leases.owned}
            released = m.release(give)
            if released:
                log.info("%s: handed over partitions %s of %s", m.member_id, released, self.sub.topic)
        desired = self._desired()
        if desired != self.current or self._reload_needed:
            self._rebuild(desired)

    def _rebuild(self, desired: dict[int, int]) -> None:
        self.asm.clear()
        self._reload_needed = False
        gained = sorted(set(desired) - set(self.current))
        lost = sorted(set(self.current) - set(desired))
        if gained or lost:
            log.info("%s: partitions of %s now %s (gained %s, lost %s)", self.worker.member_id,
                     self.sub.topic, sorted(desired), gained, lost)
        self.paused = {p: t for p, t in self.paused.items() if p in desired}
        self.fails = {k: v for k, v in self.fails.items() if k[0] in desired}
        if gained and self.member is not None:
            # attempts on an event that failed under a previous owner count here too: a hand-over (or a
            # crash-looping member) does not give a poison event a fresh set of attempts
            with self.client.connection() as conn:
                for p, position, attempts in conn.execute(self.client._q("retry_states"),
                                                          (self.sub.group, self.meta.id, gained)):
                    key = (int(p), int(position))
                    self.fails[key] = max(self.fails.get(key, 0), int(attempts))
        self.flagged |= set(gained)
        self.current = dict(desired)
        self.stats.add(rebalances=1)
        if not desired:
            self.consumer = None
            return
        c = Consumer(self.client, self.sub.topic, self.sub.group, start=self.sub.start,
                     partitions=sorted(desired))
        assert self.member is not None
        c._fence = (self.member.member_id, dict(desired))
        self.consumer = c

    def _changed(self) -> bool:
        m = self.member
        if m is None:
            return False
        return m.changed.is_set() or (bool(self.current) and not m.healthy())

    def _owns(self, partitions: set[int], *, leaving_ok: bool) -> bool:
        """Still allowed to process these partitions (lease held under the same epoch, member healthy)."""
        m = self.member
        if m is None:
            return True
        leases = m.leases
        if not (leases.alive and m.healthy()):
            return False
        return all(leases.owned.get(p) == self.current.get(p) and (leaving_ok or p not in leases.leaving)
                   for p in partitions)

    # -- the loop -----------------------------------------------------------------------------------------
    def step(self) -> None:
        try:
            self._sync()
            if self.consumer is None:
                self._idle()
                return
            batch = self._collect()
            if batch:
                self._deliver(batch)
        except (psycopg.OperationalError, psycopg.errors.DeadlockDetected,
                psycopg.errors.SerializationFailure) as exc:
            log.warning("%s on %s: database error (%s); reading again from the checkpoints",
                        self.worker.member_id, self.sub.topic, str(exc).strip())
            self.asm.clear()
            self._reload_needed = True
            if self.member is not None:
                self.current = {}
                self.consumer = None
            self.stopping.wait(0.5)

    def _idle(self) -> None:
        end = time.monotonic() + self.client.poll_interval
        while time.monotonic() < end and not self.stopping.is_set():
            if self.member is not None and self.member.changed.wait(_SLICE):
                return
            if self.member is None:
                self.stopping.wait(_SLICE)

    def _wait(self, generation: int, seconds: float) -> bool:
        """Wait up to ``seconds`` (real time) for a notification; False on timeout, stop or lease change."""
        listener = self.client._listener
        end = time.monotonic() + max(0.0, seconds)
        while True:
            left = end - time.monotonic()
            if left <= 0:
                return False
            if listener.wait(self.meta.id, generation, min(left, _SLICE)):
                return True
            if self.stopping.is_set() or self._changed():
                return False

    def _fetch(self, active: list[int], room: int) -> list[Event]:
        c = self.consumer
        assert c is not None
        with self.client.connection() as conn:
            if len(active) == len(c.partitions):
                return c._fetch(conn, room)
            saved = c.partitions
            c.partitions = tuple(active)  # paused partitions sit this poll out
            try:
                return c._fetch(conn, room)
            finally:
                c.partitions = saved

    def _collect(self) -> list[Event]:
        asm = self.asm
        asm.start()
        listener = self.client._listener
        listener.start()
        poll_interval = self.client.poll_interval
        backoff = 0.0
        while True:
            if self.stopping.is_set() or self._changed():
                if self.stopping.is_set():
                    asm.clear()
                return []
            now = self.clock()
            for p in [p for p, t in self.paused.items() if t <= now]:
                del self.paused[p]
            active = [p for p in self.current if p not in self.paused]
            generation = listener.generation(self.meta.id)
            if asm.room() > 0 and active:
                got = self._fetch(active, asm.room())
                self.stats.add(polls=1)
                asm.add(got)
            if asm.ready():
                return asm.take()
            wait = backoff or poll_interval
            if asm.events:
                wait = min(wait, asm.remaining())
            if self.paused:
                wait = min(wait, max(0.0, min(self.paused.values()) - now))
            if self._wait(generation, wait):
                backoff = 0.002  # woken: the events may still be behind the fence; recheck quickly
            elif backoff:
                backoff = min(backoff * 2, poll_interval)

    def _sleep(self, seconds: float, partitions: set[int]) -> bool:
        """Back off (by the worker's clock); False if stopped or the partitions were lost meanwhile."""
        deadline = self.clock() + seconds
        while True:
            left = deadline - self.clock()
            if left <= 0:
                return True
            if self.stopping.wait(min(_SLICE, left)):
                return False
            if not self._owns(partitions, leaving_ok=False):
                return False

    # -- delivering ---------------------------------------------------------------------------------------
    def _deliver(self, batch: list[Event]) -> None:
        self.stats.add(batches=1)
        policy = self.sub.retry
        events: list[Event] | None = batch
        unit_failures = 0
        isolate = 0
        first = True
        try:
            while events:
                parts = {e.partition for e in events}
                if not first and (self.stopping.is_set() or not self._owns(parts, leaving_ok=False)):
                    return
                first = False
                events = self._dead_letter_spent(events)
                if not events:
                    return
                chunk = events[:1] if isolate else events
                res = self._attempt(chunk)
                if res.outcome is not None and not res.outcome.ok:
                    self._lost(res.outcome)
                    return
                self.stats.add(events=res.done)
                if res.interrupted:
                    return
                if res.error is None:
                    events = events[len(chunk):]
                    isolate = max(0, isolate - len(chunk))
                    unit_failures = 0
                    continue
                self.stats.add(failures=1)
                if res.index is None:  # a batch failed as a whole
                    unit_failures += 1
                    kind, msg = _error_text(res.error)
                    if unit_failures >= policy.max_attempts:
                        log.warning("%s: batch of %d events of %s failed %d times (%s: %s); delivering them "
                                    "one by one", self.worker.member_id, len(chunk), self.sub.topic,
                                    unit_failures, kind, msg)
                        isolate, unit_failures = len(chunk), 0
                        continue
                    delay = policy.delay(unit_failures)
                    log.warning("%s: batch of %d events of %s failed (attempt %d/%d, %s: %s); retrying in "
                                "%.2fs", self.worker.member_id, len(chunk), self.sub.topic, unit_failures,
                                policy.max_attempts, kind, msg, delay)
                    if not self._sleep(delay, {e.partition for e in chunk}):
                        return
                    continue
                events = self._failed(events, chunk, res)
                isolate = min(isolate, len(events))
        finally:
            c = self.consumer
            if c is not None:
                c._cursor.update(c._committed)  # whatever was not committed is read again

    def _failed(self, events: list[Event], chunk: list[Event], res: _Result) -> list[Event]:
        """An identified event failed: pause its partition from that event on; return what to go on with."""
        assert res.index is not None and res.error is not None
        failed = chunk[res.index]
        p = failed.partition
        key = (p, failed.position)
        n = self.fails[key] = self.fails.get(key, 0) + 1
        self.errors[key] = res.error
        rest = events[res.done:]
        at = next(i for i, e in enumerate(rest) if e is failed)
        keep = [e for i, e in enumerate(rest) if e.partition != p or i < at]
        before = [e for e in keep if e.partition == p]
        c = self.consumer
        assert c is not None
        c._cursor[p] = (before[-1].txid, before[-1].position) if before else c._committed[p]
        policy = self.sub.retry
        spent = n >= policy.max_attempts
        kind, msg = _error_text(res.error)
        if spent and self.sub.dead_letter:
            delay, state = 0.0, "retrying"
            log.warning("%s: event %s[%d]@%d failed %d times (%s: %s); sending it to %s",
                        self.worker.member_id, failed.topic, p, failed.position, n, kind, msg,
                        self.sub.dead_letter)
        else:
            delay = policy.delay(n)
            state = "blocked" if spent else "retrying"
            log.warning("%s: event %s[%d]@%d failed (attempt %d%s, %s: %s); retrying in %.2fs",
                        self.worker.member_id, failed.topic, p, failed.position, n,
                        f"/{policy.max_attempts}" if not spent
                        else ", no dead-letter topic: retrying forever",
                        kind, msg, delay)
        self.paused[p] = self.clock() + delay
        self._record(p, failed, n, f"{kind}: {msg}", state)
        return keep

    def _call(self, chunk: list[Event], conn: psycopg.Connection | None) -> _Result:
        handler = self.sub.handler
        if not self.sub.batch:
            for i, ev in enumerate(chunk):
                if i and not self._owns({ev.partition}, leaving_ok=True):
                    return _Result(i, None, None, None, interrupted=True)
                try:
                    if conn is None:
                        handler(ev)
                    else:
                        with conn.transaction():
                            handler(ev, conn)
                except Exception as exc:
                    if conn is not None and conn.broken:
                        raise psycopg.OperationalError("connection lost while handling an event") from exc
                    return _Result(i, i, exc, None)
            return _Result(len(chunk), None, None, None)
        try:
            if conn is None:
                handler(list(chunk))
            else:
                with conn.transaction():
                    handler(list(chunk), conn)
        except EventFailed as exc:
            cause: BaseException = exc.cause or exc
            at = next((i for i, e in enumerate(chunk) if e.partition == exc.event.partition
                       and e.position == exc.event.position), None)
            if at is None:
                return _Result(0, 0 if len(chunk) == 1 else None, cause, None)
            return _Result(at if conn is None else 0, at, cause, None)
        except Exception as exc:
            if conn is not None and conn.broken:
                raise psycopg.OperationalError("connection lost while handling a batch") from exc
            return _Result(0, 0 if len(chunk) == 1 else None, exc, None)
        return _Result(len(chunk), None, None, None)

    def _attempt(self, chunk: list[Event]) -> _Result:
        c = self.consumer
        assert c is not None
        if self.sub.mode != "transactional":
            res = self._call(chunk, None)
            if res.done:
                res.outcome = c.commit(chunk[:res.done])
                self._committed(chunk[:res.done], res.outcome)
            return res
        timeout_ms = str(round((self.member.session_timeout if self.member else 60.0) * 1000))
        with self.client.connection() as conn:
            with conn.transaction():
                # a member paused inside its transaction must not hold locks (and the read fence) forever
                conn.execute("SELECT set_config('idle_in_transaction_session_timeout', %s, true)",
                             (timeout_ms,))
                res = self._call(chunk, conn)
                targets = c._targets(chunk[:res.done]) if res.done else {}
                if targets:
                    res.outcome = c._store(conn, targets)
                    if not res.outcome.ok:
                        raise psycopg.Rollback()
        if res.outcome is not None and res.outcome.ok:
            c._apply(targets)
            self._committed(chunk[:res.done], res.outcome)
        return res

    def _committed(self, events: Sequence[Event], outcome: CommitOutcome) -> None:
        if not outcome.ok:
            return
        self.stats.add(commits=1)
        for e in events:
            self.fails.pop((e.partition, e.position), None)
            self.errors.pop((e.partition, e.position), None)
        done = {e.partition for e in events} & self.flagged
        if done and self.member is not None:
            with self.client.connection() as conn:
                conn.execute(self.client._q("clear_retry_state"),
                             (self.sub.group, self.meta.id, sorted(done)))
        self.flagged -= done

    def _lost(self, outcome: CommitOutcome) -> None:
        parts = sorted(self.consumer.last_outcomes) if self.consumer else []
        bad = [p for p in parts if self.consumer and not self.consumer.last_outcomes[p].ok]
        if outcome is CommitOutcome.FENCED:
            self.stats.add(fenced=1)
            log.warning("%s: commit on %s partitions %s fenced: the lease moved to another member; stopped "
                        "processing them", self.worker.member_id, self.sub.topic, bad)
            if self.member is not None:
                try:
                    self.member.refresh()
                except psycopg.Error:
                    pass
        else:
            log.warning("%s: commit on %s partitions %s returned %s: the checkpoint was moved by someone "
                        "else; reading again from it", self.worker.member_id, self.sub.topic, bad,
                        outcome.name)
        self._reload_needed = True
        if self.member is not None:
            self.current = {}
            self.consumer = None

    def _record(self, partition: int, event: Event, attempts: int, error: str, state: str) -> None:
        if self.member is None:
            return
        self.flagged.add(partition)
        with self.client.connection() as conn:
            conn.execute(self.client._q("set_retry_state"),
                         (state, event.position, attempts, error[:_MAX_MESSAGE], self.sub.group, self.meta.id,
                          partition, self.member.member_id))

    # -- dead letters -------------------------------------------------------------------------------------
    def _dlt(self) -> _TopicMeta:
        if self._dlt_meta is None:
            name = self.sub.dead_letter
            assert name is not None
            try:
                self._dlt_meta = self.client._topic(name)
            except TopicNotFound:
                try:
                    self.client.create_topic(name, self.meta.partitions)
                except TopicConflict:
                    pass
                self._dlt_meta = self.client._topic(name, refresh=True)
        return self._dlt_meta

    def _dead_letter_spent(self, events: list[Event]) -> list[Event] | None:
        """Send to the dead-letter topic every event that heads its partition here with its attempts spent."""
        if not self.sub.dead_letter:
            return events
        limit = self.sub.retry.max_attempts
        out: list[Event] = []
        seen: set[int] = set()
        for e in events:
            if e.partition not in seen and self.fails.get((e.partition, e.position), 0) >= limit:
                if not self._dead_letter(e):
                    return None
                continue
            seen.add(e.partition)
            out.append(e)
        return out

    def _dead_letter(self, ev: Event) -> bool:
        key = (ev.partition, ev.position)
        attempts = self.fails.get(key, 0)
        kind, msg = _error_text(self.errors.get(key) or RuntimeError("unknown error"))
        dlt = self._dlt()
        headers = dict(ev.headers)
        headers.update({
            DLT_GROUP: self.sub.group, DLT_TOPIC: ev.topic, DLT_PARTITION: str(ev.partition),
            DLT_POSITION: str(ev.position), DLT_ERROR_TYPE: kind, DLT_ERROR_MESSAGE: msg,
            DLT_ATTEMPTS: str(attempts), DLT_MEMBER: self.worker.member_id,
            DLT_FAILED_AT: datetime.now(timezone.utc).isoformat(),
        })
        if ev.event_id:
            headers[DLT_EVENT_ID] = ev.event_id
        partition = ev.partition if dlt.partitions == self.meta.partitions else None
        c = self.consumer
        assert c is not None
        outcome = None
        with self.client.connection() as conn:
            with conn.transaction():
                self.client.publish(dlt.name, ev.value, key=ev.key, headers=headers, partition=partition,
                                    event_type=ev.event_type, correlation_id=ev.correlation_id,
                                    causation_id=ev.causation_id, conn=conn)
                targets = c._targets([ev])
                outcome = c._store(conn, targets)
                if not outcome.ok:
                    raise psycopg.Rollback()
        if not outcome.ok:
            self._lost(outcome)
            return False
        c._apply(targets)
        self.stats.add(dead_lettered=1)
        self._committed([ev], outcome)
        return True


# -- the worker -----------------------------------------------------------------------------------------
class Worker:
    """Runs handlers for one or more subscriptions in this process, as a member of their groups.

    ``member_id`` (default ``host:pid:random``) names the member in every group. ``clock`` (default
    ``time.monotonic``) times batches (``max_wait``) and retry backoffs; leases always use real time.
    ``install_signal_handlers`` (default true): :meth:`run` called in the main thread stops gracefully on
    SIGINT/SIGTERM (a second signal interrupts at once). ``shutdown_timeout`` (default ``None``: no
    limit) bounds how long stopping waits for a handler to finish the batch in hand; past it the leases
    are given back while the handler still runs (its commit is then fenced).

    Use :meth:`run` (blocks until stopped), or :meth:`start` / :meth:`stop` (or ``with worker:``).
    """

    def __init__(self, client: Client, *, member_id: str | None = None, clock: Clock | None = None,
                 install_signal_handlers: bool = True, shutdown_timeout: float | None = None) -> None:
        if member_id is not None and (not isinstance(member_id, str) or not 0 < len(member_id) <= 200):
            raise InvalidArgument(f"member_id must be a string of 1 to 200 characters, got {member_id!r}")
        if clock is not None and not callable(clock):
            raise InvalidArgument(f"clock must be a callable returning seconds, not {type(clock).__name__}")
        if shutdown_timeout is not None:
            _number("shutdown_timeout", shutdown_timeout)
        self.client = client
        self.member_id = member_id or new_member_id()
        self.clock: Clock = clock or time.monotonic
        self.install_signal_handlers = install_signal_handlers
        self.shutdown_timeout = shutdown_timeout
        self.stats = WorkerStats()
        self._subs: list[tuple[Subscription, Consumer | None]] = []
        self._runners: list[_Runner] = []
        self._members: list[GroupMember] = []
        self._services: list[Service] = []
        self._supervisor: Supervisor | None = None
        self._stop_requested = threading.Event()
        self._done = threading.Event()
        self._lock = threading.Lock()
        self._started = False
        self._stopped = False
        self.failure: ServiceFailed | None = None

    def __repr__(self) -> str:
        return f"<pgstreams.Worker {self.member_id!r} subscriptions={len(self._subs)}>"

    def subscribe(self, topic: str, group: str, handler: Handler, *, batch: bool = False, min_events: int = 1,
                  max_events: int = 100, max_wait: float = 1.0, mode: Mode = "at-least-once",
                  retry: RetryPolicy | None = None, dead_letter: str | bool | None = None,
                  start: Start = "earliest", heartbeat_interval: float | None = None,
                  session_timeout: float | None = None,
                  partitions: Sequence[int] | None = None) -> Subscription:
        """Run ``handler`` on ``topic`` as a member of ``group``.

        ``handler(event)`` (``batch=False``, default) or ``handler(events)`` (``batch=True``); in
        ``mode="transactional"`` it is called as ``handler(event_or_events, conn)`` inside the transaction
        that stores the checkpoint (the default mode, ``"at-least-once"``, commits after it returns). A
        handler that cannot be called so, or an ``async def`` function, is refused (:class:`InvalidArgument`).
        ``min_events`` / ``max_events`` / ``max_wait``: see :class:`BatchConfig` (defaults 1, 100, 1.0 s).
        ``retry``: a :class:`RetryPolicy` (default ``RetryPolicy()``). ``dead_letter``: ``None`` (default)
        for the group's configuration (``"<topic>.dlt"`` unless configured otherwise), ``True`` for
        ``"<topic>.dlt"``, a topic name, or ``False`` for none (a failing event is retried forever). The
        dead-letter topic is created on first use with the topic's partition count. ``start``: where the
        group starts on partitions without a checkpoint (default ``"earliest"``).
        ``heartbeat_interval`` / ``session_timeout``: default to the group's configuration (3 s / 30 s
        unless configured, see :func:`pgstreams.configure_group`).
        ``partitions``: a static assignment instead of membership (default ``None``: join the group): the
        worker processes exactly these partitions, takes no leases and is not fenced, like a
        :class:`pgstreams.Consumer` with ``partitions=``; do not mix it with members of the same group.
        """
        sub = _make_subscription(self.client, topic, group, handler, batch=batch, min_events=min_events,
                                 max_events=max_events, max_wait=max_wait, mode=mode, retry=retry,
                                 dead_letter=dead_letter, start=start, heartbeat_interval=heartbeat_interval,
                                 session_timeout=session_timeout, member=partitions is None)
        fixed = None
        if partitions is not None:
            fixed = Consumer(self.client, sub.topic, sub.group, start=sub.start, partitions=partitions)
        self._add(sub, fixed)
        return sub

    def _add(self, sub: Subscription, fixed: Consumer | None) -> None:
        with self._lock:
            if self._started:
                raise InvalidArgument("subscribe before the worker starts")
            if any(s.topic == sub.topic and s.group == sub.group for s, _ in self._subs):
                raise InvalidArgument(f"already subscribed to {sub.topic!r} in group {sub.group!r}")
            self._subs.append((sub, fixed))

    @property
    def subscriptions(self) -> tuple[Subscription, ...]:
        """The subscriptions, in order."""
        return tuple(s for s, _ in self._subs)

    def assignment(self) -> dict[tuple[str, str], tuple[int, ...]]:
        """The partitions being processed now, per ``(group, topic)``."""
        return {(r.sub.group, r.sub.topic): tuple(sorted(r.current)) for r in self._runners}

    @property
    def members(self) -> tuple[GroupMember, ...]:
        """The group memberships of this worker."""
        return tuple(self._members)

    # -- lifecycle ----------------------------------------------------------------------------------------
    def start(self) -> None:
        """Join the groups and start processing in background threads."""
        with self._lock:
            if self._started:
                raise InvalidArgument("the worker was already started")
            if not self._subs:
                raise InvalidArgument("the worker has no subscriptions: call subscribe() first")
            self._started = True
        members: list[Service] = []
        try:
            for sub, fixed in self._subs:
                member = None
                if fixed is None:
                    # checkpoints of every partition
                    Consumer(self.client, sub.topic, sub.group, start=sub.start)
                    member = GroupMember(self.client, sub.topic, sub.group, member_id=self.member_id,
                                         heartbeat_interval=sub.heartbeat_interval,
                                         session_timeout=sub.session_timeout)
                    self._members.append(member)
                    member.register()
                    members += [HeartbeatService(member), BalancerService(member)]
                self._runners.append(_Runner(self, sub, member, fixed))
        except BaseException:
            # nothing runs yet: leave the groups joined so far rather than hold leases nobody processes
            for m in self._members:
                try:
                    m.leave()
                except Exception as exc:  # noqa: BLE001 - its leases then expire after the session timeout
                    log.error("%s could not leave group %s on %s after a failed start (%s)", m.member_id,
                              m.group, m.topic, exc)
                m.close()
            self._members.clear()
            self._runners.clear()
            with self._lock:
                self._stopped = True
            self._done.set()
            raise
        self._services = members + list(self._runners)
        for svc in self._services:
            svc.start()
        self._supervisor = Supervisor(self._services, self._on_failure)
        self._supervisor.start()
        log.info("worker %s started: %s", self.member_id,
                 ", ".join(f"{s.group}/{s.topic}" for s, _ in self._subs))

    def _on_failure(self, failed: ServiceFailed) -> None:
        self.failure = failed
        self._stop_requested.set()
        threading.Thread(target=self.stop, name="pgstreams-worker-stop", daemon=True).start()

    def request_stop(self) -> None:
        """Ask the worker to stop (returns at once; :meth:`run` then stops gracefully)."""
        self._stop_requested.set()

    def stop(self, timeout: float | None = None) -> None:
        """Stop gracefully: finish and commit the batch in hand, give back the leases, leave the groups.
        Idempotent; waits until done (``timeout``, default the worker's ``shutdown_timeout``)."""
        self._stop_requested.set()
        timeout = self.shutdown_timeout if timeout is None else timeout
        with self._lock:
            if not self._started:
                return
            if self._stopped:
                busy = True
            else:
                busy, self._stopped = False, True
        if busy:  # another thread is stopping the worker: wait for it
            self._done.wait(timeout)
            return
        for r in self._runners:
            r.request_stop()
        for r in self._runners:
            r.stop(timeout)
        # heartbeats ran until the batches in hand were committed; stop them before leaving, so that no
        # balancing round or re-registration (after a pause past the session timeout) lands after the leave
        for svc in self._services:
            svc.request_stop()
        for svc in self._services:
            svc.stop(5)
        for m in self._members:
            try:
                n = m.leave()
                log.info("%s left group %s on %s (released %d leases)", m.member_id, m.group, m.topic, n)
            except Exception as exc:  # noqa: BLE001 - the leases then expire after the session timeout
                log.error("%s could not leave group %s cleanly (%s); its leases expire after the session "
                          "timeout", m.member_id, m.group, exc)
        for m in self._members:
            m.close()
        if self._supervisor is not None:
            self._supervisor.stop()
        self._done.set()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until the worker stopped; True if it did."""
        return self._done.wait(timeout)

    def run(self, until: threading.Event | None = None) -> None:
        """Start, then block until SIGINT/SIGTERM, :meth:`request_stop`/:meth:`stop`, or ``until`` is set;
        stop gracefully and return. Raises :class:`ServiceFailed` if a background service died."""
        previous: dict[signal.Signals, Any] = {}

        def on_signal(signum: int, frame: FrameType | None) -> None:
            if self._stop_requested.is_set():
                for s, h in previous.items():
                    signal.signal(s, h)
                raise KeyboardInterrupt
            log.info("%s: signal %d: finishing the batch in hand, then stopping", self.member_id, signum)
            self._stop_requested.set()

        if self.install_signal_handlers and threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                previous[sig] = signal.signal(sig, on_signal)
        try:
            self.start()
            while not self._stop_requested.wait(0.1):
                if until is not None and until.is_set():
                    break
            self.stop()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        if self.failure is not None:
            raise self.failure

    def __enter__(self) -> Worker:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def run_consumer(consumer: Consumer, handler: Handler, *, until: threading.Event | None = None,
                 install_signal_handlers: bool = True, batch: bool = False, min_events: int = 1,
                 max_events: int = 100, max_wait: float = 1.0, mode: Mode = "at-least-once",
                 retry: RetryPolicy | None = None, dead_letter: str | bool | None = None,
                 clock: Clock | None = None) -> Worker:
    """Run ``handler`` on a consumer's own partitions until stopped (see :meth:`Consumer.run`)."""
    worker = Worker(consumer._client, clock=clock, install_signal_handlers=install_signal_handlers)
    sub = _make_subscription(consumer._client, consumer.topic, consumer.group, handler, batch=batch,
                             min_events=min_events, max_events=max_events, max_wait=max_wait, mode=mode,
                             retry=retry, dead_letter=dead_letter, start=consumer.start,
                             heartbeat_interval=None, session_timeout=None, member=False)
    worker._add(sub, consumer)
    worker.run(until=until)
    return worker
