"""The operations commands through real subprocesses: topics alter, groups reset|delete, dlt replay,
maintain, retention; bad input exits 2 and changes nothing."""

from __future__ import annotations

import json
from datetime import timezone
from typing import Any

import psycopg
from test_cli import cli, ok

import pgstreams
from _core_helpers import take, until


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
        ("topics", "alter", "t", "--config", "cleanup.policy=compacted"),
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


# -- groups reset / delete and dlt replay: every option, its effect on the database -------------------
def _checkpoints(dsn: str, group: str, topic: str) -> dict[int, int]:
    """The stored checkpoints of ``group`` on ``topic``, read from the table."""
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT k.partition, k.position FROM pgstreams.checkpoints k"
            " JOIN pgstreams.topics t ON t.id = k.topic_id WHERE k.group_name = %s AND t.name = %s",
            (group, topic),
        ).fetchall()
    return {int(p): int(pos) for p, pos in rows}


def _positions(dsn: str, topic: str) -> dict[int, list[int]]:
    with pgstreams.connect(dsn) as client:
        parts = client.describe_topic(topic).topic.partitions
        return {p: [e.position for e in client.read_events(topic, p, limit=1000)] for p in range(parts)}


def _reset(dsn: str, *args: str) -> dict[str, Any]:
    return dict(json.loads(ok(dsn, "groups", "reset", "g", "--topic", "t", *args, "--json")))


def test_groups_reset_each_target_per_partition_and_dry_run(dsn: str) -> None:
    with pgstreams.connect(dsn) as client:
        client.create_topic("t", 2)
        client.publish_many("t", [{"value": i, "partition": i % 2} for i in range(10)])
        with client.connection() as conn:
            row = conn.execute("SELECT clock_timestamp()").fetchone()
        assert row is not None
        mid = row[0].astimezone(timezone.utc)
        client.publish_many("t", [{"value": i, "partition": i % 2} for i in range(10, 20)])
        c = client.consumer("t", "g")
        take(c, 20, commit=True)
    pos = _positions(dsn, "t")
    heads = _checkpoints(dsn, "g", "t")  # the latest checkpoints: at or past each partition's last event
    assert all(heads[p] >= pos[p][-1] for p in pos) and len(heads) == 2

    # --partition: only that partition moves
    out = _reset(dsn, "--to-earliest", "--partition", "1")
    assert [r["partition"] for r in out["partitions"]] == [1]
    assert _checkpoints(dsn, "g", "t") == {0: heads[0], 1: 0}
    # --to-latest: after the last committed event (the topic's last position: nothing left to read)
    out = _reset(dsn, "--to-latest")
    latest = {p: max(max(v) for v in pos.values()) for p in pos}
    assert {r["partition"]: r["checkpoint"] for r in out["partitions"]} == latest
    assert _checkpoints(dsn, "g", "t") == latest
    with pgstreams.connect(dsn) as client:
        assert _lag(client, "g") == 0
    # --to-datetime: before the first event at or after the time, per partition
    second = {p: pos[p][5] for p in pos}  # the first event of the second batch in each partition
    _reset(dsn, "--to-datetime", mid.isoformat())
    assert _checkpoints(dsn, "g", "t") == {p: second[p] - 1 for p in pos}
    # --to-position P on one partition: the next event read is the first at or after P
    _reset(dsn, "--to-position", str(pos[0][2]), "--partition", "0")
    assert _checkpoints(dsn, "g", "t") == {0: pos[0][2] - 1, 1: second[1] - 1}
    with pgstreams.connect(dsn) as client:
        c = pgstreams.Consumer(client, "t", "g", partitions=[0])
        assert [e.position for e in c.poll(1, timeout=5)] == [pos[0][2]]
    before = _checkpoints(dsn, "g", "t")
    # --dry-run with every target: the plan is shown, nothing changes
    for target in (("--to-earliest",), ("--to-latest",), ("--to-datetime", mid.isoformat()),
                   ("--shift-by", "-1"), ("--to-position", "1"), ("--to-earliest", "--partition", "1")):
        plan = _reset(dsn, *target, "--dry-run")
        assert plan["dry_run"] is True and plan["partitions"], target
        assert _checkpoints(dsn, "g", "t") == before, target
    assert "dry run: nothing changed" in ok(dsn, "groups", "reset", "g", "--topic", "t", "--to-latest",
                                            "--dry-run")
    plan = _reset(dsn, "--to-latest", "--dry-run")
    assert {r["partition"]: (r["previous"], r["checkpoint"]) for r in plan["partitions"]} == {
        p: (before[p], latest[p]) for p in pos}
    assert _checkpoints(dsn, "g", "t") == before


