"""TLS between Kafka clients and ``pgstreams kafka serve --tls-cert``: librdkafka connects with
``security.protocol=SSL`` and verifies the gateway's certificate; a client that speaks plaintext to it
gets no Kafka reply; bad TLS options are usage errors."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from confluent_kafka import Producer

import pgstreams
from _gateway_helpers import serve_process


@pytest.fixture
def certificate(tmp_path: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 and its key (PEM), made with openssl."""
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
                    "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key),
                    "-out", str(cert)], check=True, capture_output=True, timeout=60)
    return cert, key


def test_clients_connect_with_tls_and_plaintext_gets_nothing(client: pgstreams.Client, dsn: str,
                                                              certificate: tuple[Path, Path]) -> None:
    cert, key = certificate
    client.create_topic("t", partitions=1)
    cmd = [sys.executable, "-m", "pgstreams.cli", "kafka", "serve", "--dsn", dsn, "--listen", "127.0.0.1:0"]
    for args, word in ((["--tls-key", str(key)], "--tls-cert"),
                       (["--tls-cert", str(cert.with_name("missing.pem"))], "--tls-cert")):
        bad = subprocess.run([*cmd, *args], capture_output=True, text=True, timeout=120)
        assert bad.returncode == 2 and word in bad.stderr and "Traceback" not in bad.stderr, bad.stderr
    with serve_process(dsn, "--tls-cert", str(cert), "--tls-key", str(key)) as (proc, bootstrap):
        host, port = bootstrap.rsplit(":", 1)[0], int(bootstrap.rsplit(":", 1)[1])
        errors: list[object] = []
        producer = Producer({"bootstrap.servers": bootstrap, "security.protocol": "SSL",
                             "ssl.ca.location": str(cert), "message.timeout.ms": 30000})
        producer.produce("t", value=b"over tls", on_delivery=lambda err, m: errors.append(err))
        producer.flush(60)
        assert errors == [None]
        # an ApiVersions request in plaintext: the TLS handshake fails, no Kafka reply comes back
        with socket.create_connection((host, port), timeout=30) as sock:
            sock.sendall(bytes.fromhex("0000000a00120000000000010000"))
            reply = b""
            try:
                while chunk := sock.recv(4096):
                    reply += chunk
            except OSError:
                pass
            assert not reply.startswith(b"\x00\x00")  # nothing framed as a Kafka reply
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
    assert [e.value for e in client.consumer("t", "check").poll(timeout=5)] == [b"over tls"]
