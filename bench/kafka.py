"""The Kafka gateway's benchmark: a librdkafka producer and consumer group through the gateway against
pgstreams' own ``publish_many`` and ``poll_batch`` on the same events, and produce-to-consume latency.

    python -m bench.kafka [--dsn DSN] [--events 100000] [--rounds 3] [--rate 2000] [--duration 10]
                          [--markdown]

* **produce**: ``--events`` events of 100 bytes with keys (1,000 distinct) to a 4-partition topic: by a
  confluent-kafka producer (librdkafka; ``acks=all``, ``linger.ms=5``, lz4) through the gateway, and by
  ``Client.publish_many`` in batches of 1,000; beside them the raw PostgreSQL limit, a COPY of the same
  rows into a plain table. Floor: the gateway at least 0.5 x ``publish_many``.
* **consume**: the same backlog drained by a confluent-kafka consumer in a group (``subscribe``) through the
  gateway, and by a pgstreams ``Consumer`` with ``poll_batch(1000)``. Floor: at least 0.5 x ``poll_batch``.
* **latency**: a producer (``acks=all``; ``linger.ms=5``, librdkafka's default, then ``linger.ms=0``) sends
  stamped events at ``--rate`` events/s for a second of warm-up (connections, metadata, the group's first
  offsets) and then ``--duration`` s; a consumer in a group receives them: p50 and p99 of send-to-receive
  of the events after the warm-up. Floor: p99 at most 10 ms.

The gateway runs as ``pgstreams kafka serve``, in a process of its own as it is deployed. Rounds alternate
the ways; each figure is the best round. It creates its own database on the server
(``--dsn``, else ``$PGSTREAMS_DSN``, else the embedded server; this machine only) and drops it at the end.
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
from confluent_kafka import Consumer, Producer

import pgstreams

from ._common import (
    Measurement,
    machine,
    make_console,
    markdown,
    percentile,
    print_results,
    scratch_database,
    server_dsn,
)

PARTITIONS = 4
VALUE = b"v" * 100


@contextmanager
def gateway(dsn: str) -> Iterator[str]:
    """``pgstreams kafka serve`` over ``dsn`` in a process of its own (as it is deployed), on a free
    loopback port; its bootstrap address. Stopped with SIGTERM afterwards."""
    command = [sys.executable, "-m", "pgstreams.cli", "kafka", "serve", "--listen", "127.0.0.1:0",
               "--dsn", dsn]
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()  # "serving the Kafka protocol at HOST:PORT"
        if "serving the Kafka protocol at" not in line:
            raise RuntimeError(f"the gateway did not start: {line}{proc.stderr.read()}")
        yield line.rsplit(" ", 1)[1].strip()
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(30)


def publish_many(client: pgstreams.Client, topic: str, events: int) -> float:
    start = time.perf_counter()
    for i in range(0, events, 1000):
        batch = [{"value": VALUE, "key": f"k{j % 1000}"} for j in range(i, min(events, i + 1000))]
        client.publish_many(topic, batch)
    return events / (time.perf_counter() - start)


def raw_copy(dsn: str, events: int) -> float:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS raw_events (partition int, key text, value bytea)")
        start = time.perf_counter()
        for i in range(0, events, 1000):
            with conn.transaction(), conn.cursor().copy("COPY raw_events FROM STDIN") as cp:
                for j in range(i, min(events, i + 1000)):
                    cp.write_row((j % PARTITIONS, f"k{j % 1000}", VALUE))
        return events / (time.perf_counter() - start)


def kafka_produce(bootstrap: str, topic: str, events: int) -> float:
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5,
                         "compression.type": "lz4", "partitioner": "murmur2_random"})
    start = time.perf_counter()
    for i in range(events):
        while True:
            try:
                producer.produce(topic, value=VALUE, key=f"k{i % 1000}")
                break
            except BufferError:
                producer.poll(0.01)
        producer.poll(0)
    if producer.flush(300):
        raise RuntimeError("the producer did not deliver every record")
    return events / (time.perf_counter() - start)


def poll_batch(client: pgstreams.Client, topic: str, group: str, events: int) -> float:
    consumer = client.consumer(topic, group)
    start = time.perf_counter()
    got = 0
    while got < events:
        batch = consumer.poll_batch(1000, timeout=5)
        got += len(batch)
        consumer.commit()
    return events / (time.perf_counter() - start)


def kafka_consume(bootstrap: str, topic: str, group: str, events: int) -> float:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest"})
    consumer.subscribe([topic])
    got, start = 0, None
    deadline = time.monotonic() + 300
    while got < events and time.monotonic() < deadline:
        for m in consumer.consume(1000, 1.0):
            if m.error() is None:
                start = start or time.perf_counter()
                got += 1
    consumer.close()
    if got < events or start is None:
        raise RuntimeError(f"the consumer read {got} of {events} events")
    return events / (time.perf_counter() - start)


#: Seconds of a latency run before its measured part: the clients connect, fetch metadata and offsets
#: and settle (their first records wait for that, as with any broker).
WARM_UP = 1.0


def latency(bootstrap: str, topic: str, rate: float, duration: float, linger_ms: float
            ) -> tuple[float, float, int]:
    """p50 and p99 (ms) of send-to-receive of records sent at ``rate`` per second for ``duration``
    seconds after :data:`WARM_UP` (a producer with ``linger.ms`` ``linger_ms``, ``acks=all``; a consumer in
    a group), and how many records were measured."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"latency-{topic}",
                         "auto.offset.reset": "earliest", "fetch.wait.max.ms": 500})
    assigned = threading.Event()
    consumer.subscribe([topic], on_assign=lambda c, ps: assigned.set())
    while not assigned.is_set():
        consumer.poll(0.1)
    delays: list[float] = []
    done = threading.Event()

    def receive() -> None:
        while not done.is_set():
            m = consumer.poll(0.05)
            value = None if m is None or m.error() is not None else m.value()
            if value is not None:
                sent_at, _, measured = value.partition(b" ")
                if measured == b"1":
                    delays.append(time.time() - float(sent_at))

    thread = threading.Thread(target=receive)
    thread.start()
    try:
        producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": linger_ms, "acks": "all"})
        start = time.monotonic()
        sent = measured = 0
        while time.monotonic() - start < WARM_UP + duration:
            ahead = start + sent / rate - time.monotonic()
            if ahead > 0:
                time.sleep(ahead)
            counted = time.monotonic() - start >= WARM_UP
            producer.produce(topic, value=b"%r %d" % (time.time(), counted), key=f"k{sent % 1000}")
            producer.poll(0)
            sent += 1
            measured += counted
        producer.flush(60)
        deadline = time.monotonic() + 30
        while len(delays) < measured and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        done.set()
        thread.join()
        consumer.close()
    ms = [d * 1000 for d in delays]
    return percentile(ms, 50), percentile(ms, 99), len(ms)


