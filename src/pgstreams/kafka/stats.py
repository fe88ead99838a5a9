"""The gateway's own counters, for its Prometheus metrics (``pgstreams.metrics.GatewayCollector``): open and
accepted connections, requests and requests answered with an error per API, and the duration of each
request reported to watchers (as a worker's ``WorkerStats``)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any

#: A watcher of request durations: ``watcher(api, seconds)``.
DurationWatcher = Callable[[str, float], None]


class GatewayStats:
    """Counters of a gateway since it started (read with :meth:`snapshot`), and request durations reported
    to watchers (:meth:`watch`)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.open_connections = 0
        self.connections = 0
        self.requests: dict[str, int] = {}
        self.errors: dict[str, int] = {}
        self._watchers: list[DurationWatcher] = []

    def watch(self, watcher: DurationWatcher) -> None:
        """Call ``watcher(api, seconds)`` for every request answered from now on (on the gateway's event
        loop: it must be quick)."""
        with self._lock:
            self._watchers.append(watcher)

    def connected(self) -> None:
        with self._lock:
            self.open_connections += 1
            self.connections += 1

    def disconnected(self) -> None:
        with self._lock:
            self.open_connections -= 1

    def answered(self, api: str, seconds: float, failed: bool) -> None:
        """A request of ``api`` was answered after ``seconds``; ``failed``: with an error code (or not at
        all: the connection was closed)."""
        with self._lock:
            self.requests[api] = self.requests.get(api, 0) + 1
            if failed:
                self.errors[api] = self.errors.get(api, 0) + 1
        for w in self._watchers:
            w(api, seconds)

    def snapshot(self) -> dict[str, Any]:
        """The counters: ``open_connections``, ``connections``, ``requests`` and ``errors`` (per API)."""
        with self._lock:
            return {"open_connections": self.open_connections, "connections": self.connections,
                    "requests": dict(self.requests), "errors": dict(self.errors)}


def has_error(values: object) -> bool:
    """Whether a response (as plain values) carries an error code other than 0 anywhere."""
    if isinstance(values, Mapping):
        for k, v in values.items():
            if k == "error_code":
                if v:
                    return True
            elif isinstance(v, (Mapping, list, tuple)) and has_error(v):
                return True
        return False
    if isinstance(values, (list, tuple)):
        return any(isinstance(v, (Mapping, list, tuple)) and has_error(v) for v in values)
    return False