def test_groups_reset_and_delete_bad_input_exit_2_and_change_nothing(dsn: str) -> None:
    with pgstreams.connect(dsn) as client:
        client.create_topic("t", 2)
        client.create_topic("u", 1)
        client.publish_many("t", [{"value": i, "partition": i % 2} for i in range(6)])
        client.publish("u", 1)
        take(client.consumer("t", "g"), 6, commit=True)
        take(client.consumer("u", "g"), 1, commit=True)
    before = (_checkpoints(dsn, "g", "t"), _checkpoints(dsn, "g", "u"))
    for args in (
        ("groups", "reset", "g", "--topic", "t", "--to-earliest", "--partition", "2"),
        ("groups", "reset", "g", "--topic", "t", "--to-earliest", "--partition", "-1"),
        ("groups", "reset", "g", "--topic", "t", "--to-position", "-5"),
        ("groups", "reset", "g", "--topic", "t", "--to-position", "x"),
        ("groups", "reset", "g", "--topic", "t", "--shift-by", "1.5"),
        ("groups", "reset", "g", "--topic", "t", "--to-datetime", "2024-01-01T00:00:00"),  # no zone
        ("groups", "reset", "g", "--topic", "t", "--to-latest", "--shift-by", "1"),
        ("groups", "reset", "bad group!", "--topic", "t", "--to-latest"),
        ("groups", "reset", "g", "--topic", "bad topic!", "--to-latest"),
        ("groups", "delete", "bad group!"),
        ("groups", "delete", "g", "--topic", "bad topic!"),
    ):
        p = cli(dsn, *args)
        assert p.returncode == 2, (args, p.stdout, p.stderr)
        assert "Traceback" not in p.stderr and p.stderr.startswith("error:"), (args, p.stderr)
    # unknown group or topic: exit 1, nothing changed
    for args in (
        ("groups", "reset", "nobody", "--topic", "t", "--to-latest"),
        ("groups", "reset", "g", "--topic", "missing", "--to-latest"),
        ("groups", "delete", "nobody"),
        ("groups", "delete", "g", "--topic", "missing"),
    ):
        p = cli(dsn, *args)
        assert p.returncode == 1, (args, p.stdout, p.stderr)
        assert "Traceback" not in p.stderr and p.stderr.startswith("error:"), (args, p.stderr)
    assert (_checkpoints(dsn, "g", "t"), _checkpoints(dsn, "g", "u")) == before


def test_groups_delete_on_one_topic_keeps_the_others(dsn: str) -> None:
    with pgstreams.connect(dsn) as client:
        client.create_topic("t", 2)
        client.create_topic("u", 1)
        client.publish_many("t", [{"value": i, "partition": i % 2} for i in range(4)])
        client.publish("u", 1)
        take(client.consumer("t", "g"), 4, commit=True)
        take(client.consumer("u", "g"), 1, commit=True)
        take(client.consumer("t", "other"), 4, commit=True)
    kept_u, kept_other = _checkpoints(dsn, "g", "u"), _checkpoints(dsn, "other", "t")
    out = ok(dsn, "groups", "delete", "g", "--topic", "t")
    assert "deleted group 'g' on topic 't' (2 checkpoint(s))" in out
    assert _checkpoints(dsn, "g", "t") == {}
    assert _checkpoints(dsn, "g", "u") == kept_u and _checkpoints(dsn, "other", "t") == kept_other
    assert [r["topic"] for r in json.loads(ok(dsn, "groups", "describe", "g", "--json"))] == ["u"]
    p = cli(dsn, "groups", "delete", "g", "--topic", "t")  # nothing left there
    assert p.returncode == 1 and "Traceback" not in p.stderr
    ok(dsn, "groups", "delete", "g")
    assert _checkpoints(dsn, "g", "u") == {} and _checkpoints(dsn, "other", "t") == kept_other


