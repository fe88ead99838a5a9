"""Kafka's administration APIs through the gateway (confluent-kafka's AdminClient): topics created,
configured, grown and deleted are pgstreams topics, and groups are listed and described with their
members."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource as AioConfigResource
from aiokafka.admin.config_resource import ConfigResourceType as AioResourceType
from confluent_kafka import Consumer, KafkaException
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewPartitions,
    NewTopic,
)
from kafka.admin import ConfigResource as KafkaPythonConfigResource
from kafka.admin import ConfigResourceType, KafkaAdminClient

import pgstreams
from _core_helpers import until
from _gateway_helpers import running_gateway


@pytest.fixture
def admin(client: pgstreams.Client, dsn: str) -> Iterator[AdminClient]:
    with running_gateway(dsn) as address:
        yield AdminClient({"bootstrap.servers": address})


def _error(future: object) -> str:
    with pytest.raises(KafkaException) as caught:
        future.result(30)  # type: ignore[attr-defined]
    return caught.value.args[0].name()


def test_topics_created_configured_grown_and_deleted_through_kafka_are_pgstreams_topics(
        client: pgstreams.Client, admin: AdminClient) -> None:
    done = admin.create_topics([NewTopic("orders", 3, config={"retention.ms": "60000"}),
                                NewTopic("audit", 1)])
    assert [f.result(30) for f in done.values()] == [None, None]
    orders = client.describe_topic("orders")
    assert orders.topic.partitions == 3 and orders.config["retention.ms"] == 60000
    # refusals: an existing topic, a bad name, a replication factor PostgreSQL does not have, a bad key
    assert _error(admin.create_topics([NewTopic("orders", 3)])["orders"]) == "TOPIC_ALREADY_EXISTS"
    assert _error(admin.create_topics([NewTopic("bad name", 1)])["bad name"]) == "TOPIC_EXCEPTION"
    assert _error(admin.create_topics([NewTopic("r3", 1, replication_factor=3)])["r3"]) == \
        "INVALID_REPLICATION_FACTOR"
    assert _error(admin.create_topics([NewTopic("k", 1, config={"no.such.key": "1"})])["k"]) == \
        "INVALID_CONFIG"
    assert {t.name for t in client.list_topics()} == {"orders", "audit"}
    # configuration: described with defaults marked, changed and reset key by key
    resource = ConfigResource("topic", "orders")
    (described,) = admin.describe_configs([resource]).values()
    configs = described.result(30)
    assert configs["retention.ms"].value == "60000" and not configs["retention.ms"].is_default
    assert configs["max.message.bytes"].is_default
    change = ConfigResource("topic", "orders", incremental_configs=[
        ConfigEntry("retention.ms", None, incremental_operation=AlterConfigOpType.DELETE),
        ConfigEntry("max.message.bytes", "2000000", incremental_operation=AlterConfigOpType.SET)])
    assert [f.result(30) for f in admin.incremental_alter_configs([change]).values()] == [None]
    after = client.describe_topic("orders")
    assert after.config["retention.ms"] == -1 and after.config["max.message.bytes"] == 2000000
    # partitions only grow
    assert [f.result(30) for f in admin.create_partitions([NewPartitions("orders", 5)]).values()] == [None]
    assert client.describe_topic("orders").topic.partitions == 5
    assert _error(admin.create_partitions([NewPartitions("orders", 2)])["orders"]) == "INVALID_PARTITIONS"
    assert [f.result(30) for f in admin.delete_topics(["audit"]).values()] == [None]
    assert {t.name for t in client.list_topics()} == {"orders"}


def test_groups_are_listed_and_described_with_their_members(client: pgstreams.Client, dsn: str) -> None:
    client.create_topic("t", partitions=2)
    client.publish("t", "x")
    with running_gateway(dsn) as address:
        admin = AdminClient({"bootstrap.servers": address})
        consumer = Consumer({"bootstrap.servers": address, "group.id": "kafka-group", "client.id": "one",
                             "auto.offset.reset": "earliest"})
        assigned: list[int] = []
        consumer.subscribe(["t"], on_assign=lambda c, ps: assigned.extend(p.partition for p in ps))

        def joined() -> bool:
            consumer.poll(0.1)  # the group protocol runs in poll()
            return len(assigned) == 2

        try:
            until(joined, 60, "the member's assignment")
            listed = {g.group_id: g for g in admin.list_consumer_groups().result(30).valid}
            assert "kafka-group" in listed
            (described,) = admin.describe_consumer_groups(["kafka-group"]).values()
            group = described.result(30)
            assert group.state.name == "STABLE" and len(group.members) == 1
            member = group.members[0]
            assert member.client_id == "one"
            assert {tp.partition for tp in member.assignment.topic_partitions} == {0, 1}
        finally:
            consumer.close()


def test_alter_configs_replaces_the_whole_configuration_and_validate_only_changes_nothing(
        client: pgstreams.Client, dsn: str) -> None:
    """``AlterConfigs`` (aiokafka's and KafkaJS's only way to change a configuration): the keys given are
    set, every other key set on the topic goes back to its default; a bad key or ``validate_only`` leaves
    the topic as it was."""
    client.create_topic("orders", 2, config={"retention.ms": 60000, "max.message.bytes": 2000000})

    async def alter(configs: dict[str, str]) -> int:
        admin = AIOKafkaAdminClient(bootstrap_servers=address)
        await admin.start()
        try:
            resource = AioConfigResource(AioResourceType.TOPIC, "orders", configs)
            (response,) = await admin.alter_configs([resource])
            ((error, _message, _type, _name),) = response.resources
            return int(error)
        finally:
            await admin.close()

    with running_gateway(dsn) as address:
        checker = KafkaAdminClient(bootstrap_servers=address)
        try:  # kafka-python's AlterConfigs with validate_only
            checker.alter_configs([KafkaPythonConfigResource(ConfigResourceType.TOPIC, "orders",
                                                             {"retention.ms": "120000"})],
                                  validate_only=True, incremental=False)
        finally:
            checker.close()
        assert client.describe_topic("orders").config["retention.ms"] == 60000
        assert asyncio.run(alter({"no.such.key": "1"})) == 40  # INVALID_CONFIG
        assert client.describe_topic("orders").config["max.message.bytes"] == 2000000
        assert asyncio.run(alter({"retention.ms": "120000"})) == 0
    config = client.describe_topic("orders").config
    assert config["retention.ms"] == 120000
    assert config["max.message.bytes"] == 1048588  # back to its default: it was not given
