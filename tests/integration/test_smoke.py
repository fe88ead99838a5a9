from __future__ import annotations

import pytest

import pgstreams


def test_publish_then_consume_roundtrip(client: pgstreams.Client) -> None:
    client.create_topic("orders", partitions=2)
    client.publish("orders", {"id": 1}, key="a")
    client.publish("orders", b"\x00\x01", key="b")
    client.publish("orders", "text", key="a")
    got = client.consumer("orders", "g").poll(10, timeout=2)
    assert sorted((type(e.value).__name__) for e in got) == ["bytes", "dict", "str"]
    by_key = [e.value for e in got if e.key == "a"]
    assert by_key == [{"id": 1}, "text"]


def test_public_signatures_are_those_documented() -> None:
    """The core API's names, parameters, defaults and keyword-only markers, as specified."""
    import dataclasses
    import inspect

    from pgstreams import Client, Consumer, ConsumerTransaction

    def shape(fn: object) -> str:
        parts, star = [], False
        for p in inspect.signature(fn).parameters.values():  # type: ignore[arg-type]
            if p.kind is p.KEYWORD_ONLY and not star:
                parts.append("*")
                star = True
            parts.append(p.name + ("" if p.default is p.empty else f"={p.default!r}"))
        return "(" + ", ".join(parts) + ")"

    assert shape(pgstreams.connect).startswith("(dsn=None, *, schema='pgstreams', migrate=True")
    assert shape(Client.create_topic).startswith("(self, name, partitions=1")
    assert shape(Client.list_topics) == "(self)"
    assert shape(Client.describe_topic) == "(self, name)"
    assert shape(Client.delete_topic) == "(self, name)"
    assert shape(Client.publish) == (
        "(self, topic, value, *, key=None, headers=None, partition=None, event_type=None, event_id=None,"
        " correlation_id=None, causation_id=None, conn=None, notify=True, delay=None)")
    assert shape(Client.publish_many) == "(self, topic, events)"
    assert shape(Client.consumer) == "(self, topic, group, *, start='earliest')"
    assert shape(Consumer.poll) == shape(ConsumerTransaction.poll) == "(self, max_events=500, timeout=1.0)"
    assert shape(Consumer.commit) == "(self, events=None, *, durable=True)"
    assert shape(Consumer.seek) == "(self, partition, position)"
    assert shape(Consumer.seek_to_beginning) == shape(Consumer.seek_to_end) == shape(Consumer.transaction)
    assert shape(Consumer.seek_to_time) == "(self, dt)"
    # share groups and queues
    assert shape(Client.share_consumer) == (
        "(self, topic, group, *, start='earliest', lock_timeout=30.0, max_deliveries=5, dead_letter=True,"
        " ordering=None)")
    assert shape(pgstreams.ShareConsumer.poll) == shape(pgstreams.ShareTransaction.poll) == (
        "(self, max_events=500, timeout=1.0)")
    assert shape(pgstreams.ShareConsumer.ack).startswith("(self, events")
    assert shape(pgstreams.ShareConsumer.release).startswith("(self, events, delay=0.0")
    assert shape(pgstreams.ShareConsumer.reject).startswith("(self, events, reason=None")
    assert shape(pgstreams.ShareConsumer.renew) == "(self, events)"
    assert shape(pgstreams.ShareConsumer.transaction) == "(self)"
    assert shape(Client.create_queue).startswith("(self, name")
    assert shape(Client.queue) == "(self, name)"
    assert "delivery_count" in {f.name for f in dataclasses.fields(pgstreams.Event)}
    assert shape(pgstreams.Worker.subscribe).endswith("share=False, concurrency=1, lock_timeout=None)")
    assert {f.name for f in dataclasses.fields(pgstreams.Event)} >= {
        "topic", "partition", "position", "key", "value", "headers", "event_type", "event_id",
        "correlation_id", "causation_id", "created_at"}
    assert pgstreams.Event.__dataclass_params__.frozen  # type: ignore[attr-defined]
    assert {f.name for f in dataclasses.fields(pgstreams.PublishResult)} >= {"topic", "partition", "position"}
    assert {"STORED", "IGNORED", "FURTHER", "OLDER"} <= set(pgstreams.CommitOutcome.__members__)
    assert issubclass(pgstreams.InvalidName, ValueError) and issubclass(pgstreams.TopicNotFound, LookupError)
    with pytest.raises(TypeError):
        pgstreams.connect(None, "other_schema")  # type: ignore[call-arg]  # keyword-only
