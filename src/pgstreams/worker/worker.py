"""The :class:`Worker`: runs subscriptions in a process, as a member of their groups (or on a static
assignment), with named services watched by a supervisor; :func:`run_consumer` runs a handler on a
:class:`pgstreams.Consumer`'s own partitions."""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from types import FrameType
from typing import TYPE_CHECKING, Any, cast

from ..cdc import DEFAULT_MAX_RETAINED, CaptureService, Cdc
from ..consumer import Consumer, Start, StreamReader, create_checkpoints
from ..errors import InvalidArgument
from ..groups import BalancerService, GroupMember, HeartbeatService, new_member_id
from ..maintenance import DEFAULT_MAINTENANCE_INTERVAL, MaintenanceService
from ..names import check_topic
from ..ports import SessionPublisher
from ..services import Service, ServiceFailed, Supervisor
from ..shares import DEFAULT_LOCK_TIMEOUT, ShareConsumer, ShareOptions
from ._checks import number
from .batching import Clock
from .deadletter import DeadLetters
from .handlers import Handler
from .retry import RetryPolicy
from .retrystate import RetryStateStore
from .runner import Runner, WorkerStats
from .shares import ShareRunner, ShareSource
from .streams import StreamSource
from .subscription import DEFAULTS, Mode, Subscription, SubscriptionOptions, make_subscription

if TYPE_CHECKING:
    from ..cdc.capture import CaptureClient

log = logging.getLogger("pgstreams.worker")

#: The delivery limit of a share subscription without a dead-letter topic: retried (almost) forever.
_FOREVER = 1_000_000


