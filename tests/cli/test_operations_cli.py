"""The operations commands through real subprocesses: topics alter, groups reset|delete, dlt replay,
maintain, retention; bad input exits 2 and changes nothing."""

from __future__ import annotations

import json

from test_cli import cli, ok

import pgstreams


def test_topics_config_alter_and_describe(dsn: str) -> None:
    ok(
        dsn,
        "topics",
        "create",
        "t",
        "-p",
        "2",
        "--config",
        "retention.ms=60000",
        "--config",
        "segment.events=2000",
    )
    desc = json.loads(ok(dsn, "topics", "describe", "t", "--json"))
    entries = {e["name"]: e for e in desc["config_entries"]}
    assert entries["retention.ms"]["value"] == 60000 and not entries["retention.ms"]["is_default"]
    assert entries["retention.bytes"]["is_default"] and entries["segment.events"]["value"] == 2000
    ok(
        dsn,
        "topics",
        "alter",
        "t",
        "--config",
        "max.message.bytes=500",
        "--delete-config",
        "retention.ms",
        "--partitions",
        "3",
    )
    with pgstreams.connect(dsn) as client:
        d = client.describe_topic("t")
    assert d.topic.partitions == 3 and d.topic.config == {"max.message.bytes": 500}
    assert "default" in ok(dsn, "topics", "describe", "t")


def test_bad_input_exits_2_and_changes_nothing(dsn: str) -> None:
    ok(dsn, "topics", "create", "t", "--config", "retention.ms=1000")
    for args in (
        ("topics", "alter", "t", "--config", "retention.ms=soon"),
        ("topics", "alter", "t", "--config", "nokey=1"),
        ("topics", "alter", "t", "--config", "cleanup.policy=compact"),
        ("topics", "alter", "t", "--partitions", "0"),
        ("topics", "alter", "t", "--delete-config", "bogus"),
        ("topics", "create", "u", "--config", "max.message.bytes=-3"),
        ("groups", "reset", "g", "--topic", "t"),
        ("groups", "reset", "g", "--topic", "t", "--to-earliest", "--to-latest"),
        ("groups", "reset", "g", "--topic", "t", "--to-datetime", "yesterday"),
        ("maintain", "--schedule", "--every", "often"),
    ):
        p = cli(dsn, *args)
        assert p.returncode == 2, (args, p.stdout, p.stderr)
        assert "Traceback" not in p.stderr and p.stderr.startswith("error:")
    with pgstreams.connect(dsn) as client:
        assert [t.name for t in client.list_topics()] == ["t"]
        assert client.describe_topic("t").topic.config == {"retention.ms": 1000}


def test_groups_reset_delete_and_dlt_replay(dsn: str) -> None:
    with pgstreams.connect(dsn) as client:
        client.create_topic("t", 1)
        client.create_topic("t.dlt", 1)
        for i in range(4):
            client.publish("t", i)
        client.publish("t.dlt", "again", key="k", headers={"dlt.topic": "t", "dlt.error_type": "ValueError"})
        c = client.consumer("t", "g")
        c.commit(c.poll(10, timeout=1))
    dry = json.loads(ok(dsn, "groups", "reset", "g", "--topic", "t", "--to-earliest", "--dry-run", "--json"))
    assert dry["dry_run"] and dry["partitions"][0]["checkpoint"] == 0
    assert json.loads(ok(dsn, "groups", "describe", "g", "--json"))[0]["checkpoint"] == 4
    ok(dsn, "groups", "reset", "g", "--topic", "t", "--shift-by", "-2")
    assert json.loads(ok(dsn, "groups", "describe", "g", "--json"))[0]["checkpoint"] == 2
    assert "would replay 1" in ok(dsn, "dlt", "replay", "t.dlt", "--dry-run")
    assert "replayed 1" in ok(dsn, "dlt", "replay", "t.dlt", "--where-error-type", "ValueError")
    assert "replayed 0" in ok(dsn, "dlt", "replay", "t.dlt")
    ok(dsn, "groups", "delete", "g")
    p = cli(dsn, "groups", "describe", "g")
    assert p.returncode == 1 and "Traceback" not in p.stderr
    out = json.loads(ok(dsn, "maintain", "--json"))
    assert out["skipped"] is False
    assert [r["topic"] for r in json.loads(ok(dsn, "retention", "--json"))] == ["t", "t.dlt"]