def test_groups_reset_and_delete_are_refused_while_the_group_has_live_members(dsn: str) -> None:
    with pgstreams.connect(dsn) as client:
        client.create_topic("t", 2)
        client.publish_many("t", [{"value": i, "partition": i % 2} for i in range(4)])
        seen: list[int] = []
        worker = pgstreams.Worker(client, install_signal_handlers=False, maintenance=None)
        worker.subscribe("t", "g", lambda e: seen.append(e.position))
        with worker:
            until(lambda: len(seen) == 4 and _lag(client, "g") == 0, 60, "the worker's commits")
            before = _checkpoints(dsn, "g", "t")
            for args in (
                ("groups", "reset", "g", "--topic", "t", "--to-earliest"),
                ("groups", "reset", "g", "--topic", "t", "--to-position", "1", "--partition", "0"),
                ("groups", "delete", "g"),
                ("groups", "delete", "g", "--topic", "t"),
            ):
                p = cli(dsn, *args)
                assert p.returncode == 1, (args, p.stdout, p.stderr)
                assert "live member" in p.stderr and "Traceback" not in p.stderr, p.stderr
                assert _checkpoints(dsn, "g", "t") == before, args
            # a dry run changes nothing either way and is refused too (it plans a reset of a live group)
            p = cli(dsn, "groups", "reset", "g", "--topic", "t", "--to-earliest", "--dry-run")
            assert p.returncode == 1 and "live member" in p.stderr
        # once the members are gone the same commands work
    _reset(dsn, "--to-earliest")
    assert _checkpoints(dsn, "g", "t") == {0: 0, 1: 0}
    ok(dsn, "groups", "delete", "g", "--topic", "t")
    assert _checkpoints(dsn, "g", "t") == {}


def _lag(client: pgstreams.Client, group: str) -> int | None:
    try:
        return sum(s.lag for s in client.describe_group(group))
    except pgstreams.GroupNotFound:
        return None


def _dead_letters(dsn: str) -> None:
    with pgstreams.connect(dsn) as client:
        client.create_topic("t", 1)
        client.create_topic("other", 1)
        client.create_topic("t.dlt", 1)
        for i, kind in enumerate(("ValueError", "KeyError", "ValueError")):
            client.publish("t.dlt", {"n": i}, key=f"k{i}",
                           headers={"dlt.topic": "t", "dlt.error_type": kind, "trace": f"x{i}"})


def _all(dsn: str, topic: str) -> list[pgstreams.Event]:
    with pgstreams.connect(dsn) as client:
        return client.read_events(topic, 0, limit=1000)


