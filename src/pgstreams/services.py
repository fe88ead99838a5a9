"""Named background services and the supervisor that watches them.

A :class:`Service` is a loop in its own thread that runs ``step()`` every ``interval()`` seconds until it is
stopped. A step that raises kills the service: it does not restart itself, because a silently restarting
heartbeat hides the very failure that makes a member lose its leases. The :class:`Supervisor` notices a
dead service within ``check_interval`` seconds, logs it at CRITICAL level and calls its ``on_failure``
callback (the worker then stops and :meth:`pgstreams.Worker.run` raises :class:`ServiceFailed`).
Transient database errors are the step's business: membership steps catch connection errors, log them and
try again at the next tick.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence

from .errors import PgStreamsError

log = logging.getLogger("pgstreams.services")


class ServiceFailed(PgStreamsError):
    """A background service of a worker (heartbeat, balancer, runner) died; ``service`` names it and the
    exception that killed it is the ``__cause__``."""

    def __init__(self, service: str, error: BaseException) -> None:
        super().__init__(f"service {service!r} died: {type(error).__name__}: {error}")
        self.service = service
        self.error = error


class Service:
    """A named loop: ``step()`` runs every ``interval()`` seconds (0: back to back) in a daemon thread.

    Subclass and override :meth:`step` (and :meth:`interval`, :meth:`finish`), or pass ``step`` and
    ``interval`` (default 1.0 s). :meth:`wake` cuts the current wait short. :attr:`stopping` is set once
    :meth:`stop` was called, so a long step can return early.
    """

    def __init__(self, name: str, step: Callable[[], None] | None = None,
                 interval: float | Callable[[], float] = 1.0) -> None:
        self.name = name
        self._step_fn = step
        self._interval = interval
        self.stopping = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()
        self.error: BaseException | None = None

    def __repr__(self) -> str:
        state = "failed" if self.error else ("running" if self.alive else "stopped")
        return f"<pgstreams.Service {self.name!r} {state}>"

    def step(self) -> None:
        """One iteration of the loop."""
        if self._step_fn is not None:
            self._step_fn()

    def interval(self) -> float:
        """Seconds to wait after a step."""
        return self._interval() if callable(self._interval) else self._interval

    def finish(self) -> None:
        """Runs once in the service's thread after the loop ended, stopped or failed (:attr:`error` says
        which): release what the steps held. Does nothing by default."""

    def start(self) -> None:
        """Start the thread (once: later calls, from any thread, do nothing)."""
        if self._thread is not None:  # the common case, without the lock (services started on first use)
            return
        with self._start_lock:
            if self._thread is not None:
                return
            self._thread = threading.Thread(target=self._run, name=f"pgstreams-{self.name}", daemon=True)
            self._thread.start()

    def wake(self) -> None:
        """Run the next step now (at once if the loop is waiting, else right after the current step)."""
        if not self._wake.is_set():  # already set: a wake-up is pending; setting it again costs a lock
            self._wake.set()

    def request_stop(self) -> None:
        """Ask the loop to end after the current step, without waiting."""
        self.stopping.set()
        self._wake.set()

    def stop(self, timeout: float | None = None) -> None:
        """Ask the loop to end and wait for it (``timeout`` seconds at most; default: until it ends)."""
        self.request_stop()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        """True while the thread runs."""
        return self._thread is not None and self._thread.is_alive()

    @property
    def died(self) -> bool:
        """True if the loop ended by an exception (or ended without being asked to)."""
        return self._thread is not None and not self._thread.is_alive() and (
            self.error is not None or not self.stopping.is_set())

    def _run(self) -> None:
        try:
            while not self.stopping.is_set():
                self.step()
                if self.stopping.is_set():
                    break
                wait = self.interval()
                if wait > 0:
                    self._wake.wait(wait)
                self._wake.clear()
        except BaseException as exc:
            self.error = exc
            log.critical("service %s died: %s: %s", self.name, type(exc).__name__, exc, exc_info=exc)
        finally:
            self.finish()


class Supervisor:
    """Watches services from its own thread; on the first dead one, logs it and calls ``on_failure``."""

    def __init__(self, services: Sequence[Service], on_failure: Callable[[ServiceFailed], None],
                 check_interval: float = 0.05) -> None:
        self.services = list(services)
        self._on_failure = on_failure
        self._check_interval = check_interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.failure: ServiceFailed | None = None

    def start(self) -> None:
        """Start watching."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="pgstreams-supervisor", daemon=True)
            self._thread.start()

    def check(self) -> None:
        """Raise :class:`ServiceFailed` if a watched service died."""
        for svc in list(self.services):
            if svc.died:
                err = svc.error or RuntimeError("the loop ended without being stopped")
                failed = ServiceFailed(svc.name, err)
                failed.__cause__ = err
                raise failed

    def stop(self) -> None:
        """Stop watching (the services themselves are stopped by their owner)."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(5)

    def _run(self) -> None:
        while not self._stop.wait(self._check_interval):
            try:
                self.check()
            except ServiceFailed as failed:
                self.failure = failed
                log.critical("supervisor: %s; stopping the worker", failed)
                self._on_failure(failed)
                return
