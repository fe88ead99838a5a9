"""Status samples of the last minutes, behind the console's charts (publish rate, group lag, share-group
backlog)."""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from ..models import StatusSnapshot

log = logging.getLogger("pgstreams.console")


@dataclass(frozen=True)
class Sample:
    """One status read: when (monotonic seconds), events published per topic, lag per (group, topic), and
    per (share group, topic) its backlog: events in flight, available or waiting."""

    at: float
    published: dict[str, int]
    lag: dict[tuple[str, str], int]
    backlog: dict[tuple[str, str], int]


class History:
    """The samples of the last ``minutes``, read by a background thread every ``interval`` seconds
    through ``status`` (``Client.status``); the latest snapshot too, for the pages."""

    def __init__(self, status: Callable[[], StatusSnapshot], interval: float, minutes: float) -> None:
        self._status = status
        self.interval = interval
        self._samples: deque[Sample] = deque(maxlen=max(2, int(minutes * 60 / interval) + 1))
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start sampling (a daemon thread)."""
        self._thread = threading.Thread(target=self._run, name="pgstreams-console-history", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop sampling."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _run(self) -> None:
        while True:
            try:
                self.record(self._status())
            except Exception as exc:  # noqa: BLE001 - a failed sample leaves a gap; the pages say why
                log.warning("console status sample failed: %s", str(exc).strip())
            if self._stop.wait(self.interval):
                return

    def record(self, snap: StatusSnapshot) -> None:
        """Add a sample of ``snap``."""
        published: dict[str, int] = {}
        for p in snap.partitions:
            published[p.topic] = published.get(p.topic, 0) + p.published
        lag: dict[tuple[str, str], int] = {}
        for g in snap.groups:
            lag[(g.group, g.topic)] = lag.get((g.group, g.topic), 0) + g.lag
        backlog: dict[tuple[str, str], int] = {}
        for s in snap.shares:
            key = (s.group, s.topic)
            backlog[key] = backlog.get(key, 0) + s.acquired + s.available + s.waiting
        with self._lock:
            self._samples.append(Sample(time.monotonic(), published, lag, backlog))

    def rates(self, topic: str) -> list[float]:
        """Events published per second to ``topic`` between consecutive samples."""
        with self._lock:
            samples = list(self._samples)
        out = []
        for a, b in itertools.pairwise(samples):
            if topic in a.published and topic in b.published and b.at > a.at:
                out.append(max(0.0, (b.published[topic] - a.published[topic]) / (b.at - a.at)))
        return out

    def lags(self, group: str, topic: str) -> list[float]:
        """The lag of ``group`` on ``topic`` (events, all partitions) at each sample."""
        with self._lock:
            return [float(s.lag[(group, topic)]) for s in self._samples if (group, topic) in s.lag]

    def backlogs(self, group: str, topic: str) -> list[float]:
        """The backlog of share group ``group`` on ``topic`` (events in flight, available or waiting, all
        partitions) at each sample."""
        with self._lock:
            return [float(s.backlog[(group, topic)]) for s in self._samples if (group, topic) in s.backlog]