def run(dsn: str, events: int, rounds: int, rate: float, duration: float) -> list[Measurement]:
    best: dict[str, float] = {}
    with scratch_database(dsn, "pgstreams_bench_kafka") as db, pgstreams.connect(db) as client, \
            gateway(db) as bootstrap:
        for r in range(rounds):
            for name in ("publish_many", "kafka_produce", "raw_copy"):
                topic = f"{name}_{r}"
                client.create_topic(topic, partitions=PARTITIONS)
                if name == "publish_many":
                    rate_ = publish_many(client, topic, events)
                elif name == "kafka_produce":
                    rate_ = kafka_produce(bootstrap, topic, events)
                else:
                    rate_ = raw_copy(db, events)
                best[name] = max(best.get(name, 0.0), rate_)
            best["poll_batch"] = max(best.get("poll_batch", 0.0),
                                     poll_batch(client, f"publish_many_{r}", f"native_{r}", events))
            best["kafka_consume"] = max(best.get("kafka_consume", 0.0),
                                        kafka_consume(bootstrap, f"publish_many_{r}", f"kafka_{r}", events))
        lat = {}
        for linger in (5.0, 0.0):
            topic = f"latency_{int(linger)}"
            client.create_topic(topic, partitions=PARTITIONS)
            lat[linger] = latency(bootstrap, topic, rate, duration, linger)
    produce_ratio = best["kafka_produce"] / best["publish_many"]
    consume_ratio = best["kafka_consume"] / best["poll_batch"]
    return [
        Measurement("publish_many (batches of 1,000)", best["publish_many"], "events/s", best["raw_copy"],
                    "COPY into a plain table"),
        Measurement("produce through the gateway (librdkafka, acks=all, lz4)", best["kafka_produce"],
                    "events/s", best["publish_many"], "publish_many", ">= 0.5 x publish_many",
                    produce_ratio >= 0.5),
        Measurement("consume through the gateway (librdkafka group)", best["kafka_consume"], "events/s",
                    best["poll_batch"], "poll_batch(1000)", ">= 0.5 x poll_batch", consume_ratio >= 0.5),
        *(m for linger, (p50, p99, _n) in lat.items() for m in (
            Measurement(f"produce-to-consume p50 at {rate:,.0f} events/s, linger.ms={linger:g}", p50, "ms",
                        higher_is_better=False),
            Measurement(f"produce-to-consume p99 at {rate:,.0f} events/s, linger.ms={linger:g}", p99, "ms",
                        floor="<= 10 ms", ok=p99 <= 10, higher_is_better=False))),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.kafka", description=__doc__.split("\n")[0])
    parser.add_argument("--dsn")
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rate", type=float, default=2000.0)
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args(argv)
    dsn = server_dsn(args.dsn)
    console = make_console()
    console.print(machine(dsn))
    rows = run(dsn, args.events, args.rounds, args.rate, args.duration)
    print_results("The Kafka gateway", rows, console)
    if args.markdown:
        print(markdown(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
