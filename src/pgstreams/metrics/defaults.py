"""The defaults of the metrics exporters (importable without prometheus_client, for help texts)."""

from __future__ import annotations

#: Where ``pgstreams metrics serve`` and ``pgstreams worker --metrics-port`` listen by default (loopback).
DEFAULT_METRICS_HOST = "127.0.0.1"
#: The default port of ``pgstreams metrics serve``.
DEFAULT_METRICS_PORT = 9187
#: Seconds a status read is reused for further scrapes (however many scrapers ask meanwhile).
DEFAULT_MIN_INTERVAL = 5.0
#: Buckets (seconds) of the handler and batch duration histograms of a worker's metrics.
DEFAULT_DURATION_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
                            30.0, 60.0)
