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
