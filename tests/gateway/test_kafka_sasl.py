"""SASL PLAIN through the Kafka gateway against PostgreSQL roles, on a server of the test's own that checks
passwords (SCRAM-SHA-256): a role's name and password authenticate a Kafka client, which then produces and
consumes only what ``pgstreams grant`` gave the role (``TOPIC_AUTHORIZATION_FAILED`` otherwise); a wrong
password, or a request before authenticating, gets nothing; and a gateway refuses to listen beyond
loopback without authentication unless told to."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import os
import socket
import struct
import threading
import time
from collections.abc import Iterator

import psycopg
import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from kafka import KafkaConsumer, KafkaProducer
from kafka import TopicPartition as KTopicPartition
from kafka.errors import GroupAuthorizationFailedError, TopicAuthorizationFailedError
from kio.schema.metadata.v12.request import MetadataRequest
from kio.schema.sasl_authenticate.v2.request import SaslAuthenticateRequest
from kio.schema.sasl_authenticate.v2.response import SaslAuthenticateResponse
from kio.schema.sasl_handshake.v0.request import SaslHandshakeRequest as SaslHandshakeRequestV0
from kio.schema.sasl_handshake.v0.response import SaslHandshakeResponse as SaslHandshakeResponseV0
from kio.schema.sasl_handshake.v1.request import SaslHandshakeRequest
from kio.schema.sasl_handshake.v1.response import SaslHandshakeResponse
from kio.serial import entity_reader
from psycopg import sql
from psycopg.conninfo import make_conninfo

import pgstreams
import pgstreams.aio
from _core_helpers import new_database
from _gateway_helpers import read_frame, request_frame
from pgstreams.embedded import restartable_server
from pgstreams.kafka import Gateway


@pytest.fixture(scope="module")
def checked() -> Iterator[str]:
    """A database (migrated) on a server that checks passwords, with roles ``alice`` (produce to and
    consume ``t`` as group ``g``), ``bob`` (produce to ``other``) and ``carol`` (nothing), and topics ``t``,
    ``secret`` and ``other``."""
    with restartable_server(password="admin-pw") as server:
        dsn = new_database(server.dsn, "sasl_")
        with pgstreams.connect(dsn) as client, psycopg.connect(dsn, autocommit=True) as conn:
            for role in ("alice", "bob", "carol"):
                conn.execute(sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
                    sql.Identifier(role), sql.Literal(f"{role}-pw")))
            client.create_topic("t", partitions=1)
            client.create_topic("secret", partitions=1)
            client.create_topic("other", partitions=1)
            client.grant("alice", produce=["t"], consume="g", topics=["t"])
            client.grant("bob", produce=["other"])
            client.publish("secret", "classified")
        yield dsn


def _gateway_thread(dsn: str, **options: object
                    ) -> tuple[str, asyncio.AbstractEventLoop, asyncio.Event, threading.Thread]:
    ready = threading.Event()
    state: dict[str, object] = {}

    async def main() -> None:
        async with await pgstreams.aio.connect(dsn) as client:
            async with Gateway(client, listen="127.0.0.1:0", **options) as gateway:  # type: ignore[arg-type]
                stop = asyncio.Event()
                state.update(address="{}:{}".format(*gateway.address), stop=stop,
                             loop=asyncio.get_running_loop())
                ready.set()
                await stop.wait()

    thread = threading.Thread(target=lambda: asyncio.run(main()), daemon=True)
    thread.start()
    assert ready.wait(60)
    return str(state["address"]), state["loop"], state["stop"], thread  # type: ignore[return-value]


@pytest.fixture(scope="module")
def gateway(checked: str) -> Iterator[str]:
    address, loop, stop, thread = _gateway_thread(checked, sasl=["PLAIN", "SCRAM-SHA-256"])
    yield address
    loop.call_soon_threadsafe(stop.set)
    thread.join(30)


def _config(gateway: str, user: str, password: str, mechanism: str = "PLAIN") -> dict[str, object]:
    return {"bootstrap.servers": gateway, "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": mechanism,
            "sasl.username": user, "sasl.password": password}


def _produce(gateway: str, user: str, password: str, topic: str, mechanism: str = "PLAIN") -> object:
    errors: list[object] = []
    p = Producer({**_config(gateway, user, password, mechanism), "message.timeout.ms": 10000, "retries": 0})
    p.produce(topic, value=b"hello", on_delivery=lambda err, m: errors.append(err))
    p.flush(30)
    assert len(errors) == 1
    return errors[0]


def test_a_role_produces_and_consumes_what_it_was_granted(checked: str, gateway: str) -> None:
    assert _produce(gateway, "alice", "alice-pw", "t") is None
    c = Consumer({**_config(gateway, "alice", "alice-pw"), "group.id": "g", "enable.auto.commit": False})
    c.assign([TopicPartition("t", 0, 0)])
    got = None
    deadline = time.monotonic() + 30
    while got is None and time.monotonic() < deadline:
        got = c.poll(0.5)
    c.close()
    assert got is not None and got.error() is None and got.value() == b"hello"
    with pgstreams.connect(checked) as client:  # stored as alice's event
        assert [e.value for e in client.consumer("t", "check").poll(timeout=5)] == [b"hello"]


def test_a_role_without_the_grant_is_refused_and_stores_nothing(checked: str, gateway: str) -> None:
    err = _produce(gateway, "bob", "bob-pw", "t")
    assert err is not None and err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED  # type: ignore[attr-defined]
    # alice reads t, not secret (kafka-python raises the fetch's error; librdkafka only logs it)
    c = KafkaConsumer(bootstrap_servers=gateway, security_protocol="SASL_PLAINTEXT", sasl_mechanism="PLAIN",
                      sasl_plain_username="alice", sasl_plain_password="alice-pw", enable_auto_commit=False)
    c.assign([KTopicPartition("secret", 0)])
    c.seek(KTopicPartition("secret", 0), 0)
    try:
        with pytest.raises(TopicAuthorizationFailedError):
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                assert not c.poll(500), "a record of a topic the role may not read"
    finally:
        c.close()
    with pgstreams.connect(checked) as client:
        assert all(e.value == b"hello" for e in client.consumer("t", "count").poll(timeout=2))


def _frame(key: int, version: int, request: object) -> bytes:
    return request_frame(key, version, 7, request, "sasl-test")


def test_a_wrong_password_or_no_authentication_gets_nothing(gateway: str) -> None:
    host, port = gateway.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(_frame(17, 1, SaslHandshakeRequest(mechanism="PLAIN")))
        shake = entity_reader(SaslHandshakeResponse)(memoryview(read_frame(sock)), 4)[0]
        assert shake.error_code == 0 and shake.mechanisms == ("PLAIN", "SCRAM-SHA-256")
        sock.sendall(_frame(36, 2, SaslAuthenticateRequest(auth_bytes=b"\0alice\0wrong")))
        answer = entity_reader(SaslAuthenticateResponse)(memoryview(read_frame(sock)), 5)[0]
        assert answer.error_code == 58  # SASL_AUTHENTICATION_FAILED
        assert "alice" in (answer.error_message or "") and "wrong" not in (answer.error_message or "")
        assert read_frame(sock) == b""  # and the connection is closed
    with socket.create_connection((host, int(port)), timeout=30) as sock:  # a role granted nothing at all
        sock.sendall(_frame(17, 1, SaslHandshakeRequest(mechanism="PLAIN")))
        read_frame(sock)
        sock.sendall(_frame(36, 2, SaslAuthenticateRequest(auth_bytes=b"\0carol\0carol-pw")))
        answer = entity_reader(SaslAuthenticateResponse)(memoryview(read_frame(sock)), 5)[0]
        assert answer.error_code == 58 and "pgstreams grant" in (answer.error_message or "")
    with socket.create_connection((host, int(port)), timeout=30) as sock:  # a request before authenticating
        sock.sendall(_frame(3, 12, MetadataRequest(topics=None, allow_auto_topic_creation=False,
                                                   include_topic_authorized_operations=False)))
        assert read_frame(sock) == b""


def test_a_gateway_beyond_loopback_needs_authentication_or_an_explicit_choice(checked: str) -> None:
    async def main() -> None:
        async with await pgstreams.aio.connect(checked) as client:
            with pytest.raises(ValueError, match="without authentication"):
                Gateway(client, listen="0.0.0.0:0")
            with pytest.raises(ValueError, match="not served"):
                Gateway(client, listen="127.0.0.1:0", sasl=["GSSAPI"])
            async with Gateway(client, listen="0.0.0.0:0", allow_unauthenticated=True) as open_one:
                assert open_one.address[1] > 0
            async with Gateway(client, listen="0.0.0.0:0", sasl=["PLAIN"]) as guarded:
                assert guarded.address[1] > 0

    asyncio.run(main())
    assert make_conninfo(checked)  # the DSN stays usable


def test_scram_is_checked_by_postgresql_and_the_client_acts_as_the_role(checked: str, gateway: str) -> None:
    """SCRAM-SHA-256: the exchange is relayed to PostgreSQL (the gateway never sees the password); the
    authenticated client then has the role's rights, no more."""
    assert _produce(gateway, "alice", "alice-pw", "t", "SCRAM-SHA-256") is None
    err = _produce(gateway, "bob", "bob-pw", "t", "SCRAM-SHA-256")
    assert err is not None and err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED  # type: ignore[attr-defined]
    assert _scram(gateway, "alice", "alice-pw") == (0, True)  # the server's signature checks out
    code, _ = _scram(gateway, "alice", "wrong")
    assert code == 58  # SASL_AUTHENTICATION_FAILED
    ok = KafkaProducer(bootstrap_servers=gateway, security_protocol="SASL_PLAINTEXT",
                       sasl_mechanism="SCRAM-SHA-256", sasl_plain_username="alice",
                       sasl_plain_password="alice-pw")
    ok.send("t", b"kafka-python").get(timeout=30)
    ok.close()
    with pgstreams.connect(checked) as client:
        values = [e.value for e in client.consumer("t", "scram-check").poll(max_events=100, timeout=5)]
    assert values.count(b"hello") >= 1 and b"kafka-python" in values


