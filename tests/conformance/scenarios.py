"""The Kafka client scenarios of the conformance tests, for one client against one broker: one line per
scenario on standard output, the same for every client and every broker that behaves as Kafka does.

    python scenarios.py CLIENT BOOTSTRAP PREFIX

``CLIENT``: ``confluent`` (librdkafka), ``kafka-python`` or ``kcat`` (Debian's, driven as a subprocess);
KafkaJS has its own runner (``kafkajs/scenarios.js``). The topics (created beforehand by the test, with
``PREFIX``): ``meta`` and ``keyed`` (3 partitions), ``acks0``, ``acks1``, ``acksall``, ``latest``,
``bytime``, ``gzip``, ``snappy``, ``lz4`` and ``zstd`` (1 partition each). Scenarios: the metadata of a
topic; three records produced with each ``acks`` and read back from the earliest offset; a read from the
latest offset (the high watermark) and one from a time (``ListOffsets`` by timestamp); three records
compressed with each of Kafka's codecs read back; twelve keyed records (Kafka's murmur2 partitioner) read
back per partition; a record produced to a topic that does not exist.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable

ACKS = (("0", 0), ("1", 1), ("all", -1))
CODECS = ("gzip", "snappy", "lz4", "zstd")
KEYED = [(f"k{i % 6}", f"v{i}") for i in range(12)]
TIMEOUT = 30.0


def _keyed_line(got: list[tuple[int, str]]) -> str:
    parts: dict[int, list[str]] = {}
    for p, v in got:
        parts.setdefault(p, []).append(v)
    return "keyed: " + " ".join(f"p{p}=" + ",".join(parts[p]) for p in sorted(parts))


def confluent(bootstrap: str, prefix: str, out: Callable[[str], None]) -> None:
    from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition
    from confluent_kafka.admin import AdminClient

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
    errors: list[object] = []
    p = Producer({"bootstrap.servers": bootstrap, "message.timeout.ms": 5000,
                  "allow.auto.create.topics": False})
    p.produce(f"{prefix}missing", value=b"x", on_delivery=lambda err, m: errors.append(err))
    p.flush(TIMEOUT)
    failed = bool(errors) and errors[0] is not None
    out("unknown topic: " + ("error" if failed else "stored"))
    del KafkaError


def kafka_python(bootstrap: str, prefix: str, out: Callable[[str], None]) -> None:
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition
    from kafka.errors import KafkaError

    c = KafkaConsumer(bootstrap_servers=bootstrap)
    out(f"metadata: {prefix}meta partitions={len(c.partitions_for_topic(f'{prefix}meta') or ())}")
    c.close()

    def read(topic: str, partitions: int, count: int) -> list[tuple[int, str]]:
        c = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
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
    p = KafkaProducer(bootstrap_servers=bootstrap, max_block_ms=5000)
    try:
        p.send(f"{prefix}missing", value=b"x").get(timeout=TIMEOUT)
        out("unknown topic: stored")
    except KafkaError:
        out("unknown topic: error")
    finally:
        p.close(timeout=5)


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
    done = run("-P", "-t", f"{prefix}missing", "-X", "message.timeout.ms=5000", "-X",
               "allow.auto.create.topics=false", stdin="x\n")
    out("unknown topic: " + ("error" if done.returncode != 0 else "stored"))


CLIENTS: dict[str, Callable[[str, str, Callable[[str], None]], None]] = {
    "confluent": confluent, "kafka-python": kafka_python, "kcat": kcat}


def main(argv: list[str]) -> int:
    client, bootstrap, prefix = argv
    CLIENTS[client](bootstrap, prefix, lambda line: print(line, flush=True))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
