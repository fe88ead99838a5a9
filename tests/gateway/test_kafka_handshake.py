"""The Kafka gateway's handshake and metadata, with real Kafka clients (confluent-kafka, which is
librdkafka, and kafka-python) and raw frames: the versions advertised come from the one table, an
unsupported or malformed request costs its own connection only, and ``pgstreams kafka serve`` runs and
refuses bad options as a command should."""

from __future__ import annotations

import re
import signal
import socket
import struct
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient
from kafka import KafkaConsumer

import pgstreams
from _core_helpers import wait_until
from _gateway_helpers import running_gateway, serve_process
from pgstreams.kafka import SERVED


@pytest.fixture
def gateway(client: pgstreams.Client, dsn: str) -> Iterator[str]:
    with running_gateway(dsn) as address:
        yield address


def _request(api_key: int, version: int, correlation: int, body: bytes = b"", flexible: bool = False
             ) -> bytes:
    header = struct.pack(">hhih", api_key, version, correlation, 4) + b"test"
    if flexible:
        header += b"\0"
    payload = header + body
    return struct.pack(">i", len(payload)) + payload


def _read_frame(sock: socket.socket) -> bytes:
    size = struct.unpack(">i", _recv(sock, 4))[0]
    return _recv(sock, size)


def _recv(sock: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        if not chunk:
            raise ConnectionError("closed")
        out += chunk
    return out


def _connect(address: str) -> socket.socket:
    host, port = address.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=30)
    return sock


def _api_versions_v0(frame: bytes) -> tuple[int, int, dict[int, tuple[int, int]]]:
    correlation, error, count = struct.unpack_from(">ihi", frame)
    apis = {}
    for i in range(count):
        key, lo, hi = struct.unpack_from(">hhh", frame, 10 + 6 * i)
        apis[key] = (lo, hi)
    return correlation, error, apis


def test_confluent_kafka_and_kafka_python_read_the_topics_and_partitions(client: pgstreams.Client,
                                                                         gateway: str) -> None:
    client.create_topic("orders", partitions=3)
    client.create_topic("audit", partitions=1)
    md = AdminClient({"bootstrap.servers": gateway}).list_topics(timeout=30)
    assert {t: len(m.partitions) for t, m in md.topics.items()} == {"orders": 3, "audit": 1}
    (broker,) = md.brokers.values()
    assert f"{broker.host}:{broker.port}" == gateway
    assert all(p.leader == broker.id for p in md.topics["orders"].partitions.values())
    consumer = KafkaConsumer(bootstrap_servers=gateway, request_timeout_ms=30000)
    try:
        assert consumer.topics() == {"orders", "audit"}
        assert consumer.partitions_for_topic("orders") == {0, 1, 2}
    finally:
        consumer.close()
    missing = AdminClient({"bootstrap.servers": gateway}).list_topics(topic="nope", timeout=30)
    assert missing.topics["nope"].error is not None
    assert missing.topics["nope"].error.name() == "UNKNOWN_TOPIC_OR_PART"


def test_api_versions_lists_exactly_the_table_and_refuses_an_unknown_version_in_v0(gateway: str) -> None:
    with _connect(gateway) as sock:
        sock.sendall(_request(18, 0, 41))
        correlation, error, apis = _api_versions_v0(_read_frame(sock))
        assert (correlation, error) == (41, 0)
        assert apis == {a.key: (a.min_version, a.max_version) for a in SERVED.values()}
        # a version above those served: UNSUPPORTED_VERSION (35), answered in v0 with the table
        sock.sendall(_request(18, 99, 42))
        correlation, error, apis = _api_versions_v0(_read_frame(sock))
        assert (correlation, error) == (42, 35) and 18 in apis
        # the connection stays usable
        sock.sendall(_request(18, 0, 43))
        assert _api_versions_v0(_read_frame(sock))[:2] == (43, 0)


