"""The Kafka client scenarios of the conformance tests, for one client against one broker: one line per
scenario on standard output, the same for every client and every broker that behaves as Kafka does.

    python scenarios.py CLIENT BOOTSTRAP PREFIX

``CLIENT``: ``confluent`` (librdkafka), ``kafka-python``, ``aiokafka`` or ``kcat`` (Debian's, driven as a
subprocess); KafkaJS has its own runner (``kafkajs/scenarios.js``). The topics (created beforehand by the
test, with ``PREFIX``): ``meta`` and ``keyed`` (3 partitions), ``group`` (2), ``txin``, ``txout``, ``idem``,
``acks0``, ``acks1``, ``acksall``, ``latest``, ``bytime``, ``gzip``, ``snappy``, ``lz4`` and ``zstd`` (1
partition each). Scenarios: the metadata of a topic; three records produced with each ``acks`` and read back
from the earliest offset; a read from the latest offset (the high watermark) and one from a time
(``ListOffsets`` by timestamp); three records compressed with each of Kafka's codecs read back; twelve keyed
records (Kafka's murmur2 partitioner) read back per partition; three records of an idempotent producer (the
first produce response to ``PREFIX idem`` is lost on the way: ``_losing_proxy.py``), then ``end``, read back;
a record produced to a topic that does not exist; a topic created with a configuration (``CreateTopics``),
described (``DescribeConfigs``) and reconfigured (``IncrementalAlterConfigs``, or ``AlterConfigs`` for the
clients without it); a consumer group of two members that split the partitions, commit, and hand over to the
one left when the other leaves, and whose commits a member started later resumes from, reading on across a
restart of the broker (the scenario prints :data:`RESTART_REQUEST` and waits for a line on standard input); a
transactional producer that aborts, then commits, records of ``txout`` with the offsets of ``txin`` (topics of
1 partition) for group ``PREFIX tx``, read back by a read-committed consumer; as a role that may read ``PREFIX
secure`` but not write to it, on the gateway that authenticates (``$SASL_BOOTSTRAP``, ``$SASL_USER``,
``$SASL_PASSWORD``; not run without them), a produce refused and a read. A scenario the broker refuses prints
``SCENARIO: error NAME``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable

ACKS = (("0", 0), ("1", 1), ("all", -1))
CODECS = ("gzip", "snappy", "lz4", "zstd")
KEYED = [(f"k{i % 6}", f"v{i}") for i in range(12)]
TIMEOUT = 30.0


def _keyed_line(got: list[tuple[int, str]]) -> str:
    parts: dict[int, list[str]] = {}
    for p, v in got:
        parts.setdefault(p, []).append(v)
    return "keyed: " + " ".join(f"p{p}=" + ",".join(parts[p]) for p in sorted(parts))


def _idempotence_line(read: list[str]) -> str:
    """What an idempotent producer's three records (whose first produce response was lost, so that the
    producer sent them again) and a record produced after them read back as: each once, then ``end``."""
    return "idempotence: " + " ".join(read)


def _admin_line(partitions: int, before: str, after: str) -> str:
    return f"admin: partitions={partitions} retention.ms={before} then {after}"


#: The gateway that authenticates (SASL PLAIN), and this client's role there, for the authorisation
#: scenario; unset (the reference broker, which runs without users): the scenario is not run.
SASL = (os.environ.get("SASL_BOOTSTRAP"), os.environ.get("SASL_USER"), os.environ.get("SASL_PASSWORD"))


def _auth_line(denied: bool, read: list[str]) -> str:
    return f"authorization: produce={'denied' if denied else 'allowed'} read={' '.join(read)}"


def _authorization(out: Callable[[str], None], run: Callable[[str, str, str], str]) -> None:
    bootstrap, user, password = SASL
    if not (bootstrap and user and password):
        out("authorization: not run (no SASL gateway)")
    else:
        out(_guarded("authorization", lambda: run(bootstrap, user, password)))


def _guarded(scenario: str, run: Callable[[], str]) -> str:
    """The line of ``run``, or ``SCENARIO: error NAME`` when it raised (a broker that refused it)."""
    try:
        return run()
    except Exception as exc:  # noqa: BLE001 - the line names it
        print(f"{scenario}: {exc!r}", file=sys.stderr)
        return f"{scenario}: error {type(exc).__name__}"


def _transactions_line(after_abort: str, after_commit: str, read: list[str]) -> str:
    return (f"transactions: offset after abort={after_abort} after commit={after_commit} "
            f"read committed={' '.join(read)}")


async def _aguarded(scenario: str, run: Callable[[], Awaitable[str]]) -> str:
    """:func:`_guarded` of a coroutine function."""
    try:
        return await run()
    except Exception as exc:  # noqa: BLE001 - the line names it
        print(f"{scenario}: {exc!r}", file=sys.stderr)
        return f"{scenario}: error {type(exc).__name__}"


class _Member:
    """A consumer of one client in group ``PREFIX g``, subscribed to topic ``PREFIX group``, polling in a
    thread of its own: what it was assigned and the values it read (each committed once read)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.assigned: set[int] = set()
        self.values: list[str] = []
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self.run, name=name, daemon=True)

    def run(self) -> None:
        raise NotImplementedError

    def start(self) -> _Member:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join(TIMEOUT)


