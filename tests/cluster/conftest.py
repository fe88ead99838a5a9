"""Fixtures of the cluster tests: three PostgreSQL servers of this test session's own (embedded binaries,
each on its own loopback port), and per test a fresh database on each of them, made a cluster.

The tests of this folder run on one xdist worker (``xdist_group("cluster")``, see tests/conftest.py), so
a test session starts three servers, not three per worker.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack

import psycopg
import pytest

from _core_helpers import new_database
from pgstreams.cluster import init_cluster
from pgstreams.embedded import TemporaryServer, restartable_server

SHARDS = 3


@pytest.fixture(scope="session")
def shard_servers() -> Iterator[list[TemporaryServer]]:
    """Three running servers (fsync off: the machine does not crash; commits stay synchronous)."""
    with ExitStack() as stack:
        yield [stack.enter_context(restartable_server({"fsync": "off"})) for _ in range(SHARDS)]


@pytest.fixture
def shard_dsns(shard_servers: list[TemporaryServer]) -> list[str]:
    """A new empty database on each server: the DSNs of the shards of a cluster not created yet."""
    for server in shard_servers:  # a test that stopped a server and failed before starting it again
        try:
            psycopg.connect(server.dsn, connect_timeout=5).close()
        except psycopg.OperationalError:
            server.start()
    return [new_database(s.dsn, "shard_") for s in shard_servers]


@pytest.fixture
def cluster_dsns(shard_dsns: list[str]) -> list[str]:
    """The shard DSNs of a new cluster (``pgstreams cluster init`` done)."""
    init_cluster(shard_dsns)
    return shard_dsns
