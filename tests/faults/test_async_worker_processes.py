"""Workers with an ``async def`` handler, as processes of one group: every event is handled, failing
ones are retried and dead-lettered, as with a plain handler."""

from __future__ import annotations

import os
import subprocess

import psycopg

import pgstreams
from _core_helpers import until
from _obs_helpers import CLI, TESTS


def test_async_handler_workers_in_two_processes_handle_every_event(dsn: str) -> None:
    from workers_app import create_tables

    create_tables(dsn)
    with pgstreams.connect(dsn) as client:
        client.create_topic("jobs", 4)
        client.publish_many("jobs", [{"value": i, "partition": i % 4} for i in range(1, 41)])
        procs = [subprocess.Popen(
            [*CLI, "worker", "obs_app:async_record", "--topic", "jobs", "--group", "g", "--max-attempts", "2",
             "--backoff", "0.01", "--heartbeat-interval", "0.3", "--session-timeout", "3", "--member-id",
             f"w{i}", "--dsn", dsn], cwd=TESTS, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
            env=dict(os.environ, OBS_APP_DSN=dsn, WORKERS_APP_NAME=f"w{i}")) for i in (1, 2)]
        try:
            # both joined (and so handle SIGTERM) before anything is asserted
            until(lambda: len(pgstreams.group_members(client, "g")) == 2, 120, "both workers in the group")

            def dead_letters() -> int:
                try:
                    return sum(p.events for p in client.describe_topic("jobs.dlt").partition_info)
                except pgstreams.TopicNotFound:
                    return 0

            until(lambda: dead_letters() == 8, 90, "the 8 failing events dead-lettered")

            def delivered() -> set[int]:
                with psycopg.connect(dsn) as conn:
                    return {r[0] for r in conn.execute("SELECT position FROM deliveries")}

            positions = {e.position for e in client.consumer("jobs", "peek").poll(100, 5)}
            assert len(positions) == 40
            until(lambda: delivered() >= positions, 60, "every event delivered")
            until(lambda: sum(s.lag for s in client.describe_group("g")) == 0, 60, "the group caught up")
            for p in procs:
                p.terminate()
            for p in procs:
                assert p.wait(30) == 0, p.stderr.read() if p.stderr else ""
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
