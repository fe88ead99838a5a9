"""Typed operations on sink bookkeeping: units of work (Spark write tasks) stored exactly once."""

from __future__ import annotations

import psycopg

from .executor import Executor


class SinkStore:
    """Write tasks of sinks (``spark_sink_tasks``): a sink is a streaming query or a batch write job, a
    task is one ``(batch_id, task_partition)`` of it."""

    def __init__(self, executor: Executor) -> None:
        self.ex = executor

    def claim(self, conn: psycopg.Connection, sink_id: str, batch_id: int, task_partition: int,
              topic_id: int) -> bool:
        """Claim a task in the caller's transaction; False when it was committed before (store nothing)."""
        row = self.ex.one("claim_sink_task", (sink_id, batch_id, task_partition, topic_id), conn=conn)
        return row is not None

    def record(self, conn: psycopg.Connection, sink_id: str, batch_id: int, task_partition: int, events: int,
               stored: int) -> None:
        """Record what the claimed task did (``events`` received, ``stored`` published)."""
        self.ex.run("record_sink_task", (events, stored, sink_id, batch_id, task_partition), conn=conn)

    def forget(self, conn: psycopg.Connection, sink_id: str) -> None:
        """Drop every task of a finished sink."""
        self.ex.run("forget_sink", (sink_id,), conn=conn)

    def forget_before(self, conn: psycopg.Connection, sink_id: str, batch_id: int) -> None:
        """Drop the tasks of batches before ``batch_id`` (they can never run again)."""
        self.ex.run("forget_sink_batches_before", (sink_id, batch_id), conn=conn)
