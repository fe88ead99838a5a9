"""The cluster worker: runs handlers on a cluster's topics, as a member of their groups on every shard.

A :class:`ClusterWorker` runs one :class:`pgstreams.Worker` per shard (the same member id on each): each
is a member of the group on its shard and leases that shard's partitions with the single-server fair
share, balancing and fencing, so together the members of a group lease (shard, partition) pairs. A
shard's worker that stops because its shard became unreachable is started again once the shard answers;
the other shards' workers go on meanwhile.
"""

from __future__ import annotations

import inspect
import logging
import signal
import threading
from collections.abc import Sequence
from types import FrameType
from typing import TYPE_CHECKING, Any

from ..errors import InvalidArgument
from ..groups import new_member_id
from ..models import Event
from ..worker import Worker
from ..worker.handlers import is_async
from ..worker.worker import signals_handled
from .consumer import SHARD_RETRY_INTERVAL, tag_shard

if TYPE_CHECKING:
    from .client import ClusterClient

__all__ = ["ClusterWorker"]

log = logging.getLogger("pgstreams.cluster")


class _OnShard:
    """A handler whose events are tagged with their shard before it is called (same arity)."""

    def __init__(self, handler: Any, shard: int) -> None:
        self.handler = handler
        self.shard = shard
        self.__signature__ = inspect.signature(handler)

    def __call__(self, first: Event | Sequence[Event], *rest: Any) -> Any:
        tag_shard([first] if isinstance(first, Event) else first, self.shard)
        return self.handler(first, *rest)


def _on_shard(handler: Any, shard: int) -> Any:
    """``handler`` tagging its events with ``shard`` (an ``async def`` handler stays one)."""
    if is_async(handler):
        async def call(first: Event | Sequence[Event], *rest: Any) -> Any:
            tag_shard([first] if isinstance(first, Event) else first, shard)
            return await handler(first, *rest)

        call.__signature__ = inspect.signature(handler)  # type: ignore[attr-defined]
        return call
    return _OnShard(handler, shard)


class ClusterWorker:
    """Runs handlers on a cluster's topics: :meth:`subscribe` as :meth:`pgstreams.Worker.subscribe`
    (same arguments), one member per shard of the topic's span; handlers receive events with their
    ``shard``, and in ``mode="transactional"`` the connection of that shard's transaction.

    ``member_id`` (default ``host:pid:random``) names the member on every shard; ``shutdown_timeout`` and
    ``maintenance`` are passed to each shard's :class:`pgstreams.Worker` (so every shard has its
    maintenance). ``install_signal_handlers`` (default true): :meth:`run` stops on SIGINT/SIGTERM.
    """

    def __init__(self, cluster: ClusterClient, *, member_id: str | None = None,
                 install_signal_handlers: bool = True, **worker_options: Any) -> None:
        if member_id is not None and (not isinstance(member_id, str) or not 0 < len(member_id) <= 200):
            raise InvalidArgument(f"member_id must be a string of 1 to 200 characters, got {member_id!r}")
        self.cluster = cluster
        self.member_id = member_id or new_member_id()
        self.install_signal_handlers = install_signal_handlers
        self._options = worker_options
        self._subs: dict[int, list[tuple[str, str, Any, dict[str, Any]]]] = {}
        self._workers: dict[int, Worker] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._watch: threading.Thread | None = None
        self._started = False
        self._new(0, check_only=True)

    def __repr__(self) -> str:
        return f"<pgstreams.ClusterWorker {self.member_id!r} shards={sorted(self._subs)}>"

    def _new(self, shard: int, check_only: bool = False) -> Worker:
        worker = Worker(self.cluster.shards[shard], member_id=self.member_id, install_signal_handlers=False,
                        **self._options)
        if not check_only:
            for topic, group, handler, options in self._subs.get(shard, []):
                worker.subscribe(topic, group, _on_shard(handler, shard), **options)
        return worker

    def subscribe(self, topic: str, group: str, handler: Any, **options: Any) -> None:
        """Run ``handler`` on ``topic`` (every shard of its span) as a member of ``group``; the options are
        those of :meth:`pgstreams.Worker.subscribe`, checked on the first shard before anything runs."""
        if self._started:
            raise InvalidArgument("subscribe before starting the worker")
        state = self.cluster.topic(topic, refresh=True)
        probe = self._new(0, check_only=True)
        probe.subscribe(topic, group, _on_shard(handler, 0), **options)  # validates everything once
        for shard in range(state.span):
            self._subs.setdefault(shard, []).append((topic, group, handler, dict(options)))

    @property
    def workers(self) -> dict[int, Worker]:
        """The running :class:`pgstreams.Worker` of each shard."""
        with self._lock:
            return dict(self._workers)

    def assignment(self) -> dict[tuple[str, str], tuple[tuple[int, int], ...]]:
        """The (shard, partition) pairs being processed now, per ``(group, topic)``."""
        out: dict[tuple[str, str], list[tuple[int, int]]] = {}
        for shard, worker in sorted(self.workers.items()):
            for key, partitions in worker.assignment().items():
                out.setdefault(key, []).extend((shard, p) for p in partitions)
        return {k: tuple(v) for k, v in out.items()}

    def start(self) -> None:
        """Start a worker on every shard with subscriptions (a shard that cannot be reached is started
        once it answers) and the thread that watches them."""
        if not self._subs:
            raise InvalidArgument("the worker has no subscriptions: call subscribe() first")
        if self._started:
            raise InvalidArgument("the worker was already started")
        self._started = True
        for shard in sorted(self._subs):
            self._start_shard(shard)
        self._watch = threading.Thread(target=self._watcher, name="pgstreams-cluster-worker", daemon=True)
        self._watch.start()

    def _start_shard(self, shard: int) -> None:
        try:
            worker = self._new(shard)
            worker.start()
        except Exception as exc:  # noqa: BLE001 - the shard is tried again by the watcher
            log.warning("%s: cannot start the worker of %s (%s); trying again", self.member_id,
                        self.cluster.shard_name(shard), exc)
            return
        with self._lock:
            self._workers[shard] = worker

    def _watcher(self) -> None:
        while not self._stop.wait(SHARD_RETRY_INTERVAL / 4):
            for shard in sorted(self._subs):
                with self._lock:
                    worker = self._workers.get(shard)
                if worker is not None and not worker.wait(0):
                    continue
                if worker is not None:
                    log.warning("%s: the worker of %s stopped (%s); starting it again", self.member_id,
                                self.cluster.shard_name(shard), worker.failure)
                    with self._lock:
                        self._workers.pop(shard, None)
                if not self._stop.is_set():
                    self._start_shard(shard)

    def request_stop(self) -> None:
        """Ask the worker to stop (returns at once)."""
        self._stop.set()

    def stop(self, timeout: float | None = None) -> None:
        """Stop every shard's worker gracefully (see :meth:`pgstreams.Worker.stop`). Idempotent."""
        self._stop.set()
        if self._watch is not None:
            self._watch.join()
        for worker in self.workers.values():
            worker.request_stop()
        for worker in self.workers.values():
            worker.stop(timeout)

    def run(self, until: threading.Event | None = None) -> None:
        """Start, block until SIGINT/SIGTERM, :meth:`request_stop` or ``until`` is set, then stop."""
        previous: dict[signal.Signals, Any] = {}

        def on_signal(signum: int, frame: FrameType | None) -> None:
            self._stop.set()

        with signals_handled(on_signal, self.install_signal_handlers, previous):
            self.start()
            while not self._stop.wait(0.1):
                if until is not None and until.is_set():
                    break
            self.stop()

    def __enter__(self) -> ClusterWorker:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