def _until(what: str, cond: Callable[[], bool]) -> bool:
    deadline = time.monotonic() + TIMEOUT
    while not cond():
        if time.monotonic() > deadline:
            print(f"timed out waiting for {what}", file=sys.stderr)
            return False
        time.sleep(0.05)
    return True


def _group(member: Callable[[str], _Member], produce: Callable[[list[tuple[int, str]]], None],
           out: Callable[[str], None]) -> None:
    """Two members split the topic's two partitions and read what is then published; the first leaves
    and the second takes its partition; the second leaves too, and a third member resumes from their
    commits, and goes on reading across a restart of the broker. The values each read are printed sorted:
    a value read again would show."""
    one, two = member("one").start(), member("two").start()
    split = _until("both members to get a partition", lambda: one.assigned | two.assigned == {0, 1}
                   and bool(one.assigned) and bool(two.assigned) and not one.assigned & two.assigned)
    produce([(0, "a0"), (0, "a1"), (1, "a2"), (1, "a3")])
    _until("the first records", lambda: len(one.values) + len(two.values) >= 4)
    first, read = one.values + two.values, len(two.values)
    one.stop()
    _until("the member left to take both partitions", lambda: two.assigned == {0, 1})
    produce([(0, "b0"), (1, "b1")])
    _until("the records after the hand-over", lambda: len(two.values) >= read + 2)
    handed = two.values[read:]
    two.stop()
    produce([(0, "c0"), (1, "c1")])
    three = member("three").start()
    _until("the records after the restart", lambda: len(three.values) >= 2)
    _until("the member to hold both partitions", lambda: three.assigned == {0, 1})
    read = len(three.values)
    _restart_broker()
    produce([(0, "d0"), (1, "d1")])
    _until("the records after the broker's restart", lambda: len(three.values) >= read + 2)
    three.stop()
    for m in (one, two, three):  # shown by the test when the line differs
        print(f"group member {m.name}: assigned {sorted(m.assigned)}, read {m.values}", file=sys.stderr)
    out(f"group: split={'yes' if split else 'no'} first={' '.join(sorted(first))} "
        f"handed over={' '.join(sorted(handed))} resumed={' '.join(sorted(three.values[:read]))} "
        f"after the broker restarted={' '.join(sorted(three.values[read:]))}")


#: The line a scenario prints when it wants the broker restarted; the test answers on standard input
#: once it was (the reference broker, which keeps its data in memory, is not restarted).
RESTART_REQUEST = "restart the broker, please"


def _restart_broker() -> None:
    print(RESTART_REQUEST, flush=True)
    sys.stdin.readline()


