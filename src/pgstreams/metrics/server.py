"""The metrics endpoint: Prometheus' text format at ``/metrics`` (and ``/``) over HTTP."""

from __future__ import annotations

import gzip
import socket
import threading
from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import parse_qs
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import CollectorRegistry, generate_latest, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer, choose_encoder, gzip_accepted

from .defaults import DEFAULT_METRICS_HOST, DEFAULT_METRICS_PORT
from .exposition import render


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
    family, addr = _best_family(host, port)

    class Server(ThreadingWSGIServer):
        address_family = family

    server = make_server(addr, port, metrics_app(registry), Server, handler_class=_Quiet)
    thread = threading.Thread(target=server.serve_forever, name="pgstreams-metrics-http", daemon=True)
    thread.start()
    return MetricsServer(server, thread, host)


#: A WSGI application.
WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


def metrics_app(registry: CollectorRegistry) -> WsgiApp:
    """A WSGI application serving ``registry`` as ``prometheus_client.make_wsgi_app`` does (any path,
    ``OPTIONS``, gzip when accepted, OpenMetrics and ``name[]`` filters on request), with Prometheus'
    default text format rendered by :func:`pgstreams.metrics.exposition.render` (the same bytes, faster)."""
    fallback = make_wsgi_app(registry)

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        encoder, content_type = choose_encoder(environ.get("HTTP_ACCEPT", ""))
        if (environ["REQUEST_METHOD"] != "GET" or environ.get("PATH_INFO") == "/favicon.ico"
                or encoder is not generate_latest or "name[]" in parse_qs(environ.get("QUERY_STRING", ""))):
            return fallback(environ, start_response)
        output = render(registry)
        headers = [("Content-Type", content_type)]
        if gzip_accepted(environ.get("HTTP_ACCEPT_ENCODING", "")):
            output = gzip.compress(output)
            headers.append(("Content-Encoding", "gzip"))
        start_response("200 OK", headers)
        return [output]

    return app


class _Quiet(WSGIRequestHandler):
    """Logs no request."""

    def log_message(self, format: str, *args: Any) -> None:
        pass


def _best_family(host: str, port: int) -> tuple[socket.AddressFamily, str]:
    """The address family and address to bind ``host`` with (IPv6 addresses too)."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, _, _, _, sockaddr = infos[0]
    return family, str(sockaddr[0])