def _scram(gateway: str, user: str, password: str) -> tuple[int, bool]:
    """A SCRAM-SHA-256 exchange (RFC 5802) over a raw connection: the final reply's error code, and whether
    the server's signature in it proves the server knew the role's verifier."""
    host, port = gateway.rsplit(":", 1)
    nonce = base64.b64encode(os.urandom(18)).decode()
    bare = f"n={user},r={nonce}"
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(_frame(17, 1, SaslHandshakeRequest(mechanism="SCRAM-SHA-256")))
        read_frame(sock)
        sock.sendall(_frame(36, 2, SaslAuthenticateRequest(auth_bytes=f"n,,{bare}".encode())))
        first = entity_reader(SaslAuthenticateResponse)(memoryview(read_frame(sock)), 5)[0]
        assert first.error_code == 0, first
        server_first = first.auth_bytes.decode()
        fields = dict(p.split("=", 1) for p in server_first.split(","))
        assert fields["r"].startswith(nonce)
        salt, rounds = base64.b64decode(fields["s"]), int(fields["i"])
        salted = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, rounds)
        client_key = hmac.digest(salted, b"Client Key", "sha256")
        without_proof = f"c=biws,r={fields['r']}"
        message = f"{bare},{server_first},{without_proof}".encode()
        signature = hmac.digest(hashlib.sha256(client_key).digest(), message, "sha256")
        proof = base64.b64encode(bytes(a ^ b for a, b in zip(client_key, signature, strict=True))).decode()
        sock.sendall(_frame(36, 2, SaslAuthenticateRequest(auth_bytes=f"{without_proof},p={proof}".encode())))
        final = entity_reader(SaslAuthenticateResponse)(memoryview(read_frame(sock)), 5)[0]
    server_key = hmac.digest(salted, b"Server Key", "sha256")
    expected = "v=" + base64.b64encode(hmac.digest(server_key, message, "sha256")).decode()
    return int(final.error_code), final.auth_bytes.decode() == expected


