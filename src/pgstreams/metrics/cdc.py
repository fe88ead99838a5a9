"""The metrics of change data capture: each capture's replication slot (its lag behind the server's WAL,
the WAL it keeps, ``wal_status``, ``safe_wal_size``) and what it stored, read through
``client.cdc.list()`` (label ``capture``)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ..cdc import CaptureInfo
from .defaults import DEFAULT_MIN_INTERVAL
from .exposition import FastFamily, label_text

if TYPE_CHECKING:
    from ..client import Client

log = logging.getLogger("pgstreams.metrics")

#: The values of a slot's ``wal_status`` (PostgreSQL 13+): ``pgstreams_cdc_slot_wal_status`` is 1 for the
#: current one; ``lost``: the slot lost WAL it needed (its capture cannot go on).
WAL_STATUSES = ("reserved", "extended", "unreserved", "lost")
_CAPTURE = ("capture",)


class CaptureCollector(Collector):
    """The captures of one schema (``client.cdc.list()``, or ``captures``, any callable returning
    :class:`pgstreams.cdc.CaptureInfo` values), read at most once per ``min_interval`` seconds (default
    :data:`DEFAULT_MIN_INTERVAL`) however many scrapers ask. A failed read is logged and exports
    ``pgstreams_cdc_up 0``. ``clock`` (default ``time.monotonic``) times the reuse."""

    def __init__(self, client: Client | None = None, *,
                 captures: Callable[[], Sequence[CaptureInfo]] | None = None,
                 min_interval: float = DEFAULT_MIN_INTERVAL, clock: Callable[[], float] = time.monotonic
                 ) -> None:
        if (client is None) == (captures is None):
            raise ValueError("pass either a client or a captures callable")
        if isinstance(min_interval, bool) or not isinstance(min_interval, int | float) or min_interval < 0:
            raise ValueError(f"min_interval must be a number of seconds >= 0, not {min_interval!r}")
        self._captures: Callable[[], Sequence[CaptureInfo]] = (
            captures if captures is not None else client.cdc.list)  # type: ignore[union-attr]
        self.min_interval = float(min_interval)
        self._clock = clock
        self._lock = threading.Lock()
        self._read: Sequence[CaptureInfo] | None = None
        self._read_at: float | None = None

    def read(self) -> Sequence[CaptureInfo] | None:
        """The captures: the last read if younger than ``min_interval``, else a new one (``None`` when
        reading failed)."""
        with self._lock:
            now = self._clock()
            if self._read_at is not None and now - self._read_at < self.min_interval:
                return self._read
            self._read_at = now
            try:
                self._read = list(self._captures())
            except Exception as exc:  # noqa: BLE001 - the exporter reports it and keeps serving
                self._read = None
                log.warning("reading the captures failed: %s", str(exc).strip())
            return self._read

    def describe(self) -> list[Metric]:
        """Nothing up front: a registry must not read the database when the collector is registered."""
        return []

    def collect(self) -> Iterator[Metric]:
        captures = self.read()
        up = GaugeMetricFamily("pgstreams_cdc_up", "1 if the last read of the captures succeeded, else 0")
        up.add_metric([], 0.0 if captures is None else 1.0)
        yield up
        if captures:
            yield from capture_metrics(captures)


def capture_metrics(captures: Sequence[CaptureInfo]) -> Iterator[Metric]:
    """The families of ``captures`` (those of a slot only while the slot exists)."""
    def gauge(name: str, doc: str, labels: tuple[str, ...] = _CAPTURE) -> FastFamily:
        return FastFamily(name, doc, "gauge", labels)

    present = gauge("pgstreams_cdc_slot_present", "1 while the capture's replication slot exists (0: "
                    "dropped, the capture cannot go on)")
    active = gauge("pgstreams_cdc_slot_active", "1 while a process reads the capture's slot")
    lag = gauge("pgstreams_cdc_slot_lag_bytes", "WAL written since the slot's confirmed position")
    retained = gauge("pgstreams_cdc_slot_retained_bytes", "WAL the server keeps for the slot")
    safe = gauge("pgstreams_cdc_slot_safe_wal_size_bytes", "WAL that can still be written before the slot "
                 "loses WAL it needs (max_slot_wal_keep_size; absent without a limit)")
    status = gauge("pgstreams_cdc_slot_wal_status", "1 for the slot's wal_status (reserved, extended, "
                   "unreserved, lost)", ("capture", "status"))
    changes = FastFamily("pgstreams_cdc_changes", "Events the capture stored (snapshot rows included)",
                         "counter", _CAPTURE)
    transactions = FastFamily("pgstreams_cdc_transactions", "Source transactions the capture stored",
                              "counter", _CAPTURE)
    snapshot_rows = gauge("pgstreams_cdc_snapshot_rows", "Rows an incremental snapshot of a table stored",
                          ("capture", "table"))
    snapshot_done = gauge("pgstreams_cdc_snapshot_finished", "1 once an incremental snapshot of a table is "
                          "finished", ("capture", "table"))
    for c in captures:
        labels = (c.name,)
        text = label_text(_CAPTURE, labels)
        changes.add(labels, c.changes, text)
        transactions.add(labels, c.transactions, text)
        present.add(labels, 0.0 if c.slot_active is None else 1.0, text)
        for s in c.snapshots:
            pair = (c.name, s.table)
            snapshot_rows.add(pair, s.rows)
            snapshot_done.add(pair, 1.0 if s.finished else 0.0)
        if c.slot_active is None:
            continue
        active.add(labels, 1.0 if c.slot_active else 0.0, text)
        lag.add(labels, c.lag_bytes or 0, text)
        retained.add(labels, c.retained_bytes or 0, text)
        if c.safe_wal_size is not None:
            safe.add(labels, c.safe_wal_size, text)
        for st in WAL_STATUSES:
            status.add((c.name, st), 1.0 if c.wal_status == st else 0.0)
    yield from (present, active, lag, retained, safe, status, changes, transactions, snapshot_rows,
                snapshot_done)
