"""The Kafka protocol gateway: unmodified Kafka clients and tools over pgstreams topics (``docs/kafka.md``).

``pgstreams kafka serve`` runs it from the command line; from Python, :func:`serve` (until cancelled) or
:class:`Gateway` (``async with``). It needs the ``kafka`` extra (``pip install "pgstreams[kafka]"``: the
``kio`` codec). What is served is listed in :data:`SERVED`, the one table that both dispatch and the
``ApiVersions`` reply are built from.
"""

from __future__ import annotations

from .server import DEFAULT_LISTEN, Gateway, serve
from .versions import SERVED, ApiRange

__all__ = ["DEFAULT_LISTEN", "SERVED", "ApiRange", "Gateway", "serve"]