def test_the_docs_list_exactly_the_apis_and_versions_served() -> None:
    page = (Path(__file__).resolve().parents[2] / "docs" / "kafka.md").read_text()
    listed = {int(k): (int(lo), int(hi))
              for k, lo, hi in re.findall(r"^\| (\d+) \| \w+ \| (\d+) to (\d+) \|$", page, re.M)}
    assert listed == {a.key: (a.min_version, a.max_version) for a in SERVED.values()}


@pytest.mark.parametrize("frame", [
    _request(9999, 0, 1),  # an API that is not served
    _request(3, 99, 1),  # a version of Metadata that is not served
    struct.pack(">i", 2**30) + b"x" * 16,  # a frame over the size limit
    struct.pack(">i", 20) + struct.pack(">hhi", 3, 12, 1) + b"\xff" * 12,  # a malformed Metadata
])
def test_a_bad_request_closes_its_own_connection_only(gateway: str, frame: bytes) -> None:
    with _connect(gateway) as good, _connect(gateway) as bad:
        bad.sendall(frame)
        with pytest.raises(ConnectionError):
            _read_frame(bad)
        good.sendall(_request(18, 0, 7))
        assert _api_versions_v0(_read_frame(good))[:2] == (7, 0)


def test_kafka_serve_command_serves_until_sigterm_and_refuses_bad_options(dsn: str) -> None:
    cmd = [sys.executable, "-m", "pgstreams.cli", "kafka", "serve", "--dsn", dsn]
    for args, word in ((["--listen", "nowhere"], "--listen"), (["--listen", "127.0.0.1:99999"], "--listen"),
                       (["--advertise", "host"], "--advertise"), (["--node-id", "-1"], "--node-id"),
                       (["--sasl", "GSSAPI"], "--sasl"),
                       (["--listen", "0.0.0.0:0"], "without authentication")):
        bad = subprocess.run([*cmd, *args], capture_output=True, text=True, timeout=120)
        assert bad.returncode == 2 and word in bad.stderr and "Traceback" not in bad.stderr, bad.stderr
    with serve_process(dsn) as (proc, bootstrap):
        md = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=30)
        assert md.brokers
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0


def test_kafka_serve_exports_its_metrics(client: pgstreams.Client, dsn: str) -> None:
    """``--metrics-port``: connections, requests and errors per API, and request durations."""
    client.create_topic("t", partitions=1)
    with serve_process(dsn, "--metrics-port", "0") as (proc, bootstrap):
        assert proc.stderr is not None
        metrics_line = wait_until(proc.stderr.readline, 60, "the metrics address")
        url = re.search(r"serving metrics at (\S+)", metrics_line)
        assert url, metrics_line
        admin = AdminClient({"bootstrap.servers": bootstrap})
        admin.list_topics(timeout=30)
        missing = admin.list_topics("nope", timeout=30).topics["nope"]
        assert missing.error is not None  # answered with UNKNOWN_TOPIC_OR_PARTITION: an error counted
        consumer = KafkaConsumer(bootstrap_servers=bootstrap)
        assert consumer.partitions_for_topic("t") == {0}
        consumer.close()
        with urllib.request.urlopen(url.group(1), timeout=30) as page:
            text = page.read().decode()
        label = f'gateway="{bootstrap}"'
        for api in ("metadata", "api_versions"):
            assert re.search(rf'pgstreams_kafka_requests_total\{{api="{api}",{label}\}} [1-9]', text), text
        assert re.search(rf'pgstreams_kafka_request_errors_total\{{api="metadata",{label}\}} [1-9]', text)
        assert not re.search(r'pgstreams_kafka_request_errors_total\{api="api_versions"', text)
        assert re.search(rf'pgstreams_kafka_connections_total\{{{label}\}} [1-9]', text)
        assert f"pgstreams_kafka_connections_open{{{label}}}" in text
        assert re.search(rf'pgstreams_kafka_request_duration_seconds_count\{{api="metadata",{label}\}} [1-9]',
                         text)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
