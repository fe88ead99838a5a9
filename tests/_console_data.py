"""The data the console tests look at: a topic with JSON, text and bytes events, a group behind on it,
a dead-letter topic filled by a real worker, a share group with events in flight, available and
dead-lettered, and a queue."""

from __future__ import annotations

import pgstreams
from _core_helpers import running, until


def fail_on_boom(event: pgstreams.Event) -> None:
    if event.value == {"boom": True}:
        raise ValueError("boom is not allowed")


def fill(dsn: str) -> dict[str, int]:
    """Create the data; return where the dead letters are (position of each by its value's index)."""
    with pgstreams.connect(dsn) as client:
        client.create_topic("orders", 2)
        client.publish("orders", {"id": 1, "items": ["a", "b"]}, key="customer-1", partition=0,
                       event_type="OrderPlaced", headers={"source": "web"}, event_id="order-1",
                       correlation_id="corr-1")
        client.publish("orders", "plain text", partition=0)
        client.publish("orders", b"\x00\xffraw", partition=0)
        client.publish_many("orders", [{"value": {"n": i}, "partition": 1} for i in range(5)])
        consumer = client.consumer("orders", "billing")
        assert consumer.poll(max_events=1, timeout=5)
        consumer.commit()
        client.create_topic("payments", 1)
        client.publish_many("payments", [{"value": {"boom": True}}, {"value": {"ok": 1}},
                                         {"value": {"boom": True}}])
        worker = pgstreams.Worker(client, install_signal_handlers=False, maintenance=None)
        worker.subscribe("payments", "payer", fail_on_boom, retry=pgstreams.RetryPolicy(max_attempts=1))
        with running(worker):
            until(lambda: worker.stats.dead_lettered == 2, 60, "two dead letters")
        letters = client.read_events("payments.dlt", 0, limit=10)
        assert len(letters) == 2
        # share group crew on jobs: 2 events in flight (locked for an hour), 1 rejected (dead-lettered to
        # jobs.dlt), 3 available
        client.create_topic("jobs", 2)
        client.publish_many("jobs", [{"value": {"job": i}, "partition": i % 2} for i in range(6)])
        crew = client.share_consumer("jobs", "crew", lock_timeout=3600, max_deliveries=3)
        taken = crew.acquire(3)
        assert len(taken) == 3
        assert crew.reject(taken[0], "not a job we do").ok
        client.create_queue("mail")
        client.publish_many("mail", [{"value": "hello"}, {"value": "again"}])
        return {"first": letters[0].position, "second": letters[1].position}