def test_a_role_without_a_consume_grant_cannot_join_a_group(gateway: str) -> None:
    """bob may produce to ``other`` but consume nothing: his JoinGroup is refused as a whole with
    GROUP_AUTHORIZATION_FAILED (not a closed connection)."""
    c = KafkaConsumer(bootstrap_servers=gateway, security_protocol="SASL_PLAINTEXT", sasl_mechanism="PLAIN",
                      sasl_plain_username="bob", sasl_plain_password="bob-pw", group_id="g",
                      enable_auto_commit=False)
    c.subscribe(["t"])
    try:
        with pytest.raises(GroupAuthorizationFailedError):
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                assert not c.poll(500), "a record for a role that may not consume"
    finally:
        c.close()


def test_after_a_version_0_handshake_the_plain_token_comes_as_it_is(gateway: str) -> None:
    """``SaslHandshake`` v0 (what librdkafka 2.0, Debian's kcat, looks for): the token follows in a frame of
    its own, not in a ``SaslAuthenticate``; an empty frame answers a good one, a bad one closes the
    connection."""
    host, port = gateway.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(_frame(17, 0, SaslHandshakeRequestV0(mechanism="PLAIN")))
        shake = entity_reader(SaslHandshakeResponseV0)(memoryview(read_frame(sock)), 4)[0]
        assert shake.error_code == 0
        token = b"\0alice\0alice-pw"
        sock.sendall(struct.pack(">i", len(token)) + token)
        assert sock.recv(4, socket.MSG_WAITALL) == struct.pack(">i", 0)  # authenticated: an empty token
        sock.sendall(_frame(3, 12, MetadataRequest(topics=None, allow_auto_topic_creation=False,
                                                   include_topic_authorized_operations=False)))
        assert len(read_frame(sock)) > 8  # requests are answered now
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(_frame(17, 0, SaslHandshakeRequestV0(mechanism="PLAIN")))
        read_frame(sock)
        token = b"\0alice\0wrong"
        sock.sendall(struct.pack(">i", len(token)) + token)
        assert sock.recv(4, socket.MSG_WAITALL) == b""  # closed