class Worker:
    """Runs handlers for one or more subscriptions in this process, as a member of their groups.

    ``member_id`` (default ``host:pid:random``) names the member in every group. ``clock`` (default
    ``time.monotonic``) times batches (``max_wait``) and retry backoffs; leases always use real time.
    ``install_signal_handlers`` (default true): :meth:`run` called in the main thread stops gracefully on
    SIGINT/SIGTERM (a second signal interrupts at once). ``shutdown_timeout`` (default ``None``: no
    limit) bounds how long stopping waits for a handler to finish the batch in hand; past it the leases
    are given back while the handler still runs (its commit is then fenced).

    ``maintenance`` (default :data:`pgstreams.maintenance.DEFAULT_MAINTENANCE_INTERVAL` seconds; ``None``:
    none) runs a :class:`pgstreams.maintenance.MaintenanceService`: of all the workers of a database,
    exactly one (the leader) runs a maintenance pass (segments ahead, retention, expiry of stale members)
    every that many seconds, so a deployment with workers needs no pg_cron.

    ``captures`` (default none): the change data captures (:mod:`pgstreams.cdc`, by name) this worker
    runs, each as a :class:`pgstreams.cdc.CaptureService`: of all the workers that name a capture, one
    captures it at a time and another takes it over when that one dies. A worker that names captures also
    runs the slot guard (:meth:`pgstreams.cdc.Cdc.guard_service`: every minute, a warning for each
    capture's slot that keeps more than ``slot_max_retained`` bytes of WAL, default
    :data:`pgstreams.cdc.DEFAULT_MAX_RETAINED`, or lost WAL; with ``slot_drop``, such a slot that no
    process captures is dropped).

    Use :meth:`run` (blocks until stopped), or :meth:`start` / :meth:`stop` (or ``with worker:``).
    ``client``: a :class:`pgstreams.Client` (the worker runs on its session and publishes dead letters
    through it).
    """

    def __init__(self, client: SessionPublisher, *, member_id: str | None = None, clock: Clock | None = None,
                 install_signal_handlers: bool = True, shutdown_timeout: float | None = None,
                 maintenance: float | None = DEFAULT_MAINTENANCE_INTERVAL, captures: Sequence[str] = (),
                 slot_max_retained: int = DEFAULT_MAX_RETAINED, slot_drop: bool = False) -> None:
        if member_id is not None and (not isinstance(member_id, str) or not 0 < len(member_id) <= 200):
            raise InvalidArgument(f"member_id must be a string of 1 to 200 characters, got {member_id!r}")
        if clock is not None and not callable(clock):
            raise InvalidArgument(f"clock must be a callable returning seconds, not {type(clock).__name__}")
        if shutdown_timeout is not None:
            number("shutdown_timeout", shutdown_timeout)
        if maintenance is not None:
            number("maintenance", maintenance, allow_low=False)
        self.client = client
        #: the session of ``client``, which the subscriptions run on
        self.session = client.session
        self.maintenance = maintenance
        if isinstance(captures, str):
            raise InvalidArgument("captures must be a sequence of capture names, not a string")
        #: the change data captures this worker runs
        self.captures = tuple(check_topic(c) for c in captures)
        retained = slot_max_retained
        if isinstance(retained, bool) or not isinstance(retained, int) or retained < 0:
            raise InvalidArgument(f"slot_max_retained must be a number of bytes >= 0, got {retained!r}")
        if not isinstance(slot_drop, bool):
            raise InvalidArgument(f"slot_drop must be True or False, not {slot_drop!r}")
        self.slot_max_retained = slot_max_retained
        self.slot_drop = slot_drop
        self.member_id = member_id or new_member_id()
        self.clock: Clock = clock or time.monotonic
        self.install_signal_handlers = install_signal_handlers
        self.shutdown_timeout = shutdown_timeout
        self.stats = WorkerStats()
        self._subs: list[tuple[Subscription, StreamReader | None]] = []  # with the reader of a static one
        self._runners: list[Runner | ShareRunner] = []
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

    def subscribe(self, topic: str, group: str, handler: Handler, *, batch: bool = DEFAULTS.batch,
                  min_events: int = DEFAULTS.min_events, max_events: int = DEFAULTS.max_events,
                  max_wait: float = DEFAULTS.max_wait, mode: Mode = DEFAULTS.mode,
                  retry: RetryPolicy | None = None, dead_letter: str | bool | None = None,
                  start: Start = DEFAULTS.start, heartbeat_interval: float | None = None,
                  session_timeout: float | None = None,
                  partitions: Sequence[int] | None = None, share: bool = DEFAULTS.share,
                  concurrency: int = DEFAULTS.concurrency,
                  lock_timeout: float | None = DEFAULTS.lock_timeout) -> Subscription:
        """Run ``handler`` on ``topic`` as a member of ``group``.

        ``handler(event)`` (``batch=False``, default) or ``handler(events)`` (``batch=True``); in
        ``mode="transactional"`` it is called as ``handler(event_or_events, conn)`` inside the transaction
        that stores the checkpoint (the default mode, ``"at-least-once"``, commits after it returns). A
        handler that cannot be called so is refused (:class:`InvalidArgument`); an ``async def`` handler
        runs on the process's handler event loop (``concurrency`` coroutines at once for a share group).
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
        ``share`` (default false): run on share group ``group`` (see :meth:`pgstreams.Client.share_consumer`):
        no membership, every worker reads every partition and events are acquired one by one; a failing
        event is released with the ``retry`` backoff (other events go on) and after ``retry.max_attempts``
        deliveries goes to the dead-letter topic (without one it is retried forever). ``lock_timeout``
        (share groups only; default ``None``: :data:`pgstreams.DEFAULT_LOCK_TIMEOUT`, 30 s): seconds each
        event stays locked to this worker (0.01 to 86400): a handler that takes longer loses the event to
        another consumer. ``concurrency`` (default 1, share groups only) handlers run at once in this
        process.
        """
        return self.add_subscription(topic, group, handler, SubscriptionOptions(
            batch=batch, min_events=min_events, max_events=max_events, max_wait=max_wait, mode=mode,
            retry=retry, dead_letter=dead_letter, start=start, heartbeat_interval=heartbeat_interval,
            session_timeout=session_timeout, partitions=partitions, share=share, concurrency=concurrency,
            lock_timeout=lock_timeout))

    def add_subscription(self, topic: str, group: str, handler: Handler,
                         options: SubscriptionOptions | None = None) -> Subscription:
        """:meth:`subscribe` with its keyword arguments as one :class:`SubscriptionOptions` (default: all
        defaults)."""
        sub = make_subscription(self.session, topic, group, handler, options or SubscriptionOptions())
        fixed = None
        if options is not None and options.partitions is not None:
            fixed = create_checkpoints(self.session, sub.topic, sub.group, start=sub.start,
                                       partitions=options.partitions)
        self._add(sub, fixed)
        return sub

    def _add(self, sub: Subscription, fixed: StreamReader | None) -> None:
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
        return {(r.sub.group, r.sub.topic): r.source.partitions for r in self._runners}

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
                if sub.share:
                    self._runners += self._share_runners(sub)
                else:
                    self._runners.append(self._runner(sub, fixed, members))
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
        if self.maintenance is not None:
            members.append(MaintenanceService(self.session, self.maintenance))
        members += [CaptureService(cast("CaptureClient", self.client), name) for name in self.captures]
        if self.captures:
            cdc = Cdc(cast("CaptureClient", self.client))
            members.append(cdc.guard_service(self.slot_max_retained, drop=self.slot_drop,
                                             spare=self.captures))
        self._services = members + list(self._runners)
        for svc in self._services:
            svc.start()
        self._supervisor = Supervisor(self._services, self._on_failure)
        self._supervisor.start()
        log.info("worker %s started: %s", self.member_id,
                 ", ".join(f"{s.group}/{s.topic}" for s, _ in self._subs))

    def _runner(self, sub: Subscription, fixed: StreamReader | None, services: list[Service]) -> Runner:
        """The runner of ``sub``: on the partitions of ``fixed``, or as a member of the group (registered
        now, its heartbeat and balancer added to ``services``)."""
        retry_states = None
        if fixed is None:
            group = create_checkpoints(self.session, sub.topic, sub.group, start=sub.start)
            member = GroupMember(self.session, sub.topic, sub.group, member_id=self.member_id,
                                 heartbeat_interval=sub.heartbeat_interval,
                                 session_timeout=sub.session_timeout)
            self._members.append(member)
            member.register()
            services += [HeartbeatService(member), BalancerService(member)]
            source = StreamSource.leased(group, member)
            retry_states = RetryStateStore(self.session, sub.group, group.topic_id, self.member_id)
            partitions = group.partition_count
        else:
            source = StreamSource.fixed(fixed)
            partitions = fixed.partition_count
        dead_letters = None
        if sub.dead_letter is not None:
            dead_letters = DeadLetters(self.client, sub.dead_letter, source, partitions=partitions,
                                       member_id=self.member_id)
        return Runner(sub, source, member_id=self.member_id, clock=self.clock, stats=self.stats,
                      retry_states=retry_states, dead_letters=dead_letters)

    def _share_runners(self, sub: Subscription) -> list[ShareRunner]:
        """The ``concurrency`` runners of share subscription ``sub``, over one consumer of its group."""
        dlt = sub.dead_letter
        options = ShareOptions(start=sub.start, max_deliveries=sub.retry.max_attempts if dlt else _FOREVER,
                               dead_letter=dlt if dlt is not None else False,
                               lock_timeout=DEFAULT_LOCK_TIMEOUT if sub.lock_timeout is None
                               else sub.lock_timeout)
        source = ShareSource(ShareConsumer(self.client, sub.topic, sub.group, options,
                                           consumer_id=self.member_id))
        return [ShareRunner(sub, source, index=i, member_id=self.member_id, clock=self.clock,
                            stats=self.stats) for i in range(sub.concurrency)]

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

        with signals_handled(on_signal, self.install_signal_handlers, previous):
            self.start()
            while not self._stop_requested.wait(0.1):
                if until is not None and until.is_set():
                    break
            self.stop()
        if self.failure is not None:
            raise self.failure

    def __enter__(self) -> Worker:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def run_consumer(client: SessionPublisher, consumer: Consumer, handler: Handler, *,
                 until: threading.Event | None = None, install_signal_handlers: bool = True,
                 batch: bool = DEFAULTS.batch, min_events: int = DEFAULTS.min_events,
                 max_events: int = DEFAULTS.max_events, max_wait: float = DEFAULTS.max_wait,
                 mode: Mode = DEFAULTS.mode, retry: RetryPolicy | None = None,
                 dead_letter: str | bool | None = None, clock: Clock | None = None) -> Worker:
    """Run ``handler`` on ``consumer``'s partitions until SIGINT/SIGTERM (or ``until``, a
    ``threading.Event``, is set); return the stopped :class:`Worker`. ``client`` is the
    :class:`pgstreams.Client` the consumer reads through (it publishes the dead letters).

    The consumer does not join the group's membership (no leases: it reads exactly its ``partitions``);
    use :class:`Worker` for that. The options are those of :meth:`Worker.subscribe` except ``start`` and
    the membership timings (``batch`` default false, ``min_events`` 1, ``max_events`` 100, ``max_wait``
    1.0 s, ``mode`` ``"at-least-once"``, ``retry`` ``RetryPolicy()``, ``dead_letter`` the group's
    configuration), plus ``until``, ``install_signal_handlers`` (default true) and ``clock`` (default
    ``time.monotonic``). Failing events are retried and dead-lettered as by a worker; no retry state is
    recorded in the group status. Raises :class:`InvalidArgument` for a consumer of another client.
    """
    reader = consumer.reader
    if reader.session is not client.session:
        raise InvalidArgument("the consumer reads through another client than the one given")
    worker = Worker(client, clock=clock, install_signal_handlers=install_signal_handlers)
    options = SubscriptionOptions(batch=batch, min_events=min_events, max_events=max_events,
                                  max_wait=max_wait, mode=mode, retry=retry, dead_letter=dead_letter,
                                  start=consumer.start)
    worker._add(make_subscription(reader.session, consumer.topic, consumer.group, handler, options), reader)
    worker.run(until=until)
    return worker


@contextmanager
def signals_handled(on_signal: Callable[[int, FrameType | None], None], install: bool,
                    previous: dict[signal.Signals, Any]) -> Iterator[None]:
    """For the block, ``on_signal`` handles SIGINT and SIGTERM (if ``install`` and in the main thread);
    the handlers it replaces are kept in ``previous`` and put back afterwards."""
    if install and threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, on_signal)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