def confluent(bootstrap: str, prefix: str, out: Callable[[str], None]) -> None:
    from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition
    from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, NewTopic

    md = AdminClient({"bootstrap.servers": bootstrap}).list_topics(f"{prefix}meta", timeout=TIMEOUT)
    out(f"metadata: {prefix}meta partitions={len(md.topics[f'{prefix}meta'].partitions)}")

    def read(topic: str, partitions: int, count: int) -> list[tuple[int, str]]:
        c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"{prefix}reader",
                      "enable.auto.commit": False})
        c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
        got: list[tuple[int, str]] = []
        deadline = time.monotonic() + TIMEOUT
        while len(got) < count and time.monotonic() < deadline:
            m = c.poll(0.2)
            if m is not None and m.error() is None:
                got.append((m.partition(), m.value().decode()))
        c.close()
        return got

    for name, acks in ACKS:
        p = Producer({"bootstrap.servers": bootstrap, "acks": acks, "linger.ms": 0})
        for i in range(3):
            p.produce(f"{prefix}acks{name}", value=f"v{i}".encode(), key=f"k{i}".encode())
        p.flush(TIMEOUT)
        out(f"acks={name}: " + " ".join(v for _, v in read(f"{prefix}acks{name}", 1, 3)))
    def produce(topic: str, values: list[str]) -> None:
        p = Producer({"bootstrap.servers": bootstrap})
        for v in values:
            p.produce(topic, value=v.encode())
        p.flush(TIMEOUT)

    def read_from(topic: str, offset: int, count: int) -> list[str]:
        c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"{prefix}from",
                      "enable.auto.commit": False})
        c.assign([TopicPartition(topic, 0, offset)])
        got: list[str] = []
        deadline = time.monotonic() + TIMEOUT
        while len(got) < count and time.monotonic() < deadline:
            m = c.poll(0.2)
            if m is not None and m.error() is None:
                got.append(m.value().decode())
        c.close()
        return got

    produce(f"{prefix}latest", ["old0", "old1"])
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"{prefix}latest", "enable.auto.commit": False})
    end = c.get_watermark_offsets(TopicPartition(f"{prefix}latest", 0), timeout=TIMEOUT)[1]
    c.close()
    produce(f"{prefix}latest", ["new0"])
    out("from latest: " + " ".join(read_from(f"{prefix}latest", end, 1)))
    produce(f"{prefix}bytime", ["before0", "before1"])
    at = int(time.time() * 1000) + 1
    time.sleep(0.01)  # the records after it are stamped later: the next milliseconds
    produce(f"{prefix}bytime", ["after0", "after1"])
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"{prefix}bytime", "enable.auto.commit": False})
    (found,) = c.offsets_for_times([TopicPartition(f"{prefix}bytime", 0, at)], timeout=TIMEOUT)
    c.close()
    out("from a time: " + " ".join(read_from(f"{prefix}bytime", found.offset, 2)))
    for codec in CODECS:
        p = Producer({"bootstrap.servers": bootstrap, "compression.type": codec, "linger.ms": 5})
        for i in range(3):
            p.produce(f"{prefix}{codec}", value=f"v{i}".encode() * 50, key=f"k{i}".encode())
        p.flush(TIMEOUT)
        out(f"compression={codec}: " + " ".join(v[:2] for _, v in read(f"{prefix}{codec}", 1, 3)))
    p = Producer({"bootstrap.servers": bootstrap, "partitioner": "murmur2_random"})
    for k, v in KEYED:
        p.produce(f"{prefix}keyed", value=v.encode(), key=k.encode())
    p.flush(TIMEOUT)
    out(_keyed_line(read(f"{prefix}keyed", 3, len(KEYED))))
    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for i in range(3):
        p.produce(f"{prefix}idem", value=f"v{i}".encode())
    p.flush(TIMEOUT)
    produce(f"{prefix}idem", ["end"])
    out(_idempotence_line([v for _, v in read(f"{prefix}idem", 1, 4)]))
    errors: list[object] = []
    p = Producer({"bootstrap.servers": bootstrap, "message.timeout.ms": 5000,
                  "allow.auto.create.topics": False})
    p.produce(f"{prefix}missing", value=b"x", on_delivery=lambda err, m: errors.append(err))
    p.flush(TIMEOUT)
    failed = bool(errors) and errors[0] is not None
    out("unknown topic: " + ("error" if failed else "stored"))

    def admin_scenario() -> str:
        admin = AdminClient({"bootstrap.servers": bootstrap})
        created = f"{prefix}created"
        new = NewTopic(created, 2, 1, config={"retention.ms": "3600000"})
        admin.create_topics([new])[created].result(TIMEOUT)
        partitions = len(admin.list_topics(created, timeout=TIMEOUT).topics[created].partitions)

        def retention() -> str:
            (future,) = admin.describe_configs([ConfigResource("topic", created)]).values()
            return str(future.result(TIMEOUT)["retention.ms"].value)

        before = retention()
        change = ConfigResource("topic", created, incremental_configs=[
            ConfigEntry("retention.ms", "7200000", incremental_operation=AlterConfigOpType.SET)])
        for future in admin.incremental_alter_configs([change]).values():
            future.result(TIMEOUT)
        return _admin_line(partitions, before, retention())

    out(_guarded("admin", admin_scenario))

    class Member(_Member):
        def run(self) -> None:
            c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"{prefix}g", "client.id": self.name,
                          "auto.offset.reset": "earliest", "enable.auto.commit": False,
                          "session.timeout.ms": 10000, "heartbeat.interval.ms": 300})

            def assigned(consumer: Consumer, partitions: list[TopicPartition]) -> None:
                self.assigned = {p.partition for p in partitions}

            def revoked(consumer: Consumer, partitions: list[TopicPartition]) -> None:
                self.assigned = set()

            c.subscribe([f"{prefix}group"], on_assign=assigned, on_revoke=revoked)
            while not self.stopping.is_set():
                m = c.poll(0.1)
                if m is not None and m.error() is None:
                    self.values.append(m.value().decode())
                    c.commit(message=m, asynchronous=False)
            c.close()

    def produce_to(records: list[tuple[int, str]]) -> None:
        p = Producer({"bootstrap.servers": bootstrap})
        for partition, v in records:
            p.produce(f"{prefix}group", value=v.encode(), partition=partition)
        p.flush(TIMEOUT)

    _group(Member, produce_to, out)

    def transactions() -> str:
        tin, tout = f"{prefix}txin", f"{prefix}txout"
        produce(tin, ["i0", "i1"])
        group = Consumer({"bootstrap.servers": bootstrap, "group.id": f"{prefix}tx",
                          "enable.auto.commit": False})

        def committed() -> str:
            (tp,) = group.committed([TopicPartition(tin, 0)], timeout=TIMEOUT)
            return str(tp.offset) if tp.offset >= 0 else "none"

        p = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"{prefix}tx"})
        p.init_transactions(TIMEOUT)
        p.begin_transaction()
        p.produce(tout, value=b"aborted")
        p.send_offsets_to_transaction([TopicPartition(tin, 0, 1)], group.consumer_group_metadata(), TIMEOUT)
        p.abort_transaction(TIMEOUT)
        after_abort = committed()
        p.begin_transaction()
        for v in (b"o0", b"o1"):
            p.produce(tout, value=v)
        p.send_offsets_to_transaction([TopicPartition(tin, 0, 2)], group.consumer_group_metadata(), TIMEOUT)
        p.commit_transaction(TIMEOUT)
        after_commit = committed()
        group.close()
        return _transactions_line(after_abort, after_commit, [v for _, v in read(tout, 1, 2)])

    out(_guarded("transactions", transactions))

    def authorization(sasl: str, user: str, password: str) -> str:
        conf = {"bootstrap.servers": sasl, "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN",
                "sasl.username": user, "sasl.password": password}
        errors: list[KafkaError] = []
        p = Producer({**conf, "message.timeout.ms": 10000, "retries": 0})
        p.produce(f"{prefix}secure", value=b"x", on_delivery=lambda err, m: errors.append(err))
        p.flush(TIMEOUT)
        denied = bool(errors) and errors[0] is not None \
            and errors[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
        c = Consumer({**conf, "group.id": f"{prefix}sg", "enable.auto.commit": False})
        c.assign([TopicPartition(f"{prefix}secure", 0, OFFSET_BEGINNING)])
        got: list[str] = []
        deadline = time.monotonic() + TIMEOUT
        while not got and time.monotonic() < deadline:
            m = c.poll(0.2)
            if m is not None and m.error() is None:
                got.append(m.value().decode())
        c.close()
        return _auth_line(denied, got)

    _authorization(out, authorization)


def kafka_python(bootstrap: str, prefix: str, out: Callable[[str], None]) -> None:
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition
    from kafka.errors import KafkaError

    c = KafkaConsumer(bootstrap_servers=bootstrap)
    out(f"metadata: {prefix}meta partitions={len(c.partitions_for_topic(f'{prefix}meta') or ())}")
    c.close()

    def read(topic: str, partitions: int, count: int) -> list[tuple[int, str]]:
        c = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                          isolation_level="read_committed")
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        c.assign(tps)
        c.seek_to_beginning(*tps)
        got: list[tuple[int, str]] = []
        deadline = time.monotonic() + TIMEOUT
        while len(got) < count and time.monotonic() < deadline:
            for tp, records in c.poll(200).items():
                got.extend((tp.partition, r.value.decode()) for r in records)
        c.close()
        return got

    for name, acks in ACKS:
        p = KafkaProducer(bootstrap_servers=bootstrap, acks=acks if name != "all" else "all")
        for i in range(3):
            p.send(f"{prefix}acks{name}", value=f"v{i}".encode(), key=f"k{i}".encode())
        p.flush(TIMEOUT)
        p.close()
        out(f"acks={name}: " + " ".join(v for _, v in read(f"{prefix}acks{name}", 1, 3)))
    def produce(topic: str, values: list[str]) -> None:
        p = KafkaProducer(bootstrap_servers=bootstrap)
        for v in values:
            p.send(topic, value=v.encode())
        p.flush(TIMEOUT)
        p.close()

    def read_from(tp: TopicPartition, offset: int, count: int) -> list[str]:
        c = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
        c.assign([tp])
        c.seek(tp, offset)
        got: list[str] = []
        deadline = time.monotonic() + TIMEOUT
        while len(got) < count and time.monotonic() < deadline:
            for records in c.poll(200).values():
                got.extend(r.value.decode() for r in records)
        c.close()
        return got

    latest = TopicPartition(f"{prefix}latest", 0)
    produce(latest.topic, ["old0", "old1"])
    c = KafkaConsumer(bootstrap_servers=bootstrap)
    end = c.end_offsets([latest])[latest]
    c.close()
    produce(latest.topic, ["new0"])
    out("from latest: " + " ".join(read_from(latest, end, 1)))
    bytime = TopicPartition(f"{prefix}bytime", 0)
    produce(bytime.topic, ["before0", "before1"])
    at = int(time.time() * 1000) + 1
    time.sleep(0.01)  # the records after it are stamped later: the next milliseconds
    produce(bytime.topic, ["after0", "after1"])
    c = KafkaConsumer(bootstrap_servers=bootstrap)
    found = c.offsets_for_times({bytime: at})[bytime]
    c.close()
    out("from a time: " + " ".join(read_from(bytime, found.offset if found else -1, 2)))
    for codec in CODECS:
        p = KafkaProducer(bootstrap_servers=bootstrap, compression_type=codec, linger_ms=5)
        for i in range(3):
            p.send(f"{prefix}{codec}", value=f"v{i}".encode() * 50, key=f"k{i}".encode())
        p.flush(TIMEOUT)
        p.close()
        out(f"compression={codec}: " + " ".join(v[:2] for _, v in read(f"{prefix}{codec}", 1, 3)))
    p = KafkaProducer(bootstrap_servers=bootstrap)
    for k, v in KEYED:
        p.send(f"{prefix}keyed", value=v.encode(), key=k.encode())
    p.flush(TIMEOUT)
    p.close()
    out(_keyed_line(read(f"{prefix}keyed", 3, len(KEYED))))
    p = KafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=True)
    for i in range(3):
        p.send(f"{prefix}idem", value=f"v{i}".encode())
    p.flush(TIMEOUT)
    p.close()
    produce(f"{prefix}idem", ["end"])
    out(_idempotence_line([v for _, v in read(f"{prefix}idem", 1, 4)]))
    p = KafkaProducer(bootstrap_servers=bootstrap, max_block_ms=5000)
    try:
        p.send(f"{prefix}missing", value=b"x").get(timeout=TIMEOUT)
        out("unknown topic: stored")
    except KafkaError:
        out("unknown topic: error")
    finally:
        p.close(timeout=5)

    def admin_scenario() -> str:
        from kafka.admin import ConfigResource, ConfigResourceType, KafkaAdminClient, NewTopic

        admin = KafkaAdminClient(bootstrap_servers=bootstrap)
        created = f"{prefix}created"
        admin.create_topics([NewTopic(created, 2, 1, topic_configs={"retention.ms": "3600000"})])
        c = KafkaConsumer(bootstrap_servers=bootstrap)
        partitions = len(c.partitions_for_topic(created) or ())
        c.close()

        def retention() -> str:
            described = admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, created)],
                                               config_filter="all")
            return str(described["topic"][created]["retention.ms"]["value"])

        before = retention()
        admin.alter_configs([ConfigResource(ConfigResourceType.TOPIC, created, {"retention.ms": "7200000"})],
                            incremental=True)
        line = _admin_line(partitions, before, retention())
        admin.close()
        return line

    out(_guarded("admin", admin_scenario))
    from kafka import ConsumerRebalanceListener

    class Member(_Member):
        def run(self) -> None:
            member = self

            class Listener(ConsumerRebalanceListener):  # type: ignore[misc]
                def on_partitions_revoked(self, revoked: object) -> None:
                    member.assigned = set()

                def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
                    member.assigned = {tp.partition for tp in assigned}

            c = KafkaConsumer(bootstrap_servers=bootstrap, group_id=f"{prefix}g", client_id=self.name,
                              auto_offset_reset="earliest", enable_auto_commit=False,
                              session_timeout_ms=10000, heartbeat_interval_ms=300)
            # the topic's partitions known before joining: kafka-python 3.0 (up to 3.0.12 at least) loses a
            # join when its leader rejoins because metadata came after its first assignment and a poll
            # times out before that join ends (the join's assignment is never applied, its heartbeats stay
            # off: the member is stuck); Kafka's brokers hide it by delaying a new group's first round
            # (group.initial.rebalance.delay.ms), by when the client has the metadata
            c.partitions_for_topic(f"{prefix}group")
            c.subscribe([f"{prefix}group"], listener=Listener())
            while not self.stopping.is_set():
                try:
                    # a poll long enough for a rebalance round to end within it (see above): it returns as
                    # soon as records come
                    for records in c.poll(1000).values():
                        self.values.extend(r.value.decode() for r in records)
                        c.commit()
                except KafkaError as exc:  # as an application would: the client reconnects, go on
                    print(f"{self.name}: {exc!r}", file=sys.stderr)
                    self.stopping.wait(0.1)
            c.close()

    def produce_to(records: list[tuple[int, str]]) -> None:
        p = KafkaProducer(bootstrap_servers=bootstrap)
        for partition, v in records:
            p.send(f"{prefix}group", value=v.encode(), partition=partition)
        p.flush(TIMEOUT)
        p.close()

    _group(Member, produce_to, out)
    from kafka.structs import OffsetAndMetadata

    def transactions() -> str:
        tin, tout = f"{prefix}txin", f"{prefix}txout"
        produce(tin, ["i0", "i1"])
        group = KafkaConsumer(bootstrap_servers=bootstrap, group_id=f"{prefix}tx", enable_auto_commit=False)

        def committed() -> str:
            offset = group.committed(TopicPartition(tin, 0))
            return "none" if offset is None or offset < 0 else str(offset)

        p = KafkaProducer(bootstrap_servers=bootstrap, transactional_id=f"{prefix}tx")
        p.init_transactions()
        p.begin_transaction()
        p.send(tout, value=b"aborted")
        p.send_offsets_to_transaction({TopicPartition(tin, 0): OffsetAndMetadata(1, "", -1)}, f"{prefix}tx")
        p.abort_transaction()
        after_abort = committed()
        p.begin_transaction()
        for v in (b"o0", b"o1"):
            p.send(tout, value=v)
        p.send_offsets_to_transaction({TopicPartition(tin, 0): OffsetAndMetadata(2, "", -1)}, f"{prefix}tx")
        p.commit_transaction()
        after_commit = committed()
        group.close()
        p.close()
        return _transactions_line(after_abort, after_commit, [v for _, v in read(tout, 1, 2)])

    out(_guarded("transactions", transactions))

    def kp_authorization(sasl: str, user: str, password: str) -> str:
        from kafka.errors import TopicAuthorizationFailedError

        conf = {"bootstrap_servers": sasl, "security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "PLAIN",
                "sasl_plain_username": user, "sasl_plain_password": password}
        p = KafkaProducer(**conf, retries=0)
        try:
            p.send(f"{prefix}secure", value=b"x").get(timeout=TIMEOUT)
            denied = False
        except TopicAuthorizationFailedError:
            denied = True
        finally:
            p.close(timeout=5)
        c = KafkaConsumer(**conf, enable_auto_commit=False)
        tp = TopicPartition(f"{prefix}secure", 0)
        c.assign([tp])
        c.seek_to_beginning(tp)
        got: list[str] = []
        deadline = time.monotonic() + TIMEOUT
        while not got and time.monotonic() < deadline:
            for records in c.poll(200).values():
                got.extend(r.value.decode() for r in records)
        c.close()
        return _auth_line(denied, got)

    _authorization(out, kp_authorization)


