"""The metrics endpoint: Prometheus' text format at ``/metrics`` (and ``/``) over HTTP."""

from __future__ import annotations

import threading
from typing import Any

from prometheus_client import CollectorRegistry, start_http_server

from .defaults import DEFAULT_METRICS_HOST, DEFAULT_METRICS_PORT


class MetricsServer:
    """A running endpoint for ``registry``: ``host`` and ``port`` (the bound port, when 0 was asked),
    :meth:`close` to stop it."""

    def __init__(self, server: Any, thread: threading.Thread, host: str) -> None:
        self._server = server
        self._thread = thread
        self.host = host
        self.port: int = int(server.server_address[1])

    @property
    def url(self) -> str:
        """The endpoint's address, ``http://HOST:PORT/metrics``."""
        return f"http://{self.host}:{self.port}/metrics"

    def close(self) -> None:
        """Stop serving."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


def serve(registry: CollectorRegistry, *, host: str = DEFAULT_METRICS_HOST, port: int = DEFAULT_METRICS_PORT
          ) -> MetricsServer:
    """Serve ``registry`` at ``http://host:port/metrics`` on a background thread (defaults:
    :data:`DEFAULT_METRICS_HOST`, :data:`DEFAULT_METRICS_PORT`; port 0: any free port). Raises
    ``OSError`` when the address cannot be bound."""
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise ValueError(f"port must be an integer from 0 to 65535, not {port!r}")
    server, thread = start_http_server(port, addr=host, registry=registry)
    return MetricsServer(server, thread, host)