def test_dlt_replay_to_another_topic_with_a_group_a_filter_and_a_dry_run(dsn: str) -> None:
    _dead_letters(dsn)
    # --dry-run: shows what would go, publishes nothing, moves no checkpoint
    out = json.loads(ok(dsn, "dlt", "replay", "t.dlt", "--to", "other", "--where-error-type", "ValueError",
                        "--group", "mine", "--dry-run", "--json"))
    assert out["dry_run"] is True and out["replayed"] == 2 and out["skipped"] == 1
    assert [e["key"] for e in out["events"]] == ["k0", "k2"]
    assert _all(dsn, "other") == [] and _all(dsn, "t") == []
    assert _checkpoints(dsn, "mine", "t.dlt") == {}
    # --to other, --group mine, --where-error-type ValueError: the ValueError ones go to other, once
    assert "replayed 2 dead letter(s) of 3 read (1 passed over)" in ok(
        dsn, "dlt", "replay", "t.dlt", "--to", "other", "--group", "mine", "--where-error-type", "ValueError")
    got = _all(dsn, "other")
    assert [(e.key, e.value) for e in got] == [("k0", {"n": 0}), ("k2", {"n": 2})]
    dlt = _all(dsn, "t.dlt")
    assert [e.headers for e in got] == [
        {"trace": "x0", "dlt.replayed_from": f"t.dlt/0/{dlt[0].position}",
         "dlt.replayed_at": got[0].headers["dlt.replayed_at"]},
        {"trace": "x2", "dlt.replayed_from": f"t.dlt/0/{dlt[2].position}",
         "dlt.replayed_at": got[1].headers["dlt.replayed_at"]},
    ]
    assert _all(dsn, "t") == []  # not to the original topic
    assert _checkpoints(dsn, "mine", "t.dlt") == {0: dlt[-1].position}  # progress in the group given
    assert _checkpoints(dsn, "pgstreams-dlt-replay", "t.dlt") == {}  # not the default group's
    # run again with the same group: nothing more
    assert "replayed 0 dead letter(s) of 0 read" in ok(dsn, "dlt", "replay", "t.dlt", "--to", "other",
                                                       "--group", "mine")
    assert len(_all(dsn, "other")) == 2
    # another group replays the rest to the original topic (the default target), the KeyError one only
    assert "replayed 1 dead letter(s) of 3 read (2 passed over)" in ok(
        dsn, "dlt", "replay", "t.dlt", "--group", "keys", "--where-error-type", "KeyError")
    assert [(e.key, e.value) for e in _all(dsn, "t")] == [("k1", {"n": 1})]


def test_dlt_replay_bad_input_exits_2_and_changes_nothing(dsn: str) -> None:
    _dead_letters(dsn)
    for args in (
        ("dlt", "replay", "bad topic!"),
        ("dlt", "replay", "t.dlt", "--to", "bad topic!"),
        ("dlt", "replay", "t.dlt", "--group", "bad group!"),
    ):
        p = cli(dsn, *args)
        assert p.returncode == 2, (args, p.stdout, p.stderr)
        assert "Traceback" not in p.stderr and p.stderr.startswith("error:"), (args, p.stderr)
    for args in (("dlt", "replay", "t.dlt", "--to", "missing"), ("dlt", "replay", "missing.dlt")):
        p = cli(dsn, *args)
        assert p.returncode == 1, (args, p.stdout, p.stderr)
        assert "Traceback" not in p.stderr and p.stderr.startswith("error:"), (args, p.stderr)
    assert _all(dsn, "t") == [] and _all(dsn, "other") == []
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SELECT count(*) FROM pgstreams.checkpoints").fetchone() == (0,)


def test_a_compacted_topic_on_the_command_line(dsn: str) -> None:
    ok(dsn, "topics", "create", "c", "--config", "cleanup.policy=compact", "--config", "segment.events=1000",
       "--config", "min.cleanable.dirty.ratio=0.2")
    with pgstreams.connect(dsn) as client:
        client.publish_many("c", [{"value": i, "key": f"k{i % 10}"} for i in range(1001)])
    line = " ".join(ok(dsn, "maintain").split())  # the console wraps long lines
    assert "compaction: 1 segment(s) mapped, 1 rewritten (989 events removed)" in line
    desc = json.loads(ok(dsn, "topics", "describe", "c", "--json"))
    assert desc["compaction"]["events_removed"] == 989 and desc["compaction"]["dirty_ratio"] == 0.0
    assert "dirty ratio 0.000" in " ".join(ok(dsn, "topics", "describe", "c").split())
    rows = json.loads(ok(dsn, "retention", "c", "--json"))
    assert rows[0]["cleanup_policy"] == "compact" and rows[0]["events_compacted"] == 989
    for bad in ("min.cleanable.dirty.ratio=2", "cleanup.policy=compacted", "min.compaction.lag.ms=-1"):
        p = cli(dsn, "topics", "alter", "c", "--config", bad)
        assert p.returncode == 2 and bad.split("=")[0] in p.stderr and "Traceback" not in p.stderr