def aiokafka(bootstrap: str, prefix: str, out: Callable[[str], None]) -> None:
    asyncio.run(_aiokafka(bootstrap, prefix, out))


async def _aiokafka(bootstrap: str, prefix: str, out: Callable[[str], None]) -> None:
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)  # its retries of the unknown topic
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
    from aiokafka.errors import KafkaError

    async def partitions_of(topic: str) -> int:
        p = AIOKafkaProducer(bootstrap_servers=bootstrap)
        await p.start()
        try:
            return len(await p.partitions_for(topic))
        finally:
            await p.stop()

    out(f"metadata: {prefix}meta partitions={await partitions_of(f'{prefix}meta')}")

    async def consumer_of(tps: list[TopicPartition]) -> AIOKafkaConsumer:
        c = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
        await c.start()
        c.assign(tps)
        return c

    async def drain(c: AIOKafkaConsumer, count: int) -> list[tuple[int, str]]:
        got: list[tuple[int, str]] = []
        deadline = time.monotonic() + TIMEOUT
        while len(got) < count and time.monotonic() < deadline:
            for tp, records in (await c.getmany(timeout_ms=200)).items():
                got.extend((tp.partition, r.value.decode()) for r in records if r.value is not None)
        await c.stop()
        return got

    async def read(topic: str, partitions: int, count: int) -> list[tuple[int, str]]:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        c = await consumer_of(tps)
        await c.seek_to_beginning(*tps)
        return await drain(c, count)

    async def read_from(tp: TopicPartition, offset: int, count: int) -> list[str]:
        c = await consumer_of([tp])
        c.seek(tp, offset)
        return [v for _, v in await drain(c, count)]

    async def produce(topic: str, values: list[str], **config: object) -> None:
        p = AIOKafkaProducer(bootstrap_servers=bootstrap, **config)
        await p.start()
        try:
            for v in values:
                await p.send_and_wait(topic, value=v.encode())
        finally:
            await p.stop()

    for name, acks in ACKS:
        p = AIOKafkaProducer(bootstrap_servers=bootstrap, acks=acks if name != "all" else "all")
        await p.start()
        for i in range(3):
            await p.send_and_wait(f"{prefix}acks{name}", value=f"v{i}".encode(), key=f"k{i}".encode())
        await p.stop()
        out(f"acks={name}: " + " ".join(v for _, v in await read(f"{prefix}acks{name}", 1, 3)))
    latest = TopicPartition(f"{prefix}latest", 0)
    await produce(latest.topic, ["old0", "old1"])
    c = await consumer_of([latest])
    end = (await c.end_offsets([latest]))[latest]
    await c.stop()
    await produce(latest.topic, ["new0"])
    out("from latest: " + " ".join(await read_from(latest, end, 1)))
    bytime = TopicPartition(f"{prefix}bytime", 0)
    await produce(bytime.topic, ["before0", "before1"])
    at = int(time.time() * 1000) + 1
    await asyncio.sleep(0.01)  # the records after it are stamped later: the next milliseconds
    await produce(bytime.topic, ["after0", "after1"])
    c = await consumer_of([bytime])
    found = (await c.offsets_for_times({bytime: at}))[bytime]
    await c.stop()
    out("from a time: " + " ".join(await read_from(bytime, found.offset if found else -1, 2)))
    for codec in CODECS:
        p = AIOKafkaProducer(bootstrap_servers=bootstrap, compression_type=codec, linger_ms=5)
        await p.start()
        batch = [await p.send(f"{prefix}{codec}", value=f"v{i}".encode() * 50, key=f"k{i}".encode())
                 for i in range(3)]
        await asyncio.gather(*batch)
        await p.stop()
        out(f"compression={codec}: " + " ".join(v[:2] for _, v in await read(f"{prefix}{codec}", 1, 3)))
    p = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await p.start()
    for k, v in KEYED:
        await p.send_and_wait(f"{prefix}keyed", value=v.encode(), key=k.encode())
    await p.stop()
    out(_keyed_line(await read(f"{prefix}keyed", 3, len(KEYED))))

    async def idempotence() -> str:
        p = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=True)
        await p.start()
        try:
            await asyncio.gather(*[await p.send(f"{prefix}idem", value=f"v{i}".encode()) for i in range(3)])
        finally:
            await p.stop()
        await produce(f"{prefix}idem", ["end"])
        return _idempotence_line([v for _, v in await read(f"{prefix}idem", 1, 4)])

    out(await _aguarded("idempotence", idempotence))
    p = AIOKafkaProducer(bootstrap_servers=bootstrap, request_timeout_ms=5000)
    await p.start()
    try:
        await p.send_and_wait(f"{prefix}missing", value=b"x")
        out("unknown topic: stored")
    except KafkaError:
        out("unknown topic: error")
    finally:
        await p.stop()

    async def admin_scenario() -> str:
        from aiokafka.admin import AIOKafkaAdminClient, NewTopic
        from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        created = f"{prefix}created"
        await admin.create_topics([NewTopic(created, 2, 1, topic_configs={"retention.ms": "3600000"})])
        partitions = await partitions_of(created)

        async def retention() -> str:
            (response,) = await admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, created)])
            (resource,) = response.resources  # (error code, message, type, name, config entries)
            return str(next(e[1] for e in resource[-1] if e[0] == "retention.ms"))

        before = await retention()
        change = ConfigResource(ConfigResourceType.TOPIC, created, {"retention.ms": "7200000"})
        await admin.alter_configs([change])
        line = _admin_line(partitions, before, await retention())
        await admin.close()
        return line

    out(await _aguarded("admin", admin_scenario))
    from aiokafka import ConsumerRebalanceListener

    class Member(_Member):
        def run(self) -> None:
            asyncio.run(self.consume())

        async def consume(self) -> None:
            member = self

            class Listener(ConsumerRebalanceListener):  # type: ignore[misc]
                async def on_partitions_revoked(self, revoked: object) -> None:
                    member.assigned = set()

                async def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
                    member.assigned = {tp.partition for tp in assigned}

            c = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=f"{prefix}g", client_id=self.name,
                                 auto_offset_reset="earliest", enable_auto_commit=False,
                                 session_timeout_ms=10000, heartbeat_interval_ms=300)
            c.subscribe([f"{prefix}group"], listener=Listener())
            await c.start()
            while not self.stopping.is_set():
                try:
                    for records in (await c.getmany(timeout_ms=100)).values():
                        self.values.extend(r.value.decode() for r in records if r.value is not None)
                        await c.commit()
                except KafkaError as exc:  # as an application would: the client reconnects, go on
                    print(f"{self.name}: {exc!r}", file=sys.stderr)
                    await asyncio.sleep(0.1)
            await c.stop()

    def produce_to(records: list[tuple[int, str]]) -> None:
        async def send() -> None:
            p = AIOKafkaProducer(bootstrap_servers=bootstrap)
            await p.start()
            for partition, v in records:
                await p.send_and_wait(f"{prefix}group", value=v.encode(), partition=partition)
            await p.stop()

        sender = threading.Thread(target=asyncio.run, args=(send(),))  # this thread runs the scenario's
        sender.start()
        sender.join()

    _group(Member, produce_to, out)

    async def transactions() -> str:
        tin, tout = f"{prefix}txin", f"{prefix}txout"
        await produce(tin, ["i0", "i1"])
        group = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=f"{prefix}tx",
                                 enable_auto_commit=False)
        await group.start()

        async def committed() -> str:
            offset = await group.committed(TopicPartition(tin, 0))
            return "none" if offset is None or offset < 0 else str(offset)

        p = AIOKafkaProducer(bootstrap_servers=bootstrap, transactional_id=f"{prefix}tx")
        await p.start()
        try:
            await p.begin_transaction()
            await p.send(tout, value=b"aborted")
            await p.send_offsets_to_transaction({TopicPartition(tin, 0): 1}, f"{prefix}tx")
            await p.abort_transaction()
            after_abort = await committed()
            await p.begin_transaction()
            for v in (b"o0", b"o1"):
                await p.send(tout, value=v)
            await p.send_offsets_to_transaction({TopicPartition(tin, 0): 2}, f"{prefix}tx")
            await p.commit_transaction()
            after_commit = await committed()
        finally:
            await p.stop()
            await group.stop()
        tp = TopicPartition(tout, 0)
        c = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                             isolation_level="read_committed")
        await c.start()
        c.assign([tp])
        await c.seek_to_beginning(tp)
        return _transactions_line(after_abort, after_commit, [v for _, v in await drain(c, 2)])

    out(await _aguarded("transactions", transactions))
    from aiokafka.errors import TopicAuthorizationFailedError

    async def aio_authorization(sasl: str, user: str, password: str) -> str:
        conf = {"bootstrap_servers": sasl, "security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "PLAIN",
                "sasl_plain_username": user, "sasl_plain_password": password}
        p = AIOKafkaProducer(**conf)
        await p.start()
        try:
            await p.send_and_wait(f"{prefix}secure", value=b"x")
            denied = False
        except TopicAuthorizationFailedError:
            denied = True
        finally:
            await p.stop()
        tp = TopicPartition(f"{prefix}secure", 0)
        c = AIOKafkaConsumer(**conf, enable_auto_commit=False)
        await c.start()
        c.assign([tp])
        await c.seek_to_beginning(tp)
        return _auth_line(denied, [v for _, v in await drain(c, 1)])

    sasl, user, password = SASL
    if not (sasl and user and password):
        out("authorization: not run (no SASL gateway)")
    else:
        out(await _aguarded("authorization", lambda: aio_authorization(sasl, user, password)))


