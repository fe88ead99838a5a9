"""``pgstreams kafka serve`` stopped with SIGTERM while requests are in flight: it stops listening, answers
the requests it had read (a produce that waits on a lock is completed and stored once, a metadata request
read behind it is answered), then closes the connection and exits 0."""

from __future__ import annotations

import signal
import socket
import struct
from datetime import timedelta

import psycopg
from kio.schema.metadata.v1.request import MetadataRequest
from kio.schema.produce.v3.request import PartitionProduceData, ProduceRequest, TopicProduceData
from kio.schema.produce.v3.response import ProduceResponse
from kio.serial import entity_reader
from kio.static.primitive import i16, i32, i32Timedelta
from test_kafka_pipelining import _batch

import pgstreams
from _core_helpers import wait_until
from _gateway_helpers import read_frame, request_frame, serve_process


def _frame(key: int, version: int, correlation: int, request: object) -> bytes:
    return request_frame(key, version, correlation, request, "shutdown")


def _refused(host: str, port: int) -> bool:
    try:
        socket.create_connection((host, port), timeout=1).close()
    except OSError:
        return True
    return False


def test_sigterm_answers_the_requests_in_flight_and_exits_0(client: pgstreams.Client, dsn: str) -> None:
    client.create_topic("t", partitions=1)
    tid = client.topic_record("t").id
    dbname = psycopg.conninfo.conninfo_to_dict(dsn)["dbname"]
    with serve_process(dsn) as (proc, bootstrap):
        host, port = bootstrap.rsplit(":", 1)[0], int(bootstrap.rsplit(":", 1)[1])
        with psycopg.connect(dsn) as locker, socket.create_connection((host, port), timeout=60) as sock:
            # the topic's table locked: the produce waits in the database
            locker.execute(f"LOCK TABLE pgstreams.topic_{tid} IN ACCESS EXCLUSIVE MODE")
            produce = ProduceRequest(transactional_id=None, acks=i16(-1),
                                     timeout=i32Timedelta.parse(timedelta(seconds=30)),
                                     topic_data=(TopicProduceData(name="t", partition_data=(
                                         PartitionProduceData(index=i32(0), records=_batch([b"late"])),)),))
            metadata = MetadataRequest(topics=None)
            sock.sendall(_frame(0, 3, 1, produce) + _frame(3, 1, 2, metadata))
            with psycopg.connect(dsn, autocommit=True) as watch:
                def produce_waits() -> bool:
                    return bool(watch.execute(
                        "SELECT count(*) FROM pg_stat_activity WHERE datname = %s"
                        " AND wait_event_type = 'Lock'", (dbname,)).fetchone()[0])  # type: ignore[index]

                wait_until(produce_waits, 60, "the produce to wait for the lock")
                proc.send_signal(signal.SIGTERM)
                wait_until(lambda: _refused(host, port), 60, "the gateway to stop listening")
                assert proc.poll() is None  # still answering what it read
            locker.rollback()  # the lock goes: the produce completes
            first = read_frame(sock)
            assert struct.unpack_from(">i", first)[0] == 1
            reply = entity_reader(ProduceResponse)(memoryview(first), 4)[0]
            part = reply.responses[0].partition_responses[0]
            assert part.error_code == 0 and part.base_offset >= 0
            second = read_frame(sock)
            assert struct.unpack_from(">i", second)[0] == 2  # the metadata request read behind it
            assert read_frame(sock) == b""  # then the connection is closed
        assert proc.wait(60) == 0
    assert [e.value for e in client.consumer("t", "check").poll(timeout=5)] == [b"late"]


def test_a_connection_accepted_as_the_gateway_closes_does_not_hold_its_close(dsn: str) -> None:
    """A connection whose task started but whose request reader had not run yet when the gateway closed:
    the close ends it at once (it used to wait for a request that never came, for the whole drain time,
    while the clients found no gateway: their members' sessions ran out)."""
    import asyncio
    import time

    import pgstreams.aio
    from pgstreams.kafka.server import DRAIN_TIMEOUT, Gateway

    async def main() -> float:
        async with await pgstreams.aio.connect(dsn) as client:
            gateway = Gateway(client, listen="127.0.0.1:0")
            await gateway.start()
            _reader, writer = await asyncio.open_connection(*gateway.address)
            deadline = time.monotonic() + 30
            # one loop step at a time until the connection's task has started: its reader is created then
            # and runs at the next step, so closing now cancels the reader before it ever ran
            while gateway.stats.open_connections == 0:
                assert time.monotonic() < deadline, "the gateway did not accept the connection"
                await asyncio.sleep(0)
            started = time.monotonic()
            await gateway.close()
            took = time.monotonic() - started
            writer.close()
            return took

    took = asyncio.run(main())
    assert took < DRAIN_TIMEOUT / 3, f"the gateway's close took {took:.1f} s"
