"""Prometheus metrics for pgstreams (the optional ``metrics`` extra: ``pip install "pgstreams[metrics]"``).

- :class:`StatusCollector`: the database-wide metrics (topics, partitions, group lag, members, dead
  letters), read from the status views through :meth:`pgstreams.Client.status` at most once per
  ``min_interval`` however many scrapers ask; register it in an application's own registry
  (``registry.register(StatusCollector(client))``);
- :class:`CaptureCollector`: the change data captures' slots (lag in bytes, retained WAL, ``wal_status``,
  ``safe_wal_size``), what they stored and their incremental snapshots, through ``client.cdc.list()``;
- :class:`WorkerCollector`: a :class:`pgstreams.Worker`'s own counters and duration histograms;
- :class:`GatewayCollector`: a Kafka gateway's connections, requests, errors and request durations;
- :func:`serve`: an HTTP endpoint (``/metrics``) for a registry, as ``pgstreams metrics serve`` and
  ``pgstreams worker --metrics-port N`` run it;
- :func:`render`: a registry in Prometheus' text format, the same bytes as
  ``prometheus_client.generate_latest`` in a fraction of its time (what :func:`serve` sends).

This package depends on the core's public API; the core imports nothing of it. See ``docs/metrics.md``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .defaults import (
    DEFAULT_DURATION_BUCKETS,
    DEFAULT_METRICS_HOST,
    DEFAULT_METRICS_PORT,
    DEFAULT_MIN_INTERVAL,
)

if TYPE_CHECKING:
    from .cdc import CaptureCollector
    from .collectors import GatewayCollector, StatusCollector, WorkerCollector
    from .exposition import render
    from .server import MetricsServer, serve

# The collectors need prometheus_client: imported on first use, so that the defaults are importable
# without it (the command line's help texts).
_LAZY = {"CaptureCollector": ".cdc", "StatusCollector": ".collectors", "WorkerCollector": ".collectors",
         "GatewayCollector": ".collectors", "MetricsServer": ".server", "serve": ".server",
         "render": ".exposition"}

if not TYPE_CHECKING:

    def __getattr__(name: str) -> Any:
        if name in _LAZY:
            value = getattr(importlib.import_module(_LAZY[name], __name__), name)
            globals()[name] = value
            return value
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = [
    "DEFAULT_DURATION_BUCKETS",
    "DEFAULT_METRICS_HOST",
    "DEFAULT_METRICS_PORT",
    "DEFAULT_MIN_INTERVAL",
    "CaptureCollector",
    "GatewayCollector",
    "MetricsServer",
    "StatusCollector",
    "WorkerCollector",
    "render",
    "serve",
]