def kcat(bootstrap: str, prefix: str, out: Callable[[str], None]) -> None:
    def run(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["kcat", "-b", bootstrap, "-q", "-m", "3", *args], input=stdin,
                              capture_output=True, text=True, timeout=60)

    listed = run("-L", "-J", "-t", f"{prefix}meta")
    if listed.returncode != 0:
        out("metadata: error")
    else:
        md = json.loads(listed.stdout)
        (topic,) = [t for t in md["topics"] if t["topic"] == f"{prefix}meta"]
        out(f"metadata: {prefix}meta partitions={len(topic['partitions'])}")

    def read(topic: str, count: int) -> list[tuple[int, str]]:
        done = run("-C", "-t", topic, "-o", "beginning", "-c", str(count), "-f", "%p %s\\n",
                   "-X", "fetch.wait.max.ms=100")
        return [(int(p), v) for p, v in (line.split(" ", 1) for line in done.stdout.splitlines() if line)]

    for name, acks in ACKS:
        run("-P", "-t", f"{prefix}acks{name}", "-K", ":", "-X", f"acks={acks}",
            stdin="".join(f"k{i}:v{i}\n" for i in range(3)))
        out(f"acks={name}: " + " ".join(v for _, v in read(f"{prefix}acks{name}", 3)))
    run("-P", "-t", f"{prefix}latest", stdin="old0\nold1\n")
    # offsets from the end (-o -1 would be the last record; a query of the end offset itself is -Q-free here)
    listed = run("-C", "-t", f"{prefix}latest", "-o", "-1", "-c", "1", "-f", "%o\\n")
    end = int(listed.stdout.split()[0]) + 1 if listed.stdout.split() else 0
    run("-P", "-t", f"{prefix}latest", stdin="new0\n")
    got = run("-C", "-t", f"{prefix}latest", "-o", str(end), "-c", "1", "-f", "%s\\n")
    out("from latest: " + " ".join(got.stdout.split()))
    run("-P", "-t", f"{prefix}bytime", stdin="before0\nbefore1\n")
    at = int(time.time() * 1000) + 1
    time.sleep(0.01)  # the records after it are stamped later: the next milliseconds
    run("-P", "-t", f"{prefix}bytime", stdin="after0\nafter1\n")
    got = run("-C", "-t", f"{prefix}bytime", "-o", f"s@{at}", "-c", "2", "-f", "%s\\n")
    out("from a time: " + " ".join(got.stdout.split()))
    for codec in CODECS:
        run("-P", "-t", f"{prefix}{codec}", "-K", ":", "-z", codec,
            stdin="".join(f"k{i}:{f'v{i}' * 50}\n" for i in range(3)))
        out(f"compression={codec}: " + " ".join(v[:2] for _, v in read(f"{prefix}{codec}", 3)))
    run("-P", "-t", f"{prefix}keyed", "-K", ":", "-X", "partitioner=murmur2_random",
        stdin="".join(f"{k}:{v}\n" for k, v in KEYED))
    got = read(f"{prefix}keyed", len(KEYED))
    out(_keyed_line(sorted(got, key=lambda pv: (pv[0], int(pv[1][1:])))))
    # an idempotent producer whose first produce response is lost (tests/conformance/_losing_proxy.py)
    run("-P", "-t", f"{prefix}idem", "-X", "enable.idempotence=true", stdin="v0\nv1\nv2\n")
    run("-P", "-t", f"{prefix}idem", stdin="end\n")
    out(_idempotence_line([v for _, v in read(f"{prefix}idem", 4)]))
    done = run("-P", "-t", f"{prefix}missing", "-X", "message.timeout.ms=5000", "-X",
               "allow.auto.create.topics=false", stdin="x\n")
    out("unknown topic: " + ("error" if done.returncode != 0 else "stored"))
    out("admin: unsupported by the client")
    # kcat's balanced consumer (-G) neither shows its assignment nor commits before it exits
    out("group: unsupported by the client")
    out("transactions: unsupported by the client")

    def kcat_authorization(sasl: str, user: str, password: str) -> str:
        auth = ["-X", "security.protocol=SASL_PLAINTEXT", "-X", "sasl.mechanisms=PLAIN",
                "-X", f"sasl.username={user}", "-X", f"sasl.password={password}"]

        def as_role(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
            # not quiet (-q): a failed delivery is reported on standard error only then
            return subprocess.run(["kcat", "-b", sasl, "-m", "3", *auth, *args], input=stdin,
                                  capture_output=True, text=True, timeout=60)

        produced = as_role("-P", "-t", f"{prefix}secure", "-X", "message.timeout.ms=10000", stdin="x\n")
        denied = produced.returncode != 0 and "authorization" in produced.stderr.lower()
        got = as_role("-C", "-t", f"{prefix}secure", "-o", "beginning", "-c", "1", "-f", "%s\\n")
        return _auth_line(denied, got.stdout.split())

    _authorization(out, kcat_authorization)


CLIENTS: dict[str, Callable[[str, str, Callable[[str], None]], None]] = {
    "confluent": confluent, "kafka-python": kafka_python, "aiokafka": aiokafka, "kcat": kcat}


#: A folder to write each client's library log to (``CLIENT.log``, debug level), when set: for a scenario
#: whose line differs, what the client saw.
LOG_FOLDER = os.environ.get("PGSTREAMS_SCENARIO_LOG")


def main(argv: list[str]) -> int:
    client, bootstrap, prefix = argv
    if LOG_FOLDER:
        logging.basicConfig(filename=os.path.join(LOG_FOLDER, f"{client}.log"), level=logging.DEBUG,
                            format="%(asctime)s %(threadName)s %(name)s %(message)s")
    CLIENTS[client](bootstrap, prefix, lambda line: print(line, flush=True))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
